//! The manager's member of Docker's overlay gossip (`shoal_gossip`), served on the manager's advertised
//! address, port 7946, with the cluster's `networking:gossip` keys as the key manager rotates them: Docker
//! Engine workers join it through the managers' addresses and find each other there (docs/engine-worker.md).
//! A port already taken (a Docker manager on the same address, another Shoal manager on 127.0.0.1) is
//! logged and leaves the rest of the node running.

use std::net::SocketAddr;
use std::sync::Arc;

use shoal_store::{MemoryStore, Object};
use tokio::sync::watch;

use crate::authz::{EntryPoints, Guard};

/// The cluster's gossip keys, the one to seal with first: the second by Lamport time when there are several,
/// as libnetwork picks its primary key (of the keyring's three, the middle one: a key every node has had
/// for a rotation's time), then the others.
fn gossip_keys(store: &MemoryStore) -> Vec<Vec<u8>> {
    let mut keys = store.view(|t| {
        t.clusters()
            .iter()
            .flat_map(|c| c.network_bootstrap_keys.clone())
            .filter(|k| k.subsystem == shoal_manager::keymanager::SUBSYSTEM_GOSSIP)
            .collect::<Vec<_>>()
    });
    keys.sort_by_key(|k| k.lamport_time);
    if keys.len() > 1 {
        keys.swap(0, 1);
    }
    keys.into_iter().map(|k| k.key).collect()
}

/// Serves the member named `name` on `addr` until `stop`.
pub(crate) async fn run(
    name: String,
    addr: SocketAddr,
    store: Arc<MemoryStore>,
    entry_points: EntryPoints,
    mut stop: watch::Receiver<bool>,
) {
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
    entry_points.register("overlay-gossip", handle.addr(), Guard::GossipKey);
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

#[cfg(test)]
mod tests {
    use shoal_api::{Cluster, EncryptionKey};
    use shoal_store::Changes;

    use super::*;

    #[test]
    fn the_member_seals_with_the_key_libnetwork_makes_primary_and_opens_with_all() {
        let store = MemoryStore::default();
        let key = |subsystem: &str, t: u64| EncryptionKey {
            subsystem: subsystem.into(),
            key: vec![t as u8; 16],
            lamport_time: t,
            ..Default::default()
        };
        let mut c = Changes::new();
        c.create(Cluster {
            id: "c".into(),
            network_bootstrap_keys: vec![
                key("networking:gossip", 7),
                key("networking:ipsec", 8),
                key("networking:gossip", 5),
                key("networking:gossip", 9),
            ],
            ..Default::default()
        });
        store.apply(1, c.actions()).unwrap();
        // The middle of the three by Lamport time first (libnetwork's primary), then the others; no IPsec key.
        assert_eq!(gossip_keys(&store), [vec![7u8; 16], vec![5u8; 16], vec![9u8; 16]]);
    }
}
