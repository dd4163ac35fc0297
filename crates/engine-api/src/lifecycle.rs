//! The swarm lifecycle on the control socket, as Docker's `daemon/cluster` answers it: `POST /swarm/init`,
//! `POST /swarm/join` and `POST /swarm/leave`, and the socket of a node that is in no swarm yet (an
//! "inactive" node: `/_ping`, `/version`, `/info` with `Swarm.LocalNodeState` `"inactive"`, init and join;
//! everything else refused with Docker's "not a swarm manager. Use docker swarm init or docker swarm join"
//! message).
//!
//! This module decodes and checks the requests (addresses as the engine reads them, every field Shoal cannot
//! honour refused with a 400 naming it, the spec merged into the defaults and validated before anything
//! starts) and the leave refusals that need the cluster state (a manager without `force`, with Docker's
//! quorum messages). Starting and stopping the node's part in the cluster is the node's (`SwarmLifecycle`),
//! which answers only once the node is in its new state, so the next command sees it. Answers to init, join
//! and leave close their connection (the socket's server changes under them).
//!
//! Must not depend on Raft, the state dir or the executors.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::future::BoxFuture;
use serde::Deserialize;
use shoal_api::{ClusterSpec, NodeRole};

use crate::error::ApiError;
use crate::json::objects::SwarmSpecJson;
use crate::json::system::{InfoJson, SwarmInfoJson};
use crate::swarm_update::merge_spec;

/// Docker's message for a cluster command sent to a node that is in no swarm.
pub const NOT_IN_SWARM: &str = "This node is not a swarm manager. Use \"docker swarm init\" or \"docker swarm join\" \
to connect this node to swarm and try again.";

/// Docker's message for init or join on a node that is already in a swarm.
pub const SWARM_EXISTS: &str =
    "This node is already part of a swarm. Use \"docker swarm leave\" to leave this swarm and join another one.";

/// Docker's message for leave on a node that is in no swarm.
pub const NO_SWARM: &str = "This node is not part of a swarm";

/// The port of a listen or advertise address that names none (Docker's).
pub const DEFAULT_SWARM_PORT: u16 = 2377;

/// The most addresses a join request may name.
pub const MAX_REMOTE_ADDRS: usize = 16;

/// The longest join token accepted (a real one is about 85 bytes).
pub const MAX_JOIN_TOKEN_BYTES: usize = 1024;

/// The node availability an init or join asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Availability {
    /// Tasks are scheduled on it (the default).
    #[default]
    Active,
    /// No new tasks.
    Pause,
    /// No tasks.
    Drain,
}

impl Availability {
    fn parse(s: &str) -> Result<Availability, ApiError> {
        match s.to_ascii_lowercase().as_str() {
            "" | "active" => Ok(Availability::Active),
            "pause" => Ok(Availability::Pause),
            "drain" => Ok(Availability::Drain),
            other => Err(ApiError::BadRequest(format!("invalid Availability {other:?}: use active, pause or drain"))),
        }
    }

    /// The wire value.
    pub fn to_api(self) -> shoal_api::node_spec::Availability {
        match self {
            Availability::Active => shoal_api::node_spec::Availability::Active,
            Availability::Pause => shoal_api::node_spec::Availability::Pause,
            Availability::Drain => shoal_api::node_spec::Availability::Drain,
        }
    }
}

/// What a checked `POST /swarm/init` asks the node to do.
#[derive(Debug, Clone)]
pub struct InitOptions {
    /// The remote API's listen address.
    pub listen: SocketAddr,
    /// The address other nodes use (None: the node picks one, see the node's doc).
    pub advertise: Option<SocketAddr>,
    /// The cluster spec to write once the cluster exists: the defaults with the request's fields merged in,
    /// already validated.
    pub spec: ClusterSpec,
    /// The node's availability.
    pub availability: Availability,
    /// The address the node's overlay (VXLAN) traffic uses (`DataPathAddr`; None: the advertised one).
    pub data_path_addr: Option<IpAddr>,
    /// The address pools and data path port the swarm's networks are made with (checked).
    pub networking: shoal_manager::controlapi::network::SwarmNetworking,
}

