//! `ProcessExecutor`: runs a task's `ContainerSpec` command (+ args) as a local process, with the spec's
//! environment and working directory, stdout/stderr relayed line by line, timestamped, to
//! `state_dir/tasks/<task id>/{stdout,stderr}.log` (`logs`), in its own process group. The image is not
//! used (there is no container runtime here).
//!
//! Children must die with the daemon, even on `kill -9`: every process gets PR_SET_PDEATHSIG(SIGKILL), and
//! is forked from one long-lived spawner thread (the death signal fires when the forking *thread* exits,
//! so spawning from short-lived blocking-pool threads would kill tasks at random). Stop = SIGTERM to the
//! process group, SIGKILL after the stop grace period. Controllers kill their process group on drop.
//!
//! Environment: the process gets PATH (the daemon's, or a default) plus the spec's `env`; nothing else of
//! the daemon's environment leaks in. A task with secrets or configs also gets `SHOAL_SECRETS_DIR` and
//! `SHOAL_CONFIGS_DIR`: its two directories on the node's tmpfs (`task_files`), written in `prepare` and
//! removed with the task (or when the agent stops: processes die with it). Must not depend on the session or
//! gRPC.
//!
//! Networks: with the node's data plane (`with_network`), a task attached to networks runs in a network
//! namespace of its own (`/run/netns/shl-task-<task id>`, made in `prepare`, plumbed by the data plane before
//! `start` goes on, deleted in `remove`). The process enters it with `setns` between fork and exec, and in a
//! mount namespace of its own (`unshare(CLONE_NEWNS)`, mounts made private) gets the task's
//! `state_dir/tasks/<id>/resolv.conf` (the node's resolver at 127.0.0.11) bind-mounted over
//! `/etc/resolv.conf`: the rest of the file system is the node's, as for any process task. Without the data
//! plane, such a task is rejected with the reason the node has none. A networked task told to stop keeps
//! running until this node's VIPs dropped it and then `NETWORK_DRAIN` more before its stop signal, so that no
//! VIP sends it new connections as it goes. Its published ports are forwarded by the node's data plane
//! (ingress ports from every node, host-mode ports from this one); what the plane cannot forward is refused
//! (`ports_a_process_cannot_honour`).
//!
//! Mounts: bind mounts, and cluster mounts (which the worker turns into binds of the volumes' publish paths),
//! are made in the process's own mount namespace over the node's existing paths (`mounts`); volume and tmpfs
//! mounts need a container and are refused.

pub(crate) mod logs;
mod mounts;
pub(crate) mod privileges;
mod spawner;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use shoal_api::{task_spec, ContainerSpec, EngineDescription, NodeDescription, Platform, Resources, Task};

use crate::dependencies::FileKind;
use crate::exec::{stop_grace_period, BoxFuture, Controller, Executor, ExecutorError, ExitStatus, TaskFiles};
use crate::network::NetworkPlane;
use crate::task_files::{process_place, FilesRoot, CONFIGS_DIR_ENV, SECRETS_DIR_ENV};
use spawner::Spawner;

/// How long an exited task's output relays get to record its last lines.
pub(crate) const RELAY_DRAIN: Duration = Duration::from_secs(1);

/// How long a task on a network keeps running after this node's VIPs dropped it, before its stop signal: the
/// time for the other nodes to drop it too.
pub(crate) const NETWORK_DRAIN: Duration = Duration::from_secs(2);

/// PATH given to tasks when the daemon has none.
pub(crate) const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Runs tasks as local processes.
pub struct ProcessExecutor {
    state_dir: PathBuf,
    hostname: String,
    engine_labels: HashMap<String, String>,
    spawner: Arc<Spawner>,
    /// Where task secrets and configs are written (`None`: tasks that have any are rejected).
    files_root: Option<FilesRoot>,
    /// The node's data plane, or why there is none (tasks with networks are then rejected with it).
    network: Result<Arc<NetworkPlane>, String>,
}

impl std::fmt::Debug for ProcessExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessExecutor").field("state_dir", &self.state_dir).finish()
    }
}

