//! `Fanout`: one watcher of the store for all of a dispatcher's agent streams. A router task receives every
//! commit once and hands each node only the changes that concern it (its node object; tasks assigned to
//! it now or before the change; cluster volumes published to it now or before), so a commit costs O(its
//! changes), not O(open streams). Without it every stream watched the store itself, and N agents
//! registering (N commits) cost N^2 wake-ups: with 10k simulated nodes the manager spent minutes of CPU on
//! registration alone.
//!
//! Same contract as `MemoryStore::view_and_watch`: `view_and_watch` subscribes before it reads, and every
//! commit after the view is delivered, none before (routed commits at or below the view's index are
//! skipped). A subscriber whose queue is full, or a router that lags behind the store, makes the
//! subscriber's next `recv` return `Lagged`: it must read a fresh view.
//!
//! Bounds: each subscriber queues at most `NODE_QUEUE_COMMITS` routed commits. Must not depend on the
//! dispatcher's RPCs or on IO other than the store.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use shoal_store::{Change, MemoryStore, Object, Tables, Watch, WatchError};
use tokio::sync::mpsc;

/// Most routed commits queued for one subscriber before it is told it lagged.
pub(crate) const NODE_QUEUE_COMMITS: usize = 256;

/// What the router hands a subscriber.
enum Routed {
    /// The changes of one commit that concern the subscriber's node.
    Commit { index: u64, changes: Vec<Change> },
    /// Commits were lost (the router lagged behind the store): read a fresh view.
    Lagged,
}

struct Subscriber {
    id: u64,
    tx: mpsc::Sender<Routed>,
    lagged: Arc<AtomicBool>,
}

#[derive(Default)]
struct Routes {
    by_node: HashMap<String, Vec<Subscriber>>,
    next_id: u64,
    router_running: bool,
}

/// The per-dispatcher router of store commits to node streams.
pub(crate) struct Fanout {
    store: Arc<MemoryStore>,
    routes: Arc<Mutex<Routes>>,
}

impl std::fmt::Debug for Fanout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fanout").field("nodes", &self.routes.lock().by_node.len()).finish()
    }
}

/// Why `NodeWatch::recv` returned no changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeWatchError {
    /// Changes were dropped: read a fresh view (`Fanout::view_and_watch` again).
    Lagged,
    /// The store's watch queue closed.
    Closed,
}

/// One node's stream of changes. Dropping it unsubscribes.
pub(crate) struct NodeWatch {
    rx: mpsc::Receiver<Routed>,
    lagged: Arc<AtomicBool>,
    after_index: u64,
    node_id: String,
    id: u64,
    routes: Weak<Mutex<Routes>>,
}

/// The nodes a change concerns: a node object's own ID; a task's node, and its previous node if it moved; the
/// nodes a cluster volume is (or was, before the change) published to. Each at most once; only a volume's
/// change (rare) allocates.
fn for_nodes_of<'a>(ch: &'a Change, mut f: impl FnMut(&'a str)) {
    match (&ch.object, &ch.old) {
        (Object::Node(n), _) => f(n.id.as_str()),
        (Object::Task(t), old) => {
            if !t.node_id.is_empty() {
                f(t.node_id.as_str());
            }
            if let Some(Object::Task(o)) = old {
                if !o.node_id.is_empty() && o.node_id != t.node_id {
                    f(o.node_id.as_str());
                }
            }
        }
        (Object::Volume(v), old) => {
            let mut nodes: Vec<&str> = v.publish_status.iter().map(|s| s.node_id.as_str()).collect();
            if let Some(Object::Volume(o)) = old {
                nodes.extend(o.publish_status.iter().map(|s| s.node_id.as_str()));
            }
            nodes.sort_unstable();
            nodes.dedup();
            nodes.into_iter().for_each(f);
        }
        _ => {}
    }
}

/// `for_nodes_of`, collected, for the assignment tests.
#[cfg(test)]
pub(super) fn nodes_of_for_tests(ch: &Change) -> Vec<&str> {
    let mut out = Vec::new();
    for_nodes_of(ch, |n| out.push(n));
    out
}

impl Fanout {
    /// A fanout over `store`; the router starts with the first subscriber.
    pub(crate) fn new(store: Arc<MemoryStore>) -> Fanout {
        Fanout { store, routes: Arc::new(Mutex::new(Routes::default())) }
    }

