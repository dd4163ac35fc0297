//! A `shoal daemon` process under test. Each gets its own temporary state dir, control socket and a free
//! loopback port. Dropping it stops the daemon (SIGTERM, then SIGKILL after a bound) and removes the dir, so
//! tests leave nothing behind even when they panic; task processes die with the daemon.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::http;

/// How to start a daemon.
#[derive(Debug, Clone, Default)]
pub struct DaemonOptions {
    /// Extra flags.
    pub extra_args: Vec<String>,
    /// Reuse this state dir instead of a fresh one (for restart tests).
    pub state_dir: Option<PathBuf>,
    /// The `--executor` to use (`process` when unset); kept across restarts.
    pub executor: Option<String>,
    /// The loopback IP the remote API listens on (`127.0.0.1` when unset), e.g. `127.0.0.2` to give each
    /// manager of a multi-manager test its own address; kept across restarts.
    pub listen_ip: Option<String>,
    /// The `--hostname` (`shoal-test-node` when unset); kept across restarts.
    pub hostname: Option<String>,
    /// Run the daemon inside this network namespace (`nsenter --net`, which execs: the PID is the daemon's),
    /// e.g. one of a `netns::Net`; kept across restarts. Then `listen_ip` must be the namespace's address.
    pub netns: Option<String>,
    /// The remote API port (a free port of `listen_ip` when unset; required with `netns`, whose port space
    /// the test cannot probe).
    pub port: Option<u16>,
}

/// A running daemon.
pub struct DaemonProcess {
    binary: PathBuf,
    child: Option<Child>,
    tmp: Option<tempfile::TempDir>,
    state_dir: PathBuf,
    socket: PathBuf,
    port: u16,
    log_path: PathBuf,
    executor: String,
    ip: String,
    hostname: String,
    netns: Option<String>,
}

