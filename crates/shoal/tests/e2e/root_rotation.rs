//! Root CA rotation as a Docker user runs it, with the stock docker CLI, on 3 managers and 2 workers running
//! tasks:
//!
//! - `docker swarm ca --rotate` (a new root made by the cluster) returns once every node holds a certificate
//!   from the new root and trusts it: each node's certificate file verifies against the new root and its root
//!   file is the new root; the same tasks keep running; the worker join token from before is refused.
//! - `docker swarm ca --rotate --ca-cert --ca-key --detach` (a root the operator made) while a worker is down:
//!   `docker info` says "Root Rotation In Progress" and the rotation waits for that node; once it is removed
//!   (`docker node rm --force`), the rotation finishes and `docker swarm ca` prints the given root.

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use common::*;

fn read(d: &DaemonProcess, file: &str) -> String {
    std::fs::read_to_string(d.state_dir().join("certificates").join(file)).unwrap_or_default()
}

/// Whether `d`'s certificate file is signed by `root_pem`'s key and its trusted root file is `root_pem`.
fn holds_cert_from(d: &DaemonProcess, root_pem: &str) -> Result<(), String> {
    let root = shoal_ca::parse_cert_pem_chain(root_pem.as_bytes()).map_err(|e| e.to_string())?;
    let chain = shoal_ca::parse_cert_pem_chain(read(d, "swarm-node.crt").as_bytes()).map_err(|e| e.to_string())?;
    if !shoal_ca::signed_by(&chain[0], &root[0]).map_err(|e| e.to_string())? {
        return Err("its certificate is not signed by the new root".into());
    }
    if read(d, "swarm-root-ca.crt").trim() != root_pem.trim() {
        return Err("its trusted root file is not the new root".into());
    }
    Ok(())
}

fn running_ids(m: &DaemonProcess) -> Vec<String> {
    let mut ids: Vec<String> = tasks_of(m, "steady")
        .iter()
        .filter(|t| state(t) == "running")
        .map(|t| t["ID"].as_str().unwrap_or("").to_string())
        .collect();
    ids.sort();
    ids
}

fn ready_nodes(m: &DaemonProcess) -> usize {
    docker_cli::run(m.socket(), &["node", "ls", "--format", "{{.Status}}"])
        .stdout
        .split(|b| *b == b'\n')
        .filter(|l| l == b"Ready")
        .count()
}

