//! A deterministic simulation of a whole Shoal cluster in one thread, driven by one seed (as FoundationDB's
//! and TigerBeetle's simulators): three managers (raft-rs's `RawNode` over a simulated disk, each with its
//! store, the real leader-only subsystems and the real dispatcher), simulated agents running tasks, a
//! simulated network, per-manager wall clocks, and an API client writing through the control API. Every
//! random choice comes from one `StdRng` seeded with the seed; time is a step counter; futures are polled
//! in a fixed order (`exec`). A run is a fault phase (crashes with or without loss of unsynced writes,
//! restarts, partitions, message loss and delay, clock jumps, agent crashes, task failures, under the
//! random workload) and then a heal phase (everything restarted and reconnected, no faults, no new writes)
//! in which every service must converge within a bounded number of steps.
//!
//! Checked after every step (`checks`): no acknowledged write lost (its entry is at its index on every
//! manager that applied that index, and an acknowledged service exists on every manager that applied it
//! unless a removal was sent), the same entry at each index on every manager, at most one leader per term,
//! no slot running two tasks except while a node is or was just cut off (SwarmKit replaces the tasks of
//! a node it marks down, which may still run them), and the workload's single-node cluster volume never
//! published to two nodes at once at its plugin (`csi`). At the end: one leader, identical stores, every
//! service's tasks running as its spec says, and nothing else running.
//!
//! `run(seed, &SimConfig)` returns a `Report` or a `Failure` naming the seed, the step and the check; the
//! same seed replays the same run exactly. The test `tests/sim.rs` runs many seeds (README.md).
//!
//! Must not read the wall clock, spawn threads or open sockets.

pub mod agent;
pub mod csi;
pub mod disk;
pub mod exec;
pub mod manager;
mod membership;
pub mod net;
pub mod workload;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use raft::StateRole;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shoal_api::{Service, Task, TaskState};
use shoal_manager::ClusterState;
use shoal_manager::DispatcherConfig;
use shoal_store::{ManualClock, StoreObject, Tables};

use agent::Agent;
use manager::{Manager, ManagerConfig, Msg};
use net::{Endpoint, Lane, Network};
use shoal_manager::ManualTimer;
use workload::Client;

/// Length of one step of simulated time (one Raft tick), in ms.
pub const STEP_MS: u64 = 100;
/// Wall-clock time at the start of a run (any fixed value).
pub const START_UNIX_MS: u64 = 1_700_000_000_000;
/// How long after a node was cut off its old tasks may still run beside their replacements, in ms: the
/// heartbeat TTL the leader waits before it marks the node down, plus the time to reconnect and stop them.
pub const CUT_OFF_GRACE_MS: u64 = 6_000;

/// What one run does.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Managers (Raft voters).
    pub managers: usize,
    /// Agents.
    pub agents: usize,
    /// Steps with faults and writes.
    pub fault_steps: u64,
    /// Most steps the cluster may take to converge once faults stop.
    pub converge_steps: u64,
    /// Inject faults (false: only the workload).
    pub faults: bool,
    /// Followers probe a silent leader as the daemon's transport does (`Transport::probe`); false: they wait
    /// out the election timeout, as without the probe.
    pub probe_leaders: bool,
    /// The workload demotes managers and has new ones join (`membership`); false: fixed voters.
    pub membership_changes: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            managers: 3,
            agents: 4,
            fault_steps: 400,
            converge_steps: 1200,
            faults: true,
            probe_leaders: true,
            membership_changes: true,
        }
    }
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Steps run.
    pub steps: u64,
    /// Steps the heal phase took to converge.
    pub converge_steps: u64,
    /// Requests sent, acknowledged, refused, of unknown outcome.
    pub sent: u64,
    /// Acknowledged (reads included).
    pub acked: u64,
    /// Reads through a read barrier that passed (each checked against the acknowledged writes).
    pub reads: u64,
    /// Writes followers forwarded that the leader appended.
    pub forwarded: u64,
    /// The most network addresses (tasks' and VIPs') held at once on a manager.
    pub most_addresses: usize,
    /// Unknown outcome.
    pub unknown: u64,
    /// Faults injected.
    pub faults: u64,
    /// Leaders elected (distinct terms with a leader).
    pub terms: u64,
    /// Highest commit index.
    pub commit: u64,
    /// Messages delivered and lost.
    pub delivered: u64,
    /// Messages lost.
    pub lost: u64,
    /// A digest of the run's events: equal for two runs of one seed.
    pub trace: u64,
    /// The leader-only loops a leader ran (the first seen), by name.
    pub leader_loops: Vec<&'static str>,
    /// The cluster volume's publications and unpublications at the simulated CSI plugin.
    pub volume_publications: (u64, u64),
    /// Raft membership changes applied (managers removed and added).
    pub membership_changes: u64,
}

/// A check that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The seed.
    pub seed: u64,
    /// The step it failed at.
    pub step: u64,
    /// What was wrong.
    pub what: String,
    /// The last events before it.
    pub recent: Vec<String>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "simulation seed {} failed at step {}: {}", self.seed, self.step, self.what)?;
        writeln!(f, "replay: SHOAL_SIM_SEED={} cargo nextest run -p shoal-sim sim_seeds_0", self.seed)?;
        writeln!(f, "last events:")?;
        for e in &self.recent {
            writeln!(f, "  {e}")?;
        }
        Ok(())
    }
}

