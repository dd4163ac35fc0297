//! The Docker Engine API v1.47 (its swarm part) over HTTP on the control unix socket, so that the stock
//! docker CLI and Shoal's own CLI can drive a Shoal cluster: routing (with an optional `/v1.NN` prefix on
//! every path), the JSON documents and their conversions (`json`), `filters`, and errors as
//! `{"message": ...}`. Every response carries `API-Version: 1.47` and `Server: Shoal/<version>`.
//!
//! Reads come from the store; every write goes through `shoal_manager::controlapi`. Must not depend on Raft
//! or the executors.

pub mod attach;
pub mod ca;
pub mod connections;
pub mod error;
pub mod events;
pub mod filters;
mod handlers;
pub use shoal_engine_json as json;
pub mod lifecycle;
pub mod locked;
pub mod logs;
mod networks;
pub mod relay;
pub mod request;
mod secrets;
#[cfg(test)]
mod secrets_tests;
pub mod swarm_update;
#[cfg(test)]
mod tests;
pub mod unlock;
pub mod versions;
mod volumes;
pub mod worker;

use std::future::Future;
use std::sync::Arc;

use axum::http::HeaderValue;
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use shoal_manager::ClusterState;

pub use error::ApiError;

/// The Engine API version served.
pub const API_VERSION: &str = "1.47";

/// What the API server needs to know about this node.
#[derive(Clone, Debug)]
pub struct ApiContext {
    /// The cluster state (store to read, proposer to write through `controlapi`).
    pub state: ClusterState,
    /// This node's ID (`Swarm.NodeID` in `/info`; marks the current node in `docker node ls`).
    pub node_id: String,
    /// This node's advertised remote API address.
    pub node_addr: String,
    /// The task executor in use: "process" or "docker".
    pub executor: String,
    /// This node's host name.
    pub hostname: String,
    /// Where logs come from while this manager does not lead (None: such requests answer 503).
    pub leader_logs: Option<Arc<dyn logs::LeaderLogs>>,
    /// The node's swarm lifecycle (`/swarm/leave`); none for in-process nodes.
    pub lifecycle: lifecycle::LifecycleRef,
    /// The swarm events `GET /events` answers from (`events::EventLog`, fed by the Watch stream).
    pub events: Arc<events::EventLog>,
}

/// Serves the API on `listener` within the default `connections::ConnectionLimits` until `shutdown`
/// resolves; in-flight requests then get a bounded time to finish.
pub async fn serve_unix(
    listener: tokio::net::UnixListener,
    ctx: ApiContext,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_unix_with(listener, ctx, connections::ConnectionLimits::default(), shutdown).await
}

/// `serve_unix` within `limits`.
pub async fn serve_unix_with(
    listener: tokio::net::UnixListener,
    ctx: ApiContext,
    limits: connections::ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    connections::serve_unix(listener, router(ctx), limits, shutdown).await
}

/// The API's routes over `ctx`. Requests may carry a `/v1.NN` prefix; it is stripped before routing.
pub fn router(ctx: ApiContext) -> Router {
    let routes = Router::new()
        .route("/info", get(handlers::info))
        .route("/swarm", get(handlers::swarm))
        .route("/shoal/v1/ca/client-cert", post(ca::client_cert))
        .route("/shoal/v1/ca/revoke-client-cert", post(ca::revoke_client_cert))
        .route("/swarm/update", post(swarm_update::update_swarm))
        .route("/swarm/unlockkey", get(unlock::unlock_key))
        .route("/swarm/unlock", post(unlock::not_locked))
        .route("/swarm/init", post(lifecycle::manager_init))
        .route("/swarm/join", post(lifecycle::member_join))
        .route("/swarm/leave", post(lifecycle::manager_leave))
        .route("/services", get(handlers::list_services))
        .route("/services/create", post(handlers::create_service))
        .route("/services/{id}", get(handlers::get_service).delete(handlers::remove_service))
        .route("/services/{id}/update", post(handlers::update_service))
        .route("/tasks", get(handlers::list_tasks))
        .route("/tasks/{id}", get(handlers::get_task))
        .route("/tasks/{id}/logs", get(logs::task_logs))
        .route("/services/{id}/logs", get(logs::service_logs))
        .route("/nodes", get(handlers::list_nodes))
        .route("/nodes/{id}", get(handlers::get_node).delete(handlers::remove_node))
        .route("/nodes/{id}/update", post(handlers::update_node))
        .route("/secrets", get(secrets::list_secrets))
        .route("/secrets/create", post(secrets::create_secret))
        .route("/secrets/{id}", get(secrets::get_secret).delete(secrets::remove_secret))
        .route("/secrets/{id}/update", post(secrets::update_secret))
        .route("/configs", get(secrets::list_configs))
        .route("/configs/create", post(secrets::create_config))
        .route("/configs/{id}", get(secrets::get_config).delete(secrets::remove_config))
        .route("/configs/{id}/update", post(secrets::update_config))
        .route("/networks", get(networks::list_networks))
        .route("/networks/create", post(networks::create_network))
        .route("/networks/{id}", get(networks::get_network).delete(networks::remove_network))
        .route("/volumes", get(volumes::list_volumes))
        .route("/volumes/create", post(volumes::create_volume))
        .route("/volumes/{name}", get(volumes::get_volume).put(volumes::update_volume).delete(volumes::remove_volume))
        .route("/distribution/{*name}", get(handlers::distribution))
        .route("/events", get(events::events))
        .fallback(handlers::not_found);
    let health = ctx.state.clone();
    with_context(routes, ctx).layer(axum::middleware::from_fn_with_state(health, handlers::unhealthy_ping))
}

/// `routes` (handlers over `ctx`, fallback included) as every API of this crate serves them (this one, a
/// worker's, a locked manager's): with `/_ping` and `/version`, Docker's headers on every response, and what
/// `request` does around every handler (body read first, version prefix checked and stripped, JSON errors).
pub(crate) fn with_context<C: Send + Sync + 'static>(routes: Router<Arc<C>>, ctx: C) -> Router {
    let routes = Router::new()
        .route("/_ping", get(handlers::ping))
        .route("/version", get(handlers::version))
        .merge(routes)
        .with_state(Arc::new(ctx));
    Router::new()
        .fallback_service(routes)
        .layer(axum::middleware::from_fn(request::api_version))
        .layer(axum::middleware::from_fn(request::json_errors))
        .layer(axum::middleware::map_response(add_headers))
        .layer(axum::extract::DefaultBodyLimit::max(request::BODY_LIMIT_BYTES))
        .layer(axum::middleware::from_fn(request::read_body_first))
}

async fn add_headers(mut r: Response) -> Response {
    use axum::body::HttpBody;
    // An empty answer (`200 OK` to a delete or an update) says what it is, in one of the spec's media types.
    if r.body().size_hint().exact() == Some(0) && !r.headers().contains_key(axum::http::header::CONTENT_TYPE) {
        r.headers_mut().insert(axum::http::header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    }
    let h = r.headers_mut();
    h.insert("API-Version", HeaderValue::from_static(API_VERSION));
    h.insert("Server", HeaderValue::from_static(concat!("Shoal/", env!("CARGO_PKG_VERSION"))));
    r
}
