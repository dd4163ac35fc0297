//! All of a node's TLS in one place: its certificate material (root CA, node certificate and key, swapped
//! in place on renewal), the server side of the remote gRPC port (TLS 1.2+, client certificates verified
//! against the cluster root when presented, required by the authorization layer for everything but the
//! CA bootstrap calls), gRPC client endpoints that present the node certificate and accept only a manager
//! (`swarm-manager` in the peer's certificate, signed by the root), the caller identity of a connection,
//! and the unauthenticated bootstrap endpoint used once to download the root CA (whose digest the caller
//! then checks against its join token). The remote port is reachable before authentication, so its accept
//! path is bounded: a handshake timeout per connection, handshake and connection caps per source address
//! (`source_limits`), and rate-limited log lines about refused connections.
//!
//! Crypto: rustls 0.23 with the ring provider, passed explicitly (no process-wide default). Must not know
//! the store, Raft or the Engine API.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use shoal_ca::NodeSubject;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::server::TlsStream;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::connection_caps::{Capped, ListenerCaps, RemoteCaps};
use crate::source_limits::{LogLimiter, Refused, SourceGuard, SourceLimits};

/// The DNS name every manager certificate carries; clients check it, so only a manager can serve them.
pub(crate) const MANAGER_SERVER_NAME: &str = "swarm-manager";
/// Longest a TLS handshake may take on the server before the connection is dropped: a peer that connects
/// and sends nothing holds a handshake place this long.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);
/// Most handshakes in progress at once on one listener; further connections wait to be accepted.
pub(crate) const MAX_PENDING_HANDSHAKES: usize = 256;
/// Most handshakes in progress at once from one source address on the remote gRPC port; a connection beyond
/// it is closed at once, so one address cannot take the listener's handshake places or fill its backlog.
pub(crate) const MAX_HANDSHAKES_PER_SOURCE: usize = 32;
/// Most connections (handshaking or established) one source address holds at once on the remote gRPC port.
/// A node needs a few (its agent's session, Raft, forwarded proposals); the bound leaves room for many nodes
/// behind one NAT address.
pub(crate) const MAX_CONNECTIONS_PER_SOURCE: usize = 512;
/// At most one log line per this period about refused or timed-out connections (with the count left out).
pub(crate) const REFUSAL_LOG_PERIOD: Duration = Duration::from_secs(10);
/// Connections that finished their handshake and wait for the gRPC server to take them.
pub(crate) const ACCEPTED_QUEUE: usize = 64;
/// Timeout of connecting (TCP + TLS) from a client endpoint.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// HTTP/2 pings on every connection to a manager, this often...
pub(crate) const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// ...and a connection whose ping is not answered within this is closed.
pub(crate) const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(3);

/// Why TLS material could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM certificate or key did not parse.
    #[error("{what} is not valid PEM: {reason}")]
    BadPem {
        /// Which file or field.
        what: &'static str,
        /// The parser's message.
        reason: String,
    },
    /// The node certificate is not one Shoal issued (no role OU, ...).
    #[error("the node certificate is unusable: {0}")]
    BadCertificate(#[from] shoal_ca::CaError),
    /// rustls refused the configuration.
    #[error("TLS configuration refused: {0}")]
    Config(String),
    /// An endpoint could not be built.
    #[error("invalid address {addr:?}: {reason}")]
    BadAddress {
        /// The address.
        addr: String,
        /// Why.
        reason: String,
    },
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs_from_pem(pem: &str, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::BadPem { what, reason: e.to_string() })?;
    if certs.is_empty() {
        return Err(TlsError::BadPem { what, reason: "no certificate found".into() });
    }
    Ok(certs)
}

