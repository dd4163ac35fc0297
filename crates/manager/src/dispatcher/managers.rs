//! What every session message carries besides the node (`SessionInfo`): the list of managers, so that an
//! agent that loses the manager it talks to can try the others (and a restarted agent can find the cluster
//! without the manager it joined through), and the cluster's network encryption keys (the key manager's,
//! `Cluster.network_bootstrap_keys`); and, kept apart (`SessionRoot`), the cluster's root certificate. Sans IO:
//! `session_info` reads a store view; `touches_session_info` tells whether a commit's change may alter it. The
//! dispatcher keeps the current info in a `watch` channel, recomputed by one store watcher (`run_session_info`), and
//! resends the session message to every agent when it changes (a key rotation reaches every agent so).
//!
//! The source is the Node objects' `manager_status` (Raft ID, address, reachability), which the leader keeps
//! in step with the Raft membership and which every manager has in its replicated store, so the list is the
//! same on whichever manager becomes leader. Listed: every manager whose address is known and whose
//! reachability is not UNREACHABLE, plus the dispatcher's own address (it is the leader serving the
//! session); each with weight `MANAGER_WEIGHT`. Sorted by address, so an unchanged set is an unchanged list.
//!
//! Bound: one entry per manager. Must not depend on Raft internals or on the agent.

use std::sync::{Arc, Weak};

use shoal_api::{raft_member_status::Reachability, EncryptionKey, Peer, WeightedPeer};
use shoal_store::{Change, MemoryStore, Object, Tables, WatchError};
use tokio::sync::watch;

/// The weight every listed manager gets (SwarmKit's default observation weight).
pub(crate) const MANAGER_WEIGHT: i64 = 10;

/// The managers an agent may talk to, as of `tables`; `own_addr` (this dispatcher's advertised address)
/// is always listed when not empty.
pub(crate) fn manager_peers(tables: &Tables, own_addr: &str) -> Vec<WeightedPeer> {
    let mut peers: Vec<Peer> = tables
        .nodes()
        .iter()
        .filter_map(|n| {
            let m = n.manager_status.as_ref()?;
            let listed = !m.addr.is_empty() && m.reachability != Reachability::Unreachable as i32;
            listed.then(|| Peer { node_id: n.id.clone(), addr: m.addr.clone() })
        })
        .collect();
    if !own_addr.is_empty() && !peers.iter().any(|p| p.addr == own_addr) {
        peers.push(Peer { node_id: String::new(), addr: own_addr.to_string() });
    }
    peers.sort_by(|a, b| a.addr.cmp(&b.addr).then_with(|| a.node_id.cmp(&b.node_id)));
    peers.dedup_by(|a, b| a.addr == b.addr);
    peers.into_iter().map(|p| WeightedPeer { peer: Some(p), weight: MANAGER_WEIGHT }).collect()
}

/// What a session message carries besides the node.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct SessionInfo {
    /// `manager_peers`.
    pub managers: Vec<WeightedPeer>,
    /// The cluster's network encryption keys.
    pub network_bootstrap_keys: Vec<EncryptionKey>,
}

/// The session info as of `tables`; `own_addr` as in `manager_peers`.
pub(crate) fn session_info(tables: &Tables, own_addr: &str) -> SessionInfo {
    SessionInfo {
        managers: manager_peers(tables, own_addr),
        network_bootstrap_keys: tables
            .clusters()
            .iter()
            .next()
            .map(|c| c.network_bootstrap_keys.clone())
            .unwrap_or_default(),
    }
}

/// True when `ch` may change `session_info`: `touches_managers`, or a cluster change whose network keys
/// differ between before and after.
pub(crate) fn touches_session_info(ch: &Change) -> bool {
    let keys = |o: Option<&Object>| match o {
        Some(Object::Cluster(c)) => Some(c.network_bootstrap_keys.clone()),
        _ => None,
    };
    match &ch.object {
        Object::Cluster(_) if ch.kind == shoal_store::ActionKind::Update => {
            keys(Some(&ch.object)) != keys(ch.old.as_ref())
        }
        Object::Cluster(_) => true,
        _ => touches_managers(ch),
    }
}

/// True when `ch` may change `manager_peers`: a node change where the node had or has a manager status
/// that differs between before and after.
pub(crate) fn touches_managers(ch: &Change) -> bool {
    let status = |o: Option<&Object>| match o {
        Some(Object::Node(n)) => n.manager_status.as_ref().map(|m| (m.addr.clone(), m.reachability)),
        _ => None,
    };
    if !matches!(ch.object, Object::Node(_)) {
        return false;
    }
    match ch.kind {
        shoal_store::ActionKind::Update => status(Some(&ch.object)) != status(ch.old.as_ref()),
        _ => status(Some(&ch.object)).is_some(),
    }
}

