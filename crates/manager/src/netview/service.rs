//! The `shoal.v1.NetworkView` gRPC service: one stream per calling node, carrying `node_view` for the node
//! named by the caller's certificate (never a node it names itself). The stream subscribes to the store before
//! it reads (`view_and_watch`), sends the first view at once, and after a commit touching nodes, services,
//! tasks or networks waits `MIN_RECOMPUTE_INTERVAL_MS` (so a burst of commits costs one computation), reads a
//! fresh view and sends it if it differs from the last one sent. A lagged watch is answered with a fresh view
//! too. Bounds: one view in flight per stream (a slow agent holds back only its own stream); each view is at
//! most the node's networks times their subnets' addresses.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use shoal_api::shoal_v1::network_view_server::NetworkView;
use shoal_api::shoal_v1::{NetworkViewRequest, NodeNetworkView};
use shoal_store::{Commit, ObjectKind};
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::ClusterState;

/// The shortest time between two computations of one node's view.
pub(crate) const MIN_RECOMPUTE_INTERVAL_MS: u64 = 100;

/// Serves each node its data-plane view (see the module doc).
#[derive(Debug, Clone)]
pub struct NetworkViewService {
    state: ClusterState,
}

impl NetworkViewService {
    /// The service over `state`'s store.
    pub fn new(state: ClusterState) -> NetworkViewService {
        NetworkViewService { state }
    }

    /// The tonic server for it.
    pub fn server(self) -> super::NetworkViewServer<NetworkViewService> {
        super::NetworkViewServer::new(self)
    }
}

/// Whether a commit may change some node's view.
fn concerns_views(c: &Commit) -> bool {
    c.changes.iter().any(|ch| {
        matches!(ch.object.kind(), ObjectKind::Node | ObjectKind::Service | ObjectKind::Task | ObjectKind::Network)
    })
}

async fn stream_views(state: ClusterState, node_id: String, tx: mpsc::Sender<Result<NodeNetworkView, Status>>) {
    let store = Arc::clone(&state.store);
    let (mut last, mut watch) = store.view_and_watch(|t| super::node_view(t, &node_id));
    if tx.send(Ok(last.clone())).await.is_err() {
        return;
    }
    loop {
        let changed = tokio::select! {
            r = watch.recv() => match r {
                Ok(c) => concerns_views(&c),
                Err(RecvError::Lagged(_)) => true,
                Err(RecvError::Closed) => return,
            },
            _ = tx.closed() => return,
        };
        if !changed {
            continue;
        }
        state.timer.sleep_ms(MIN_RECOMPUTE_INTERVAL_MS).await;
        // Everything queued meanwhile is covered by the fresh view below.
        loop {
            match watch.try_recv() {
                Ok(_) | Err(TryRecvError::Lagged(_)) => continue,
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Closed) => return,
            }
        }
        let view = store.view(|t| super::node_view(t, &node_id));
        if view != last {
            if tx.send(Ok(view.clone())).await.is_err() {
                return;
            }
            last = view;
        }
    }
}

#[tonic::async_trait]
impl NetworkView for NetworkViewService {
    type WatchStream = Pin<Box<dyn Stream<Item = Result<NodeNetworkView, Status>> + Send + 'static>>;

    async fn watch(&self, req: Request<NetworkViewRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let node_id = crate::ca::node_identity(&req)?;
        let (tx, rx) = mpsc::channel(1);
        tokio::spawn(stream_views(self.state.clone(), node_id, tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