    /// Subscribes to the changes that concern `node_id`, then runs `f` on a view: every commit after the
    /// view is delivered by the returned watch, none before. Must be called within a tokio runtime.
    pub(crate) fn view_and_watch<R>(&self, node_id: &str, f: impl FnOnce(&Tables) -> R) -> (R, NodeWatch) {
        let (tx, rx) = mpsc::channel(NODE_QUEUE_COMMITS);
        let lagged = Arc::new(AtomicBool::new(false));
        let id = {
            let mut routes = self.routes.lock();
            if !routes.router_running {
                routes.router_running = true;
                // Subscribed under the lock, before any subscriber registers: nothing falls between.
                let watch = self.store.watch();
                tokio::spawn(route(watch, Arc::downgrade(&self.routes)));
            }
            routes.next_id += 1;
            let id = routes.next_id;
            routes.by_node.entry(node_id.to_string()).or_default().push(Subscriber { id, tx, lagged: lagged.clone() });
            id
        };
        let (value, after_index) = self.store.view(|t| (f(t), t.last_index()));
        let watch = NodeWatch {
            rx,
            lagged,
            after_index,
            node_id: node_id.to_string(),
            id,
            routes: Arc::downgrade(&self.routes),
        };
        (value, watch)
    }
}

impl NodeWatch {
    fn accept(&mut self, r: Routed) -> Option<Result<Vec<Change>, NodeWatchError>> {
        if self.lagged.swap(false, Ordering::SeqCst) {
            while self.rx.try_recv().is_ok() {}
            return Some(Err(NodeWatchError::Lagged));
        }
        match r {
            Routed::Lagged => Some(Err(NodeWatchError::Lagged)),
            Routed::Commit { index, .. } if index <= self.after_index => None,
            Routed::Commit { changes, .. } => Some(Ok(changes)),
        }
    }

    /// The next commit's changes for this node.
    pub(crate) async fn recv(&mut self) -> Result<Vec<Change>, NodeWatchError> {
        loop {
            let Some(r) = self.rx.recv().await else { return Err(NodeWatchError::Closed) };
            if let Some(out) = self.accept(r) {
                return out;
            }
        }
    }

    /// A commit's changes already queued, without waiting; `None` when nothing is queued.
    pub(crate) fn try_recv(&mut self) -> Option<Result<Vec<Change>, NodeWatchError>> {
        loop {
            match self.rx.try_recv() {
                Ok(r) => {
                    if let Some(out) = self.accept(r) {
                        return Some(out);
                    }
                }
                Err(mpsc::error::TryRecvError::Empty) => return None,
                Err(mpsc::error::TryRecvError::Disconnected) => return Some(Err(NodeWatchError::Closed)),
            }
        }
    }
}

impl Drop for NodeWatch {
    fn drop(&mut self) {
        let Some(routes) = self.routes.upgrade() else { return };
        let mut routes = routes.lock();
        if let Some(subs) = routes.by_node.get_mut(&self.node_id) {
            subs.retain(|s| s.id != self.id);
            if subs.is_empty() {
                routes.by_node.remove(&self.node_id);
            }
        }
    }
}

/// Tells a subscriber it missed changes (a marker if there is room, else the flag it checks).
fn mark_lagged(s: &Subscriber) {
    s.lagged.store(true, Ordering::SeqCst);
    let _ = s.tx.try_send(Routed::Lagged);
}