impl ProcessExecutor {
    /// An executor keeping task files under `state_dir/tasks/`. Starts the spawner thread, which lives as
    /// long as this executor or any of its controllers.
    pub fn new(
        state_dir: impl Into<PathBuf>,
        hostname: &str,
        engine_labels: HashMap<String, String>,
    ) -> ProcessExecutor {
        ProcessExecutor {
            state_dir: state_dir.into(),
            hostname: hostname.to_string(),
            engine_labels,
            spawner: Arc::new(Spawner::start()),
            files_root: None,
            network: Err("the daemon was started without the data plane".into()),
        }
    }

    /// Connects tasks to their networks through `plane` (`Err`: why this node has no data plane).
    pub fn with_network(mut self, plane: Result<Arc<NetworkPlane>, String>) -> ProcessExecutor {
        self.network = plane;
        self
    }

    /// Writes task secrets and configs under `root` (on a tmpfs). Files left there by an earlier run of the
    /// agent belong to processes that died with it: they are removed now.
    pub fn with_files_root(mut self, root: FilesRoot) -> ProcessExecutor {
        root.sweep(&Default::default());
        self.files_root = Some(root);
        self
    }

    /// The directory of one task's files.
    pub fn task_dir(&self, task_id: &str) -> PathBuf {
        self.state_dir.join("tasks").join(task_id)
    }
}

/// Docker's name for this machine's architecture.
pub(crate) fn docker_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "x86_64",
        "aarch64" => "aarch64",
        "arm" => "armv7l",
        "x86" => "i386",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        other => other,
    }
}

