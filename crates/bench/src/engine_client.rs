//! A keep-alive Engine API client over the control unix socket (hyper HTTP/1, one connection per client),
//! as a docker client library holds its connection: requests go one after another on the same connection.
//! Must not depend on any scenario.

use std::path::Path;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use crate::report::BenchError;

/// One HTTP/1 connection to the control socket.
pub(crate) struct EngineConn {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

impl EngineConn {
    /// Connects to `socket`.
    pub(crate) async fn connect(socket: &Path) -> Result<EngineConn, BenchError> {
        let stream = tokio::net::UnixStream::connect(socket)
            .await
            .map_err(|e| BenchError::Request(format!("connect {}: {e}", socket.display())))?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| BenchError::Request(format!("handshake: {e}")))?;
        tokio::spawn(conn);
        Ok(EngineConn { sender })
    }

    /// Sends one request and reads the whole answer: status and body.
    pub(crate) async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: Option<String>,
    ) -> Result<(u16, Bytes), BenchError> {
        self.sender.ready().await.map_err(|e| BenchError::Request(format!("connection: {e}")))?;
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "shoal")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| BenchError::Request(e.to_string()))?;
        let resp =
            self.sender.send_request(req).await.map_err(|e| BenchError::Request(format!("{method} {path}: {e}")))?;
        let status = resp.status().as_u16();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| BenchError::Request(format!("{method} {path}: {e}")))?
            .to_bytes();
        Ok((status, bytes))
    }

    /// GET returning parsed JSON; non-2xx is an error.
    pub(crate) async fn get_json(&mut self, path: &str) -> Result<serde_json::Value, BenchError> {
        let (status, body) = self.request("GET", path, None).await?;
        if !(200..300).contains(&status) {
            return Err(BenchError::Request(format!("GET {path}: {status} {}", String::from_utf8_lossy(&body))));
        }
        serde_json::from_slice(&body).map_err(|e| BenchError::Request(format!("GET {path}: bad JSON: {e}")))
    }
}

/// The Engine API JSON of a replicated service spec named `name` (image busybox, `sleep 3600`).
pub(crate) fn service_spec_json(name: &str, replicas: u64) -> String {
    serde_json::json!({
        "Name": name,
        "TaskTemplate": { "ContainerSpec": { "Image": "busybox", "Args": ["sleep", "3600"] } },
        "Mode": { "Replicated": { "Replicas": replicas } },
    })
    .to_string()
}
