//! The screen every Raft message from a peer passes before raft-rs steps it: raft-rs takes a message's
//! fields as given and panics on some it never sends itself, which would kill the member's Raft thread.
//! Pure functions, shared by the driver, the fuzz targets and the simulation.

use raft::eraftpb::{ConfState, Message};

/// What a message from a peer must satisfy before raft-rs steps it, which takes its fields as given and
/// panics (killing the Raft thread) on some it never sends: returns false to drop the message, and clamps
/// a heartbeat's commit (`clamp_heartbeat_commit`). Local-only messages (campaign, timers, transport
/// reports) never come from a peer. `MsgPropose`, `MsgReadIndex` and `MsgTransferLeader` are forwarded to
/// the leader without a term, and raft-rs panics forwarding one that carries a term ("term should not be
/// set when sending MsgPropose"); a vote request must name a term; an append's entries must carry the
/// indexes that follow its own; a snapshot's conf state must be one joint consensus can produce
/// (`conf_state_is_consistent`). (All found by fuzzing the Raft transport's messages, `shoal-fuzz`.)
pub(crate) fn screen_inbound(m: &mut Message, last_index: u64) -> bool {
    use raft::eraftpb::MessageType::{
        MsgBeat, MsgCheckQuorum, MsgHup, MsgPropose, MsgReadIndex, MsgRequestPreVote, MsgRequestVote, MsgSnapStatus,
        MsgTransferLeader, MsgUnreachable,
    };
    // Messages the local node gives itself (campaign, heartbeat and quorum timers, transport reports): a
    // peer never sends them.
    if matches!(m.get_msg_type(), MsgHup | MsgBeat | MsgCheckQuorum | MsgUnreachable | MsgSnapStatus) {
        tracing::debug!(from = m.from, kind = ?m.get_msg_type(), "local-only raft message from a peer dropped");
        return false;
    }
    if matches!(m.get_msg_type(), MsgPropose | MsgReadIndex | MsgTransferLeader) && m.term != 0 {
        tracing::debug!(from = m.from, kind = ?m.get_msg_type(), term = m.term, "forwarded raft message with a term \
                                                                                 dropped");
        return false;
    }
    // raft-rs reads term 0 as a match for any index beyond its log: an append after an entry of term 0
    // (only the empty log's index 0 has it) or a snapshot of term 0 would commit entries it lacks.
    let after_term_0 = m.get_msg_type() == raft::eraftpb::MessageType::MsgAppend && m.log_term == 0 && m.index != 0;
    let snapshot_term_0 =
        m.get_msg_type() == raft::eraftpb::MessageType::MsgSnapshot && m.get_snapshot().get_metadata().term == 0;
    if after_term_0 || snapshot_term_0 {
        tracing::debug!(from = m.from, kind = ?m.get_msg_type(), "raft message naming term 0 beyond the log start \
                                                                  dropped");
        return false;
    }
    // raft-rs rebuilds its configuration from a snapshot's conf state and panics ("invalid restore") when
    // the result differs from what the snapshot says: only a conf state a leader could have written passes.
    if m.get_msg_type() == raft::eraftpb::MessageType::MsgSnapshot
        && !conf_state_is_consistent(m.get_snapshot().get_metadata().get_conf_state())
    {
        tracing::debug!(from = m.from, "raft snapshot with an inconsistent conf state dropped");
        return false;
    }
    // A vote request names the term it campaigns for (raft-rs panics answering one of term 0).
    if matches!(m.get_msg_type(), MsgRequestVote | MsgRequestPreVote) && m.term == 0 {
        tracing::debug!(from = m.from, "raft vote request without a term dropped");
        return false;
    }
    // An append's entries follow its index one by one, with terms from its log term up to its own term,
    // never decreasing, as a leader writes them (raft-rs slices and commits by position and panics on
    // entries whose indexes say otherwise; it reads a term 0 beyond its log as a match).
    let mut prev_term = m.log_term;
    if m.get_msg_type() == raft::eraftpb::MessageType::MsgAppend
        && m.entries.iter().enumerate().any(|(i, e)| {
            let misplaced = Some(e.index) != m.index.checked_add(1 + i as u64);
            let bad_term = e.term == 0 || e.term < prev_term || e.term > m.term;
            prev_term = e.term;
            misplaced || bad_term
        })
    {
        tracing::debug!(from = m.from, index = m.index, "raft append whose entries do not follow its index dropped");
        return false;
    }
    clamp_heartbeat_commit(m, last_index);
    true
}

