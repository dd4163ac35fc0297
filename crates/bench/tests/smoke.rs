//! Runs every scenario of the built `shoal-bench` at its `--smoke` size and checks that the last line of its
//! output is a well-formed `RESULT <scenario> <value> <unit>` with a positive value, so the benchmarks keep
//! working as the code changes. Scenarios that start daemons use the `shoal` binary next to `shoal-bench`
//! in the target dir, building it first when it is missing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

fn bench() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_shoal-bench"))
}

/// The `shoal` binary next to `shoal-bench`, built (same profile) if it is not there yet.
fn shoal() -> &'static Path {
    static SHOAL: OnceLock<PathBuf> = OnceLock::new();
    SHOAL.get_or_init(|| {
        let path = bench().with_file_name("shoal");
        if !path.exists() {
            let profile_dir = bench().parent().and_then(|p| p.file_name()).and_then(|n| n.to_str()).unwrap_or("debug");
            let mut cmd = Command::new(env!("CARGO"));
            cmd.args(["build", "-p", "shoal", "--bin", "shoal"]);
            if profile_dir == "release" {
                cmd.arg("--release");
            }
            let status = cmd.status().expect("run cargo build -p shoal");
            assert!(status.success(), "cargo build -p shoal failed");
        }
        assert!(path.exists(), "{} missing after building it", path.display());
        path
    })
}

/// Longest one smoke run may take: well under the test runner's 180 s cut-off, so a run that hangs fails
/// with its own output (the phase it was in) instead of being killed silently.
const RUN_DEADLINE: Duration = Duration::from_secs(100);

/// Runs `shoal-bench <args> --smoke` and returns (scenario, value, unit) from its RESULT line. Its output
/// goes to files (read after it ends, so a full pipe never stalls it); a run past `RUN_DEADLINE` is killed and
/// the test fails with what it printed.
fn smoke(args: &[&str]) -> (String, f64, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let (out_path, err_path) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let mut child = Command::new(bench())
        .args(args)
        .arg("--smoke")
        .env("SHOAL_BIN", shoal())
        .stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("stderr file"))
        .spawn()
        .expect("run shoal-bench");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for shoal-bench") {
            break Some(status);
        }
        if start.elapsed() > RUN_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let Some(status) = status else {
        panic!(
            "shoal-bench {args:?} --smoke still running after {RUN_DEADLINE:?}\nstdout:\n{stdout}\nstderr:\n{stderr}"
        );
    };
    assert!(status.success(), "shoal-bench {args:?} --smoke failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    let last = stdout.lines().last().unwrap_or_default();
    let parts: Vec<&str> = last.split_whitespace().collect();
    assert!(
        parts.len() == 4 && parts[0] == "RESULT",
        "last line is not `RESULT <scenario> <value> <unit>`: {last:?}\nstdout:\n{stdout}"
    );
    let value: f64 = parts[2].parse().unwrap_or_else(|_| panic!("RESULT value {:?} is not a number", parts[2]));
    assert!(value.is_finite() && value >= 0.0, "RESULT value {value} out of range");
    (parts[1].to_string(), value, parts[3].to_string())
}

#[test]
fn scheduler_smoke() {
    let (s, v, u) = smoke(&["scheduler"]);
    assert_eq!((s.as_str(), u.as_str()), ("scheduler", "ms"));
    assert!(v > 0.0);
    let (s, _, _) = smoke(&["scheduler", "--constraints"]);
    assert_eq!(s, "scheduler");
}

#[test]
fn writes_smoke_api_and_cli() {
    let (s, v, u) = smoke(&["writes", "--clients", "4"]);
    assert_eq!((s.as_str(), u.as_str()), ("writes", "creates/s"));
    assert!(v > 0.0);
    let (s, v, _) = smoke(&["writes", "--via", "cli", "--clients", "1"]);
    assert_eq!(s, "writes");
    assert!(v > 0.0);
    let (s, v, _) = smoke(&["writes", "--via", "docker", "--clients", "1"]);
    assert_eq!(s, "writes");
    assert!(v > 0.0);
}

#[test]
fn idle_smoke() {
    let (s, v, u) = smoke(&["idle"]);
    assert_eq!((s.as_str(), u.as_str()), ("idle", "ticks/120s"));
    assert!(v >= 0.0);
}

#[test]
fn e2e_smoke() {
    let (s, v, u) = smoke(&["e2e"]);
    assert_eq!((s.as_str(), u.as_str()), ("e2e", "ms"));
    let (s, g, _) = smoke(&["e2e", "--global"]);
    assert_eq!(s, "e2e-global");
    // Services on an overlay network: the allocator gives every task an address before it is placed.
    let (s, n, _) = smoke(&["e2e", "--network"]);
    assert_eq!(s, "e2e-network");
    assert!(n > 0.0);
    assert!(g > 0.0);
    assert!(v > 0.0);
}

#[test]
fn agents_smoke() {
    let (s, _, u) = smoke(&["agents"]);
    assert_eq!((s.as_str(), u.as_str()), ("agents", "cores"));
    let (s, v, u) = smoke(&["agents", "--job", "1", "--max-concurrent", "20"]);
    assert_eq!((s.as_str(), u.as_str()), ("agents-job", "s"));
    assert!(v > 0.0, "a job of 500 completions takes some time");
    // A global service on the simulated nodes reaches RUNNING on every one (the run fails otherwise).
    let (s, _, u) = smoke(&["agents", "--global"]);
    assert_eq!((s.as_str(), u.as_str()), ("agents", "cores"));
}

#[test]
fn memory_smoke() {
    let (s, v, u) = smoke(&["memory"]);
    assert_eq!((s.as_str(), u.as_str()), ("memory", "MiB"));
    assert!(v > 0.0);
}

#[test]
fn startup_smoke() {
    let (s, v, u) = smoke(&["startup"]);
    assert_eq!((s.as_str(), u.as_str()), ("startup", "ms"));
    assert!(v > 0.0);
}

#[test]
fn failover_smoke() {
    let (s, v, u) = smoke(&["failover"]);
    assert_eq!((s.as_str(), u.as_str()), ("failover", "ms"));
    assert!(v > 0.0);
}
