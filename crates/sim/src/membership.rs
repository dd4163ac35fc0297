//! Raft membership changes in the simulation, made as the daemon makes them: a manager is demoted (the role
//! manager's `demote`: removed through `Core::propose_conf_change` once the others keep a reachable quorum; a
//! demoted leader first hands its leadership over) and a new manager joins (`RaftMembership.Join`: the leader
//! adds a voter with a fresh Raft ID, the new manager starts with `StartMode::Join`'s disk and catches up from
//! the leader's snapshot). A join whose answer is lost is retried with a new ID, and the member the lost
//! attempt may still have added is removed, as `RaftNode::add_member_with_id` replaces an unreachable member
//! at the joining address. A removed manager runs on for a while (until it learns it is a worker) and then
//! stops for good.
//!
//! Checked after every step: every manager has the same configuration at the same applied index; a member
//! removed, once a quorum of the configuration that removed it applied that, never leads a later term (it
//! may go on leading the term it leads then: raft-rs does not step a leader down when it applies its own
//! removal, and the daemon relies on its manager stopping once it is a worker); a leader's
//! commit index is durable on a majority of its configuration (before or after this step's change), so a
//! removed member never counts toward a quorum. At the end: every member's configuration is the expected one.
//!
//! Must not read the wall clock: time is the simulation's steps.

use std::collections::{BTreeMap, BTreeSet};

use raft::eraftpb::{ConfChange, ConfChangeType, ConfState};
use raft::StateRole;
use rand::Rng;
use shoal_raft::{Members, ProposeError, MEMBERSHIP_CHANGE_TIMEOUT};
use tokio::sync::oneshot;

use crate::manager::Manager;
use crate::net::Endpoint;
use crate::{index_of, World};

/// Steps between two passes of the reconciler (the role manager's pass), drawn in this range: a fixed period
/// equal to the election timeout would always look just after the leader's quorum check resets who was
/// heard from, and see no member reachable.
const PASS_STEPS: std::ops::Range<u64> = 5..16;
/// Voters the workload keeps most of the time (it goes to one fewer or one more between two changes).
pub(crate) const VOTERS: usize = 3;

/// A configuration, comparable: voters, learners, outgoing voters, each sorted.
type ConfKey = (Vec<u64>, Vec<u64>, Vec<u64>);

fn key(cs: &ConfState) -> ConfKey {
    let sorted = |v: &[u64]| {
        let mut v = v.to_vec();
        v.sort_unstable();
        v
    };
    (sorted(&cs.voters), sorted(&cs.learners), sorted(&cs.voters_outgoing))
}

/// A membership change proposed and not yet answered.
struct Op {
    join: bool,
    target: u64,
    done: oneshot::Receiver<Result<Members, ProposeError>>,
    deadline_step: u64,
}

/// The membership the workload wants, the change in flight and what the checks remember.
#[derive(Default)]
pub(crate) struct Membership {
    /// Whether the workload changes the membership at all.
    pub enabled: bool,
    /// Raft IDs meant to be voters.
    pub expected: BTreeSet<u64>,
    op: Option<Op>,
    next_pass_step: u64,
    next_change_step: u64,
    /// Removed managers still running, and the step they stop at.
    retire_at: BTreeMap<u64, u64>,
    /// Removed members whose removal a quorum of the new configuration applied, and the highest term any
    /// manager had then: they must never lead a later term (raft-rs lets a leader that applies its own
    /// removal go on leading its term; the daemon stops its manager once it is a worker).
    gone: BTreeMap<u64, u64>,
    /// The configuration at each applied index seen.
    conf_at: BTreeMap<u64, ConfKey>,
    /// Per leader: its voters and commit index at the last check, and its term.
    leading: BTreeMap<u64, (Vec<u64>, u64, u64)>,
    /// Membership changes applied (answered to the proposer).
    pub changes: u64,
}

impl Membership {
    pub(crate) fn new(voters: &[u64], enabled: bool) -> Membership {
        Membership { enabled, expected: voters.iter().copied().collect(), next_change_step: 60, ..Default::default() }
    }

    /// Whether nothing is in flight or pending: no change, no removed manager still running.
    pub(crate) fn settled(&self) -> bool {
        self.op.is_none() && self.retire_at.is_empty()
    }
}

