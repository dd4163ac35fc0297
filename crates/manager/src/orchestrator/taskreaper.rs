//! The task reaper: deletes tasks the cluster no longer needs.
//!
//! - Tasks with desired REMOVE (scale-down, service removal), once they stopped: observed state terminal,
//!   or never assigned (no node, or observed < ASSIGNED).
//! - Tasks whose service no longer exists, once they are not running (same test). Network attachment tasks
//!   (no service; `resourceapi`) are never reaped: `DetachNetwork` removes them.
//! - History: at most `task_history_retention_limit` tasks per (service, slot), and per (service, node) for
//!   a global service (all its tasks have slot 0) (from the cluster object's
//!   `spec.orchestration`; 0/unset or no cluster: `DEFAULT_RETENTION_LIMIT`; negative: no history is kept).
//!   The oldest tasks that are done go first: desired past RUNNING and observed terminal (or never
//!   assigned). A task still meant to run, or still running, is never deleted, nor a job's task that
//!   completed in the job's current iteration (the jobs orchestrator counts those).
//!
//! The core is `reap(tables, keys)`; the loop (`TaskReaper`) collects the slots touched by task commits and
//! flushes every `FLUSH_AFTER_MS` or `MAX_DIRTY_SLOTS` slots, whichever comes first. It reads the whole task
//! table once at start. Must not depend on other subsystems.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use shoal_api::{Task, TaskState};
use shoal_store::{ActionKind, Changes, Object, Tables, WatchError};
use tokio::sync::watch;

use super::{history_key, observed_state};
use crate::state::ClusterState;
use crate::subsystem::{stopped, Subsystem, SubsystemFuture};
use crate::write::{is_conflict, propose_grouped, MAX_ACTIONS_PER_WRITE};

/// History kept per slot when the cluster sets none (SwarmKit's default).
pub(crate) const DEFAULT_RETENTION_LIMIT: usize = 5;
/// The reaper flushes collected slots at most this long after the first one.
pub(crate) const FLUSH_AFTER_MS: u64 = 250;
/// The reaper flushes as soon as this many slots are collected.
pub(crate) const MAX_DIRTY_SLOTS: usize = 1000;
/// Most deletions proposed per write (also bounded by `write::MAX_ACTIONS_PER_WRITE`).
pub(crate) const MAX_DELETES_PER_WRITE: usize = MAX_ACTIONS_PER_WRITE;
/// Most attempts per flush when a deletion conflicts (a task changed or vanished meanwhile).
const MAX_ATTEMPTS: u32 = 3;

/// One slot of one service: what the reaper groups history by.
pub(crate) type SlotKey = (String, u64);

/// The retention limit in force: the cluster's `task_history_retention_limit` (0 or no cluster: the
/// default; negative: 0).
pub(crate) fn retention_limit(tables: &Tables) -> usize {
    let limit = tables
        .clusters()
        .iter()
        .next()
        .and_then(|c| c.spec.as_ref())
        .and_then(|s| s.orchestration.as_ref())
        .map(|o| o.task_history_retention_limit)
        .unwrap_or(0);
    match limit {
        0 => DEFAULT_RETENTION_LIMIT,
        n if n < 0 => 0,
        n => usize::try_from(n).unwrap_or(usize::MAX),
    }
}

/// True when the task no longer runs anywhere: observed terminal, or never reached a node.
fn stopped_or_never_assigned(t: &Task) -> bool {
    let observed = observed_state(t);
    observed.is_terminal() || observed < TaskState::Assigned || t.node_id.is_empty()
}

/// The deletions for the given slots (see the module doc). Each task is deleted at most once.
pub(crate) fn reap<'a>(tables: &Tables, keys: impl IntoIterator<Item = &'a SlotKey>) -> Changes {
    let limit = retention_limit(tables);
    let mut changes = Changes::new();
    for (service_id, slot) in keys {
        // Network attachments (`resourceapi`) belong to no service: `DetachNetwork` removes them.
        if service_id.is_empty() {
            continue;
        }
        let service = tables.services().get(service_id);
        let service_exists = service.is_some();
        // A job's completions of its current iteration are what it counts: they stay.
        let counted = |t: &Task| {
            service.is_some_and(|s| {
                super::jobs::is_job(s)
                    && observed_state(t) == TaskState::Complete
                    && super::jobs::in_iteration(t, super::jobs::current_iteration(s))
            })
        };
        let mut keep: Vec<&Arc<Task>> = Vec::new();
        for t in tables.tasks().by_slot(service_id, *slot) {
            let gone = t.desired_state() == TaskState::Remove || !service_exists;
            if gone && stopped_or_never_assigned(t) {
                changes.remove(t.clone());
            } else if !counted(t) {
                keep.push(t);
            }
        }
        if keep.len() <= limit {
            continue;
        }
        if *slot == GLOBAL_SLOT {
            // A global service's tasks all have slot 0: their history is per node.
            let mut by_node: BTreeMap<&str, Vec<&Arc<Task>>> = BTreeMap::new();
            for t in keep {
                by_node.entry(t.node_id.as_str()).or_default().push(t);
            }
            for history in by_node.into_values() {
                trim_history(history, limit, &mut changes);
            }
        } else {
            trim_history(keep, limit, &mut changes);
        }
    }
    changes
}