struct World {
    seed: u64,
    mcfg: ManagerConfig,
    /// Membership changes: what is wanted, the change in flight, what the checks remember.
    members: membership::Membership,
    rng: StdRng,
    step: u64,
    timer: Arc<ManualTimer>,
    clocks: Vec<Arc<ManualClock>>,
    managers: Vec<Manager>,
    agents: Vec<Agent>,
    node_ids: Vec<String>,
    net: Network<Msg>,
    client: Client,
    fail_chance: f64,
    /// `SimConfig::probe_leaders`.
    probe_leaders: bool,
    /// Writes followers forwarded that the leader appended.
    forwarded: u64,
    /// The most addresses held at once in the workload's network (tasks and VIPs), as checked.
    most_addresses: std::cell::Cell<usize>,
    /// Leader per term.
    leaders: BTreeMap<u64, u64>,
    /// The entry at each index as first applied anywhere: (term, digest).
    entries: BTreeMap<u64, (u64, u64)>,
    /// Per manager: the highest index already compared with `entries`.
    checked: BTreeMap<u64, u64>,
    /// Per manager (since its start): the applied index and each task's observed state at the last check.
    observed: BTreeMap<u64, (u64, BTreeMap<String, i32>)>,
    /// Services seen with a start-first update config (in any spec, at any time): their slots may hold
    /// old-spec tasks beside the current one until the updater reaches them.
    start_first: std::cell::RefCell<BTreeSet<String>>,
    /// Nodes the leader's store showed DOWN at the last check.
    down: BTreeSet<String>,
    recent: std::collections::VecDeque<String>,
    /// Every event, when tracing (`run_traced`).
    full: Option<Vec<String>>,
    trace: u64,
    leader_loops: Vec<&'static str>,
    faults: u64,
}

impl World {
    fn new(seed: u64, cfg: &SimConfig) -> World {
        let voters: Vec<u64> = (1..=cfg.managers as u64).collect();
        let mcfg = ManagerConfig {
            voters: voters.clone(),
            snapshot_interval_entries: 40,
            log_entries_for_slow_followers: 10,
            dispatcher: DispatcherConfig { heartbeat_period_ms_default: 1000, ..Default::default() },
            csi: csi::SimCsi::default(),
        };
        let timer = Arc::new(ManualTimer::default());
        let clocks: Vec<Arc<ManualClock>> = voters.iter().map(|_| Arc::new(ManualClock::new(START_UNIX_MS))).collect();
        let mut managers: Vec<Manager> = voters
            .iter()
            .map(|id| Manager::new(*id, &mcfg, clocks[index_of(*id)].clone(), seed ^ (id << 56)))
            .collect();
        for m in &mut managers {
            m.start(&mcfg, &timer);
        }
        let node_ids: Vec<String> = (0..cfg.agents).map(|i| format!("node{i:02}")).collect();
        let agents = node_ids.iter().enumerate().map(|(i, n)| Agent::new(i, n.clone())).collect();
        World {
            seed,
            members: membership::Membership::new(&voters, cfg.membership_changes),
            mcfg,
            rng: StdRng::seed_from_u64(seed),
            step: 0,
            timer,
            clocks,
            managers,
            agents,
            node_ids,
            net: Network::new(),
            client: Client::default(),
            fail_chance: 0.0,
            probe_leaders: cfg.probe_leaders,
            forwarded: 0,
            most_addresses: Default::default(),
            leaders: BTreeMap::new(),
            entries: BTreeMap::new(),
            checked: BTreeMap::new(),
            observed: BTreeMap::new(),
            start_first: Default::default(),
            down: BTreeSet::new(),
            recent: Default::default(),
            full: None,
            trace: 0xcbf2_9ce4_8422_2325,
            leader_loops: Vec::new(),
            faults: 0,
        }
    }

    fn now_ms(&self) -> u64 {
        use shoal_manager::Timer;
        self.timer.now_ms()
    }

    fn event(&mut self, e: String) {
        self.trace = manager::digest(&[self.trace.to_le_bytes().as_slice(), e.as_bytes()].concat());
        if self.recent.len() >= 40 {
            self.recent.pop_front();
        }
        self.recent.push_back(format!("[{}] {e}", self.step));
        if let Some(full) = &mut self.full {
            full.push(format!("[{}] {e}", self.step));
        }
    }

    fn fail(&self, what: String, seed: u64) -> Failure {
        Failure { seed, step: self.step, what, recent: self.recent.iter().cloned().collect() }
    }

    /// A manager restarted: its store starts again from its disk.
    fn forget_checks(&mut self, id: u64) {
        self.checked.remove(&id);
        self.observed.remove(&id);
    }

    /// The managers that may run (started, not removed and stopped).
    fn manager_ids(&self) -> Vec<u64> {
        self.managers.iter().filter(|m| m.may_run()).map(|m| m.id).collect()
    }

    /// Faults of one step of the fault phase.
    fn inject_faults(&mut self) {
        let r = self.rng.random_range(0..1000);
        let n = self.managers.len();
        let a = self.agents.len();
        let event = match r {
            0..=4 => {
                let i = self.rng.random_range(0..n);
                if !self.managers[i].is_up() {
                    return;
                }
                let lose = self.rng.random_bool(0.5);
                self.managers[i].crash(lose);
                self.net.set_down(Endpoint::Manager(self.managers[i].id), true);
                format!(
                    "crash manager {} (unsynced writes {})",
                    self.managers[i].id,
                    if lose { "lost" } else { "kept" }
                )
            }
            5..=24 => {
                let i = self.rng.random_range(0..n);
                if self.managers[i].is_up() || !self.managers[i].may_run() {
                    return;
                }
                self.managers[i].start(&self.mcfg, &self.timer);
                self.forget_checks(self.managers[i].id);
                self.net.set_down(Endpoint::Manager(self.managers[i].id), false);
                format!("restart manager {}", self.managers[i].id)
            }
            25..=32 => {
                let mut sides = BTreeMap::new();
                for m in self.manager_ids() {
                    sides.insert(Endpoint::Manager(m), self.rng.random_range(0..2u8));
                }
                for i in 0..a {
                    sides.insert(Endpoint::Agent(i), self.rng.random_range(0..2u8));
                }
                let text = format!("partition {sides:?}");
                self.net.partition(sides);
                text
            }
            33..=52 if self.net.partitioned() => {
                self.net.partition(BTreeMap::new());
                "heal partition".into()
            }
            53..=60 => {
                self.net.loss = [0.0, 0.02, 0.1, 0.3][self.rng.random_range(0..4)];
                self.net.max_delay_steps = self.rng.random_range(0..=5);
                format!("network loss {} delay <= {} steps", self.net.loss, self.net.max_delay_steps)
            }
            61..=63 => {
                let i = self.rng.random_range(0..n);
                if self.rng.random_bool(0.7) {
                    let jump = self.rng.random_range(1_000..120_000);
                    self.clocks[i].advance_ms(jump);
                    format!("clock of manager {} jumps {jump} ms forward", i + 1)
                } else {
                    let jump = self.rng.random_range(1_000..10_000);
                    let now = shoal_store::Clock::now_unix_ms(&*self.clocks[i]);
                    self.clocks[i].set_unix_ms(now - jump);
                    format!("clock of manager {} jumps {jump} ms back", i + 1)
                }
            }
            64..=66 => {
                let i = self.rng.random_range(0..a);
                if !self.agents[i].up {
                    return;
                }
                self.agents[i].crash();
                self.net.set_down(Endpoint::Agent(i), true);
                format!("crash agent {i}")
            }
            67..=86 => {
                let i = self.rng.random_range(0..a);
                if self.agents[i].up {
                    return;
                }
                let now = self.now_ms();
                self.agents[i].restart(now);
                self.net.set_down(Endpoint::Agent(i), false);
                format!("restart agent {i}")
            }
            87..=90 => {
                self.fail_chance = [0.0, 0.001, 0.01][self.rng.random_range(0..3)];
                format!("task failure chance {}", self.fail_chance)
            }
            _ => return,
        };
        self.faults += 1;
        self.event(event);
    }

