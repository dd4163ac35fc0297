//! The rest of the Docker Engine API on the same socket: every path Shoal does not own is relayed to the
//! node's own Docker Engine (the one the docker executor runs containers on), as dockerd serves both from
//! one socket. `Engine::wrap` puts this in front of any of this crate's routers (a manager's, a worker's, a
//! locked manager's, a node's in no swarm):
//!
//! - Shoal's paths (`/_ping`, `/swarm*`, `/services*`, `/tasks*`, `/nodes*`, `/secrets*`, `/configs*`,
//!   `/distribution/*`, `/shoal/*`) go to Shoal's router alone.
//! - `GET /info`, `GET /version`, `GET /networks` and `GET /events` are asked of both and merged (`merge`):
//!   the engine's containers, images and host facts with Shoal's swarm section; local networks then the
//!   swarm's; both event streams in one.
//! - `/networks/create` goes to Shoal for the `overlay` driver (or `Scope: swarm`), else to the engine;
//!   `/networks/{id}` to Shoal when Shoal has that network, else to the engine.
//! - `GET /volumes` is asked of both and merged: the engine's local volumes, then the swarm's cluster volumes
//!   (on a node whose Shoal answers no volumes, a worker, the engine's alone). `POST /volumes/create` goes to
//!   Shoal when it carries a `ClusterVolumeSpec`, else to the engine; `/volumes/{name}` (inspect, update,
//!   delete) to Shoal when the swarm has a cluster volume of that exact name or ID, else to the engine
//!   (`/volumes/prune` is the engine's). A node without an engine serves the cluster volumes alone.
//! - `POST /containers/create` naming an attachable swarm network is made in a holder's namespace that the
//!   node plumbs (`attach::SwarmAttach`, given by `Engine::with_attach`); a non-attachable one is refused
//!   (403, as dockerd); `POST /containers/{id}/start` of such a container waits for the plumbing, and a
//!   `/restart` of a running one keeps its attachment through the restart's stop; `POST
//!   /networks/{id}/connect` and `/disconnect` naming a swarm network connect a running container to it
//!   through the same attachment path (in the container's own namespace) and disconnect it.
//! - Everything else is relayed byte for byte with hyper on both sides: bodies streamed both ways (build
//!   contexts, image loads, logs that follow, stats, events), and `Connection: Upgrade` requests (`attach`,
//!   `exec` start, `docker run -it`) answered 101 and then copied as raw streams both ways. A `/v1.NN` prefix
//!   is kept, lowered to the engine's newest API version when it names a newer one (Shoal answers 1.47; an
//!   older engine would refuse it).
//!
//! Bounds: at most `MAX_RELAYS` relayed requests (and hijacked streams) at once, so relays never hold more
//! than half of the listener's connections and Shoal's own paths always find room; connecting to the
//! engine times out after `CONNECT_TIMEOUT`; the engine's part of a merged answer after `MERGE_TIMEOUT`
//! (Shoal's part is then answered alone). No lock is held across a relay. Relayed connections stay counted
//! by `connections` (a hijacked stream holds its connection, `connections::HeldConnection`).
//!
//! A node without an engine (the process executor) answers the engine's paths with 501 and a message saying
//! so; unknown paths get 404. Must not depend on the store, Raft or the executors.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use futures::StreamExt;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt;

use crate::attach::SwarmAttach;
use crate::connections::HeldConnection;
use crate::json::ErrorResponse;

/// How long connecting to the engine's socket may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How long the engine's part of a merged answer (`/info`, `/version`, `/networks`, the head of `/events`)
/// may take before Shoal's part is answered alone.
pub const MERGE_TIMEOUT: Duration = Duration::from_secs(5);

/// Relayed requests in flight at once (hijacked streams included), half the listener's default connection
/// cap; beyond it: 503.
pub const MAX_RELAYS: usize = 512;

/// The largest engine answer read whole for a merge, and the largest `/networks/create` body looked into.
pub const MERGE_BODY_LIMIT_BYTES: usize = 16 << 20;

/// The longest event line kept whole when two event streams are merged (longer ones are dropped).
pub const MAX_EVENT_LINE_BYTES: usize = 1 << 20;

/// How long a learned engine API version is trusted before it is asked again.
const VERSION_TTL: Duration = Duration::from_secs(60);

/// The first path segments (after any `/v1.NN`) that are Shoal's alone (`debug`: Shoal's own debug views).
const SHOAL_SEGMENTS: &[&str] =
    &["_ping", "swarm", "services", "tasks", "nodes", "secrets", "configs", "distribution", "shoal", "debug"];

/// The first path segments of the Docker Engine API that are the engine's (what a node without one answers
/// 501 to; any other unknown path is a 404 there).
const ENGINE_SEGMENTS: &[&str] = &[
    "auth",
    "build",
    "commit",
    "containers",
    "exec",
    "grpc",
    "images",
    "plugins",
    "session",
    "system",
    "volumes",
    "networks",
];

type EngineClient = Client<UnixConnector, Body>;

/// The engine this node relays to, or why it has none; and the node's side of containers on attachable
/// swarm networks, or why it has none.
#[derive(Clone)]
pub struct Engine(EngineKind, Attacher);

/// The node's `SwarmAttach`, or why it has none.
type Attacher = Result<Arc<dyn SwarmAttach>, Arc<str>>;

/// Why a node has no `SwarmAttach` until `Engine::with_attach` gives one.
const NO_ATTACH: &str =
    "this node cannot plumb a container of its engine into a swarm network (its executor has no data plane)";

#[derive(Clone)]
enum EngineKind {
    Docker(Arc<DockerEngine>),
    Absent(Arc<str>),
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            EngineKind::Docker(d) => write!(f, "Engine::Docker({})", d.socket.display()),
            EngineKind::Absent(why) => write!(f, "Engine::Absent({why})"),
        }
    }
}

struct DockerEngine {
    socket: PathBuf,
    client: EngineClient,
    /// The engine's newest API version and when it was learned (a std lock, never held across an await).
    version: Mutex<Option<(Instant, (u32, u32))>>,
    relays: Arc<Semaphore>,
}

/// What a node with the process executor says of its engine.
pub const PROCESS_EXECUTOR: &str =
    "this node runs its tasks as processes (the process executor) and has no container engine";

impl Engine {
    /// The Docker Engine at `addr` (`unix:///PATH` or a socket path), the one the docker executor uses.
    /// `control_socket` is Shoal's own socket: an engine address naming it (a relay to itself) is refused, as
    /// is a TCP address (the relay speaks to a local unix socket only).
    pub fn docker(addr: &str, control_socket: &Path) -> Engine {
        if addr.starts_with("tcp://") || addr.starts_with("http://") || addr.starts_with("https://") {
            return Engine::absent(format!(
                "the Docker Engine address {addr} is not a unix socket: the control socket relays to a local engine's \
                 unix socket only"
            ));
        }
        let socket = PathBuf::from(addr.strip_prefix("unix://").unwrap_or(addr));
        if same_file(&socket, control_socket) {
            return Engine::absent(format!(
                "the Docker Engine address {addr} is Shoal's own control socket: start the daemon with --engine-addr \
                 naming the Docker Engine's socket"
            ));
        }
        let path = socket.clone();
        let connector = UnixConnector(Arc::new(path));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(16)
            .build(connector);
        Engine(
            EngineKind::Docker(Arc::new(DockerEngine {
                socket,
                client,
                version: Mutex::new(None),
                relays: Arc::new(Semaphore::new(MAX_RELAYS)),
            })),
            Err(NO_ATTACH.into()),
        )
    }

    /// No engine on this node, because `why` (e.g. `PROCESS_EXECUTOR`).
    pub fn absent(why: impl Into<String>) -> Engine {
        Engine(EngineKind::Absent(why.into().into()), Err(NO_ATTACH.into()))
    }

    /// Containers created on attachable swarm networks are put there by `attach` (`Err`: why this node
    /// cannot, said to whoever asks).
    pub fn with_attach(mut self, attach: Result<Arc<dyn SwarmAttach>, String>) -> Engine {
        self.1 = attach.map_err(Into::into);
        self
    }