/// Total memory from /proc/meminfo, in bytes (0 when unreadable).
fn total_memory_bytes() -> i64 {
    let Ok(text) = std::fs::read_to_string("/proc/meminfo") else { return 0 };
    text.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<i64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn container_spec(task: &Task) -> Option<&ContainerSpec> {
    match task.spec.as_ref()?.runtime.as_ref()? {
        task_spec::Runtime::Container(c) => Some(c),
        task_spec::Runtime::Attachment(_) => None,
    }
}

/// The settings of a task that a plain process cannot have (they need a container), named as the Engine API
/// names them. A task that sets any is rejected with them named, never run without them.
fn settings_a_process_cannot_honour(task: &Task, c: &ContainerSpec) -> Vec<&'static str> {
    let limits = task.spec.as_ref().and_then(|s| s.resources.as_ref()).and_then(|r| r.limits.as_ref());
    let checks: [(&'static str, bool); 16] = [
        ("ContainerSpec.User", !c.user.is_empty()),
        ("ContainerSpec.Groups", !c.groups.is_empty()),
        ("ContainerSpec.Hostname", !c.hostname.is_empty()),
        ("ContainerSpec.DNSConfig", c.dns_config.as_ref().is_some_and(|d| *d != Default::default())),
        ("ContainerSpec.Hosts", !c.hosts.is_empty()),
        ("ContainerSpec.Healthcheck", c.healthcheck.as_ref().is_some_and(|h| *h != Default::default())),
        ("ContainerSpec.TTY", c.tty),
        ("ContainerSpec.OpenStdin", c.open_stdin),
        ("ContainerSpec.ReadOnly", c.read_only),
        ("ContainerSpec.StopSignal", !c.stop_signal.is_empty()),
        ("ContainerSpec.Init", c.init == Some(true)),
        ("Resources.Limits.NanoCPUs", limits.is_some_and(|l| l.nano_cpus != 0)),
        ("Resources.Limits.MemoryBytes", limits.is_some_and(|l| l.memory_bytes != 0)),
        ("Resources.Limits.Pids", c.pids_limit != 0),
        ("ContainerSpec.Sysctls", !c.sysctls.is_empty()),
        // The task's own, or the cluster's default: a process's output is kept by the executor itself.
        ("LogDriver", task.log_driver.as_ref().is_some_and(|d| !d.name.is_empty())),
    ];
    checks.into_iter().filter(|(_, set)| *set).map(|(name, _)| name).collect()
}

/// Why the task's networks or ports cannot be honoured by a plain process, if they cannot. Without networks, a
/// process shares its node's network and publishes a host-mode port only as the port it listens on
/// (published = target); a port mapping or an ingress port would be dropped. With networks, it needs the
/// node's data plane, which forwards its ingress ports from every node (routing mesh) and its host-mode ports
/// from this node (`network::desired`): TCP and UDP, a host-mode port with its number given, and on a network
/// that reaches outside (not only `--internal` ones).
fn ports_a_process_cannot_honour(task: &Task, network: &Result<Arc<NetworkPlane>, String>) -> Option<String> {
    use shoal_api::port_config::PublishMode;
    let ports = task.endpoint.iter().flat_map(|e| e.ports.iter());
    if task.predefined_network() == Some("bridge") {
        return Some(
            "the process executor has no bridge network (a process runs in the node's own network); use \
             --network host, an overlay network, or a node with the docker executor"
                .into(),
        );
    }
    if let Some(driver) = task.engine_network().and_then(|a| a.node_local_driver()) {
        return Some(format!(
            "the process executor has no {driver} network (a Docker Engine makes those); run the task on a node \
             with the docker executor"
        ));
    }
    // On the host network a process is as one without networks: in the node's own namespace.
    if task.on_overlay() {
        let plane = match network {
            Ok(p) => p,
            Err(why) => {
                return Some(format!(
                    "this node cannot attach a task to a network: {why}; run it on a node with the overlay data plane"
                ))
            }
        };
        if let Err(why) = plane.check_task(task) {
            return Some(why);
        }
        return crate::network::desired::ports_unforwardable(task);
    }
    for p in ports {
        if p.publish_mode != PublishMode::Host as i32 {
            return Some(format!(
                "the process executor cannot publish port {} through the routing mesh; use --publish mode=host",
                p.target_port
            ));
        }
        if p.published_port != p.target_port {
            return Some(format!(
                "the process executor cannot map host port {} to port {} (a process listens on the node itself); \
                 publish the port as mode=host,target={1},published={1} or use the docker executor",
                p.published_port, p.target_port
            ));
        }
    }
    None
}

impl Executor for ProcessExecutor {
    fn describe(&self) -> NodeDescription {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as i64;
        NodeDescription {
            hostname: self.hostname.clone(),
            platform: Some(Platform { architecture: docker_arch().into(), os: "linux".into() }),
            resources: Some(Resources {
                nano_cpus: cpus * 1_000_000_000,
                memory_bytes: total_memory_bytes(),
                generic: vec![],
            }),
            engine: Some(EngineDescription {
                engine_version: "shoal-process".into(),
                labels: self.engine_labels.clone(),
                // `host`: a task on the host network runs in the node's own namespace, as any process.
                plugins: std::iter::once(crate::network::network_plugin("host"))
                    .chain(self.network.is_ok().then(crate::network::overlay_plugin))
                    .collect(),
            }),
            ..Default::default()
        }
    }

    fn controller(&self, task: &Task, files: TaskFiles) -> Result<Box<dyn Controller>, ExecutorError> {
        let spec = container_spec(task).cloned().unwrap_or_default();
        if let Some(why) = ports_a_process_cannot_honour(task, &self.network) {
            return Err(ExecutorError::InvalidSpec(why));
        }
        let unhonoured = settings_a_process_cannot_honour(task, &spec);
        if !unhonoured.is_empty() {
            return Err(ExecutorError::InvalidSpec(format!(
                "the process executor cannot honour {}: run the service on a node with the docker executor (e.g. \
                 a placement constraint on that node's labels), or remove the setting",
                unhonoured.join(", ")
            )));
        }
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let apparmor = std::fs::read_to_string("/proc/self/attr/current").ok();
        let limits = privileges::ProcessLimits::from_spec(&spec, &status, apparmor.as_deref()).map_err(|why| {
            ExecutorError::InvalidSpec(format!(
                "the process executor cannot honour {why}: run the service on a node with the docker executor, or \
                 change the setting"
            ))
        })?;
        let binds = mounts::binds_of(&spec).map_err(ExecutorError::InvalidSpec)?;
        let argv: Vec<String> = spec.command.iter().chain(spec.args.iter()).cloned().collect();
        if argv.is_empty() {
            return Err(ExecutorError::InvalidSpec(format!(
                "image {} has no command: the process executor needs a command or args",
                spec.image
            )));
        }
        let path = std::env::var("PATH").unwrap_or_else(|_| DEFAULT_PATH.to_string());
        let mut env = vec![("PATH".to_string(), path)];
        // The generic resources the scheduler gave the task come first, as SwarmKit's executors set them; the
        // spec's own variables may override them.
        let generic = shoal_api::generic::env(&task.assigned_generic_resources);
        for kv in generic.iter().chain(&spec.env) {
            if let Some((k, v)) = kv.split_once('=') {
                env.retain(|(ek, _)| ek != k);
                env.push((k.to_string(), v.to_string()));
            }
        }
        let files = if files.is_empty() {
            None
        } else {
            let root = self.files_root.clone().ok_or_else(|| {
                ExecutorError::InvalidSpec(
                    "this node keeps no secrets or configs: its agent has no tmpfs for them".into(),
                )
            })?;
            for f in &files {
                process_place(f).map_err(ExecutorError::InvalidSpec)?;
            }
            crate::task_files::check_in_memory(root.path()).map_err(ExecutorError::InvalidSpec)?;
            env.retain(|(k, _)| k != SECRETS_DIR_ENV && k != CONFIGS_DIR_ENV);
            for (name, kind) in [(SECRETS_DIR_ENV, FileKind::Secret), (CONFIGS_DIR_ENV, FileKind::Config)] {
                env.push((name.to_string(), root.kind_dir(&task.id, kind).display().to_string()));
            }
            Some((root, files))
        };
        Ok(Box::new(ProcessController {
            files,
            task_id: task.id.clone(),
            argv,
            env,
            dir: (!spec.dir.is_empty()).then(|| PathBuf::from(&spec.dir)),
            task_dir: self.task_dir(&task.id),
            grace: stop_grace_period(task),
            spawner: self.spawner.clone(),
            network: if task.on_overlay() { self.network.clone().ok() } else { None },
            netns: None,
            task: Arc::new(task.clone()),
            binds,
            limits,
            child: None,
            pid: 0,
            exit: None,
            relays: Vec::new(),
        }))
    }

    fn name(&self) -> &'static str {
        "process"
    }

    fn network_plane(&self) -> Option<Arc<NetworkPlane>> {
        self.network.clone().ok()
    }

    fn data_plane_off(&self) -> Option<String> {
        self.network.as_ref().err().cloned()
    }

    fn agent_stopped(&self) {
        // Every task process is gone with its runner: no secret or config file outlives the agent.
        if let Some(root) = &self.files_root {
            root.sweep(&Default::default());
        }
    }

    fn logs(&self, task: &Task, options: &crate::exec::LogOptions) -> Result<crate::exec::LogStream, ExecutorError> {
        logs::read(self.task_dir(&task.id), options)
    }
}