/// The current certificate material (one consistent snapshot).
#[derive(Clone)]
struct Material {
    root_pem: String,
    cert_pem: String,
    key_pem: String,
    subject: NodeSubject,
    not_after: std::time::SystemTime,
    server: Arc<rustls::ServerConfig>,
    /// The SwarmKit API socket's OpenSSL server side with this certificate and key, built at its first use
    /// (most nodes never need it) and then shared by every connection: one per material, so a renewal or a
    /// new root installs an empty cell and the next connection gets the new certificate.
    openssl: Arc<std::sync::OnceLock<openssl::ssl::SslAcceptor>>,
}

/// A node's TLS identity: root CA, its certificate and key. Cheap to clone (shared); `update` swaps in a
/// renewed certificate for every connection made after it, `update_roots` the roots it trusts (a root
/// rotation). `tls_info` follows both: what the node reports in its description.
#[derive(Clone)]
pub struct NodeTls {
    inner: Arc<RwLock<Material>>,
    info: Arc<watch::Sender<shoal_api::NodeTlsInfo>>,
}

/// What a node reports about its certificate (`NodeDescription.tls_info`): the roots it trusts and who issued
/// its certificate.
pub(crate) fn tls_info_of(root_pem: &str, cert_pem: &str) -> shoal_api::NodeTlsInfo {
    let issuer = shoal_ca::cert_issuer_info(cert_pem.as_bytes(), root_pem.as_bytes()).unwrap_or_default();
    shoal_api::NodeTlsInfo {
        trust_root: root_pem.as_bytes().to_vec(),
        cert_issuer_subject: issuer.subject,
        cert_issuer_public_key: issuer.public_key,
    }
}

impl std::fmt::Debug for NodeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = self.inner.read();
        f.debug_struct("NodeTls").field("subject", &m.subject).field("not_after", &m.not_after).finish_non_exhaustive()
    }
}

fn build(root_pem: &str, cert_pem: &str, key_pem: &str) -> Result<Material, TlsError> {
    let roots = certs_from_pem(root_pem, "the root CA certificate")?;
    let chain = certs_from_pem(cert_pem, "the node certificate")?;
    let info = shoal_ca::parse_cert(&chain[0])?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| TlsError::BadPem { what: "the node key", reason: e.to_string() })?;
    let mut store = RootCertStore::empty();
    for r in roots {
        store.add(r).map_err(|e| TlsError::Config(format!("root CA: {e}")))?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(store), provider())
        .allow_unauthenticated()
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let mut server = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    server.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Material {
        root_pem: root_pem.to_string(),
        cert_pem: cert_pem.to_string(),
        key_pem: key_pem.to_string(),
        subject: info.subject,
        not_after: info.not_after,
        server: Arc::new(server),
        openssl: Arc::default(),
    })
}

/// OpenSSL's server side with `cert_pem` (the leaf first) and `key_pem`, HTTP/2 by ALPN, no client
/// certificate asked for (as the rustls side of the SwarmKit API socket). No session tickets and no session
/// cache: the clients that come here (`swarmctl`, one process per command) never resume a session, and each
/// of OpenSSL's two TLS 1.3 tickets cost a session encoded, copied and encrypted on every connection.
fn openssl_server(cert_pem: &str, key_pem: &str) -> Result<openssl::ssl::SslAcceptor, openssl::error::ErrorStack> {
    use openssl::ssl::{select_next_proto, AlpnError, SslAcceptor, SslMethod, SslSessionCacheMode};
    let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server())?;
    let mut chain = openssl::x509::X509::stack_from_pem(cert_pem.as_bytes())?.into_iter();
    if let Some(leaf) = chain.next() {
        b.set_certificate(&leaf)?;
    }
    for extra in chain {
        b.add_extra_chain_cert(extra)?;
    }
    let key = openssl::pkey::PKey::private_key_from_pem(key_pem.as_bytes())?;
    b.set_private_key(&key)?;
    b.check_private_key()?;
    b.set_alpn_select_callback(|_, offered| select_next_proto(b"\x02h2", offered).ok_or(AlpnError::NOACK));
    b.set_num_tickets(0)?;
    b.set_session_cache_mode(SslSessionCacheMode::OFF);
    Ok(b.build())
}

