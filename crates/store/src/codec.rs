//! Encoding of writes (SwarmKit's `InternalRaftRequest`) and snapshots (`Snapshot`/`StoreSnapshot`) as bytes.

use shoal_api::prost::Message;
use shoal_api::{InternalRaftRequest, Snapshot, StoreSnapshot};

use crate::object::Action;
use crate::StoreError;

/// Encodes a write: a request ID (so the proposer can find its result) and the actions.
pub fn encode_request(id: u64, actions: &[Action]) -> Vec<u8> {
    let req = InternalRaftRequest { id, action: actions.iter().map(Action::to_wire).collect() };
    req.encode_to_vec()
}

/// Decodes a write.
pub fn decode_request(bytes: &[u8]) -> Result<(u64, Vec<Action>), StoreError> {
    let req = InternalRaftRequest::decode(bytes)
        .map_err(|e| StoreError::Decode { what: "raft request", reason: e.to_string() })?;
    let mut actions = Vec::with_capacity(req.action.len());
    for a in req.action {
        actions.push(
            Action::from_wire(a).ok_or_else(|| StoreError::Decode {
                what: "store action",
                reason: "no target or unknown kind".into(),
            })?,
        );
    }
    Ok((req.id, actions))
}

/// Encodes a store snapshot in SwarmKit's `Snapshot` envelope.
pub fn encode_snapshot(store: StoreSnapshot) -> Vec<u8> {
    Snapshot { version: 0, membership: None, store: Some(store) }.encode_to_vec()
}

/// Decodes a store snapshot.
pub fn decode_snapshot(bytes: &[u8]) -> Result<StoreSnapshot, StoreError> {
    let snap = Snapshot::decode(bytes).map_err(|e| StoreError::Decode { what: "snapshot", reason: e.to_string() })?;
    Ok(snap.store.unwrap_or_default())
}