struct ProcessController {
    /// The task's secrets and configs, and where they go (written in `prepare`, removed in `remove`).
    files: Option<(FilesRoot, TaskFiles)>,
    task_id: String,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    dir: Option<PathBuf>,
    task_dir: PathBuf,
    grace: Duration,
    spawner: Arc<Spawner>,
    /// The data plane, for a task with networks.
    network: Option<Arc<NetworkPlane>>,
    /// The task's network namespace, once made (released in `remove` or on drop).
    netns: Option<PathBuf>,
    /// The task as assigned (its attachments).
    task: Arc<Task>,
    /// Its bind mounts (and cluster mounts, as binds of their publish paths), made in its mount namespace.
    binds: Vec<mounts::Bind>,
    /// Its ulimits, OOM score, capabilities and no-new-privileges, applied before exec.
    limits: privileges::ProcessLimits,
    child: Option<tokio::process::Child>,
    pid: i32,
    exit: Option<ExitStatus>,
    /// The tasks copying the process's output into its log files.
    relays: Vec<tokio::task::JoinHandle<()>>,
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> String {
    format!("{what} {}: {e}", path.display())
}

impl ProcessController {
    fn signal_group(&self, sig: Signal) {
        if self.pid > 0 {
            // ESRCH (group already gone) is the normal outcome after the leader and its children exited.
            let _ = killpg(Pid::from_raw(self.pid), sig);
        }
    }

