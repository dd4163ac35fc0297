//! A second, stock Docker Engine (Debian's `dockerd`, the docker.io package) started by a test, to join a
//! Shoal cluster as a worker with `docker swarm join`. Needs root, iproute2, util-linux (`nsenter`,
//! `unshare`) and the main engine running (its storage driver is reused and the test image is copied from it).
//!
//! The engine runs in a network namespace of its own (`shoal-eng-<pid>-<tag>`) joined to the host by a veth:
//! the engine's side is `eth0` with `10.79.<k>.2/24` and a default route to the host side, `10.79.<k>.1/24`;
//! the host side also carries `10.79.<k>.11`.. (one per manager, [`SecondEngine::manager_ip`]) for the Shoal
//! daemons to listen on, so the engine's swarm traffic goes over the veth. Only the network namespace is
//! entered (`nsenter --net`: `ip netns exec` would remount /sys and hide the cgroup mounts dockerd needs), plus
//! a UTS namespace for its own hostname. It has its own `--data-root`, `--exec-root` (and with it its own
//! containerd), `--pidfile`, unix socket, its own `docker0` inside its namespace, `--config-file` with `{}` (the
//! host's daemon.json names the main engine's data root), and its own containerd namespaces, so the two
//! engines never see each other's containers. `DOCKER_SERVICE_PREFER_OFFLINE_IMAGE=1` makes its swarm
//! executor use the local image without trying a registry.
//!
//! Dropping it force-removes its containers, stops dockerd (SIGTERM, then SIGKILL after 30 s), unmounts what
//! is left under its directory, deletes the namespace (and with it the veth) and the directory, even when the
//! test failed. Namespaces, veths, directories and forwarding rules ([`SecondEngine::forward_with`], marked
//! with the test process's ID) left by a test process that died are removed by the next [`SecondEngine::start`].

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::docker_engine;

/// Prefix of the namespaces this module creates.
const NS_PREFIX: &str = "shoal-eng-";
/// Prefix of the host side of the veths.
const VETH_PREFIX: &str = "she";
/// Prefix of the engine's directories in /tmp (short: containerd's socket paths live under the exec root).
const DIR_PREFIX: &str = "shoal-eng-";
/// With this set to `1`, the engines log at debug level.
pub const ENGINE_DEBUG_ENV: &str = "SHOAL_TEST_ENGINE_DEBUG";
/// How long dockerd may take to answer after it is started.
const START_LIMIT: Duration = Duration::from_secs(90);
/// How long dockerd may take to stop on SIGTERM before it is killed.
const STOP_LIMIT: Duration = Duration::from_secs(30);
/// Most manager addresses on the host side.
pub const MAX_MANAGER_IPS: usize = 8;

/// Runs a command, panicking with its output when it fails.
fn run(args: &[&str]) -> String {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("run {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed ({}): {}{}\n(the second engine needs root, iproute2 and util-linux)",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The main engine's storage driver (fuse-overlayfs on our machines, overlay2 elsewhere).
fn main_storage_driver() -> String {
    docker_engine::engine_ok(&["info", "--format", "{{.Driver}}"]).trim().to_string()
}

/// Mount points at or under `dir`, deepest first.
fn mounts_under(dir: &Path) -> Vec<String> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return Vec::new() };
    let prefix = dir.to_string_lossy().to_string();
    let mut points: Vec<String> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| *p == prefix || p.starts_with(&format!("{prefix}/")))
        .map(str::to_string)
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    points.dedup();
    points
}

/// Unmounts everything at or under `dir` (lazily: a dead engine's shims may still hold them).
fn unmount_under(dir: &Path) {
    for p in mounts_under(dir) {
        let _ = Command::new("umount").args(["-l", &p]).output();
    }
}

