//! The node's identity on disk (`<state dir>/node.json`): its node ID and Raft ID, created on first start and
//! read back on every later start, written atomically (tmp file, fsync, rename).

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::NodeError;

/// Who this node is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeIdentity {
    /// The node's ID (a `Node` object's ID).
    pub node_id: String,
    /// The node's Raft member ID.
    pub raft_id: u64,
}

fn path(state_dir: &Path) -> PathBuf {
    state_dir.join("node.json")
}

/// Reads the identity, if the state dir has one.
pub(crate) fn load(state_dir: &Path) -> Result<Option<NodeIdentity>, NodeError> {
    let p = path(state_dir);
    match std::fs::read(&p) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            NodeError::State(format!("{} is corrupted ({e}); restore it or start with an empty state dir", p.display()))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(NodeError::io(&p, e)),
    }
}

/// Writes the identity durably.
pub(crate) fn store(state_dir: &Path, id: &NodeIdentity) -> Result<(), NodeError> {
    let p = path(state_dir);
    let tmp = state_dir.join("node.json.tmp");
    let bytes = serde_json::to_vec_pretty(id).expect("identity serializes");
    let mut f = std::fs::File::create(&tmp).map_err(|e| NodeError::io(&tmp, e))?;
    f.write_all(&bytes).and_then(|_| f.sync_all()).map_err(|e| NodeError::io(&tmp, e))?;
    std::fs::rename(&tmp, &p).map_err(|e| NodeError::io(&p, e))?;
    std::fs::File::open(state_dir).and_then(|d| d.sync_all()).map_err(|e| NodeError::io(state_dir, e))?;
    Ok(())
}