    /// Ends every fault: all up, healed, lossless, no task failures.
    fn heal(&mut self) {
        self.heal_membership();
        for i in 0..self.managers.len() {
            if !self.managers[i].may_run() {
                continue;
            }
            if !self.managers[i].is_up() {
                self.managers[i].start(&self.mcfg, &self.timer);
                self.forget_checks(self.managers[i].id);
            }
            self.net.set_down(Endpoint::Manager(self.managers[i].id), false);
        }
        let now = self.now_ms();
        for i in 0..self.agents.len() {
            if !self.agents[i].up {
                self.agents[i].restart(now);
            }
            self.net.set_down(Endpoint::Agent(i), false);
        }
        self.net.partition(BTreeMap::new());
        self.net.loss = 0.0;
        self.net.max_delay_steps = 1;
        self.fail_chance = 0.0;
        self.event("heal: faults stop".into());
    }

    fn send(&mut self, from: Endpoint, out: Vec<(Endpoint, Msg)>) {
        let now = self.step;
        for (to, msg) in out {
            let lane = if matches!(msg, Msg::Raft(_)) { Lane::Datagram } else { Lane::Stream };
            let snapshot = matches!(&msg, Msg::Raft(m) if m.get_msg_type() == raft::eraftpb::MessageType::MsgSnapshot);
            self.net.send(&mut self.rng, now, lane, from, to, msg, snapshot);
        }
    }

    /// One step of everything.
    fn tick(&mut self, writes: bool) {
        self.step += 1;
        self.timer.advance_ms(STEP_MS);
        for c in &self.clocks {
            c.advance_ms(STEP_MS);
        }
        let now_ms = self.now_ms();
        let ids = self.manager_ids();
        self.deliver(now_ms, &ids);
        self.step_membership(writes);
        // The API client.
        let states: BTreeMap<u64, ClusterState> =
            self.managers.iter().filter_map(|m| m.run.as_ref().map(|r| (m.id, r.state.clone()))).collect();
        let events = self.client.step(now_ms, writes, &states, &mut self.rng);
        for e in events {
            self.event(e);
        }
        self.step_managers(now_ms);
        self.resolve_acknowledged();
        self.step_agents(now_ms, &ids);
        self.trace_step();
    }

    /// Delivers the messages due this step, the snapshot losses, and the broken streams (`ids`: the
    /// managers').
    fn deliver(&mut self, now_ms: u64, ids: &[u64]) {
        for env in self.net.due(&mut self.rng, self.step) {
            match (env.from, env.to, env.msg) {
                (from, Endpoint::Manager(m), Msg::Raft(msg)) => {
                    let snapshot = msg.get_msg_type() == raft::eraftpb::MessageType::MsgSnapshot;
                    if let Some(run) = self.managers[index_of(m)].run.as_mut() {
                        run.step_raft(*msg);
                    }
                    // The transport reports a snapshot it delivered (`PeerLink::report_snapshot`).
                    if let (true, Endpoint::Manager(f)) = (snapshot, from) {
                        if let Some(run) = self.managers[index_of(f)].run.as_mut() {
                            run.report_snapshot(m, true);
                        }
                    }
                }
                (Endpoint::Manager(f), Endpoint::Manager(m), Msg::Forward { id, data }) => {
                    let out = match self.managers[index_of(m)].run.as_mut() {
                        Some(run) => run.receive_forward(f, id, data),
                        None => Vec::new(),
                    };
                    self.send(Endpoint::Manager(m), out);
                }
                (_, Endpoint::Manager(m), Msg::Forwarded { id, result }) => {
                    self.forwarded += u64::from(result.is_ok());
                    if let Some(run) = self.managers[index_of(m)].run.as_mut() {
                        run.receive_forwarded(id, result);
                    }
                }
                (Endpoint::Agent(a), Endpoint::Manager(m), msg) => {
                    let node = self.node_ids[a].clone();
                    let out = match self.managers[index_of(m)].run.as_mut() {
                        Some(run) => run.receive_from_agent(now_ms, a, &node, msg),
                        None => Vec::new(),
                    };
                    self.send(Endpoint::Manager(m), out);
                }
                (Endpoint::Manager(m), Endpoint::Agent(a), msg) => self.agents[a].receive(now_ms, m, msg, ids),
                _ => {}
            }
        }
        for (from, to) in std::mem::take(&mut self.net.lost_notices) {
            if let (Endpoint::Manager(f), Endpoint::Manager(t)) = (from, to) {
                if let Some(run) = self.managers[index_of(f)].run.as_mut() {
                    run.report_snapshot(t, false);
                }
            }
        }
        for (from, to) in self.net.broken_due(self.step) {
            match (from, to) {
                (Endpoint::Agent(a), Endpoint::Manager(m)) | (Endpoint::Manager(m), Endpoint::Agent(a)) => {
                    self.agents[a].connection_broken(now_ms, m, ids);
                    if let Some(run) = self.managers[index_of(m)].run.as_mut() {
                        run.drop_stream(a);
                    }
                }
                _ => {}
            }
        }
    }

