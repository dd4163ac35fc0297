//! The docker executor against the local Docker Engine, driven by the stock docker CLI: tasks are labelled
//! containers visible to `docker ps`, scale and rm converge, a killed container's task is replaced, an
//! unhealthy container never runs, a missing image rejects the task with the engine's reason, and
//! containers survive a restart of the Shoal daemon without loss or duplicates.
//!
//! Skipped (with a message) where the docker CLI or engine is missing. Every test's containers are removed
//! when it ends, however it ends (`EngineDaemon`).

mod common;

use std::time::Duration;

use common::*;
use shoal_testkit::docker_engine::{self, EngineDaemon};

fn engine_daemon() -> Option<(EngineDaemon, &'static str)> {
    let image = docker_engine::test_image_or_skip()?;
    Some((EngineDaemon::start(&shoal_bin()), image))
}

/// Waits until the engine runs exactly `n` containers of `service` for this node and the service has `n`
/// running tasks; returns the container IDs.
fn wait_containers(d: &EngineDaemon, service: &str, n: usize) -> Vec<String> {
    wait_until(&format!("{n} running containers of {service}"), Duration::from_secs(60), || {
        let running = tasks_of(d, service).iter().filter(|t| state(t) == "running" && desired(t) == "running").count();
        let ids = docker_engine::running_with_label(d.node_id(), "com.docker.swarm.service.name", service);
        if ids.len() == n && running == n {
            Ok(ids)
        } else {
            Err(format!("{} containers, {running} running tasks", ids.len()))
        }
    })
}

#[test]
fn services_run_as_labelled_containers_that_scale_are_replaced_and_removed() {
    let Some((d, image)) = engine_daemon() else { return };
    let info = docker(&d, &["info", "--format", "{{json .}}"]);
    assert!(info.contains("shoal.executor=docker"), "docker info names the executor: {info}");

    let sid =
        docker(&d, &["service", "create", "--detach", "--name", "web", "--replicas", "2", image, "sleep", "1000"]);
    let sid = sid.trim().lines().last().unwrap_or_default().to_string();
    let ids = wait_containers(&d, "web", 2);
    for id in &ids {
        let labels = docker_engine::engine_ok(&["inspect", "--format", "{{json .Config.Labels}}", id]);
        let l: serde_json::Value = serde_json::from_str(&labels).expect("labels JSON");
        assert_eq!(l["com.docker.swarm.service.id"], sid.as_str());
        assert_eq!(l["com.docker.swarm.service.name"], "web");
        assert_eq!(l["com.docker.swarm.node.id"], d.node_id());
        let task_id = l["com.docker.swarm.task.id"].as_str().expect("task id label");
        let name = docker_engine::engine_ok(&["inspect", "--format", "{{.Name}}", id]);
        assert!(name.trim().trim_start_matches('/').starts_with("web.") && name.trim().ends_with(task_id), "{name}");
        let cmd = docker_engine::engine_ok(&["inspect", "--format", "{{json .Config.Cmd}}", id]);
        assert_eq!(cmd.trim(), r#"["sleep","1000"]"#);
    }

    docker(&d, &["service", "scale", "--detach", "web=5"]);
    wait_containers(&d, "web", 5);
    docker(&d, &["service", "scale", "--detach", "web=3"]);
    let ids = wait_containers(&d, "web", 3);

    // A killed container fails its task; the orchestrator replaces it with a new container.
    docker_engine::engine_ok(&["kill", &ids[0]]);
    wait_until("the killed container's task failed and was replaced", Duration::from_secs(60), || {
        let now = docker_engine::running_with_label(d.node_id(), "com.docker.swarm.service.name", "web");
        let failed = tasks_of(&d, "web").iter().filter(|t| state(t) == "failed").count();
        if now.len() == 3 && !now.contains(&ids[0]) && failed == 1 {
            Ok(())
        } else {
            Err(format!("{} running containers, {failed} failed tasks", now.len()))
        }
    });

    docker(&d, &["service", "rm", "web"]);
    wait_until("no container of web left", Duration::from_secs(60), || {
        let left = docker_engine::containers_of_node(d.node_id());
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{} containers", left.len()))
        }
    });
}

