//! The `/networks` endpoints for swarm-scope overlay networks: list (filters `id`, `name`, `label`, `driver`,
//! `scope`, `type`), inspect by ID, name or ID prefix, create (201 `{"Id", "Warning"}`; other drivers and
//! scopes refused with a 400 naming them) and delete (204; refused while a service uses the network, naming
//! it). Writes go through `controlapi`; reads pass the read barrier first.
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
use crate::handlers::read_barrier;
use crate::json::network::{NetworkCreateJson, NetworkCreateResponse, NetworkJson};
use crate::request::json_body;
use crate::ApiContext;

type Ctx = State<Arc<ApiContext>>;
type Params = Query<HashMap<String, String>>;
type ApiResult = Result<Response, ApiError>;

/// `GET /networks`.
pub(crate) async fn list_networks(State(ctx): Ctx, Query(q): Params) -> ApiResult {
    let f = filters::networks(q.get("filters").map(String::as_str))?;
    read_barrier(&ctx).await?;
    // The predefined `host` and `bridge` are the node's own networks: dockerd lists its engine's (the relay
    // adds them on a docker node), never the swarm's copies, which only let services name them.
    let out: Vec<NetworkJson> = controlapi::list_networks(&ctx.state, &f.control)
        .iter()
        .filter(|n| n.predefined_driver().is_none())
        .map(NetworkJson::from_api)
        .filter(|n| f.drivers.is_empty() || f.drivers.contains(&n.driver))
        .filter(|n| f.scopes.is_empty() || f.scopes.contains(&n.scope))
        .filter(|_| f.types.is_empty() || f.types.iter().any(|t| t == "custom"))
        .collect();
    Ok(Json(out).into_response())
}

/// `GET /networks/{id}` (ID, name or unique ID prefix). `scope` other than swarm finds nothing, as Docker.
pub(crate) async fn get_network(State(ctx): Ctx, Path(id): Path<String>, Query(q): Params) -> ApiResult {
    if q.get("verbose").is_some_and(|v| v == "1" || v == "true") {
        return Err(ApiError::BadRequest("verbose network inspect is not supported yet: leave out --verbose".into()));
    }
    if q.get("scope").is_some_and(|s| !s.is_empty() && s != "swarm") {
        return Err(ApiError::NotFound(format!("network {id} not found (Shoal's networks are swarm-scope)")));
    }
    read_barrier(&ctx).await?;
    let n = controlapi::get_network(&ctx.state, &id)?;
    // The swarm's copy of a predefined network answers only a swarm-scope lookup (the docker CLI's check of
    // `docker service create --network host`); otherwise the node's own network is meant: its engine answers
    // (the relay asks it when this says 404).
    if n.predefined_driver().is_some() && q.get("scope").is_none_or(|s| s != "swarm") {
        return Err(ApiError::NotFound(format!(
            "network {id} not found: {id} is each node's own network, not a swarm network (its engine shows it)"
        )));
    }
    let mut out = NetworkJson::from_api(&n);
    if n.spec.as_ref().is_some_and(|s| s.ingress) {
        if let Some(sbox) = ingress_sandbox(&ctx, &n.id) {
            out.containers.insert("ingress-sbox".into(), sbox);
        }
    }
    Ok(Json(out).into_response())
}

/// This node's endpoint on the ingress network (its `Node.attachments` address, where the routing mesh
/// forwards from), shown as Docker shows its ingress sandbox in `docker network inspect ingress`.
fn ingress_sandbox(ctx: &ApiContext, ingress: &str) -> Option<serde_json::Value> {
    let addr = ctx.state.store.view(|t| {
        let node = t.nodes().get(&ctx.node_id)?.clone();
        let a = node.attachments.iter().find(|a| a.network.as_ref().is_some_and(|n| n.id == ingress))?;
        a.addresses.first().cloned()
    })?;
    let ip: std::net::Ipv4Addr = addr.split('/').next()?.parse().ok()?;
    let o = ip.octets();
    Some(serde_json::json!({
        "Name": "ingress-endpoint",
        "EndpointID": "",
        "MacAddress": format!("02:42:{:02x}:{:02x}:{:02x}:{:02x}", o[0], o[1], o[2], o[3]),
        "IPv4Address": addr,
        "IPv6Address": "",
    }))
}

/// `POST /networks/create`.
pub(crate) async fn create_network(State(ctx): Ctx, headers: HeaderMap, body: Bytes) -> ApiResult {
    let req: NetworkCreateJson = json_body(&headers, &body, "network create request")?;
    let n = controlapi::create_network(&ctx.state, req.to_api()?).await?;
    Ok((StatusCode::CREATED, Json(NetworkCreateResponse { id: n.id, warning: String::new() })).into_response())
}

/// `DELETE /networks/{id}`: 204, or 400 naming the service that uses it.
pub(crate) async fn remove_network(State(ctx): Ctx, Path(id): Path<String>) -> ApiResult {
    controlapi::remove_network(&ctx.state, &id).await?;
    Ok((StatusCode::NO_CONTENT, [(header::CONTENT_TYPE, "application/json")]).into_response())
}