    /// Managers: subsystems, proposals, raft, agents' streams.
    fn step_managers(&mut self, now_ms: u64) {
        let crashed: Vec<u64> = match self.probe_leaders {
            true => self.managers.iter().filter(|m| !m.is_up()).map(|m| m.id).collect(),
            false => Vec::new(),
        };
        for i in 0..self.managers.len() {
            let id = self.managers[i].id;
            let Some(run) = self.managers[i].run.as_mut() else { continue };
            run.run_leader_loops();
            if self.leader_loops.is_empty() {
                self.leader_loops = run.leader_loop_names();
            }
            let forwards = run.take_proposals(now_ms);
            run.tick();
            // The daemon's transport probes a silent leader: a crashed manager's host refuses the connection
            // unless a partition is in the way (then the probe times out and says nothing).
            if let Some(leader) = run.silent_leader() {
                if crashed.contains(&leader) && self.net.same_side(Endpoint::Manager(id), Endpoint::Manager(leader)) {
                    run.peer_gone(leader);
                }
            }
            let msgs = run.raft_ready(now_ms);
            let mut out: Vec<(Endpoint, Msg)> =
                msgs.into_iter().map(|m| (Endpoint::Manager(m.to), Msg::Raft(Box::new(m)))).collect();
            out.extend(forwards);
            out.extend(run.serve_agents(&self.node_ids));
            self.send(Endpoint::Manager(id), out);
        }
    }

    /// Acknowledged writes: read the entry that carried each.
    fn resolve_acknowledged(&mut self) {
        for (what, m, index) in std::mem::take(&mut self.client.ledger.to_resolve) {
            let entry = self.managers[index_of(m)].run.as_ref().and_then(|r| r.applied_log.lock().get(&index).copied());
            if let Some((term, digest)) = entry {
                self.client.ledger.acked.push(workload::Acked { what, index, term, digest });
            }
        }
    }

    /// Agents, then who is cut off from the leader now (`ids`: the managers').
    fn step_agents(&mut self, now_ms: u64, ids: &[u64]) {
        let period = self.mcfg.dispatcher.heartbeat_period_ms_default;
        for i in 0..self.agents.len() {
            let out = self.agents[i].step(now_ms, period, ids, self.fail_chance, &mut self.rng);
            self.send(Endpoint::Agent(i), out);
        }
        // Who is cut off from the leader now.
        let leader = self.leader();
        for a in &mut self.agents {
            let healthy = a.up
                && leader.is_some_and(|l| {
                    a.session_manager() == Some(l) && self.net.connected(Endpoint::Agent(a.index), Endpoint::Manager(l))
                });
            if !healthy {
                a.last_cut_off_ms = now_ms;
            }
        }
    }

    /// Folds who leads and what each manager applied into the trace.
    fn trace_step(&mut self) {
        let leader = self.leader();
        let applied: Vec<(u64, u64)> = self
            .managers
            .iter()
            .filter_map(|m| m.run.as_ref().and_then(|r| r.applied_log.lock().last_key_value().map(|(i, e)| (*i, e.1))))
            .collect();
        let leader_text = format!("leader {leader:?} commit {} applied {applied:?}", self.max_commit());
        self.trace = manager::digest(&[self.trace.to_le_bytes().as_slice(), leader_text.as_bytes()].concat());
        if let Some(full) = &mut self.full {
            full.push(format!("[{}] {leader_text}", self.step));
        }
    }

    /// The manager that leads (as its subsystems see it), if exactly one does.
    fn leader(&self) -> Option<u64> {
        let leading: Vec<u64> = self
            .managers
            .iter()
            .filter(|m| m.run.as_ref().is_some_and(|r| r.leader_state().is_leader))
            .map(|m| m.id)
            .collect();
        match leading.as_slice() {
            [one] => Some(*one),
            [] => None,
            many => {
                // Two "leaders" of different terms can coexist briefly (the old one has not heard yet);
                // the newest term is the leader.
                many.iter()
                    .max_by_key(|id| self.managers[index_of(**id)].run.as_ref().map(|r| r.leader_state().term))
                    .copied()
            }
        }
    }

    fn max_commit(&self) -> u64 {
        self.managers.iter().filter_map(|m| m.run.as_ref().map(|r| r.commit())).max().unwrap_or(0)
    }

