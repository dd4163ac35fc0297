//! SwarmKit's API on a local socket (`--listen-swarmkit-api PATH`, as swarmd's `--listen-control-api`):
//! `Control`, `Watch`, `Logs` (`swarmctl service logs`; the leader answers, as on the remote port) and
//! `Health` over gRPC over TLS with the node's certificate, the transport swarmd uses
//! on its control socket, so the stock `swarmctl` (which skips verification there) and SwarmKit's Go client
//! connect unchanged. The socket file's mode (0600) is the access control, as in swarmd: no client
//! certificate is asked for.
//!
//! A client that sends a socket path as its TLS server name (the stock `swarmctl -s /abs/path/swarmd.sock`:
//! grpc-go takes the dial target as the name and as the HTTP/2 authority) is answered by OpenSSL with the
//! same certificate and has its authority replaced (`socket_path_names`); every other client is answered by
//! rustls, as the remote port is.
//!
//! Requests to `Control`, `Watch` and `Logs` are checked for fields Shoal's protos do not define before they are
//! decoded (`shoal_api::unknown_fields`): such a request is refused with INVALID_ARGUMENT naming the fields,
//! never served with the fields dropped.
//!
//! Bounds: `MAX_CONNECTIONS` connections at once (more wait in the backlog), a TLS handshake (the
//! ClientHello read first, at most `MAX_CLIENT_HELLO_BYTES`) within `HANDSHAKE_TIMEOUT`, request messages of
//! at most `MAX_REQUEST_BYTES`.
//!
//! Must not know what the services do; they are `shoal_manager`'s (`ControlService`, `WatchService`, `HealthService`).

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::BodyExt;
use shoal_manager::ClusterState;
use shoal_manager::{ControlService, HealthService, WatchService};
use shoal_raft::RaftNode;
use tokio::net::UnixStream;
use tokio::sync::{watch, OwnedSemaphorePermit};
use tokio::task::JoinHandle;
use tonic::codegen::http;
use tonic::Status;

use crate::tls::NodeTls;
use crate::NodeError;

/// Connections served at once.
pub(crate) const MAX_CONNECTIONS: usize = 64;
/// A client must finish its TLS handshake within this.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);
/// The largest request message accepted (gRPC's usual default).
pub(crate) const MAX_REQUEST_BYTES: usize = 4 << 20;
/// The most bytes read to find a ClientHello's server name (one TLS record).
pub(crate) const MAX_CLIENT_HELLO_BYTES: usize = 5 + (16 << 10);

/// A connection after its TLS handshake, whichever library made it.
pub(crate) trait Conn: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Conn for T {}

/// Binds the socket at `path` (replacing a stale one), mode 0600.
pub(crate) fn bind(path: &Path) -> Result<tokio::net::UnixListener, NodeError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| NodeError::io(dir, e))?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(NodeError::io(path, e)),
    }
    let listener = tokio::net::UnixListener::bind(path)
        .map_err(|e| NodeError::listen("--listen-swarmkit-api", path.display(), e))?;
    crate::set_mode(path, 0o600)?;
    Ok(listener)
}

/// Serves Control, Watch and Health on `listener` with `tls` until `shutdown` turns true; registers the
/// socket in `entry_points` (its guard: the socket file's mode).
pub(crate) fn serve(
    listener: tokio::net::UnixListener,
    tls: NodeTls,
    state: &ClusterState,
    raft: &RaftNode,
    entry_points: &crate::authz::EntryPoints,
    shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let path = listener.local_addr().ok().and_then(|a| a.as_pathname().map(|p| p.display().to_string()));
    entry_points.register("swarmkit-socket", path.unwrap_or_default(), crate::authz::Guard::SocketFileMode);
    let control = ControlService::new(state.clone()).server().max_decoding_message_size(MAX_REQUEST_BYTES);
    let log: Arc<dyn shoal_raft::CommittedLog> = Arc::new(raft.clone());
    let watch = WatchService::new(state.clone(), Some(log), Some(shutdown.clone()))
        .server()
        .max_decoding_message_size(MAX_REQUEST_BYTES);
    let router = tonic::transport::Server::builder()
        .layer(tower::layer::layer_fn(|inner| KnownFields { inner }))
        .add_service(control)
        .add_service(watch)
        .add_service(
            shoal_manager::LogsService::new(state.clone()).server().max_decoding_message_size(MAX_REQUEST_BYTES),
        )
        .add_service(HealthService::socket().server());
    let incoming = tls_unix_incoming(listener, tls, shutdown.clone());
    let stop = {
        let mut rx = shutdown;
        async move { shoal_manager::stopped(&mut rx).await }
    };
    tokio::spawn(async move {
        if let Err(e) = router.serve_with_incoming_shutdown(incoming, stop).await {
            tracing::error!(error = %e, "SwarmKit API server failed");
        }
    })
}