    /// `shoal` (one of this crate's routers) with the engine's paths relayed and the shared ones merged.
    pub fn wrap(self, shoal: Router) -> Router {
        Router::new().fallback(dispatch).with_state(Arc::new(Relay { shoal, engine: self.0, attach: self.1 }))
    }
}

fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => a == b,
    }
}

/// Connects to the engine's unix socket, within `CONNECT_TIMEOUT`.
#[derive(Clone)]
struct UnixConnector(Arc<PathBuf>);

impl tower::Service<Uri> for UnixConnector {
    type Response = TokioIo<tokio::net::UnixStream>;
    type Error = std::io::Error;
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let path = self.0.clone();
        Box::pin(async move {
            match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::UnixStream::connect(&*path)).await {
                Ok(Ok(s)) => Ok(TokioIo::new(s)),
                Ok(Err(e)) => Err(e),
                Err(_) => Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no connection within {} s", CONNECT_TIMEOUT.as_secs()),
                )),
            }
        })
    }
}

struct Relay {
    shoal: Router,
    engine: EngineKind,
    attach: Attacher,
}

/// Where a request goes.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Shoal,
    Engine,
    /// Unknown to both (a node without an engine answers 404 itself).
    Unknown,
    Info,
    Version,
    Networks,
    Events,
    NetworkCreate,
    /// `/networks/{id}`: Shoal's when it has that network.
    NetworkById,
    /// `POST /containers/create` and `POST /networks/{id}/connect`: a swarm network named is the node's
    /// to plumb (`attach`).
    ContainerNetworks,
    /// `POST /networks/{id}/disconnect`: the node's for a swarm network.
    NetworkDisconnect,
    /// `POST /containers/{id}/start` and `/restart`: a container on a swarm network is plumbed first.
    ContainerStart,
    /// `GET /volumes`: the engine's local volumes and the swarm's cluster volumes.
    Volumes,
    /// `POST /volumes/create`: Shoal's for a cluster volume.
    VolumeCreate,
    /// `/volumes/{name}`: Shoal's when it has a cluster volume of that name or ID.
    VolumeByName,
}

fn route(method: &Method, path: &str) -> Route {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let first = segments.first().copied().unwrap_or("");
    let get = method == Method::GET || method == Method::HEAD;
    match (first, &segments[1..]) {
        ("info", []) if get => Route::Info,
        ("version", []) if get => Route::Version,
        ("events", []) if get => Route::Events,
        ("networks", []) if get => Route::Networks,
        ("networks", []) => Route::Shoal,
        ("networks", ["create"]) => Route::NetworkCreate,
        ("networks", ["prune"]) => Route::Engine,
        ("networks", [_, "connect"]) if method == Method::POST => Route::ContainerNetworks,
        ("networks", [_, "disconnect"]) if method == Method::POST => Route::NetworkDisconnect,
        ("containers", ["create"]) if method == Method::POST => Route::ContainerNetworks,
        ("containers", [_, "start" | "restart"]) if method == Method::POST => Route::ContainerStart,
        ("networks", [_]) => Route::NetworkById,
        ("volumes", []) if get => Route::Volumes,
        ("volumes", ["create"]) if method == Method::POST => Route::VolumeCreate,
        ("volumes", ["prune"]) => Route::Engine,
        ("volumes", [_]) => Route::VolumeByName,
        ("info" | "version" | "events" | "", _) => Route::Shoal,
        (s, _) if SHOAL_SEGMENTS.contains(&s) => Route::Shoal,
        (s, _) if ENGINE_SEGMENTS.contains(&s) => Route::Engine,
        _ => Route::Unknown,
    }
}

fn error(status: StatusCode, message: String) -> Response {
    let mut r = (status, axum::Json(ErrorResponse { message })).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r.headers_mut().insert("API-Version", HeaderValue::from_static(crate::API_VERSION));
    r.headers_mut().insert("Server", HeaderValue::from_static(concat!("Shoal/", env!("CARGO_PKG_VERSION"))));
    r
}

/// What a node without an engine answers for a path of the engine's. A lookup of one object (`docker inspect`
/// tries a container, an image, a volume, ... in turn, moving on at a 404) gets the engine's 404 for a missing
/// object, since the node has none; everything else gets the 501 that says why.
fn no_engine(why: &str, method: &Method, path: &str) -> Response {
    if method == Method::GET {
        if let Some(what) = missing_object(path) {
            return error(StatusCode::NOT_FOUND, format!("{what} ({why})"));
        }
    }
    no_engine_501(why, method, path)
}

/// The engine's not-found message for a GET of one object at `path` (without its version), if it is one.
fn missing_object(path: &str) -> Option<String> {
    let rest = path.strip_prefix('/')?;
    let (kind, name) = rest.split_once('/')?;
    let inspect = |n: &str| n.strip_suffix("/json").filter(|n| !n.is_empty() && !n.contains('/')).map(str::to_string);
    match kind {
        "containers" => inspect(name).map(|n| format!("No such container: {n}")),
        "images" => name.strip_suffix("/json").filter(|n| !n.is_empty()).map(|n| format!("No such image: {n}")),
        "plugins" => inspect(name).map(|n| format!("plugin {n} not found")),
        "volumes" if !name.is_empty() && !name.contains('/') => Some(format!("get {name}: no such volume")),
        _ => None,
    }
}

fn no_engine_501(why: &str, method: &Method, path: &str) -> Response {
    error(
        StatusCode::NOT_IMPLEMENTED,
        format!(
            "{why}: {method} {path} needs a container engine. Swarm commands (docker service, node, secret, config, \
             network with overlay networks) work on this socket; for containers, images and volumes, use a node \
             started with --executor docker, or point DOCKER_HOST at a Docker Engine's own socket"
        ),
    )
}

async fn dispatch(State(relay): State<Arc<Relay>>, req: Request) -> Response {
    let full = req.uri().path().to_string();
    let bare = crate::request::split_version(&full).map_or(full.as_str(), |(_, p)| p).to_string();
    let route = route(req.method(), &bare);
    let engine = match &relay.engine {
        EngineKind::Docker(d) => d.clone(),
        EngineKind::Absent(why) => {
            return match route {
                Route::Engine | Route::ContainerStart | Route::ContainerNetworks | Route::NetworkDisconnect => {
                    no_engine(why, req.method(), &bare)
                }
                Route::Unknown => error(
                    StatusCode::NOT_FOUND,
                    format!("page not found: {bare} is not an endpoint of the Docker Engine API"),
                ),
                Route::VolumeCreate => volume_create(&relay, None, req, why).await,
                Route::VolumeByName => volume_by_name(&relay, None, req, &full, why).await,
                _ => shoal(&relay, req).await,
            };
        }
    };
    match route {
        Route::Shoal => shoal(&relay, req).await,
        Route::Engine | Route::Unknown => engine.relay(req).await,
        Route::Info => merge_info(&relay, &engine, req).await,
        Route::Version => merge_version(&relay, &engine, req).await,
        Route::Networks => merge_networks(&relay, &engine, req).await,
        Route::Events => merge_events(&relay, &engine, req).await,
        Route::NetworkCreate => network_create(&relay, &engine, req).await,
        Route::NetworkById => network_by_id(&relay, &engine, req, &full).await,
        Route::ContainerNetworks => container_networks(&relay, &engine, req, &full).await,
        Route::NetworkDisconnect => network_disconnect(&relay, &engine, req, &full).await,
        Route::ContainerStart => container_start(&relay, &engine, req, &bare).await,
        Route::Volumes => merge_volumes(&relay, &engine, req).await,
        Route::VolumeCreate => volume_create(&relay, Some(&engine), req, "").await,
        Route::VolumeByName => volume_by_name(&relay, Some(&engine), req, &full, "").await,
    }
}

async fn shoal(relay: &Relay, req: Request) -> Response {
    match relay.shoal.clone().oneshot(req).await {
        Ok(r) => r,
        Err(never) => match never {},
    }
}

/// A copy of `req`'s head with an empty body (for asking both sides).
fn copy_head(req: &Request) -> Request {
    let mut r = Request::new(Body::empty());
    *r.method_mut() = req.method().clone();
    *r.uri_mut() = req.uri().clone();
    *r.headers_mut() = req.headers().clone();
    r.headers_mut().remove(header::CONTENT_LENGTH);
    r.headers_mut().remove(header::TRANSFER_ENCODING);
    r
}