/// True when a conf state is one joint consensus can produce: at least one voter; no ID twice in a list;
/// no ID both voter and learner; learners-next and auto-leave only in a joint configuration, where each
/// learner-next is an outgoing voter that is not an incoming voter, and no learner is an outgoing voter
/// (such a node waits in learners-next instead).
pub(crate) fn conf_state_is_consistent(cs: &ConfState) -> bool {
    use std::collections::BTreeSet;
    let set = |ids: &[u64]| -> Option<BTreeSet<u64>> {
        let s: BTreeSet<u64> = ids.iter().copied().collect();
        (s.len() == ids.len() && !s.contains(&0)).then_some(s)
    };
    let (Some(voters), Some(learners), Some(outgoing), Some(next)) =
        (set(cs.get_voters()), set(cs.get_learners()), set(cs.get_voters_outgoing()), set(cs.get_learners_next()))
    else {
        return false;
    };
    if voters.is_empty() || !voters.is_disjoint(&learners) {
        return false;
    }
    if outgoing.is_empty() {
        return next.is_empty() && !cs.auto_leave;
    }
    next.is_subset(&outgoing)
        && next.is_disjoint(&voters)
        && learners.is_disjoint(&outgoing)
        && next.is_disjoint(&learners)
}

/// Clamps a heartbeat's commit index to this member's last log index, and says whether it did. raft-rs
/// takes a heartbeat's commit as its own and panics ("to_commit N is out of range [last_index M]") when it
/// lies beyond the log, which kills the Raft thread: a leader sends min(match, commit), beyond the log only
/// when this member lost entries the leader saw it hold (a cut tail), or when the sender is confused.
/// Entries up to the last index are a prefix of what the leader matched, so committing them is what it
/// asked; the rest comes by append.
pub(crate) fn clamp_heartbeat_commit(m: &mut Message, last_index: u64) -> bool {
    if m.get_msg_type() == raft::eraftpb::MessageType::MsgHeartbeat && m.commit > last_index {
        tracing::warn!(
            from = m.from,
            commit = m.commit,
            last_index,
            "heartbeat commit beyond this member's log clamped"
        );
        m.commit = last_index;
        return true;
    }
    false
}

#[cfg(test)]
mod heartbeat_tests {
    use raft::eraftpb::{Message, MessageType};
    use raft::storage::MemStorage;
    use raft::{Config, RawNode};

    use super::{clamp_heartbeat_commit, conf_state_is_consistent, screen_inbound};

