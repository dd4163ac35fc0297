//! Shoal's own endpoint for operator client certificates, `POST /shoal/v1/ca/client-cert` (body
//! `{"Name": ..., "CSR": <PEM>}`, answer `{"Certificate": <PEM>, "RootCA": <PEM>}`), used by
//! `shoal ca issue-client-cert`. Only served on the local control socket, whose access is the operator's.
//!
//! Must not depend on Raft or the executors.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use shoal_manager::ca::{issue_client_cert, ClientCertError};

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