fn pid_alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Removes what test processes that no longer exist left behind: namespaces, veths, directories.
fn remove_leftovers() {
    remove_leftover_rules();
    let dead = |rest: &str| rest.split('-').next().and_then(|p| p.parse::<i32>().ok()).is_some_and(|p| !pid_alive(p));
    if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            if name.strip_prefix(NS_PREFIX).is_some_and(dead) {
                let _ = Command::new("ip").args(["netns", "del", name]).output();
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir("/tmp") {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if name.strip_prefix(DIR_PREFIX).is_some_and(dead) {
                unmount_under(&e.path());
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

/// Picks a /24 of 10.79.0.0/16 that no interface of the host uses yet.
fn free_subnet() -> u8 {
    let used = run(&["ip", "-4", "-o", "addr", "show"]);
    let start = (std::process::id() % 200) as u8;
    (0..200u8)
        .map(|i| 20 + (start + i) % 200)
        .find(|k| !used.contains(&format!("10.79.{k}.")))
        .expect("a free 10.79.x.0/24 subnet")
}

/// How to start a second engine.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Short tag, unique among the engines of one test process (names the namespace).
    pub tag: String,
    /// The engine's hostname (what `docker node ls` on Shoal shows).
    pub hostname: String,
    /// How many manager addresses the host side carries (`manager_ip(0..n)`), at most [`MAX_MANAGER_IPS`].
    pub manager_ips: usize,
}

/// A running second engine; see the module doc.
pub struct SecondEngine {
    ns: String,
    veth: String,
    subnet: u8,
    hostname: String,
    dir: PathBuf,
    child: Option<Child>,
}

impl SecondEngine {
    /// Starts the engine and loads the test image into it ([`docker_engine::TEST_IMAGE`], built on the main
    /// engine if missing). Panics (after cleaning up) if it does not answer within 90 s.
    pub fn start(opts: EngineOptions) -> SecondEngine {
        SecondEngine::start_with_flags(opts, &[])
    }

    /// As `start`, with more `dockerd` flags (e.g. `--iptables=false`, `--userland-proxy=false`).
    pub fn start_with_flags(opts: EngineOptions, flags: &[&str]) -> SecondEngine {
        assert!(opts.manager_ips <= MAX_MANAGER_IPS, "at most {MAX_MANAGER_IPS} manager addresses");
        remove_leftovers();
        let image = docker_engine::ensure_test_image();
        let driver = main_storage_driver();
        let pid = std::process::id();
        let dir = std::env::temp_dir().join(format!("{DIR_PREFIX}{pid}-{}", opts.tag));
        let mut eng = SecondEngine {
            ns: format!("{NS_PREFIX}{pid}-{}", opts.tag),
            veth: format!("{VETH_PREFIX}{pid}{}", opts.tag.chars().next().unwrap_or('x')),
            subnet: free_subnet(),
            hostname: opts.hostname.clone(),
            dir,
            child: None,
        };
        assert!(eng.veth.len() <= 15, "veth name {} too long", eng.veth);
        // From here on, a failure still removes whatever was created (Drop).
        std::fs::create_dir_all(&eng.dir).expect("engine dir");
        let k = eng.subnet;
        run(&["ip", "netns", "add", &eng.ns]);
        run(&["ip", "link", "add", &eng.veth, "type", "veth", "peer", "name", "eth0", "netns", &eng.ns]);
        run(&["ip", "addr", "add", &format!("10.79.{k}.1/24"), "dev", &eng.veth]);
        for i in 0..opts.manager_ips {
            run(&["ip", "addr", "add", &format!("{}/32", eng.manager_ip(i)), "dev", &eng.veth]);
        }
        run(&["ip", "link", "set", &eng.veth, "up"]);
        run(&["ip", "-n", &eng.ns, "addr", "add", &format!("{}/24", eng.ip()), "dev", "eth0"]);
        run(&["ip", "-n", &eng.ns, "link", "set", "eth0", "up"]);
        run(&["ip", "-n", &eng.ns, "link", "set", "lo", "up"]);
        run(&["ip", "-n", &eng.ns, "route", "add", "default", "via", &format!("10.79.{k}.1")]);
        let config = eng.dir.join("daemon.json");
        // `SHOAL_TEST_ENGINE_DEBUG=1` turns on dockerd's debug log (libnetwork's gossip and peer events).
        let debug = std::env::var_os(ENGINE_DEBUG_ENV).is_some_and(|v| v == "1");
        std::fs::write(&config, if debug { r#"{"debug": true}"# } else { "{}" }).expect("daemon.json");
        let log = std::fs::File::create(eng.log_path()).expect("dockerd log");
        let child = Command::new("nsenter")
            .arg(format!("--net=/var/run/netns/{}", eng.ns))
            .args(["unshare", "--uts", "--", "sh", "-c", "hostname \"$0\" && exec \"$@\""])
            .arg(&eng.hostname)
            .arg("dockerd")
            .arg("--config-file")
            .arg(&config)
            .arg("--data-root")
            .arg(eng.dir.join("data"))
            .arg("--exec-root")
            .arg(eng.dir.join("exec"))
            .arg("--pidfile")
            .arg(eng.dir.join("docker.pid"))
            .arg("-H")
            .arg(format!("unix://{}", eng.socket().display()))
            .arg("--storage-driver")
            .arg(&driver)
            .arg("--containerd-namespace")
            .arg(format!("shoal-eng-{pid}-{}", opts.tag))
            .arg("--containerd-plugins-namespace")
            .arg(format!("shoal-eng-{pid}-{}-plugins", opts.tag))
            .args(flags)
            .env("DOCKER_SERVICE_PREFER_OFFLINE_IMAGE", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("start dockerd (needs root and util-linux's nsenter and unshare)");
        eng.child = Some(child);
        let start = Instant::now();
        loop {
            if eng.docker(&["version", "--format", "{{.Server.Version}}"]).status.success() {
                break;
            }
            let exited = eng.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
            if exited.is_some() || start.elapsed() > START_LIMIT {
                panic!(
                    "the second engine did not answer within {START_LIMIT:?} (exit: {exited:?}); its log:\n{}",
                    eng.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // The test image, copied from the main engine (no registry anywhere).
        let saved = docker_engine::engine(&["save", image]);
        assert!(saved.status.success(), "docker save {image}: {}", String::from_utf8_lossy(&saved.stderr));
        let mut load = Command::new("docker");
        load.arg("-H").arg(format!("unix://{}", eng.socket().display())).args(["load", "-q"]);
        let out = crate::process::output_with_stdin(load.env_remove("DOCKER_CONTEXT"), &saved.stdout, "docker load");
        assert!(out.status.success(), "docker load into the second engine: {}", String::from_utf8_lossy(&out.stderr));
        eng
    }

    /// The engine's address (its side of the veth): what it advertises to the swarm.
    pub fn ip(&self) -> String {
        format!("10.79.{}.2", self.subnet)
    }

    /// The `i`-th manager address on the host side, for a Shoal daemon's `listen_ip`.
    pub fn manager_ip(&self, i: usize) -> String {
        assert!(i < MAX_MANAGER_IPS, "manager address {i} beyond {MAX_MANAGER_IPS}");
        format!("10.79.{}.{}", self.subnet, 11 + i)
    }

    /// The engine's hostname.
    pub fn hostname(&self) -> &str {
        &self.hostname
    }

    /// The engine's `--data-root` (its swarm state is under `swarm/`, its node certificate at
    /// `swarm/certificates/swarm-node.crt`).
    pub fn data_root(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The engine's network namespace (for checks that it is gone after a drop).
    pub fn netns(&self) -> &str {
        &self.ns
    }

    /// The engine's API socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("docker.sock")
    }

    /// dockerd's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("dockerd.log")
    }

    /// The last 60 lines of dockerd's log (for failure messages).
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    /// Runs `docker -H <this engine> ARGS...`.
    pub fn docker(&self, args: &[&str]) -> Output {
        Command::new("docker")
            .arg("-H")
            .arg(format!("unix://{}", self.socket().display()))
            .args(args)
            .env_remove("DOCKER_HOST")
            .env_remove("DOCKER_CONTEXT")
            .stdin(Stdio::null())
            .output()
            .expect("run docker")
    }

    /// Runs `docker -H <this engine> ARGS...` and returns stdout; panics with stderr and the engine's log
    /// tail when it fails.
    pub fn docker_ok(&self, args: &[&str]) -> String {
        let out = self.docker(args);
        assert!(
            out.status.success(),
            "docker -H <second engine> {args:?} failed ({}): {}\ndockerd log:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            self.log_tail()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// IDs of the engine's running containers whose label `key` equals `value`.
    pub fn running_with_label(&self, key: &str, value: &str) -> Vec<String> {
        let filter = format!("label={key}={value}");
        self.docker_ok(&["ps", "-q", "--no-trunc", "--filter", &filter]).lines().map(str::to_string).collect()
    }

    /// Takes the engine's side of the veth down: from then on it reaches no manager (its routes go with the
    /// link), while dockerd and its containers keep running. There is no way back for this engine: a test that
    /// needs it connected again starts another.
    pub fn disconnect(&self) {
        run(&["ip", "-n", &self.ns, "link", "set", "eth0", "down"]);
    }

    /// dockerd's PID, while it runs.
    pub fn dockerd_pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

/// Forwarding between two engines' veths on the host, until dropped (see [`SecondEngine::forward_with`]).
#[derive(Debug)]
pub struct Forwarding {
    rules: Vec<Vec<String>>,
}

impl Drop for Forwarding {
    fn drop(&mut self) {
        for r in &self.rules {
            let mut args = vec!["-D".to_string()];
            args.extend(r.iter().cloned());
            let _ = Command::new("iptables").args(&args).output();
        }
    }
}

/// The comment that marks this process's forwarding rules (leftovers of dead processes are removed by it).
fn forward_comment(pid: u32) -> String {
    format!("{NS_PREFIX}{pid}")
}

/// Removes forwarding rules whose test process no longer exists.
fn remove_leftover_rules() {
    let Ok(out) = Command::new("iptables").args(["-S", "FORWARD"]).output() else { return };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(rest) = line.strip_prefix("-A ") else { continue };
        let Some(pid) = rest.split(NS_PREFIX).nth(1).and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next()) else {
            continue;
        };
        if pid.parse::<i32>().is_ok_and(|p| !pid_alive(p)) {
            let mut args = vec!["-D"];
            args.extend(rest.split_whitespace().map(|a| a.trim_matches('"')));
            let _ = Command::new("iptables").args(&args).output();
        }
    }
}

impl SecondEngine {
    /// Lets this engine and `other` reach each other through the host, as two machines on one network do:
    /// the host forwards between their veths (a host running Docker drops forwarded packets it does not
    /// know: FORWARD policy DROP). Overlay traffic between engines (gossip on 7946, VXLAN on 4789) takes this
    /// path. The rules go when the returned guard drops (or with the next `start` after a crash).
    pub fn forward_with(&self, other: &SecondEngine) -> Forwarding {
        let comment = forward_comment(std::process::id());
        let mut rules = Vec::new();
        for (a, b) in [(&self.veth, &other.veth), (&other.veth, &self.veth)] {
            let rule: Vec<String> =
                ["FORWARD", "-i", a, "-o", b, "-m", "comment", "--comment", &comment, "-j", "ACCEPT"]
                    .iter()
                    .map(|x| x.to_string())
                    .collect();
            let mut args = vec!["-I".to_string(), "FORWARD".to_string(), "1".to_string()];
            args.extend(rule[1..].iter().cloned());
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let mut cmd = vec!["iptables"];
            cmd.extend(args);
            run(&cmd);
            rules.push(rule);
        }
        Forwarding { rules }
    }
}

impl Drop for SecondEngine {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if matches!(child.try_wait(), Ok(None)) {
                let ids = self.docker(&["ps", "-aq"]);
                let ids: Vec<String> = String::from_utf8_lossy(&ids.stdout)
                    .lines()
                    .map(str::to_string)
                    .filter(|l| !l.is_empty())
                    .collect();
                if !ids.is_empty() {
                    let mut args = vec!["rm", "-f"];
                    args.extend(ids.iter().map(String::as_str));
                    let _ = self.docker(&args);
                }
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(child.id() as i32),
                    nix::sys::signal::Signal::SIGTERM,
                );
                let start = Instant::now();
                while matches!(child.try_wait(), Ok(None)) && start.elapsed() < STOP_LIMIT {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        // A killed dockerd leaves its containerd (and shims) behind: they run with the exec root in their
        // command line.
        let exec_root = self.dir.join("exec").to_string_lossy().to_string();
        for pid in processes_mentioning(&exec_root) {
            crate::process::kill9(pid);
        }
        unmount_under(&self.dir);
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
        let _ = Command::new("ip").args(["link", "del", &self.veth]).output();
        if std::thread::panicking() {
            // A failed test keeps the engine's whole log (its tail is often not enough to see why).
            let kept = std::env::temp_dir().join(format!("shoal-dockerd-log-{}.log", self.ns));
            if std::fs::copy(self.log_path(), &kept).is_ok() {
                eprintln!("--- engine {}: dockerd's log kept at {} ---", self.hostname, kept.display());
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// PIDs of processes whose command line contains `needle`.
fn processes_mentioning(needle: &str) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return out };
    for e in entries.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        if String::from_utf8_lossy(&raw).contains(needle) && pid != std::process::id() as i32 {
            out.push(pid);
        }
    }
    out
}
