//! `shoal daemon`'s flags (modeled on swarmd), in the client: `shoal daemon` parses and checks them before it
//! runs `shoald` (a usage error starts nothing), and `shoald` parses them the same way. Plain values: the
//! daemon (the `shoal` package) turns them into its configuration. The rules a flag shares with the Engine API
//! (`--data-path-addr` as `DataPathAddr`) are `shoal_engine_json`'s, and generic resources are read by
//! `shoal_api`'s parser, so the daemon and the API never disagree with the command line.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use tracing_subscriber::filter::Targets;

/// Flags of `shoal daemon`.
#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// State directory: node identity, Raft log and snapshots, task logs.
    #[arg(long, short = 'd', default_value = crate::DEFAULT_STATE_DIR, env = "SHOAL_STATE_DIR")]
    pub state_dir: PathBuf,
    /// Control socket to serve the Engine API on (default: <state dir>/control.sock).
    #[arg(long)]
    pub listen_control_api: Option<PathBuf>,
    /// Address for the remote gRPC API (dispatcher, raft) [default: 127.0.0.1:4242, or the one the last
    /// `docker swarm init` or `join` gave].
    #[arg(long)]
    pub listen_remote_api: Option<SocketAddr>,
    /// Address other nodes use to reach this one (default: the listen address).
    #[arg(long)]
    pub advertise_remote_api: Option<SocketAddr>,
    /// IPv4 address of this machine the node's overlay (VXLAN) traffic leaves from and arrives at, as
    /// `docker swarm init/join --data-path-addr` [default: the advertised address, or the one the last init or
    /// join gave].
    #[arg(long, value_parser = parse_data_path_addr)]
    pub data_path_addr: Option<std::net::IpAddr>,
    /// Node hostname (default: the machine's).
    #[arg(long)]
    pub hostname: Option<String>,
    /// Generic resources this node offers to tasks, as swarmd's flag: comma-separated kind=value terms, a
    /// count (ssd=4) or named units (gpu=UUID1,gpu=UUID2); a task reserving one gets its units in
    /// DOCKER_RESOURCE_<KIND>.
    #[arg(long, value_parser = parse_generic_resources)]
    pub generic_node_resources: Option<GenericResources>,
    /// Task executor: auto, process or docker.
    #[arg(long, value_enum, default_value_t = ExecutorChoice::Auto)]
    pub executor: ExecutorChoice,
    /// Do not connect tasks to overlay networks on this node (the data plane changes the host's links,
    /// nftables and ip_forward; it is on by default for the process executor when run as root on a kernel
    /// with VXLAN and nftables NAT). Tasks with networks are then not placed here.
    #[arg(long)]
    pub no_data_plane: bool,
    /// Docker Engine address for the docker executor (unix:///PATH or tcp://HOST:PORT).
    #[arg(long, default_value = "unix:///var/run/docker.sock")]
    pub engine_addr: String,
    /// Join the cluster of the manager at this remote address (host:port) as a new manager, on first start.
    #[arg(long)]
    pub join_addr: Option<String>,
    /// With an empty state dir, join no swarm: wait for `docker swarm init` or `docker swarm join` on the
    /// control socket, as a fresh Docker Engine does (without it, an empty state dir makes a one-node swarm).
    #[arg(long, conflicts_with_all = ["join_addr", "join_token"])]
    pub no_init: bool,
    /// Disaster recovery: make this manager the only member of its Raft cluster (keeping its data) when a
    /// majority of the managers is lost for good; re-join the other managers afterwards.
    #[arg(long)]
    pub force_new_cluster: bool,
    /// Length of one Raft tick, in milliseconds (every manager of a cluster should use the same timing).
    #[arg(long, default_value_t = 100)]
    pub raft_tick_interval_ms: u64,
    /// Raft ticks without hearing from a leader before a manager campaigns (randomized up to twice that).
    #[arg(long, default_value_t = 10)]
    pub election_tick: usize,
    /// Raft ticks between the leader's heartbeats (less than --election-tick).
    #[arg(long, default_value_t = 1)]
    pub heartbeat_tick: usize,
    /// The join token for --join-addr (from `docker swarm join-token worker|manager` on a manager): a worker
    /// token makes this node a worker only, a manager token a manager. First start only.
    #[arg(long, env = "SHOAL_JOIN_TOKEN", hide_env_values = true)]
    pub join_token: Option<String>,
    /// Also serve the Engine API on TCP, mutual TLS only (tcp://IP:PORT): clients need a manager certificate or
    /// one from `shoal ca issue-client-cert`, and the cluster's ca.pem.
    #[arg(long, value_parser = parse_tcp_addr)]
    pub listen_api: Option<SocketAddr>,
    /// A file holding the swarm's unlock key (SWMKEY-1-...): a manager restarted with autolock on unlocks
    /// itself with it instead of waiting for `docker swarm unlock`.
    #[arg(long)]
    pub unlock_key_file: Option<PathBuf>,
    /// How often the leading manager rotates the overlay networks' encryption and gossip keys (nodes keep the
    /// last three, so one that missed a rotation still reads the others), e.g. `12h` (SwarmKit's), `30m`. At
    /// least one second.
    #[arg(long, default_value = "12h", value_parser = parse_key_rotation)]
    pub network_key_rotation_interval: std::time::Duration,
    /// A CSI plugin for cluster volumes, as NAME=unix:///path/to/its.sock (repeatable): while this manager
    /// leads, it has the plugin NAME (a volume's driver) create and delete the volumes that name it.
    #[arg(long = "csi-plugin", value_name = "NAME=unix:///PATH", value_parser = parse_csi_plugin)]
    pub csi_plugins: Vec<(String, PathBuf)>,
    /// Take a Raft snapshot (and compact the log) every this many applied entries.
    #[arg(long)]
    pub raft_snapshot_interval_entries: Option<u64>,
    /// Serve Prometheus metrics at /metrics and, on managers, a live page of the cluster at / on this
    /// address (IP:PORT, plain HTTP, unauthenticated: e.g. 127.0.0.1:9323). Off by default.
    #[arg(long)]
    pub listen_metrics: Option<SocketAddr>,
    /// Also serve SwarmKit's own gRPC API (Control, Watch, Logs, Health) on this unix socket (mode 0600, TLS with
    /// the node's certificate), as swarmd's --listen-control-api, for `swarmctl -s PATH` (default: off).
    #[arg(long)]
    pub listen_swarmkit_api: Option<PathBuf>,
    /// Log filter: a level (error, warn, info, debug, trace) and/or comma-separated `target=level`
    /// directives, e.g. `info` or `shoal_raft=debug,info`.
    #[arg(long, env = "SHOAL_LOG", default_value = "info", value_parser = parse_log_filter)]
    pub log_level: Targets,
}

