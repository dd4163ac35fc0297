//! A stock Docker Engine worker (Debian's dockerd in a network namespace of its own:
//! `shoal_testkit::second_engine`) beside one Shoal manager, driven with the stock docker CLI:
//!
//! - a task on the engine that uses a secret and a config reads them in its container (`docker exec` on the
//!   engine): the secret at `/run/secrets/<name>`, the config at its target, with the contents created;
//! - `docker swarm ca --rotate` on Shoal finishes with the engine on the new root: its node certificate
//!   (`<data root>/swarm/certificates/swarm-node.crt`) is signed by the new root, its trusted root
//!   (`swarm-root-ca.crt`) is the new root, Shoal counts it (its reported TLS information is the cluster's),
//!   it stays Ready and its service's container keeps running (the same container);
//! - an engine cut off from the manager in mid-rotation blocks it, as a Down node blocks a SwarmKit rotation;
//!   it leaves (`docker swarm leave --force`), Shoal sees it Down, and `docker node rm --force` lets the
//!   rotation finish.
//!
//! docs/engine-worker.md says what the engine calls and what Shoal answers. Needs what `engine_worker.rs`
//! needs (root, the docker CLI, dockerd and the main engine running); fails where the engine is missing,
//! unless `SHOAL_TEST_SKIP_MISSING` names it (`shoal_testkit::prerequisites`).

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use shoal_testkit::docker_engine;
use shoal_testkit::second_engine::{EngineOptions, SecondEngine};
use shoal_testkit::DaemonOptions;

/// How long the engine may take to join and be seen Ready, or tasks to reach a state on it.
const LIMIT: Duration = Duration::from_secs(90);
/// How long a root rotation may take from the CLI's request to its end.
const ROTATION_LIMIT: Duration = Duration::from_secs(90);

/// The second engine (tag `tag`, hostname `engine-<tag>`) and one Shoal manager listening on its first
/// manager address; `None` (with a message) where there is no engine to copy from.
fn engine_and_manager(tag: &str) -> Option<(SecondEngine, DaemonProcess)> {
    if shoal_testkit::prerequisites::skip_unless(shoal_testkit::prerequisites::Prerequisite::Dockerd) {
        return None;
    }
    let eng =
        SecondEngine::start(EngineOptions { tag: tag.to_string(), hostname: format!("engine-{tag}"), manager_ips: 1 });
    let d = DaemonProcess::start_with(
        &shoal_bin(),
        DaemonOptions {
            listen_ip: Some(eng.manager_ip(0)),
            hostname: Some(format!("shoal-{tag}")),
            ..DaemonOptions::default()
        },
    );
    Some((eng, d))
}

/// `docker` against the Shoal manager's control socket.
fn shoal(d: &DaemonProcess, args: &[&str]) -> String {
    docker_cli::ok(d.socket(), args)
}

/// The engine joins `d`'s cluster as a worker; waits until `d` lists it Ready and returns its node ID.
fn join(eng: &SecondEngine, d: &DaemonProcess) -> String {
    let token = shoal_testkit::managers::join_token(d, "Worker");
    eng.docker_ok(&["swarm", "join", "--token", &token, "--advertise-addr", &eng.ip(), &d.remote_addr()]);
    let node_id = eng.docker_ok(&["info", "--format", "{{.Swarm.NodeID}}"]).trim().to_string();
    assert!(!node_id.is_empty(), "the engine names no node ID after joining");
    wait_status(d, &node_id, "Ready");
    node_id
}

/// Waits until `d` lists node `node_id` with status `status`.
fn wait_status(d: &DaemonProcess, node_id: &str, status: &str) {
    wait_until(&format!("node {node_id} {status} on Shoal"), LIMIT, || {
        let ls = shoal(d, &["node", "ls", "--format", "{{.ID}} {{.Status}}"]);
        if ls.lines().any(|l| l == format!("{node_id} {status}")) {
            Ok(())
        } else {
            Err(ls)
        }
    });
}