/// The router: one store watcher, commits split by node. Ends when the fanout is dropped or the store's
/// queue closes.
async fn route(mut watch: Watch, routes: Weak<Mutex<Routes>>) {
    loop {
        let received = watch.recv().await;
        let Some(routes) = routes.upgrade() else { return };
        match received {
            Ok(commit) => {
                let mut per_node: HashMap<&str, Vec<Change>> = HashMap::new();
                for ch in &commit.changes {
                    for_nodes_of(ch, |node| per_node.entry(node).or_default().push(ch.clone()));
                }
                let routes = routes.lock();
                for (node, changes) in per_node {
                    let Some(subs) = routes.by_node.get(node) else { continue };
                    for s in subs {
                        let msg = Routed::Commit { index: commit.index, changes: changes.clone() };
                        if let Err(mpsc::error::TrySendError::Full(_)) = s.tx.try_send(msg) {
                            mark_lagged(s);
                        }
                    }
                }
            }
            Err(WatchError::Lagged(_)) => {
                let routes = routes.lock();
                routes.by_node.values().flatten().for_each(mark_lagged);
            }
            Err(WatchError::Closed) => {
                let mut routes = routes.lock();
                routes.by_node.clear();
                routes.router_running = false;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_api::{Node, Task, TaskState, TaskStatus};
    use shoal_store::Changes;

    fn task(id: &str, node: &str) -> Task {
        Task {
            id: id.into(),
            node_id: node.into(),
            status: Some(TaskStatus { state: TaskState::Assigned as i32, ..Default::default() }),
            ..Default::default()
        }
    }

    fn ids(changes: &[Change]) -> Vec<String> {
        changes.iter().map(|c| c.object.id().to_string()).collect()
    }

    #[tokio::test]
    async fn routes_each_change_to_the_nodes_it_concerns_only() {
        let store = Arc::new(MemoryStore::default());
        let fanout = Fanout::new(store.clone());
        let (_, mut n1) = fanout.view_and_watch("n1", |_| ());
        let (_, mut n2) = fanout.view_and_watch("n2", |_| ());
        let mut c = Changes::new();
        c.create(task("a", "n1")).create(task("b", "n2")).create(Node { id: "n1".into(), ..Default::default() });
        store.apply(1, c.actions()).unwrap();
        assert_eq!(ids(&n1.recv().await.unwrap()), vec!["a", "n1"]);
        assert_eq!(ids(&n2.recv().await.unwrap()), vec!["b"]);

        // A task moving from n1 to n2 concerns both.
        let mut moved = store.view(|t| (**t.tasks().get("a").unwrap()).clone());
        moved.node_id = "n2".into();
        store.apply(2, Changes::new().update(moved).actions()).unwrap();
        assert_eq!(ids(&n1.recv().await.unwrap()), vec!["a"]);
        assert_eq!(ids(&n2.recv().await.unwrap()), vec!["a"]);
        assert!(n1.try_recv().is_none());
    }

    #[tokio::test]
    async fn commits_in_the_view_are_not_delivered_again() {
        let store = Arc::new(MemoryStore::default());
        let fanout = Fanout::new(store.clone());
        // Start the router, then write while a second subscriber registers and reads.
        let (_, _other) = fanout.view_and_watch("n9", |_| ());
        store.apply(1, Changes::new().create(task("a", "n1")).actions()).unwrap();
        let (seen, mut w) = fanout.view_and_watch("n1", |t| t.tasks().by_node("n1").count());
        assert_eq!(seen, 1);
        store.apply(2, Changes::new().create(task("b", "n1")).actions()).unwrap();
        assert_eq!(ids(&w.recv().await.unwrap()), vec!["b"]);
    }

    #[tokio::test]
    async fn a_full_queue_reports_lagged_then_recovers_with_a_new_view() {
        let store = Arc::new(MemoryStore::default());
        let fanout = Fanout::new(store.clone());
        let (_, mut w) = fanout.view_and_watch("n1", |_| ());
        for i in 0..(NODE_QUEUE_COMMITS as u64 + 10) {
            store.apply(i + 1, Changes::new().create(task(&format!("t{i}"), "n1")).actions()).unwrap();
        }
        // Let the router run without consuming anything: the queue fills and the overflow is flagged.
        for _ in 0..10_000 {
            if w.lagged.load(Ordering::SeqCst) {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(
            w.recv().await.unwrap_err(),
            NodeWatchError::Lagged,
            "a lag is reported before anything after the gap"
        );
        drop(w);
        let (count, mut w) = fanout.view_and_watch("n1", |t| t.tasks().by_node("n1").count());
        assert_eq!(count, NODE_QUEUE_COMMITS + 10);
        store.apply(10_000, Changes::new().create(task("late", "n1")).actions()).unwrap();
        assert_eq!(ids(&w.recv().await.unwrap()), vec!["late"]);
    }

    #[tokio::test]
    async fn dropping_a_watch_unsubscribes() {
        let store = Arc::new(MemoryStore::default());
        let fanout = Fanout::new(store.clone());
        let (_, w) = fanout.view_and_watch("n1", |_| ());
        assert_eq!(fanout.routes.lock().by_node.len(), 1);
        drop(w);
        assert!(fanout.routes.lock().by_node.is_empty());
    }
}
