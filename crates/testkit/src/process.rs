//! Looking at processes on this machine (for checks like "3 real `sleep 3141` processes"), and running a
//! command with input on its stdin.

use std::io::Write;
use std::process::{Command, Output, Stdio};

/// PIDs of live (not zombie) processes whose full command line equals `argv`.
pub fn pids_with_cmdline(argv: &[&str]) -> Vec<i32> {
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
        if !zombie {
            out.push(pid);
        }
    }
    out
}

/// Sends SIGKILL to a process.
pub fn kill9(pid: i32) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
}

/// Waits (at most `limit`) for a child started with piped stdout/stderr to exit; returns whether it exited
/// successfully and what it printed (stderr, then stdout). Kills it and panics with `what` past the limit.
pub fn wait_exit(mut child: std::process::Child, limit: std::time::Duration, what: &str) -> (bool, String) {
    let start = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            let out = child.wait_with_output().expect("wait_with_output");
            let text = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
            return (status.success(), text);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not exit within {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
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