/// Headers that describe one hop of a connection, not the message (RFC 9110 7.6.1).
const HOP_BY_HOP: &[&str] = &["connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade"];

fn wants_upgrade(h: &HeaderMap) -> bool {
    h.get(header::UPGRADE).is_some()
        && h.get_all(header::CONNECTION)
            .iter()
            .any(|v| v.to_str().is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("upgrade"))))
}

impl DockerEngine {
    fn unreachable(&self, e: impl std::fmt::Display) -> Response {
        error(
            StatusCode::BAD_GATEWAY,
            format!("the Docker Engine at unix://{} did not answer: {e}", self.socket.display()),
        )
    }

    /// The engine's newest API version (cached for `VERSION_TTL`; None when it does not say).
    async fn max_version(&self) -> Option<(u32, u32)> {
        if let Some((at, v)) = *self.version.lock().unwrap_or_else(|p| p.into_inner()) {
            if at.elapsed() < VERSION_TTL {
                return Some(v);
            }
        }
        let req = Request::get("http://docker/version").body(Body::empty()).ok()?;
        let (status, body) = self.fetch(req).await.ok()?;
        if !status.is_success() {
            return None;
        }
        let doc: serde_json::Value = serde_json::from_slice(&body).ok()?;
        let (major, minor) = doc.get("ApiVersion")?.as_str()?.split_once('.')?;
        let v = (major.parse().ok()?, minor.parse().ok()?);
        *self.version.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), v));
        Some(v)
    }

    /// The engine's URI for `uri`: the path and query kept, a `/v1.NN` above the engine's newest lowered to it.
    async fn engine_uri(&self, uri: &Uri) -> Result<Uri, Response> {
        let path = uri.path();
        let mut pq = match uri.query() {
            Some(q) => format!("{path}?{q}"),
            None => path.to_string(),
        };
        if let Some((asked, rest)) = crate::request::split_version(path) {
            if let Some(max) = self.max_version().await {
                if asked > max {
                    pq = match uri.query() {
                        Some(q) => format!("/v{}.{}{rest}?{q}", max.0, max.1),
                        None => format!("/v{}.{}{rest}", max.0, max.1),
                    };
                }
            }
        }
        format!("http://docker{pq}")
            .parse()
            .map_err(|e| error(StatusCode::BAD_REQUEST, format!("the request's path cannot be relayed: {e}")))
    }

    /// Sends `req` (its URI already the engine's) within `MERGE_TIMEOUT`, reading the whole answer.
    async fn fetch(&self, req: Request) -> Result<(StatusCode, Bytes), String> {
        let call = async {
            let resp = self.client.request(req).await.map_err(|e| e.to_string())?;
            let status = resp.status();
            let body = http_body_util::Limited::new(resp.into_body(), MERGE_BODY_LIMIT_BYTES)
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(MERGE_TIMEOUT, call)
            .await
            .map_err(|_| format!("no answer within {} s", MERGE_TIMEOUT.as_secs()))?
    }

    /// `GET` of the head of `req` from the engine, read whole (for a merge).
    async fn fetch_like(&self, mut r: Request) -> Result<(StatusCode, Bytes), String> {
        let uri = r.uri().clone();
        *r.uri_mut() = self.engine_uri(&uri).await.map_err(|_| "the path cannot be relayed".to_string())?;
        strip_hop_by_hop(r.headers_mut());
        self.fetch(r).await
    }

    /// Relays `req` to the engine and its answer back; an upgrade becomes a raw stream both ways.
    async fn relay(self: &Arc<Self>, mut req: Request) -> Response {
        let Ok(permit) = self.relays.clone().try_acquire_owned() else {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "too many requests relayed to the Docker Engine at once (the limit is {MAX_RELAYS}): retry shortly"
                ),
            );
        };
        let uri = match self.engine_uri(req.uri()).await {
            Ok(u) => u,
            Err(r) => return r,
        };
        *req.uri_mut() = uri;
        let upgrade = wants_upgrade(req.headers());
        let held = req.extensions_mut().remove::<HeldConnection>();
        let client_side = upgrade.then(|| hyper::upgrade::on(&mut req));
        if !upgrade {
            strip_hop_by_hop(req.headers_mut());
        }
        // Only what the engine needs travels on: the body, the head (no extensions of this server's).
        let (parts, body) = req.into_parts();
        let mut out = Request::from_parts(parts, body);
        *out.extensions_mut() = Default::default();
        let mut resp = match self.client.request(out).await {
            Ok(r) => r,
            Err(e) => return self.unreachable(std::error::Error::source(&e).map_or(e.to_string(), |s| s.to_string())),
        };
        if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
            if let Some(client_side) = client_side {
                let engine_side = hyper::upgrade::on(&mut resp);
                tokio::spawn(splice(client_side, engine_side, held, permit));
                let (parts, _) = resp.into_parts();
                return Response::from_parts(parts, Body::empty());
            }
        }
        let (mut parts, body) = resp.into_parts();
        if parts.status != StatusCode::SWITCHING_PROTOCOLS {
            strip_hop_by_hop(&mut parts.headers);
        }
        // The permit goes with the body: a followed log or event stream counts until it ends.
        let body = body.map_err(move |e| {
            let _held = &permit;
            axum::Error::new(e)
        });
        Response::from_parts(parts, Body::new(body))
    }
}

fn strip_hop_by_hop(h: &mut HeaderMap) {
    for name in HOP_BY_HOP {
        h.remove(*name);
    }
}