fn free_port(ip: &str) -> u16 {
    TcpListener::bind((ip, 0)).and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

impl DaemonProcess {
    /// Starts `binary daemon` on a fresh state dir and waits until its control socket answers `/_ping`.
    pub fn start(binary: &Path) -> DaemonProcess {
        DaemonProcess::start_with(binary, DaemonOptions::default())
    }

    /// Starts with options.
    pub fn start_with(binary: &Path, opts: DaemonOptions) -> DaemonProcess {
        let tmp = tempfile::Builder::new().prefix("shoal-test-").tempdir().expect("tempdir");
        let state_dir = opts.state_dir.clone().unwrap_or_else(|| tmp.path().join("state"));
        let socket = tmp.path().join("control.sock");
        let log_path = tmp.path().join("daemon.log");
        let ip = opts.listen_ip.clone().unwrap_or_else(|| "127.0.0.1".into());
        let mut d = DaemonProcess {
            binary: binary.to_path_buf(),
            child: None,
            tmp: Some(tmp),
            state_dir,
            socket,
            port: match (opts.port, &opts.netns) {
                (Some(p), _) => p,
                (None, None) => free_port(&ip),
                (None, Some(ns)) => panic!("DaemonOptions::port is required with netns {ns}"),
            },
            log_path,
            executor: opts.executor.clone().unwrap_or_else(|| "process".into()),
            ip,
            hostname: opts.hostname.clone().unwrap_or_else(|| "shoal-test-node".into()),
            netns: opts.netns.clone(),
        };
        d.spawn(&opts.extra_args);
        d
    }

    /// `binary daemon` with this daemon's state dir, sockets, executor and hostname, then `extra`.
    fn command(&self, extra: &[String]) -> Command {
        let mut cmd = match &self.netns {
            None => Command::new(&self.binary),
            // `nsenter --net`, not `ip netns exec`: the daemon keeps the machine's mount namespace, as a real
            // node's daemon does, so the namespaces its data plane names (the networks', the tasks') are
            // mounted where they outlive it (a killed daemon's docker tasks keep their network).
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/run/netns/{ns}")).arg("--").arg(&self.binary);
                c
            }
        };
        cmd.arg("daemon")
            .arg("--state-dir")
            .arg(&self.state_dir)
            .arg("--listen-control-api")
            .arg(&self.socket)
            .arg("--listen-remote-api")
            .arg(self.remote_addr())
            .arg("--executor")
            .arg(&self.executor)
            .arg("--hostname")
            .arg(&self.hostname)
            .args(self.netns.is_none().then_some("--no-data-plane"))
            .args(extra)
            .env("SHOAL_LOG", "info")
            .stdin(Stdio::null());
        cmd
    }

    fn spawn(&mut self, extra: &[String]) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log_path).expect("daemon log");
        let child = self
            .command(extra)
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("start shoal daemon");
        self.child = Some(child);
        self.wait_ready();
    }

    /// Starts the daemon again on the same state dir (stopped or killed before) when it is expected to
    /// refuse to start: waits up to `limit` for it to exit and returns its exit status and its stderr.
    /// Panics, after killing it, if it is still running then or its control socket answered.
    pub fn start_expecting_exit(&mut self, extra: &[String], limit: Duration) -> (std::process::ExitStatus, String) {
        assert!(self.child.is_none(), "stop or kill the daemon before starting it again");
        let stderr_path = self.log_path.with_file_name("refused-start.stderr");
        let stderr = std::fs::File::create(&stderr_path).expect("stderr file");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log_path).expect("daemon log");
        let mut child = self.command(extra).stdout(log).stderr(stderr).spawn().expect("start shoal daemon");
        let socket = &self.socket;
        // `Some` when it exited, `None` when its control socket answered (it started: fail at once).
        let exited = crate::wait::poll_until(limit, crate::wait::POLL, || {
            if let Some(status) = child.try_wait().expect("wait for the daemon") {
                return Ok(Some(status));
            }
            if http::request(socket, "GET", "/_ping", None).is_ok_and(|r| r.status == 200) {
                return Ok(None);
            }
            Err("still running".to_string())
        });
        let status = match exited {
            Ok(Some(status)) => status,
            answered => {
                let answered = answered.is_ok();
                let _ = child.kill();
                let _ = child.wait();
                let err = std::fs::read_to_string(&stderr_path).unwrap_or_default();
                panic!(
                    "the daemon did not exit within {limit:?} (control socket answered: {answered}); stderr:\n{err}"
                );
            }
        };
        let err = std::fs::read_to_string(&stderr_path).unwrap_or_default();
        // Keep it in the daemon log too, for a failing test's dump.
        if let Ok(mut log) = std::fs::OpenOptions::new().append(true).open(&self.log_path) {
            use std::io::Write;
            let _ = log.write_all(err.as_bytes());
        }
        (status, err)
    }

    fn wait_ready(&mut self) {
        let (socket, log_path, child) = (&self.socket, &self.log_path, &mut self.child);
        let ready = crate::wait::poll_until(Duration::from_secs(30), crate::wait::POLL, || {
            let answer = match http::request(socket, "GET", "/_ping", None) {
                Ok(r) if r.status == 200 => return Ok(()),
                Ok(r) => format!("/_ping answered {}", r.status),
                Err(e) => format!("/_ping: {e}"),
            };
            if let Some(status) = child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                let log = std::fs::read_to_string(log_path).unwrap_or_default();
                panic!("daemon exited during start ({status}); log:\n{log}");
            }
            Err(answer)
        });
        if let Err(last) = ready {
            panic!("daemon did not answer /_ping within 30 s ({last}); log:\n{}", self.log());
        }
    }

    /// The control socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The remote API address (`ip:port`), e.g. for another daemon's `--join-addr`.
    pub fn remote_addr(&self) -> String {
        format!("{}:{}", self.ip, self.port)
    }

    /// Whether the daemon process is running (not stopped or killed by the test).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The state dir.
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// The daemon's PID.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(0)
    }

    /// What the daemon logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// GET a path on the Engine API and return the JSON body, panicking on a non-2xx answer.
    pub fn get(&self, path: &str) -> serde_json::Value {
        let r = http::request(&self.socket, "GET", path, None).expect("request");
        assert!((200..300).contains(&r.status), "GET {path} -> {} {}", r.status, r.body);
        r.body
    }

    /// Stops the daemon with SIGTERM and waits (bounded) for it to exit; returns whether it exited cleanly.
    pub fn stop(&mut self) -> bool {
        let Some(mut child) = self.child.take() else { return true };
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let exited = crate::wait::poll_until(Duration::from_secs(20), crate::wait::POLL, || match child.try_wait() {
            Ok(Some(status)) => Ok(status),
            _ => Err("still running".to_string()),
        });
        match exited {
            Ok(status) => status.success(),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                false
            }
        }
    }

    /// Removes the state dir (the daemon must be stopped or killed): a manager that lost its disk.
    pub fn wipe_state(&mut self) {
        assert!(self.child.is_none(), "stop or kill the daemon before wiping its state");
        if self.state_dir.exists() {
            std::fs::remove_dir_all(&self.state_dir).expect("remove the state dir");
        }
    }

    /// Kills the daemon with SIGKILL (a crash).
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Moves the (stopped) daemon to a free port of `ip` for its next start: a manager whose address changes.
    pub fn move_to(&mut self, ip: &str) {
        assert!(self.child.is_none(), "stop or kill the daemon before moving it");
        assert!(self.netns.is_none(), "a daemon in a network namespace keeps its address");
        self.ip = ip.to_string();
        self.port = free_port(ip);
    }

    /// Starts the daemon again on the same state dir, socket and port.
    pub fn restart(&mut self, extra: &[String]) {
        assert!(self.child.is_none(), "stop or kill the daemon before restarting it");
        self.spawn(extra);
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("--- shoal daemon log ---\n{}", self.log());
        }
        if let Some(tmp) = self.tmp.take() {
            let _ = tmp.close();
        }
    }
}