/// The slot of every task of a global service (replicated slots start at 1).
const GLOBAL_SLOT: u64 = 0;

/// Deletes the oldest done tasks of one history until at most `limit` remain (or none is done).
fn trim_history(mut keep: Vec<&Arc<Task>>, limit: usize, changes: &mut Changes) {
    if keep.len() <= limit {
        return;
    }
    keep.sort_by(|a, b| history_key(a).cmp(&history_key(b)));
    let mut excess = keep.len() - limit;
    for t in keep {
        if excess == 0 {
            break;
        }
        if t.desired_state() > TaskState::Running && stopped_or_never_assigned(t) {
            changes.remove(t.clone());
            excess -= 1;
        }
    }
}

/// Every slot that has a task.
pub(crate) fn all_slots(tables: &Tables) -> BTreeSet<SlotKey> {
    tables.tasks().iter().map(|t| (t.service_id.clone(), t.slot)).collect()
}

/// The task reaper subsystem.
#[derive(Debug, Default)]
pub(crate) struct TaskReaper;

impl Subsystem for TaskReaper {
    fn name(&self) -> &'static str {
        "task-reaper"
    }

    fn run(&self, state: ClusterState, stop: watch::Receiver<bool>) -> SubsystemFuture {
        Box::pin(run(state, stop))
    }
}

async fn run(state: ClusterState, mut stop: watch::Receiver<bool>) {
    let (mut dirty, mut events) = state.store.view_and_watch(all_slots);
    let mut removed_services: HashSet<String> = HashSet::new();
    loop {
        if !removed_services.is_empty() {
            state.store.view(|t| {
                for s in removed_services.drain() {
                    dirty.extend(t.tasks().by_service(&s).map(|t| (t.service_id.clone(), t.slot)));
                }
            });
        }
        if !dirty.is_empty() {
            flush(&state, std::mem::take(&mut dirty)).await;
        }
        // Wait for the first event, then collect until the window closes or the batch is full.
        let mut deadline_ms: Option<u64> = None;
        loop {
            let timer = async {
                match deadline_ms {
                    Some(d) => state.sleep_ms(d.saturating_sub(state.timer.now_ms())).await,
                    None => std::future::pending().await,
                }
            };
            // Biased (stop, window, events) so that a simulation replays and a busy watch queue cannot hold
            // the window open.
            tokio::select! {
                biased;
                _ = stopped(&mut stop) => return,
                _ = timer => break,
                r = events.recv() => match r {
                    Ok(commit) => {
                        for ch in &commit.changes {
                            match (&ch.object, ch.kind) {
                                (Object::Task(t), ActionKind::Create | ActionKind::Update) => {
                                    dirty.insert((t.service_id.clone(), t.slot));
                                }
                                (Object::Service(s), ActionKind::Remove) => {
                                    removed_services.insert(s.id.clone());
                                }
                                (Object::Cluster(_), _) => {
                                    dirty.extend(state.store.view(all_slots));
                                }
                                _ => {}
                            }
                        }
                    }
                    Err(WatchError::Lagged(_)) => dirty.extend(state.store.view(all_slots)),
                    Err(WatchError::Closed) => return,
                },
            }
            if dirty.len() + removed_services.len() >= MAX_DIRTY_SLOTS {
                break;
            }
            if deadline_ms.is_none() && !(dirty.is_empty() && removed_services.is_empty()) {
                deadline_ms = Some(state.timer.now_ms() + FLUSH_AFTER_MS);
            }
        }
    }
}

/// Deletes what `reap` finds in `slots`, in writes of bounded size, retrying conflicts from a fresh view.
async fn flush(state: &ClusterState, slots: BTreeSet<SlotKey>) {
    let mut slots: Vec<SlotKey> = slots.into_iter().collect();
    for _ in 0..MAX_ATTEMPTS {
        if slots.is_empty() {
            return;
        }
        let groups: Vec<(SlotKey, Changes)> =
            state.store.view(|t| slots.iter().map(|k| (k.clone(), reap(t, std::iter::once(k)))).collect());
        let failed = propose_grouped(state, groups, MAX_DELETES_PER_WRITE).await;
        if failed.iter().any(|(_, e)| !is_conflict(e)) {
            tracing::debug!("task reaper write failed; will retry on the next event");
            return;
        }
        slots = failed.into_iter().map(|(k, _)| k).collect();
        slots.dedup();
    }
}