/// Copies bytes both ways between the client's upgraded connection and the engine's until both ends are
/// done, or the client's connection must close.
async fn splice(
    client: hyper::upgrade::OnUpgrade,
    engine: hyper::upgrade::OnUpgrade,
    held: Option<HeldConnection>,
    permit: OwnedSemaphorePermit,
) {
    let _permit = permit;
    let (client, engine) = match tokio::try_join!(client, engine) {
        Ok(both) => both,
        Err(e) => {
            tracing::debug!(error = %e, "a relayed upgrade did not complete");
            return;
        }
    };
    let mut client = TokioIo::new(client);
    let mut engine = TokioIo::new(engine);
    let closed = async {
        match held.clone() {
            Some(h) => h.closed().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        r = tokio::io::copy_bidirectional(&mut client, &mut engine) => {
            if let Err(e) = r {
                tracing::debug!(error = %e, "a relayed stream ended");
            }
        }
        _ = closed => {}
    }
    drop(held);
}

/// Shoal's answer to `req`, read whole when it is a success (None: it is not, with the answer).
async fn shoal_json(relay: &Relay, req: Request) -> Result<(axum::http::response::Parts, serde_json::Value), Response> {
    let resp = shoal(relay, req).await;
    if !resp.status().is_success() {
        return Err(resp);
    }
    let (parts, body) = resp.into_parts();
    let bytes = axum::body::to_bytes(body, MERGE_BODY_LIMIT_BYTES).await.unwrap_or_default();
    match serde_json::from_slice(&bytes) {
        Ok(v) => Ok((parts, v)),
        Err(_) => Err(Response::from_parts(parts, Body::from(bytes))),
    }
}

async fn engine_json(engine: &DockerEngine, req: Request) -> Result<serde_json::Value, String> {
    // One bound for the whole of it (learning the engine's version included).
    let (status, body) = tokio::time::timeout(MERGE_TIMEOUT, engine.fetch_like(req))
        .await
        .map_err(|_| format!("no answer within {} s", MERGE_TIMEOUT.as_secs()))??;
    if !status.is_success() {
        let msg =
            serde_json::from_slice::<ErrorResponse>(&body).map(|e| e.message).unwrap_or_else(|_| status.to_string());
        return Err(format!("{status}: {msg}"));
    }
    serde_json::from_slice(&body).map_err(|e| format!("its answer is not JSON: {e}"))
}

fn json_response(mut parts: axum::http::response::Parts, v: &serde_json::Value) -> Response {
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let mut body = serde_json::to_vec(v).unwrap_or_default();
    body.push(b'\n');
    Response::from_parts(parts, Body::from(body))
}

/// Asks Shoal and the engine the same question at once.
async fn both(
    relay: &Relay,
    engine: &DockerEngine,
    req: Request,
) -> (Result<(axum::http::response::Parts, serde_json::Value), Response>, Result<serde_json::Value, String>) {
    let engine_req = copy_head(&req);
    tokio::join!(shoal_json(relay, req), engine_json(engine, engine_req))
}

/// The `/info` keys that stay Shoal's (the rest, the engine's containers, images and host, are the engine's).
const SHOAL_INFO_KEYS: &[&str] = &["ID", "Name", "Labels", "ServerVersion", "Swarm", "Warnings"];

async fn merge_info(relay: &Relay, engine: &DockerEngine, req: Request) -> Response {
    let (shoal, engine_answer) = both(relay, engine, req).await;
    let (parts, mut info) = match shoal {
        Ok(ok) => ok,
        Err(resp) => return resp,
    };
    merge::info(
        &mut info,
        engine_answer.map_err(|e| format!("the Docker Engine at unix://{}: {e}", engine.socket.display())),
    );
    json_response(parts, &info)
}

async fn merge_version(relay: &Relay, engine: &DockerEngine, req: Request) -> Response {
    let (shoal, engine_answer) = both(relay, engine, req).await;
    let (parts, mut version) = match shoal {
        Ok(ok) => ok,
        Err(resp) => return resp,
    };
    if let Ok(e) = engine_answer {
        merge::version(&mut version, &e);
    }
    json_response(parts, &version)
}

async fn merge_networks(relay: &Relay, engine: &DockerEngine, req: Request) -> Response {
    let (shoal, engine_answer) = both(relay, engine, req).await;
    match (shoal, engine_answer) {
        (Ok((parts, swarm)), Ok(local)) => json_response(parts, &merge::networks(local, swarm)),
        (Ok((parts, swarm)), Err(e)) => {
            tracing::debug!(error = %e, "GET /networks: the engine's networks left out");
            json_response(parts, &swarm)
        }
        // A node in no swarm, or a worker: the engine's networks alone, as dockerd there lists them.
        (Err(resp), Ok(local)) if resp.status().is_server_error() => {
            json_response(Response::new(Body::empty()).into_parts().0, &local)
        }
        (Err(resp), _) => resp,
    }
}

/// A request's head, its body (at most `MERGE_BODY_LIMIT_BYTES`, kept to pass on) and the body's JSON
/// (null when it is none); a body that cannot be read is a 400.
async fn read_json_body(req: Request) -> Result<(axum::http::request::Parts, Bytes, serde_json::Value), Response> {
    let (parts, body) = req.into_parts();
    let bytes = match http_body_util::Limited::new(body, MERGE_BODY_LIMIT_BYTES).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => return Err(error(StatusCode::BAD_REQUEST, format!("the request body could not be read: {e}"))),
    };
    let doc = serde_json::from_slice(&bytes).unwrap_or_default();
    Ok((parts, bytes, doc))
}

async fn network_create(relay: &Relay, engine: &Arc<DockerEngine>, req: Request) -> Response {
    let (parts, bytes, doc) = match read_json_body(req).await {
        Ok(read) => read,
        Err(resp) => return resp,
    };
    let field = |k: &str| {
        doc.as_object()
            .and_then(|o| o.iter().find(|(name, _)| name.eq_ignore_ascii_case(k)))
            .and_then(|(_, v)| v.as_str())
            .unwrap_or("")
            .to_string()
    };
    let req = Request::from_parts(parts, Body::from(bytes));
    if field("Driver") == "overlay" || field("Scope") == "swarm" {
        shoal(relay, req).await
    } else {
        engine.relay(req).await
    }
}

/// The networks a container create (`HostConfig.NetworkMode`, `NetworkingConfig.EndpointsConfig`) or a
/// network connect (the path's network) names, but the engine's own (`bridge`, `host`, `none`, `default`,
/// `container:...`).
fn named_networks(path: &str, body: &serde_json::Value) -> Vec<String> {
    let field = |v: &serde_json::Value, k: &str| -> Option<serde_json::Value> {
        v.as_object()?.iter().find(|(name, _)| name.eq_ignore_ascii_case(k)).map(|(_, v)| v.clone())
    };
    let mut names = Vec::new();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    if let ["networks", id, "connect" | "disconnect"] = segments.as_slice() {
        names.push(id.to_string());
    } else {
        let host = field(body, "HostConfig").unwrap_or_default();
        if let Some(serde_json::Value::String(mode)) = field(&host, "NetworkMode") {
            names.push(mode);
        }
        let net = field(body, "NetworkingConfig").unwrap_or_default();
        if let Some(serde_json::Value::Object(eps)) = field(&net, "EndpointsConfig") {
            names.extend(eps.keys().cloned());
        }
    }
    names
        .retain(|n| !matches!(n.as_str(), "" | "bridge" | "host" | "none" | "default") && !n.starts_with("container:"));
    names.sort();
    names.dedup();
    names
}

/// Where a network a container names lives.
enum Found {
    /// The engine's own (or unknown to both: the engine answers).
    Local,
    /// The swarm's, as Shoal's `GET /networks/{id}` shows it (a manager).
    Swarm(serde_json::Value),
    /// Not the engine's, and this node cannot look up the swarm's (a worker): the manager decides at attach.
    Unsure,
}

/// Looks network `name` up in Shoal (a manager answers), then in the engine.
async fn find_network(relay: &Relay, engine: &DockerEngine, prefix: &str, name: &str) -> Found {
    let mut probe = Request::new(Body::empty());
    *probe.uri_mut() = format!("{prefix}/networks/{name}").parse().unwrap_or_default();
    let resp = shoal(relay, probe).await;
    let status = resp.status();
    if status.is_success() {
        let bytes = axum::body::to_bytes(resp.into_body(), MERGE_BODY_LIMIT_BYTES).await.unwrap_or_default();
        return Found::Swarm(serde_json::from_slice(&bytes).unwrap_or_default());
    }
    if !status.is_server_error() {
        return Found::Local;
    }
    let mut ask = Request::new(Body::empty());
    *ask.uri_mut() = format!("http://docker/networks/{name}").parse().unwrap_or_default();
    match engine.fetch(ask).await {
        Ok((s, _)) if s == StatusCode::NOT_FOUND => Found::Unsure,
        _ => Found::Local,
    }
}

fn refused(r: crate::attach::AttachRefusal) -> Response {
    error(StatusCode::from_u16(r.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), r.message)
}

