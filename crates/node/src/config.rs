//! `DaemonConfig`: everything a node needs to start, as the `shoal daemon` flags give it.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Which executor runs tasks on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExecutorKind {
    /// Docker when a Docker Engine answers, else plain processes.
    #[default]
    Auto,
    /// Plain processes.
    Process,
    /// Docker containers through the local Docker Engine.
    Docker,
}

/// How to run one node.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// Where the node keeps its identity, Raft log, snapshots and task logs.
    pub state_dir: PathBuf,
    /// The control socket (Engine API over HTTP on a unix socket).
    pub listen_control_api: PathBuf,
    /// The address the gRPC remote API (dispatcher, health) listens on.
    pub listen_remote_api: SocketAddr,
    /// The address other nodes use to reach this one (defaults to `listen_remote_api`).
    pub advertise_remote_api: Option<SocketAddr>,
    /// The address of this machine the node's overlay (VXLAN) traffic leaves from and arrives at
    /// (`--data-path-addr`, or the last init's or join's `DataPathAddr`); `None`: the address the managers know
    /// the node by. Reported to the managers as the engine label `shoal.data-path-addr`.
    pub data_path_addr: Option<std::net::IpAddr>,
    /// The daemon's own `--data-path-addr`: what an init or join without `DataPathAddr` uses (never a
    /// previous swarm's).
    pub data_path_addr_flag: Option<std::net::IpAddr>,
    /// The node's hostname (defaults to the machine's).
    pub hostname: Option<String>,
    /// Generic resources the node offers to tasks (`--generic-node-resources gpu=UUID1,gpu=UUID2,ssd=4`).
    pub generic_node_resources: Vec<shoal_api::GenericResource>,
    /// Which executor to use.
    pub executor: ExecutorKind,
    /// Connect tasks to overlay networks (the process executor, when root and the kernel allow; see
    /// `shoal_agent::NetworkPlane`). Off by default here (in-process nodes share their test's namespace); the
    /// daemon's default is on (`--no-data-plane` turns it off).
    pub data_plane: bool,
    /// Raft tick interval.
    pub raft_tick_interval_ms: u64,
    /// How often this manager, while it leads, rotates the overlay networks' encryption and gossip keys
    /// (SwarmKit's 12 hours by default).
    pub network_key_rotation_ms: u64,
    /// The CSI plugins this manager's volume manager calls for cluster volumes: each plugin's name (a
    /// volume's driver) and the unix socket its controller service listens on.
    pub csi_plugins: Vec<(String, PathBuf)>,
    /// Raft ticks without a leader's message before a follower campaigns (randomized in [n, 2n)).
    pub raft_election_tick: usize,
    /// Raft ticks between the leader's heartbeats.
    pub raft_heartbeat_tick: usize,
    /// The Docker Engine the docker executor uses (`unix:///var/run/docker.sock` by default).
    pub engine_addr: String,
    /// A running manager's remote address (`host:port`) to join as a new manager on first start (`None`:
    /// bootstrap a new cluster). Ignored once the node has Raft state.
    pub join_addr: Option<String>,
    /// Disaster recovery: on this start, make this manager the only Raft member (keeping its data), when a
    /// quorum of managers is lost for good. Other managers must join again afterwards.
    pub force_new_cluster: bool,
    /// The address pools and data path port of the cluster this node makes (a `docker swarm init` on the
    /// socket sets them; the defaults otherwise). Used only when the node creates the cluster.
    pub init_networking: shoal_manager::controlapi::network::SwarmNetworking,
    /// The join token for `join_addr` (`SWMTKN-1-...`): a worker token makes this node a worker only, a
    /// manager token a manager. Used on first start only; afterwards the node's certificate says who it is.
    pub join_token: Option<JoinToken>,
    /// Also serve the Engine API on this TCP address, mutual TLS only (managers).
    pub listen_api_tcp: Option<SocketAddr>,
    /// Node certificate validity to issue instead of the cluster's setting (and its one-hour minimum):
    /// for tests of certificate renewal only (the daemon reads it from `SHOAL_DEBUG_NODE_CERT_EXPIRY_SECS`).
    pub node_cert_expiry_override: Option<std::time::Duration>,
    /// The swarm's unlock key (`SWMKEY-1-...`) for a manager that restarts locked (autolock): used instead
    /// of waiting for `docker swarm unlock`. A wrong key makes the start fail.
    pub unlock_key: Option<UnlockKeyText>,
    /// Take a Raft snapshot every this many applied entries (default 10 000).
    pub raft_snapshot_interval_entries: Option<u64>,
    /// With an empty state dir, wait for `docker swarm init` or `docker swarm join` instead of creating a
    /// one-node cluster (`--no-init`; see `lifecycle`).
    pub no_init: bool,
    /// The remote API addresses were named by the daemon's flags: they win over those `swarm.json` keeps
    /// from the last init or join.
    pub remote_api_from_flags: bool,
    /// How long a first start with a join token keeps retrying a manager it cannot reach (it may be
    /// starting at the same time), with a doubling delay up to `join::JOIN_RETRY_MAX`.
    pub join_retry_for: std::time::Duration,
    /// Serve Prometheus metrics (and, on managers, the live page) over plain HTTP on this address.
    pub listen_metrics: Option<SocketAddr>,
    /// Serve SwarmKit's own gRPC API (Control, Watch, Logs, Health; for `swarmctl`) on this unix socket, mode
    /// 0600, over TLS with the node's certificate, as swarmd's `--listen-control-api` (`None`: not served).
    pub listen_swarmkit_api: Option<PathBuf>,
}