impl World {
    /// A new manager slot (not started) under a fresh Raft ID; IDs are never reused.
    fn new_manager_id(&mut self) -> u64 {
        let id = self.managers.len() as u64 + 1;
        let clock = std::sync::Arc::new(shoal_store::ManualClock::new(crate::START_UNIX_MS));
        clock.set_unix_ms(shoal_store::Clock::now_unix_ms(&*self.clocks[0]));
        self.clocks.push(clock.clone());
        let seed = self.seed ^ (id << 56);
        self.managers.push(Manager::joining(id, Members::default(), clock, seed));
        self.net.set_down(Endpoint::Manager(id), true);
        id
    }

    /// One step of membership changes: stop removed managers whose time came, change what is wanted (fault
    /// phase), take the answer of the change in flight, and reconcile.
    pub(crate) fn step_membership(&mut self, writes: bool) {
        let due: Vec<u64> =
            self.members.retire_at.iter().filter(|(_, at)| **at <= self.step).map(|(id, _)| *id).collect();
        for id in due {
            self.members.retire_at.remove(&id);
            self.managers[index_of(id)].retire();
            self.net.set_down(Endpoint::Manager(id), true);
            self.forget_checks(id);
            self.event(format!("removed manager {id} stops (it is a worker now)"));
        }
        if !self.members.enabled {
            return;
        }
        // The operator changes the membership once the last change is done (the leader's members are the
        // wanted ones), so it stays within one voter of `VOTERS`.
        let done = self.members.op.is_none()
            && self.leader().and_then(|l| self.managers[index_of(l)].run.as_ref()).is_some_and(|r| {
                r.members().members.keys().copied().collect::<BTreeSet<u64>>() == self.members.expected
            });
        if writes && done && self.step >= self.members.next_change_step {
            self.members.next_change_step = self.step + self.rng.random_range(40..120);
            let n = self.members.expected.len();
            let add = n < VOTERS || (n == VOTERS && self.rng.random_bool(0.5));
            if add && n <= VOTERS {
                let id = self.new_manager_id();
                self.members.expected.insert(id);
                self.event(format!("wanted: a new manager joins as {id}"));
            } else if n >= VOTERS {
                let list: Vec<u64> = self.members.expected.iter().copied().collect();
                let id = list[self.rng.random_range(0..list.len())];
                self.members.expected.remove(&id);
                self.event(format!("wanted: manager {id} is demoted"));
            }
        }
        self.take_membership_answer();
        if self.members.op.is_none() && self.step >= self.members.next_pass_step {
            self.members.next_pass_step = self.step + self.rng.random_range(PASS_STEPS);
            self.reconcile_membership();
        }
    }

    /// At the heal: back to `VOTERS` wanted voters.
    pub(crate) fn heal_membership(&mut self) {
        if !self.members.enabled {
            return;
        }
        while self.members.expected.len() < VOTERS {
            let id = self.new_manager_id();
            self.members.expected.insert(id);
            self.event(format!("wanted: a new manager joins as {id}"));
        }
        while self.members.expected.len() > VOTERS {
            let id = *self.members.expected.last().expect("more than VOTERS");
            self.members.expected.remove(&id);
            self.event(format!("wanted: manager {id} is demoted"));
        }
    }

    fn take_membership_answer(&mut self) {
        let Some(op) = self.members.op.as_mut() else { return };
        let answer = match op.done.try_recv() {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(oneshot::error::TryRecvError::Closed) => Err("the leader stopped".into()),
            Err(oneshot::error::TryRecvError::Empty) if self.step >= op.deadline_step => {
                Err(format!("not applied within {MEMBERSHIP_CHANGE_TIMEOUT:?}"))
            }
            Err(oneshot::error::TryRecvError::Empty) => return,
        };
        let op = self.members.op.take().expect("in flight");
        match (op.join, answer) {
            (true, Ok(members)) => {
                self.members.changes += 1;
                let i = index_of(op.target);
                let (clock, seed) = (self.managers[i].clock.clone(), self.seed ^ (op.target << 56));
                self.managers[i] = Manager::joining(op.target, members, clock, seed);
                self.managers[i].start(&self.mcfg, &self.timer);
                self.net.set_down(Endpoint::Manager(op.target), false);
                self.event(format!("manager {} joined; it starts and waits for the leader's snapshot", op.target));
            }
            (true, Err(e)) => {
                // The joining manager's Join failed: it asks again and gets a new ID. The lost attempt's
                // member, if it is added after all, is not wanted (and is removed).
                self.members.expected.remove(&op.target);
                self.managers[index_of(op.target)].retired = true;
                let id = self.new_manager_id();
                self.members.expected.insert(id);
                self.event(format!("join of manager {} failed ({e}); it joins again as {id}", op.target));
            }
            (false, Ok(_)) => {
                self.members.changes += 1;
                let m = &mut self.managers[index_of(op.target)];
                if m.may_run() {
                    let at = self.step + self.rng.random_range(0..=50);
                    self.members.retire_at.insert(op.target, at);
                } else {
                    m.retired = true;
                }
                self.event(format!("manager {} removed from raft", op.target));
            }
            (false, Err(e)) => self.event(format!("removal of manager {} failed ({e}); retried", op.target)),
        }
    }

