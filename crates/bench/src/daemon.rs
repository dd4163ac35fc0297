//! A `shoal daemon` under benchmark: its own temporary state dir, control socket and loopback gRPC port,
//! the process executor, default log level (info, to a file). Readiness is polled tightly (a raw
//! `GET /_ping` on the control socket every 0.2 ms) so that start-up can be timed. Dropping it stops the
//! daemon (SIGTERM, then SIGKILL after `STOP_TIMEOUT`) and removes the dir, also when a benchmark fails.
//! Must not depend on any scenario.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::report::BenchError;

/// How long a daemon may take to answer `/_ping` after it is spawned.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a daemon may take to exit after SIGTERM before it is killed.
pub(crate) const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// The hostname the benchmark daemon runs under (its own node).
pub(crate) const MANAGER_HOSTNAME: &str = "shoal-bench-manager";

/// The `shoal` binary: the given path, else `shoal` next to the running `shoal-bench`.
pub(crate) fn shoal_binary(given: Option<PathBuf>) -> PathBuf {
    given.unwrap_or_else(|| {
        let me = std::env::current_exe().unwrap_or_default();
        me.with_file_name("shoal")
    })
}

/// A running daemon, stopped on drop.
pub(crate) struct BenchDaemon {
    child: Option<Child>,
    dir: Option<tempfile::TempDir>,
    socket: PathBuf,
    binary: PathBuf,
    remote: std::net::SocketAddr,
    /// Time from spawn to the first successful `/_ping` (of the latest start, see `restart`).
    pub ready_after: Duration,
}

fn free_port() -> Result<u16, BenchError> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| BenchError::Setup(format!("no free loopback port: {e}")))
}

/// One `GET /_ping` on the control socket; true on a 200 answer.
pub(crate) fn ping(socket: &Path) -> bool {
    let Ok(mut s) = UnixStream::connect(socket) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    if s.write_all(b"GET /_ping HTTP/1.1\r\nHost: shoal\r\nConnection: close\r\n\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 64];
    let mut got = 0;
    while got < 12 {
        match s.read(&mut buf[got..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    buf[..got].starts_with(b"HTTP/1.1 200")
}

impl BenchDaemon {
    /// Starts `binary daemon` and waits until it answers `/_ping`.
    pub(crate) fn start(binary: &Path) -> Result<BenchDaemon, BenchError> {
        if !binary.exists() {
            return Err(BenchError::Daemon(format!(
                "{} not found: build it (cargo build --release) or pass --shoal PATH",
                binary.display()
            )));
        }
        let dir = tempfile::Builder::new()
            .prefix("shoal-bench-")
            .tempdir()
            .map_err(|e| BenchError::Setup(format!("temp dir: {e}")))?;
        let socket = dir.path().join("control.sock");
        let remote: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()?).parse().expect("valid address");
        let mut d = BenchDaemon {
            child: None,
            dir: Some(dir),
            socket,
            binary: binary.to_path_buf(),
            remote,
            ready_after: Duration::ZERO,
        };
        d.spawn_until_ready()?;
        Ok(d)
    }

    /// Stops the daemon (SIGTERM, as an operator would) and starts it again on the same state dir, waiting
    /// until it answers `/_ping`; `ready_after` is then the time of this start (a restart: identity,
    /// certificates and Raft log already on disk).
    pub(crate) fn restart(&mut self) -> Result<(), BenchError> {
        self.stop();
        self.spawn_until_ready()
    }

    fn spawn_until_ready(&mut self) -> Result<(), BenchError> {
        let dir = self.dir.as_ref().map(|d| d.path().to_path_buf()).expect("state dir kept until drop");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("daemon.log"))
            .map_err(|e| BenchError::Setup(format!("daemon log: {e}")))?;
        let log2 = log.try_clone().map_err(|e| BenchError::Setup(format!("daemon log: {e}")))?;
        let start = Instant::now();
        let child = Command::new(&self.binary)
            .arg("daemon")
            .arg("--state-dir")
            .arg(dir.join("state"))
            .arg("--listen-control-api")
            .arg(&self.socket)
            .arg("--listen-remote-api")
            .arg(self.remote.to_string())
            .arg("--executor")
            .arg("process")
            .arg("--hostname")
            .arg(MANAGER_HOSTNAME)
            .env("SHOAL_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| BenchError::Daemon(format!("cannot start {}: {e}", self.binary.display())))?;
        self.child = Some(child);
        loop {
            if ping(&self.socket) {
                self.ready_after = start.elapsed();
                return Ok(());
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                return Err(BenchError::Daemon(format!("exited during start ({status}); log:\n{}", self.log())));
            }
            if start.elapsed() > READY_TIMEOUT {
                return Err(BenchError::Daemon(format!(
                    "no answer on /_ping within {READY_TIMEOUT:?}; log:\n{}",
                    self.log()
                )));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// The control socket (Engine API).
    pub(crate) fn socket(&self) -> &Path {
        &self.socket
    }

    /// The daemon's PID.
    pub(crate) fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    /// What the daemon logged.
    pub(crate) fn log(&self) -> String {
        self.dir.as_ref().and_then(|d| std::fs::read_to_string(d.path().join("daemon.log")).ok()).unwrap_or_default()
    }

    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::SIGTERM);
        let start = Instant::now();
        while start.elapsed() < STOP_TIMEOUT {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for BenchDaemon {
    fn drop(&mut self) {
        self.stop();
        if let Some(d) = self.dir.take() {
            let _ = d.close();
        }
    }
}
