//! Real Python clients for tests (the Docker SDK, schemathesis, prometheus_client's text parsers): a venv under the
//! target dir (`target/test-venv`), created on first use with the pinned `PACKAGES` installed from PyPI by pip, under a
//! file lock so that concurrent test processes make it once; and a runner for a script with that venv's
//! interpreter. A fresh machine needs only `python3` with its `venv` module; `cargo nextest run` does the rest.
//! Must not depend on Shoal's crates.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// What the venv holds, pinned (top-level packages; pip resolves the rest).
pub const PACKAGES: &[&str] = &["docker==7.2.0", "schemathesis==4.32.5", "prometheus_client==0.26.0"];

/// The target dir the running test binary was built into (`CARGO_TARGET_DIR` when set).
fn target_dir() -> Result<PathBuf, String> {
    if let Some(d) = std::env::var_os("CARGO_TARGET_DIR") {
        return Ok(PathBuf::from(d));
    }
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    // target/<profile>/deps/<test binary>
    exe.ancestors().nth(3).map(Path::to_path_buf).ok_or_else(|| format!("no target dir above {}", exe.display()))
}

/// The venv's directory, made (once, under a lock) if missing or holding other packages.
pub fn venv() -> Result<PathBuf, String> {
    let target = target_dir()?;
    let dir = target.join("test-venv");
    let marker = dir.join("shoal-packages.txt");
    let wanted = PACKAGES.join("\n");
    let ready = || std::fs::read_to_string(&marker).is_ok_and(|m| m == wanted);
    if ready() {
        return Ok(dir);
    }
    std::fs::create_dir_all(&target).map_err(|e| format!("{}: {e}", target.display()))?;
    let lock_path = target.join("test-venv.lock");
    let lock = File::create(&lock_path).map_err(|e| format!("{}: {e}", lock_path.display()))?;
    lock.lock().map_err(|e| format!("lock {}: {e}", lock_path.display()))?;
    if ready() {
        return Ok(dir);
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| format!("remove {}: {e}", dir.display()))?;
    }
    run(Command::new("python3").args(["-m", "venv"]).arg(&dir), "python3 -m venv (the venv module of Python 3)")?;
    let mut pip = Command::new(dir.join("bin/pip"));
    pip.args(["install", "--quiet", "--disable-pip-version-check"]).args(PACKAGES);
    run(&mut pip, "pip install")?;
    let mut f = File::create(&marker).map_err(|e| format!("{}: {e}", marker.display()))?;
    f.write_all(wanted.as_bytes()).map_err(|e| format!("{}: {e}", marker.display()))?;
    Ok(dir)
}

fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Runs `program` (an executable of the venv's `bin/`, e.g. "python" or "schemathesis") with `args` and
/// `env`, killed after `limit`. Panics when the venv cannot be made.
pub fn run_in_venv(program: &str, args: &[&str], env: &[(&str, &str)], limit: Duration) -> Output {
    let venv = venv().unwrap_or_else(|e| panic!("the test venv: {e}"));
    let mut cmd = Command::new(venv.join("bin").join(program));
    cmd.args(args).envs(env.iter().copied()).stdin(Stdio::null());
    output_within(&mut cmd, limit).unwrap_or_else(|e| panic!("{program} {args:?}: {e}"))
}

/// The command's output, or an error once `limit` passes (the process is then killed).
fn output_within(cmd: &mut Command, limit: Duration) -> Result<Output, String> {
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(|e| format!("spawn: {e}"))?;
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.map_err(|e| format!("wait: {e}")),
        Err(_) => {
            crate::process::kill9(pid);
            let out = rx.recv().map_err(|e| format!("wait: {e}"))?.map_err(|e| format!("wait: {e}"))?;
            Err(format!(
                "still running after {limit:?}, killed:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }
}

/// Runs a Python script (its source) with the venv's interpreter; see `run_in_venv`.
pub fn run_script(source: &str, env: &[(&str, &str)], limit: Duration) -> Output {
    run_in_venv("python", &["-c", source], env, limit)
}
