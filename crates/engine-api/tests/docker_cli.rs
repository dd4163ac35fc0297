//! Drives the real docker CLI (28.x) against the Engine API served on a temporary unix socket over a
//! `ClusterState` with a `LocalProposer` (no orchestrator runs, so services are created with `--detach`).
//! Skipped, with a printed reason, when `docker` is not installed.

use std::process::Command;

use shoal_api::{
    node_status, ManagerStatus, Node, NodeDescription, NodeRole, NodeSpec, NodeStatus, Task, TaskState, TaskStatus,
};
use shoal_manager::ClusterState;
use shoal_store::Changes;
use shoal_testkit::prerequisites::{self, Prerequisite};
use shoal_testkit::ApiServer;

struct Server {
    api: ApiServer,
    config_dir: tempfile::TempDir,
    state: ClusterState,
}

impl Server {
    fn start() -> Server {
        let api = ApiServer::start("node1aaaaaaaaaaaaaaaaaaaaa", "shoal-host", 3);
        let state = api.state().clone();
        Server { api, config_dir: tempfile::tempdir().unwrap(), state }
    }

    /// Runs `docker -H unix://SOCK args...`; returns (exit code, stdout, stderr).
    fn docker(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new("docker")
            .arg("-H")
            .arg(format!("unix://{}", self.api.socket().display()))
            .args(args)
            .env_remove("DOCKER_HOST")
            .env_remove("DOCKER_CONTEXT")
            .env("DOCKER_CONFIG", self.config_dir.path())
            .env("DOCKER_CLI_HINTS", "false")
            .output()
            .expect("run docker");
        let r = (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        eprintln!("$ docker {}\n-> {}\n{}{}", args.join(" "), r.0, r.1, r.2);
        r
    }

    fn ok(&self, args: &[&str]) -> String {
        let (code, out, err) = self.docker(args);
        assert_eq!(code, 0, "docker {args:?} failed: {err}");
        out
    }
}

fn seed_node(state: &ClusterState, id: &str) {
    let mut n = Node {
        id: id.into(),
        spec: Some(NodeSpec::default()),
        description: Some(NodeDescription {
            hostname: "shoal-host".into(),
            engine: Some(shoal_api::EngineDescription { engine_version: "0.1.0".into(), ..Default::default() }),
            ..Default::default()
        }),
        status: Some(NodeStatus { addr: "127.0.0.1".into(), ..Default::default() }),
        manager_status: Some(ManagerStatus { leader: true, addr: "127.0.0.1:4242".into(), ..Default::default() }),
        ..Default::default()
    };
    n.set_role(NodeRole::Manager);
    n.spec.as_mut().unwrap().set_desired_role(NodeRole::Manager);
    n.status.as_mut().unwrap().set_state(node_status::State::Ready);
    n.manager_status.as_mut().unwrap().set_reachability(shoal_api::raft_member_status::Reachability::Reachable);
    let mut c = Changes::new();
    c.create(n);
    propose(state, c);
}

fn propose(state: &ClusterState, c: Changes) {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(state.propose(c)).unwrap();
}

/// A running task in slot 1 of `service_id` on `node_id`, as the orchestrator and agent would leave it.
fn seed_running_task(state: &ClusterState, service_id: &str, node_id: &str) {
    let svc = shoal_manager::controlapi::get_service(state, service_id).unwrap();
    let mut t = Task {
        id: "task1aaaaaaaaaaaaaaaaaaaaa".into(),
        service_id: svc.id.clone(),
        slot: 1,
        node_id: node_id.into(),
        spec: svc.spec.as_ref().unwrap().task.clone().map(Into::into),
        meta: Some(shoal_api::Meta { created_at: Some(state.now()), updated_at: Some(state.now()), version: None }),
        status: Some(TaskStatus {
            state: TaskState::Running as i32,
            message: "started".into(),
            timestamp: Some(shoal_api::timestamp_from_system_time(std::time::SystemTime::now())),
            ..Default::default()
        }),
        ..Default::default()
    };
    t.set_desired_state(TaskState::Running);
    let mut c = Changes::new();
    c.create(t);
    propose(state, c);
}

/// Splits a docker table into rows of whitespace-separated cells (header first).
fn rows(out: &str) -> Vec<Vec<String>> {
    out.lines().map(|l| l.split_whitespace().map(str::to_string).collect()).collect()
}

#[test]
fn the_docker_cli_drives_shoal() {
    if prerequisites::skip_unless(Prerequisite::DockerCli) {
        return;
    }
    let s = Server::start();
    seed_node(&s.state, "node1aaaaaaaaaaaaaaaaaaaaa");

    // version: the CLI negotiates 1.47 from the ping.
    let v = s.ok(&["version", "--format", "{{.Server.APIVersion}} {{.Server.Os}}"]);
    assert_eq!(v.trim(), "1.47 linux");

    // create
    let (code, out, err) =
        s.docker(&["service", "create", "--detach", "--name", "web", "--replicas", "3", "busybox", "sleep", "3141"]);
    assert_eq!(code, 0, "{err}");
    let id = out.trim().to_string();
    assert_eq!(id.len(), 25, "create prints the service ID: {out:?}");
    assert!(err.contains("could not be accessed on a registry to record"), "the CLI warns and goes on: {err}");

    // ls: REPLICAS from ServiceStatus (no orchestrator: 0 of 3 running).
    let ls = rows(&s.ok(&["service", "ls"]));
    assert_eq!(ls[0], ["ID", "NAME", "MODE", "REPLICAS", "IMAGE", "PORTS"]);
    assert_eq!(ls[1][1..], ["web", "replicated", "0/3", "busybox:latest"]);
    assert!(id.starts_with(&ls[1][0]));

    // inspect
    let inspect = s.ok(&["service", "inspect", "web"]);
    let doc: serde_json::Value = serde_json::from_str(&inspect).unwrap();
    assert_eq!(doc[0]["ID"], id.as_str());
    assert_eq!(doc[0]["Spec"]["Mode"]["Replicated"]["Replicas"], 3);
    assert_eq!(doc[0]["Spec"]["TaskTemplate"]["ContainerSpec"]["Args"], serde_json::json!(["sleep", "3141"]));
    let fmt =
        s.ok(&["service", "inspect", "--format", "{{.Spec.Name}} {{.Spec.TaskTemplate.ContainerSpec.Image}}", "web"]);
    assert_eq!(fmt.trim(), "web busybox:latest");

    // ps: no tasks yet (no orchestrator runs here), header only.
    let ps = rows(&s.ok(&["service", "ps", "web"]));
    assert_eq!(ps[0][..3], ["ID", "NAME", "IMAGE"]);
    assert_eq!(ps.len(), 1);

    // With a running task: REPLICAS 1/3, and ps shows the task as web.1 on the node's hostname.
    seed_running_task(&s.state, &id, "node1aaaaaaaaaaaaaaaaaaaaa");
    let ls = rows(&s.ok(&["service", "ls"]));
    assert_eq!(ls[1][3], "1/3");
    let ps = rows(&s.ok(&["service", "ps", "web"]));
    assert_eq!(ps[1][..6], ["task1aaaaaaa", "web.1", "busybox:latest", "shoal-host", "Running", "Running"]);

    // node ls marks this node.
    let nodes = rows(&s.ok(&["node", "ls"]));
    assert_eq!(nodes[0][..3], ["ID", "HOSTNAME", "STATUS"]);
    assert_eq!(nodes[1][..6], ["node1aaaaaaaaaaaaaaaaaaaaa", "*", "shoal-host", "Ready", "Active", "Leader"]);

    // update args, then scale.
    s.ok(&["service", "update", "--detach", "--args", "sleep 2718", "web"]);
    let args = s.ok(&["service", "inspect", "--format", "{{json .Spec.TaskTemplate.ContainerSpec.Args}}", "web"]);
    assert_eq!(args.trim(), r#"["sleep","2718"]"#);
    let out = s.ok(&["service", "scale", "web=5", "--detach"]);
    assert!(out.contains("web scaled to 5"), "{out}");
    let ls = rows(&s.ok(&["service", "ls"]));
    assert_eq!(ls[1][3], "1/5");

    // errors
    let (code, _, err) = s.docker(&["service", "inspect", "nope"]);
    assert_eq!(code, 1);
    assert!(err.contains("nope"), "{err}");
    let (code, _, err) = s.docker(&["service", "create", "--detach", "--name", "web", "busybox"]);
    assert_eq!(code, 1);
    assert!(err.contains("Error response from daemon: service name web is already in use"), "{err}");
    let (code, _, err) = s.docker(&["service", "scale", "nope=2", "--detach"]);
    assert_eq!(code, 1);
    assert!(err.contains("nope"), "{err}");

    // rm
    let out = s.ok(&["service", "rm", "web"]);
    assert_eq!(out.trim(), "web");
    let ls = rows(&s.ok(&["service", "ls"]));
    assert_eq!(ls.len(), 1);
    let (code, _, err) = s.docker(&["service", "rm", "web"]);
    assert_eq!(code, 1);
    assert!(err.contains("Error response from daemon: service web not found"), "{err}");
}
