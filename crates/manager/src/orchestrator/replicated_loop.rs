//! The replicated orchestrator's async loop: subscribes and reads (`view_and_watch`), reconciles every
//! service, then reacts to commits. A service is reconciled again when it is created, updated or removed,
//! when one of its tasks changes, when a node holding its tasks goes down (or is removed), and when a
//! restart or update delay it asked for ends. A lagging watch makes it reconcile everything again.
//!
//! Bounds: at most `MAX_EVENTS_PER_BATCH` commits are drained before a pass; a pass reads at most
//! `MAX_SERVICES_PER_PASS` services per view; writes carry at most `write::MAX_ACTIONS_PER_WRITE` actions;
//! a service whose write conflicts is retried at most `MAX_ATTEMPTS` times per round (the next event brings
//! it back); the timer sleeps at most `MAX_TIMER_SLEEP_MS` so a moved clock is noticed.
//!
//! Must not depend on other subsystems; only on `ClusterState`.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

use shoal_api::node_status;
use shoal_store::{ActionKind, Commit, Object, Tables, WatchError};
use tokio::sync::watch;

use super::replicated::{reconcile_service, remove_service_tasks, replicas, Reconciled};
use super::write::{is_conflict, propose_grouped, MAX_ACTIONS_PER_WRITE};
use crate::state::ClusterState;
use crate::subsystem::{stopped, Subsystem, SubsystemFuture};

/// Most commits drained from the watch queue before a pass.
pub const MAX_EVENTS_PER_BATCH: usize = 10_000;
/// Most services reconciled from one read view.
pub const MAX_SERVICES_PER_PASS: usize = 1000;
/// Most write attempts for one service in one round.
pub const MAX_ATTEMPTS: u32 = 3;
/// Longest timer sleep, so that a clock that moved is noticed.
pub const MAX_TIMER_SLEEP_MS: u64 = 1000;
/// Pause after a write failed for a reason other than a conflict (e.g. lost leadership).
const BACKOFF_MS: u64 = 100;

/// The replicated orchestrator subsystem (with the restart supervisor and the rolling updater).
#[derive(Debug, Default)]
pub struct ReplicatedOrchestrator;

impl Subsystem for ReplicatedOrchestrator {
    fn name(&self) -> &'static str {
        "replicated-orchestrator"
    }

    fn run(&self, state: ClusterState, stop: watch::Receiver<bool>) -> SubsystemFuture {
        Box::pin(run(state, stop))
    }
}

/// Every service, plus services that are gone but still have tasks not marked for removal.
fn all_targets(t: &Tables) -> BTreeSet<String> {
    let mut ids: BTreeSet<String> = t.services().iter().map(|s| s.id.clone()).collect();
    for task in t.tasks().iter() {
        if task.desired_state() < shoal_api::TaskState::Remove && t.services().get(&task.service_id).is_none() {
            ids.insert(task.service_id.clone());
        }
    }
    ids
}

#[derive(Default)]
struct LoopState {
    pending: BTreeSet<String>,
    down_nodes: HashSet<String>,
    wakes: HashMap<String, u64>,
    logged_modes: HashSet<String>,
}

impl LoopState {
    fn note(&mut self, commit: &Commit) {
        for ch in &commit.changes {
            match &ch.object {
                Object::Service(s) => {
                    self.pending.insert(s.id.clone());
                }
                // Deletions (the reaper's) do not need a pass.
                Object::Task(t) if ch.kind != ActionKind::Remove && !t.service_id.is_empty() => {
                    self.pending.insert(t.service_id.clone());
                }
                Object::Node(n) => {
                    let down = |o: &Option<Object>| match o {
                        Some(Object::Node(n)) => n.status.as_ref().map(|s| s.state()) == Some(node_status::State::Down),
                        _ => false,
                    };
                    let drained = |o: &Option<Object>| match o {
                        Some(Object::Node(n)) => super::node_is_drained(Some(n)),
                        _ => false,
                    };
                    let now_down = ch.kind == ActionKind::Remove
                        || n.status.as_ref().map(|s| s.state()) == Some(node_status::State::Down);
                    let now_drained = super::node_is_drained(Some(n)) && !drained(&ch.old);
                    if now_drained || (now_down && !(ch.kind == ActionKind::Update && down(&ch.old))) {
                        self.down_nodes.insert(n.id.clone());
                    }
                }
                _ => {}
            }
        }
    }
}

