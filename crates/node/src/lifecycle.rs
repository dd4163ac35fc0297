//! The node's side of the swarm lifecycle (`docker swarm init`, `join`, `leave`), as Docker's
//! `daemon/cluster` runs it: the daemon is in one of three states, and `run_daemon` moves between them.
//!
//! - Inactive: in no swarm. Its control socket is `shoal_engine_api::lifecycle`'s inactive one. A node is
//!   inactive when its state dir holds no cluster state, no `--join-addr` was given, and either `--no-init`
//!   was given or `swarm.json` says it left a swarm (so a restart after `docker swarm leave` stays out of
//!   every swarm, as Docker's does). Without either, an empty state dir still bootstraps a one-node
//!   cluster at once (the README's first command).
//! - A member: a manager (`Node::start`) or a worker (`worker_node::run_worker`); a promotion or a demotion
//!   moves it from one to the other in-process (`run_daemon`).
//! - Leaving: its parts stop (its tasks with them), everything in the state dir but the state dir lock and
//!   the control socket is removed, and `swarm.json` records that it left.
//!
//! The daemon's one control socket (`control_socket`) stays bound through every state; each state installs
//! what answers on it. Init and join come from the inactive socket as a `Request` with a reply channel; the
//! answer is sent only once the node is in its new state: after a successful start the new state's router
//! already answers, and after a failure the state the attempt wrote is removed and the inactive router is
//! back before the error is sent. Leave is answered once the inactive router is back. Requests are taken
//! one at a time (a queue of one; a second request meanwhile is refused, "in progress").
//!
//! `swarm.json` also keeps the listen and advertise addresses an init or join gave, so a restart uses them
//! unless the daemon's flags name addresses themselves.
//!
//! Must not log join tokens.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use shoal_engine_api::lifecycle::{Availability, InitOptions, JoinOptions, LifecycleRef, SwarmLifecycle, SWARM_EXISTS};
use shoal_engine_api::ApiError;
use tokio::sync::{mpsc, oneshot};

use crate::control_socket::ControlSocket;
use crate::{DaemonConfig, NodeError};

/// The file that records the node's lifecycle state and the addresses of its last init or join.
pub(crate) const SWARM_RECORD: &str = "swarm.json";

/// How long a join through the API (`docker swarm join`) keeps trying a manager it cannot reach (Docker's
/// `swarmConnectTimeout`).
pub(crate) const API_JOIN_RETRY_FOR: Duration = Duration::from_secs(20);

/// How long one manager named in a join request gets to accept a TCP connection when several are named.
const REMOTE_PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// What `swarm.json` holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SwarmRecord {
    /// The node left its swarm (or an init or join failed) and waits for init or join.
    #[serde(default)]
    pub inactive: bool,
    /// The remote API's listen address given by the last init or join.
    #[serde(default)]
    pub listen_remote_api: Option<SocketAddr>,
    /// The advertised address given by (or picked for) the last init or join.
    #[serde(default)]
    pub advertise_remote_api: Option<SocketAddr>,
    /// The data path address the last init or join gave.
    #[serde(default)]
    pub data_path_addr: Option<std::net::IpAddr>,
}

fn record_path(state_dir: &Path) -> PathBuf {
    state_dir.join(SWARM_RECORD)
}

