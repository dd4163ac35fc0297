//! The scheduler's async loop: subscribes and reads (`view_and_watch`, which also builds its `NodeSet`),
//! places every pending task, then reacts to commits. Every commit received is applied to the node set and
//! noted: new or updated PENDING tasks are scheduled by ID; any node change, and (while some task could not
//! be placed) any task that stops or leaves a node, makes it look at every pending task.
//!
//! The node set is in step with the view a pass reads: inside the view (read lock held, so no commit lands)
//! the loop first takes every commit still queued, which is every commit up to the view because the store
//! publishes a commit before it releases the write lock (and publishes none for a write that changed
//! nothing). If the watch lagged, the set is rebuilt from that view and every pending task is looked at.
//!
//! Batching without a timer: after an event that gives it work, it takes every commit already queued (at most
//! `MAX_EVENTS_PER_BATCH`, outside the view; the rest inside it) and runs a pass at once; commits that arrive
//! during a pass make the next batch. A burst is thus batched by the pass's own duration, and a lone write is
//! placed without waiting. Bounds: more than `MAX_TRACKED_IDS` pending IDs turn into one pass over the PENDING
//! index; writes carry at most `write::MAX_ACTIONS_PER_WRITE` actions; conflicting writes are retried at most
//! `MAX_ATTEMPTS` times per pass, then by the next pass (which runs at once: a task whose write failed is
//! never dropped); after any other failure the loop pauses `BACKOFF_MS` before that pass.
//!
//! Must not depend on other subsystems; only on `ClusterState`.

use std::collections::BTreeSet;
use std::sync::Arc;

use shoal_store::{ActionKind, Change, Commit, Object, Tables, Watch, WatchError};
use tokio::sync::broadcast::error::TryRecvError;
use tokio::sync::watch;

use super::{is_schedulable, NodeSet, PendingTasks, Scheduler};
use crate::state::ClusterState;
use crate::subsystem::{stopped, Subsystem, SubsystemFuture};
use crate::tasks::observed_state;
use crate::write::{is_conflict, propose_grouped, MAX_ACTIONS_PER_WRITE};

/// Most commits collected before a pass.
pub(super) const MAX_EVENTS_PER_BATCH: usize = 10_000;
/// Most task IDs tracked one by one; past that the pass reads the PENDING index.
pub(super) const MAX_TRACKED_IDS: usize = 10_000;
/// Most write attempts per pass; tasks whose writes still conflict go to the next pass.
pub(crate) const MAX_ATTEMPTS: u32 = 3;
/// Pause after a write failed for a reason other than a conflict (e.g. lost leadership), in ms.
const BACKOFF_MS: u64 = 100;

/// The scheduler subsystem.
#[derive(Debug, Default)]
pub(crate) struct SchedulerLoop;

impl Subsystem for SchedulerLoop {
    fn name(&self) -> &'static str {
        "scheduler"
    }

    fn run(&self, state: ClusterState, stop: watch::Receiver<bool>) -> SubsystemFuture {
        Box::pin(run(state, stop))
    }
}

/// What the next pass should look at.
#[derive(Default)]
struct Wanted {
    all: bool,
    ids: BTreeSet<String>,
}

impl Wanted {
    fn is_empty(&self) -> bool {
        !self.all && self.ids.is_empty()
    }

    fn take(&mut self) -> PendingTasks {
        let all = std::mem::take(&mut self.all);
        let ids = std::mem::take(&mut self.ids);
        if all {
            PendingTasks::All
        } else {
            PendingTasks::Only(ids)
        }
    }

    /// Tasks whose write failed: looked at again by the next pass (those no longer PENDING are skipped).
    fn retry(&mut self, ids: impl IntoIterator<Item = String>) {
        if !self.all {
            self.ids.extend(ids);
            if self.ids.len() > MAX_TRACKED_IDS {
                self.all = true;
                self.ids.clear();
            }
        }
    }

    fn note(&mut self, ch: &Change, unplaced: bool) {
        match &ch.object {
            Object::Node(_) => self.all = true,
            // A volume created, made active or released may let a waiting task use it.
            Object::Volume(_) if unplaced => self.all = true,
            Object::Task(t) => {
                if ch.kind != ActionKind::Remove && is_schedulable(t) {
                    self.ids.insert(t.id.clone());
                    if self.ids.len() > MAX_TRACKED_IDS {
                        self.all = true;
                        self.ids.clear();
                    }
                }
                if unplaced {
                    // Resources free up when a task stops or leaves its node.
                    let held = |t: &shoal_api::Task| !t.node_id.is_empty() && !observed_state(t).is_terminal();
                    let was_held = matches!(&ch.old, Some(Object::Task(o)) if held(o));
                    let freed = match ch.kind {
                        ActionKind::Remove => was_held,
                        _ => was_held && !held(t),
                    };
                    if freed {
                        self.all = true;
                    }
                }
            }
            _ => {}
        }
    }
}

/// What the loop keeps between passes: the node set, what the next pass should look at, and whether the
/// last pass left a task unplaced.
struct Memory {
    nodes: NodeSet,
    wanted: Wanted,
    unplaced: bool,
    /// The watch lagged: `nodes` misses commits and is rebuilt from the next view.
    stale: bool,
}

