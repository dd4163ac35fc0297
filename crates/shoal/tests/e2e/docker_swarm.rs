//! Shoal nodes in a Docker swarm (issue 36; docs/design/swarm-migration.md).
//!
//! - As a worker: `docker swarm join` with the swarm's worker token on a Shoal node makes it a worker of the
//!   Docker swarm. Docker's managers see it Ready, and a service constrained to it runs there (the task's
//!   process is checked in /proc) and is stopped when the service is removed.
//! - As a manager: a Shoal manager cannot be a member of a Docker swarm's Raft group yet, and the swarm must
//!   not pay for trying. A join with the manager token is refused before Raft is asked (the Docker manager
//!   would add the node as a voter and lose its quorum when it cannot keep up), saying why and what to do,
//!   and the Docker swarm keeps working.
//!
//! Needs root, the docker CLI, dockerd (docker.io) and the main engine running (`shoal_testkit::second_engine`);
//! fails where the engine is missing, unless `SHOAL_TEST_SKIP_MISSING` names it.

use crate::common;

use std::time::Duration;

use common::*;
use shoal_testkit::second_engine::{EngineOptions, SecondEngine};
use shoal_testkit::DaemonOptions;

/// How long the swarm may take to see the Shoal node, and to run or stop its task.
const LIMIT: Duration = Duration::from_secs(90);

/// A Docker swarm of one manager on a second engine (tag `tag`), and a `--no-init` Shoal daemon `hostname`
/// on the engine's first manager address.
fn docker_swarm_and_shoal_node(tag: &str, hostname: &str) -> Option<(SecondEngine, DaemonProcess)> {
    if shoal_testkit::prerequisites::skip_unless(shoal_testkit::prerequisites::Prerequisite::Dockerd) {
        return None;
    }
    let eng = SecondEngine::start(EngineOptions { tag: tag.into(), hostname: format!("docker-{tag}"), manager_ips: 1 });
    eng.docker_ok(&["swarm", "init", "--advertise-addr", &eng.ip()]);
    let d = DaemonProcess::start_with(
        &shoal_bin(),
        DaemonOptions {
            listen_ip: Some(eng.manager_ip(0)),
            hostname: Some(hostname.into()),
            extra_args: vec!["--no-init".into()],
            ..DaemonOptions::default()
        },
    );
    Some((eng, d))
}

#[test]
fn a_shoal_node_joins_a_docker_swarm_as_a_worker_and_runs_its_tasks() {
    let Some((eng, d)) = docker_swarm_and_shoal_node("dsw", "shoal-w") else { return };
    let image = shoal_testkit::docker_engine::test_image_or_skip().expect("the test image");
    let token = eng.docker_ok(&["swarm", "join-token", "-q", "worker"]).trim().to_string();
    let addr = d.remote_addr();
    let manager = format!("{}:2377", eng.ip());
    let out = docker_cli::ok(
        d.socket(),
        &["swarm", "join", "--token", &token, "--listen-addr", &addr, "--advertise-addr", &addr, &manager],
    );
    assert!(out.contains("This node joined a swarm as a worker."), "{out}");
    wait_until("the Docker manager lists the Shoal node Ready", LIMIT, || {
        let ls = eng.docker_ok(&["node", "ls", "--format", "{{.Hostname}} {{.Status}}"]);
        if ls.lines().any(|l| l == "shoal-w Ready") {
            Ok(())
        } else {
            Err(ls)
        }
    });
    // A service for the Shoal node only, its task a process with an argument no other process has.
    let argv = ["sleep", "7291"];
    eng.docker_ok(
        &["service", "create", "-d", "--name", "onshoal", "--constraint", "node.hostname==shoal-w", image]
            .iter()
            .chain(&argv)
            .copied()
            .collect::<Vec<_>>(),
    );
    wait_until("the task running on the Shoal node", LIMIT, || {
        let ps = eng.docker_ok(&["service", "ps", "--format", "{{.Node}} {{.CurrentState}}", "onshoal"]);
        let pids = shoal_testkit::process::pids_with_cmdline(&argv);
        if ps.lines().any(|l| l.starts_with("shoal-w Running")) && pids.len() == 1 {
            Ok(())
        } else {
            Err(format!("{ps} pids {pids:?}"))
        }
    });
    eng.docker_ok(&["service", "rm", "onshoal"]);
    wait_until("the task's process stopped", LIMIT, || {
        let pids = shoal_testkit::process::pids_with_cmdline(&argv);
        if pids.is_empty() {
            Ok(())
        } else {
            Err(format!("{pids:?}"))
        }
    });
}

#[test]
fn a_shoal_node_refuses_to_join_a_docker_swarms_managers_and_the_swarm_keeps_its_quorum() {
    let Some((eng, d)) = docker_swarm_and_shoal_node("dsm", "shoal-0") else { return };
    let token = eng.docker_ok(&["swarm", "join-token", "-q", "manager"]).trim().to_string();
    let addr = d.remote_addr();
    let manager = format!("{}:2377", eng.ip());
    let out = docker_cli::run(
        d.socket(),
        &["swarm", "join", "--token", &token, "--listen-addr", &addr, "--advertise-addr", &addr, &manager],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the join went through: {}", String::from_utf8_lossy(&out.stdout));
    assert!(
        err.contains(&format!("the manager at {manager} refused the join: it is a Docker Engine's swarm manager"))
            && err.contains("join this node with the swarm's worker token instead"),
        "{err}\n{}",
        d.log()
    );
    let state = docker_cli::ok(d.socket(), &["info", "--format", "{{.Swarm.LocalNodeState}}"]);
    assert_eq!(state.trim(), "inactive", "the Shoal node stays in no swarm");

    // The Docker swarm has one manager still, and it leads and writes.
    let managers = eng.docker_ok(&["info", "--format", "{{.Swarm.Managers}}"]);
    assert_eq!(managers.trim(), "1", "the Docker swarm's managers: {}", eng.docker_ok(&["node", "ls"]));
    eng.docker_ok(&["network", "create", "-d", "overlay", "after-the-refusal"]);
    eng.docker_ok(&["network", "rm", "after-the-refusal"]);
}