    /// The checks of every step.
    fn check(&mut self) -> Result<(), String> {
        if let Some(v) = self.mcfg.csi.violation() {
            return Err(v);
        }
        for m in &self.managers {
            let Some(run) = &m.run else { continue };
            let (role, term, _) = run.raft_state();
            if role == StateRole::Leader {
                if let Some(other) = self.leaders.insert(term, m.id) {
                    if other != m.id {
                        return Err(format!("two leaders in term {term}: managers {other} and {}", m.id));
                    }
                }
            }
            let from = self.checked.get(&m.id).copied().unwrap_or(0);
            let applied_log = run.applied_log.lock();
            for (index, entry) in applied_log.range(from + 1..) {
                match self.entries.get(index) {
                    Some(first) if first != entry => {
                        return Err(format!(
                            "manager {} applied entry {index} of term {} but another applied term {} there",
                            m.id, entry.0, first.0
                        ));
                    }
                    Some(_) => {}
                    None => {
                        self.entries.insert(*index, *entry);
                    }
                }
            }
            drop(applied_log);
            self.checked.insert(m.id, run.applied());
            // A task's observed state never moves backwards as a store applies the log.
            let states: BTreeMap<String, i32> = run
                .store
                .view(|t| t.tasks().iter().map(|x| (x.id.clone(), x.status.as_ref().map_or(0, |s| s.state))).collect());
            if let Some((applied, before)) = self.observed.get(&m.id) {
                if run.applied() >= *applied {
                    for (id, now) in &states {
                        if before.get(id).is_some_and(|b| now < b) {
                            return Err(format!(
                                "task {id}'s observed state moved backwards on manager {} ({:?} -> {:?})",
                                m.id,
                                TaskState::try_from(before[id]),
                                TaskState::try_from(*now)
                            ));
                        }
                    }
                }
            }
            self.observed.insert(m.id, (run.applied(), states));
            for a in &self.client.ledger.acked {
                if run.applied() < a.index {
                    continue;
                }
                if let Some(entry) = run.applied_log.lock().get(&a.index) {
                    if *entry != (a.term, a.digest) {
                        return Err(format!(
                            "acknowledged write lost: {} was entry {} of term {}; manager {} applied term {} there",
                            a.what, a.index, a.term, m.id, entry.0
                        ));
                    }
                }
            }
            let missing = run.store.view(|t| {
                self.client
                    .ledger
                    .created
                    .iter()
                    .find(|(id, index)| {
                        run.applied() >= **index
                            && !self.client.ledger.maybe_removed.contains(*id)
                            && t.services().get(id).is_none()
                    })
                    .map(|(id, index)| (id.clone(), *index))
            });
            if let Some((id, index)) = missing {
                return Err(format!(
                    "acknowledged service {id} (created at {index}) is missing on manager {} at {}",
                    m.id,
                    run.applied()
                ));
            }
        }
        // No node is marked down by a leader that heard its heartbeat well within the heartbeat TTL.
        if let Some(l) = self.leader() {
            let run = self.managers[index_of(l)].run.as_ref().expect("the leader is up");
            let down: BTreeSet<String> = run.store.view(|t| {
                t.nodes().iter().filter(|n| shoal_manager::node_is_down(Some(n))).map(|n| n.id.clone()).collect()
            });
            let period = self.mcfg.dispatcher.heartbeat_period_ms_default;
            let ttl = period * u64::from(self.mcfg.dispatcher.missed_heartbeats_before_down);
            let now = self.now_ms();
            for n in down.difference(&self.down) {
                if let Some(beat) = run.last_beat_ok_ms.get(n).filter(|b| now.saturating_sub(**b) + 2 * period < ttl) {
                    return Err(format!(
                        "manager {l} marked node {n} down {} ms after answering its heartbeat (heartbeat TTL {ttl} ms)",
                        now - beat
                    ));
                }
            }
            self.down = down;
        }
        if let Some(e) = self.client.ledger.internal_errors.first() {
            return Err(format!("the control API answered an internal error: {e}"));
        }
        if let Some(e) = self.client.ledger.stale_reads.first() {
            return Err(format!("a read through a read barrier missed an acknowledged write: {e}"));
        }
        self.check_membership()?;
        self.check_addresses()?;
        self.check_slots()
    }

    /// No slot runs two tasks, except tasks on nodes cut off within `CUT_OFF_GRACE_MS` (SwarmKit replaces
    /// the tasks of a node it marks down), and those SwarmKit replaces while they run: with start-first
    /// updates the old tasks of a slot run until their replacement does (and until the updater reaches the
    /// slot, when a later spec is stop-first), and a job's earlier iteration until it is shut down. So: at
    /// most one running task per slot (per node for global modes), counting for services that ever had a
    /// start-first spec only tasks of the current spec, and for jobs only the current iteration.
    /// No two holders of one address in a network, on any manager: tasks whose attachments hold theirs
    /// (observed RUNNING or earlier, as the allocator counts them), services' VIPs and nodes' own attachments.
    fn check_addresses(&self) -> Result<(), String> {
        let mut most = 0;
        for m in &self.managers {
            let Some(run) = &m.run else { continue };
            let dup = run.store.view(|t| {
                let mut held: BTreeMap<(String, String), String> = BTreeMap::new();
                let mut hold = |net: &str, addr: &str, who: String| {
                    let ip = addr.split('/').next().unwrap_or(addr).to_string();
                    match held.insert((net.to_string(), ip.clone()), who.clone()) {
                        Some(other) if other != who => Some(format!("{ip} in network {net}: {other} and {who}")),
                        _ => None,
                    }
                };
                for task in t.tasks().iter() {
                    let observed = task.status.as_ref().map(|s| s.state()).unwrap_or(TaskState::New);
                    if observed > TaskState::Running {
                        continue;
                    }
                    for a in &task.networks {
                        let Some(n) = &a.network else { continue };
                        for addr in &a.addresses {
                            if let Some(d) = hold(&n.id, addr, format!("task {}", task.id)) {
                                return Some(d);
                            }
                        }
                    }
                }
                // A node's own attachments (ingress, and the networks of its tasks) hold theirs too.
                for node in t.nodes().iter() {
                    for a in &node.attachments {
                        let Some(n) = &a.network else { continue };
                        for addr in &a.addresses {
                            if let Some(d) = hold(&n.id, addr, format!("node {}", node.id)) {
                                return Some(d);
                            }
                        }
                    }
                }
                for s in t.services().iter() {
                    for vip in s.endpoint.as_ref().map(|e| e.virtual_ips.as_slice()).unwrap_or_default() {
                        if let Some(d) = hold(&vip.network_id, &vip.addr, format!("service {} (VIP)", s.id)) {
                            return Some(d);
                        }
                    }
                }
                most = most.max(held.len());
                None
            });
            if let Some(d) = dup {
                return Err(format!("manager {} holds one address twice: {d}", m.id));
            }
        }
        self.most_addresses.set(self.most_addresses.get().max(most));
        Ok(())
    }

