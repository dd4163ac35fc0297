//! `Members`: the Raft members' addresses (and the IDs removed for good), as carried in conf-change contexts,
//! persisted next to the conf state, and written into every snapshot (SwarmKit's `Snapshot.membership`, a
//! `ClusterSnapshot`). Pure data and its wire conversion; no IO.

use std::collections::{BTreeMap, BTreeSet};

use prost::Message as _;
use shoal_api::{ClusterSnapshot, RaftMember};

/// One Raft member as the cluster knows it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Member {
    /// The member's Raft ID.
    pub raft_id: u64,
    /// The node ID of the manager (empty when not known).
    pub node_id: String,
    /// The address its Raft gRPC services listen on (`host:port`).
    pub addr: String,
}

impl Member {
    /// The wire form.
    pub fn to_wire(&self) -> RaftMember {
        RaftMember { raft_id: self.raft_id, node_id: self.node_id.clone(), addr: self.addr.clone(), status: None }
    }

    /// From the wire form.
    pub fn from_wire(m: &RaftMember) -> Member {
        Member { raft_id: m.raft_id, node_id: m.node_id.clone(), addr: m.addr.clone() }
    }

    /// The encoding carried in a conf change's context.
    pub(crate) fn encode(&self) -> Vec<u8> {
        self.to_wire().encode_to_vec()
    }

    /// Decodes a conf change's context.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Member, prost::DecodeError> {
        RaftMember::decode(bytes).map(|m| Member::from_wire(&m))
    }
}

/// The membership: current members by Raft ID, and IDs removed from the cluster (never to be reused).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Members {
    /// Current members.
    pub members: BTreeMap<u64, Member>,
    /// Removed Raft IDs.
    pub removed: BTreeSet<u64>,
}

impl Members {
    /// The address of member `raft_id`, if known.
    pub fn addr(&self, raft_id: u64) -> Option<&str> {
        self.members.get(&raft_id).map(|m| m.addr.as_str()).filter(|a| !a.is_empty())
    }

    /// The wire form (`ClusterSnapshot`).
    pub fn to_wire(&self) -> ClusterSnapshot {
        ClusterSnapshot {
            members: self.members.values().map(Member::to_wire).collect(),
            removed: self.removed.iter().copied().collect(),
        }
    }

    /// From the wire form.
    pub fn from_wire(c: &ClusterSnapshot) -> Members {
        Members {
            members: c.members.iter().map(|m| (m.raft_id, Member::from_wire(m))).collect(),
            removed: c.removed.iter().copied().collect(),
        }
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        self.to_wire().encode_to_vec()
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Members, prost::DecodeError> {
        ClusterSnapshot::decode(bytes).map(|c| Members::from_wire(&c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_round_trip_through_the_wire_form() {
        let mut m = Members::default();
        m.members.insert(7, Member { raft_id: 7, node_id: "n7".into(), addr: "127.0.0.7:4242".into() });
        m.members.insert(3, Member { raft_id: 3, node_id: String::new(), addr: "127.0.0.3:4242".into() });
        m.removed.insert(9);
        assert_eq!(Members::decode(&m.encode()).unwrap(), m);
        assert_eq!(m.addr(7), Some("127.0.0.7:4242"));
        assert_eq!(m.addr(9), None);
        let one = m.members[&7].clone();
        assert_eq!(Member::decode(&one.encode()).unwrap(), one);
    }
}