/// Accepted connections after their TLS handshake, at most `MAX_CONNECTIONS` at once.
fn tls_unix_incoming(
    listener: tokio::net::UnixListener,
    tls: NodeTls,
    shutdown: watch::Receiver<bool>,
) -> tokio_stream::wrappers::ReceiverStream<Result<Held<Box<dyn Conn>>, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    tokio::spawn(async move {
        let mut shutdown = shutdown;
        loop {
            let permit = tokio::select! {
                p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
                _ = shoal_manager::stopped(&mut shutdown) => return,
                _ = tx.closed() => return,
            };
            let stream = tokio::select! {
                r = listener.accept() => match r {
                    Ok((s, _)) => s,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept on the SwarmKit API socket failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = shoal_manager::stopped(&mut shutdown) => return,
                _ = tx.closed() => return,
            };
            let tls = tls.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(stream, &tls)).await {
                    Ok(Ok(s)) => {
                        let _ = tx.send(Ok(Held { inner: s, _permit: permit })).await;
                    }
                    Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake on the SwarmKit API socket refused"),
                    Err(_) => {
                        tracing::debug!("no TLS handshake on the SwarmKit API socket within {HANDSHAKE_TIMEOUT:?}")
                    }
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// Reads the ClientHello's first record, then hands the connection (those bytes first) to rustls, or to
/// OpenSSL with the authority fix when its server name is not a DNS name (see the module doc).
async fn handshake(mut stream: UnixStream, tls: &NodeTls) -> std::io::Result<Box<dyn Conn>> {
    use crate::socket_path_names::{client_hello_sni, AuthorityFix, FixedAuthority, Replay, Sni};
    use tokio::io::AsyncReadExt;
    let mut head = Vec::with_capacity(1024);
    let sni = loop {
        match client_hello_sni(&head) {
            Sni::Incomplete if head.len() < MAX_CLIENT_HELLO_BYTES => {}
            Sni::Incomplete => break Sni::Acceptable,
            done => break done,
        }
        let mut chunk = [0u8; 4096];
        let want = (MAX_CLIENT_HELLO_BYTES - head.len()).min(chunk.len());
        let n = stream.read(&mut chunk[..want]).await?;
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed before a ClientHello"));
        }
        head.extend_from_slice(&chunk[..n]);
    };
    let stream = Replay::new(head, stream);
    match sni {
        Sni::NotADnsName(name) => {
            tracing::debug!(server_name = %String::from_utf8_lossy(&name), "a client named the socket by its path");
            let acceptor = tls.openssl_acceptor().map_err(std::io::Error::other)?;
            let ssl = openssl::ssl::Ssl::new(acceptor.context()).map_err(std::io::Error::other)?;
            let mut s = tokio_openssl::SslStream::new(ssl, stream).map_err(std::io::Error::other)?;
            Pin::new(&mut s).accept().await.map_err(std::io::Error::other)?;
            Ok(Box::new(FixedAuthority::on_reads(s, AuthorityFix::default())))
        }
        _ => {
            let s = tokio_rustls::TlsAcceptor::from(tls.server_config()).accept(stream).await?;
            Ok(Box::new(s))
        }
    }
}

/// A connection that holds one of the `MAX_CONNECTIONS` places until it is dropped.
struct Held<S> {
    inner: S,
    _permit: OwnedSemaphorePermit,
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Held<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Held<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Nothing is known of a local socket's client (no certificate is asked for, a unix peer has no address).
impl<S> tonic::transport::server::Connected for Held<S> {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

/// The protobuf type a method takes (SwarmKit names every one `<Method>Request`), or `None` for Health,
/// whose requests are not checked.
fn request_type(path: &str) -> Option<String> {
    if path.starts_with("/docker.swarmkit.v1.Health/") {
        return None;
    }
    let method = path.rsplit('/').next().filter(|m| !m.is_empty())?;
    Some(format!(".docker.swarmkit.v1.{method}Request"))
}

/// True for the services this socket serves (their other methods are answered by tonic).
fn served(path: &str) -> bool {
    ["/docker.swarmkit.v1.Control/", "/docker.swarmkit.v1.Watch/", "/docker.swarmkit.v1.Logs/"]
        .iter()
        .any(|p| path.starts_with(p))
}

/// Why the gRPC messages of a body are not acceptable (`None`: they are).
fn check_messages(type_name: &str, mut body: &[u8]) -> Option<Status> {
    while !body.is_empty() {
        if body.len() < 5 {
            return Some(Status::invalid_argument("truncated gRPC message"));
        }
        if body[0] != 0 {
            return Some(Status::invalid_argument(
                "compressed requests are not accepted on this socket: send them uncompressed",
            ));
        }
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        let Some(msg) = body.get(5..5 + len) else {
            return Some(Status::invalid_argument("truncated gRPC message"));
        };
        match shoal_api::unknown_fields::unknown_fields(type_name, msg) {
            Ok(unknown) if unknown.is_empty() => {}
            Ok(unknown) => {
                return Some(Status::invalid_argument(format!(
                    "the request carries fields Shoal does not support ({}); leave them out",
                    unknown.join(", ")
                )))
            }
            Err(e) => return Some(Status::invalid_argument(e.to_string())),
        }
        body = &body[5 + len..];
    }
    None
}

/// The layer that refuses Control and Watch requests carrying unknown fields (see the module doc).
#[derive(Clone)]
struct KnownFields<S> {
    inner: S,
}

impl<S> tower::Service<http::Request<tonic::body::Body>> for KnownFields<S>
where
    S: tower::Service<http::Request<tonic::body::Body>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let Some(type_name) = request_type(req.uri().path()) else {
            return Box::pin(self.inner.call(req));
        };
        if !served(req.uri().path()) || !shoal_api::unknown_fields::is_known_type(&type_name) {
            // tonic would answer UNIMPLEMENTED without a word.
            let method = req.uri().path().rsplit('/').next().unwrap_or_default().to_string();
            let s = Status::unimplemented(format!(
                "{method} is not served by Shoal's SwarmKit API, which serves Control (without task removal, \
                 extensions, resources and volumes), Watch, Logs and Health; use the Engine API socket for \
                 what it offers"
            ));
            return Box::pin(async move { Ok(s.into_http()) });
        }
        // The service that was made ready goes with this call; a clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let limited = http_body_util::Limited::new(body, MAX_REQUEST_BYTES + 5);
            let bytes = match limited.collect().await {
                Ok(c) => c.to_bytes(),
                Err(_) => {
                    let s = Status::resource_exhausted(format!(
                        "the request is larger than {MAX_REQUEST_BYTES} bytes or was cut off"
                    ));
                    return Ok(s.into_http());
                }
            };
            if let Some(refused) = check_messages(&type_name, &bytes) {
                return Ok(refused.into_http());
            }
            let req = http::Request::from_parts(parts, tonic::body::Body::new(http_body_util::Full::new(bytes)));
            inner.call(req).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_types_follow_swarmkits_naming() {
        assert_eq!(
            request_type("/docker.swarmkit.v1.Control/ListNodes").as_deref(),
            Some(".docker.swarmkit.v1.ListNodesRequest")
        );
        assert_eq!(
            request_type("/docker.swarmkit.v1.Watch/Watch").as_deref(),
            Some(".docker.swarmkit.v1.WatchRequest")
        );
        assert_eq!(request_type("/docker.swarmkit.v1.Health/Check"), None);
        assert!(served("/docker.swarmkit.v1.Logs/SubscribeLogs") && !served("/docker.swarmkit.v1.Dispatcher/Session"));
    }

    #[test]
    fn unknown_fields_and_compression_are_refused() {
        use shoal_api::prost::Message;
        let frame = |flag: u8, msg: &[u8]| {
            let mut b = vec![flag];
            b.extend_from_slice(&u32::try_from(msg.len()).unwrap().to_be_bytes());
            b.extend_from_slice(msg);
            b
        };
        let ok = shoal_api::GetNodeRequest { node_id: "n1".into() }.encode_to_vec();
        assert!(check_messages(".docker.swarmkit.v1.GetNodeRequest", &frame(0, &ok)).is_none());
        let mut extra = ok.clone();
        extra.extend_from_slice(&[5 << 3, 0]);
        assert!(
            check_messages(".docker.swarmkit.v1.GetNodeRequest", &frame(0, &extra)).is_none(),
            "a zero value loses nothing"
        );
        extra.extend_from_slice(&[5 << 3, 1]);
        let s = check_messages(".docker.swarmkit.v1.GetNodeRequest", &frame(0, &extra)).unwrap();
        assert!(s.message().contains("field 5"), "{}", s.message());
        assert!(check_messages(".docker.swarmkit.v1.GetNodeRequest", &frame(1, &ok)).is_some());
        assert!(check_messages(".docker.swarmkit.v1.GetNodeRequest", &frame(0, &ok)[..3]).is_some());
    }

    /// A certificate and key for node `id`, signed by `root`.
    fn node_cert(root: &shoal_ca::RootCa, id: &str) -> (String, String) {
        let csr = shoal_ca::generate_node_key_and_csr().unwrap();
        let subject =
            shoal_ca::NodeSubject { node_id: id.into(), role: shoal_ca::Role::Manager, cluster_id: "c1".into() };
        let cert = root
            .sign_csr(&csr.csr_pem, &subject, Duration::from_secs(3600), std::time::SystemTime::now(), &mut rand::rng())
            .unwrap();
        (cert, csr.key_pem)
    }

    /// The common name of the certificate the socket at `path` presents to a client that names it by its path
    /// (answered by OpenSSL, as `swarmctl` is), taken from `incoming` once the server's handshake is done.
    async fn cn_seen_by_path<S>(path: &Path, incoming: &mut S) -> String
    where
        S: futures::Stream<Item = Result<Held<Box<dyn Conn>>, std::io::Error>> + Unpin,
    {
        use futures::StreamExt;
        let unix = UnixStream::connect(path).await.unwrap();
        let mut b = openssl::ssl::SslConnector::builder(openssl::ssl::SslMethod::tls_client()).unwrap();
        b.set_verify(openssl::ssl::SslVerifyMode::NONE);
        b.set_alpn_protos(b"\x02h2").unwrap();
        let mut conf = b.build().configure().unwrap();
        conf.set_verify_hostname(false);
        let ssl = conf.into_ssl(&path.to_string_lossy()).unwrap();
        let mut client = tokio_openssl::SslStream::new(ssl, unix).unwrap();
        Pin::new(&mut client).connect().await.unwrap();
        incoming.next().await.unwrap().expect("the server side of the handshake");
        let cert = client.ssl().peer_certificate().unwrap();
        let cn = cert.subject_name().entries_by_nid(openssl::nid::Nid::COMMONNAME).next().unwrap();
        String::from_utf8(cn.data().as_slice().to_vec()).unwrap()
    }

    #[tokio::test]
    async fn path_named_connections_share_one_acceptor_and_see_a_renewed_certificate() {
        let root = shoal_ca::RootCa::generate(std::time::SystemTime::now(), &mut rand::rng()).unwrap();
        let (cert, key) = node_cert(&root, "before");
        let tls = NodeTls::new(root.cert_pem(), &cert, &key).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("swarmd.sock");
        let (_stop, shutdown) = watch::channel(false);
        let mut incoming = tls_unix_incoming(bind(&path).unwrap(), tls.clone(), shutdown);
        assert_eq!(cn_seen_by_path(&path, &mut incoming).await, "before");
        let shared = tls.openssl_acceptor().unwrap();
        assert_eq!(cn_seen_by_path(&path, &mut incoming).await, "before");
        assert!(
            std::ptr::eq(tls.openssl_acceptor().unwrap().context(), shared.context()),
            "one OpenSSL context for every connection with the same certificate"
        );
        let (cert, key) = node_cert(&root, "after");
        tls.update(&cert, &key).unwrap();
        assert_eq!(
            cn_seen_by_path(&path, &mut incoming).await,
            "after",
            "a new connection gets the renewed certificate"
        );
        assert!(!std::ptr::eq(tls.openssl_acceptor().unwrap().context(), shared.context()));
        assert_eq!(cn_seen_by_path(&path, &mut incoming).await, "after");
    }
}