    fn check_slots(&self) -> Result<(), String> {
        use shoal_api::service_spec::Mode;
        struct Kind {
            global: bool,
            start_first: bool,
            spec_version: u64,
            iteration: Option<u64>,
            text: String,
        }
        let now = self.now_ms();
        let mut kinds: BTreeMap<String, Kind> = BTreeMap::new();
        // The leader's view first (then the others', for services only they still hold).
        let mut order: Vec<&Manager> = self.managers.iter().collect();
        order.sort_by_key(|m| Some(m.id) != self.leader());
        for m in order {
            let Some(run) = &m.run else { continue };
            run.store.view(|t| {
                for s in t.services().iter() {
                    let mode = s.spec.as_ref().and_then(|sp| sp.mode.as_ref());
                    let start_first = [s.spec.as_ref(), s.previous_spec.as_ref()].into_iter().flatten().any(|sp| {
                        sp.update
                            .as_ref()
                            .is_some_and(|u| u.order == shoal_api::update_config::UpdateOrder::StartFirst as i32)
                    });
                    let start_first = start_first || self.start_first.borrow().contains(&s.id);
                    if start_first {
                        self.start_first.borrow_mut().insert(s.id.clone());
                    }
                    let job = shoal_manager::is_job(s);
                    kinds.entry(s.id.clone()).or_insert_with(|| Kind {
                        global: matches!(mode, Some(Mode::Global(_) | Mode::GlobalJob(_))),
                        start_first,
                        spec_version: s.spec_version.as_ref().map_or(0, |v| v.index),
                        iteration: job.then(|| shoal_manager::current_iteration(s)),
                        text: format!("{mode:?}, update {:?}", s.update_status.as_ref().map(|u| u.state())),
                    });
                }
            });
        }
        let mut by_slot: BTreeMap<(String, u64, String), Vec<(String, bool)>> = BTreeMap::new();
        for a in &self.agents {
            let excused = now.saturating_sub(a.last_cut_off_ms) <= CUT_OFF_GRACE_MS;
            for t in a.running() {
                // A service no manager holds any more: removed, its tasks being stopped.
                let Some(k) = kinds.get(&t.service_id) else { continue };
                if k.start_first && t.spec_version.as_ref().map_or(0, |v| v.index) != k.spec_version {
                    continue;
                }
                if k.iteration.is_some_and(|i| !shoal_manager::in_iteration(t, i)) {
                    continue;
                }
                let node = if k.global { t.node_id.clone() } else { String::new() };
                by_slot.entry((t.service_id.clone(), t.slot, node)).or_default().push((t.id.clone(), excused));
            }
        }
        for ((service, slot, node), tasks) in by_slot {
            let strict = tasks.iter().filter(|(_, excused)| !*excused).count();
            if tasks.len() > 1 && strict > 1 {
                return Err(format!(
                    "service {service} ({}) slot {slot}{} runs {} tasks ({:?}) on nodes that were not cut off; the \
                     leader has: {:?}",
                    kinds.get(&service).map_or("", |k| k.text.as_str()),
                    if node.is_empty() { String::new() } else { format!(" on {node}") },
                    tasks.len(),
                    tasks,
                    self.leader_tasks(&service)
                ));
            }
        }
        Ok(())
    }

    /// The tasks of a service in the leader's store, for failure messages.
    fn leader_tasks(&self, service: &str) -> Vec<String> {
        let Some(run) = self.leader().and_then(|l| self.managers[index_of(l)].run.as_ref()) else {
            return Vec::new();
        };
        run.store.view(|t| {
            let order = |sp: Option<&shoal_api::ServiceSpec>| {
                sp.map(|sp| {
                    let image = match sp.task.as_ref().and_then(|t| t.runtime.as_ref()) {
                        Some(shoal_api::task_spec::Runtime::Container(c)) => format!("{} {:?}", c.image, c.env),
                        _ => String::new(),
                    };
                    (image, sp.update.as_ref().map(|u| u.order))
                })
            };
            let head = t.services().get(service).map(|s| {
                format!(
                    "service v{} spec v{:?} {:?} previous v{:?} {:?} status {:?}",
                    s.version(),
                    s.spec_version.as_ref().map(|v| v.index),
                    order(s.spec.as_ref()),
                    s.previous_spec_version.as_ref().map(|v| v.index),
                    order(s.previous_spec.as_ref()),
                    s.update_status
                )
            });
            head.into_iter().chain(t.tasks().by_service(service).map(|x| describe_task(x))).collect()
        })
    }

    /// Why the cluster has not converged yet (None: it has).
    fn not_converged(&self) -> Option<String> {
        if let Some(why) = self.membership_not_converged() {
            return Some(why);
        }
        let leader = self.leader()?;
        let lrun = self.managers[index_of(leader)].run.as_ref()?;
        let index = lrun.applied();
        for m in self.managers.iter().filter(|m| m.may_run()) {
            let run = m.run.as_ref()?;
            if run.applied() != index || run.commit() != lrun.commit() {
                return Some(format!(
                    "manager {} applied {} / leader {index}; {}; leader's view: {}",
                    m.id,
                    run.applied(),
                    run.debug_raft(),
                    lrun.debug_progress(m.id)
                ));
            }
        }
        let summary = |t: &Tables| {
            let mut v: Vec<(String, u64)> = t.services().iter().map(|s| (s.id.clone(), s.version())).collect();
            v.extend(t.tasks().iter().map(|s| (s.id.clone(), s.version())));
            v.extend(t.nodes().iter().map(|s| (s.id.clone(), s.version())));
            v.sort();
            v
        };
        let want = lrun.store.view(summary);
        for m in self.managers.iter().filter(|m| m.may_run()) {
            if m.run.as_ref()?.store.view(summary) != want {
                return Some(format!("manager {}'s store differs from the leader's", m.id));
            }
        }
        for a in &self.agents {
            if a.session_manager() != Some(leader) {
                return Some(format!("agent {} has no session with the leader", a.index));
            }
        }
        let running: BTreeSet<String> = self.agents.iter().flat_map(|a| a.running().map(|t| t.id.clone())).collect();
        lrun.store.view(|t| {
            let mut expected = BTreeSet::new();
            for s in t.services().iter() {
                if let Some(why) = service_not_converged(t, s, &mut expected) {
                    return Some(why);
                }
            }
            if expected != running {
                let extra: Vec<&String> = running.difference(&expected).collect();
                let missing: Vec<&String> = expected.difference(&running).collect();
                return Some(format!("running tasks differ from the store: extra {extra:?}, missing {missing:?}"));
            }
            None
        })
    }
}