    /// The role manager's pass on the leader: remove a member that is not wanted (once the others keep a
    /// reachable quorum; a leader that is not wanted hands its leadership over), else add a wanted one.
    fn reconcile_membership(&mut self) {
        let Some(leader) = self.leader() else { return };
        let step = self.step;
        let expected = self.members.expected.clone();
        let run = self.managers[index_of(leader)].run.as_mut().expect("the leader is up");
        let members = run.members();
        let reachable = run.reachable();
        // A demoted manager whose removal was answered with an error but applied after all: the role
        // manager's next pass finds it out of Raft and makes it a worker, and it stops.
        let out: Vec<u64> = self
            .managers
            .iter()
            .filter(|m| m.may_run() && !expected.contains(&m.id) && !members.members.contains_key(&m.id))
            .map(|m| m.id)
            .filter(|id| !self.members.retire_at.contains_key(id))
            .collect();
        for id in out {
            let at = step + self.rng.random_range(0..=50);
            self.members.retire_at.insert(id, at);
            self.event(format!("manager {id} is out of raft: it stops by step {at}"));
        }
        let run = self.managers[index_of(leader)].run.as_mut().expect("the leader is up");
        let deadline_step = step + u64::try_from(MEMBERSHIP_CHANGE_TIMEOUT.as_millis()).unwrap_or(0) / crate::STEP_MS;
        let mut cc = ConfChange::default();
        // `RaftNode::removal_keeps_quorum`: the members left must have a reachable quorum. A member whose
        // join answer was lost (never started, unreachable) goes first: the joining manager's next Join
        // replaces it.
        let keeps_quorum = |t: u64| {
            let remaining: Vec<u64> = members.members.keys().copied().filter(|id| *id != t).collect();
            let alive = remaining.iter().filter(|id| reachable.get(id) == Some(&true)).count();
            !remaining.is_empty() && alive > remaining.len() / 2
        };
        let extra: Vec<u64> = members.members.keys().copied().filter(|id| !expected.contains(id)).collect();
        let removable = extra.iter().copied().find(|t| *t != leader && keeps_quorum(*t));
        let (join, target) = if let Some(t) = removable {
            cc.set_change_type(ConfChangeType::RemoveNode);
            (false, t)
        } else if extra.contains(&leader) {
            let to = members.members.keys().copied().find(|id| *id != leader && reachable.get(id) == Some(&true));
            let ok = to.map(|to| run.transfer_leader(to));
            self.event(format!("demoted leader {leader} hands leadership to {to:?} ({ok:?})"));
            return;
        } else if !extra.is_empty() {
            self.event(format!("removal of {extra:?} postponed: no reachable quorum without it ({reachable:?})"));
            return;
        } else if let Some(t) = expected.iter().copied().find(|id| !members.members.contains_key(id)) {
            let member = crate::disk::member(t);
            cc.set_change_type(ConfChangeType::AddNode);
            cc.context = prost::Message::encode_to_vec(&member.to_wire()).into();
            (true, t)
        } else {
            return;
        };
        cc.node_id = target;
        let (done, rx) = oneshot::channel();
        let index = run.propose_conf_change(cc, done);
        self.members.op = Some(Op { join, target, done: rx, deadline_step });
        let what = if join { "add" } else { "remove" };
        self.event(format!("membership: leader {leader} proposes to {what} manager {target} (index {index:?})"));
    }

