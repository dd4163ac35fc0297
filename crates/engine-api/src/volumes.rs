//! The cluster volume endpoints (layer 1, docs/design/cluster-volumes.md): `GET /volumes` (the swarm's cluster
//! volumes, filters `name` (substring), `label`, `driver`; `dangling` is accepted and leaves them all in, as
//! the manager does not know which containers use one), `POST /volumes/create` with a `ClusterVolumeSpec` (201
//! with the `Volume`), `GET /volumes/{name}`, `PUT /volumes/{name}?version=N` (only `Availability` may change;
//! another change is a 400 naming the field) and `DELETE /volumes/{name}` (204; refused, naming them, while
//! services mount it). A volume is found by its exact name or ID, never by a prefix, so that the relay
//! (`relay.rs`) can ask here first and hand every other name to the node's engine, whose local volumes these
//! paths also serve. Every write goes through `controlapi`; reads pass the read barrier first.
//!
//! Must not depend on Raft or the executors.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use shoal_manager::controlapi;

use crate::error::ApiError;
use crate::filters;
use crate::handlers::{read_barrier, version_param};
use crate::json::volume::{VolumeCreateJson, VolumeJson, VolumeListJson, VolumeUpdateJson};
use crate::request::{json_body, parse_bool_param};
use crate::ApiContext;

type Ctx = State<Arc<ApiContext>>;
type Params = Query<HashMap<String, String>>;
type ApiResult = Result<Response, ApiError>;

/// The cluster volume named `name` (exact name or ID), or the engine's 404 message.
fn find(ctx: &ApiContext, name: &str) -> Result<Arc<shoal_api::Volume>, ApiError> {
    controlapi::find_volume_exact(&ctx.state, name)
        .ok_or_else(|| ApiError::NotFound(format!("get {name}: no such volume (neither the swarm's nor the engine's)")))
}

/// `GET /volumes`: the swarm's cluster volumes (the relay adds the engine's local ones).
pub(crate) async fn list_volumes(State(ctx): Ctx, Query(q): Params) -> ApiResult {
    let mut f = filters::parse(q.get("filters").map(String::as_str), &["name", "label", "driver", "dangling"])?;
    let names = f.remove("name").unwrap_or_default();
    let control = controlapi::VolumeFilters {
        labels: f.remove("label").unwrap_or_default(),
        drivers: f.remove("driver").unwrap_or_default(),
        ..Default::default()
    };
    read_barrier(&ctx).await?;
    let volumes = controlapi::list_volumes(&ctx.state, &control)
        .iter()
        .map(|v| VolumeJson::from_api(v))
        .filter(|v| names.is_empty() || names.iter().any(|n| v.name.contains(n.as_str())))
        .collect();
    Ok(Json(VolumeListJson { volumes, warnings: Vec::new() }).into_response())
}

/// `POST /volumes/create` with a `ClusterVolumeSpec`: 201 with the new `Volume`.
pub(crate) async fn create_volume(State(ctx): Ctx, headers: HeaderMap, body: Bytes) -> ApiResult {
    let req: VolumeCreateJson = json_body(&headers, &body, "volume create request")?;
    let volume = controlapi::create_volume(&ctx.state, req.to_api()?).await?;
    Ok((StatusCode::CREATED, Json(VolumeJson::from_api(&volume))).into_response())
}

/// `GET /volumes/{name}` (exact name or ID).
pub(crate) async fn get_volume(State(ctx): Ctx, Path(name): Path<String>) -> ApiResult {
    read_barrier(&ctx).await?;
    let v = find(&ctx, &name)?;
    Ok(Json(VolumeJson::from_api(&v)).into_response())
}

/// `PUT /volumes/{name}?version=N` with `{"Spec": ClusterVolumeSpec}`: the spec as it should be; fields left
/// out stay as they are, and only `Availability` may differ from the volume's.
pub(crate) async fn update_volume(
    State(ctx): Ctx,
    Path(name): Path<String>,
    Query(q): Params,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    let req: VolumeUpdateJson = json_body(&headers, &body, "volume update request")?;
    let version = version_param(&q)?;
    let Some(wanted) = req.spec else {
        return Err(ApiError::BadRequest(
            "Spec: the update needs the cluster volume's spec (e.g. {\"Spec\": {\"Availability\": \"drain\"}})".into(),
        ));
    };
    let current = find(&ctx, &name)?;
    let mut spec = current.spec.clone().unwrap_or_default();
    wanted.apply_to(&mut spec)?;
    controlapi::update_volume(&ctx.state, &current.id, version, spec).await?;
    Ok(StatusCode::OK.into_response())
}

/// `DELETE /volumes/{name}[?force=1]`: 204, or 400 naming the services that mount it.
pub(crate) async fn remove_volume(State(ctx): Ctx, Path(name): Path<String>, Query(q): Params) -> ApiResult {
    let force = parse_bool_param(&q, "force")?;
    let current = find(&ctx, &name)?;
    controlapi::remove_volume(&ctx.state, &current.id, force).await?;
    Ok((StatusCode::NO_CONTENT, [(header::CONTENT_TYPE, "application/json")]).into_response())
}
