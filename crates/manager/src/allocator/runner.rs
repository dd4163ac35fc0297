//! The allocator's async loop: builds its pools from the view it subscribes with (`view_and_watch`, so on
//! every leadership gain it starts from the replicated state), allocates what that view needs, then reacts
//! to commits. As the scheduler's loop, it keeps its pools in step with the view a pass reads by taking every
//! queued commit inside the view; a lagged watch or a failed write rebuilds them from the next view (a write
//! that failed may have held addresses in memory only).
//!
//! What a commit asks for: a service written (its endpoint may need allocating), a task written NEW (its
//! attachments), a task placed, ended or removed (its node's own attachments: `nodes_to_revisit`), and, while some task
//! waits for capacity, anything that freed an address or a port (every NEW task is looked at again). Bounds: at most
//! `MAX_TRACKED_IDS` IDs are tracked one by one (past that a pass looks at everything), writes carry at most
//! `MAX_ACTIONS_PER_WRITE` actions and `MAX_BYTES_PER_WRITE` bytes, and after a failed write the loop waits for the
//! next commit before trying again.
//!
//! Must not depend on other subsystems; only on `ClusterState`.

use std::collections::BTreeSet;

use shoal_store::{ActionKind, Changes, Commit, Object, Watch, WatchError};
use tokio::sync::broadcast::error::TryRecvError;
use tokio::sync::watch;

use super::core::{nodes_to_revisit, Allocator};
use crate::state::ClusterState;
use crate::subsystem::{stopped, Subsystem, SubsystemFuture};
use crate::tasks::observed_state;
use crate::write::{chunk_actions, MAX_ACTIONS_PER_WRITE};

/// Most service or task IDs tracked one by one before a pass looks at every service and NEW task.
pub(super) const MAX_TRACKED_IDS: usize = 10_000;

/// The allocator subsystem.
#[derive(Debug, Default)]
pub(crate) struct AllocatorLoop;

impl Subsystem for AllocatorLoop {
    fn name(&self) -> &'static str {
        "allocator"
    }

    fn run(&self, state: ClusterState, stop: watch::Receiver<bool>) -> SubsystemFuture {
        Box::pin(run(state, stop))
    }
}

#[derive(Default)]
struct Work {
    services: BTreeSet<String>,
    /// Nodes whose own attachments (ingress, and the networks of their tasks) may need allocating or freeing.
    nodes: BTreeSet<String>,
    tasks: BTreeSet<String>,
    all: bool,
    /// The last pass left a task waiting for capacity.
    blocked: bool,
    /// The pools miss commits (lagged watch, failed write): rebuild from the next view.
    stale: bool,
}

impl Work {
    fn is_empty(&self) -> bool {
        !self.all && self.services.is_empty() && self.tasks.is_empty() && self.nodes.is_empty()
    }

    fn note(&mut self, alloc: &mut Allocator, commit: &Commit) {
        for ch in &commit.changes {
            // A network removed: every node's attachment to it goes (the ingress network's, or one a node
            // still holds for tasks that ended).
            let network_gone = ch.kind == ActionKind::Remove && matches!(&ch.object, Object::Network(_));
            if alloc.apply(ch) && self.blocked {
                self.all = true;
            }
            if network_gone {
                self.all = true;
            }
            if !self.all {
                // A task placed, ended or removed: its node's own attachments may change.
                self.nodes.extend(nodes_to_revisit(ch));
            }
            if ch.kind == ActionKind::Remove || self.all {
                continue;
            }
            match &ch.object {
                Object::Service(s) => {
                    self.services.insert(s.id.clone());
                }
                Object::Task(t) if observed_state(t) == shoal_api::TaskState::New => {
                    self.tasks.insert(t.id.clone());
                }
                Object::Node(n) => {
                    self.nodes.insert(n.id.clone());
                }
                // A new ingress network: every node gets an address on it.
                Object::Network(n) if alloc.ingress() == Some(n.id.as_str()) => self.all = true,
                _ => {}
            }
            if self.services.len() + self.tasks.len() + self.nodes.len() > MAX_TRACKED_IDS {
                self.all = true;
            }
        }
        if self.all {
            self.services.clear();
            self.tasks.clear();
            self.nodes.clear();
        }
    }