impl NodeTls {
    /// TLS material from PEM: the cluster root, this node's certificate and its private key.
    pub fn new(root_pem: &str, cert_pem: &str, key_pem: &str) -> Result<NodeTls, TlsError> {
        let m = build(root_pem, cert_pem, key_pem)?;
        let info = Arc::new(watch::channel(tls_info_of(root_pem, cert_pem)).0);
        Ok(NodeTls { inner: Arc::new(RwLock::new(m)), info })
    }

    fn install(&self, m: Material) {
        let info = tls_info_of(&m.root_pem, &m.cert_pem);
        *self.inner.write() = m;
        self.info.send_if_modified(|cur| {
            let changed = *cur != info;
            *cur = info;
            changed
        });
    }

    /// Replaces the certificate and key (renewal). Connections opened from now on use them; open ones
    /// keep going (tasks are not interrupted).
    pub fn update(&self, cert_pem: &str, key_pem: &str) -> Result<(), TlsError> {
        let root = self.inner.read().root_pem.clone();
        let m = build(&root, cert_pem, key_pem)?;
        self.install(m);
        Ok(())
    }

    /// Replaces the roots this node trusts (one or more PEM certificates), keeping its certificate: the new
    /// root the session messages carry once a root rotation is over. Connections opened from now on check peers
    /// against them.
    pub fn update_roots(&self, root_pem: &str) -> Result<(), TlsError> {
        let (cert, key) = {
            let m = self.inner.read();
            (m.cert_pem.clone(), m.key_pem.clone())
        };
        let m = build(root_pem, &cert, &key)?;
        self.install(m);
        Ok(())
    }

    /// What this node reports about its TLS (see `tls_info_of`), following every change.
    pub fn tls_info(&self) -> watch::Receiver<shoal_api::NodeTlsInfo> {
        self.info.subscribe()
    }

    /// The private key, PEM (to write the certificate files again with new roots).
    pub(crate) fn key_pem(&self) -> String {
        self.inner.read().key_pem.clone()
    }

    /// Who the current certificate names.
    pub fn subject(&self) -> NodeSubject {
        self.inner.read().subject.clone()
    }

    /// When the current certificate expires.
    pub fn not_after(&self) -> std::time::SystemTime {
        self.inner.read().not_after
    }

    /// The current certificate, PEM.
    pub fn cert_pem(&self) -> String {
        self.inner.read().cert_pem.clone()
    }

    /// The SwarmKit API socket's OpenSSL server side with the current certificate and key (see
    /// `openssl_server`): built once per certificate, then shared.
    pub(crate) fn openssl_acceptor(&self) -> Result<openssl::ssl::SslAcceptor, openssl::error::ErrorStack> {
        let (cell, cert_pem, key_pem) = {
            let m = self.inner.read();
            if let Some(a) = m.openssl.get() {
                return Ok(a.clone());
            }
            (m.openssl.clone(), m.cert_pem.clone(), m.key_pem.clone())
        };
        // Two first connections may both build one; the cell keeps the first. A renewal meanwhile installed a
        // new cell, so this one, of the old certificate, is no longer reached.
        let built = openssl_server(&cert_pem, &key_pem)?;
        Ok(cell.get_or_init(|| built).clone())
    }

    /// The root CA certificate, PEM.
    pub fn root_pem(&self) -> String {
        self.inner.read().root_pem.clone()
    }

    /// The server configuration for the next accepted connection.
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        self.inner.read().server.clone()
    }

    /// A gRPC endpoint to the manager at `addr` (`IP:PORT`, or a URI): mutual TLS with this node's current
    /// certificate; the server must present a manager certificate signed by the cluster root.
    pub fn endpoint(&self, addr: &str) -> Result<Endpoint, TlsError> {
        let m = self.inner.read().clone();
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&m.root_pem))
            .identity(Identity::from_pem(&m.cert_pem, &m.key_pem))
            .domain_name(MANAGER_SERVER_NAME)
            .assume_http2(true);
        https_endpoint(addr)?.tls_config(tls).map_err(|e| TlsError::Config(e.to_string()))
    }
}

