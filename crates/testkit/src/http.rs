//! A minimal blocking Engine API client over a unix socket, for tests: method, path, optional JSON body ->
//! status and parsed JSON.

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use std::path::Path;

/// Status code and body (JSON if it parses, else a JSON string).
#[derive(Debug, Clone)]
pub struct Response {
    /// HTTP status.
    pub status: u16,
    /// Parsed body.
    pub body: serde_json::Value,
    /// Response headers, lower-cased names.
    pub headers: Vec<(String, String)>,
}

/// Sends one request on the socket and waits for the whole answer.
pub fn request(socket: &Path, method: &str, path: &str, body: Option<&str>) -> Result<Response, String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(send(socket, method, path, body))
}

/// Why `request_within` got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestError {
    /// The socket could not be connected: the request was never sent.
    Connect(String),
    /// The request may have been sent, but no whole answer came back (error or `limit` passed).
    NoAnswer(String),
}

/// `request`, giving up after `limit`; says whether the request can have reached the server.
pub fn request_within(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&str>,
    limit: std::time::Duration,
) -> Result<Response, RequestError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| RequestError::Connect(e.to_string()))?;
    rt.block_on(async {
        let stream = tokio::net::UnixStream::connect(socket)
            .await
            .map_err(|e| RequestError::Connect(format!("connect {}: {e}", socket.display())))?;
        match tokio::time::timeout(limit, send_on(stream, method, path, body)).await {
            Ok(r) => r.map_err(RequestError::NoAnswer),
            Err(_) => Err(RequestError::NoAnswer(format!("no answer within {limit:?}"))),
        }
    })
}

async fn send(socket: &Path, method: &str, path: &str, body: Option<&str>) -> Result<Response, String> {
    let stream =
        tokio::net::UnixStream::connect(socket).await.map_err(|e| format!("connect {}: {e}", socket.display()))?;
    send_on(stream, method, path, body).await
}

async fn send_on(
    stream: tokio::net::UnixStream,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<Response, String> {
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "shoal")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.unwrap_or("").to_string())))
        .map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let headers =
        resp.headers().iter().map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string())).collect();
    let bytes = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    Ok(Response { status, body, headers })
}
