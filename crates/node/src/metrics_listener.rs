//! `--listen-metrics IP:PORT`: the node's Prometheus metrics and, on managers, the live page
//! (`shoal_observe`), over plain HTTP. Off by default; loopback is the documented address, since what it
//! shows (node names, addresses, task errors) is the cluster's and nothing authenticates a reader.
//!
//! Bounds as the TCP Engine API's: at most `MAX_METRICS_CONNECTIONS` connections at once (accepting waits),
//! at most `MAX_METRICS_CONNECTIONS_PER_SOURCE` per source address (more are closed at once), then the Engine
//! API's header, idle and body timeouts and head limits (`shoal_engine_api::connections`). The live page's
//! own subscriber cap is `shoal_observe::live::MAX_SUBSCRIBERS`. Must not know what the routes serve.

use std::sync::Arc;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::source_limits::{LogLimiter, SourceLimits};
use crate::tls::REFUSAL_LOG_PERIOD;

/// Most connections to the metrics listener at once.
pub(crate) const MAX_METRICS_CONNECTIONS: usize = 256;
/// Most connections one source address holds at once (a Prometheus server needs one; a few pages more).
pub(crate) const MAX_METRICS_CONNECTIONS_PER_SOURCE: usize = 32;

/// Serves `router` on `listener` until `stop` turns true.
pub(crate) async fn serve(listener: TcpListener, router: Router, mut stop: watch::Receiver<bool>) {
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_METRICS_CONNECTIONS));
    // No handshake here: a connection is established as soon as it is accepted.
    let sources = SourceLimits::new(MAX_METRICS_CONNECTIONS_PER_SOURCE, MAX_METRICS_CONNECTIONS_PER_SOURCE);
    let refusals = Arc::new(LogLimiter::new(REFUSAL_LOG_PERIOD));
    loop {
        let Some((permit, tcp, peer)) =
            crate::tls::accept_bounded(&listener, &permits, "metrics", shoal_manager::stopped(&mut stop)).await
        else {
            return;
        };
        let mut guard = match sources.admit(peer.ip()) {
            Ok(g) => g,
            Err(_) => {
                if let Some(suppressed) = refusals.allow(std::time::Instant::now()) {
                    tracing::warn!(
                        %peer,
                        suppressed,
                        "metrics connection refused: its address already holds {MAX_METRICS_CONNECTIONS_PER_SOURCE} \
                         connections (lines like this one are written at most every {REFUSAL_LOG_PERIOD:?})"
                    );
                }
                continue;
            }
        };
        guard.established();
        let (router, mut stop) = (router.clone(), stop.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let _guard = guard;
            let limits = shoal_engine_api::connections::ConnectionLimits::default();
            let state = shoal_engine_api::connections::untracked();
            shoal_engine_api::connections::serve_connection(
                tcp,
                router,
                limits,
                state,
                shoal_manager::stopped(&mut stop),
            )
            .await;
        });
    }
}

/// Binds `--listen-metrics`.
pub(crate) async fn bind(addr: std::net::SocketAddr) -> Result<TcpListener, crate::NodeError> {
    let listener = TcpListener::bind(addr).await.map_err(|e| crate::NodeError::listen("--listen-metrics", addr, e))?;
    if !addr.ip().is_loopback() {
        tracing::warn!(
            %addr,
            "--listen-metrics is not a loopback address: anyone who reaches it reads the cluster's node names, \
             addresses and task errors without authenticating; prefer 127.0.0.1 and a scraper on this machine"
        );
    }
    Ok(listener)
}

/// Starts the listener of a manager: its metrics (store, Raft, dispatcher, process) and the live page with
/// its feed. Returns the tasks, named.
pub(crate) fn start_manager(
    listener: TcpListener,
    state: &shoal_manager::ClusterState,
    raft: &shoal_raft::RaftNode,
    dispatcher: &Arc<shoal_manager::Dispatcher>,
    node_id: &str,
    recorders: shoal_observe::Recorders,
    stop: watch::Receiver<bool>,
) -> Vec<(&'static str, tokio::task::JoinHandle<()>)> {
    let raft = raft.clone();
    let raft_reading = Arc::new(move || {
        let s = raft.status();
        shoal_observe::RaftFigures {
            is_leader: s.is_leader,
            term: s.term,
            leader_id: s.leader_id,
            commit_index: s.commit,
            applied_index: s.applied,
            snapshot_index: s.last_snapshot_index,
            synced_writes: raft.synced_writes(),
            members: raft.members().members.len() as u64,
        }
    });
    let dispatcher = dispatcher.clone();
    let sources = shoal_observe::Sources {
        node_id: node_id.to_string(),
        store: Some(state.store.clone()),
        raft: Some(raft_reading),
        dispatcher_sessions: Some(Arc::new(move || dispatcher.session_count())),
    };
    let metrics = Arc::new(shoal_observe::Metrics::new(sources, recorders.clone()));
    let hub = shoal_observe::LiveHub::new(state.store.clone());
    let router = shoal_observe::router(shoal_observe::Observed { metrics, live: Some(hub.clone()) });
    vec![
        ("live-page-feed", tokio::spawn(hub.run(recorders, stop.clone()))),
        ("metrics", tokio::spawn(serve(listener, router, stop))),
    ]
}

/// Starts the listener of a worker: node and process metrics only (it has no store to show).
pub(crate) fn start_worker(
    listener: TcpListener,
    node_id: &str,
    stop: watch::Receiver<bool>,
) -> (&'static str, tokio::task::JoinHandle<()>) {
    let sources = shoal_observe::Sources { node_id: node_id.to_string(), ..Default::default() };
    let metrics = Arc::new(shoal_observe::Metrics::new(sources, shoal_observe::Recorders::new()));
    let router = shoal_observe::router(shoal_observe::Observed { metrics, live: None });
    ("metrics", tokio::spawn(serve(listener, router, stop)))
}