/// Reads `swarm.json` (absent: the default record).
pub(crate) fn load_record(state_dir: &Path) -> Result<SwarmRecord, NodeError> {
    let p = record_path(state_dir);
    match std::fs::read(&p) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| {
            NodeError::State(format!(
                "{} is corrupted ({e}); remove it to start as the daemon's flags say",
                p.display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(SwarmRecord::default()),
        Err(e) => Err(NodeError::io(&p, e)),
    }
}

fn store_record(state_dir: &Path, r: &SwarmRecord) -> Result<(), NodeError> {
    let p = record_path(state_dir);
    let bytes = serde_json::to_vec(r).expect("serializes");
    crate::statedir::replace_private(&p, "tmp", &bytes).map_err(|(p, e)| NodeError::io(&p, e))
}

/// Whether the state dir holds any cluster state (an identity, certificates or Raft data).
fn has_cluster_state(state_dir: &Path) -> Result<bool, NodeError> {
    Ok(crate::identity::load(state_dir)?.is_some()
        || shoal_raft::RaftNode::has_existing_state(state_dir)
        || crate::statedir::certs_dir(state_dir).exists())
}

/// Whether this start waits for init or join (see the module doc); also takes the addresses of the last
/// init or join from `swarm.json` when the flags named none.
pub(crate) fn prepare_start(cfg: &mut DaemonConfig) -> Result<bool, NodeError> {
    let record = load_record(&cfg.state_dir)?;
    if !cfg.remote_api_from_flags {
        if let Some(a) = record.listen_remote_api {
            cfg.listen_remote_api = a;
        }
        if record.advertise_remote_api.is_some() {
            cfg.advertise_remote_api = record.advertise_remote_api;
        }
    }
    if cfg.data_path_addr.is_none() {
        cfg.data_path_addr = record.data_path_addr;
    }
    if has_cluster_state(&cfg.state_dir)? {
        return Ok(false);
    }
    if cfg.no_init && (cfg.join_addr.is_some() || cfg.join_token.is_some()) {
        return Err(NodeError::Config(
            "--no-init waits for `docker swarm init` or `docker swarm join`: leave out --join-addr and --join-token, \
             or --no-init"
                .into(),
        ));
    }
    Ok(cfg.join_addr.is_none() && (cfg.no_init || record.inactive))
}

/// Removes the node's cluster state (everything in the state dir but its lock and the control socket) and
/// records that it is inactive.
pub(crate) fn clear_state(cfg: &DaemonConfig) -> Result<(), NodeError> {
    let keep =
        |name: &std::ffi::OsStr| name == crate::STATE_DIR_LOCK || cfg.state_dir.join(name) == cfg.listen_control_api;
    let entries = std::fs::read_dir(&cfg.state_dir).map_err(|e| NodeError::io(&cfg.state_dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| NodeError::io(&cfg.state_dir, e))?;
        if keep(&entry.file_name()) {
            continue;
        }
        let path = entry.path();
        let removed = match entry.file_type() {
            Ok(t) if t.is_dir() => std::fs::remove_dir_all(&path),
            _ => std::fs::remove_file(&path),
        };
        removed.map_err(|e| NodeError::io(&path, e))?;
    }
    store_record(&cfg.state_dir, &SwarmRecord { inactive: true, ..Default::default() })
}

/// Removes the containers the docker executor ran for this node (Docker's leave removes them too; they
/// would outlive the node otherwise), their network-namespace holders, and then the node's data plane. Nothing to do
/// for the process executor, whose tasks stopped with the agent; an engine that cannot be reached is logged
/// (`--executor auto` may have used processes).
pub(crate) async fn remove_containers(cfg: &DaemonConfig) {
    if cfg.executor == crate::ExecutorKind::Process {
        return;
    }
    let Ok(Some(identity)) = crate::identity::load(&cfg.state_dir) else { return };
    match shoal_agent::remove_node_containers(&cfg.engine_addr, &identity.node_id).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(containers = n, "removed this node's containers"),
        Err(e) => tracing::info!(error = %e, "did not remove this node's containers"),
    }
    // The data plane outlived the stopped agent with its containers: with them gone, it goes too (every
    // Shoal link, table and task namespace this daemon made).
    if cfg.data_plane {
        match shoal_agent::NetworkPlane::open(&cfg.state_dir) {
            Ok(plane) => plane.clear().await,
            Err(why) => tracing::info!("did not remove the data plane: {why}"),
        }
    }
}

/// A request from a control socket, with the channel its answer goes to.
pub(crate) enum Request {
    Init(Box<InitOptions>, oneshot::Sender<Result<String, ApiError>>),
    Join(JoinOptions, oneshot::Sender<Result<(), ApiError>>),
    Leave(oneshot::Sender<Result<(), ApiError>>),
}

/// The `SwarmLifecycle` the control sockets call: requests go to `run_daemon`'s loop.
#[derive(Clone)]
pub(crate) struct Handle {
    tx: mpsc::Sender<Request>,
}

/// The handle and the loop's end of its queue (one request at a time).
pub(crate) fn channel() -> (Handle, mpsc::Receiver<Request>) {
    let (tx, rx) = mpsc::channel(1);
    (Handle { tx }, rx)
}

impl Handle {
    pub(crate) fn as_ref(&self) -> LifecycleRef {
        LifecycleRef(Some(Arc::new(self.clone())))
    }

    fn send<T: Send + 'static>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, ApiError>>) -> Request,
    ) -> BoxFuture<'static, Result<T, ApiError>> {
        let tx = self.tx.clone();
        let (reply, answer) = oneshot::channel();
        let sent = tx.try_send(make(reply));
        Box::pin(async move {
            sent.map_err(|_| {
                ApiError::Unavailable(
                    "another swarm init, join or leave is in progress on this node: wait for it to finish and retry"
                        .into(),
                )
            })?;
            answer.await.map_err(|_| ApiError::Unavailable("the node stopped before it finished the request".into()))?
        })
    }
}