/// Keeps `list` equal to `session_info` of the store: one watcher, recomputing from a view on every commit
/// that touches it (or after a lag). Ends when every holder of `list` is gone (checked after each commit)
/// or the store's watch closes.
pub(crate) async fn run_session_info(
    store: Arc<MemoryStore>,
    own_addr: String,
    list: Weak<watch::Sender<Arc<SessionInfo>>>,
) {
    run_derived(store, move |t| session_info(t, &own_addr), touches_session_info, list).await
}

/// What session messages say of the cluster's root CA. `root_ca` is what `SessionMessage.RootCA` carries, as
/// SwarmKit's dispatcher sends it: the cluster's root certificate (`Cluster.root_ca.ca_cert`), which stays
/// the old root while a rotation lasts and is the new root once it is over. `rotating_to` (the new root while
/// a rotation lasts, else empty) is not sent: it only makes the start of a rotation a change, so that every
/// session gets a new message then, as SwarmKit's dispatcher sends one on every cluster update.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct SessionRoot {
    /// `SessionMessage.RootCA`.
    pub root_ca: Vec<u8>,
    /// The root a rotation in progress moves to; empty when none is.
    pub rotating_to: Vec<u8>,
}

/// The session root as of `tables` (empty before the cluster has a root).
pub(crate) fn session_root(tables: &Tables) -> SessionRoot {
    let Some(rc) = tables.clusters().iter().next().and_then(|c| c.root_ca.clone()) else {
        return SessionRoot::default();
    };
    SessionRoot { root_ca: rc.ca_cert, rotating_to: rc.root_rotation.map(|r| r.ca_cert).unwrap_or_default() }
}

/// Keeps `root` equal to `session_root` of the store, as `run_session_info` does for the managers.
pub(crate) async fn run_session_root(store: Arc<MemoryStore>, root: Weak<watch::Sender<Arc<SessionRoot>>>) {
    run_derived(store, session_root, |ch| matches!(ch.object, Object::Cluster(_)), root).await
}

