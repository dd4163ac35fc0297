//! `shoal daemon`: its flags (`shoal_cli::DaemonArgs`) turned into the node's configuration, logging setup,
//! the runtime, and signal handling.

use shoal_cli::{DaemonArgs, ExecutorChoice};
use shoal_node::{DaemonConfig, ExecutorKind};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Runs the daemon until SIGTERM or SIGINT. Returns the process exit code.
pub fn run(args: DaemonArgs) -> i32 {
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_ansi(ansi).with_writer(std::io::stderr))
        .with(args.log_level)
        .init();

    // Absolute from here on: a task's files live under the state dir, and a process task's child changes its
    // directory before it mounts its resolv.conf (a relative `./shoal-state` failed every networked task).
    let state_dir = match std::path::absolute(&args.state_dir) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("shoal daemon: cannot resolve --state-dir {}: {e}", args.state_dir.display());
            return 2;
        }
    };
    // The socket keeps the path as given: a unix socket's path is bounded (108 bytes), a relative one less so.
    let listen_control_api = args.listen_control_api.clone().unwrap_or_else(|| args.state_dir.join("control.sock"));
    let mut cfg = DaemonConfig::new(state_dir, listen_control_api);
    if let Some(a) = args.listen_remote_api {
        cfg.listen_remote_api = a;
    }
    cfg.advertise_remote_api = args.advertise_remote_api;
    cfg.remote_api_from_flags = args.listen_remote_api.is_some() || args.advertise_remote_api.is_some();
    cfg.no_init = args.no_init;
    (cfg.data_path_addr, cfg.data_path_addr_flag) = (args.data_path_addr, args.data_path_addr);
    cfg.hostname = args.hostname;
    cfg.generic_node_resources = args.generic_node_resources.map(|g| g.0).unwrap_or_default();
    cfg.executor = match args.executor {
        ExecutorChoice::Auto => ExecutorKind::Auto,
        ExecutorChoice::Process => ExecutorKind::Process,
        ExecutorChoice::Docker => ExecutorKind::Docker,
    };
    cfg.engine_addr = args.engine_addr;
    cfg.data_plane = !args.no_data_plane;
    cfg.join_addr = args.join_addr;
    cfg.force_new_cluster = args.force_new_cluster;
    cfg.raft_tick_interval_ms = args.raft_tick_interval_ms;
    cfg.network_key_rotation_ms = u64::try_from(args.network_key_rotation_interval.as_millis()).unwrap_or(u64::MAX);
    cfg.csi_plugins = args.csi_plugins;
    cfg.raft_election_tick = args.election_tick;
    cfg.raft_heartbeat_tick = args.heartbeat_tick;
    cfg.join_token = args.join_token.map(shoal_node::JoinToken);
    cfg.listen_api_tcp = args.listen_api;
    cfg.raft_snapshot_interval_entries = args.raft_snapshot_interval_entries;
    cfg.listen_metrics = args.listen_metrics;
    cfg.listen_swarmkit_api = args.listen_swarmkit_api;
    if let Some(path) = &args.unlock_key_file {
        match std::fs::read_to_string(path) {
            Ok(key) => cfg.unlock_key = Some(shoal_node::UnlockKeyText(key.trim().to_string())),
            Err(e) => {
                eprintln!("shoal: cannot read the unlock key file {}: {e}", path.display());
                return 2;
            }
        }
    }
    // Hidden, for tests of certificate renewal: issue node certificates valid this many seconds.
    match std::env::var("SHOAL_DEBUG_NODE_CERT_EXPIRY_SECS").ok().map(|v| v.parse::<u64>()) {
        None => {}
        Some(Ok(secs)) if secs > 0 => cfg.node_cert_expiry_override = Some(std::time::Duration::from_secs(secs)),
        Some(_) => {
            eprintln!("shoal: SHOAL_DEBUG_NODE_CERT_EXPIRY_SECS must be a positive number of seconds");
            return 2;
        }
    }

    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("shoal: cannot start the runtime: {e}");
            return 1;
        }
    };
    // The handlers go in before the daemon starts serving: a SIGTERM that arrives once the socket answers but
    // before the shutdown future was first polled would otherwise kill the process with the default action
    // (CI saw a daemon that answered /info die by SIGTERM, no clean stop).
    let result = runtime.block_on(async {
        let shutdown = match shutdown_signal() {
            Ok(s) => s,
            Err(e) => return Err(e),
        };
        shoal_node::run_daemon(cfg, shutdown).await.map_err(|e| e.to_string())
    });
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("shoal: {e}");
            1
        }
    }
}

/// Installs the SIGTERM and SIGINT handlers now and returns the future that ends at the first of them.
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>, String> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(|e| format!("cannot install the SIGTERM handler: {e}"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| format!("cannot install the SIGINT handler: {e}"))?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}
