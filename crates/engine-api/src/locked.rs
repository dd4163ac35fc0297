//! The control socket of a locked manager (autolock on, restarted, unlock key not given yet): it holds no
//! cluster state it can read, so it answers `/_ping`, `/version`, `/info` (`Swarm.LocalNodeState`
//! `"locked"`, as Docker reports it) and `POST /swarm/unlock`, and refuses everything else with 503 and
//! Docker's message. The key check itself is the node's (`Unlocker`): a wrong key answers 401 with Docker's
//! "swarm could not be unlocked: invalid key provided", a malformed one 400; either way the node stays
//! locked.
//!
//! Must not depend on the store, Raft or the key files.

use std::future::Future;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use crate::error::ApiError;
use crate::json::system::{InfoJson, SwarmInfoJson};
use crate::unlock::UnlockRequestJson;

/// Docker's message for any cluster command sent to a locked manager.
pub const LOCKED: &str = "Swarm is encrypted and needs to be unlocked before it can be used. Please use \
\"docker swarm unlock\" to unlock it.";

/// Docker's message for a wrong unlock key.
pub const INVALID_KEY: &str = "swarm could not be unlocked: invalid key provided";

/// Why an unlock attempt failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnlockError {
    /// The key is not in the `SWMKEY-1-...` format (400).
    #[error("{0}")]
    BadFormat(String),
    /// The key does not open this node's keys (401).
    #[error("{INVALID_KEY}")]
    WrongKey,
    /// The node could not use its key files (500).
    #[error("{0}")]
    Failed(String),
}

/// Checks an unlock key against the node's sealed keys; on success the node leaves the locked state.
pub trait Unlocker: Send + Sync + 'static {
    /// Tries `key` (as the user typed it).
    fn unlock(&self, key: &str) -> Result<(), UnlockError>;
}

/// What a locked manager's control socket knows.
#[derive(Clone)]
pub struct LockedContext {
    /// This node's ID.
    pub node_id: String,
    /// The host name.
    pub hostname: String,
    /// Checks keys.
    pub unlocker: Arc<dyn Unlocker>,
    /// The node's swarm lifecycle (`docker swarm leave --force` of a locked manager).
    pub lifecycle: crate::lifecycle::LifecycleRef,
}

impl std::fmt::Debug for LockedContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockedContext").field("node_id", &self.node_id).finish_non_exhaustive()
    }
}

async fn info(State(ctx): State<Arc<LockedContext>>, v: crate::request::ApiVersion) -> Json<InfoJson> {
    let mut info = InfoJson {
        swarm: SwarmInfoJson {
            node_id: ctx.node_id.clone(),
            local_node_state: "locked".into(),
            control_available: false,
            ..Default::default()
        },
        ..crate::handlers::host_info(&ctx.node_id, &ctx.hostname)
    };
    crate::versions::adjust_info(v, &mut info);
    Json(info)
}

async fn unlock(State(ctx): State<Arc<LockedContext>>, headers: axum::http::HeaderMap, body: Bytes) -> Response {
    let what = "unlock request {\"UnlockKey\": \"SWMKEY-1-...\"}";
    let req: UnlockRequestJson = match crate::request::json_body(&headers, &body, what) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let unlocker = ctx.unlocker.clone();
    let outcome = tokio::task::spawn_blocking(move || unlocker.unlock(&req.unlock_key))
        .await
        .unwrap_or_else(|e| Err(UnlockError::Failed(format!("the unlock check stopped: {e}"))));
    match outcome {
        Ok(()) => StatusCode::OK.into_response(),
        Err(UnlockError::BadFormat(m)) => ApiError::BadRequest(m).into_response(),
        Err(UnlockError::WrongKey) => ApiError::Unauthorized(INVALID_KEY.into()).into_response(),
        Err(UnlockError::Failed(m)) => ApiError::Internal(m).into_response(),
    }
}