/// A container create on an attachable swarm network is made in a holder's namespace that the node plumbs
/// (`attach`), a network connect naming one connects the running container through the node
/// (`network_connect`); a non-attachable one is refused, as dockerd refuses it. Anything else goes to the
/// engine.
async fn container_networks(relay: &Relay, engine: &Arc<DockerEngine>, req: Request, full: &str) -> Response {
    let (parts, bytes, doc) = match read_json_body(req).await {
        Ok(read) => read,
        Err(resp) => return resp,
    };
    let bare = crate::request::split_version(full).map_or(full, |(_, p)| p);
    let prefix = &full[..full.len() - bare.len()];
    let connect = bare.starts_with("/networks/");
    let mut swarm: Vec<(String, Option<serde_json::Value>)> = Vec::new();
    let mut local = Vec::new();
    for name in named_networks(bare, &doc) {
        match find_network(relay, engine, prefix, &name).await {
            Found::Local => local.push(name),
            Found::Swarm(n) => swarm.push((name, Some(n))),
            Found::Unsure => swarm.push((name, None)),
        }
    }
    let Some((network, found)) = swarm.first().cloned() else {
        return engine.relay(Request::from_parts(parts, Body::from(bytes))).await;
    };
    if let Some(n) = &found {
        if !n.get("Attachable").and_then(|a| a.as_bool()).unwrap_or(false) {
            return error(
                StatusCode::FORBIDDEN,
                format!(
                    "Could not attach to network {network}: network {network} is not manually attachable: create it \
                     with --attachable (docker network create -d overlay --attachable {network}) to run containers on \
                     it with docker run or docker network connect, or run this one as a service (docker service create \
                     --network {network} ...)"
                ),
            );
        }
    }
    if connect {
        return network_connect(relay, &doc, &network, found.as_ref()).await;
    }
    let others: Vec<String> = swarm.iter().skip(1).map(|(n, _)| n.clone()).chain(local).collect();
    if let Some(why) = crate::attach::refusal(&doc, &network, &others) {
        return error(StatusCode::BAD_REQUEST, why);
    }
    let attach = match &relay.attach {
        Ok(a) => a.clone(),
        Err(why) => {
            return error(StatusCode::NOT_IMPLEMENTED, format!("network {network} is a swarm network and {why}"));
        }
    };
    let aliases = crate::attach::aliases(&doc, &network);
    let prepared = match attach.prepare(&network, &aliases, crate::attach::holder_facts(&doc)).await {
        Ok(p) => p,
        Err(r) => return refused(r),
    };
    let body = crate::attach::rewrite_create(doc, &prepared);
    let mut create = Request::from_parts(parts, Body::from(serde_json::to_vec(&body).unwrap_or_default()));
    create.headers_mut().remove(header::CONTENT_LENGTH);
    create.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let uri = create.uri().clone();
    *create.uri_mut() = match engine.engine_uri(&uri).await {
        Ok(u) => u,
        Err(r) => {
            attach.abandon(&prepared.holder).await;
            return r;
        }
    };
    strip_hop_by_hop(create.headers_mut());
    *create.extensions_mut() = Default::default();
    let (status, answer) = match engine.fetch(create).await {
        Ok(a) => a,
        Err(e) => {
            attach.abandon(&prepared.holder).await;
            return engine.unreachable(e);
        }
    };
    let created = serde_json::from_slice::<serde_json::Value>(&answer)
        .ok()
        .and_then(|v| v.get("Id").and_then(|i| i.as_str()).map(str::to_string));
    let Some(id) = created.filter(|_| status == StatusCode::CREATED) else {
        attach.abandon(&prepared.holder).await;
        let mut r = Response::new(Body::from(answer));
        *r.status_mut() = status;
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        return r;
    };
    if let Err(r) = attach.attach(&id).await {
        let mut rm = Request::new(Body::empty());
        *rm.method_mut() = Method::DELETE;
        *rm.uri_mut() = format!("http://docker/containers/{id}?force=1&v=1").parse().unwrap_or_default();
        if let Err(e) = engine.fetch(rm).await {
            tracing::warn!(container = %id, "cannot remove a container whose attach failed: {e}");
        }
        attach.abandon(&prepared.holder).await;
        return refused(r);
    }
    let mut r = Response::new(Body::from(answer));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// The name of a swarm network as Shoal's lookup shows it, else as the user typed it.
fn canonical_name(typed: &str, found: Option<&serde_json::Value>) -> String {
    found.and_then(|n| n.get("Name")?.as_str().map(str::to_string)).unwrap_or_else(|| typed.to_string())
}

/// `docker network connect <swarm network> <container>`: the node connects the running container through the
/// swarm's attachment path (its own namespace, plumbed). 200 with no body, as dockerd answers.
async fn network_connect(
    relay: &Relay,
    doc: &serde_json::Value,
    network: &str,
    found: Option<&serde_json::Value>,
) -> Response {
    let field = crate::attach::field;
    let Some(container) = field(doc, "Container").and_then(|c| c.as_str()).filter(|c| !c.is_empty()) else {
        return error(StatusCode::BAD_REQUEST, "Container: name the container to connect".into());
    };
    let ep = field(doc, "EndpointConfig").cloned().unwrap_or_default();
    if let Some(why) = crate::attach::endpoint_refusal(&ep, network, "EndpointConfig") {
        return error(StatusCode::BAD_REQUEST, why);
    }
    let attach = match &relay.attach {
        Ok(a) => a.clone(),
        Err(why) => {
            return error(StatusCode::NOT_IMPLEMENTED, format!("network {network} is a swarm network and {why}"));
        }
    };
    let aliases: Vec<String> = field(&ep, "Aliases")
        .and_then(|a| a.as_array())
        .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    match attach.connect(container, &canonical_name(network, found), &aliases).await {
        Ok(()) => ok_empty(),
        Err(r) => refused(r),
    }
}

fn ok_empty() -> Response {
    let mut r = Response::new(Body::empty());
    r.headers_mut().insert("API-Version", HeaderValue::from_static(crate::API_VERSION));
    r
}

/// `docker network disconnect <network> <container>`: the node's for a swarm network (a worker, which cannot
/// look the swarm's up, asks the node for any network the engine does not have), the engine's otherwise.
async fn network_disconnect(relay: &Relay, engine: &Arc<DockerEngine>, req: Request, full: &str) -> Response {
    let (parts, bytes, doc) = match read_json_body(req).await {
        Ok(read) => read,
        Err(resp) => return resp,
    };
    let bare = crate::request::split_version(full).map_or(full, |(_, p)| p);
    let prefix = &full[..full.len() - bare.len()];
    let Some(name) = named_networks(bare, &doc).into_iter().next() else {
        return engine.relay(Request::from_parts(parts, Body::from(bytes))).await;
    };
    let found = match find_network(relay, engine, prefix, &name).await {
        Found::Local => return engine.relay(Request::from_parts(parts, Body::from(bytes))).await,
        Found::Swarm(n) => Some(n),
        Found::Unsure => None,
    };
    let attach = match &relay.attach {
        Ok(a) => a.clone(),
        Err(why) => return error(StatusCode::NOT_IMPLEMENTED, format!("network {name} is a swarm network and {why}")),
    };
    let field = crate::attach::field;
    let Some(container) = field(&doc, "Container").and_then(|c| c.as_str()).filter(|c| !c.is_empty()) else {
        return error(StatusCode::BAD_REQUEST, "Container: name the container to disconnect".into());
    };
    let force = field(&doc, "Force").and_then(|f| f.as_bool()).unwrap_or(false);
    match attach.disconnect(container, &canonical_name(&name, found.as_ref()), force).await {
        Ok(()) => ok_empty(),
        Err(r) => refused(r),
    }
}

/// A container's start: one on a swarm network is attached and plumbed first (nothing for the others). A
/// restart of a running one keeps its attachment through the restart's stop.
async fn container_start(relay: &Relay, engine: &Arc<DockerEngine>, req: Request, bare: &str) -> Response {
    let Ok(attach) = &relay.attach else { return engine.relay(req).await };
    let mut segments = bare.trim_start_matches('/').split('/').skip(1);
    let (id, action) = (segments.next().unwrap_or_default(), segments.next().unwrap_or_default());
    if action != "restart" {
        if let Err(r) = attach.before_start(id).await {
            return refused(r);
        }
        return engine.relay(req).await;
    }
    let marked = match attach.restart_begins(id).await {
        Ok(m) => m,
        Err(r) => return refused(r),
    };
    // Ended however the relay ends: a client gone mid-restart must not leave the container marked, or its
    // next real stop would keep the attachment.
    let _mark = RestartMark(attach, marked);
    engine.relay(req).await
}

/// A restart `SwarmAttach::restart_begins` marked, ended (`restart_ended`) when dropped.
struct RestartMark<'a>(&'a Arc<dyn SwarmAttach>, Option<String>);

impl Drop for RestartMark<'_> {
    fn drop(&mut self) {
        if let Some(m) = self.1.take() {
            self.0.restart_ended(&m);
        }
    }
}

async fn network_by_id(relay: &Relay, engine: &Arc<DockerEngine>, req: Request, full: &str) -> Response {
    // The query goes with the probe: Shoal answers for a predefined network (`host`, `bridge`) only to a
    // swarm-scope lookup (`?scope=swarm`, as the docker CLI checks `service create --network host`).
    let mut probe = Request::new(Body::empty());
    let target = match req.uri().query() {
        Some(q) => format!("{full}?{q}"),
        None => full.to_string(),
    };
    *probe.uri_mut() = target.parse().unwrap_or_default();
    if shoal(relay, probe).await.status().is_success() {
        shoal(relay, req).await
    } else {
        engine.relay(req).await
    }
}