/// A service of one task on node `node_id` that runs until stopped, with `extra` flags before the image.
fn create_on(d: &DaemonProcess, name: &str, node_id: &str, extra: &[&str]) {
    let constraint = format!("node.id=={node_id}");
    let mut args = vec!["service", "create", "--detach", "--name", name, "--constraint", &constraint];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[docker_engine::TEST_IMAGE, "sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]);
    shoal(d, &args);
}

/// Waits until the engine runs exactly one container of `service`; returns its ID.
fn engine_container(eng: &SecondEngine, service: &str) -> String {
    wait_until(&format!("the container of {service} running on the engine"), LIMIT, || {
        let ids = eng.running_with_label("com.docker.swarm.service.name", service);
        match ids.as_slice() {
            [one] => Ok(one.clone()),
            _ => Err(format!("running: {ids:?}")),
        }
    })
}

/// Whether the Shoal cluster says a root rotation is in progress.
fn rotating(d: &DaemonProcess) -> bool {
    shoal(d, &["info", "--format", "{{.Swarm.Cluster.RootRotationInProgress}}"]).trim() == "true"
}

/// The engine's certificate files (`swarm-node.crt`, `swarm-root-ca.crt`).
fn engine_file(eng: &SecondEngine, file: &str) -> String {
    std::fs::read_to_string(eng.data_root().join("swarm/certificates").join(file)).unwrap_or_default()
}

/// Whether the engine's node certificate is signed by `root_pem`'s key and its trusted root is `root_pem`.
fn engine_holds_cert_from(eng: &SecondEngine, root_pem: &str) -> Result<(), String> {
    let root = shoal_ca::parse_cert_pem_chain(root_pem.as_bytes()).map_err(|e| e.to_string())?;
    let chain =
        shoal_ca::parse_cert_pem_chain(engine_file(eng, "swarm-node.crt").as_bytes()).map_err(|e| e.to_string())?;
    if !shoal_ca::signed_by(&chain[0], &root[0]).map_err(|e| e.to_string())? {
        return Err("its node certificate is not signed by the new root".into());
    }
    if engine_file(eng, "swarm-root-ca.crt").trim() != root_pem.trim() {
        return Err("its trusted root file is not the new root".into());
    }
    Ok(())
}

#[test]
fn a_task_on_the_engine_reads_its_secret_and_config() {
    let Some((eng, d)) = engine_and_manager("s") else { return };
    let node_id = join(&eng, &d);
    const PW: &str = "engine-s3cr3t\nsecond line";
    const CONF: &str = "listen = 8080\nname = \"engine\"\n";
    for (kind, name, content) in [("secret", "app_pw", PW), ("config", "app_conf", CONF)] {
        let out = docker_cli::run_with_stdin(d.socket(), &[kind, "create", name, "-"], content);
        assert!(out.status.success(), "docker {kind} create: {}", String::from_utf8_lossy(&out.stderr));
    }
    create_on(
        &d,
        "uses-both",
        &node_id,
        &["--secret", "app_pw", "--config", "source=app_conf,target=/etc/app/app.conf,mode=0440"],
    );
    let container = engine_container(&eng, "uses-both");
    let secret = eng.docker_ok(&["exec", &container, "cat", "/run/secrets/app_pw"]);
    assert_eq!(secret, PW, "the secret as created");
    let config = eng.docker_ok(&["exec", &container, "cat", "/etc/app/app.conf"]);
    assert_eq!(config, CONF, "the config as created");
    let mode = eng.docker_ok(&["exec", &container, "stat", "-c", "%a", "/etc/app/app.conf"]);
    assert_eq!(mode.trim(), "440", "the config's mode as asked");
    // The engine keeps secrets off its disk, as a Docker manager's workers do.
    let mounts = eng.docker_ok(&["exec", &container, "cat", "/proc/mounts"]);
    assert!(
        mounts.lines().any(|l| l.split(' ').nth(1) == Some("/run/secrets/app_pw") && l.starts_with("tmpfs ")),
        "the secret is a tmpfs mount:\n{mounts}"
    );
}

#[test]
fn docker_swarm_ca_rotate_puts_the_engine_on_the_new_root_while_its_task_runs() {
    let Some((eng, d)) = engine_and_manager("o") else { return };
    let node_id = join(&eng, &d);
    create_on(&d, "steady", &node_id, &[]);
    let container = engine_container(&eng, "steady");
    let old_root = shoal(&d, &["swarm", "ca"]);
    assert_eq!(engine_file(&eng, "swarm-root-ca.crt").trim(), old_root.trim(), "the engine trusts the first root");

    // The stock CLI's rotation: it returns once every node reports a certificate from the new root and trusts
    // it, and the cluster's rotation is over.
    let child = docker_cli::command(d.socket(), &["swarm", "ca", "--rotate"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run docker swarm ca --rotate");
    let (ok, out) = process::wait_exit(child, ROTATION_LIMIT, "docker swarm ca --rotate");
    assert!(ok, "docker swarm ca --rotate:\n{out}\ndockerd log:\n{}", eng.log_tail());
    let new_root = shoal(&d, &["swarm", "ca"]);
    assert_ne!(new_root.trim(), old_root.trim(), "a new root");
    assert!(out.contains(new_root.trim()), "the CLI printed the new root:\n{out}");
    assert!(!rotating(&d), "the rotation is over");

    // Counted: the engine's reported TLS information is the cluster's (trust root and issuer).
    let cluster_tls = shoal(&d, &["info", "--format", "{{json .Swarm.Cluster.TLSInfo}}"]);
    let engine_tls = shoal(&d, &["node", "inspect", &node_id, "--format", "{{json .Description.TLSInfo}}"]);
    assert_eq!(engine_tls.trim(), cluster_tls.trim(), "the engine reports the new root's TLS information");

    // On the engine itself: its certificate from the new root, its trusted root the new root alone.
    wait_until("the engine's files hold the new root's certificate", LIMIT, || engine_holds_cert_from(&eng, &new_root));
    wait_status(&d, &node_id, "Ready");
    assert_eq!(engine_container(&eng, "steady"), container, "the same container kept running");
    let ps = shoal(&d, &["service", "ps", "--format", "{{.CurrentState}}", "steady"]);
    assert_eq!(ps.lines().count(), 1, "no task was replaced: {ps}");
    assert!(ps.starts_with("Running"), "{ps}");

    // The engine still gets work over connections made with its new certificate.
    create_on(&d, "after", &node_id, &[]);
    engine_container(&eng, "after");
}

#[test]
fn an_engine_that_leaves_in_mid_rotation_is_removed_and_the_rotation_finishes() {
    let Some((eng, d)) = engine_and_manager("l") else { return };
    let node_id = join(&eng, &d);
    let old_root = shoal(&d, &["swarm", "ca"]);

    // Cut off from the manager, the engine cannot renew: the rotation waits for it.
    eng.disconnect();
    shoal(&d, &["swarm", "ca", "--rotate", "--detach"]);
    assert!(rotating(&d), "docker info says the rotation is in progress");
    let out = eng.docker_ok(&["swarm", "leave", "--force"]);
    assert!(out.contains("left the swarm"), "{out}");
    assert_eq!(eng.docker_ok(&["info", "--format", "{{.Swarm.LocalNodeState}}"]).trim(), "inactive");
    // The manager's own node renews; the engine, Down, is the one node left, and a Down node still counts, as
    // in SwarmKit: its certificate chains only to the old root.
    let issuer =
        |id: &str| shoal(&d, &["node", "inspect", id, "--format", "{{json .Description.TLSInfo.CertIssuerPublicKey}}"]);
    let old_issuer = shoal(&d, &["info", "--format", "{{json .Swarm.Cluster.TLSInfo.CertIssuerPublicKey}}"]);
    let manager_id = shoal(&d, &["info", "--format", "{{.Swarm.NodeID}}"]).trim().to_string();
    wait_until("the manager's node to report a certificate from the new root", LIMIT, || {
        if issuer(&manager_id) != old_issuer {
            Ok(())
        } else {
            Err("still the old root's".to_string())
        }
    });
    wait_status(&d, &node_id, "Down");
    assert_eq!(issuer(&node_id), old_issuer, "the engine's certificate is still from the old root");
    assert!(rotating(&d), "the rotation waits for the Down engine");

    // Removed, it no longer counts.
    shoal(&d, &["node", "rm", "--force", &node_id]);
    wait_until("the rotation to finish", ROTATION_LIMIT, || {
        if rotating(&d) {
            Err("in progress".to_string())
        } else {
            Ok(())
        }
    });
    let new_root = shoal(&d, &["swarm", "ca"]);
    assert_ne!(new_root.trim(), old_root.trim(), "the new root is the cluster's");
    let nodes = shoal(&d, &["node", "ls", "--format", "{{.ID}}"]);
    assert!(!nodes.contains(&node_id), "the engine is gone from the node list: {nodes}");
}
