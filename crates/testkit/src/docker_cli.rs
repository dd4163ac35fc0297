//! The stock docker CLI pointed at a Shoal control socket.

use std::path::Path;
use std::process::{Command, Output};

/// True when a `docker` binary is on PATH.
pub fn available() -> bool {
    Command::new("docker").arg("--version").output().map(|o| o.status.success()).unwrap_or(false)
}

/// The command `docker -H unix://SOCKET ARGS...` with an empty config dir (no contexts, no credentials),
/// not started.
pub fn command(socket: &Path, args: &[&str]) -> Command {
    let config = crate::scratch_dir().join("docker-config");
    let _ = std::fs::create_dir_all(&config);
    let mut cmd = Command::new("docker");
    cmd.arg("--config")
        .arg(&config)
        .arg("-H")
        .arg(format!("unix://{}", socket.display()))
        .args(args)
        .env_remove("DOCKER_HOST")
        .env_remove("DOCKER_CONTEXT");
    cmd
}

/// Runs `docker -H unix://SOCKET ARGS...` (see [`command`]).
pub fn run(socket: &Path, args: &[&str]) -> Output {
    command(socket, args).output().expect("run docker")
}

/// Runs `docker -H unix://SOCKET ARGS...` with `input` on its stdin (not a terminal: e.g. `docker swarm
/// unlock` reads the key from it).
pub fn run_with_stdin(socket: &Path, args: &[&str], input: &str) -> Output {
    crate::process::output_with_stdin(&mut command(socket, args), input.as_bytes(), "docker")
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
