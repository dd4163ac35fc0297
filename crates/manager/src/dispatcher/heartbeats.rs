//! Heartbeat deadlines, sans IO: which node must send its next heartbeat by when, and which nodes have
//! missed their deadline at a given `now`. Time comes in as `now_ms` arguments, read from a monotonic timer
//! (never the wall clock: a clock step would expire every node at once); nothing here reads a clock, sleeps
//! or writes the store (the dispatcher's leader-only loop does that with the expired list).
//!
//! Bound: one entry per node that opened a session (or was READY when this manager became leader).

use std::collections::{BTreeSet, HashMap};

/// Per-node heartbeat deadlines, ordered so that expiry is O(expired) rather than a scan.
#[derive(Debug, Default)]
pub(crate) struct Heartbeats {
    deadline_by_node: HashMap<String, u64>,
    by_deadline: BTreeSet<(u64, String)>,
}

impl Heartbeats {
    /// No node tracked.
    #[cfg(test)]
    pub(crate) fn new() -> Heartbeats {
        Heartbeats::default()
    }

    /// Records a heartbeat (or a new session) from `node_id`: it must send the next one before
    /// `now_ms + ttl_ms`, where `ttl_ms` is the period times the heartbeats it may miss.
    pub(crate) fn beat(&mut self, node_id: &str, now_ms: u64, ttl_ms: u64) {
        self.set_deadline(node_id, now_ms.saturating_add(ttl_ms));
    }

    /// Starts tracking `node_id` with the given deadline, unless it is already tracked with a later one
    /// (used for the grace period when this manager becomes leader).
    pub(crate) fn track_at_least(&mut self, node_id: &str, deadline_ms: u64) {
        if self.deadline_by_node.get(node_id).is_some_and(|d| *d >= deadline_ms) {
            return;
        }
        self.set_deadline(node_id, deadline_ms);
    }

    fn set_deadline(&mut self, node_id: &str, deadline: u64) {
        if let Some(old) = self.deadline_by_node.insert(node_id.to_string(), deadline) {
            self.by_deadline.remove(&(old, node_id.to_string()));
        }
        self.by_deadline.insert((deadline, node_id.to_string()));
    }

    /// Stops tracking `node_id`.
    #[cfg(test)]
    pub(crate) fn forget(&mut self, node_id: &str) {
        if let Some(old) = self.deadline_by_node.remove(node_id) {
            self.by_deadline.remove(&(old, node_id.to_string()));
        }
    }

    /// True when `node_id` is tracked (it has a live deadline).
    pub(crate) fn is_tracked(&self, node_id: &str) -> bool {
        self.deadline_by_node.contains_key(node_id)
    }

    /// The deadline of `node_id`, if tracked.
    #[cfg(test)]
    pub(crate) fn deadline(&self, node_id: &str) -> Option<u64> {
        self.deadline_by_node.get(node_id).copied()
    }

    /// Removes and returns every node whose deadline is at or before `now_ms`, earliest first.
    pub(crate) fn expire(&mut self, now_ms: u64) -> Vec<String> {
        let mut expired = Vec::new();
        while let Some((deadline, _)) = self.by_deadline.first() {
            if *deadline > now_ms {
                break;
            }
            let (_, node) = self.by_deadline.pop_first().expect("first exists");
            self.deadline_by_node.remove(&node);
            expired.push(node);
        }
        expired
    }

    /// The earliest deadline, if any node is tracked.
    pub(crate) fn next_deadline(&self) -> Option<u64> {
        self.by_deadline.first().map(|(deadline, _)| *deadline)
    }

    /// Number of tracked nodes.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.deadline_by_node.len()
    }

    /// True when no node is tracked.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.deadline_by_node.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_deadline_is_the_earliest() {
        let mut h = Heartbeats::new();
        assert_eq!(h.next_deadline(), None);
        h.beat("a", 1_000, 500);
        h.beat("b", 1_000, 200);
        assert_eq!(h.next_deadline(), Some(1_200));
        h.beat("b", 2_000, 200);
        assert_eq!(h.next_deadline(), Some(1_500));
        h.expire(1_500);
        assert_eq!(h.next_deadline(), Some(2_200));
    }

    #[test]
    fn a_node_expires_only_after_its_deadline() {
        let mut hb = Heartbeats::new();
        hb.beat("a", 1_000, 15_000);
        hb.beat("b", 2_000, 15_000);
        assert!(hb.expire(15_999).is_empty());
        assert_eq!(hb.expire(16_000), vec!["a".to_string()]);
        assert!(!hb.is_tracked("a"));
        assert_eq!(hb.expire(20_000), vec!["b".to_string()]);
        assert!(hb.is_empty());
    }

    #[test]
    fn a_heartbeat_pushes_the_deadline_back() {
        let mut hb = Heartbeats::new();
        hb.beat("a", 0, 100);
        hb.beat("a", 90, 100);
        assert!(hb.expire(150).is_empty());
        assert_eq!(hb.deadline("a"), Some(190));
        assert_eq!(hb.len(), 1);
        assert_eq!(hb.expire(190), vec!["a".to_string()]);
    }

    #[test]
    fn grace_tracking_never_shortens_a_deadline() {
        let mut hb = Heartbeats::new();
        hb.beat("a", 0, 1_000);
        hb.track_at_least("a", 500);
        assert_eq!(hb.deadline("a"), Some(1_000));
        hb.track_at_least("b", 500);
        assert_eq!(hb.deadline("b"), Some(500));
        hb.forget("b");
        assert_eq!(hb.expire(10_000), vec!["a".to_string()]);
    }
}
