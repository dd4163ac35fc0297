//! The `/secrets` and `/configs` endpoints: list (filters `names`, `name`, `id`, `label`), create (201
//! `{"ID"}`), inspect by ID, name or ID prefix, update of the labels (`version` required), delete (204). Every
//! write goes through `controlapi`; reads pass the read barrier first, as the other reads do. A secret's data is
//! never in an answer (`SecretJson::from_api` leaves it out; `controlapi` has already cleared it); a config's is,
//! as Docker does.
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
use crate::json::{ConfigJson, ConfigSpecJson, IdResponse, SecretJson, SecretSpecJson};
use crate::request::{json_body, ApiVersion};
use crate::versions::refuse_templating_before_1_37;
use crate::ApiContext;

type Ctx = State<Arc<ApiContext>>;
type Params = Query<HashMap<String, String>>;
type ApiResult = Result<Response, ApiError>;

/// `204 No Content`, labelled with the one media type the API document gives these endpoints (the engine
/// sends no `Content-Type`; an empty answer would otherwise be labelled `text/plain`).
fn no_content() -> ApiResult {
    Ok((StatusCode::NO_CONTENT, [(header::CONTENT_TYPE, "application/json")]).into_response())
}

fn created(id: String) -> ApiResult {
    Ok((StatusCode::CREATED, Json(IdResponse { id })).into_response())
}

/// `GET /secrets`.
pub(crate) async fn list_secrets(State(ctx): Ctx, Query(q): Params) -> ApiResult {
    let f = filters::secrets(q.get("filters").map(String::as_str))?;
    read_barrier(&ctx).await?;
    let out: Vec<SecretJson> = controlapi::list_secrets(&ctx.state, &f).iter().map(SecretJson::from_api).collect();
    Ok(Json(out).into_response())
}

/// `POST /secrets/create`.
pub(crate) async fn create_secret(State(ctx): Ctx, v: ApiVersion, headers: HeaderMap, body: Bytes) -> ApiResult {
    let spec: SecretSpecJson = json_body(&headers, &body, "secret spec")?;
    refuse_templating_before_1_37(v, "secret", spec.templating.is_some()).map_err(ApiError::BadRequest)?;
    let secret = controlapi::create_secret(&ctx.state, spec.to_api()?).await?;
    created(secret.id)
}

/// `GET /secrets/{id}` (ID, name or unique ID prefix).
pub(crate) async fn get_secret(State(ctx): Ctx, Path(id): Path<String>) -> ApiResult {
    read_barrier(&ctx).await?;
    let s = controlapi::get_secret(&ctx.state, &id)?;
    Ok(Json(SecretJson::from_api(&s)).into_response())
}

/// `POST /secrets/{id}/update?version=N`: labels only.
pub(crate) async fn update_secret(
    State(ctx): Ctx,
    Path(id): Path<String>,
    Query(q): Params,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    let spec: SecretSpecJson = json_body(&headers, &body, "secret spec")?;
    let version = version_param(&q)?;
    controlapi::update_secret(&ctx.state, &id, version, spec.to_api()?).await?;
    Ok(StatusCode::OK.into_response())
}

/// `DELETE /secrets/{id}`: 204, or 400 naming the services that use it.
pub(crate) async fn remove_secret(State(ctx): Ctx, Path(id): Path<String>) -> ApiResult {
    controlapi::remove_secret(&ctx.state, &id).await?;
    no_content()
}

/// `GET /configs`.
pub(crate) async fn list_configs(State(ctx): Ctx, Query(q): Params) -> ApiResult {
    let f = filters::secrets(q.get("filters").map(String::as_str))?;
    read_barrier(&ctx).await?;
    let out: Vec<ConfigJson> =
        controlapi::list_configs(&ctx.state, &f).iter().map(|c| ConfigJson::from_api(c)).collect();
    Ok(Json(out).into_response())
}

/// `POST /configs/create`.
pub(crate) async fn create_config(State(ctx): Ctx, v: ApiVersion, headers: HeaderMap, body: Bytes) -> ApiResult {
    let spec: ConfigSpecJson = json_body(&headers, &body, "config spec")?;
    refuse_templating_before_1_37(v, "config", spec.templating.is_some()).map_err(ApiError::BadRequest)?;
    let config = controlapi::create_config(&ctx.state, spec.to_api()?).await?;
    created(config.id)
}

/// `GET /configs/{id}` (ID, name or unique ID prefix), data included.
pub(crate) async fn get_config(State(ctx): Ctx, Path(id): Path<String>) -> ApiResult {
    read_barrier(&ctx).await?;
    let c = controlapi::get_config(&ctx.state, &id)?;
    Ok(Json(ConfigJson::from_api(&c)).into_response())
}

/// `POST /configs/{id}/update?version=N`: labels only.
pub(crate) async fn update_config(
    State(ctx): Ctx,
    Path(id): Path<String>,
    Query(q): Params,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    let spec: ConfigSpecJson = json_body(&headers, &body, "config spec")?;
    let version = version_param(&q)?;
    controlapi::update_config(&ctx.state, &id, version, spec.to_api()?).await?;
    Ok(StatusCode::OK.into_response())
}

/// `DELETE /configs/{id}`: 204, or 400 naming the services that use it.
pub(crate) async fn remove_config(State(ctx): Ctx, Path(id): Path<String>) -> ApiResult {
    controlapi::remove_config(&ctx.state, &id).await?;
    no_content()
}