/// `--executor`: which executor runs tasks on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExecutorChoice {
    /// Docker when a Docker Engine answers, else plain processes.
    Auto,
    /// Plain processes.
    Process,
    /// Docker containers through the local Docker Engine.
    Docker,
}

/// Parses `--log-level`: a level and/or `target=level` directives. A filter that cannot be read is an error at
/// start (not a silent fallback), so a typo does not hide the logs that were asked for.
fn parse_log_filter(s: &str) -> Result<Targets, String> {
    s.parse::<Targets>().map_err(|e| {
        format!("{s:?}: {e}; use a level (error, warn, info, debug, trace) or target=level, comma-separated")
    })
}

fn parse_csi_plugin(s: &str) -> Result<(String, PathBuf), String> {
    let (name, socket) = s.split_once('=').ok_or_else(|| format!("{s:?}: use NAME=unix:///path/to/plugin.sock"))?;
    if name.is_empty() || name.len() > 255 {
        return Err(format!("{s:?}: the plugin's name (a volume's driver) must be 1 to 255 bytes"));
    }
    let path = socket.strip_prefix("unix://").unwrap_or(socket);
    if !path.starts_with('/') {
        return Err(format!("{s:?}: the plugin's socket must be an absolute path, as unix:///path/to/plugin.sock"));
    }
    Ok((name.to_string(), PathBuf::from(path)))
}

fn parse_key_rotation(s: &str) -> Result<std::time::Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e}: give a duration such as 12h, 30m or 90s"))?;
    if d < std::time::Duration::from_secs(1) {
        return Err(format!("{s} is shorter than one second: the keys would rotate faster than nodes can follow"));
    }
    Ok(d)
}

fn parse_tcp_addr(s: &str) -> Result<SocketAddr, String> {
    let rest = s.strip_prefix("tcp://").ok_or_else(|| format!("{s:?}: use tcp://IP:PORT"))?;
    rest.parse().map_err(|e| format!("{s:?}: {e}; use tcp://IP:PORT"))
}

/// The parsed `--generic-node-resources` value.
#[derive(Debug, Clone)]
pub struct GenericResources(pub Vec<shoal_api::GenericResource>);

fn parse_generic_resources(s: &str) -> Result<GenericResources, String> {
    shoal_api::generic::parse_offer(s).map(GenericResources)
}

fn parse_data_path_addr(s: &str) -> Result<std::net::IpAddr, String> {
    match shoal_engine_json::data_path_addr(s) {
        Ok(Some(ip)) => Ok(ip),
        Ok(None) => Err("give an IPv4 address".into()),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_csi_plugin, parse_log_filter};
    use tracing::Level;

    #[test]
    fn csi_plugins_are_a_name_and_an_absolute_unix_socket() {
        let p = parse_csi_plugin("csi.example=unix:///run/csi/x.sock").unwrap();
        assert_eq!(p, ("csi.example".to_string(), std::path::PathBuf::from("/run/csi/x.sock")));
        assert_eq!(parse_csi_plugin("n=/run/x.sock").unwrap().1, std::path::PathBuf::from("/run/x.sock"));
        for (bad, says) in [
            ("no-equals", "use NAME=unix:///path"),
            ("=unix:///run/x.sock", "1 to 255 bytes"),
            ("n=unix://run/x.sock", "absolute path"),
            ("n=relative.sock", "absolute path"),
        ] {
            let err = parse_csi_plugin(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn log_filters_take_a_level_and_target_directives() {
        let f = parse_log_filter("shoal_raft=debug,warn").unwrap();
        assert!(f.would_enable("shoal_raft::node", &Level::DEBUG));
        assert!(!f.would_enable("shoal_manager", &Level::INFO));
        assert!(f.would_enable("shoal_manager", &Level::WARN));
        assert!(parse_log_filter("info").unwrap().would_enable("anything", &Level::INFO));
        let err = parse_log_filter("shoal=loud").unwrap_err();
        assert!(err.contains("shoal=loud") && err.contains("target=level"), "{err}");
    }
}