impl SwarmLifecycle for Handle {
    fn init(&self, opts: InitOptions) -> BoxFuture<'static, Result<String, ApiError>> {
        self.send(|r| Request::Init(Box::new(opts), r))
    }
    fn join(&self, opts: JoinOptions) -> BoxFuture<'static, Result<(), ApiError>> {
        self.send(|r| Request::Join(opts, r))
    }
    fn leave(&self) -> BoxFuture<'static, Result<(), ApiError>> {
        self.send(Request::Leave)
    }
}

/// Where an answer goes.
pub(crate) enum Reply {
    Init(oneshot::Sender<Result<String, ApiError>>),
    Join(oneshot::Sender<Result<(), ApiError>>),
    Leave(oneshot::Sender<Result<(), ApiError>>),
}

impl Reply {
    fn send(self, r: Result<String, ApiError>) {
        match self {
            Reply::Init(tx) => drop(tx.send(r)),
            Reply::Join(tx) | Reply::Leave(tx) => drop(tx.send(r.map(|_| ()))),
        }
    }
}

/// What the node must still do about a request in progress: what the start it asked for needs, and where
/// the answer goes.
pub(crate) struct Pending {
    pub reply: Reply,
    /// For an init: the spec to write and this node's availability once the cluster exists.
    pub init: Option<(shoal_api::ClusterSpec, Availability)>,
    /// For a join: this node's availability.
    pub join_availability: Option<Availability>,
    /// An error to answer once the inactive socket is back.
    pub failure: Option<ApiError>,
}

impl Pending {
    /// Answers the request (on the connection it came on: the control socket's server stays).
    pub(crate) fn answer(self, r: Result<String, ApiError>) {
        self.reply.send(r);
    }

    /// A leave, answered once the node is inactive.
    pub(crate) fn leave(reply: oneshot::Sender<Result<(), ApiError>>) -> Pending {
        Pending { reply: Reply::Leave(reply), init: None, join_availability: None, failure: None }
    }
}

/// The session with the control sockets a member runs with: the requests queue, and the request whose
/// answer waits for the start.
pub(crate) struct Session<'a> {
    pub handle: &'a Handle,
    /// The daemon's control socket, where each state installs what answers.
    pub control: &'a ControlSocket,
    pub requests: &'a mut mpsc::Receiver<Request>,
    pub pending: &'a mut Option<Pending>,
}

impl Session<'_> {
    /// The node is up (`node_id`): answer the init or join that started it.
    pub(crate) async fn started(&mut self, node_id: &str) {
        if let Some(p) = self.pending.take() {
            p.answer(Ok(node_id.to_string()));
        }
    }

    /// Waits for a leave request; init and join meanwhile are refused (this node is in a swarm).
    pub(crate) async fn next_leave(&mut self) -> oneshot::Sender<Result<(), ApiError>> {
        loop {
            match self.requests.recv().await {
                Some(Request::Leave(reply)) => return reply,
                Some(Request::Init(_, reply)) => drop(reply.send(Err(ApiError::Unavailable(SWARM_EXISTS.into())))),
                Some(Request::Join(_, reply)) => drop(reply.send(Err(ApiError::Unavailable(SWARM_EXISTS.into())))),
                None => std::future::pending::<()>().await,
            }
        }
    }
}

