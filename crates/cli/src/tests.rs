//! The client commands against an in-process Engine API server on a temporary unix socket (no daemon):
//! create, ls, inspect, ps, scale, update, rm, node commands, `--format json`, and exit codes.

use clap::Parser;
use shoal_api::{node_status, Node, NodeDescription, NodeRole, NodeSpec, NodeStatus};
use shoal_manager::ClusterState;
use shoal_store::Changes;
use shoal_testkit::ApiServer;

use super::*;

#[derive(Parser)]
struct TestCli {
    #[command(subcommand)]
    cmd: ClientCommand,
}

struct Server {
    /// Held for its lifetime: dropping it stops the server.
    _api: ApiServer,
    host: String,
    state: ClusterState,
}

impl Server {
    fn start() -> Server {
        let api = ApiServer::start("node1", "box1", 11);
        let host = format!("unix://{}", api.socket().display());
        let state = api.state().clone();
        Server { _api: api, host, state }
    }

    /// Runs `shoal <args>`; returns (exit code, stdout, stderr).
    fn run(&self, args: &[&str]) -> (i32, String, String) {
        let cmd = TestCli::try_parse_from(std::iter::once("shoal").chain(args.iter().copied())).unwrap().cmd;
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let client = Client::new(&self.host).unwrap();
        let code = exit_code(execute(&client, cmd, &mut out, &mut err), &mut err);
        (code, String::from_utf8(out).unwrap(), String::from_utf8(err).unwrap())
    }

    fn ok(&self, args: &[&str]) -> String {
        let (code, out, err) = self.run(args);
        assert_eq!(code, 0, "shoal {args:?}: {err}");
        out
    }

    fn seed_node(&self) {
        let mut n = Node {
            id: "node1".into(),
            spec: Some(NodeSpec::default()),
            description: Some(NodeDescription { hostname: "box1".into(), ..Default::default() }),
            status: Some(NodeStatus::default()),
            ..Default::default()
        };
        n.set_role(NodeRole::Worker);
        n.status.as_mut().unwrap().set_state(node_status::State::Ready);
        let mut c = Changes::new();
        c.create(n);
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(self.state.propose(c)).unwrap();
    }
}

fn rows(out: &str) -> Vec<Vec<String>> {
    out.lines().map(|l| l.split_whitespace().map(str::to_string).collect()).collect()
}

#[test]
fn service_lifecycle_through_the_cli() {
    let s = Server::start();
    let id = s.ok(&[
        "service",
        "create",
        "--name",
        "web",
        "--replicas",
        "3",
        "--env",
        "A=1",
        "--constraint",
        "node.role==worker",
        "--restart-condition",
        "on-failure",
        "--restart-delay",
        "1m30s",
        "--limit-cpu",
        "0.5",
        "--limit-memory",
        "64m",
        "--update-order",
        "start-first",
        "--label",
        "tier=front",
        "busybox",
        "sleep",
        "3141",
    ]);
    let id = id.trim();
    assert_eq!(id.len(), 25);

    let ls = rows(&s.ok(&["service", "ls"]));
    assert_eq!(ls[0], ["ID", "NAME", "MODE", "REPLICAS", "IMAGE"]);
    assert_eq!(ls[1], [&id[..12], "web", "replicated", "0/3", "busybox"]);

    let inspect: serde_json::Value = serde_json::from_str(&s.ok(&["service", "inspect", "web"])).unwrap();
    let spec = &inspect[0]["Spec"];
    assert_eq!(spec["TaskTemplate"]["ContainerSpec"]["Args"], serde_json::json!(["sleep", "3141"]));
    assert_eq!(spec["TaskTemplate"]["ContainerSpec"]["Env"], serde_json::json!(["A=1"]));
    assert_eq!(spec["TaskTemplate"]["RestartPolicy"]["Condition"], "on-failure");
    assert_eq!(spec["TaskTemplate"]["RestartPolicy"]["Delay"], 90_000_000_000i64);
    assert_eq!(spec["TaskTemplate"]["Resources"]["Limits"]["NanoCPUs"], 500_000_000);
    assert_eq!(spec["TaskTemplate"]["Resources"]["Limits"]["MemoryBytes"], 64 << 20);
    assert_eq!(spec["TaskTemplate"]["Placement"]["Constraints"], serde_json::json!(["node.role==worker"]));
    assert_eq!(spec["UpdateConfig"]["Order"], "start-first");
    assert_eq!(spec["Labels"]["tier"], "front");

    let json_ls: serde_json::Value = serde_json::from_str(&s.ok(&["service", "ls", "--format", "json"])).unwrap();
    assert_eq!(json_ls[0]["ServiceStatus"]["DesiredTasks"], 3);

    assert_eq!(s.ok(&["service", "scale", "web=5"]).trim(), "web scaled to 5");
    s.ok(&["service", "update", "--args", "sleep 2718", "--env-add", "B=2", "--env-rm", "A", "--force", "web"]);
    let after: serde_json::Value = serde_json::from_str(&s.ok(&["service", "inspect", id])).unwrap();
    let spec = &after[0]["Spec"];
    assert_eq!(spec["Mode"]["Replicated"]["Replicas"], 5);
    assert_eq!(spec["TaskTemplate"]["ContainerSpec"]["Args"], serde_json::json!(["sleep", "2718"]));
    assert_eq!(spec["TaskTemplate"]["ContainerSpec"]["Env"], serde_json::json!(["B=2"]));
    assert_eq!(spec["TaskTemplate"]["ForceUpdate"], 1);

    // The update supervisor's settings, then a rollback to the previous spec.
    s.ok(&[
        "service",
        "update",
        "--args",
        "sleep 3000",
        "--update-failure-action",
        "rollback",
        "--update-monitor",
        "2s",
        "--update-max-failure-ratio",
        "0.25",
        "--update-parallelism",
        "2",
        "web",
    ]);
    let after: serde_json::Value = serde_json::from_str(&s.ok(&["service", "inspect", id])).unwrap();
    let u = &after[0]["Spec"]["UpdateConfig"];
    assert_eq!(
        (&u["FailureAction"], &u["Monitor"], &u["Parallelism"]),
        (&serde_json::json!("rollback"), &serde_json::json!(2_000_000_000i64), &serde_json::json!(2))
    );
    assert_eq!(u["MaxFailureRatio"], 0.25);
    assert_eq!(u["Order"], "start-first", "kept");
    assert_eq!(s.ok(&["service", "rollback", "web"]).trim(), "web");
    let after: serde_json::Value = serde_json::from_str(&s.ok(&["service", "inspect", id])).unwrap();
    assert_eq!(after[0]["Spec"]["TaskTemplate"]["ContainerSpec"]["Args"], serde_json::json!(["sleep", "2718"]));
    assert_eq!(after[0]["UpdateStatus"]["State"], "rollback_started");

    // ps with no tasks: the header only; json: an empty list.
    let ps = s.ok(&["service", "ps", "web"]);
    assert_eq!(rows(&ps), [["ID", "NAME", "IMAGE", "NODE", "DESIRED", "STATE", "CURRENT", "STATE", "ERROR"]]);
    assert_eq!(s.ok(&["service", "ps", "web", "--format", "json"]).trim(), "[]");
    assert_eq!(
        s.ok(&["task", "ls", "--service", "web", "--desired-state", "running", "--format", "json"]).trim(),
        "[]"
    );

    assert_eq!(s.ok(&["service", "rm", "web"]).trim(), "web");
    assert_eq!(rows(&s.ok(&["service", "ls"])).len(), 1);
}