/// Keeps `out` equal to `compute` of the store, recomputed on every commit with a change `touches` says
/// matters (or after a lag), published only when it differs.
async fn run_derived<T: PartialEq + Send + Sync + 'static>(
    store: Arc<MemoryStore>,
    compute: impl Fn(&Tables) -> T,
    touches: impl Fn(&Change) -> bool,
    out: Weak<watch::Sender<Arc<T>>>,
) {
    let publish = |value: T| -> bool {
        let Some(tx) = out.upgrade() else { return false };
        tx.send_if_modified(|cur| {
            if **cur == value {
                return false;
            }
            *cur = Arc::new(value);
            true
        });
        true
    };
    let (value, mut watch) = store.view_and_watch(&compute);
    if !publish(value) {
        return;
    }
    loop {
        let recompute = match watch.recv().await {
            Ok(commit) => commit.changes.iter().any(&touches),
            Err(WatchError::Lagged(_)) => true,
            Err(WatchError::Closed) => return,
        };
        if out.strong_count() == 0 {
            return;
        }
        if recompute && !publish(store.view(&compute)) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_api::{ManagerStatus, Node};
    use shoal_store::{ActionKind, Changes};

    fn manager(id: &str, addr: &str, reach: Reachability) -> Node {
        Node {
            id: id.into(),
            manager_status: Some(ManagerStatus {
                raft_id: 1,
                addr: addr.into(),
                leader: false,
                reachability: reach as i32,
            }),
            ..Default::default()
        }
    }

    fn addrs(peers: &[WeightedPeer]) -> Vec<&str> {
        peers.iter().map(|p| p.peer.as_ref().unwrap().addr.as_str()).collect()
    }

    #[test]
    fn lists_reachable_managers_and_this_one_sorted_without_duplicates() {
        let store = MemoryStore::default();
        let mut c = Changes::new();
        c.create(manager("m3", "10.0.0.3:4242", Reachability::Reachable))
            .create(manager("m1", "10.0.0.1:4242", Reachability::Unknown))
            .create(manager("m2", "10.0.0.2:4242", Reachability::Unreachable))
            .create(manager("m4", "", Reachability::Reachable))
            .create(Node { id: "worker".into(), ..Default::default() });
        store.apply(1, c.actions()).unwrap();
        let peers = store.view(|t| manager_peers(t, "10.0.0.1:4242"));
        assert_eq!(addrs(&peers), vec!["10.0.0.1:4242", "10.0.0.3:4242"]);
        assert!(peers.iter().all(|p| p.weight == MANAGER_WEIGHT));
        assert_eq!(peers[0].peer.as_ref().unwrap().node_id, "m1", "the node's entry is kept, not the bare address");
        let with_own = store.view(|t| manager_peers(t, "10.0.0.9:4242"));
        assert_eq!(addrs(&with_own), vec!["10.0.0.1:4242", "10.0.0.3:4242", "10.0.0.9:4242"]);
        assert!(store.view(|t| manager_peers(t, "")).len() == 2);
    }

    #[test]
    fn only_changes_of_manager_statuses_touch_the_list() {
        let m = manager("m1", "10.0.0.1:4242", Reachability::Reachable);
        let created = Change { kind: ActionKind::Create, object: Object::Node(Arc::new(m.clone())), old: None };
        assert!(touches_managers(&created));
        let worker = Node { id: "w".into(), ..Default::default() };
        let worker_created = Change { kind: ActionKind::Create, object: Object::Node(Arc::new(worker)), old: None };
        assert!(!touches_managers(&worker_created));
        // A heartbeat-style update (status, description) of a manager leaves the list alone.
        let mut same = m.clone();
        same.description = Some(Default::default());
        let update = |new: Node| Change {
            kind: ActionKind::Update,
            object: Object::Node(Arc::new(new)),
            old: Some(Object::Node(Arc::new(m.clone()))),
        };
        assert!(!touches_managers(&update(same)));
        let unreachable = manager("m1", "10.0.0.1:4242", Reachability::Unreachable);
        assert!(touches_managers(&update(unreachable)));
        let demoted = Node { manager_status: None, ..m.clone() };
        assert!(touches_managers(&update(demoted)));
        let removed = Change { kind: ActionKind::Remove, object: Object::Node(Arc::new(m.clone())), old: None };
        assert!(touches_managers(&removed));
    }

    #[tokio::test]
    async fn the_watcher_follows_the_store_and_stops_with_its_holder() {
        let store = Arc::new(MemoryStore::default());
        let tx = Arc::new(watch::channel(Arc::new(SessionInfo::default())).0);
        let mut rx = tx.subscribe();
        let task = tokio::spawn(run_session_info(store.clone(), "10.0.0.9:4242".into(), Arc::downgrade(&tx)));
        rx.changed().await.unwrap();
        assert_eq!(addrs(&rx.borrow_and_update().managers), vec!["10.0.0.9:4242"]);
        store
            .apply(1, Changes::new().create(manager("m1", "10.0.0.1:4242", Reachability::Reachable)).actions())
            .unwrap();
        rx.changed().await.unwrap();
        assert_eq!(addrs(&rx.borrow_and_update().managers), vec!["10.0.0.1:4242", "10.0.0.9:4242"]);
        let mut down = store.view(|t| (**t.nodes().get("m1").unwrap()).clone());
        down.manager_status.as_mut().unwrap().reachability = Reachability::Unreachable as i32;
        store.apply(2, Changes::new().update(down).actions()).unwrap();
        rx.changed().await.unwrap();
        assert_eq!(addrs(&rx.borrow_and_update().managers), vec!["10.0.0.9:4242"]);
        // The cluster's network keys: created, then rotated.
        let key = |t: u64| shoal_api::EncryptionKey {
            lamport_time: t,
            key: vec![u8::try_from(t).unwrap(); 16],
            ..Default::default()
        };
        let mut cluster =
            shoal_api::Cluster { id: "c1".into(), network_bootstrap_keys: vec![key(1)], ..Default::default() };
        store.apply(3, Changes::new().create(cluster.clone()).actions()).unwrap();
        rx.changed().await.unwrap();
        assert_eq!(rx.borrow_and_update().network_bootstrap_keys, vec![key(1)]);
        cluster.meta = store.view(|t| t.clusters().get("c1").unwrap().meta);
        cluster.network_bootstrap_keys = vec![key(1), key(2)];
        store.apply(4, Changes::new().update(cluster).actions()).unwrap();
        rx.changed().await.unwrap();
        assert_eq!(rx.borrow_and_update().network_bootstrap_keys, vec![key(1), key(2)]);
        drop(tx);
        store.apply(5, Changes::new().create(Node { id: "w".into(), ..Default::default() }).actions()).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(10), task).await.expect("the watcher ends").unwrap();
    }
}
