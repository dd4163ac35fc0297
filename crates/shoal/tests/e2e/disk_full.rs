//! A manager whose disk fills up, end to end: a real daemon whose state dir is on a small filesystem of its own
//! (a 64 MiB tmpfs, mounted for the test and unmounted on drop, after the daemon stopped, panics included), a
//! filler file that takes every free byte, writes through the Engine API and the docker CLI. While the disk is
//! full, writes fail with a 503 that names the disk and what to do, `/_ping` answers 500 with `Swarm: error`
//! and `/info` says why; once the filler is gone the manager takes writes again by itself, without a restart,
//! and every write acknowledged before, during and after is there after a restart.

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use shoal_testkit::daemon::DaemonOptions;
use shoal_testkit::http;

/// Size of the test's filesystem.
const DISK_MIB: u64 = 64;
/// Bytes of each secret written: a few writes use up what raft-engine allocated ahead in its log file.
const SECRET_BYTES: usize = 300 << 10; // a multiple of 3
/// How long the manager may take to resume once the filler is gone.
const RESUME_WITHIN: Duration = Duration::from_secs(30);

/// A tmpfs of `DISK_MIB` MiB mounted on a fresh directory; unmounted and removed on drop.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount() -> SmallDisk {
        let dir = tempfile::Builder::new().prefix("shoal-disk-full-").tempdir_in(shoal_testkit::scratch_dir()).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={DISK_MIB}m,mode=0700"), "shoal-disk-full"])
            .arg(dir.path())
            .output()
            .expect("run mount");
        assert!(out.status.success(), "mount a tmpfs: {}", String::from_utf8_lossy(&out.stderr));
        SmallDisk { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let out = Command::new("umount").arg(self.dir.path()).output();
        if !out.is_ok_and(|o| o.status.success()) {
            // Still busy (a daemon that did not exit): detach it, it goes once the last user does.
            let _ = Command::new("umount").arg("-l").arg(self.dir.path()).output();
        }
    }
}

/// Writes a filler file into `dir` until the filesystem is full; returns its path.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).expect("create the filler");
    let chunk = vec![0xa5u8; 1 << 20];
    for size in [1 << 20, 4096, 1] {
        while f.write_all(&chunk[..size]).is_ok() {}
    }
    let _ = f.sync_all();
    path
}

/// `POST /secrets/create` of a secret named `name` holding `SECRET_BYTES` bytes.
fn create_secret(d: &DaemonProcess, name: &str) -> http::Response {
    // Base64 of SECRET_BYTES bytes "s" ("sss" is "c3Nz").
    let data = "c3Nz".repeat(SECRET_BYTES / 3);
    let body = serde_json::json!({ "Name": name, "Data": data }).to_string();
    http::request(d.socket(), "POST", "/v1.47/secrets/create", Some(&body)).expect("an answer")
}

fn secret_names(d: &DaemonProcess) -> Vec<String> {
    let mut names: Vec<String> = d
        .get("/v1.47/secrets")
        .as_array()
        .expect("a list of secrets")
        .iter()
        .map(|s| s["Spec"]["Name"].as_str().unwrap_or_default().to_string())
        .collect();
    names.sort();
    names
}

#[test]
fn a_full_disk_pauses_writes_with_a_clear_503_and_the_manager_resumes_when_space_returns() {
    let disk = SmallDisk::mount();
    let state_dir = disk.path().join("state");
    let opts = DaemonOptions { state_dir: Some(state_dir.clone()), ..DaemonOptions::default() };
    let mut d = DaemonProcess::start_with(&shoal_bin(), opts);
    let mut acked = Vec::new();
    for i in 0..3 {
        let name = format!("before-{i}");
        let r = create_secret(&d, &name);
        assert_eq!(r.status, 201, "{name}: {r:?}");
        acked.push(name);
    }

    let filler = fill(disk.path());
    // raft-engine writes into the space it allocated ahead until that runs out: write until refused.
    let started = Instant::now();
    let refused = loop {
        let name = format!("during-{}", acked.len());
        let r = create_secret(&d, &name);
        match r.status {
            201 => acked.push(name),
            503 => break r,
            other => panic!("{name}: unexpected {other}: {r:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(60), "writes never failed on a full disk");
    };
    let message = refused.body["message"].as_str().unwrap_or_default().to_string();
    let raft_dir = state_dir.join("raft").display().to_string();
    for want in ["disk", "full", "no space left", &raft_dir, &disk.path().display().to_string(), "free at least"] {
        assert!(message.contains(want), "the 503 names {want:?}: {message}");
    }
    assert!(!message.contains("just elected") && !message.contains("quorum"), "no false election story: {message}");

    // The docker CLI shows the same reason.
    if docker_cli::available() {
        let out = docker_cli::run_with_stdin(d.socket(), &["secret", "create", "cli-during", "-"], "x");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "a write on a full disk fails");
        assert!(stderr.contains("no space left") && stderr.contains(&raft_dir), "docker CLI: {stderr}");
    }
    // Health says so too: /_ping fails (500, Swarm: error) and /info carries the reason.
    let ping = http::request(d.socket(), "GET", "/_ping", None).expect("ping");
    assert_eq!(ping.status, 500, "{ping:?}");
    assert!(ping.headers.iter().any(|(k, v)| k == "swarm" && v == "error"), "{ping:?}");
    assert!(ping.body["message"].as_str().unwrap_or_default().contains("no space left"), "{ping:?}");
    let head = http::request(d.socket(), "HEAD", "/v1.41/_ping", None).expect("HEAD ping");
    assert_eq!(head.status, 500, "{head:?}");
    let info = d.get("/v1.47/info");
    assert!(info["Swarm"]["Error"].as_str().unwrap_or_default().contains("no space left"), "{}", info["Swarm"]);
    assert!(
        info["Warnings"].as_array().is_some_and(|w| w.iter().any(|w| w.as_str().unwrap_or("").contains("disk"))),
        "{}",
        info["Warnings"]
    );

    // Space returns: the manager takes writes again by itself.
    std::fs::remove_file(&filler).expect("remove the filler");
    let resumed = Instant::now();
    let name = wait_until("a write succeeds once space returned", RESUME_WITHIN, || {
        let name = format!("after-{}", acked.len());
        let r = create_secret(&d, &name);
        match r.status {
            201 => Ok(name),
            _ => Err(format!("{} {}", r.status, r.body)),
        }
    });
    eprintln!("resumed {:?} after the filler was removed", resumed.elapsed());
    acked.push(name);
    assert_eq!(http::request(d.socket(), "GET", "/_ping", None).expect("ping").status, 200);
    assert!(d.get("/v1.47/info")["Swarm"]["Error"].as_str().unwrap_or_default().is_empty());
    for i in 0..3 {
        let name = format!("after-more-{i}");
        assert_eq!(create_secret(&d, &name).status, 201, "{name}");
        acked.push(name);
    }
    let has_all = |names: &[String], what: &str| {
        for n in &acked {
            assert!(names.contains(n), "{what}: acknowledged secret {n} missing");
        }
    };
    has_all(&secret_names(&d), "before the restart");

    // Every acknowledged write survives a restart.
    assert!(d.stop(), "a clean stop");
    d.restart(&[]);
    has_all(&secret_names(&d), "after the restart");
    let log = d.log();
    for line in
        log.lines().filter(|l| l.contains("disk") || l.contains("resumed") || l.contains("torn") || l.contains("WARN"))
    {
        eprintln!("daemon: {line}");
    }
    assert!(log.contains("raft resumed"), "the manager says it resumed");
    eprintln!("{} writes acknowledged", acked.len());
    drop(d);
    drop(disk);
}