/// Why service `s` has not converged (its expected running tasks go into `expected`).
/// The position in `World::managers` of manager `id` (Raft ids are 1, 2, ... in order).
fn index_of(id: u64) -> usize {
    usize::try_from(id - 1).expect("a manager's Raft id counts from 1")
}

fn service_not_converged(t: &Tables, s: &Service, expected: &mut BTreeSet<String>) -> Option<String> {
    use shoal_api::update_status::UpdateState;
    let state = s.update_status.as_ref().map(|u| u.state());
    if matches!(state, Some(UpdateState::Updating | UpdateState::RollbackStarted)) {
        return Some(still_updating(t, s));
    }
    let paused = matches!(state, Some(UpdateState::Paused | UpdateState::RollbackPaused));
    let live: Vec<_> = t.tasks().by_service(&s.id).filter(|t| t.desired_state() <= TaskState::Running).collect();
    for task in &live {
        if let Some(why) = task_not_converged(t, s, task, paused, live.len()) {
            return Some(why);
        }
        expected.insert(task.id.clone());
    }
    let ready: Vec<&str> =
        t.nodes().iter().filter(|n| shoal_manager::is_ready_and_active(n)).map(|n| n.id.as_str()).collect();
    if shoal_manager::is_job(s) {
        return job_not_converged(t, s, &ready);
    }
    tasks_not_converged(s, &live, &ready)
}

/// Why service `s` has not converged while its update (or rollback) is in progress: its tasks.
fn still_updating(t: &Tables, s: &Service) -> String {
    let tasks: Vec<String> = t
        .tasks()
        .by_service(&s.id)
        .map(|t| {
            format!(
                "{} slot {} {:?}/{:?} v{:?} node {}",
                t.id,
                t.slot,
                t.status.as_ref().map(|s| s.state()),
                t.desired_state(),
                t.spec_version.as_ref().map(|v| v.index),
                t.node_id
            )
        })
        .collect();
    format!(
        "service {} is still updating ({:?}, spec v{:?}): {tasks:?}",
        s.id,
        s.update_status,
        s.spec_version.as_ref().map(|v| v.index)
    )
}

/// Why `task` of service `s` (`paused`: its update is; one of `live` tasks meant to run) has not converged:
/// not running, on a node not ready and active, or not up to date.
fn task_not_converged(t: &Tables, s: &Service, task: &Task, paused: bool, live: usize) -> Option<String> {
    if task.status.as_ref().map(|st| st.state()) != Some(TaskState::Running) {
        let st = task.status.clone().unwrap_or_default();
        return Some(format!(
            "task {} of service {} (slot {}) is not running: observed {:?} ({:?} {:?}), desired {:?}, node {:?}",
            task.id,
            s.id,
            task.slot,
            st.state(),
            st.message,
            st.err,
            task.desired_state(),
            task.node_id
        ));
    }
    let node = t.nodes().get(&task.node_id).map(|n| &**n);
    if !node.is_some_and(shoal_manager::is_ready_and_active) {
        return Some(format!(
            "task {} of service {} runs on node {:?}, which is not ready and active",
            task.id, s.id, task.node_id
        ));
    }
    if !paused && shoal_manager::is_task_dirty(s, task, node) {
        return Some(
            format!(
                "task {} of service {} is not up to date: task spec v{:?}, service spec v{:?}, update {:?}, {} tasks",
                task.id,
                s.id,
                task.spec_version.as_ref().map(|v| v.index),
                s.spec_version.as_ref().map(|v| v.index),
                s.update_status,
                live
            ) + &format!(
                "\n  service spec {:?}\n  previous {:?}\n  task spec {:?}\n  all: {:?}",
                s.spec.as_ref().map(|x| (&x.task, &x.mode, &x.update)),
                s.previous_spec.as_ref().map(|x| (&x.task, &x.mode)),
                task.spec,
                t.tasks().by_service(&s.id).map(|x| describe_task(x)).collect::<Vec<_>>()
            ),
        );
    }
    None
}

/// Why job `s` has not converged: its current iteration has not completed (on every ready node, `ready`,
/// for a global job).
fn job_not_converged(t: &Tables, s: &Service, ready: &[&str]) -> Option<String> {
    use shoal_api::service_spec::Mode;
    let iteration = shoal_manager::current_iteration(s);
    let current: Vec<_> = t.tasks().by_service(&s.id).filter(|t| shoal_manager::in_iteration(t, iteration)).collect();
    let complete: BTreeSet<(u64, &str)> = current
        .iter()
        .filter(|t| t.status.as_ref().map(|st| st.state()) == Some(TaskState::Complete))
        .map(|t| {
            if matches!(s.spec.as_ref().and_then(|sp| sp.mode.as_ref()), Some(Mode::GlobalJob(_))) {
                (0, t.node_id.as_str())
            } else {
                (t.slot, "")
            }
        })
        .collect();
    let done = match s.spec.as_ref().and_then(|sp| sp.mode.as_ref()) {
        Some(Mode::ReplicatedJob(j)) => complete.len() as u64 == j.total_completions,
        _ => ready.iter().all(|n| complete.contains(&(0, *n))),
    };
    if !done {
        return Some(format!("job {} iteration {iteration} has completed {complete:?}", s.id));
    }
    None
}