    /// A follower of a 3-member group stepping a heartbeat whose commit lies beyond its log: without the
    /// clamp raft-rs panics; with it the follower commits what it holds and keeps running.
    #[test]
    fn a_heartbeat_commit_beyond_the_log_is_clamped_not_fatal() {
        let storage = MemStorage::new_with_conf_state((vec![1, 2, 3], vec![]));
        let cfg = Config { id: 2, ..Default::default() };
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let mut raw = RawNode::new(&cfg, storage, &logger).unwrap();
        let mut hb = Message::default();
        hb.set_msg_type(MessageType::MsgHeartbeat);
        hb.set_from(1);
        hb.set_to(2);
        hb.set_term(1);
        hb.set_commit(1_000);
        let last = raw.raft.raft_log.last_index();
        let mut clamped = hb.clone();
        assert!(clamp_heartbeat_commit(&mut clamped, last));
        raw.step(clamped).unwrap();
        assert_eq!(raw.raft.raft_log.committed, last);
        let unclamped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| raw.step(hb)));
        assert!(unclamped.is_err(), "raft-rs takes the commit as is (the reason for the clamp)");
        let mut ok = Message::default();
        ok.set_msg_type(MessageType::MsgHeartbeat);
        ok.set_commit(last);
        assert!(!clamp_heartbeat_commit(&mut ok, last));
    }

    /// A forwarded proposal or read-index request carrying a term is dropped: raft-rs panics forwarding it.
    #[test]
    fn forwarded_messages_with_a_term_are_dropped() {
        let storage = MemStorage::new_with_conf_state((vec![1, 2, 3], vec![]));
        let cfg = Config { id: 2, ..Default::default() };
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let mut raw = RawNode::new(&cfg, storage, &logger).unwrap();
        raw.raft.become_follower(1, 1);
        for kind in [MessageType::MsgPropose, MessageType::MsgReadIndex] {
            let mut m = Message::default();
            m.set_msg_type(kind);
            m.set_from(3);
            m.set_to(2);
            m.set_term(1);
            m.set_entries(vec![raft::eraftpb::Entry::default()].into());
            assert!(!screen_inbound(&mut m.clone(), 0), "{kind:?} with a term is dropped");
            let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| raw.step(m.clone())));
            assert!(stepped.is_err(), "raft-rs panics on {kind:?} with a term (the reason for the screen)");
            m.set_term(0);
            assert!(screen_inbound(&mut m, 0), "{kind:?} without a term passes");
        }
        for kind in [MessageType::MsgRequestVote, MessageType::MsgRequestPreVote] {
            let mut m = Message::default();
            m.set_msg_type(kind);
            m.set_from(3);
            m.set_to(2);
            assert!(!screen_inbound(&mut m.clone(), 0), "{kind:?} of term 0 is dropped");
            m.set_term(2);
            assert!(screen_inbound(&mut m, 0), "{kind:?} of a term passes");
        }
    }

    /// An append whose entries' indexes do not follow its index, or whose terms are not those a leader
    /// writes, is dropped: raft-rs slices by them and commits past its log.
    #[test]
    fn appends_with_misnumbered_or_misdated_entries_are_dropped() {
        let entry = |index| {
            let mut e = raft::eraftpb::Entry::default();
            e.set_index(index);
            e.set_term(1);
            e
        };
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgAppend);
        m.set_index(5);
        m.set_term(1);
        m.set_log_term(1);
        m.set_entries(vec![entry(6), entry(7)].into());
        assert!(screen_inbound(&mut m.clone(), 7));
        let mut unterm = entry(7);
        unterm.set_term(0);
        m.set_entries(vec![entry(6), unterm].into());
        assert!(!screen_inbound(&mut m.clone(), 7), "an entry of term 0 is dropped");
        m.set_term(0);
        m.set_entries(vec![entry(6)].into());
        assert!(!screen_inbound(&mut m.clone(), 7), "an entry of a later term than the message is dropped");
        m.set_term(1);
        m.set_entries(vec![entry(6), entry(9)].into());
        assert!(!screen_inbound(&mut m.clone(), 7));
        m.set_index(u64::MAX);
        m.set_entries(vec![entry(0)].into());
        assert!(!screen_inbound(&mut m.clone(), 7));
        m.set_index(5);
        m.set_log_term(0);
        m.set_entries(vec![entry(6)].into());
        assert!(!screen_inbound(&mut m.clone(), 7), "an append after index 5 of term 0 is dropped");
        let mut snap = Message::default();
        snap.set_msg_type(MessageType::MsgSnapshot);
        snap.mut_snapshot().mut_metadata().set_index(100);
        assert!(!screen_inbound(&mut snap.clone(), 7), "a snapshot of term 0 is dropped");
        snap.mut_snapshot().mut_metadata().set_term(1);
        snap.mut_snapshot().mut_metadata().mut_conf_state().set_voters(vec![1, 2, 3]);
        assert!(screen_inbound(&mut snap, 7));
    }

    /// Conf states raft-rs restores from a snapshot: the screen lets through exactly those it restores as
    /// given (raft-rs panics "invalid restore" on the others; found by fuzzing, `raft_step`).
    #[test]
    fn only_conf_states_joint_consensus_produces_pass() {
        use raft::eraftpb::ConfState;
        let cs = |voters: &[u64], learners: &[u64], outgoing: &[u64], next: &[u64], auto_leave: bool| ConfState {
            voters: voters.to_vec(),
            learners: learners.to_vec(),
            voters_outgoing: outgoing.to_vec(),
            learners_next: next.to_vec(),
            auto_leave,
            ..Default::default()
        };
        for (what, c, ok) in [
            ("three voters", cs(&[1, 2, 3], &[], &[], &[], false), true),
            ("voters and a learner", cs(&[2, 3], &[1], &[], &[], false), true),
            ("joint, 1 leaving to learner", cs(&[2, 3], &[], &[1, 2, 3], &[1], true), true),
            ("no voter", cs(&[], &[1], &[], &[], false), false),
            ("a voter twice", cs(&[2, 2, 3], &[], &[], &[], false), false),
            ("voter and learner", cs(&[1, 2], &[1], &[], &[], false), false),
            ("learner-next outside a joint config", cs(&[2, 3], &[], &[], &[1], false), false),
            ("auto-leave outside a joint config", cs(&[2, 3], &[], &[], &[], true), false),
            ("learner-next not an outgoing voter", cs(&[2, 3], &[], &[2, 3], &[1], false), false),
            ("learner-next also an incoming voter", cs(&[1, 2], &[], &[1, 2, 3], &[1], false), false),
            ("learner also an outgoing voter", cs(&[2, 3], &[1], &[1, 2, 3], &[], false), false),
            ("raft ID 0", cs(&[0, 2], &[], &[], &[], false), false),
        ] {
            assert_eq!(conf_state_is_consistent(&c), ok, "{what}");
        }
    }

    /// What a peer never sends: the local node's own timers and transport reports, and a forwarded
    /// leadership transfer with a term (raft-rs panics forwarding it; found by fuzzing, `raft_step`).
    #[test]
    fn local_only_messages_and_a_transfer_with_a_term_are_dropped() {
        use raft::eraftpb::MessageType::*;
        for kind in [MsgHup, MsgBeat, MsgCheckQuorum, MsgUnreachable, MsgSnapStatus] {
            let mut m = Message { msg_type: kind, from: 1, to: 2, ..Default::default() };
            assert!(!screen_inbound(&mut m, 7), "{kind:?}");
        }
        let mut transfer = Message { msg_type: MsgTransferLeader, from: 1, to: 2, term: 1, ..Default::default() };
        assert!(!screen_inbound(&mut transfer.clone(), 7));
        transfer.term = 0;
        assert!(screen_inbound(&mut transfer, 7));
    }
}