#[test]
fn an_unhealthy_container_never_runs_and_is_replaced() {
    let Some((d, image)) = engine_daemon() else { return };
    let args = [
        "service",
        "create",
        "--detach",
        "--name",
        "sick",
        "--health-cmd",
        "false",
        "--health-interval",
        "200ms",
        "--health-retries",
        "1",
        "--restart-delay",
        "100ms",
        image,
        "sleep",
        "1000",
    ];
    docker(&d, &args);
    wait_until("two failed attempts of sick", Duration::from_secs(60), || {
        let tasks = tasks_of(&d, "sick");
        let failed: Vec<_> = tasks.iter().filter(|t| state(t) == "failed").collect();
        if let Some(t) = tasks.iter().find(|t| state(t) == "running") {
            panic!("an unhealthy task reached RUNNING: {t}");
        }
        if failed.len() >= 2 {
            let err = failed[0]["Status"]["Err"].as_str().unwrap_or_default();
            assert!(err.contains("unhealthy"), "the failure says why: {err}");
            Ok(())
        } else {
            Err(format!("{} failed tasks", failed.len()))
        }
    });

    // A healthy one runs.
    docker(
        &d,
        &[
            "service",
            "create",
            "--detach",
            "--name",
            "fine",
            "--health-cmd",
            "true",
            "--health-interval",
            "200ms",
            image,
            "sleep",
            "1000",
        ],
    );
    wait_containers(&d, "fine", 1);
}

#[test]
fn a_missing_image_rejects_the_task_with_the_engines_reason() {
    let Some((d, _)) = engine_daemon() else { return };
    docker(&d, &["service", "create", "--detach", "--name", "ghost", "shoal-test-no-such-image:1", "sleep", "1"]);
    wait_until("a rejected task", Duration::from_secs(60), || {
        let tasks = tasks_of(&d, "ghost");
        match tasks.iter().find(|t| state(t) == "rejected") {
            Some(t) => {
                let err = t["Status"]["Err"].as_str().unwrap_or_default().to_string();
                assert!(err.contains("shoal-test-no-such-image:1") && err.contains("pulling it failed"), "{err}");
                Ok(())
            }
            None => Err(format!("states: {:?}", tasks.iter().map(state).collect::<Vec<_>>())),
        }
    });
}

#[test]
fn containers_survive_a_daemon_restart_without_loss_or_duplicates() {
    let Some((mut d, image)) = engine_daemon() else { return };
    docker(&d, &["service", "create", "--detach", "--name", "web", "--replicas", "3", image, "sleep", "1000"]);
    let mut before = wait_containers(&d, "web", 3);
    before.sort();
    let tasks_before: Vec<String> =
        tasks_of(&d, "web").iter().map(|t| t["ID"].as_str().unwrap_or_default().to_string()).collect();

    assert!(d.stop(), "the daemon stops cleanly");
    // Containers outlive the daemon.
    let mut during = docker_engine::running_with_label(d.node_id(), "com.docker.swarm.service.name", "web");
    during.sort();
    assert_eq!(during, before, "containers keep running while the daemon is down");

    // A leftover container of a task the manager does not know is removed on restart.
    let stray = docker_engine::engine_ok(&[
        "run",
        "-d",
        "--label",
        &format!("com.docker.swarm.node.id={}", d.node_id()),
        "--label",
        "com.docker.swarm.task.id=notataskofthiscluster0000",
        image,
        "sleep",
        "1000",
    ]);
    let stray = stray.trim().to_string();

    d.restart(&[]);
    let mut after = wait_containers(&d, "web", 3);
    after.sort();
    assert_eq!(after, before, "the same containers, adopted: none lost, none duplicated");
    let mut tasks_after: Vec<String> = tasks_of(&d, "web")
        .iter()
        .filter(|t| state(t) == "running")
        .map(|t| t["ID"].as_str().unwrap_or_default().to_string())
        .collect();
    tasks_after.sort();
    let mut tasks_before = tasks_before;
    tasks_before.sort();
    assert_eq!(tasks_after, tasks_before, "the same tasks keep running");
    wait_until("the stray container is removed", Duration::from_secs(30), || {
        if docker_engine::containers_of_node(d.node_id()).contains(&stray) {
            Err("still there".into())
        } else {
            Ok(())
        }
    });

    // And the service still converges.
    docker(&d, &["service", "scale", "--detach", "web=4"]);
    wait_containers(&d, "web", 4);
}