    async fn wait_exit(&mut self) -> Result<ExitStatus, ExecutorError> {
        if let Some(exit) = self.exit {
            return Ok(exit);
        }
        let child = self.child.as_mut().ok_or(ExecutorError::NotReady("started"))?;
        let st =
            child.wait().await.map_err(|e| ExecutorError::Runtime(format!("waiting for the process failed: {e}")))?;
        use std::os::unix::process::ExitStatusExt;
        let code = st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0));
        let exit = ExitStatus { code, pid: self.pid };
        self.exit = Some(exit);
        self.child = None;
        // Let the relays record the last lines before the exit is reported (bounded: a leftover child
        // may hold the pipes open).
        for relay in self.relays.drain(..) {
            let _ = tokio::time::timeout(RELAY_DRAIN, relay).await;
        }
        // A process task never starts again: its namespace goes with it (not with the task's removal,
        // which may come much later).
        if let (Some(plane), Some(_)) = (&self.network, self.netns.take()) {
            if let Err(e) = plane.release(&self.task_id).await {
                tracing::warn!(task = %self.task_id, "{e}");
            }
        }
        Ok(exit)
    }

    async fn kill_and_reap(&mut self) -> Result<(), ExecutorError> {
        self.signal_group(Signal::SIGKILL);
        if self.child.is_some() {
            self.wait_exit().await?;
        }
        Ok(())
    }
}