#[test]
fn docker_swarm_ca_rotate_replaces_the_root_on_every_node_while_tasks_keep_running() {
    if no_docker_cli() {
        return;
    }
    let m1 = node_at(61, "rot-m1", None);
    let m2 = node_at(62, "rot-m2", Some((&m1, "Manager")));
    let m3 = node_at(63, "rot-m3", Some((&m1, "Manager")));
    let w1 = node_at(64, "rot-w1", Some((&m1, "Worker")));
    let mut w2 = node_at(65, "rot-w2", Some((&m1, "Worker")));
    wait_until("5 nodes Ready", Duration::from_secs(60), || {
        let n = ready_nodes(&m1);
        if n == 5 {
            Ok(())
        } else {
            Err(format!("{n} Ready"))
        }
    });
    shoal_testkit::managers::create_service(&m1, "steady", 5, &["sleep", "3542"]).unwrap();
    let before = wait_until("5 running tasks", Duration::from_secs(60), || {
        let ids = running_ids(&m1);
        if ids.len() == 5 {
            Ok(ids)
        } else {
            Err(format!("{ids:?}"))
        }
    });
    let old_root = docker(&m1, &["swarm", "ca"]);
    let old_token = docker(&m1, &["swarm", "join-token", "-q", "worker"]).trim().to_string();

    // The stock CLI's rotation: it returns once the rotation is over, printing the new root.
    let child = docker_cli::command(m1.socket(), &["swarm", "ca", "--rotate"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (ok, out) = process::wait_exit(child, Duration::from_secs(120), "docker swarm ca --rotate");
    assert!(ok, "{out}");
    let new_root = docker(&m1, &["swarm", "ca"]);
    assert_ne!(new_root.trim(), old_root.trim(), "a new root");
    assert!(out.contains(new_root.trim()), "the CLI printed the new root:\n{out}");
    let info = docker(&m2, &["info", "--format", "{{.Swarm.Cluster.RootRotationInProgress}}"]);
    assert_eq!(info.trim(), "false");
    for d in [&m1, &m2, &m3, &w1, &w2] {
        wait_until("the node's files hold the new root's certificate", Duration::from_secs(30), || {
            holds_cert_from(d, &new_root)
        });
    }
    assert_eq!(running_ids(&m1), before, "the same tasks kept running");
    assert_eq!(tasks_of(&m1, "steady").len(), 5, "no task was replaced");
    assert_eq!(ready_nodes(&m3), 5, "every node is still Ready");

    // The join token changed with the root; the old one is refused.
    let new_token = docker(&m1, &["swarm", "join-token", "-q", "worker"]).trim().to_string();
    assert_ne!(new_token, old_token);
    let late = DaemonProcess::start_with(
        &shoal_bin(),
        shoal_testkit::DaemonOptions {
            listen_ip: Some("127.0.0.66".into()),
            hostname: Some("rot-late".into()),
            extra_args: vec!["--no-init".into()],
            ..Default::default()
        },
    );
    let out = docker_cli::run(late.socket(), &["swarm", "join", "--token", &old_token, &m1.remote_addr()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("does not match the join token"), "{err}");
    drop(late);

    // A root the operator made, while a worker is down: in progress until that node is removed.
    let dir = tempfile::tempdir().unwrap();
    let given = shoal_ca::RootCa::generate(std::time::SystemTime::now(), &mut rand::rng()).unwrap();
    let (cert_file, key_file) = (dir.path().join("root.crt"), dir.path().join("root.key"));
    std::fs::write(&cert_file, given.cert_pem()).unwrap();
    std::fs::write(&key_file, given.key_pem()).unwrap();
    w2.stop();
    let w2_id = docker(&m1, &["node", "ls", "--filter", "name=rot-w2", "--format", "{{.ID}}"]).trim().to_string();
    let (c, k) = (cert_file.to_str().unwrap(), key_file.to_str().unwrap());
    docker(&m1, &["swarm", "ca", "--rotate", "--detach", "--ca-cert", c, "--ca-key", k]);
    let info = docker(&m1, &["info"]);
    assert!(info.contains("Root Rotation In Progress: true"), "{info}");
    for d in [&m1, &m2, &m3, &w1] {
        wait_until("the running nodes renewed from the given root", Duration::from_secs(60), || {
            let chain =
                shoal_ca::parse_cert_pem_chain(read(d, "swarm-node.crt").as_bytes()).map_err(|e| e.to_string())?;
            let root = shoal_ca::parse_cert_pem_chain(given.cert_pem().as_bytes()).unwrap();
            if shoal_ca::signed_by(&chain[0], &root[0]).map_err(|e| e.to_string())? {
                Ok(())
            } else {
                Err("not yet".into())
            }
        });
    }
    let info = docker(&m2, &["info", "--format", "{{.Swarm.Cluster.RootRotationInProgress}}"]);
    assert_eq!(info.trim(), "true", "the down worker blocks completion");
    docker(&m1, &["node", "rm", "--force", &w2_id]);
    wait_until("the rotation to finish", Duration::from_secs(60), || {
        let info = docker(&m1, &["info", "--format", "{{.Swarm.Cluster.RootRotationInProgress}}"]);
        if info.trim() == "false" {
            Ok(())
        } else {
            Err(info)
        }
    });
    assert_eq!(docker(&m3, &["swarm", "ca"]).trim(), given.cert_pem().trim());
    for d in [&m1, &m2, &m3, &w1] {
        wait_until("the node trusts the given root", Duration::from_secs(30), || holds_cert_from(d, given.cert_pem()));
    }
    wait_until("the service's 5 tasks running on the nodes left", Duration::from_secs(60), || {
        let n = running_ids(&m1).len();
        if n == 5 {
            Ok(())
        } else {
            Err(format!("{n} running"))
        }
    });
}

/// A root CA key in SEC1 form (`EC PRIVATE KEY`, what `openssl ecparam -genkey` and `openssl ec` write) is
/// accepted as Docker accepts it: the rotation finishes and the node's certificate is signed with that key.
#[test]
fn a_root_ca_key_in_sec1_form_rotates_the_root() {
    if no_docker_cli() {
        return;
    }
    let d = daemon();
    let dir = tempfile::tempdir().unwrap();
    let given = shoal_ca::RootCa::generate(std::time::SystemTime::now(), &mut rand::rng()).unwrap();
    let (cert_file, pkcs8_file, key_file) =
        (dir.path().join("root.crt"), dir.path().join("root.p8"), dir.path().join("root.key"));
    std::fs::write(&cert_file, given.cert_pem()).unwrap();
    std::fs::write(&pkcs8_file, given.key_pem()).unwrap();
    let out = std::process::Command::new("openssl")
        .args(["ec", "-in", pkcs8_file.to_str().unwrap(), "-out", key_file.to_str().unwrap()])
        .stderr(Stdio::null())
        .status();
    if !out.is_ok_and(|s| s.success()) {
        eprintln!("skipped: openssl cannot write the key in SEC1 form");
        return;
    }
    let sec1 = std::fs::read_to_string(&key_file).unwrap();
    assert!(sec1.starts_with("-----BEGIN EC PRIVATE KEY-----"), "{sec1}");
    let (c, k) = (cert_file.to_str().unwrap(), key_file.to_str().unwrap());
    docker(&d, &["swarm", "ca", "--rotate", "--ca-cert", c, "--ca-key", k]);
    assert_eq!(docker(&d, &["swarm", "ca"]).trim(), given.cert_pem().trim());
    wait_until("the node holds a certificate from the given root", Duration::from_secs(30), || {
        holds_cert_from(&d, given.cert_pem())
    });
}