#[test]
fn auto_picks_docker_when_the_engine_answers_and_processes_otherwise() {
    if shoal_testkit::prerequisites::skip_unless(shoal_testkit::prerequisites::Prerequisite::DockerEngine) {
        return;
    }
    let executor_of = |extra: &[&str]| {
        let d = shoal_testkit::DaemonProcess::start_with(
            &shoal_bin(),
            shoal_testkit::DaemonOptions {
                executor: Some("auto".into()),
                extra_args: extra.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            },
        );
        let labels = d.get("/v1.47/info")["Labels"].clone();
        labels
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l.as_str()?.strip_prefix("shoal.executor=").map(str::to_string))
            .next()
    };
    assert_eq!(executor_of(&[]).as_deref(), Some("docker"));
    let missing = std::env::temp_dir().join("shoal-no-engine-here.sock");
    let addr = format!("unix://{}", missing.display());
    assert_eq!(executor_of(&["--engine-addr", &addr]).as_deref(), Some("process"));
}

#[test]
fn the_container_carries_the_task_spec() {
    let Some((d, image)) = engine_daemon() else { return };
    let vol = tempfile::tempdir().expect("bind source");
    let bind = format!("type=bind,source={},target=/host,readonly", vol.path().display());
    let volume_name = format!("shoal-test-{}", d.node_id());
    let volume = format!("type=volume,source={volume_name},target=/data");
    docker(
        &d,
        &[
            "service",
            "create",
            "--detach",
            "--name",
            "spec",
            "--env",
            "GREETING=hi",
            "--user",
            "nobody",
            "--workdir",
            "/tmp",
            "--hostname",
            "box",
            "--limit-cpu",
            "0.5",
            "--limit-memory",
            "64M",
            "--reserve-memory",
            "32M",
            "--limit-pids",
            "50",
            "--stop-signal",
            "SIGINT",
            "--stop-grace-period",
            "7s",
            "--init",
            "--mount",
            &bind,
            "--mount",
            "type=tmpfs,target=/scratch",
            "--mount",
            &volume,
            "--entrypoint",
            "sleep",
            image,
            "1000",
        ],
    );
    let ids = wait_containers(&d, "spec", 1);
    let c: serde_json::Value =
        serde_json::from_str(&docker_engine::engine_ok(&["inspect", &ids[0]])).expect("inspect JSON");
    let c = &c[0];
    let cfg = &c["Config"];
    assert!(cfg["Env"].as_array().unwrap().iter().any(|e| e == "GREETING=hi"), "{}", cfg["Env"]);
    assert_eq!(
        (cfg["User"].as_str(), cfg["WorkingDir"].as_str(), cfg["Hostname"].as_str()),
        (Some("nobody"), Some("/tmp"), Some("box"))
    );
    assert_eq!(cfg["Entrypoint"], serde_json::json!(["sleep"]));
    assert_eq!(cfg["Cmd"], serde_json::json!(["1000"]));
    assert_eq!((cfg["StopSignal"].as_str(), cfg["StopTimeout"].as_i64()), (Some("SIGINT"), Some(7)));
    let host = &c["HostConfig"];
    assert_eq!(
        (host["NanoCpus"].as_i64(), host["Memory"].as_i64(), host["Init"].as_bool()),
        (Some(500_000_000), Some(64 << 20), Some(true))
    );
    assert_eq!(
        (host["MemoryReservation"].as_i64(), host["PidsLimit"].as_i64()),
        (Some(32 << 20), Some(50)),
        "the reservation and the process count limit reach the container"
    );
    let mounts: Vec<(String, String)> = c["Mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["Type"].as_str().unwrap_or("").to_string(), m["Destination"].as_str().unwrap_or("").to_string()))
        .collect();
    for want in [("bind", "/host"), ("tmpfs", "/scratch"), ("volume", "/data")] {
        assert!(
            mounts.iter().any(|(t, dst)| t == want.0 && dst == want.1)
                || host["Mounts"]
                    .as_array()
                    .is_some_and(|ms| ms.iter().any(|m| m["Type"] == want.0 && m["Target"] == want.1)),
            "mount {want:?} in {mounts:?}"
        );
    }
    drop(d);
    let _ = docker_engine::engine(&["volume", "rm", "-f", &volume_name]);
}

#[test]
fn leaving_the_swarm_removes_the_nodes_containers() {
    let Some((d, image)) = engine_daemon() else { return };
    docker(&d, &["service", "create", "--detach", "--name", "leaving", "--replicas", "2", image, "sleep", "1000"]);
    wait_containers(&d, "leaving", 2);
    let out = docker(&d, &["swarm", "leave", "--force"]);
    assert!(out.contains("Node left the swarm."), "{out}");
    let left = docker_engine::containers_of_node(d.node_id());
    assert!(left.is_empty(), "the node's containers are removed with its swarm state: {left:?}");
    assert_eq!(docker(&d, &["info", "--format", "{{.Swarm.LocalNodeState}}"]).trim(), "inactive");
}
