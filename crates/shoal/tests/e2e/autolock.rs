//! Encryption at rest and autolock, driven as a user would: the Raft log and snapshots hold nothing readable;
//! `docker swarm update --autolock=true` prints an unlock key; a restarted manager (SIGTERM or kill -9) is
//! locked (only `/_ping`, `/version`, `/info` and `POST /swarm/unlock` answer; `docker service ls` gets
//! Docker's "Swarm is encrypted ..." message) until `docker swarm unlock` brings the right key; a wrong or
//! malformed key is refused and the node stays locked; after `docker swarm unlock-key --rotate` only the new
//! key works; `--autolock=false` makes restarts unlocked again. Also the shoal CLI's `swarm` commands and the
//! daemon's `--unlock-key-file`, and (3 managers) a restarted follower is locked too.

use crate::common;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use common::*;
use serde_json::Value;
use shoal_testkit::http;

const LOCKED_MESSAGE: &str = "Swarm is encrypted and needs to be unlocked before it can be used";
const INVALID_KEY: &str = "swarm could not be unlocked: invalid key provided";

fn create(d: &DaemonProcess, name: &str, labels: Value, argv: &[&str]) -> String {
    let body = serde_json::json!({
        "Name": name,
        "Labels": labels,
        "TaskTemplate": {"ContainerSpec": {"Image": "busybox", "Args": argv},
            "RestartPolicy": {"Delay": 100_000_000u64}},
        "Mode": {"Replicated": {"Replicas": 1}},
    });
    shoal_testkit::managers::post_service(d, &body).unwrap_or_else(|e| panic!("create: {e}"))
}

/// `shoal ARGS` with `input` on stdin (not a terminal: the CLI reads the key from it).
fn shoal_with_stdin(socket: &Path, args: &[&str], input: &str) -> Output {
    process::output_with_stdin(&mut shoal_command(socket, args), input.as_bytes(), "shoal")
}

fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The `SWMKEY-1-...` word in `s`.
fn key_in(s: &str) -> String {
    s.split_whitespace().find(|w| w.starts_with("SWMKEY-1-")).unwrap_or_else(|| panic!("no key in {s:?}")).to_string()
}

fn node_state(d: &DaemonProcess) -> String {
    d.get("/v1.47/info")["Swarm"]["LocalNodeState"].as_str().unwrap_or("").to_string()
}

fn key_files(d: &DaemonProcess) -> (Vec<u8>, String) {
    let dek = std::fs::read(d.state_dir().join("raft").join("dek")).unwrap_or_default();
    let tls = std::fs::read_to_string(d.state_dir().join("certificates").join("swarm-node.key")).unwrap_or_default();
    (dek, tls)
}

/// Waits until this manager's key files are sealed (`true`) or plain (`false`), and differ from `not`.
fn wait_keys(d: &DaemonProcess, sealed: bool, not: Option<&(Vec<u8>, String)>) -> (Vec<u8>, String) {
    wait_until(&format!("key files sealed={sealed}"), Duration::from_secs(20), || {
        let (dek, tls) = key_files(d);
        let dek_sealed = dek.starts_with(b"SHOAL-RAFT-DEK-SEALED");
        let tls_sealed = tls.starts_with("-----BEGIN SHOAL ENCRYPTED PRIVATE KEY-----");
        let changed = not.is_none_or(|n| n.0 != dek && n.1 != tls);
        if dek_sealed == sealed && tls_sealed == sealed && changed {
            Ok((dek, tls))
        } else {
            Err(format!("dek sealed {dek_sealed}, tls key sealed {tls_sealed}, changed {changed}"))
        }
    })
}

/// Waits until the restarted daemon serves the full API again after an unlock.
fn wait_unlocked(d: &DaemonProcess) {
    wait_until("the manager to serve after the unlock", Duration::from_secs(30), || {
        match http::request(d.socket(), "GET", "/v1.47/services", None) {
            Ok(r) if r.status == 200 => Ok(()),
            Ok(r) => Err(format!("{} {}", r.status, r.body)),
            Err(e) => Err(e),
        }
    })
}

fn assert_locked(d: &DaemonProcess) {
    assert_eq!(node_state(d), "locked");
    for path in ["/v1.47/services", "/v1.47/swarm", "/v1.47/swarm/unlockkey", "/v1.47/nodes"] {
        let r = http::request(d.socket(), "GET", path, None).unwrap();
        assert_eq!(r.status, 503, "{path}: {}", r.body);
        assert!(r.body["message"].as_str().unwrap_or("").contains(LOCKED_MESSAGE), "{path}: {}", r.body);
    }
}