async fn merge_volumes(relay: &Relay, engine: &DockerEngine, req: Request) -> Response {
    let (shoal, engine_answer) = both(relay, engine, req).await;
    match (shoal, engine_answer) {
        (Ok((parts, swarm)), Ok(local)) => json_response(parts, &merge::volumes(local, swarm)),
        (Ok((parts, swarm)), Err(e)) => {
            tracing::debug!(error = %e, "GET /volumes: the engine's volumes left out");
            json_response(parts, &swarm)
        }
        // A node whose Shoal answers no volumes (a worker, a node in no swarm): the engine's alone.
        (Err(_), Ok(local)) => json_response(Response::new(Body::empty()).into_parts().0, &local),
        (Err(resp), Err(_)) => resp,
    }
}

/// `POST /volumes/create`: Shoal's when the body carries a `ClusterVolumeSpec`, else the engine's (or, on a
/// node without one, the answer saying `why`).
async fn volume_create(relay: &Relay, engine: Option<&Arc<DockerEngine>>, req: Request, why: &str) -> Response {
    let (parts, bytes, doc) = match read_json_body(req).await {
        Ok(read) => read,
        Err(resp) => return resp,
    };
    let cluster = doc
        .as_object()
        .and_then(|o| o.iter().find(|(k, _)| k.eq_ignore_ascii_case("ClusterVolumeSpec")))
        .is_some_and(|(_, v)| !v.is_null());
    let req = Request::from_parts(parts, Body::from(bytes));
    match engine {
        _ if cluster => shoal(relay, req).await,
        Some(engine) => engine.relay(req).await,
        // A body that is no JSON object is Shoal's 400 (the engine would say the same) on a node without one.
        None if !doc.is_object() => shoal(relay, req).await,
        None => no_engine(why, req.method(), req.uri().path()),
    }
}

/// `/volumes/{name}`: Shoal's when the swarm has a cluster volume of that exact name or ID, else the engine's
/// (or, on a node without one, the answer saying `why`).
async fn volume_by_name(
    relay: &Relay,
    engine: Option<&Arc<DockerEngine>>,
    req: Request,
    full: &str,
    why: &str,
) -> Response {
    let mut probe = Request::new(Body::empty());
    *probe.uri_mut() = full.parse().unwrap_or_default();
    if shoal(relay, probe).await.status().is_success() {
        return shoal(relay, req).await;
    }
    match engine {
        Some(engine) => engine.relay(req).await,
        None => {
            let bare = crate::request::split_version(full).map_or(full, |(_, p)| p);
            no_engine(why, req.method(), bare)
        }
    }
}

async fn merge_events(relay: &Relay, engine: &DockerEngine, req: Request) -> Response {
    let mut engine_req = copy_head(&req);
    let shoal_resp = shoal(relay, req).await;
    if shoal_resp.status().is_client_error() {
        // A bad filter or time: the same answer the engine would give.
        return shoal_resp;
    }
    let engine_resp = async {
        let uri = engine_req.uri().clone();
        *engine_req.uri_mut() = engine.engine_uri(&uri).await.map_err(|_| "the path cannot be relayed")?;
        strip_hop_by_hop(engine_req.headers_mut());
        match tokio::time::timeout(MERGE_TIMEOUT, engine.client.request(engine_req)).await {
            Ok(Ok(r)) if r.status().is_success() => Ok(r),
            Ok(Ok(r)) => Err(format!("it answered {}", r.status())),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {} s", MERGE_TIMEOUT.as_secs())),
        }
    }
    .await;
    let engine_resp = match engine_resp {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "GET /events: the Docker Engine's events left out");
            return shoal_resp;
        }
    };
    if !shoal_resp.status().is_success() {
        // A node in no swarm: the engine's events alone.
        let (mut parts, body) = engine_resp.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        return Response::from_parts(parts, Body::new(body.map_err(axum::Error::new)));
    }
    let (mut parts, shoal_body) = shoal_resp.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    let shoal_lines = merge::lines(shoal_body.into_data_stream().map(|r| r.map_err(std::io::Error::other)));
    let engine_lines =
        merge::lines(engine_resp.into_body().into_data_stream().map(|r| r.map_err(std::io::Error::other)));
    let merged = futures::stream::select(shoal_lines, engine_lines);
    Response::from_parts(parts, Body::from_stream(merged))
}

/// The merges themselves, pure over JSON documents and byte streams.
pub mod merge {
    use super::*;

    /// Shoal's `/info` with the engine's host, containers and images facts (everything but
    /// `SHOAL_INFO_KEYS`); labels and warnings from both; the engine's failure as a warning.
    pub fn info(shoal: &mut serde_json::Value, engine: Result<serde_json::Value, String>) {
        let Some(doc) = shoal.as_object_mut() else { return };
        match engine {
            Ok(serde_json::Value::Object(e)) => {
                for (k, v) in e {
                    match k.as_str() {
                        "Labels" | "Warnings" => {
                            if let (Some(mine), Some(theirs)) =
                                (doc.get_mut(&k).and_then(|l| l.as_array_mut()), v.as_array())
                            {
                                mine.extend(theirs.iter().cloned());
                            } else if !doc.get(&k).is_some_and(|x| x.is_array()) {
                                doc.insert(k, v);
                            }
                        }
                        k2 if SHOAL_INFO_KEYS.contains(&k2) => {}
                        _ => {
                            doc.insert(k, v);
                        }
                    }
                }
            }
            Ok(_) => {}
            Err(why) => {
                let warning = serde_json::Value::String(format!("WARNING: {why}: container and image counts left out"));
                match doc.get_mut("Warnings").and_then(|w| w.as_array_mut()) {
                    Some(w) => w.push(warning),
                    None => {
                        doc.insert("Warnings".into(), serde_json::Value::Array(vec![warning]));
                    }
                }
            }
        }
    }

    /// Shoal's `/version` with the engine's components after Shoal's.
    pub fn version(shoal: &mut serde_json::Value, engine: &serde_json::Value) {
        let Some(theirs) = engine.get("Components").and_then(|c| c.as_array()) else { return };
        if let Some(mine) = shoal.get_mut("Components").and_then(|c| c.as_array_mut()) {
            mine.extend(theirs.iter().cloned());
        }
    }

    /// The engine's local networks, then the swarm's (a swarm network the engine also lists, by ID, once).
    pub fn networks(local: serde_json::Value, swarm: serde_json::Value) -> serde_json::Value {
        let mut out: Vec<serde_json::Value> = match local {
            serde_json::Value::Array(a) => a,
            _ => Vec::new(),
        };
        let seen: std::collections::HashSet<String> =
            out.iter().filter_map(|n| n.get("Id").and_then(|i| i.as_str()).map(str::to_string)).collect();
        if let serde_json::Value::Array(a) = swarm {
            out.extend(
                a.into_iter().filter(|n| !n.get("Id").and_then(|i| i.as_str()).is_some_and(|i| seen.contains(i))),
            );
        }
        serde_json::Value::Array(out)
    }

    /// The engine's local volumes, then the swarm's cluster volumes (`{"Volumes": [...], "Warnings": [...]}`
    /// each; the engine's warnings kept).
    pub fn volumes(mut local: serde_json::Value, swarm: serde_json::Value) -> serde_json::Value {
        if !local.is_object() {
            local = serde_json::json!({});
        }
        let mine = match swarm.get("Volumes") {
            Some(serde_json::Value::Array(a)) => a.clone(),
            _ => Vec::new(),
        };
        let list = local.as_object_mut().map(|o| o.entry("Volumes").or_insert_with(|| serde_json::json!([])));
        match list {
            Some(serde_json::Value::Array(a)) => a.extend(mine),
            Some(other) => *other = serde_json::Value::Array(mine),
            None => {}
        }
        local
    }

