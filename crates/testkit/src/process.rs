//! Looking at processes on this machine (for checks like "3 real `sleep 3141` processes"), and running a
//! command with input on its stdin.

use std::io::Write;
use std::process::{Command, Output, Stdio};

/// PIDs of live (not zombie) processes whose full command line equals `argv` and that descend from this
/// test process (its daemons' tasks, in-process nodes' tasks). nextest runs the tests of every binary at
/// once, so a machine-wide count would also see another test's `sleep 6262` (CI counted 9 processes for a
/// test that started 3). The first call makes this process a child subreaper, so a task's own children
/// orphaned by the task's death stay counted here rather than moving to init.
pub fn pids_with_cmdline(argv: &[&str]) -> Vec<i32> {
    become_subreaper();
    let me = std::process::id() as i32;
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return out };
    for e in entries.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        let args: Vec<&[u8]> = raw.split(|b| *b == 0).filter(|a| !a.is_empty()).collect();
        if args.len() != argv.len() || !args.iter().zip(argv).all(|(a, b)| *a == b.as_bytes()) {
            continue;
        }
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
            .unwrap_or(true);
        if !zombie && descends_from(pid, me) {
            out.push(pid);
        }
    }
    out
}

/// Whether `ancestor` is `pid`'s parent, grandparent, ... (by /proc/<pid>/stat's parent field).
fn descends_from(pid: i32, ancestor: i32) -> bool {
    let mut current = pid;
    // A process tree is far shallower than this; the bound only guards against a racing PID reuse loop.
    for _ in 0..64 {
        let Some(parent) = parent_of(current) else { return false };
        if parent == ancestor {
            return true;
        }
        if parent <= 1 {
            return false;
        }
        current = parent;
    }
    false
}

/// The parent PID of `pid`, or None when it is gone.
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: the fields after the last ')' are state, ppid.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Makes this process the child subreaper of its descendants (once).
fn become_subreaper() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = nix::sys::prctl::set_child_subreaper(true);
    });
}

/// Sends SIGKILL to a process.
pub fn kill9(pid: i32) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
}

/// Waits (at most `limit`) for a child started with piped stdout/stderr to exit; returns whether it exited
/// successfully and what it printed (stderr, then stdout). Kills it and panics with `what` past the limit.
pub fn wait_exit(mut child: std::process::Child, limit: std::time::Duration, what: &str) -> (bool, String) {
    let exited = crate::wait::poll_until(limit, std::time::Duration::from_millis(50), || {
        child.try_wait().expect("try_wait").ok_or_else(|| "still running".to_string())
    });
    match exited {
        Ok(status) => {
            let out = child.wait_with_output().expect("wait_with_output");
            let text = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
            (status.success(), text)
        }
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not exit within {limit:?}");
        }
    }
}

/// Runs `cmd` with `input` written to its stdin (then closed) and waits for it; stdout and stderr captured.
/// `what` names the command in the panic when it cannot be started.
pub fn output_with_stdin(cmd: &mut Command, input: &[u8], what: &str) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {what}: {e}"));
    child.stdin.take().expect("stdin").write_all(input).unwrap_or_else(|e| panic!("write to {what}'s stdin: {e}"));
    child.wait_with_output().unwrap_or_else(|e| panic!("wait for {what}: {e}"))
}