/// Why service `s` has not converged: its `live` tasks are not one per slot and as many as it wants, or
/// (global) not one on each ready node.
fn tasks_not_converged(s: &Service, live: &[&Arc<Task>], ready: &[&str]) -> Option<String> {
    use shoal_api::service_spec::Mode;
    match s.spec.as_ref().and_then(|sp| sp.mode.as_ref()) {
        Some(Mode::Replicated(r)) => {
            let slots: BTreeSet<u64> = live.iter().map(|t| t.slot).collect();
            if live.len() as u64 != r.replicas || slots.len() != live.len() {
                return Some(format!(
                    "service {} has {} tasks meant to run in {} slots, wants {}",
                    s.id,
                    live.len(),
                    slots.len(),
                    r.replicas
                ));
            }
        }
        Some(Mode::Global(_)) => {
            let nodes: BTreeSet<&str> = live.iter().map(|t| t.node_id.as_str()).collect();
            if nodes.len() != live.len() || live.len() != ready.len() {
                return Some(format!(
                    "global service {} has {} tasks on {} nodes, {} nodes ready",
                    s.id,
                    live.len(),
                    nodes.len(),
                    ready.len()
                ));
            }
        }
        _ => {}
    }
    None
}

/// Runs one seed: the fault phase, then the heal phase until the cluster converges.
pub fn run(seed: u64, cfg: &SimConfig) -> Result<Report, Failure> {
    run_world(World::new(seed, cfg), seed, cfg)
}

/// `run`, with every event of the run (to find where two runs part).
pub fn run_traced(seed: u64, cfg: &SimConfig) -> (Result<Report, Failure>, Vec<String>) {
    let mut w = World::new(seed, cfg);
    w.full = Some(Vec::new());
    let log = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    let result = run_world_with(w, seed, cfg, Some(log.clone()));
    let events = std::mem::take(&mut *log.lock());
    (result, events)
}

/// Steps (Raft ticks of `STEP_MS`) from a crash of the leader of a formed cluster, with no other fault and no
/// writes, to another manager leading; the invariants are checked at every step.
pub fn failover_steps(seed: u64, cfg: &SimConfig) -> Result<u64, Failure> {
    const LIMIT: u64 = 500;
    let mut w = World::new(seed, cfg);
    w.event(format!("seed {seed}: failover"));
    let old = loop {
        w.tick(false);
        w.check().map_err(|e| w.fail(e, seed))?;
        // Formed: a leader every manager follows.
        let leader =
            w.leader().filter(|l| w.managers.iter().all(|m| m.run.as_ref().is_some_and(|r| r.raft_state().2 == *l)));
        match leader {
            Some(l) if w.step > 20 => break l,
            _ if w.step > LIMIT => return Err(w.fail(format!("no leader within {LIMIT} steps"), seed)),
            _ => {}
        }
    };
    let i = index_of(old);
    w.managers[i].crash(false);
    w.net.set_down(Endpoint::Manager(old), true);
    w.event(format!("crash leader {old}"));
    let crashed_at = w.step;
    loop {
        w.tick(false);
        w.check().map_err(|e| w.fail(e, seed))?;
        if w.leader().is_some_and(|l| l != old) {
            return Ok(w.step - crashed_at);
        }
        if w.step - crashed_at > LIMIT {
            return Err(w.fail(format!("no new leader within {LIMIT} steps of the crash"), seed));
        }
    }
}

fn run_world(w: World, seed: u64, cfg: &SimConfig) -> Result<Report, Failure> {
    run_world_with(w, seed, cfg, None)
}

fn run_world_with(
    mut w: World,
    seed: u64,
    cfg: &SimConfig,
    log: Option<std::sync::Arc<parking_lot::Mutex<Vec<String>>>>,
) -> Result<Report, Failure> {
    let result = run_phases(&mut w, seed, cfg);
    if let (Some(log), Some(full)) = (log, w.full.take()) {
        *log.lock() = full;
    }
    result
}

fn run_phases(w: &mut World, seed: u64, cfg: &SimConfig) -> Result<Report, Failure> {
    w.event(format!("seed {seed}"));
    for _ in 0..cfg.fault_steps {
        if cfg.faults && w.step > 20 {
            w.inject_faults();
        }
        w.tick(true);
        w.check().map_err(|e| w.fail(e, seed))?;
    }
    w.heal();
    let heal_start = w.step;
    loop {
        w.tick(false);
        w.check().map_err(|e| w.fail(e, seed))?;
        if !w.client.busy() {
            match w.not_converged() {
                None => break,
                Some(why) if w.step - heal_start >= cfg.converge_steps => {
                    return Err(w.fail(
                        format!("not converged {} steps after the faults stopped: {why}", cfg.converge_steps),
                        seed,
                    ));
                }
                Some(_) => {}
            }
        }
    }
    let l = &w.client.ledger;
    Ok(Report {
        steps: w.step,
        converge_steps: w.step - heal_start,
        sent: l.sent,
        acked: l.ok,
        reads: l.reads,
        forwarded: w.forwarded,
        most_addresses: w.most_addresses.get(),
        unknown: l.unknown,
        faults: w.faults,
        terms: w.leaders.len() as u64,
        commit: w.max_commit(),
        delivered: w.net.delivered,
        lost: w.net.lost,
        trace: w.trace,
        leader_loops: w.leader_loops.clone(),
        volume_publications: w.mcfg.csi.publications(),
        membership_changes: w.members.changes,
    })
}

/// One task as the simulation's diagnostics print it: ID, slot, observed/desired state, spec version, node,
/// and when it was created (ms after the simulation's start).
fn describe_task(x: &shoal_api::Task) -> String {
    format!(
        "{} slot {} {:?}/{:?} spec v{:?} node {} created {} ms",
        x.id,
        x.slot,
        x.status.as_ref().map(|s| s.state()),
        x.desired_state(),
        x.spec_version.as_ref().map(|v| v.index),
        x.node_id,
        shoal_manager::created_ms(x).saturating_sub(START_UNIX_MS)
    )
}