/// What a checked `POST /swarm/join` asks the node to do.
#[derive(Clone)]
pub struct JoinOptions {
    /// The remote API's listen address (used if the node is or becomes a manager).
    pub listen: SocketAddr,
    /// The address other nodes use (None: the listen address, or the node picks one).
    pub advertise: Option<SocketAddr>,
    /// Managers to join through, tried in order (1 to `MAX_REMOTE_ADDRS`, `host:port`).
    pub remote_addrs: Vec<String>,
    /// The join token (a secret).
    pub join_token: String,
    /// The node's availability.
    pub availability: Availability,
    /// As in `InitOptions`.
    pub data_path_addr: Option<IpAddr>,
}

impl std::fmt::Debug for JoinOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinOptions")
            .field("listen", &self.listen)
            .field("advertise", &self.advertise)
            .field("remote_addrs", &self.remote_addrs)
            .field("availability", &self.availability)
            .field("data_path_addr", &self.data_path_addr)
            .finish_non_exhaustive()
    }
}

/// The node's side of the lifecycle: each call answers once the node is in its new state.
pub trait SwarmLifecycle: Send + Sync + 'static {
    /// Makes this inactive node the first manager of a new swarm; answers its node ID.
    fn init(&self, opts: InitOptions) -> BoxFuture<'static, Result<String, ApiError>>;
    /// Joins this inactive node to a swarm.
    fn join(&self, opts: JoinOptions) -> BoxFuture<'static, Result<(), ApiError>>;
    /// Stops this node's part in its swarm, removes its cluster state, back to inactive (the checks that
    /// need `force` are done before).
    fn leave(&self) -> BoxFuture<'static, Result<(), ApiError>>;
}

/// A handle on the node's lifecycle, or none (in-process test nodes: init, join and leave answer 503).
#[derive(Clone, Default)]
pub struct LifecycleRef(pub Option<Arc<dyn SwarmLifecycle>>);

impl std::fmt::Debug for LifecycleRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "LifecycleRef(Some)" } else { "LifecycleRef(None)" })
    }
}

impl LifecycleRef {
    fn get(&self) -> Result<&Arc<dyn SwarmLifecycle>, ApiError> {
        self.0.as_ref().ok_or_else(|| {
            ApiError::Unavailable(
                "this node's swarm membership is fixed (an in-process node): it cannot init, join or leave".into(),
            )
        })
    }
}

/// `POST /swarm/init` body (Docker's `InitRequest`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct InitRequestJson {
    /// `host:port` (IP or empty host), `:port` or `host`.
    pub listen_addr: String,
    /// Address advertised to other nodes.
    pub advertise_addr: String,
    /// Data path (VXLAN) address.
    pub data_path_addr: String,
    /// Data path (VXLAN) port.
    pub data_path_port: u32,
    /// Address pools for networks.
    pub default_addr_pool: Vec<String>,
    /// Force a new cluster from this node's state.
    pub force_new_cluster: bool,
    /// The swarm spec.
    pub spec: SwarmSpecJson,
    /// Autolock (also in `Spec.EncryptionConfig`).
    pub auto_lock_managers: bool,
    /// The node's availability.
    pub availability: String,
    /// The pools' subnet size.
    pub subnet_size: u32,
}

/// `POST /swarm/join` body (Docker's `JoinRequest`).
#[derive(Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct JoinRequestJson {
    /// As in init.
    pub listen_addr: String,
    /// As in init.
    pub advertise_addr: String,
    /// As in init.
    pub data_path_addr: String,
    /// Managers of the swarm.
    pub remote_addrs: Vec<String>,
    /// The join token.
    pub join_token: String,
    /// The node's availability.
    pub availability: String,
}