#[test]
fn docker_swarm_autolock_unlock_and_rotate() {
    if no_docker_cli() {
        return;
    }
    let mut d = daemon();
    let id = create(&d, "locked-web", serde_json::json!({}), &["sleep", "3741"]);
    wait_running(&d, "locked-web", 1, &["sleep", "3741"], Duration::from_secs(20));
    let plain = wait_keys(&d, false, None);

    // Bad input changes nothing: rotating without autolock.
    let out = docker_cli::run(d.socket(), &["swarm", "unlock-key", "--rotate"]);
    assert!(!out.status.success(), "{}", text(&out));
    let out = docker_cli::run(d.socket(), &["swarm", "unlock-key"]);
    assert!(!out.status.success() && text(&out).contains("no unlock key is set"), "{}", text(&out));

    let printed = docker(&d, &["swarm", "update", "--autolock=true"]);
    let key = key_in(&printed);
    assert_eq!(docker(&d, &["swarm", "unlock-key", "-q"]).trim(), key);
    assert_eq!(d.get("/v1.47/swarm")["Spec"]["EncryptionConfig"]["AutoLockManagers"], true);
    // The DEK, which was on disk in the clear, is replaced and everything re-sealed with the new one.
    wait_until("the DEK rotation", Duration::from_secs(20), || {
        if d.log().contains("the raft data key was rotated") {
            Ok(())
        } else {
            Err("not yet".into())
        }
    });
    let sealed = wait_keys(&d, true, Some(&plain));

    // kill -9, restart: locked. The daemon answers, but only to ping/version/info/unlock.
    d.kill9();
    d.restart(&[]);
    assert_locked(&d);
    let out = docker_cli::run(d.socket(), &["service", "ls"]);
    assert!(!out.status.success() && text(&out).contains(LOCKED_MESSAGE), "{}", text(&out));
    assert!(process::pids_with_cmdline(&["sleep", "3741"]).is_empty(), "a locked manager runs no task");

    // A wrong key, then a malformed one: refused, still locked.
    let wrong = docker_cli::run_with_stdin(
        d.socket(),
        &["swarm", "unlock"],
        "SWMKEY-1-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n",
    );
    assert!(!wrong.status.success() && text(&wrong).contains(INVALID_KEY), "{}", text(&wrong));
    let r =
        http::request(d.socket(), "POST", "/v1.47/swarm/unlock", Some(r#"{"UnlockKey":"SWMKEY-1-tooshort"}"#)).unwrap();
    assert_eq!(r.status, 400, "{}", r.body);
    assert_locked(&d);
    assert_eq!(key_files(&d), sealed, "refused keys change nothing on disk");

    // The right key: the node starts and everything is back.
    let ok = docker_cli::run_with_stdin(d.socket(), &["swarm", "unlock"], &format!("{key}\n"));
    assert!(ok.status.success(), "{}", text(&ok));
    wait_unlocked(&d);
    assert_eq!(node_state(&d), "active");
    assert_eq!(d.get(&format!("/v1.47/services/{id}"))["Spec"]["Name"], "locked-web");
    wait_running(&d, "locked-web", 1, &["sleep", "3741"], Duration::from_secs(30));
    let out = docker_cli::run(d.socket(), &["swarm", "unlock"]);
    assert!(!out.status.success() && text(&out).contains("not locked"), "{}", text(&out));

    // Rotate: the managers rewrap; after a restart the old key is refused and the new one works.
    let rotated = docker(&d, &["swarm", "unlock-key", "--rotate", "-q"]);
    let first_rotation = key_in(&rotated);
    assert_ne!(first_rotation, key);
    let after_first = wait_keys(&d, true, Some(&sealed));
    // As the engine: a rotation with an empty body (only the query flag, as SDK clients send it) rotates
    // too and leaves the spec as it was.
    let swarm = d.get("/v1.47/swarm");
    let path = format!("/v1.47/swarm/update?version={}&rotateManagerUnlockKey=true", swarm["Version"]["Index"]);
    let r = http::request(d.socket(), "POST", &path, None).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let new_key = d.get("/v1.47/swarm/unlockkey")["UnlockKey"].as_str().unwrap().to_string();
    assert!(new_key != first_rotation && new_key.starts_with("SWMKEY-1-"), "{new_key}");
    assert_eq!(d.get("/v1.47/swarm")["Spec"], swarm["Spec"], "the spec is unchanged");
    wait_keys(&d, true, Some(&after_first));
    assert!(d.stop(), "SIGTERM exits cleanly; log:\n{}", d.log());
    d.restart(&[]);
    assert_locked(&d);
    let old = docker_cli::run_with_stdin(d.socket(), &["swarm", "unlock"], &format!("{key}\n"));
    assert!(!old.status.success() && text(&old).contains(INVALID_KEY), "{}", text(&old));
    let ok = docker_cli::run_with_stdin(d.socket(), &["swarm", "unlock"], &format!("{new_key}\n"));
    assert!(ok.status.success(), "{}", text(&ok));
    wait_unlocked(&d);
    wait_running(&d, "locked-web", 1, &["sleep", "3741"], Duration::from_secs(30));

    // Autolock off: plain key files, and a restart is not locked.
    docker(&d, &["swarm", "update", "--autolock=false"]);
    assert_eq!(d.get("/v1.47/swarm")["Spec"]["EncryptionConfig"]["AutoLockManagers"], false);
    wait_keys(&d, false, None);
    assert!(d.stop());
    d.restart(&[]);
    assert_eq!(node_state(&d), "active");
    assert_eq!(d.get(&format!("/v1.47/services/{id}"))["Spec"]["Name"], "locked-web");
}

#[test]
fn shoal_cli_autolock_and_unlock_key_file() {
    let mut d = daemon();
    let id = create(&d, "cli-locked", serde_json::json!({}), &["sleep", "3742"]);
    // Rotating without autolock is refused and changes nothing.
    let swarm = d.get("/v1.47/swarm");
    let path = format!("/v1.47/swarm/update?version={}&rotateManagerUnlockKey=true", swarm["Version"]["Index"]);
    let r = http::request(d.socket(), "POST", &path, Some(&swarm["Spec"].to_string())).unwrap();
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(d.get("/v1.47/swarm")["Version"], swarm["Version"]);
    assert_eq!(d.get("/v1.47/swarm/unlockkey")["UnlockKey"], "");
    let out = shoal_cli(d.socket(), &["swarm", "update", "--autolock=true"]);
    assert!(out.status.success(), "{}", text(&out));
    let key = key_in(&String::from_utf8_lossy(&out.stdout));
    let out = shoal_cli(d.socket(), &["swarm", "unlock-key", "-q"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), key, "{}", text(&out));
    wait_keys(&d, true, None);

    assert!(d.stop());
    d.restart(&[]);
    assert_locked(&d);
    let out = shoal_with_stdin(d.socket(), &["swarm", "unlock"], "SWMKEY-1-notakey\n");
    assert!(!out.status.success() && text(&out).contains("invalid unlock key"), "{}", text(&out));
    let key_file = d.state_dir().parent().unwrap().join("unlock.key");
    std::fs::write(&key_file, format!("{key}\n")).unwrap();
    let out = shoal_cli(d.socket(), &["swarm", "unlock", "--key-file", key_file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    wait_unlocked(&d);
    assert_eq!(d.get(&format!("/v1.47/services/{id}"))["Spec"]["Name"], "cli-locked");

    // The daemon flag: a restart with the key file comes up unlocked.
    assert!(d.stop());
    d.restart(&["--unlock-key-file".into(), key_file.to_str().unwrap().into()]);
    assert_eq!(node_state(&d), "active");
    assert_eq!(d.get(&format!("/v1.47/services/{id}"))["Spec"]["Name"], "cli-locked");
}

/// Every file under `dir` (recursively) containing `needle`.
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut hits = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        let ft = entry.file_type().unwrap();
        if ft.is_dir() {
            hits.extend(files_containing(&p, needle));
        } else if ft.is_file() && std::fs::read(&p).unwrap_or_default().windows(needle.len()).any(|w| w == needle) {
            hits.push(p.display().to_string());
        }
    }
    hits
}

#[test]
fn nothing_readable_in_the_state_dir() {
    let mut d = DaemonProcess::start_with(
        &shoal_bin(),
        shoal_testkit::DaemonOptions {
            extra_args: vec!["--raft-snapshot-interval-entries".into(), "5".into()],
            ..Default::default()
        },
    );
    let marker = "shoal-at-rest-marker-5f1c";
    let first = create(&d, "m0", serde_json::json!({ "secret": marker }), &["sleep", "3743"]);
    for i in 1..8 {
        create(&d, &format!("m{i}"), serde_json::json!({ "secret": marker }), &["sleep", "3743"]);
    }
    // Wait for a snapshot taken after the first service was written: it holds the marker too.
    let first_index = d.get(&format!("/v1.47/services/{first}"))["Version"]["Index"].as_u64().unwrap();
    let snapshots = d.state_dir().join("raft").join("snapshots");
    wait_until("a raft snapshot holding the services", Duration::from_secs(20), || {
        let newest = std::fs::read_dir(&snapshots)
            .map_err(|e| e.to_string())?
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.strip_prefix("snapshot-")?.strip_suffix(".bin")?.parse::<u64>().ok()
            })
            .max()
            .unwrap_or(0);
        if newest >= first_index {
            Ok(())
        } else {
            Err(format!("newest snapshot {newest}, first service at {first_index}"))
        }
    });
    assert!(d.stop());
    assert_eq!(files_containing(d.state_dir(), marker.as_bytes()), Vec::<String>::new());
    // And the encrypted state comes back.
    d.restart(&[]);
    let services = d.get("/v1.47/services");
    assert_eq!(services.as_array().unwrap().len(), 8);
    assert_eq!(services[0]["Spec"]["Labels"]["secret"], marker);
}