impl Controller for ProcessController {
    fn prepare(&mut self) -> BoxFuture<'_, Result<(), ExecutorError>> {
        Box::pin(async move {
            if let Some(dir) = &self.dir {
                if !dir.is_dir() {
                    return Err(ExecutorError::InvalidSpec(format!(
                        "working directory {} does not exist on this node; create it or change the service's workdir",
                        dir.display()
                    )));
                }
            }
            mounts::check(&self.binds).map_err(ExecutorError::InvalidSpec)?;
            std::fs::create_dir_all(&self.task_dir)
                .map_err(|e| ExecutorError::Prepare(io_err("cannot create", &self.task_dir, e)))?;
            if let Some((root, files)) = &self.files {
                root.write(&self.task_id, files, |_, f| process_place(f)).map_err(ExecutorError::Prepare)?;
            }
            if let (Some(plane), None) = (&self.network, &self.netns) {
                let resolv = self.task_dir.join(RESOLV_CONF);
                std::fs::write(&resolv, shoal_netplane::resolv_conf())
                    .map_err(|e| ExecutorError::Prepare(io_err("cannot write", &resolv, e)))?;
                let path = plane.create_namespace(&self.task).await.map_err(ExecutorError::Prepare)?;
                self.netns = Some(path);
            }
            Ok(())
        })
    }

    fn start(&mut self) -> BoxFuture<'_, Result<i32, ExecutorError>> {
        Box::pin(async move {
            if self.child.is_some() || self.exit.is_some() {
                return Ok(self.pid);
            }
            let mut cmd = std::process::Command::new(&self.argv[0]);
            cmd.args(&self.argv[1..])
                .env_clear()
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .current_dir(self.dir.as_deref().unwrap_or(Path::new("/")))
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            self.limits.clone().apply(&mut cmd);
            let mut ns = mounts::Namespaces { netns: None, binds: self.binds.clone() };
            if let (Some(plane), Some(netns)) = (&self.network, &self.netns) {
                plane.wait_plumbed(&self.task_id).await.map_err(ExecutorError::Start)?;
                let file = std::fs::File::open(netns)
                    .map_err(|e| ExecutorError::Start(io_err("cannot open the task's network namespace", netns, e)))?;
                ns.netns = Some(file);
                // The node's resolver at 127.0.0.11, over /etc/resolv.conf for this process only.
                ns.binds.push(mounts::Bind {
                    source: self.task_dir.join(RESOLV_CONF),
                    target: PathBuf::from("/etc/resolv.conf"),
                    readonly: false,
                    non_recursive: true,
                    create_target: false,
                });
            }
            mounts::enter_namespaces(&mut cmd, ns).map_err(ExecutorError::Start)?;
            let mut child = self
                .spawner
                .spawn(cmd)
                .await
                .map_err(|e| ExecutorError::Start(format!("cannot run {:?}: {e}", self.argv[0])))?;
            if let Some(out) = child.stdout.take() {
                self.relays.push(tokio::spawn(logs::relay(out, logs::log_path(&self.task_dir, false))));
            }
            if let Some(err) = child.stderr.take() {
                self.relays.push(tokio::spawn(logs::relay(err, logs::log_path(&self.task_dir, true))));
            }
            self.pid = child.id().map_or(0, |p| p as i32);
            self.child = Some(child);
            tracing::debug!(task = %self.task_id, pid = self.pid, "process started");
            Ok(self.pid)
        })
    }

    fn wait(&mut self) -> BoxFuture<'_, Result<ExitStatus, ExecutorError>> {
        Box::pin(self.wait_exit())
    }

    fn shutdown(&mut self) -> BoxFuture<'_, Result<(), ExecutorError>> {
        Box::pin(async move {
            if self.child.is_none() {
                // Exited already: sweep any children it left in its group.
                self.signal_group(Signal::SIGKILL);
                return Ok(());
            }
            if let (Some(plane), Some(_), false) =
                (&self.network, &self.netns, self.network.as_ref().is_some_and(|p| p.is_stopping()))
            {
                // The manager takes the task out of its services' backends when it is told to stop: wait until
                // this node's VIPs dropped it, then give the other nodes' the time to follow before the process
                // stops answering (Docker waits its `defaultGossipConvergeDelay` after deactivating the
                // service binding).
                let addrs: Vec<std::net::Ipv4Addr> = crate::network::desired::attachments(&self.task)
                    .map(|a| a.into_iter().map(|(_, a)| a.address).collect())
                    .unwrap_or_default();
                let drain = async {
                    plane.wait_out_of_vips(&addrs).await;
                    tokio::time::sleep(NETWORK_DRAIN).await;
                };
                tokio::select! {
                    _ = drain => {}
                    _ = plane.stopped() => {}
                }
            }
            self.signal_group(Signal::SIGTERM);
            let grace = self.grace;
            match tokio::time::timeout(grace, self.wait_exit()).await {
                Ok(r) => {
                    r?;
                    self.signal_group(Signal::SIGKILL);
                    Ok(())
                }
                Err(_) => {
                    tracing::info!(task = %self.task_id, "process ignored SIGTERM for {grace:?}: killing it");
                    self.kill_and_reap().await
                }
            }
        })
    }

    fn terminate(&mut self) -> BoxFuture<'_, Result<(), ExecutorError>> {
        Box::pin(self.kill_and_reap())
    }

    fn remove(&mut self) -> BoxFuture<'_, Result<(), ExecutorError>> {
        Box::pin(async move {
            self.kill_and_reap().await?;
            if let Some((root, _)) = &self.files {
                root.remove(&self.task_id).map_err(ExecutorError::Runtime)?;
            }
            if let (Some(plane), Some(_)) = (&self.network, self.netns.take()) {
                plane.release(&self.task_id).await.map_err(ExecutorError::Runtime)?;
            }
            match std::fs::remove_dir_all(&self.task_dir) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(ExecutorError::Runtime(io_err("cannot remove", &self.task_dir, e))),
            }
        })
    }

    /// A process has no container; its host-mode ports are the spec's (it listens on them, or the data plane
    /// forwards them into its namespace).
    fn report(&self) -> crate::exec::RuntimeReport {
        crate::exec::RuntimeReport { container_id: String::new(), ports: crate::exec::host_mode_ports(&self.task) }
    }
}

impl Drop for ProcessController {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.signal_group(Signal::SIGKILL);
        }
        // The process is gone or going: its secrets and configs go too (an agent stopping keeps the task's
        // log files, never these).
        if let Some((root, _)) = &self.files {
            if let Err(e) = root.remove(&self.task_id) {
                tracing::warn!(task = %self.task_id, "{e}");
            }
        }
        // Its namespace too, once the process is gone (the agent's stop clears whatever is left).
        if let (Some(plane), Some(_), Ok(rt)) =
            (self.network.clone(), self.netns.take(), tokio::runtime::Handle::try_current())
        {
            let id = self.task_id.clone();
            rt.spawn(async move {
                if let Err(e) = plane.release(&id).await {
                    tracing::warn!(task = %id, "{e}");
                }
            });
        }
    }
}

/// The task's resolv.conf, in its task directory.
const RESOLV_CONF: &str = "resolv.conf";

#[cfg(test)]
mod tests;