    /// A byte stream cut into whole lines (each with its `\n`), so that two streams of JSON lines can be
    /// interleaved line by line; a line longer than `MAX_EVENT_LINE_BYTES` is dropped; the stream ends at the
    /// first error.
    pub fn lines<S>(input: S) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send
    where
        S: futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + Unpin + 'static,
    {
        futures::stream::unfold((input, Vec::<u8>::new(), false), |(mut input, mut buf, mut skipping)| async move {
            loop {
                if let Some(end) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=end).collect();
                    if std::mem::take(&mut skipping) {
                        continue;
                    }
                    return Some((Ok(Bytes::from(line)), (input, buf, skipping)));
                }
                if buf.len() > MAX_EVENT_LINE_BYTES {
                    buf.clear();
                    skipping = true;
                }
                match input.next().await {
                    Some(Ok(chunk)) => buf.extend_from_slice(&chunk),
                    Some(Err(_)) | None => return None,
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_path_goes_where_dockerd_would_answer_it() {
        let check = |m: Method, p: &str, want: Route| assert_eq!(route(&m, p), want, "{m} {p}");
        check(Method::GET, "/_ping", Route::Shoal);
        check(Method::HEAD, "/_ping", Route::Shoal);
        check(Method::GET, "/info", Route::Info);
        check(Method::GET, "/version", Route::Version);
        check(Method::GET, "/events", Route::Events);
        check(Method::GET, "/networks", Route::Networks);
        check(Method::POST, "/networks/create", Route::NetworkCreate);
        check(Method::GET, "/networks/abc", Route::NetworkById);
        check(Method::DELETE, "/networks/abc", Route::NetworkById);
        check(Method::POST, "/networks/abc/connect", Route::ContainerNetworks);
        check(Method::POST, "/networks/abc/disconnect", Route::NetworkDisconnect);
        check(Method::POST, "/containers/create", Route::ContainerNetworks);
        check(Method::POST, "/containers/abc/start", Route::ContainerStart);
        check(Method::POST, "/containers/abc/restart", Route::ContainerStart);
        check(Method::POST, "/containers/abc/stop", Route::Engine);
        check(Method::POST, "/networks/prune", Route::Engine);
        check(Method::GET, "/volumes", Route::Volumes);
        check(Method::POST, "/volumes/create", Route::VolumeCreate);
        check(Method::GET, "/volumes/data", Route::VolumeByName);
        check(Method::PUT, "/volumes/data", Route::VolumeByName);
        check(Method::DELETE, "/volumes/data", Route::VolumeByName);
        check(Method::POST, "/volumes/prune", Route::Engine);
        for p in [
            "/services",
            "/services/x/update",
            "/tasks/t",
            "/nodes",
            "/swarm/init",
            "/secrets/create",
            "/configs",
            "/distribution/busybox/json",
            "/shoal/v1/entry-points",
            "/swarm",
        ] {
            check(Method::GET, p, Route::Shoal);
        }
        for p in [
            "/containers/json",
            "/containers/x/attach",
            "/exec/x/start",
            "/images/json",
            "/build",
            "/system/df",
            "/plugins",
            "/session",
            "/auth",
            "/commit",
            "/images/create",
        ] {
            check(Method::GET, p, Route::Engine);
        }
        check(Method::GET, "/no/such", Route::Unknown);
        check(Method::POST, "/info", Route::Shoal);
    }

    #[test]
    fn the_networks_a_container_names_are_found_where_the_cli_puts_them() {
        let body = json!({"HostConfig": {"NetworkMode": "web"},
            "NetworkingConfig": {"EndpointsConfig": {"web": {}, "back": {}, "bridge": {}}}});
        assert_eq!(named_networks("/containers/create", &body), ["back", "web"]);
        let body = json!({"hostconfig": {"networkmode": "container:abc"}});
        assert!(named_networks("/containers/create", &body).is_empty());
        assert!(named_networks("/containers/create", &json!({"HostConfig": {"NetworkMode": "default"}})).is_empty());
        assert_eq!(named_networks("/networks/front/connect", &json!({"Container": "c"})), ["front"]);
        assert_eq!(named_networks("/networks/front/disconnect", &json!({"Container": "c"})), ["front"]);
    }

    #[test]
    fn info_takes_counts_from_the_engine_and_the_swarm_from_shoal() {
        let mut shoal = json!({"ID": "node1", "Name": "box", "Containers": 0, "Images": 0,
            "Labels": ["shoal.executor=docker"], "Swarm": {"NodeID": "node1"}, "ServerVersion": "0.1.0"});
        let engine = json!({"ID": "ENGINE", "Containers": 7, "ContainersRunning": 3, "Images": 12,
            "Driver": "overlay2", "Labels": ["zone=a"], "Swarm": {"LocalNodeState": "inactive"},
            "ServerVersion": "20.10", "Warnings": ["w"]});
        merge::info(&mut shoal, Ok(engine));
        assert_eq!(shoal["Containers"], 7);
        assert_eq!(shoal["ContainersRunning"], 3);
        assert_eq!(shoal["Images"], 12);
        assert_eq!(shoal["Driver"], "overlay2");
        assert_eq!(shoal["ID"], "node1");
        assert_eq!(shoal["Swarm"]["NodeID"], "node1");
        assert_eq!(shoal["ServerVersion"], "0.1.0");
        assert_eq!(shoal["Labels"], json!(["shoal.executor=docker", "zone=a"]));
        assert_eq!(shoal["Warnings"], json!(["w"]));

        let mut alone = json!({"Containers": 0, "Swarm": {}});
        merge::info(&mut alone, Err("the engine: no answer".into()));
        assert!(alone["Warnings"][0].as_str().unwrap().contains("no answer"), "{alone}");
        assert_eq!(alone["Containers"], 0);
    }

    #[test]
    fn volumes_list_local_then_the_swarm_s() {
        let local = serde_json::json!({"Volumes": [{"Name": "l"}], "Warnings": ["w"]});
        let swarm = serde_json::json!({"Volumes": [{"Name": "c", "Scope": "global"}], "Warnings": []});
        let merged = merge::volumes(local, swarm.clone());
        assert_eq!(
            merged,
            serde_json::json!({"Volumes": [{"Name": "l"}, {"Name": "c", "Scope": "global"}], "Warnings": ["w"]})
        );
        let merged = merge::volumes(serde_json::json!({"Volumes": null, "Warnings": null}), swarm);
        assert_eq!(merged["Volumes"][0]["Name"], "c");
    }

    #[test]
    fn networks_list_local_then_swarm_once_each() {
        let local = json!([{"Id": "b", "Name": "bridge"}, {"Id": "h", "Name": "host"}, {"Id": "o", "Name": "dup"}]);
        let swarm = json!([{"Id": "o", "Name": "dup"}, {"Id": "s", "Name": "web"}]);
        let got = merge::networks(local, swarm);
        let names: Vec<&str> = got.as_array().unwrap().iter().map(|n| n["Name"].as_str().unwrap()).collect();
        assert_eq!(names, ["bridge", "host", "dup", "web"]);
    }

    #[test]
    fn version_lists_both_components() {
        let mut shoal = json!({"Version": "0.1", "Components": [{"Name": "Shoal", "Version": "0.1"}]});
        merge::version(&mut shoal, &json!({"Components": [{"Name": "Engine", "Version": "20.10"}]}));
        assert_eq!(shoal["Components"][1]["Name"], "Engine");
        assert_eq!(shoal["Version"], "0.1");
    }

    #[tokio::test]
    async fn streams_are_cut_into_whole_lines() {
        let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
            Ok(Bytes::from_static(b"{\"a\":1}\n{\"b\"")),
            Ok(Bytes::from_static(b":2}\n")),
            Ok(Bytes::from(vec![b'x'; MAX_EVENT_LINE_BYTES + 10])),
            Ok(Bytes::from_static(b"x\n{\"c\":3}\n")),
        ];
        let got: Vec<Bytes> = merge::lines(futures::stream::iter(chunks)).map(|r| r.unwrap()).collect().await;
        assert_eq!(
            got,
            vec![
                Bytes::from_static(b"{\"a\":1}\n"),
                Bytes::from_static(b"{\"b\":2}\n"),
                Bytes::from_static(b"{\"c\":3}\n")
            ]
        );
    }

    #[tokio::test]
    async fn without_an_engine_its_paths_say_so_and_unknown_ones_are_404() {
        let shoal = Router::new().route("/services", axum::routing::get(|| async { "[]" }));
        let app = Engine::absent(PROCESS_EXECUTOR).wrap(shoal);
        let call = |p: &str| {
            let app = app.clone();
            let p = p.to_string();
            async move {
                let r = app.oneshot(Request::get(p).body(Body::empty()).unwrap()).await.unwrap();
                let status = r.status();
                let body = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
                (status, String::from_utf8_lossy(&body).into_owned())
            }
        };
        let (s, b) = call("/v1.47/containers/json").await;
        assert_eq!(s, StatusCode::NOT_IMPLEMENTED);
        assert!(b.contains("runs its tasks as processes") && b.contains("/containers/json"), "{b}");
        // (this bare router strips no version prefix; the API's routers do)
        assert_eq!(call("/services").await, (StatusCode::OK, "[]".to_string()));
        assert_eq!(call("/nope").await.0, StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn a_relay_to_itself_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("shoal.sock");
        let _l = tokio::net::UnixListener::bind(&sock).unwrap();
        let e = Engine::docker(&format!("unix://{}", sock.display()), &sock);
        assert!(format!("{e:?}").contains("own control socket"), "{e:?}");
        let e = Engine::docker("tcp://127.0.0.1:2375", &sock);
        assert!(format!("{e:?}").contains("not a unix socket"), "{e:?}");
    }

    /// A fake engine on a unix socket: `GET /version` says 1.41; a request with `Connection: Upgrade` gets
    /// 101, then the stream says the path it was asked for and echoes what it reads; `stuck: true` accepts
    /// connections and never answers.
    async fn fake_engine(dir: &Path, stuck: bool) -> PathBuf {
        let path = dir.join(if stuck { "stuck.sock" } else { "engine.sock" });
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                if stuck {
                    held.push(stream);
                    continue;
                }
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(|mut req: hyper::Request<hyper::body::Incoming>| async move {
                        let path = req.uri().path().to_string();
                        if path.ends_with("/version") {
                            return Ok::<_, std::convert::Infallible>(hyper::Response::new(http_body_util::Full::new(
                                Bytes::from_static(br#"{"ApiVersion":"1.41"}"#),
                            )));
                        }
                        let up = hyper::upgrade::on(&mut req);
                        tokio::spawn(async move {
                            let Ok(up) = up.await else { return };
                            let mut io = TokioIo::new(up);
                            use tokio::io::{AsyncReadExt, AsyncWriteExt};
                            let _ = io.write_all(format!("{path}\n").as_bytes()).await;
                            let mut buf = [0u8; 1024];
                            while let Ok(n) = io.read(&mut buf).await {
                                if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                                    break;
                                }
                            }
                        });
                        let mut r = hyper::Response::new(http_body_util::Full::new(Bytes::new()));
                        *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
                        r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
                        r.headers_mut().insert(header::UPGRADE, HeaderValue::from_static("tcp"));
                        Ok(r)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .with_upgrades()
                        .await;
                });
            }
        });
        path
    }