async fn run(state: ClusterState, mut stop: watch::Receiver<bool>) {
    let (targets, mut events) = state.store.view_and_watch(all_targets);
    let mut ls = LoopState { pending: targets, ..Default::default() };
    tracing::info!(services = ls.pending.len(), "replicated orchestrator started");
    loop {
        let now = state.clock.now_unix_ms();
        let due: Vec<String> = ls.wakes.iter().filter(|(_, &w)| w <= now).map(|(k, _)| k.clone()).collect();
        for id in due {
            ls.wakes.remove(&id);
            ls.pending.insert(id);
        }
        if !ls.down_nodes.is_empty() {
            let nodes = std::mem::take(&mut ls.down_nodes);
            state.store.view(|t| {
                for n in &nodes {
                    for task in t.tasks().by_node(n) {
                        ls.pending.insert(task.service_id.clone());
                    }
                }
            });
        }
        if !ls.pending.is_empty() && !reconcile_pending(&state, &mut ls).await {
            tokio::select! {
                _ = stopped(&mut stop) => return,
                _ = tokio::time::sleep(Duration::from_millis(BACKOFF_MS)) => {}
            }
            continue;
        }
        let now = state.clock.now_unix_ms();
        let sleep_ms = ls.wakes.values().min().map(|w| w.saturating_sub(now).clamp(1, MAX_TIMER_SLEEP_MS));
        tokio::select! {
            _ = stopped(&mut stop) => return,
            r = events.recv() => match r {
                Ok(commit) => {
                    ls.note(&commit);
                    for _ in 1..MAX_EVENTS_PER_BATCH {
                        match events.try_recv() {
                            Ok(c) => ls.note(&c),
                            Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_)) => {
                                ls.pending.extend(state.store.view(all_targets));
                            }
                            Err(_) => break,
                        }
                    }
                }
                Err(WatchError::Lagged(n)) => {
                    tracing::warn!(missed = n, "orchestrator watch lagged; reconciling every service");
                    ls.pending.extend(state.store.view(all_targets));
                }
                Err(WatchError::Closed) => return,
            },
            _ = tokio::time::sleep(Duration::from_millis(sleep_ms.unwrap_or(0))), if sleep_ms.is_some() => {}
        }
    }
}

/// Reconciles every pending service, retrying conflicts. Returns false when a write failed for another
/// reason (the caller backs off; pending services stay pending).
async fn reconcile_pending(state: &ClusterState, ls: &mut LoopState) -> bool {
    let mut attempts: HashMap<String, u32> = HashMap::new();
    while !ls.pending.is_empty() {
        let batch: Vec<String> = std::iter::from_fn(|| ls.pending.pop_first()).take(MAX_SERVICES_PER_PASS).collect();
        let now = state.clock.now_unix_ms();
        let results: Vec<(String, Reconciled)> = state.store.view(|t| {
            batch
                .iter()
                .map(|id| {
                    let r = match t.services().get(id) {
                        Some(s) => {
                            if replicas(s).is_none() && ls.logged_modes.insert(id.clone()) {
                                tracing::info!(service = %id, "service mode is not replicated; the replicated orchestrator leaves it alone");
                            }
                            reconcile_service(t, s, now, state.ids.as_ref())
                        }
                        None => Reconciled { changes: remove_service_tasks(t, id, now), wake_at_ms: None },
                    };
                    (id.clone(), r)
                })
                .collect()
        });
        let mut groups = Vec::with_capacity(results.len());
        for (id, r) in results {
            match r.wake_at_ms {
                Some(w) => ls.wakes.insert(id.clone(), w),
                None => ls.wakes.remove(&id),
            };
            groups.push((id, r.changes));
        }
        let mut ok = true;
        for (id, e) in propose_grouped(state, groups, MAX_ACTIONS_PER_WRITE).await {
            if !is_conflict(&e) {
                ls.pending.insert(id);
                ok = false;
                continue;
            }
            let n = attempts.entry(id.clone()).or_insert(0);
            *n += 1;
            if *n < MAX_ATTEMPTS {
                ls.pending.insert(id);
            } else {
                tracing::warn!(service = %id, error = %e, "giving up on this service until its next change");
            }
        }
        if !ok {
            return false;
        }
    }
    true
}
