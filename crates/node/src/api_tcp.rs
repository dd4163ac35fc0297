//! The Engine API over TCP with mutual TLS (`--listen-api tcp://IP:PORT`, managers only): the same routes
//! as the control socket (but `/shoal/v1/ca/...`), for remote `docker --tlsverify` and `shoal` clients. The
//! server presents a certificate from the cluster root with the listen IP as an address name (issued at
//! start, valid as long as node certificates). Connections without a certificate of the cluster root fail
//! the handshake; after it, every request is decided by the node's authorization module (`authz`) from the
//! store as it is then: a current manager's certificate or an operator certificate that is not revoked
//! passes; a worker's, a demoted or removed manager's, a revoked one gets 403 with a JSON message saying why;
//! an answer being streamed (`/events`, followed logs) ends once its caller no longer passes.
//!
//! Bounds: at most `MAX_API_CONNECTIONS` connections at once (accepting waits), and per source address at most
//! `MAX_API_HANDSHAKES_PER_SOURCE` handshakes and `MAX_API_CONNECTIONS_PER_SOURCE` connections (more are closed at
//! once, so one address cannot hold the listener's places before it authenticates), `HANDSHAKE_TIMEOUT` per
//! handshake, then the Engine API's header, idle and body read timeouts (`shoal_engine_api::connections`).
//! Must not know the routes (it serves the router it is given).

use std::sync::Arc;
use std::time::SystemTime;

use axum::Router;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use shoal_ca::{NodeSubject, Role, RootCa};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::authz::{Authorizer, Guard, PeerCert};
use crate::source_limits::{LogLimiter, Refused, SourceLimits};
use crate::tls::{TlsError, HANDSHAKE_TIMEOUT, REFUSAL_LOG_PERIOD};
use crate::NodeError;

/// Most Engine API connections over TCP at once.
pub(crate) const MAX_API_CONNECTIONS: usize = 256;
/// Most TLS handshakes in progress at once from one source address.
pub(crate) const MAX_API_HANDSHAKES_PER_SOURCE: usize = 8;
/// Most connections (handshaking or established) one source address holds at once: a client's pool needs a
/// few; several operators behind one address still fit.
pub(crate) const MAX_API_CONNECTIONS_PER_SOURCE: usize = 32;

/// The TLS server configuration: `cert_pem`/`key_pem` as the server identity, client certificates required
/// and verified against `root_pem`.
pub(crate) fn server_config(
    root_pem: &str,
    cert_pem: &str,
    key_pem: &str,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(root_pem.as_bytes()) {
        let c = c.map_err(|e| TlsError::BadPem { what: "the root CA certificate", reason: e.to_string() })?;
        roots.add(c).map_err(|e| TlsError::Config(e.to_string()))?;
    }
    let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::BadPem { what: "the API certificate", reason: e.to_string() })?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| TlsError::BadPem { what: "the API key", reason: e.to_string() })?;
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Issues the API server certificate for `listen` from the cluster's root (the manager holds it).
pub(crate) fn issue_server_cert(
    root: &RootCa,
    node_id: &str,
    cluster_id: &str,
    listen: std::net::SocketAddr,
    validity: std::time::Duration,
) -> Result<(String, String), NodeError> {
    let csr = shoal_ca::generate_node_key_and_csr().map_err(|e| NodeError::Security(e.to_string()))?;
    let subject = NodeSubject { node_id: node_id.to_string(), role: Role::Manager, cluster_id: cluster_id.to_string() };
    let cert = root
        .sign_csr_with_ips(&csr.csr_pem, &subject, validity, SystemTime::now(), &[listen.ip()], &mut rand::rng())
        .map_err(|e| NodeError::Security(e.to_string()))?;
    Ok((cert, csr.key_pem))
}

/// Serves `router` on `listener` with `config` until `stop` turns true, every request decided by `authz`
/// (with which the listener registers as `engine-api-tcp`).
pub(crate) async fn serve(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    authz: Authorizer,
    router: Router,
    mut stop: watch::Receiver<bool>,
) {
    if let Ok(addr) = listener.local_addr() {
        authz.entry_points().register("engine-api-tcp", addr, Guard::CertificateAndClusterState);
    }
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_API_CONNECTIONS));
    let sources = SourceLimits::new(MAX_API_HANDSHAKES_PER_SOURCE, MAX_API_CONNECTIONS_PER_SOURCE);
    let refusals = Arc::new(LogLimiter::new(REFUSAL_LOG_PERIOD));
    loop {
        let Some((permit, tcp, peer)) =
            crate::tls::accept_bounded(&listener, &permits, "Engine API TCP", shoal_manager::stopped(&mut stop)).await
        else {
            return;
        };
        let mut guard = match sources.admit(peer.ip()) {
            Ok(g) => g,
            Err(why) => {
                if let Some(suppressed) = refusals.allow(std::time::Instant::now()) {
                    let limit = match why {
                        Refused::Handshakes => format!("{MAX_API_HANDSHAKES_PER_SOURCE} handshakes in progress"),
                        Refused::Connections => format!("{MAX_API_CONNECTIONS_PER_SOURCE} connections"),
                    };
                    tracing::warn!(
                        %peer,
                        suppressed,
                        "Engine API TCP connection refused: its address already holds {limit} (lines like this one \
                         are written at most every {REFUSAL_LOG_PERIOD:?}; `suppressed` counts the others)"
                    );
                }
                continue;
            }
        };
        let (acceptor, router, authz, mut stop) = (acceptor.clone(), router.clone(), authz.clone(), stop.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "Engine API TLS handshake refused"),
                Err(_) => return tracing::debug!(%peer, "Engine API TLS handshake timed out"),
            };
            guard.established();
            // A certificate Shoal did not issue (no role OU) is taken as none: every request is refused.
            let caller = tls.get_ref().1.peer_certificates().and_then(|c| PeerCert::from_chain(c).ok().flatten());
            let router = authz.engine_api_gate(caller).around(router);
            // Header, keep-alive idle and body read timeouts as on the control socket.
            let limits = shoal_engine_api::connections::ConnectionLimits::default();
            let state = shoal_engine_api::connections::untracked();
            shoal_engine_api::connections::serve_connection(
                tls,
                router,
                limits,
                state,
                shoal_manager::stopped(&mut stop),
            )
            .await;
            tracing::debug!(%peer, "Engine API connection ended");
        });
    }
}