    /// The membership checks of every step (module docs).
    pub(crate) fn check_membership(&mut self) -> Result<(), String> {
        for m in &self.managers {
            let Some(run) = &m.run else { continue };
            let applied = run.applied();
            if applied == 0 {
                continue;
            }
            let k = key(&run.conf_state());
            match self.members.conf_at.get(&applied) {
                Some(first) if *first != k => {
                    return Err(format!(
                        "manager {} has configuration {k:?} at applied index {applied}; another had {first:?}",
                        m.id
                    ));
                }
                Some(_) => {}
                None => {
                    self.members.conf_at.insert(applied, k);
                }
            }
        }
        self.find_gone();
        for m in &self.managers {
            let Some(run) = &m.run else { continue };
            let (role, term, _) = run.raft_state();
            let gone_in = self.members.gone.get(&m.id).copied();
            if role == StateRole::Leader && gone_in.is_some_and(|t| term > t) {
                return Err(format!(
                    "manager {} leads term {term}, begun after a quorum of the configuration that removed it applied \
                     that (in term {gone_in:?}) \
                     ({}; its voters {:?}; configurations applied {:?})",
                    m.id,
                    run.debug_raft(),
                    run.conf_state().voters,
                    self.members.conf_at.iter().rev().take(3).collect::<Vec<_>>()
                ));
            }
        }
        self.check_commit_quorums()
    }

    /// Members whose removal a quorum of the new configuration applied (a running member whose configuration
    /// lacks it and whose applied index is at or past the first index seen without it).
    fn find_gone(&mut self) {
        let mut present: BTreeSet<u64> = BTreeSet::new();
        let mut removed: BTreeMap<u64, (u64, Vec<u64>)> = BTreeMap::new();
        for (index, (voters, _, _)) in &self.members.conf_at {
            for id in &present {
                if !voters.contains(id) {
                    removed.entry(*id).or_insert((*index, voters.clone()));
                }
            }
            present.extend(voters.iter().copied());
        }
        for (id, (index, voters)) in removed {
            if self.members.gone.contains_key(&id) {
                continue;
            }
            let applied = voters
                .iter()
                .filter(|v| {
                    self.managers
                        .get(index_of(**v))
                        .and_then(|m| m.run.as_ref())
                        .is_some_and(|r| r.applied() >= index && !r.conf_state().voters.contains(&id))
                })
                .count();
            if applied > voters.len() / 2 {
                let term = self.managers.iter().filter_map(|m| m.run.as_ref().map(|r| r.raft_state().1)).max();
                self.members.gone.insert(id, term.unwrap_or(0));
            }
        }
    }

    /// A leader's new commit index is on the disks of a majority of its voters (as of the last check or now).
    fn check_commit_quorums(&mut self) -> Result<(), String> {
        let mut now = BTreeMap::new();
        for m in &self.managers {
            let Some(run) = &m.run else { continue };
            let (role, term, _) = run.raft_state();
            if role != StateRole::Leader {
                continue;
            }
            let voters = run.conf_state().voters;
            let commit = run.commit();
            if let Some((before, prev_commit, prev_term)) = self.members.leading.get(&m.id) {
                let fresh = *prev_term == term && commit > *prev_commit;
                let entry_term = m.durable_term(commit).filter(|t| *t != 0);
                if let (true, Some(entry_term)) = (fresh, entry_term) {
                    let holds = |v: &u64| {
                        self.managers
                            .get(index_of(*v))
                            .and_then(|x| x.durable_term(commit))
                            .is_some_and(|t| t == 0 || t == entry_term)
                    };
                    let quorum = |vs: &[u64]| vs.iter().filter(|v| holds(v)).count() > vs.len() / 2;
                    if !quorum(before) && !quorum(&voters) {
                        let holders: Vec<u64> = self.managers.iter().map(|x| x.id).filter(|v| holds(v)).collect();
                        return Err(format!(
                            "leader {} committed index {commit} (term {entry_term}) held only by {holders:?}; its \
                             voters were {before:?} and are {voters:?}",
                            m.id
                        ));
                    }
                }
            }
            now.insert(m.id, (voters, commit, term));
        }
        self.members.leading = now;
        Ok(())
    }

    /// Why the membership has not converged to the wanted one (None: it has).
    pub(crate) fn membership_not_converged(&self) -> Option<String> {
        if !self.members.settled() {
            return Some("a membership change is in flight or a removed manager still runs".into());
        }
        let want: Vec<u64> = self.members.expected.iter().copied().collect();
        for m in &self.managers {
            let wanted = self.members.expected.contains(&m.id);
            match &m.run {
                None if wanted => return Some(format!("wanted manager {} is not running", m.id)),
                Some(_) if !wanted => return Some(format!("manager {} runs but is not wanted", m.id)),
                Some(run) if key(&run.conf_state()) != (want.clone(), Vec::new(), Vec::new()) => {
                    return Some(format!("manager {} has voters {:?}, wanted {want:?}", m.id, run.conf_state().voters));
                }
                _ => {}
            }
        }
        None
    }
}
