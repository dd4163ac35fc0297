//! The control socket of a worker-only node (joined with a worker token): it runs no manager and holds no
//! cluster state, so it answers `/_ping`, `/version` and `/info` (with the node's swarm identity and
//! `ControlAvailable: false`, as Docker does) and refuses everything else with 503 and the message Docker
//! gives on a worker: run the command on a manager. Shoal's own `GET /debug/dependencies` lists the IDs and
//! names of the secrets and configs the node's agent holds (never their data), for operators and tests.
//!
//! Must not depend on the store or the manager.

use std::future::Future;
use std::sync::Arc;

use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};

use crate::error::ApiError;
use crate::json::system::{InfoJson, PeerJson, SwarmInfoJson};

/// What a worker's control socket reports about the node.
#[derive(Clone, Debug)]
pub struct WorkerContext {
    /// This node's ID.
    pub node_id: String,
    /// This node's address as the manager sees it (may be empty).
    pub node_addr: String,
    /// The host name.
    pub hostname: String,
    /// The executor in use.
    pub executor: String,
    /// The cluster's managers as `(node ID, host:port)` (the ID empty while only the address is known), kept
    /// current by the node's agent from the dispatcher's session messages.
    pub managers: tokio::sync::watch::Receiver<Vec<(String, String)>>,
    /// The secrets and configs the node's agent holds (IDs and names only), kept current by the agent.
    pub held: tokio::sync::watch::Receiver<HeldDependencies>,
    /// The node's swarm lifecycle (`/swarm/leave`).
    pub lifecycle: crate::lifecycle::LifecycleRef,
    /// Why the node has no data plane, if it has none (a `docker info` warning).
    pub no_data_plane: Option<String>,
}

/// IDs and names of the secrets and configs an agent holds: never their data.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeldDependencies {
    /// Secrets as `(ID, name)`.
    pub secrets: Vec<(String, String)>,
    /// Configs as `(ID, name)`.
    pub configs: Vec<(String, String)>,
}

/// `GET /debug/dependencies`: `{"Secrets": [{"ID", "Name"}], "Configs": [...]}`.
async fn dependencies(State(ctx): State<Arc<WorkerContext>>) -> Json<serde_json::Value> {
    let held = ctx.held.borrow().clone();
    let list = |v: &[(String, String)]| -> Vec<serde_json::Value> {
        v.iter().map(|(id, name)| serde_json::json!({ "ID": id, "Name": name })).collect()
    };
    Json(serde_json::json!({ "Secrets": list(&held.secrets), "Configs": list(&held.configs) }))
}

/// The message for every cluster command sent to a worker.
pub const NOT_A_MANAGER: &str = "This node is not a swarm manager. Worker nodes can't be used to view or modify \
cluster state. Please run this command on a manager node or promote the current node to a manager.";

async fn info(State(ctx): State<Arc<WorkerContext>>, v: crate::request::ApiVersion) -> Json<InfoJson> {
    let mut info = InfoJson {
        labels: vec![format!("shoal.executor={}", ctx.executor)],
        swarm: SwarmInfoJson {
            node_id: ctx.node_id.clone(),
            node_addr: ctx.node_addr.clone(),
            local_node_state: "active".into(),
            control_available: false,
            error: String::new(),
            remote_managers: ctx
                .managers
                .borrow()
                .iter()
                .map(|(node_id, addr)| PeerJson { node_id: node_id.clone(), addr: addr.clone() })
                .collect(),
            nodes: 0,
            managers: 0,
            cluster: None,
        },
        ..crate::handlers::host_info(&ctx.node_id, &ctx.hostname)
    };
    if let Some(why) = &ctx.no_data_plane {
        info.warnings.push(crate::handlers::no_data_plane_warning(why));
    }
    crate::versions::adjust_info(v, &mut info);
    Json(info)
}

async fn leave(
    State(ctx): State<Arc<WorkerContext>>,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> axum::response::Response {
    crate::lifecycle::worker_leave(&ctx.lifecycle, &q).await.unwrap_or_else(|e| e.into_response())
}

async fn refuse() -> axum::response::Response {
    ApiError::Unavailable(NOT_A_MANAGER.into()).into_response()
}

/// The worker's routes (see `crate::with_context` for `/_ping`, `/version` and the `/v1.NN` prefix).
pub fn worker_router(ctx: WorkerContext) -> Router {
    let routes = Router::new()
        .route("/info", get(info))
        .route("/debug/dependencies", get(dependencies))
        .route("/swarm/init", axum::routing::post(crate::lifecycle::manager_init))
        .route("/swarm/join", axum::routing::post(crate::lifecycle::member_join))
        .route("/swarm/leave", axum::routing::post(leave))
        .fallback(refuse);
    crate::with_context(routes, ctx)
}

/// Serves the worker's control socket on `listener` until `shutdown` resolves.
pub async fn serve_worker_unix(
    listener: tokio::net::UnixListener,
    ctx: WorkerContext,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    crate::connections::serve_unix(
        listener,
        worker_router(ctx),
        crate::connections::ConnectionLimits::default(),
        shutdown,
    )
    .await
}