/// Docker's message for a leave without `force` on a locked manager.
pub const LEAVE_LOCKED: &str =
    "Swarm is encrypted and locked. Please unlock it first or use `--force` to ignore this message.";

async fn leave(
    State(ctx): State<Arc<LockedContext>>,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Response {
    match crate::request::parse_bool_param(&q, "force") {
        Ok(true) => crate::lifecycle::worker_leave(&ctx.lifecycle, &q).await.unwrap_or_else(|e| e.into_response()),
        Ok(false) => ApiError::Unavailable(LEAVE_LOCKED.into()).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn refuse() -> Response {
    ApiError::Unavailable(LOCKED.into()).into_response()
}

/// The locked manager's routes (see `crate::with_context` for `/_ping`, `/version` and the `/v1.NN` prefix).
pub fn locked_router(ctx: LockedContext) -> Router {
    let routes = Router::new()
        .route("/info", get(info))
        .route("/swarm/unlock", post(unlock))
        .route("/swarm/leave", post(leave))
        .fallback(refuse);
    crate::with_context(routes, ctx)
}

/// Serves the locked control socket on `listener` until `shutdown` resolves (in-flight requests finish).
pub async fn serve_locked_unix(
    listener: tokio::net::UnixListener,
    ctx: LockedContext,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    crate::connections::serve_unix(
        listener,
        locked_router(ctx),
        crate::connections::ConnectionLimits::default(),
        shutdown,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Method, Request};
    use tower::ServiceExt as _;

    struct OneKey(&'static str);

    impl Unlocker for OneKey {
        fn unlock(&self, key: &str) -> Result<(), UnlockError> {
            match key {
                k if k == self.0 => Ok(()),
                k if k.starts_with("SWMKEY-1-") => Err(UnlockError::WrongKey),
                _ => Err(UnlockError::BadFormat("invalid unlock key".into())),
            }
        }
    }

    async fn call(method: Method, path: &str, body: &str) -> (StatusCode, serde_json::Value) {
        let router = locked_router(LockedContext {
            node_id: "n1".into(),
            hostname: "h".into(),
            unlocker: Arc::new(OneKey("SWMKEY-1-right")),
            lifecycle: Default::default(),
        });
        let req = Request::builder().method(method).uri(path).body(Body::from(body.to_string())).unwrap();
        let resp = router.oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null))
    }

    #[tokio::test]
    async fn a_locked_socket_answers_info_and_unlock_only() {
        let (s, info) = call(Method::GET, "/v1.47/info", "").await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(info["Swarm"]["LocalNodeState"], "locked");
        assert_eq!(info["Swarm"]["ControlAvailable"], false);
        assert_eq!(call(Method::GET, "/_ping", "").await.0, StatusCode::OK);
        for path in ["/services", "/swarm", "/nodes", "/swarm/unlockkey"] {
            let (s, body) = call(Method::GET, path, "").await;
            assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{path}");
            assert_eq!(body["message"], LOCKED);
        }
        let (s, body) = call(Method::POST, "/swarm/leave", "").await;
        assert_eq!((s, body["message"].as_str()), (StatusCode::SERVICE_UNAVAILABLE, Some(LEAVE_LOCKED)));
        let (s, body) = call(Method::POST, "/swarm/unlock", r#"{"UnlockKey":"SWMKEY-1-wrong"}"#).await;
        assert_eq!((s, body["message"].as_str()), (StatusCode::UNAUTHORIZED, Some(INVALID_KEY)));
        let (s, body) = call(Method::POST, "/swarm/unlock", r#"{"UnlockKey":"nonsense"}"#).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
        let (s, _) = call(Method::POST, "/swarm/unlock", "not json").await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        let (s, _) = call(Method::POST, "/v1.47/swarm/unlock", r#"{"UnlockKey":"SWMKEY-1-right"}"#).await;
        assert_eq!(s, StatusCode::OK);
    }
}