fn manager(i: u8, join: Option<&DaemonProcess>) -> DaemonProcess {
    node_at(i, &format!("locked-manager-{i}"), join.map(|j| (j, "Manager")))
}

/// `POST /swarm/update` through `d` with autolock set and, optionally, the unlock key rotated.
fn update_autolock(d: &DaemonProcess, on: bool, rotate: bool) {
    let swarm = d.get("/v1.47/swarm");
    let mut spec = swarm["Spec"].clone();
    spec["EncryptionConfig"]["AutoLockManagers"] = on.into();
    let path = format!("/v1.47/swarm/update?version={}&rotateManagerUnlockKey={rotate}", swarm["Version"]["Index"]);
    let r = http::request(d.socket(), "POST", &path, Some(&spec.to_string())).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
}

fn unlock_key(d: &DaemonProcess) -> String {
    d.get("/v1.47/swarm/unlockkey")["UnlockKey"].as_str().unwrap().to_string()
}

/// Waits until every manager in `ds` reports `key` as the unlock key (followers apply the write later).
fn wait_same_key(ds: &[&DaemonProcess], key: &str) {
    wait_until("every manager to report the unlock key", Duration::from_secs(20), || {
        let seen: Vec<String> = ds.iter().map(|d| unlock_key(d)).collect();
        if seen.iter().all(|k| k == key) {
            Ok(())
        } else {
            Err("another key on some manager".into())
        }
    });
}