// Every client endpoint to a manager offers `h2` by ALPN and speaks HTTP/2 even when the server selects no
// protocol (`assume_http2`): SwarmKit's managers before swarmkit 9a32e2735 (January 2025: Docker 20.10 and
// the engines of the years after it) name no protocol in their server TLS config, and tonic otherwise refuses
// such a connection ("HTTP/2 was not negotiated"). Shoal's own servers always select `h2`.

/// `https://IP:PORT` for an address given as `IP:PORT`, `http://IP:PORT` or `https://IP:PORT`.
pub(crate) fn https_uri(addr: &str) -> String {
    let hostport = addr.trim_start_matches("https://").trim_start_matches("http://").trim_end_matches('/');
    format!("https://{hostport}")
}

fn https_endpoint(addr: &str) -> Result<Endpoint, TlsError> {
    let uri = https_uri(addr);
    Endpoint::from_shared(uri.clone())
        .map(|e| {
            e.connect_timeout(CONNECT_TIMEOUT)
                .timeout(CONNECT_TIMEOUT.saturating_mul(3))
                .tcp_nodelay(true)
                // A connection whose peer went silent (a partition) is closed and made again, instead of
                // waiting on TCP's retransmission backoff once the network heals.
                .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
                .keep_alive_timeout(KEEPALIVE_TIMEOUT)
                .keep_alive_while_idle(true)
        })
        .map_err(|e| TlsError::BadAddress { addr: uri, reason: e.to_string() })
}

/// An endpoint with no client certificate that trusts `root_pem` for the server (a joining node asking
/// the CA for its first certificate, after it checked the root against its token).
pub fn endpoint_trusting_root(addr: &str, root_pem: &str) -> Result<Endpoint, TlsError> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(root_pem))
        .domain_name(MANAGER_SERVER_NAME)
        .assume_http2(true);
    https_endpoint(addr)?.tls_config(tls).map_err(|e| TlsError::Config(e.to_string()))
}

/// An endpoint that accepts any server certificate: only for `GetRootCACertificate` when joining, whose
/// answer is trusted only if its digest matches the join token (an impostor cannot produce that).
pub(crate) fn bootstrap_endpoint(addr: &str) -> Result<Endpoint, TlsError> {
    let tls = ClientTlsConfig::new().domain_name(MANAGER_SERVER_NAME).assume_http2(true);
    https_endpoint(addr)?
        .tls_config_with_verifier(tls, Arc::new(AnyServerCert(provider())))
        .map_err(|e| TlsError::Config(e.to_string()))
}

/// The client side of the SwarmKit API socket as `swarmctl` sets it up: TLS that accepts the node's
/// certificate unverified (the socket's file mode is the access control), HTTP/2 by ALPN. For tests and
/// tools that talk to `--listen-swarmkit-api`.
#[cfg(any(test, feature = "test-doors"))] // the test crates' client; the daemon only serves
pub fn local_socket_client_config() -> rustls::ClientConfig {
    let mut c = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .expect("the provider supports TLS 1.2 and 1.3")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServerCert(provider())))
        .with_no_client_auth();
    c.alpn_protocols = vec![b"h2".to_vec()];
    c
}