/// An address as the engine reads a listen, advertise or remote address (`validateAddr` with the default
/// `0.0.0.0:2377`): `ip:port`, `ip`, `:port`, `[v6]:port`, optionally `tcp://`. Returns the host (empty when
/// absent) and the port. Host names are read only where `allow_names` (remote addresses).
fn split_addr(field: &str, addr: &str, default_port: u16) -> Result<(String, u16), ApiError> {
    let bad = |why: &str| ApiError::BadRequest(format!("invalid {field} {addr:?}: {why}"));
    if addr.is_empty() {
        return Err(bad("invalid empty address"));
    }
    if addr.len() > 300 {
        return Err(bad("longer than 300 bytes"));
    }
    let a = addr.strip_prefix("tcp://").unwrap_or(addr);
    let (host, port) = if let Some(rest) = a.strip_prefix('[') {
        let (h, tail) = rest.split_once(']').ok_or_else(|| bad("unclosed ["))?;
        match tail {
            "" => (h.to_string(), None),
            t => (h.to_string(), Some(t.strip_prefix(':').ok_or_else(|| bad("expected :port after ]"))?)),
        }
    } else {
        match a.rsplit_once(':') {
            Some((h, _)) if h.contains(':') => (a.to_string(), None), // a bare IPv6 address
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (a.to_string(), None),
        }
    };
    let port = match port {
        None | Some("") => default_port,
        Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| bad("the port must be 1 to 65535"))?,
    };
    Ok((host, port))
}

fn ip_of(field: &str, addr: &str, host: &str) -> Result<Option<IpAddr>, ApiError> {
    if host.is_empty() {
        return Ok(None);
    }
    host.parse::<IpAddr>().map(Some).map_err(|_| {
        ApiError::BadRequest(format!(
            "invalid {field} {addr:?}: {host:?} is not an IP address (Shoal does not read interface names here): \
             give this node's IP address"
        ))
    })
}

/// The listen address: an IP (or none: all addresses) and a port, 2377 when absent.
pub fn parse_listen_addr(addr: &str) -> Result<SocketAddr, ApiError> {
    let (host, port) = split_addr("ListenAddr", addr, DEFAULT_SWARM_PORT)?;
    let ip = ip_of("ListenAddr", addr, &host)?.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    Ok(SocketAddr::new(ip, port))
}

/// The advertise address: a specific IP, and a port (the listen port when absent). Empty: none given; a
/// listen address on a specific IP is then advertised as it is.
pub fn parse_advertise_addr(addr: &str, listen: SocketAddr) -> Result<Option<SocketAddr>, ApiError> {
    if addr.is_empty() {
        return Ok((!listen.ip().is_unspecified()).then_some(listen));
    }
    let (host, port) = split_addr("AdvertiseAddr", addr, listen.port())?;
    match ip_of("AdvertiseAddr", addr, &host)? {
        Some(ip) if !ip.is_unspecified() => Ok(Some(SocketAddr::new(ip, port))),
        _ => Err(ApiError::BadRequest(format!(
            "invalid AdvertiseAddr {addr:?}: advertise address must be a non-zero IP address (--advertise-addr)"
        ))),
    }
}

/// Reads `DataPathAddr` by `shoal_engine_json::data_path_addr`'s rule (the `--data-path-addr` flag's too); a
/// bad one is a 400 naming why.
pub fn parse_data_path_addr(addr: &str) -> Result<Option<IpAddr>, ApiError> {
    crate::json::data_path_addr(addr).map_err(ApiError::BadRequest)
}

