//! A small blocking HTTP/1 client for the Engine API on the control unix socket: one connection per
//! request (hyper 1 over `tokio::net::UnixStream`) driven by a current-thread runtime. Non-2xx answers become
//! `CliError::Api` with the server's `message`. Each request is bounded by `REQUEST_TIMEOUT` and responses
//! by `MAX_RESPONSE_BYTES`. Must not depend on cluster logic.

use std::path::PathBuf;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Longest a request (connect, send, read the whole answer) may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest response body read.
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// Why a client command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The daemon answered with an error; the message is the API's.
    #[error("{0}")]
    Api(String),
    /// The socket could not be reached.
    #[error("cannot connect to the Shoal daemon at {path}: {reason}; is `shoal daemon` running? (set -H or SHOAL_HOST)")]
    Connect {
        /// The socket path.
        path: String,
        /// The OS error.
        reason: String,
    },
    /// The connection broke or timed out, or the answer was not what the API documents.
    #[error("talking to the Shoal daemon at {path}: {reason}")]
    Transport {
        /// The socket path.
        path: String,
        /// What failed.
        reason: String,
    },
    /// Some items failed and each failure was already printed; exit 1 without another message.
    #[error("some items failed (see above)")]
    AlreadyReported,
    /// A bad value on the command line that clap could not catch.
    #[error("{0}")]
    Usage(String),
}

/// Turns `unix:///path` or a bare path into a socket path.
pub fn socket_path(host: &str) -> Result<PathBuf, CliError> {
    if let Some(p) = host.strip_prefix("unix://") {
        return Ok(PathBuf::from(p));
    }
    if host.contains("://") {
        return Err(CliError::Usage(format!(
            "unsupported host {host:?}: use unix:///path/to/control.sock or a socket path"
        )));
    }
    Ok(PathBuf::from(host))
}

/// A blocking Engine API client.
pub struct Client {
    socket: PathBuf,
    rt: tokio::runtime::Runtime,
}

impl Client {
    /// A client for `host` (`unix:///path` or a path). Connects lazily, per request.
    pub fn new(host: &str) -> Result<Client, CliError> {
        let socket = socket_path(host)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| CliError::Transport {
                path: socket.display().to_string(),
                reason: e.to_string(),
            })?;
        Ok(Client { socket, rt })
    }

    fn transport(&self, reason: impl ToString) -> CliError {
        CliError::Transport {
            path: self.socket.display().to_string(),
            reason: reason.to_string(),
        }
    }

    /// Sends one request; returns the status and body.
    pub fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Bytes), CliError> {
        let fut = async {
            let stream = tokio::net::UnixStream::connect(&self.socket)
                .await
                .map_err(|e| CliError::Connect {
                    path: self.socket.display().to_string(),
                    reason: e.to_string(),
                })?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| self.transport(e))?;
            let driver = tokio::spawn(conn);
            let mut req = Request::builder()
                .method(method)
                .uri(path)
                .header(hyper::header::HOST, "shoal");
            if body.is_some() {
                req = req.header(hyper::header::CONTENT_TYPE, "application/json");
            }
            let req = req
                .body(Full::new(Bytes::from(body.unwrap_or_default())))
                .map_err(|e| self.transport(e))?;
            let resp = sender
                .send_request(req)
                .await
                .map_err(|e| self.transport(e))?;
            let status = resp.status();
            let bytes = Limited::new(resp.into_body(), MAX_RESPONSE_BYTES)
                .collect()
                .await
                .map_err(|e| self.transport(e))?
                .to_bytes();
            driver.abort();
            Ok::<_, CliError>((status, bytes))
        };
        self.rt.block_on(async {
            tokio::time::timeout(REQUEST_TIMEOUT, fut)
                .await
                .map_err(|_| {
                    self.transport(format!("no answer within {}s", REQUEST_TIMEOUT.as_secs()))
                })?
        })
    }

    /// Sends a request and decodes a 2xx JSON answer (or maps the error body to `CliError::Api`).
    pub fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T, CliError> {
        let (status, bytes) = self.request(method, path, body)?;
        if !status.is_success() {
            let msg = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| {
                    v.get("message")
                        .and_then(|m| m.as_str())
                        .map(str::to_string)
                })
                .unwrap_or_else(|| format!("{status}: {}", String::from_utf8_lossy(&bytes).trim()));
            return Err(CliError::Api(msg));
        }
        let bytes = if bytes.is_empty() {
            Bytes::from_static(b"null")
        } else {
            bytes
        };
        serde_json::from_slice(&bytes)
            .map_err(|e| self.transport(format!("unexpected answer to {path}: {e}")))
    }

    /// `GET path` as JSON.
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, CliError> {
        self.call(Method::GET, path, None)
    }

    /// `POST path` with a JSON body.
    pub fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<T, CliError> {
        let body = serde_json::to_vec(body).map_err(|e| CliError::Usage(e.to_string()))?;
        self.call(Method::POST, path, Some(body))
    }

    /// `DELETE path`.
    pub fn delete(&self, path: &str) -> Result<(), CliError> {
        self.call::<serde_json::Value>(Method::DELETE, path, None)
            .map(|_| ())
    }
}

/// Percent-encodes one path segment or query value.
pub fn enc(s: &str) -> String {
    urlencoding::encode(s).into_owned()
}

/// A `filters=` query value for Docker's filter syntax: `{"name": {"value": true}, ...}`.
pub fn filters_query(pairs: &[(&str, &str)]) -> String {
    let mut map = serde_json::Map::new();
    for (k, v) in pairs {
        let entry = map
            .entry(k.to_string())
            .or_insert_with(|| serde_json::Value::Object(Default::default()));
        if let serde_json::Value::Object(m) = entry {
            m.insert(v.to_string(), serde_json::Value::Bool(true));
        }
    }
    enc(&serde_json::Value::Object(map).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_parse() {
        assert_eq!(
            socket_path("unix:///var/run/shoal/control.sock").unwrap(),
            PathBuf::from("/var/run/shoal/control.sock")
        );
        assert_eq!(
            socket_path("/tmp/x.sock").unwrap(),
            PathBuf::from("/tmp/x.sock")
        );
        assert!(socket_path("tcp://1.2.3.4:2375").is_err());
    }
}
