//! Shoal's own endpoints for operator client certificates: `POST /shoal/v1/ca/client-cert` (body
//! `{"Name": ..., "CSR": <PEM>}`, answer `{"Certificate": <PEM>, "RootCA": <PEM>}`), used by
//! `shoal ca issue-client-cert`, and `POST /shoal/v1/ca/revoke-client-cert` (body `{"Certificate": <PEM>}` or
//! `{"Serial": <hex>}`, answer `{"Serial": ..., "Name": ...}`), used by `shoal ca revoke-client-cert`. Served
//! on the local control socket only, whose access is the operator's: the TCP Engine API refuses `/shoal/v1/ca/`
//! (the node's authorization module), so a stolen operator certificate cannot mint itself a successor.
//!
//! Must not depend on Raft or the executors.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use shoal_manager::{issue_client_cert, ClientCertError};

use crate::error::ApiError;
use crate::ApiContext;

/// The request body.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ClientCertRequest {
    /// The client's name (the certificate's CN).
    pub name: String,
    /// The PEM certificate signing request (its key stays with the client).
    #[serde(rename = "CSR")]
    pub csr: String,
}

/// The answer.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ClientCertResponse {
    /// The signed client certificate, PEM.
    pub certificate: String,
    /// The cluster root CA certificate, PEM (the `ca.pem` a docker client trusts).
    #[serde(rename = "RootCA")]
    pub root_ca: String,
}

/// `POST /shoal/v1/ca/client-cert`.
pub async fn client_cert(
    State(ctx): State<Arc<ApiContext>>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: ClientCertRequest =
        crate::request::json_body(&headers, &body, "client certificate request {\"Name\": ..., \"CSR\": ...}")?;
    let (certificate, root_ca) = issue_client_cert(&ctx.state, &req.name, &req.csr).map_err(|e| match e {
        ClientCertError::NoCluster => ApiError::Unavailable(e.to_string()),
        ClientCertError::BadRequest(m) => ApiError::BadRequest(m),
    })?;
    Ok(Json(ClientCertResponse { certificate, root_ca }).into_response())
}

/// The body of `POST /shoal/v1/ca/revoke-client-cert`: one of the two fields.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct RevokeRequest {
    /// The certificate to revoke, PEM.
    pub certificate: String,
    /// Or its serial number, hex.
    pub serial: String,
}

/// The answer: what was revoked.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RevokeResponse {
    /// The revoked certificate's serial number (normalised hex).
    pub serial: String,
    /// Its name (CN), when the certificate was given.
    pub name: Option<String>,
}

/// `POST /shoal/v1/ca/revoke-client-cert`.
pub async fn revoke_client_cert(
    State(ctx): State<Arc<ApiContext>>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: RevokeRequest = crate::request::json_body(
        &headers,
        &body,
        "revocation request {\"Certificate\": <PEM>} or {\"Serial\": <hex>}",
    )?;
    let revoked = shoal_manager::revoke_client_cert(&ctx.state, Some(&req.serial), Some(&req.certificate)).await?;
    Ok(Json(RevokeResponse { serial: revoked.serial, name: revoked.name }).into_response())
}