impl Memory {
    /// Takes one received commit into account; false when the watch is closed.
    fn receive(&mut self, r: Result<Arc<Commit>, WatchError>) -> bool {
        match r {
            Ok(commit) => {
                self.nodes.apply(&commit);
                for ch in &commit.changes {
                    self.wanted.note(ch, self.unplaced);
                }
                true
            }
            Err(WatchError::Lagged(n)) => {
                let msg = "scheduler watch lagged; rebuilding the node set, looking at all pending tasks";
                tracing::warn!(missed = n, "{msg}");
                self.wanted.all = true;
                self.stale = true;
                true
            }
            Err(WatchError::Closed) => false,
        }
    }

    /// Takes the commits already queued, at most `limit`; false when the watch is closed.
    fn receive_queued(&mut self, events: &mut Watch, limit: usize) -> bool {
        for _ in 0..limit {
            let r = match events.try_recv() {
                Ok(commit) => Ok(commit),
                Err(TryRecvError::Lagged(n)) => Err(WatchError::Lagged(n)),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Closed) => return false,
            };
            if !self.receive(r) {
                return false;
            }
        }
        true
    }

    /// Inside a view: takes every commit still queued (the store publishes a commit before it releases the
    /// write lock, so the queue now holds every commit up to the view), and rebuilds the node set from the
    /// view if the watch lagged. Then `nodes` matches `tables`. False when the watch is closed.
    fn catch_up(&mut self, events: &mut Watch, tables: &Tables) -> bool {
        // The queue is bounded (the store's watch capacity), and no commit can land during the view.
        if !self.receive_queued(events, usize::MAX) {
            return false;
        }
        if self.stale {
            self.nodes = NodeSet::build(tables);
            self.stale = false;
        }
        true
    }
}

async fn run(state: ClusterState, mut stop: watch::Receiver<bool>) {
    let (nodes, mut events) = state.store.view_and_watch(NodeSet::build);
    let mut scheduler = Scheduler::new();
    let mut mem = Memory { nodes, wanted: Wanted { all: true, ..Default::default() }, unplaced: false, stale: false };
    loop {
        if !mem.wanted.is_empty() && !pass(&state, &mut scheduler, &mut mem, &mut events).await {
            return;
        }
        // Wait for an event that gives work, then take what is already queued, and run a pass.
        while mem.wanted.is_empty() {
            tokio::select! {
                biased;
                _ = stopped(&mut stop) => return,
                r = events.recv() => if !mem.receive(r) { return },
            }
        }
        if !mem.receive_queued(&mut events, MAX_EVENTS_PER_BATCH) {
            return;
        }
    }
}

/// One pass plus its writes; sets `mem.unplaced`. False when the watch is closed.
async fn pass(state: &ClusterState, scheduler: &mut Scheduler, mem: &mut Memory, events: &mut Watch) -> bool {
    let mut retry: Option<BTreeSet<String>> = None;
    for _ in 0..MAX_ATTEMPTS {
        let now = state.clock.now_unix_ms();
        let result = state.store.view(|t| {
            if !mem.catch_up(events, t) {
                return None;
            }
            // What the caught-up commits ask for joins this pass (they are not seen again).
            let mut tasks = mem.wanted.take();
            if let (PendingTasks::Only(ids), Some(failed)) = (&mut tasks, retry.take()) {
                ids.extend(failed);
            }
            Some(scheduler.schedule(t, &mut mem.nodes, &tasks, now))
        });
        let Some(result) = result else { return false };
        mem.unplaced = result.unplaced > 0;
        mem.wanted.retry(result.deferred.iter().cloned());
        if result.changes.is_empty() && result.volume_changes.is_empty() {
            return true;
        }
        tracing::debug!(assigned = result.assigned, unplaced = result.unplaced, "scheduling pass");
        // Each group is keyed by the tasks it places (to look at again if its write fails).
        let mut groups: Vec<(Vec<String>, shoal_store::Changes)> = result
            .changes
            .into_actions()
            .into_iter()
            .map(|a| (vec![a.object.id().to_string()], shoal_store::Changes::from(vec![a])))
            .collect();
        if !result.volume_changes.is_empty() {
            // The tasks placed with cluster volumes and those volumes: one write (bounded by the volumes'
            // rarity; a write over `MAX_ACTIONS_PER_WRITE` is split, and a conflict in any part retries them).
            groups.push((result.volume_tasks, result.volume_changes));
        }
        let failed = propose_grouped(state, groups, MAX_ACTIONS_PER_WRITE).await;
        if failed.is_empty() {
            return true;
        }
        if failed.iter().any(|(_, e)| !is_conflict(e)) {
            // Not a conflict (leadership lost, no quorum): a pause, then the next pass tries them again.
            tracing::debug!("scheduler write failed; retrying after {BACKOFF_MS} ms");
            mem.wanted.retry(failed.into_iter().flat_map(|(ids, _)| ids));
            state.sleep_ms(BACKOFF_MS).await;
            return true;
        }
        retry = Some(failed.into_iter().flat_map(|(ids, _)| ids).collect());
    }
    // Still conflicting: the next pass tries them again. No later event would bring them back: the commits
    // they conflicted with are already taken in (found by the simulation, `shoal-sim`).
    if let Some(ids) = retry {
        mem.wanted.retry(ids);
    }
    true
}