/// The init spec's refusals: what a new cluster's CA cannot honour.
pub(crate) fn refuse_unsupported_spec(j: &SwarmSpecJson) -> Result<(), ApiError> {
    for (field, set) in [
        ("CAConfig.SigningCACert", !j.ca_config.signing_ca_cert.is_empty()),
        ("CAConfig.SigningCAKey", !j.ca_config.signing_ca_key.is_empty()),
    ] {
        if set {
            return Err(ApiError::BadRequest(format!(
                "{field} is not supported at init: a new swarm's CA makes its own root; after the init, rotate to your \
                 root (docker swarm ca --rotate --ca-cert --ca-key)"
            )));
        }
    }
    // An external CA at init roots the swarm at the signer's root: which one must be said.
    for e in &j.ca_config.external_cas {
        e.check()?;
        if e.ca_cert.is_empty() {
            return Err(ApiError::BadRequest(
                "CAConfig.ExternalCAs at init needs the signer's root certificate: add cacert=FILE to --external-ca \
                 (the root whose key the signer holds)"
                    .into(),
            ));
        }
    }
    Ok(())
}

/// Checks an init request against `defaults` (the spec a new cluster starts with).
pub fn check_init(req: InitRequestJson, defaults: &ClusterSpec) -> Result<InitOptions, ApiError> {
    let listen = parse_listen_addr(&req.listen_addr)?;
    let advertise = parse_advertise_addr(&req.advertise_addr, listen)?;
    let data_path_addr = parse_data_path_addr(&req.data_path_addr)?;
    let networking = shoal_manager::controlapi::network::SwarmNetworking::check(
        &req.default_addr_pool,
        req.subnet_size,
        req.data_path_port,
    )?;
    let availability = Availability::parse(&req.availability)?;
    let mut j = req.spec;
    if !j.name.is_empty() && j.name != "default" {
        return Err(ApiError::BadRequest("swarm spec must be named \"default\"".into()));
    }
    refuse_unsupported_spec(&j)?;
    // The engine: `AutoLockManagers` of the request turns autolock on (the CLI sends it in both places).
    j.encryption_config.auto_lock_managers |= req.auto_lock_managers;
    let spec = merge_spec(defaults, &j);
    shoal_manager::controlapi::validate_cluster_spec(defaults, &spec)?;
    // `ForceNewCluster` on a node without a swarm: a new cluster is what it makes anyway.
    let _ = req.force_new_cluster;
    Ok(InitOptions { listen, advertise, spec, availability, data_path_addr, networking })
}

/// Checks a join request.
pub fn check_join(req: JoinRequestJson) -> Result<JoinOptions, ApiError> {
    let listen = parse_listen_addr(&req.listen_addr)?;
    let advertise = parse_advertise_addr(&req.advertise_addr, listen)?;
    let data_path_addr = parse_data_path_addr(&req.data_path_addr)?;
    let availability = Availability::parse(&req.availability)?;
    if req.remote_addrs.is_empty() {
        return Err(ApiError::BadRequest("at least 1 RemoteAddr is required to join".into()));
    }
    if req.remote_addrs.len() > MAX_REMOTE_ADDRS {
        return Err(ApiError::BadRequest(format!(
            "{} RemoteAddrs: at most {MAX_REMOTE_ADDRS} managers may be named",
            req.remote_addrs.len()
        )));
    }
    let mut remote_addrs = Vec::new();
    for a in &req.remote_addrs {
        let (host, port) = split_addr("RemoteAddr", a, DEFAULT_SWARM_PORT)?;
        if host.is_empty() {
            return Err(ApiError::BadRequest(format!("invalid RemoteAddr {a:?}: name the manager's host")));
        }
        remote_addrs.push(match host.parse::<IpAddr>() {
            Ok(ip) => SocketAddr::new(ip, port).to_string(),
            Err(_) => format!("{host}:{port}"),
        });
    }
    if req.join_token.is_empty() {
        return Err(ApiError::BadRequest(
            "a JoinToken is required: get one with `docker swarm join-token worker` (or manager) on a manager".into(),
        ));
    }
    if req.join_token.len() > MAX_JOIN_TOKEN_BYTES {
        return Err(ApiError::BadRequest(format!(
            "the JoinToken is longer than {MAX_JOIN_TOKEN_BYTES} bytes: it is not a join token"
        )));
    }
    shoal_ca::parse_join_token(&req.join_token).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    Ok(JoinOptions { listen, advertise, remote_addrs, join_token: req.join_token, availability, data_path_addr })
}