    /// Takes one received commit; false when the watch is closed.
    fn receive(&mut self, alloc: &mut Allocator, r: Result<std::sync::Arc<Commit>, WatchError>) -> bool {
        match r {
            Ok(c) => {
                self.note(alloc, &c);
                true
            }
            Err(WatchError::Lagged(n)) => {
                tracing::warn!(missed = n, "allocator watch lagged; rebuilding its pools from the store");
                self.stale = true;
                self.all = true;
                true
            }
            Err(WatchError::Closed) => false,
        }
    }
}

/// Writes the predefined networks a cluster lacks (one made before they existed); a failure is logged and
/// the next leader tries again.
async fn ensure_predefined_networks(state: &ClusterState) {
    let now = state.now();
    let written = state
        .write(|t, c| {
            for n in super::predefined::missing_predefined_networks(t, state.ids.as_ref(), now) {
                c.create(n);
            }
            Ok::<_, std::convert::Infallible>(())
        })
        .await;
    if let Err(e) = written {
        tracing::warn!("cannot write the predefined networks (host, bridge): {e}");
    }
}

async fn run(state: ClusterState, mut stop: watch::Receiver<bool>) {
    ensure_predefined_networks(&state).await;
    let (alloc, mut events) = state.store.view_and_watch(Allocator::build);
    let mut alloc = alloc;
    let mut work = Work { all: true, ..Default::default() };
    loop {
        if !work.is_empty() {
            match pass(&state, &mut alloc, &mut work, &mut events).await {
                None => return,
                Some(true) => {}
                // A write failed: wait for the next commit before trying again.
                Some(false) => {
                    tokio::select! {
                        _ = stopped(&mut stop) => return,
                        r = events.recv() => if !work.receive(&mut alloc, r) { return },
                    }
                }
            }
        }
        while work.is_empty() {
            tokio::select! {
                _ = stopped(&mut stop) => return,
                r = events.recv() => if !work.receive(&mut alloc, r) { return },
            }
        }
    }
}

/// One pass and its writes. `None` when the watch closed; `Some(false)` when a write failed.
async fn pass(state: &ClusterState, alloc: &mut Allocator, work: &mut Work, events: &mut Watch) -> Option<bool> {
    let now = state.now();
    let decided = state.store.view(|t| {
        // Every commit up to this view is queued (the store publishes before releasing its write lock).
        loop {
            let r = match events.try_recv() {
                Ok(c) => Ok(c),
                Err(TryRecvError::Lagged(n)) => Err(WatchError::Lagged(n)),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Closed) => return None,
            };
            if !work.receive(alloc, r) {
                return None;
            }
        }
        if work.stale {
            *alloc = Allocator::build(t);
            work.stale = false;
        }
        let all = std::mem::take(&mut work.all);
        let services =
            if all { t.services().iter().map(|s| s.id.clone()).collect() } else { std::mem::take(&mut work.services) };
        let tasks = std::mem::take(&mut work.tasks);
        let nodes = std::mem::take(&mut work.nodes);
        let mut out = alloc.pass(t, &services, &tasks, all, now);
        alloc.allocate_nodes(t, &nodes, all, &mut out);
        Some(out)
    })?;
    work.blocked = decided.blocked;
    let mut ok = true;
    let mut services = Changes::new();
    for s in decided.services {
        services.update(s);
    }
    let mut tasks = Changes::new();
    for t in decided.tasks {
        tasks.update(t);
    }
    let mut nodes = Changes::new();
    for n in decided.nodes {
        nodes.update(n);
    }
    // Services first: the tasks carry their endpoints.
    'writes: for list in [services, tasks, nodes] {
        for chunk in chunk_actions(list.into_actions(), MAX_ACTIONS_PER_WRITE) {
            if let Err(e) = state.proposer.propose(chunk).await {
                tracing::debug!(error = %e, "allocator write failed; rebuilding from the store");
                ok = false;
                break 'writes;
            }
        }
    }
    if !ok {
        work.stale = true;
        work.all = true;
    }
    Some(ok)
}
