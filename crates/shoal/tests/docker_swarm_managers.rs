//! Shoal managers and a Docker swarm's managers (issue 36; docs/design/swarm-migration.md). A Shoal manager
//! cannot be a member of a Docker swarm's Raft group yet, and the swarm must not pay for trying: a
//! `docker swarm join` with a Docker swarm's manager token on a Shoal node is refused before Raft is asked
//! (the Docker manager would add the node as a voter and lose its quorum when it cannot keep up), saying why
//! and what to do, and the Docker swarm keeps working.
//!
//! Needs root, the docker CLI, dockerd (docker.io) and the main engine running (`shoal_testkit::second_engine`);
//! fails where the engine is missing, unless `SHOAL_TEST_SKIP_MISSING` names it.

mod common;

use common::*;
use shoal_testkit::second_engine::{EngineOptions, SecondEngine};
use shoal_testkit::DaemonOptions;

#[test]
fn a_shoal_node_refuses_to_join_a_docker_swarms_managers_and_the_swarm_keeps_its_quorum() {
    if shoal_testkit::prerequisites::skip_unless(shoal_testkit::prerequisites::Prerequisite::Dockerd) {
        return;
    }
    let eng = SecondEngine::start(EngineOptions { tag: "dsm".into(), hostname: "docker-mgr".into(), manager_ips: 1 });
    eng.docker_ok(&["swarm", "init", "--advertise-addr", &eng.ip()]);
    let token = eng.docker_ok(&["swarm", "join-token", "-q", "manager"]).trim().to_string();
    let d = DaemonProcess::start_with(
        &shoal_bin(),
        DaemonOptions {
            listen_ip: Some(eng.manager_ip(0)),
            hostname: Some("shoal-0".into()),
            extra_args: vec!["--no-init".into()],
            ..DaemonOptions::default()
        },
    );
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