/// An answer whose connection is closed after it (the node's socket server changes under it).
fn closing(mut r: Response) -> Response {
    r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

async fn init_with(
    lifecycle: &LifecycleRef,
    defaults: &ClusterSpec,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let req: InitRequestJson = crate::request::json_body(headers, body, "swarm init request")?;
    let opts = check_init(req, defaults)?;
    let node_id = lifecycle.get()?.init(opts).await?;
    Ok(Json(node_id).into_response())
}

async fn join_with(lifecycle: &LifecycleRef, headers: &HeaderMap, body: &Bytes) -> Result<Response, ApiError> {
    let req: JoinRequestJson = crate::request::json_body(headers, body, "swarm join request")?;
    let opts = check_join(req)?;
    lifecycle.get()?.join(opts).await?;
    Ok(StatusCode::OK.into_response())
}

/// The leave refusals of a manager without `force` (Docker's `Cluster.Leave`): `managers` are the
/// managers' reachabilities, `me_reachable` whether this one is among the reachable, `has_leader` whether
/// the manager takes part in a working control plane.
pub fn manager_leave_refusal(has_leader: bool, me_reachable: bool, reachable: usize, unreachable: usize) -> String {
    let mut msg = String::from("You are attempting to leave the swarm on a node that is participating as a manager. ");
    if has_leader {
        if me_reachable && reachable.saturating_sub(2) <= unreachable {
            if reachable == 1 && unreachable == 0 {
                msg.push_str(
                    "Removing the last manager erases all current state of the swarm. Use `--force` to ignore this \
                     message. ",
                );
                return msg;
            }
            msg.push_str(&format!(
                "Removing this node leaves {} managers out of {}. Without a Raft quorum your swarm will be \
                 inaccessible. ",
                reachable.saturating_sub(1),
                reachable + unreachable
            ));
        }
    } else {
        msg.push_str("Doing so may lose the consensus of your cluster. ");
    }
    msg.push_str(
        "The only way to restore a swarm that has lost consensus is to reinitialize it with `--force-new-cluster`. \
         Use `--force` to suppress this message.",
    );
    msg
}

/// `POST /swarm/init` on a manager: it is in a swarm already.
pub(crate) async fn manager_init(headers: HeaderMap, body: Bytes) -> ApiError {
    match crate::request::json_body::<InitRequestJson>(&headers, &body, "swarm init request") {
        Ok(r) if r.force_new_cluster => ApiError::BadRequest(
            "ForceNewCluster on a running manager is not supported yet: stop the daemon and start it again with \
             --force-new-cluster"
                .into(),
        ),
        Ok(_) => ApiError::Unavailable(SWARM_EXISTS.into()),
        Err(e) => e,
    }
}

/// `POST /swarm/join` on a node in a swarm.
pub(crate) async fn member_join(headers: HeaderMap, body: Bytes) -> ApiError {
    match crate::request::json_body::<JoinRequestJson>(&headers, &body, "swarm join request") {
        Ok(_) => ApiError::Unavailable(SWARM_EXISTS.into()),
        Err(e) => e,
    }
}

/// `POST /swarm/leave[?force=1]` on a manager.
pub(crate) async fn manager_leave(
    State(ctx): State<Arc<crate::ApiContext>>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let force = crate::request::parse_bool_param(&q, "force")?;
    let lifecycle = ctx.lifecycle.get()?.clone();
    if !force {
        let has_leader = ctx.state.proposer.leadership().borrow().leader_id != 0;
        let (me, reachable, unreachable) = ctx.state.store.view(|t| {
            let mut me = false;
            let (mut reachable, mut unreachable) = (0, 0);
            for n in t.nodes().iter().filter(|n| n.role() == NodeRole::Manager) {
                let Some(m) = n.manager_status.as_ref() else { continue };
                match m.reachability() {
                    shoal_api::raft_member_status::Reachability::Reachable => {
                        reachable += 1;
                        me |= n.id == ctx.node_id;
                    }
                    shoal_api::raft_member_status::Reachability::Unreachable => unreachable += 1,
                    _ => {}
                }
            }
            (me, reachable, unreachable)
        });
        return Err(ApiError::Unavailable(manager_leave_refusal(has_leader, me, reachable, unreachable)));
    }
    lifecycle.leave().await?;
    Ok(closing(StatusCode::OK.into_response()))
}

/// `POST /swarm/leave` on a worker (no refusal: a worker holds no cluster state).
pub(crate) async fn worker_leave(
    lifecycle: &LifecycleRef,
    q: &std::collections::HashMap<String, String>,
) -> Result<Response, ApiError> {
    crate::request::parse_bool_param(q, "force")?;
    lifecycle.get()?.leave().await?;
    Ok(closing(StatusCode::OK.into_response()))
}

/// What the socket of a node in no swarm knows.
#[derive(Clone, Debug)]
pub struct InactiveContext {
    /// The host name.
    pub hostname: String,
    /// The spec a new cluster starts with (init requests are merged into it and checked against it).
    pub default_spec: ClusterSpec,
    /// The node's lifecycle.
    pub lifecycle: LifecycleRef,
}

async fn inactive_info(State(ctx): State<Arc<InactiveContext>>, v: crate::request::ApiVersion) -> Json<InfoJson> {
    let mut info = InfoJson {
        swarm: SwarmInfoJson { local_node_state: "inactive".into(), control_available: false, ..Default::default() },
        ..crate::handlers::host_info("", &ctx.hostname)
    };
    crate::versions::adjust_info(v, &mut info);
    Json(info)
}

async fn inactive_init(State(ctx): State<Arc<InactiveContext>>, headers: HeaderMap, body: Bytes) -> Response {
    closing(init_with(&ctx.lifecycle, &ctx.default_spec, &headers, &body).await.unwrap_or_else(|e| e.into_response()))
}

async fn inactive_join(State(ctx): State<Arc<InactiveContext>>, headers: HeaderMap, body: Bytes) -> Response {
    closing(join_with(&ctx.lifecycle, &headers, &body).await.unwrap_or_else(|e| e.into_response()))
}

async fn inactive_leave(Query(q): Query<std::collections::HashMap<String, String>>) -> ApiError {
    match crate::request::parse_bool_param(&q, "force") {
        Ok(_) => ApiError::Unavailable(NO_SWARM.into()),
        Err(e) => e,
    }
}

async fn inactive_refuse() -> ApiError {
    ApiError::Unavailable(NOT_IN_SWARM.into())
}

/// The routes of a node in no swarm (see `crate::with_context` for `/_ping`, `/version` and the prefix).
pub fn inactive_router(ctx: InactiveContext) -> Router {
    let routes = Router::new()
        .route("/info", get(inactive_info))
        .route("/swarm/init", post(inactive_init))
        .route("/swarm/join", post(inactive_join))
        .route("/swarm/leave", post(inactive_leave))
        .fallback(inactive_refuse);
    crate::with_context(routes, ctx)
}

/// Serves the inactive socket on `listener` until `shutdown` resolves (in-flight requests finish).
pub async fn serve_inactive_unix(
    listener: tokio::net::UnixListener,
    ctx: InactiveContext,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    crate::connections::serve_unix(
        listener,
        inactive_router(ctx),
        crate::connections::ConnectionLimits::default(),
        shutdown,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_read_as_the_engine_reads_them() {
        let check = |a: &str, want: &str| assert_eq!(parse_listen_addr(a).unwrap().to_string(), want, "{a}");
        check("0.0.0.0:2377", "0.0.0.0:2377");
        check("127.0.0.2", "127.0.0.2:2377");
        check(":4000", "0.0.0.0:4000");
        check("tcp://10.0.0.1:4000", "10.0.0.1:4000");
        check("[::1]:4000", "[::1]:4000");
        for bad in ["", "eth0:2377", "1.2.3.4:0", "1.2.3.4:99999", "[::1"] {
            assert!(parse_listen_addr(bad).is_err(), "{bad}");
        }
        let listen = parse_listen_addr("0.0.0.0:4000").unwrap();
        assert_eq!(parse_advertise_addr("", listen).unwrap(), None);
        assert_eq!(parse_advertise_addr("10.1.1.1", listen).unwrap(), Some("10.1.1.1:4000".parse().unwrap()));
        assert!(parse_advertise_addr("0.0.0.0:1", listen).is_err());
        let listen = parse_listen_addr("10.2.2.2:4000").unwrap();
        assert_eq!(parse_advertise_addr("", listen).unwrap(), Some(listen));
    }

    fn defaults() -> ClusterSpec {
        ClusterSpec {
            annotations: Some(shoal_api::Annotations { name: "default".into(), ..Default::default() }),
            ..Default::default()
        }
    }

    fn init(body: &str) -> Result<InitOptions, String> {
        let req: InitRequestJson = crate::json::decode(body.as_bytes()).map_err(|e| e.to_string())?;
        check_init(req, &defaults()).map_err(|e| e.to_string())
    }

    #[test]
    fn init_refuses_what_it_cannot_honour_and_names_it() {
        // What `docker swarm init` sends by default.
        let ok = init(
            r#"{"ListenAddr":"0.0.0.0:2377","AdvertiseAddr":"10.0.0.5","DataPathAddr":"","DataPathPort":0,
            "DefaultAddrPool":null,"ForceNewCluster":false,"Spec":{"Orchestration":{},"Raft":{"ElectionTick":0},
            "Dispatcher":{},"CAConfig":{},"TaskDefaults":{},"EncryptionConfig":{"AutoLockManagers":false}},
            "AutoLockManagers":false,"Availability":"","SubnetSize":24}"#,
        )
        .unwrap();
        assert_eq!(ok.advertise, Some("10.0.0.5:2377".parse().unwrap()));
        assert_eq!(ok.networking, shoal_manager::controlapi::network::SwarmNetworking::default());
        let pools = init(
            r#"{"ListenAddr":"0.0.0.0:2377","DataPathPort":7789,"DefaultAddrPool":["10.20.0.0/16"],"SubnetSize":26}"#,
        )
        .unwrap();
        assert_eq!(pools.networking.data_path_port, 7789);
        assert_eq!(
            (pools.networking.pools.pools[0].to_string(), pools.networking.pools.subnet_size),
            ("10.20.0.0/16".into(), 26)
        );
        let data = init(r#"{"ListenAddr":"0.0.0.0:2377","DataPathAddr":"10.0.0.1"}"#).unwrap();
        assert_eq!(data.data_path_addr, Some("10.0.0.1".parse().unwrap()));
        for (body, field) in [
            (r#"{"ListenAddr":"0.0.0.0:2377","DataPathAddr":"eth1"}"#, "does not read interface names"),
            (r#"{"ListenAddr":"0.0.0.0:2377","DataPathAddr":"127.0.0.1"}"#, "non-zero unicast"),
            (r#"{"ListenAddr":"0.0.0.0:2377","DataPathAddr":"0.0.0.0"}"#, "non-zero unicast"),
            (r#"{"ListenAddr":"0.0.0.0:2377","DataPathAddr":"fd00::1"}"#, "IPv4 only"),
            (r#"{"ListenAddr":"0.0.0.0:2377","DataPathPort":80}"#, "data path port 80 is out of range"),
            (r#"{"ListenAddr":"0.0.0.0:2377","DefaultAddrPool":["10.10.0.0/33"]}"#, "invalid address pool"),
            (r#"{"ListenAddr":"0.0.0.0:2377","DefaultAddrPool":["10.10.0.0/16"],"SubnetSize":8}"#, "too small"),
            (r#"{"ListenAddr":"0.0.0.0:2377","SubnetSize":30}"#, "at most 29"),
            (
                r#"{"ListenAddr":"0.0.0.0:2377","Spec":{"CAConfig":{"ExternalCAs":[{"Protocol":"cfssl","URL":"https://x"}]}}}"#,
                "CAConfig.ExternalCAs",
            ),
            (r#"{"ListenAddr":"0.0.0.0:2377","Spec":{"Name":"other"}}"#, "named \"default\""),
            (r#"{"ListenAddr":"0.0.0.0:2377","Availability":"sometimes"}"#, "Availability"),
            (r#"{"ListenAddr":""}"#, "invalid empty address"),
            (
                r#"{"ListenAddr":"0.0.0.0:2377","Spec":{"CAConfig":{"NodeCertExpiry":1000000000}}}"#,
                "certificate expiry",
            ),
        ] {
            let e = init(body).unwrap_err();
            assert!(e.contains(field), "{body}: {e}");
        }
        let autolock = init(r#"{"ListenAddr":"0.0.0.0:2377","AutoLockManagers":true,"Availability":"drain"}"#).unwrap();
        assert!(shoal_manager::controlapi::autolock_on(Some(&autolock.spec)));
        assert_eq!(autolock.availability, Availability::Drain);
    }

    #[test]
    fn join_needs_a_manager_and_a_token() {
        let join = |body: &str| {
            let req: JoinRequestJson = crate::json::decode(body.as_bytes()).unwrap();
            check_join(req).map_err(|e| e.to_string())
        };
        let token = "SWMTKN-1-3pu6hszjas19xyp7ghgosyx9k8atbfcr8p2is99znpy26u2lkl-1awxwuwd3z9j1z3puu7rcgdbx";
        let ok = join(&format!(r#"{{"ListenAddr":"0.0.0.0:2377","RemoteAddrs":["10.0.0.1"],"JoinToken":"{token}"}}"#))
            .unwrap();
        assert_eq!(ok.remote_addrs, ["10.0.0.1:2377"]);
        assert!(!format!("{ok:?}").contains(token), "the token stays out of Debug");
        assert!(join(&format!(r#"{{"ListenAddr":"0.0.0.0:2377","JoinToken":"{token}"}}"#))
            .unwrap_err()
            .contains("RemoteAddr"));
        assert!(join(r#"{"ListenAddr":"0.0.0.0:2377","RemoteAddrs":["10.0.0.1"]}"#).unwrap_err().contains("JoinToken"));
        assert!(join(r#"{"ListenAddr":"0.0.0.0:2377","RemoteAddrs":["10.0.0.1"],"JoinToken":"nope"}"#).is_err());
    }

    #[test]
    fn a_manager_leaving_without_force_gets_dockers_messages() {
        let last = manager_leave_refusal(true, true, 1, 0);
        assert!(
            last.ends_with(
                "Removing the last manager erases all current state of the swarm. Use `--force` to \
                                ignore this message. "
            ),
            "{last}"
        );
        let four = manager_leave_refusal(true, true, 3, 1);
        assert!(four.contains("Removing this node leaves 2 managers out of 4."), "{four}");
        assert!(four.ends_with("Use `--force` to suppress this message."));
        let three = manager_leave_refusal(true, true, 3, 0);
        assert!(!three.contains("leaves"), "a quorum remains: {three}");
        assert!(manager_leave_refusal(false, false, 0, 0).contains("Doing so may lose the consensus"));
    }
}