/// Why the inactive state ended.
pub(crate) enum InactiveExit {
    /// The daemon is stopping.
    Stopped,
    /// An init or join to start: `cfg` says how; the pending answer is set.
    Start,
}

/// Serves the inactive control socket until an init or join comes (then `cfg` holds what it asked for and
/// `pending` the answer to give once started) or `stop` resolves. An answer left `pending` by an earlier
/// attempt (a failure, a leave) is sent once this socket answers.
pub(crate) async fn serve_inactive(
    cfg: &mut DaemonConfig,
    control: &ControlSocket,
    handle: &Handle,
    requests: &mut mpsc::Receiver<Request>,
    pending: &mut Option<Pending>,
    stop: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) -> Result<InactiveExit, NodeError> {
    let ctx = shoal_engine_api::lifecycle::InactiveContext {
        hostname: cfg.hostname.clone().unwrap_or_else(crate::machine_hostname),
        default_spec: crate::default_cluster_spec(),
        lifecycle: handle.as_ref(),
    };
    let router = crate::engine_relay(cfg, None).wrap(shoal_engine_api::lifecycle::inactive_router(ctx));
    control.install(router)?;
    if let Some(mut p) = pending.take() {
        let r = match p.failure.take() {
            Some(e) => Err(e),
            None => Ok(String::new()),
        };
        p.answer(r);
    }
    tracing::info!(
        control = %cfg.listen_control_api.display(),
        "this node is in no swarm: waiting for `docker swarm init` or `docker swarm join`"
    );
    let mut stop = stop;
    loop {
        let req = tokio::select! {
            _ = stop.as_mut() => return Ok(InactiveExit::Stopped),
            r = requests.recv() => r,
        };
        match req {
            None => return Ok(InactiveExit::Stopped),
            Some(Request::Leave(reply)) => {
                let _ = reply.send(Err(ApiError::Unavailable(shoal_engine_api::lifecycle::NO_SWARM.into())));
            }
            Some(Request::Init(opts, reply)) => {
                match init_addresses(cfg, &opts) {
                    Ok(()) => {}
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        continue;
                    }
                }
                tracing::info!(listen = %cfg.listen_remote_api, advertise = ?cfg.advertise_remote_api, "docker swarm \
                                                                                                        init: starting \
                                                                                                        a new swarm");
                *pending = Some(Pending {
                    reply: Reply::Init(reply),
                    init: Some((opts.spec, opts.availability)),
                    join_availability: None,
                    failure: None,
                });
                return Ok(InactiveExit::Start);
            }
            Some(Request::Join(opts, reply)) => {
                let remote = pick_remote(&opts.remote_addrs).await;
                cfg.listen_remote_api = opts.listen;
                cfg.advertise_remote_api = opts.advertise.or(flag_advertise(cfg));
                cfg.data_path_addr = opts.data_path_addr.or(cfg.data_path_addr_flag);
                cfg.join_addr = Some(remote.clone());
                cfg.join_token = Some(crate::JoinToken(opts.join_token.clone()));
                cfg.join_retry_for = API_JOIN_RETRY_FOR;
                tracing::info!(manager = %remote, listen = %cfg.listen_remote_api, "docker swarm join: joining");
                *pending = Some(Pending {
                    reply: Reply::Join(reply),
                    init: None,
                    join_availability: Some(opts.availability),
                    failure: None,
                });
                return Ok(InactiveExit::Start);
            }
        }
    }
}

/// The daemon's own `--advertise-remote-api`, when its flags named it.
fn flag_advertise(cfg: &DaemonConfig) -> Option<SocketAddr> {
    cfg.advertise_remote_api.filter(|_| cfg.remote_api_from_flags)
}

