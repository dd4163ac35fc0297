//! The scheduler's async loop: subscribes and reads (`view_and_watch`), places every pending task, then
//! reacts to commits. New or updated PENDING tasks are scheduled by ID; any node change, and (while some
//! task could not be placed) any task that stops or leaves a node, makes it look at every pending task.
//!
//! Batching without a timer: after an event that gives it work, it takes every commit already queued (at most
//! `MAX_EVENTS_PER_BATCH`) and runs a pass at once; commits that arrive during a pass make the next batch. A
//! burst is thus batched by the pass's own duration, and a lone write is placed without waiting. Bounds: more than `MAX_TRACKED_IDS` pending IDs turn into one pass over the PENDING index; writes
//! carry at most `write::MAX_ACTIONS_PER_WRITE` actions; conflicting writes are retried at most
//! `MAX_ATTEMPTS` times per pass (the next event brings the tasks back).
//!
//! Must not depend on other subsystems; only on `ClusterState`.

use std::collections::BTreeSet;

use shoal_store::{ActionKind, Change, Object, WatchError};
use tokio::sync::broadcast::error::TryRecvError;
use tokio::sync::watch;

use super::{is_schedulable, PendingTasks, Scheduler};
use crate::orchestrator::observed_state;
use crate::orchestrator::write::{is_conflict, propose_grouped, MAX_ACTIONS_PER_WRITE};
use crate::state::ClusterState;
use crate::subsystem::{stopped, Subsystem, SubsystemFuture};

/// Most commits collected before a pass.
pub const MAX_EVENTS_PER_BATCH: usize = 10_000;
/// Most task IDs tracked one by one; past that the pass reads the PENDING index.
pub const MAX_TRACKED_IDS: usize = 10_000;
/// Most write attempts per pass.
const MAX_ATTEMPTS: u32 = 3;

/// The scheduler subsystem.
#[derive(Debug, Default)]
pub struct SchedulerLoop;

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

    fn note(&mut self, ch: &Change, unplaced: bool) {
        match &ch.object {
            Object::Node(_) => self.all = true,
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

async fn run(state: ClusterState, mut stop: watch::Receiver<bool>) {
    let ((), mut events) = state.store.view_and_watch(|_| ());
    let mut scheduler = Scheduler::new();
    let mut wanted = Wanted { all: true, ..Default::default() };
    let mut unplaced = false;
    loop {
        if !wanted.is_empty() {
            unplaced = pass(&state, &mut scheduler, wanted.take()).await;
        }
        // Wait for an event that gives work, then take what is already queued, and run a pass.
        let mut seen = 0usize;
        while wanted.is_empty() {
            tokio::select! {
                _ = stopped(&mut stop) => return,
                r = events.recv() => if !note(r, &mut wanted, unplaced) { return },
            }
        }
        while seen < MAX_EVENTS_PER_BATCH {
            let r = match events.try_recv() {
                Ok(commit) => Ok(commit),
                Err(TryRecvError::Lagged(n)) => Err(WatchError::Lagged(n)),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Closed) => return,
            };
            if !note(r, &mut wanted, unplaced) {
                return;
            }
            seen += 1;
        }
    }
}

/// Notes what one received commit asks for; false when the watch is closed.
fn note(r: Result<std::sync::Arc<shoal_store::Commit>, WatchError>, wanted: &mut Wanted, unplaced: bool) -> bool {
    match r {
        Ok(commit) => {
            for ch in &commit.changes {
                wanted.note(ch, unplaced);
            }
            true
        }
        Err(WatchError::Lagged(n)) => {
            tracing::warn!(missed = n, "scheduler watch lagged; looking at every pending task");
            wanted.all = true;
            true
        }
        Err(WatchError::Closed) => false,
    }
}

/// One pass plus its writes. Returns true when some task could not be placed.
async fn pass(state: &ClusterState, scheduler: &mut Scheduler, mut tasks: PendingTasks) -> bool {
    let mut unplaced = false;
    for _ in 0..MAX_ATTEMPTS {
        let now = state.clock.now_unix_ms();
        let result = state.store.view(|t| scheduler.schedule(t, &tasks, now));
        unplaced = result.unplaced > 0;
        if result.changes.is_empty() {
            return unplaced;
        }
        tracing::debug!(assigned = result.assigned, unplaced = result.unplaced, "scheduling pass");
        let groups = result
            .changes
            .into_actions()
            .into_iter()
            .map(|a| (a.object.id().to_string(), shoal_store::Changes::from(vec![a])))
            .collect();
        let failed = propose_grouped(state, groups, MAX_ACTIONS_PER_WRITE).await;
        if failed.is_empty() {
            return unplaced;
        }
        if failed.iter().any(|(_, e)| !is_conflict(e)) {
            tracing::debug!("scheduler write failed; will retry on the next event");
            return unplaced;
        }
        tasks = PendingTasks::Only(failed.into_iter().map(|(id, _)| id).collect());
    }
    unplaced
}