/// How long a daemon started with `--join-addr` keeps trying to reach its manager.
pub(crate) const DEFAULT_JOIN_RETRY_FOR: std::time::Duration = std::time::Duration::from_secs(120);

impl DaemonConfig {
    /// A config with defaults for everything but the state dir and the control socket.
    pub fn new(state_dir: PathBuf, listen_control_api: PathBuf) -> DaemonConfig {
        DaemonConfig {
            state_dir,
            listen_control_api,
            listen_remote_api: SocketAddr::from(([127, 0, 0, 1], 4242)),
            advertise_remote_api: None,
            data_path_addr: None,
            data_path_addr_flag: None,
            hostname: None,
            generic_node_resources: Vec::new(),
            executor: ExecutorKind::Auto,
            data_plane: false,
            raft_tick_interval_ms: 100,
            network_key_rotation_ms: shoal_manager::NETWORK_KEY_ROTATION_INTERVAL_MS,
            csi_plugins: Vec::new(),
            raft_election_tick: 10,
            raft_heartbeat_tick: 1,
            engine_addr: shoal_agent::DEFAULT_ENGINE_ADDR.to_string(),
            join_addr: None,
            force_new_cluster: false,
            init_networking: Default::default(),
            join_token: None,
            listen_api_tcp: None,
            node_cert_expiry_override: None,
            unlock_key: None,
            raft_snapshot_interval_entries: None,
            no_init: false,
            remote_api_from_flags: false,
            join_retry_for: DEFAULT_JOIN_RETRY_FOR,
            listen_metrics: None,
            listen_swarmkit_api: None,
        }
    }

    /// The advertised remote address.
    pub fn advertised(&self) -> SocketAddr {
        self.advertise_remote_api.unwrap_or(self.listen_remote_api)
    }
}

/// A join token: a secret, so its `Debug` output is redacted.
#[derive(Clone, PartialEq, Eq)]
pub struct JoinToken(pub String);

impl std::fmt::Debug for JoinToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JoinToken(<redacted>)")
    }
}

/// An unlock key as given to the daemon: a secret, so its `Debug` output is redacted.
#[derive(Clone, PartialEq, Eq)]
pub struct UnlockKeyText(pub String);

impl std::fmt::Debug for UnlockKeyText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UnlockKeyText(<redacted>)")
    }
}