#[test]
fn errors_print_one_line_and_exit_1() {
    let s = Server::start();
    let (code, out, err) = s.run(&["service", "inspect", "nope"]);
    assert_eq!((code, out.as_str()), (1, ""));
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("shoal: service nope not found"), "{err}");

    s.ok(&["service", "create", "--name", "web", "busybox"]);
    let (code, _, err) = s.run(&["service", "create", "--name", "web", "busybox"]);
    assert_eq!(code, 1);
    assert!(err.starts_with("shoal: service name web is already in use"), "{err}");

    let (code, _, err) = s.run(&["service", "create", "--name", "bad", "--constraint", "node.colour==red", "busybox"]);
    assert_eq!(code, 1);
    assert!(err.contains("unknown key"), "{err}");

    let (code, out, err) = s.run(&["service", "rm", "nope", "web"]);
    assert_eq!(code, 1);
    assert_eq!(out.trim(), "web");
    assert_eq!(err.lines().count(), 1, "{err}");

    let (code, _, err) = s.run(&["service", "scale", "web"]);
    assert_eq!(code, 1);
    assert!(err.contains("expected SERVICE=REPLICAS"), "{err}");

    // No daemon at the socket.
    let client = Client::new("unix:///nonexistent/shoal.sock").unwrap();
    let mut err = Vec::new();
    let code = exit_code(execute(&client, ClientCommand::Info, &mut Vec::new(), &mut Vec::new()), &mut err);
    assert_eq!(code, 1);
    assert!(String::from_utf8(err).unwrap().contains("cannot connect to the Shoal daemon"));
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        vec!["shoal", "service", "create"],
        vec!["shoal", "service", "create", "--restart-condition", "sometimes", "busybox"],
        vec!["shoal", "service", "create", "--restart-delay", "soon", "busybox"],
        vec!["shoal", "node", "update", "--availability", "away", "n1"],
    ] {
        let e = TestCli::try_parse_from(&args).err().unwrap_or_else(|| panic!("{args:?} parsed"));
        assert_eq!(e.exit_code(), 2, "{args:?}");
    }
}

#[test]
fn node_commands_and_info() {
    let s = Server::start();
    s.seed_node();
    let ls = rows(&s.ok(&["node", "ls"]));
    assert_eq!(ls[0], ["ID", "HOSTNAME", "STATUS", "AVAILABILITY", "MANAGER", "STATUS", "ENGINE", "VERSION"]);
    assert_eq!(ls[1], ["node1", "*", "box1", "Ready", "Active"]);
    assert_eq!(s.ok(&["node", "update", "--availability", "drain", "--label-add", "zone=east", "box1"]).trim(), "box1");
    let n: serde_json::Value = serde_json::from_str(&s.ok(&["node", "inspect", "node1"])).unwrap();
    assert_eq!(n[0]["Spec"]["Availability"], "drain");
    assert_eq!(n[0]["Spec"]["Labels"]["zone"], "east");
    let info = s.ok(&["info"]);
    assert!(info.contains(" NodeID: node1"), "{info}");
    assert!(info.contains("Executor: process"), "{info}");
    let version = s.ok(&["version"]);
    assert!(version.contains("API version: 1.47"), "{version}");
}

/// The subcommands are built lazily (`defer`), so a mistake in one would only show when it is used: build and
/// check the whole tree.
#[test]
fn the_whole_command_tree_is_valid() {
    use clap::CommandFactory;
    Args::command().debug_assert();
}
