//! Raft proposals and snapshots, as a follower receives them from the leader: decoded
//! (`shoal_store::codec`) and applied to a store, then read through its indexes. The store must refuse
//! what it cannot apply (all or nothing) and never panic.

use shoal_api::TaskState;
use shoal_store::{decode_request, decode_snapshot, encode_snapshot, MemoryStore, Tables};

/// Reads every table and index of `t`, as the subsystems do after a commit.
fn read_all(t: &Tables) {
    for s in t.services().iter() {
        let _ = t.tasks().count_by_service(&s.id);
        let _ = t.services().by_name(&s.id);
    }
    for task in t.tasks().iter() {
        let _ = t.tasks().by_node(&task.node_id).count();
        let _ = t.tasks().by_slot(&task.service_id, task.slot).count();
    }
    let _ = t.tasks().by_desired_state(TaskState::Running).count();
    let _ = t.tasks().by_state(TaskState::Pending).count();
    let _ = (t.nodes().len(), t.clusters().len(), t.last_index());
}

/// A committed `InternalRaftRequest`: decoded and applied twice (the second time its creates conflict and
/// its updates and removes find the objects), with the store read after each.
pub fn proposal(data: &[u8]) {
    let Ok((_, actions)) = decode_request(data) else { return };
    let store = MemoryStore::new(4);
    let mut watch = store.watch();
    for index in [1, 2] {
        let _ = store.apply(index, &actions);
        store.view(read_all);
    }
    while watch.try_recv().is_ok() {}
}

/// A snapshot file's content: decoded, restored into a store, read, taken again and decoded again.
pub fn snapshot(data: &[u8]) {
    let Ok(snap) = decode_snapshot(data) else { return };
    let store = MemoryStore::new(4);
    store.restore(7, snap);
    store.view(read_all);
    let (index, again) = store.snapshot();
    let bytes = encode_snapshot(again);
    let decoded = decode_snapshot(&bytes).expect("a snapshot the store took decodes");
    let other = MemoryStore::new(4);
    other.restore(index, decoded);
    other.view(read_all);
}