    /// Shoal's socket (a tiny router: `/_ping`, `/services`, `/info`) in front of `engine`, within `limits`.
    async fn shoal_socket(dir: &Path, engine: &Path, limits: crate::connections::ConnectionLimits) -> PathBuf {
        let path = dir.join("shoal.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let shoal = Router::new()
            .route("/_ping", axum::routing::get(|| async { "OK" }))
            .route("/services", axum::routing::get(|| async { "[]" }))
            .route("/info", axum::routing::get(|| async { axum::Json(json!({"Swarm": {"NodeID": "n1"}})) }));
        let router = Engine::docker(&format!("unix://{}", engine.display()), &path).wrap(shoal);
        tokio::spawn(crate::connections::serve_unix(listener, router, limits, std::future::pending()));
        path
    }

    async fn read_head(s: &mut tokio::net::UnixStream) -> String {
        use tokio::io::AsyncReadExt;
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if s.read(&mut b).await.unwrap() == 0 {
                break;
            }
            head.push(b[0]);
        }
        String::from_utf8_lossy(&head).into_owned()
    }

    async fn get(socket: &Path, path: &str) -> (String, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::UnixStream::connect(socket).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: d\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
        let mut all = String::new();
        s.read_to_string(&mut all).await.unwrap();
        let (head, body) = all.split_once("\r\n\r\n").unwrap_or((&all, ""));
        (head.to_string(), body.to_string())
    }

    #[tokio::test]
    async fn an_upgraded_stream_is_spliced_both_ways_and_holds_its_connection() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let engine = fake_engine(dir.path(), false).await;
        // (The test runs as the socket's owner: no reserve beyond the cap, so the cap is the one connection.)
        let limits =
            crate::connections::ConnectionLimits { max_connections: 1, owner_reserve: 0, ..Default::default() };
        let socket = shoal_socket(dir.path(), &engine, limits).await;

        let mut s = tokio::net::UnixStream::connect(&socket).await.unwrap();
        s.write_all(
            b"POST /v1.47/exec/abc/start HTTP/1.1\r\nHost: d\r\nConnection: Upgrade\r\nUpgrade: \
                      tcp\r\nContent-Length: 0\r\n\r\n",
        )
        .await
        .unwrap();
        let head = read_head(&mut s).await;
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        // The engine was asked at its own version, the rest of the path kept.
        let mut line = Vec::new();
        while !line.ends_with(b"\n") {
            let mut b = [0u8; 1];
            s.read_exact(&mut b).await.unwrap();
            line.push(b[0]);
        }
        assert_eq!(line, b"/v1.41/exec/abc/start\n");
        s.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n").await.unwrap();
        let mut echo = vec![0u8; 47];
        s.read_exact(&mut echo).await.unwrap();
        assert_eq!(echo, b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n", "raw bytes, never rewritten");

        // The hijacked connection is the socket's only one, busy: a second is refused, not served by evicting it.
        let (head, _) = get(&socket, "/_ping").await;
        assert!(head.starts_with("HTTP/1.1 503"), "{head}");
        s.write_all(b"still here").await.unwrap();
        let mut echo = vec![0u8; 10];
        s.read_exact(&mut echo).await.unwrap();
        assert_eq!(echo, b"still here");

        // Once the stream ends, the slot is free again.
        drop(s);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (head, body) = get(&socket, "/_ping").await;
            if head.starts_with("HTTP/1.1 200") {
                assert_eq!(body, "OK");
                break;
            }
            assert!(Instant::now() < deadline, "the slot was never freed: {head}");
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_stuck_engine_does_not_hold_up_the_swarms_paths() {
        let dir = tempfile::tempdir().unwrap();
        let engine = fake_engine(dir.path(), true).await;
        let socket = shoal_socket(dir.path(), &engine, Default::default()).await;
        // Relayed requests that the engine never answers...
        let mut stuck = Vec::new();
        for _ in 0..8 {
            let socket = socket.clone();
            stuck.push(tokio::spawn(async move { get(&socket, "/v1.41/containers/json").await }));
        }
        // ...leave Shoal's own paths answering at once.
        let started = Instant::now();
        let (head, body) = get(&socket, "/services").await;
        assert!(head.starts_with("HTTP/1.1 200") && body == "[]", "{head}");
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
        // A merged path answers Shoal's part once the engine's is given up.
        let (head, body) = get(&socket, "/info").await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let info: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(info["Swarm"]["NodeID"], "n1");
        assert!(info["Warnings"][0].as_str().unwrap().contains("no answer within"), "{info}");
        assert!(started.elapsed() < MERGE_TIMEOUT * 3, "{:?}", started.elapsed());
        for s in &stuck {
            assert!(!s.is_finished());
        }
        for s in stuck {
            s.abort();
        }
    }

    #[test]
    fn a_node_without_an_engine_answers_a_lookup_of_one_object_as_missing() {
        let why = "no engine here";
        for (path, want) in [
            ("/containers/abc/json", Some("No such container: abc")),
            ("/images/library/busybox:latest/json", Some("No such image: library/busybox:latest")),
            ("/volumes/data", Some("get data: no such volume")),
            ("/plugins/p/json", Some("plugin p not found")),
            ("/containers/json", None),
            ("/containers/abc/logs", None),
            ("/volumes", None),
        ] {
            assert_eq!(missing_object(path).as_deref(), want, "{path}");
            let status = no_engine(why, &Method::GET, path).status();
            let want_status = if want.is_some() { StatusCode::NOT_FOUND } else { StatusCode::NOT_IMPLEMENTED };
            assert_eq!(status, want_status, "{path}");
        }
        assert_eq!(no_engine(why, &Method::DELETE, "/containers/abc").status(), StatusCode::NOT_IMPLEMENTED);
    }
}
