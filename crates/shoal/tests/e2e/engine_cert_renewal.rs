//! A stock Docker Engine worker renews its node certificate with Shoal's NodeCA: the manager issues
//! certificates valid 20 s (`SHOAL_DEBUG_NODE_CERT_EXPIRY_SECS`, test-only), so the engine's agent renews at
//! once and again and again (SwarmKit's renewer aims at 50-80% of the life from the backdated start, already
//! past), and once its first certificate has expired it is still Ready and still gets work. Its own test binary
//! because it sets the environment the daemons inherit. Needs what `engine_worker.rs` needs.

use crate::common;

use std::time::{Duration, SystemTime};

use common::*;
use shoal_testkit::docker_engine;
use shoal_testkit::second_engine::{EngineOptions, SecondEngine};
use shoal_testkit::DaemonOptions;

/// The engine's node certificate (PEM) and its end of validity.
fn engine_cert(eng: &SecondEngine) -> Result<(String, SystemTime), String> {
    let pem = std::fs::read_to_string(eng.data_root().join("swarm/certificates/swarm-node.crt"))
        .map_err(|e| format!("the engine's certificate: {e}"))?;
    let der = shoal_ca::parse_cert_pem_chain(pem.as_bytes()).map_err(|e| e.to_string())?;
    let info = shoal_ca::parse_cert(der.first().ok_or("an empty chain")?).map_err(|e| e.to_string())?;
    Ok((pem, info.not_after))
}

#[test]
fn the_engine_renews_its_certificate_and_keeps_working_after_the_first_expired() {
    if shoal_testkit::prerequisites::skip_unless(shoal_testkit::prerequisites::Prerequisite::Dockerd) {
        return;
    }
    // Set before any daemon starts; this binary has only this test.
    std::env::set_var("SHOAL_DEBUG_NODE_CERT_EXPIRY_SECS", "20");
    let eng = SecondEngine::start(EngineOptions { tag: "r".into(), hostname: "engine-r".into(), manager_ips: 1 });
    let d = DaemonProcess::start_with(
        &shoal_bin(),
        DaemonOptions {
            listen_ip: Some(eng.manager_ip(0)),
            hostname: Some("shoal-0".into()),
            ..DaemonOptions::default()
        },
    );
    let token = shoal_testkit::managers::join_token(&d, "Worker");
    eng.docker_ok(&["swarm", "join", "--token", &token, "--advertise-addr", &eng.ip(), &d.remote_addr()]);
    let node_id = eng.docker_ok(&["info", "--format", "{{.Swarm.NodeID}}"]).trim().to_string();
    let (first, first_end) = engine_cert(&eng).expect("the engine's first certificate");

    // Past the first certificate's end, the engine holds a newer one, still valid.
    wait_until("the engine's first certificate expired and a fresh one in its place", Duration::from_secs(60), || {
        let (pem, end) = engine_cert(&eng)?;
        let now = SystemTime::now();
        if now > first_end + Duration::from_secs(2) && pem != first && end > now {
            Ok(())
        } else {
            Err(format!("renewed: {}, now past the first end: {}", pem != first, now > first_end))
        }
    });

    // Still Ready, and still gets work: new connections use the renewed certificate.
    wait_until("the engine Ready", Duration::from_secs(30), || {
        let ls = docker_cli::ok(d.socket(), &["node", "ls", "--format", "{{.ID}} {{.Status}}"]);
        if ls.lines().any(|l| l == format!("{node_id} Ready")) {
            Ok(())
        } else {
            Err(ls)
        }
    });
    let constraint = format!("node.hostname=={}", eng.hostname());
    docker_cli::ok(
        d.socket(),
        &[
            "service",
            "create",
            "--detach",
            "--name",
            "late",
            "--constraint",
            &constraint,
            docker_engine::TEST_IMAGE,
            "sh",
            "-c",
            "trap 'exit 0' TERM; while :; do sleep 1; done",
        ],
    );
    wait_until("the late service's container on the engine", Duration::from_secs(60), || {
        let ids = eng.running_with_label("com.docker.swarm.service.name", "late");
        if ids.len() == 1 {
            Ok(())
        } else {
            Err(format!("{ids:?}"))
        }
    });
}
