//! Proposing a pass's writes in bounded chunks. A pass produces changes per key (a service, a slot, a
//! group of tasks); they are packed into writes of at most `MAX_ACTIONS_PER_WRITE` actions, each proposed
//! as one atomic write. A key whose changes failed is reported back, so its owner can re-read and retry.
//!
//! Shared by the orchestrator, the reaper and the scheduler loops. Must not depend on their logic.

use shoal_raft::ProposeError;
use shoal_store::{Action, Changes};

use crate::state::ClusterState;

/// The most actions proposed in one write.
pub const MAX_ACTIONS_PER_WRITE: usize = 1000;

/// Proposes the changes of every key, packing whole keys together into writes of at most `max_actions`
/// actions (a key with more is split over several writes). Returns the keys whose write failed, with the
/// error. Writes are sent one after another; a failure does not stop the later ones.
pub async fn propose_grouped<K: Clone>(
    state: &ClusterState,
    groups: Vec<(K, Changes)>,
    max_actions: usize,
) -> Vec<(K, ProposeError)> {
    let max_actions = max_actions.max(1);
    let mut failed = Vec::new();
    let mut keys: Vec<K> = Vec::new();
    let mut actions: Vec<Action> = Vec::new();
    for (key, changes) in groups {
        if changes.is_empty() {
            continue;
        }
        if !actions.is_empty() && actions.len() + changes.len() > max_actions {
            flush(state, &mut keys, &mut actions, &mut failed).await;
        }
        let mut list = changes.into_actions();
        while list.len() > max_actions {
            let rest = list.split_off(max_actions);
            keys.push(key.clone());
            actions = list;
            flush(state, &mut keys, &mut actions, &mut failed).await;
            list = rest;
        }
        keys.push(key);
        actions.extend(list);
    }
    if !actions.is_empty() {
        flush(state, &mut keys, &mut actions, &mut failed).await;
    }
    failed
}

async fn flush<K>(
    state: &ClusterState,
    keys: &mut Vec<K>,
    actions: &mut Vec<Action>,
    failed: &mut Vec<(K, ProposeError)>,
) {
    let n = actions.len();
    if let Err(e) = state.propose(Changes::from(std::mem::take(actions))).await {
        tracing::debug!(actions = n, error = %e, "write failed");
        failed.extend(keys.drain(..).map(|k| (k, e.clone())));
    }
    keys.clear();
}

/// True for errors where re-reading the state and retrying may succeed (the state changed under us).
pub fn is_conflict(e: &ProposeError) -> bool {
    matches!(e, ProposeError::Store(_) | ProposeError::Unknown(_) | ProposeError::TooLarge { .. })
}
