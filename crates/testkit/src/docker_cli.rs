//! The stock docker CLI pointed at a Shoal control socket.

use std::path::Path;
use std::process::{Command, Output};

/// True when a `docker` binary is on PATH.
pub fn available() -> bool {
    Command::new("docker").arg("--version").output().map(|o| o.status.success()).unwrap_or(false)
}

/// Runs `docker -H unix://SOCKET ARGS...` with an empty config dir (no contexts, no credentials).
pub fn run(socket: &Path, args: &[&str]) -> Output {
    let config = std::env::temp_dir().join("shoal-test-docker-config");
    let _ = std::fs::create_dir_all(&config);
    Command::new("docker")
        .arg("--config")
        .arg(&config)
        .arg("-H")
        .arg(format!("unix://{}", socket.display()))
        .args(args)
        .env_remove("DOCKER_HOST")
        .env_remove("DOCKER_CONTEXT")
        .output()
        .expect("run docker")
}

/// Runs the docker CLI and returns stdout, panicking with stderr when it fails.
pub fn ok(socket: &Path, args: &[&str]) -> String {
    let out = run(socket, args);
    assert!(
        out.status.success(),
        "docker {args:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