/// Accepts any server certificate but still checks the handshake signatures (so the connection is
/// encrypted to whoever holds the presented key). See `bootstrap_endpoint`.
#[derive(Debug)]
struct AnyServerCert(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyServerCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// TLS connections accepted on `listener`, for `tonic::transport::Server::serve_with_incoming`. Each
/// handshake runs in its own task (at most `MAX_PENDING_HANDSHAKES` at once, `HANDSHAKE_TIMEOUT` each) with
/// the server configuration current at accept time. Per source address, at most `MAX_HANDSHAKES_PER_SOURCE`
/// handshakes and `MAX_CONNECTIONS_PER_SOURCE` connections are held; a connection beyond them is closed as
/// soon as it is accepted, so idle connections from one address never stop others from connecting. Refused
/// and timed-out connections are logged at most once per `REFUSAL_LOG_PERIOD`; failed handshakes (plain TCP,
/// unknown CA) at debug level. The listener's overall caps (`connection_caps`: all connections, and those
/// without a client certificate, which are also closed when silent) apply on top. The stream ends when the
/// receiver is dropped.
pub(crate) fn tls_incoming(
    listener: TcpListener,
    tls: NodeTls,
) -> tokio_stream::wrappers::ReceiverStream<Result<SourceBound<Capped<TlsStream<TcpStream>>>, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel(ACCEPTED_QUEUE);
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_PENDING_HANDSHAKES));
    let sources = SourceLimits::new(MAX_HANDSHAKES_PER_SOURCE, MAX_CONNECTIONS_PER_SOURCE);
    let refusals = Arc::new(LogLimiter::new(REFUSAL_LOG_PERIOD));
    // The listener's overall caps, from the descriptor limit (`connection_caps`).
    let caps = ListenerCaps::new(RemoteCaps::for_nofile(crate::connection_caps::nofile_limit().unwrap_or(1024)));
    tracing::info!(
        connections = caps.caps.total,
        without_certificate = caps.caps.unauthenticated,
        "remote API connection caps"
    );
    tokio::spawn(async move {
        loop {
            let Some((permit, tcp, peer)) = accept_bounded(&listener, &permits, "remote API", tx.closed()).await else {
                return;
            };
            let Some(place) = caps.admit() else {
                if let Some(suppressed) = refusals.allow(std::time::Instant::now()) {
                    let total = caps.caps.total;
                    tracing::warn!(%peer, suppressed, "remote API connection refused: the port holds {total} \
                                                       connections, its cap");
                }
                continue;
            };
            let mut guard = match sources.admit(peer.ip()) {
                Ok(g) => g,
                Err(why) => {
                    if let Some(suppressed) = refusals.allow(std::time::Instant::now()) {
                        let limit = match why {
                            Refused::Handshakes => format!("{MAX_HANDSHAKES_PER_SOURCE} handshakes in progress"),
                            Refused::Connections => format!("{MAX_CONNECTIONS_PER_SOURCE} connections"),
                        };
                        tracing::warn!(
                            %peer,
                            suppressed,
                            "remote API connection refused: its address already holds {limit} (lines like this \
                             one are written at most every {REFUSAL_LOG_PERIOD:?}; `suppressed` counts the others)"
                        );
                    }
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.server_config());
            let tx = tx.clone();
            let refusals = refusals.clone();
            let caps = caps.clone();
            tokio::spawn(async move {
                let _permit = permit;
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        guard.established();
                        let authenticated = stream.get_ref().1.peer_certificates().is_some_and(|c| !c.is_empty());
                        let (stream, evicted) = caps.establish(stream, place, authenticated);
                        if evicted {
                            if let Some(suppressed) = refusals.allow(std::time::Instant::now()) {
                                let cap = caps.caps.unauthenticated;
                                tracing::warn!(%peer, suppressed, "remote API: {cap} connections without a client \
                                                                   certificate, their cap: the oldest closed for this \
                                                                   one");
                            }
                        }
                        let _ = tx.send(Ok(SourceBound { inner: stream, _guard: guard })).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake refused"),
                    Err(_) => {
                        if let Some(suppressed) = refusals.allow(std::time::Instant::now()) {
                            tracing::info!(%peer, suppressed, "remote API connection closed: no TLS handshake within \
                                                               {HANDSHAKE_TIMEOUT:?}");
                        }
                    }
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// A connection that holds its source address's place (`source_limits`) until it is dropped.
#[derive(Debug)]
pub(crate) struct SourceBound<S> {
    inner: S,
    _guard: SourceGuard,
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for SourceBound<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for SourceBound<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for SourceBound<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// The next connection on `listener` once one of `permits` is free (the permit travels with the connection).
/// An accept error is logged (`port` names the listener) and retried after 50 ms. `None` once `stop` resolves.
pub(crate) async fn accept_bounded(
    listener: &TcpListener,
    permits: &Arc<tokio::sync::Semaphore>,
    port: &str,
    stop: impl std::future::Future<Output = ()>,
) -> Option<(tokio::sync::OwnedSemaphorePermit, TcpStream, std::net::SocketAddr)> {
    tokio::pin!(stop);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p.ok()?,
            _ = &mut stop => return None,
        };
        tokio::select! {
            r = listener.accept() => match r {
                Ok((tcp, peer)) => return Some((permit, tcp, peer)),
                Err(e) => {
                    tracing::warn!(error = %e, "accept on the {port} port failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = &mut stop => return None,
        }
    }
}

/// The agent's endpoint factory over `tls` (mutual TLS with the node's current certificate).
pub(crate) fn agent_endpoints(tls: &NodeTls) -> shoal_agent::EndpointFactory {
    let tls = tls.clone();
    Arc::new(move |addr: &str| tls.endpoint(addr).map_err(|e| e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_ca::Role;

    /// A server certificate for a manager of a new cluster root, and this node's TLS over it.
    fn manager_tls() -> (NodeTls, shoal_ca::RootCa) {
        let root = shoal_ca::RootCa::generate(std::time::SystemTime::now(), &mut rand::rng()).unwrap();
        let csr = shoal_ca::generate_node_key_and_csr().unwrap();
        let subject = NodeSubject { node_id: "m1".into(), role: Role::Manager, cluster_id: "c1".into() };
        let cert = root
            .sign_csr(&csr.csr_pem, &subject, Duration::from_secs(3600), std::time::SystemTime::now(), &mut rand::rng())
            .unwrap();
        (NodeTls::new(root.cert_pem(), &cert, &csr.key_pem).unwrap(), root)
    }

    /// A manager whose TLS selects no application protocol (as SwarmKit's before January 2025 do) still
    /// answers Shoal's clients: they speak HTTP/2 without ALPN's say-so, with and without a client
    /// certificate.
    #[tokio::test]
    async fn clients_speak_http2_to_a_server_that_selects_no_alpn_protocol() {
        let (tls, root) = manager_tls();
        let mut config = (*tls.server_config()).clone();
        config.alpn_protocols.clear();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<TlsStream<TcpStream>, std::io::Error>>(4);
        let accepting = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else { return };
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    if let Ok(stream) = acceptor.accept(tcp).await {
                        assert_eq!(stream.get_ref().1.alpn_protocol(), None, "the server selected no protocol");
                        let _ = tx.send(Ok(stream)).await;
                    }
                });
            }
        });
        let served = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(shoal_manager::HealthService::remote().server())
                .serve_with_incoming(tokio_stream::wrappers::ReceiverStream::new(rx)),
        );
        let check = |endpoint: Endpoint| async move {
            let channel = endpoint.connect().await.map_err(|e| format!("{e:?}"))?;
            let mut client = shoal_api::health_client::HealthClient::new(channel);
            let request = shoal_api::HealthCheckRequest { service: "Raft".into() };
            client.check(request).await.map(|r| r.into_inner().status).map_err(|e| e.to_string())
        };
        let serving = shoal_api::health_check_response::ServingStatus::Serving as i32;
        assert_eq!(check(tls.endpoint(&addr.to_string()).unwrap()).await, Ok(serving), "mutual TLS");
        let trusting = endpoint_trusting_root(&addr.to_string(), root.cert_pem()).unwrap();
        assert_eq!(check(trusting).await, Ok(serving), "a joining node's first call");
        assert_eq!(check(bootstrap_endpoint(&addr.to_string()).unwrap()).await, Ok(serving), "the root's fetch");
        accepting.abort();
        served.abort();
    }
}
