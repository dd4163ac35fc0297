//! The manager's member of Docker's overlay gossip (`shoal_gossip`), served on the manager's advertised
//! address, port 7946, with the cluster's `networking:gossip` keys as the key manager rotates them: Docker
//! Engine workers join it through the managers' addresses and find each other there (docs/engine-worker.md).
//! A port already taken (a Docker manager on the same address, another Shoal manager on 127.0.0.1) is
//! logged and leaves the rest of the node running.

use std::net::SocketAddr;
use std::sync::Arc;

use shoal_store::{MemoryStore, Object};
use tokio::sync::watch;

/// The cluster's gossip keys, newest first.
fn gossip_keys(store: &MemoryStore) -> Vec<Vec<u8>> {
    let mut keys = store.view(|t| {
        t.clusters()
            .iter()
            .flat_map(|c| c.network_bootstrap_keys.clone())
            .filter(|k| k.subsystem == shoal_manager::keymanager::SUBSYSTEM_GOSSIP)
            .collect::<Vec<_>>()
    });
    keys.sort_by_key(|k| std::cmp::Reverse(k.lamport_time));
    keys.into_iter().map(|k| k.key).collect()
}

/// Serves the member named `name` on `addr` until `stop`.
pub(crate) async fn run(name: String, addr: SocketAddr, store: Arc<MemoryStore>, mut stop: watch::Receiver<bool>) {
    // Subscribed before the first read, so no key rotation is missed.
    let ((), mut events) = store.view_and_watch(|_| ());
    let (keys, rx) = watch::channel(gossip_keys(&store));
    let handle = match shoal_gossip::serve(name, addr, rx).await {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(
                %addr,
                "cannot serve the overlay gossip ({e}): Docker Engine workers will not find each other through \
                 this manager (free the port, or let another manager serve it)"
            );
            return;
        }
    };
    tracing::info!(addr = %handle.addr(), "overlay gossip member serving");
    loop {
        tokio::select! {
            _ = shoal_manager::stopped(&mut stop) => return,
            r = events.recv() => match r {
                Ok(commit) if !commit.changes.iter().any(|c| matches!(c.object, Object::Cluster(_))) => continue,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    let now = gossip_keys(&store);
                    keys.send_if_modified(|k| if *k == now { false } else { *k = now; true });
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            },
        }
    }
}