fn post_unlock(d: &DaemonProcess, key: &str) -> http::Response {
    http::request(d.socket(), "POST", "/v1.47/swarm/unlock", Some(&serde_json::json!({ "UnlockKey": key }).to_string()))
        .unwrap()
}

#[test]
fn three_managers_every_one_locks_and_rotation_reaches_followers() {
    let m1 = manager(31, None);
    let m2 = manager(32, Some(&m1));
    let mut m3 = manager(33, Some(&m1));
    wait_until("3 managers", Duration::from_secs(30), || {
        let n = shoal_testkit::managers::managers_seen_by(&m1)?.len();
        if n == 3 {
            Ok(())
        } else {
            Err(format!("{n} managers"))
        }
    });
    create(&m1, "before-lock", serde_json::json!({}), &["sleep", "3744"]);
    let plain: Vec<_> = [&m1, &m2, &m3].iter().map(|d| wait_keys(d, false, None)).collect();

    // Autolock through a follower's socket; every manager seals its keys.
    update_autolock(&m2, true, false);
    let key = unlock_key(&m2);
    assert!(key.starts_with("SWMKEY-1-"), "{key:?}");
    wait_same_key(&[&m1, &m3], &key);
    let sealed: Vec<_> = [&m1, &m2, &m3].iter().zip(&plain).map(|(d, p)| wait_keys(d, true, Some(p))).collect();

    // A restarted manager is locked; the others keep the cluster going.
    m3.kill9();
    m3.restart(&[]);
    assert_locked(&m3);
    create(&m1, "while-locked", serde_json::json!({}), &["sleep", "3745"]);
    let r = post_unlock(&m3, "SWMKEY-1-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA");
    assert_eq!((r.status, r.body["message"].as_str()), (401, Some(INVALID_KEY)));
    assert_eq!(post_unlock(&m3, &key).status, 200);
    wait_unlocked(&m3);
    wait_until("the unlocked manager to catch up", Duration::from_secs(30), || {
        let names = service_names(&m3);
        if names.contains(&"while-locked".to_string()) && names.contains(&"before-lock".to_string()) {
            Ok(())
        } else {
            Err(format!("{names:?}"))
        }
    });

    // Rotation: every manager rewraps; a restarted follower takes only the new key. Waited for by the key
    // itself: a file that merely changed is not enough (a manager killed mid-rotation of its data key
    // rewraps once more under the old key when it restarts: CI saw the wait pass on that, and the old key
    // unlock the next restart).
    let _ = sealed;
    update_autolock(&m1, true, true);
    let new_key = unlock_key(&m1);
    assert_ne!(new_key, key);
    wait_same_key(&[&m2, &m3], &new_key);
    for d in [&m1, &m2, &m3] {
        wait_until("the key files sealed under the new key", Duration::from_secs(20), || {
            shoal_node::unlock(d.state_dir(), &new_key).map_err(|e| e.to_string())
        });
        wait_keys(d, true, None);
    }
    m3.kill9();
    m3.restart(&[]);
    assert_locked(&m3);
    assert_eq!(post_unlock(&m3, &key).status, 401, "the old key is refused after a rotation");
    assert_eq!(post_unlock(&m3, &new_key).status, 200);
    wait_unlocked(&m3);
}
