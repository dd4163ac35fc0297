//! Autolock on a running manager: `GET /swarm/unlockkey` (`docker swarm unlock-key`) answers the
//! cluster's unlock key in its `SWMKEY-1-...` form, or `""` when autolock is off (the docker CLI then
//! says "no unlock key is set"), and `POST /swarm/unlock` on a manager that is not locked answers Docker's
//! 409 "swarm is not locked". The locked manager's own socket is `locked`.
//!
//! Must not depend on Raft or the key files.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};

use crate::error::ApiError;
use crate::ApiContext;

/// `POST /swarm/unlock` body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct UnlockRequestJson {
    /// The unlock key, `SWMKEY-1-...`.
    pub unlock_key: String,
}

/// `GET /swarm/unlockkey` answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct UnlockKeyJson {
    /// The unlock key, or empty when autolock is off.
    pub unlock_key: String,
}

/// `GET /swarm/unlockkey`.
pub async fn unlock_key(State(ctx): State<Arc<ApiContext>>) -> Result<Json<UnlockKeyJson>, ApiError> {
    let cluster = shoal_manager::controlapi::get_cluster(&ctx.state)?;
    let unlock_key = match shoal_manager::controlapi::manager_unlock_key(&cluster) {
        Some(raw) => shoal_ca::UnlockKey::from_raw(raw)
            .ok_or_else(|| ApiError::Internal(format!("the stored unlock key has {} bytes, not 32", raw.len())))?
            .to_human(),
        None => String::new(),
    };
    Ok(Json(UnlockKeyJson { unlock_key }))
}

/// `POST /swarm/unlock` on a manager that runs (is not locked).
pub async fn not_locked(headers: axum::http::HeaderMap, body: axum::body::Bytes) -> ApiError {
    // As the engine: the request is decoded first, so a malformed one is a 400 even here.
    let what = "unlock request {\"UnlockKey\": \"SWMKEY-1-...\"}";
    match crate::request::json_body::<UnlockRequestJson>(&headers, &body, what) {
        Ok(_) => ApiError::Conflict("swarm is not locked".into()),
        Err(e) => e,
    }
}
