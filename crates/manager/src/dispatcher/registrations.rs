//! How often one node's session may write its node object (a changed description, or READY after DOWN),
//! sans IO: a token bucket per node of `REGISTRATION_BURST` writes, refilled one per
//! `REGISTRATION_REFILL_MS`. A session that would write with an empty bucket is refused (the agent retries
//! later); a session that changes nothing writes nothing and takes no token. This bounds what one worker can
//! put in the Raft log by re-registering: at most `REGISTRATION_BURST` + one per refill period writes of at
//! most `limits::MAX_NODE_DESCRIPTION_BYTES` each.
//!
//! Times are milliseconds of the dispatcher's monotonic timer, passed in; no clock reads, no IO. The map
//! holds one entry per node that wrote recently: entries whose bucket is full again are dropped when the
//! map grows past `TRACKED_NODES_PRUNE_AT`.

use std::collections::HashMap;

/// Node writes one node may make at once after a quiet spell.
pub const REGISTRATION_BURST: u32 = 20;
/// One more write is allowed every this many milliseconds, once the burst is spent. (A root rotation renews
/// every certificate twice and each renewal opens a session that writes: 5 and then one per 10 s cut nodes
/// off in the middle of one; at 64 KiB a write, 20 and one a second still bound a node to 64 KiB/s.)
pub const REGISTRATION_REFILL_MS: u64 = 1_000;
/// Past this many tracked nodes, the ones whose bucket is full again are forgotten.
pub(crate) const TRACKED_NODES_PRUNE_AT: usize = 4096;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Tokens as of `at_ms`.
    tokens: u32,
    at_ms: u64,
}

impl Bucket {
    /// The bucket refilled up to `now_ms`.
    fn at(self, now_ms: u64) -> Bucket {
        let elapsed = now_ms.saturating_sub(self.at_ms);
        let refills = elapsed / REGISTRATION_REFILL_MS;
        if refills == 0 {
            return self;
        }
        let tokens = u32::try_from((u64::from(self.tokens) + refills).min(u64::from(REGISTRATION_BURST)))
            .expect("at most REGISTRATION_BURST");
        // Keep the part of a period already elapsed, unless the bucket is full.
        let at_ms = if tokens == REGISTRATION_BURST { now_ms } else { self.at_ms + refills * REGISTRATION_REFILL_MS };
        Bucket { tokens, at_ms }
    }
}

/// The buckets of the nodes that wrote recently.
#[derive(Debug, Default)]
pub(crate) struct Registrations {
    buckets: HashMap<String, Bucket>,
}

impl Registrations {
    /// Takes a write for `node` at `now_ms`, or says in how many milliseconds the next one is allowed.
    pub(crate) fn take(&mut self, node: &str, now_ms: u64) -> Result<(), u64> {
        if self.buckets.len() >= TRACKED_NODES_PRUNE_AT && !self.buckets.contains_key(node) {
            self.buckets.retain(|_, b| b.at(now_ms).tokens < REGISTRATION_BURST);
        }
        let b = self.buckets.get(node).map_or(Bucket { tokens: REGISTRATION_BURST, at_ms: now_ms }, |b| b.at(now_ms));
        if b.tokens == 0 {
            self.buckets.insert(node.to_string(), b);
            return Err((b.at_ms + REGISTRATION_REFILL_MS).saturating_sub(now_ms));
        }
        self.buckets.insert(node.to_string(), Bucket { tokens: b.tokens - 1, ..b });
        Ok(())
    }

    /// Gives back a write taken at `now_ms` that was not made (the store write failed).
    pub(crate) fn give_back(&mut self, node: &str, now_ms: u64) {
        if let Some(b) = self.buckets.get_mut(node) {
            let refilled = b.at(now_ms);
            *b = Bucket { tokens: (refilled.tokens + 1).min(REGISTRATION_BURST), ..refilled };
        }
    }

    /// Nodes tracked now.
    #[cfg(test)]
    pub(crate) fn tracked(&self) -> usize {
        self.buckets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_gets_its_burst_then_one_write_per_refill_period() {
        let mut r = Registrations::default();
        for _ in 0..REGISTRATION_BURST {
            r.take("n1", 1000).unwrap();
        }
        assert_eq!(r.take("n1", 1000), Err(REGISTRATION_REFILL_MS));
        let part = REGISTRATION_REFILL_MS * 2 / 5;
        assert_eq!(r.take("n1", 1000 + part), Err(REGISTRATION_REFILL_MS - part));
        r.take("other", 1000 + part).expect("another node has its own bucket");
        r.take("n1", 1000 + REGISTRATION_REFILL_MS).expect("one token after a period");
        assert!(r.take("n1", 1000 + REGISTRATION_REFILL_MS + 1).is_err());
        // A period after the last refill, one more.
        r.take("n1", 1000 + 2 * REGISTRATION_REFILL_MS).unwrap();
        r.give_back("n1", 1000 + 2 * REGISTRATION_REFILL_MS);
        r.take("n1", 1000 + 2 * REGISTRATION_REFILL_MS).expect("the token given back");
        // A long quiet spell refills to the burst, no more.
        let later = 1000 + 100 * REGISTRATION_REFILL_MS;
        for _ in 0..REGISTRATION_BURST {
            r.take("n1", later).unwrap();
        }
        assert!(r.take("n1", later).is_err());
    }

    #[test]
    fn idle_nodes_are_forgotten_when_the_map_is_large() {
        let mut r = Registrations::default();
        for i in 0..TRACKED_NODES_PRUNE_AT {
            r.take(&format!("n{i}"), 0).unwrap();
        }
        assert_eq!(r.tracked(), TRACKED_NODES_PRUNE_AT);
        r.take("late", REGISTRATION_REFILL_MS).unwrap();
        assert_eq!(r.tracked(), 1, "the refilled buckets went, the new one stays");
    }
}