/// Sets `cfg`'s addresses for an init: the request's; else the daemon's `--advertise-remote-api`; else the
/// source address of this machine's default route, with the listen port.
fn init_addresses(cfg: &mut DaemonConfig, opts: &InitOptions) -> Result<(), ApiError> {
    let advertise = match opts.advertise.or(flag_advertise(cfg)) {
        Some(a) => a,
        None => {
            let ip = default_route_ip().ok_or_else(|| {
                ApiError::BadRequest(
                    "could not choose an IP address to advertise: this machine has no default route to take one from"
                        .into(),
                )
            })?;
            SocketAddr::new(ip, opts.listen.port())
        }
    };
    cfg.listen_remote_api = opts.listen;
    cfg.advertise_remote_api = Some(advertise);
    cfg.data_path_addr = opts.data_path_addr.or(cfg.data_path_addr_flag);
    cfg.init_networking = opts.networking.clone();
    cfg.join_addr = None;
    cfg.join_token = None;
    Ok(())
}

/// The local address the kernel would send from to a public address (no packet is sent).
fn default_route_ip() -> Option<std::net::IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.1:9").ok()?;
    s.local_addr().ok().map(|a| a.ip()).filter(|ip| !ip.is_unspecified())
}

/// The first of `addrs` that accepts a TCP connection within `REMOTE_PROBE_TIMEOUT`; the first one when
/// none does (the join then retries it and reports why it failed).
async fn pick_remote(addrs: &[String]) -> String {
    if addrs.len() > 1 {
        for a in addrs {
            let probe = tokio::time::timeout(REMOTE_PROBE_TIMEOUT, tokio::net::TcpStream::connect(a.as_str())).await;
            if matches!(probe, Ok(Ok(_))) {
                return a.clone();
            }
            tracing::info!(manager = %a, "cannot reach this manager; trying the next one named");
        }
    }
    addrs[0].clone()
}

/// Records the addresses this member runs with (a restart uses them unless its flags name others).
pub(crate) fn record_member(cfg: &DaemonConfig) -> Result<(), NodeError> {
    let r = SwarmRecord {
        inactive: false,
        listen_remote_api: Some(cfg.listen_remote_api),
        advertise_remote_api: cfg.advertise_remote_api,
        data_path_addr: cfg.data_path_addr,
    };
    if load_record(&cfg.state_dir)? != r {
        store_record(&cfg.state_dir, &r)?;
    }
    Ok(())
}

/// Longest an init with an external CA waits for the signer to issue this manager's certificate.
pub(crate) const INIT_EXTERNAL_CA_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Resolves once the cluster has no root rotation in progress, or fails after `limit`.
async fn rotation_done(state: &shoal_manager::ClusterState, limit: std::time::Duration) -> Result<(), ApiError> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let (done, mut watch) = state.store.view_and_watch(|t| {
            t.clusters().iter().next().is_some_and(|c| c.root_ca.as_ref().is_some_and(|r| r.root_rotation.is_none()))
        });
        if done {
            return Ok(());
        }
        if tokio::time::timeout_at(deadline, watch.recv()).await.is_err() {
            return Err(ApiError::Unavailable(format!(
                "the external CA did not sign this manager's certificate within {}s: check that the signer is running \
                 at the --external-ca URL, serves HTTPS with a certificate from the cacert root, and holds that root's \
                 key",
                limit.as_secs()
            )));
        }
    }
}

