//! Proposing a pass's writes in bounded chunks. A pass produces changes per key (a service, a slot, a
//! group of tasks); they are packed into writes of at most `MAX_ACTIONS_PER_WRITE` actions and
//! `MAX_BYTES_PER_WRITE` encoded bytes (every task carries a copy of its service's spec, so 1000 tasks of a
//! big spec would not fit the 8 MiB proposal limit), each proposed as one atomic write. A single action
//! larger than the byte bound goes alone (the control API refuses specs whose tasks would not fit a
//! proposal). A key whose changes failed is reported back, so its owner can re-read and retry.
//!
//! Shared by the orchestrators, the reaper, the scheduler, the allocator, the dispatcher and the control API.
//! Must not depend on any of them: only on the store and `ClusterState`.

use shoal_raft::ProposeError;
use shoal_store::{Action, Changes};

use crate::state::ClusterState;

/// The most actions proposed in one write.
pub(crate) const MAX_ACTIONS_PER_WRITE: usize = 1000;

/// The most encoded bytes of actions proposed in one write: half of Raft's 8 MiB proposal limit, so a
/// write always fits with room for the request's envelope and the log entry's sealing.
pub(crate) const MAX_BYTES_PER_WRITE: usize = 4 << 20;

/// Splits `actions` into consecutive chunks of at most `max_actions` actions and `MAX_BYTES_PER_WRITE`
/// bytes (an action larger than that forms its own chunk).
pub(crate) fn chunk_actions(actions: Vec<Action>, max_actions: usize) -> Vec<Vec<Action>> {
    let max_actions = max_actions.max(1);
    let mut out = Vec::new();
    let mut cur: Vec<Action> = Vec::new();
    let mut bytes = 0;
    for a in actions {
        let len = a.encoded_len();
        if !cur.is_empty() && (cur.len() >= max_actions || bytes + len > MAX_BYTES_PER_WRITE) {
            out.push(std::mem::take(&mut cur));
            bytes = 0;
        }
        bytes += len;
        cur.push(a);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Proposes the changes of every key, packing whole keys together into writes of at most `max_actions`
/// actions and `MAX_BYTES_PER_WRITE` bytes (a key with more is split over several writes). Returns the keys
/// whose write failed, with the error. Writes are sent one after another; a failure does not stop the later
/// ones.
pub(crate) async fn propose_grouped<K: Clone>(
    state: &ClusterState,
    groups: Vec<(K, Changes)>,
    max_actions: usize,
) -> Vec<(K, ProposeError)> {
    let max_actions = max_actions.max(1);
    let mut failed = Vec::new();
    let mut keys: Vec<K> = Vec::new();
    let mut actions: Vec<Action> = Vec::new();
    let mut bytes = 0usize;
    for (key, changes) in groups {
        if changes.is_empty() {
            continue;
        }
        let list = changes.into_actions();
        let len: usize = list.iter().map(Action::encoded_len).sum();
        if !actions.is_empty() && (actions.len() + list.len() > max_actions || bytes + len > MAX_BYTES_PER_WRITE) {
            flush(state, &mut keys, &mut actions, &mut failed).await;
            bytes = 0;
        }
        if list.len() > max_actions || len > MAX_BYTES_PER_WRITE {
            // Too big for one write: its own writes, chunk by chunk.
            for chunk in chunk_actions(list, max_actions) {
                keys.push(key.clone());
                actions = chunk;
                flush(state, &mut keys, &mut actions, &mut failed).await;
            }
            continue;
        }
        keys.push(key);
        actions.extend(list);
        bytes += len;
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
pub(crate) fn is_conflict(e: &ProposeError) -> bool {
    matches!(e, ProposeError::Store(_) | ProposeError::Unknown(_) | ProposeError::TooLarge { .. })
}