/// After a successful init: the request's spec, then this node's availability. An external CA with its root
/// (`--external-ca ...,cacert=FILE`) moves the new swarm to that root (a root rotation whose certificates the
/// signer issues), finished before the init is answered, so the join tokens it shows are the final ones.
pub(crate) async fn apply_init(
    state: &shoal_manager::ClusterState,
    node_id: &str,
    spec: shoal_api::ClusterSpec,
    availability: Availability,
) -> Result<(), ApiError> {
    use shoal_manager::controlapi;
    let mut spec = spec;
    let signer_root = spec
        .ca_config
        .as_ref()
        .and_then(|c| c.external_cas.iter().find(|e| !e.ca_cert.is_empty()))
        .map(|e| e.ca_cert.clone());
    if let (Some(root), Some(ca)) = (&signer_root, spec.ca_config.as_mut()) {
        ca.signing_ca_cert = root.clone();
    }
    // The new leader's own subsystems write the cluster object too (the key manager its first network keys),
    // so an update based on a version they moved past is read again and retried, a bounded number of times.
    for attempt in 1..=10 {
        let cluster = controlapi::get_cluster(state)?;
        if cluster.spec.as_ref() == Some(&spec) {
            break;
        }
        let version = cluster.meta.as_ref().and_then(|m| m.version.as_ref()).map_or(0, |v| v.index);
        match controlapi::update_cluster(state, &cluster.id, version, spec.clone()).await {
            Ok(_) => break,
            Err(controlapi::ControlError::Conflict(m)) if attempt < 10 => {
                tracing::debug!(attempt, "the cluster changed under the init's settings, reading it again: {m}");
            }
            Err(e) => return Err(e.into()),
        }
    }
    if signer_root.is_some() {
        rotation_done(state, INIT_EXTERNAL_CA_WAIT).await?;
    }
    if availability != Availability::Active {
        let node = controlapi::get_node(state, node_id)?;
        let version = node.meta.as_ref().and_then(|m| m.version.as_ref()).map_or(0, |v| v.index);
        let mut spec = node.spec.clone().unwrap_or_default();
        spec.set_availability(availability.to_api());
        controlapi::update_node(state, node_id, version, spec).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(dir: &Path) -> DaemonConfig {
        DaemonConfig::new(dir.join("state"), dir.join("state/control.sock"))
    }

    #[test]
    fn an_empty_state_dir_waits_only_with_no_init_or_after_a_leave() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = cfg(dir.path());
        std::fs::create_dir_all(&c.state_dir).unwrap();
        assert!(!prepare_start(&mut c).unwrap(), "today's default: bootstrap");
        c.no_init = true;
        assert!(prepare_start(&mut c).unwrap());
        c.join_addr = Some("127.0.0.1:1".into());
        assert!(prepare_start(&mut c).unwrap_err().to_string().contains("--no-init"));
        let mut c = cfg(dir.path());
        std::fs::create_dir_all(c.state_dir.join("raft")).unwrap();
        std::fs::write(c.state_dir.join("node.json"), br#"{"node_id":"n","raft_id":3}"#).unwrap();
        std::fs::write(c.state_dir.join(crate::STATE_DIR_LOCK), b"1").unwrap();
        std::fs::write(&c.listen_control_api, b"").unwrap();
        assert!(!prepare_start(&mut c).unwrap(), "a member");
        clear_state(&c).unwrap();
        let mut left: Vec<_> =
            std::fs::read_dir(&c.state_dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        assert_eq!(left, ["control.sock", "shoal.lock", "swarm.json"]);
        assert!(prepare_start(&mut c).unwrap(), "a node that left stays out without --no-init");
        c.join_addr = Some("127.0.0.1:1".into());
        c.join_token = Some(crate::JoinToken("t".into()));
        assert!(!prepare_start(&mut c).unwrap(), "explicit join flags join");
    }

    #[test]
    fn a_restart_uses_the_addresses_of_the_last_init_unless_flags_name_them() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = cfg(dir.path());
        std::fs::create_dir_all(&c.state_dir).unwrap();
        c.listen_remote_api = "127.0.0.9:4000".parse().unwrap();
        c.advertise_remote_api = Some("127.0.0.9:4000".parse().unwrap());
        c.data_path_addr = Some("10.1.2.3".parse().unwrap());
        record_member(&c).unwrap();
        let mut again = cfg(dir.path());
        prepare_start(&mut again).unwrap();
        assert_eq!(again.listen_remote_api, c.listen_remote_api);
        assert_eq!(again.advertise_remote_api, c.advertise_remote_api);
        assert_eq!(again.data_path_addr, c.data_path_addr);
        let mut flags = cfg(dir.path());
        flags.remote_api_from_flags = true;
        flags.data_path_addr = Some("10.9.9.9".parse().unwrap());
        prepare_start(&mut flags).unwrap();
        assert_eq!(flags.listen_remote_api, cfg(dir.path()).listen_remote_api);
        assert_eq!(flags.data_path_addr, Some("10.9.9.9".parse().unwrap()), "the flag wins");
    }
}
