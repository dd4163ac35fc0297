//! A simulated agent (worker): a session with the leader's dispatcher (open, heartbeat every period, move
//! to another manager when refused or when the session breaks), the assignments it receives, and its
//! tasks run by a simulated executor. The task state machine follows the real agent: ASSIGNED, ACCEPTED,
//! PREPARING, READY, STARTING, RUNNING, one state per step, never past the desired state (desired READY
//! stops at READY; a job's task runs and then completes); desired SHUTDOWN or later stops the task
//! (SHUTDOWN); a running task may fail (FAILED) at the simulation's failure rate. A task that leaves the
//! assigned set is killed. An agent without a session keeps its tasks running, as the real one does. A
//! crash kills every task (processes die with the daemon); after a restart the agent reports FAILED the
//! tasks the COMPLETE set gives it that it had started before.
//!
//! `running()` is the ground truth the checks read: which tasks run where.
//!
//! Statuses are reported in order, the latest per task, one report in flight, retried until written.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::Rng;
use shoal_api::{assignment, assignment_change::AssignmentAction, AssignmentChange, Task, TaskState, TaskStatus};

use crate::manager::Msg;
use crate::net::Endpoint;

/// Most updates in one status report.
pub const MAX_UPDATES_PER_REPORT: usize = 100;

/// Where the session stands.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs, reason = "each variant's doc names what its fields are")]
pub enum Session {
    /// None; try again at this time (ms).
    Down { retry_at_ms: u64 },
    /// Asked `manager` for one.
    Opening { manager: u64, attempt: u64, since_ms: u64 },
    /// Open with `manager`.
    Up { manager: u64, session: String, last_ok_ms: u64, next_beat_ms: u64 },
}

#[derive(Debug)]
struct Local {
    task: Task,
    state: TaskState,
    running: bool,
    /// A job's task completes at this time.
    completes_at_ms: Option<u64>,
}

/// One agent.
#[derive(Debug)]
pub struct Agent {
    /// Its index (its endpoint).
    pub index: usize,
    /// Its node ID.
    pub node_id: String,
    /// False while crashed.
    pub up: bool,
    /// The session.
    pub session: Session,
    attempt: u64,
    prefer: u64,
    tasks: BTreeMap<String, Local>,
    /// Tasks started before a crash (their processes are gone).
    lost: std::collections::BTreeSet<String>,
    unreported: BTreeMap<String, TaskStatus>,
    report_in_flight: Option<(u64, Vec<(String, i32)>)>,
    batch: u64,
    /// The last time (ms) this agent was not in a working session with the leader (set by the simulation).
    pub last_cut_off_ms: u64,
    /// Cluster volumes published to this node (a `VolumeAssignment` received): a task that mounts one starts
    /// only once it is here, as the real agent's does.
    volumes: std::collections::BTreeSet<String>,
    /// Cluster volumes it was told to unpublish (a REMOVE): it reports them, retried until written.
    unpublished: std::collections::BTreeSet<String>,
    volumes_report_in_flight: bool,
}

/// How long a session may go without a heartbeat answer before the agent gives it up, in periods.
const SESSION_TIMEOUT_PERIODS: u64 = 3;

impl Agent {
    /// A new agent, up, without a session.
    pub fn new(index: usize, node_id: String) -> Agent {
        Agent {
            index,
            node_id,
            up: true,
            session: Session::Down { retry_at_ms: 0 },
            attempt: 0,
            prefer: 1,
            tasks: BTreeMap::new(),
            lost: Default::default(),
            unreported: BTreeMap::new(),
            report_in_flight: None,
            batch: 0,
            last_cut_off_ms: 0,
            volumes: Default::default(),
            unpublished: Default::default(),
            volumes_report_in_flight: false,
        }
    }

    /// The manager this agent has a session with.
    pub fn session_manager(&self) -> Option<u64> {
        match &self.session {
            Session::Up { manager, .. } => Some(*manager),
            _ => None,
        }
    }

    /// Tasks whose process runs now.
    pub fn running(&self) -> impl Iterator<Item = &Task> + '_ {
        self.tasks.values().filter(|l| l.running).map(|l| &l.task)
    }

    /// Crashes: every task dies, the session is gone.
    pub fn crash(&mut self) {
        self.up = false;
        for (id, l) in std::mem::take(&mut self.tasks) {
            if l.state >= TaskState::Accepted {
                self.lost.insert(id);
            }
        }
        self.unreported.clear();
        self.report_in_flight = None;
        self.volumes.clear();
        self.unpublished.clear();
        self.volumes_report_in_flight = false;
        self.session = Session::Down { retry_at_ms: 0 };
    }

    /// Restarts after a crash.
    pub fn restart(&mut self, now_ms: u64) {
        self.up = true;
        self.session = Session::Down { retry_at_ms: now_ms };
    }

    fn go_down(&mut self, now_ms: u64, backoff_ms: u64, managers: &[u64]) {
        if let Some(pos) = managers.iter().position(|m| *m == self.prefer) {
            self.prefer = managers[(pos + 1) % managers.len()];
        } else if let Some(first) = managers.first() {
            // Its manager was removed from Raft and stopped.
            self.prefer = *first;
        }
        self.session = Session::Down { retry_at_ms: now_ms + backoff_ms };
        self.report_in_flight = None;
        self.volumes_report_in_flight = false;
    }

    fn set_state(&mut self, id: &str, state: TaskState, message: &str) {
        let l = self.tasks.get_mut(id).expect("known task");
        assert!(state >= l.state, "agent {} moved task {id} backwards ({:?} -> {state:?})", self.node_id, l.state);
        l.state = state;
        let status = TaskStatus { state: state as i32, message: message.to_string(), ..Default::default() };
        self.unreported.insert(id.to_string(), status);
    }

    /// One step: the session, the tasks, the status report. Returns what to send.
    pub fn step(
        &mut self,
        now_ms: u64,
        period_ms: u64,
        managers: &[u64],
        fail_chance: f64,
        rng: &mut StdRng,
    ) -> Vec<(Endpoint, Msg)> {
        let mut out = Vec::new();
        if !self.up {
            return out;
        }
        match self.session.clone() {
            Session::Down { retry_at_ms } if now_ms >= retry_at_ms => {
                self.attempt += 1;
                out.push((Endpoint::Manager(self.prefer), Msg::OpenSession { attempt: self.attempt }));
                self.session = Session::Opening { manager: self.prefer, attempt: self.attempt, since_ms: now_ms };
            }
            Session::Opening { since_ms, .. } if now_ms > since_ms + SESSION_TIMEOUT_PERIODS * period_ms => {
                self.go_down(now_ms, 0, managers);
            }
            Session::Up { manager, session, last_ok_ms, next_beat_ms } => {
                if now_ms > last_ok_ms + SESSION_TIMEOUT_PERIODS * period_ms {
                    self.go_down(now_ms, 0, managers);
                } else if now_ms >= next_beat_ms {
                    out.push((Endpoint::Manager(manager), Msg::Heartbeat { session: session.clone() }));
                    self.session = Session::Up { manager, session, last_ok_ms, next_beat_ms: now_ms + period_ms };
                }
            }
            _ => {}
        }
        let ids: Vec<String> = self.tasks.keys().cloned().collect();
        for id in ids {
            let l = &self.tasks[&id];
            let desired = l.task.desired_state();
            let state = l.state;
            if state.is_terminal() {
                continue;
            }
            if desired >= TaskState::Shutdown {
                self.tasks.get_mut(&id).expect("known").running = false;
                self.set_state(&id, TaskState::Shutdown, "shutdown");
                continue;
            }
            if l.running {
                if l.completes_at_ms.is_some_and(|at| now_ms >= at) {
                    self.tasks.get_mut(&id).expect("known").running = false;
                    self.set_state(&id, TaskState::Complete, "finished");
                } else if rng.random_bool(fail_chance) {
                    self.tasks.get_mut(&id).expect("known").running = false;
                    self.set_state(&id, TaskState::Failed, "task: non-zero exit (1)");
                }
                continue;
            }
            let target = desired.min(TaskState::Running);
            if state >= target {
                continue;
            }
            // A task starts only once its cluster volumes are published here.
            if state == TaskState::Ready && l.task.volumes.iter().any(|a| !self.volumes.contains(&a.id)) {
                continue;
            }
            let next = match state {
                s if s < TaskState::Accepted => TaskState::Accepted,
                TaskState::Accepted => TaskState::Preparing,
                TaskState::Preparing => TaskState::Ready,
                TaskState::Ready => TaskState::Starting,
                _ => TaskState::Running,
            };
            if next == TaskState::Running {
                let job = desired == TaskState::Complete;
                let l = self.tasks.get_mut(&id).expect("known");
                l.running = true;
                l.completes_at_ms = job.then(|| now_ms + rng.random_range(200..2000));
            }
            self.set_state(&id, next, "");
        }
        if let (Session::Up { manager, session, .. }, false) = (&self.session, self.volumes_report_in_flight) {
            if !self.unpublished.is_empty() {
                self.volumes_report_in_flight = true;
                let ids = self.unpublished.iter().cloned().collect();
                out.push((Endpoint::Manager(*manager), Msg::VolumesUnpublished { session: session.clone(), ids }));
            }
        }
        if let (Session::Up { manager, session, .. }, None) = (&self.session, &self.report_in_flight) {
            if !self.unreported.is_empty() {
                self.batch += 1;
                let updates: Vec<(String, TaskStatus)> =
                    self.unreported.iter().take(MAX_UPDATES_PER_REPORT).map(|(k, v)| (k.clone(), v.clone())).collect();
                let sent = updates.iter().map(|(k, v)| (k.clone(), v.state)).collect();
                self.report_in_flight = Some((self.batch, sent));
                out.push((
                    Endpoint::Manager(*manager),
                    Msg::Status { session: session.clone(), batch: self.batch, updates },
                ));
            }
        }
        out
    }

    /// Takes a message from a manager.
    pub fn receive(&mut self, now_ms: u64, from: u64, msg: Msg, managers: &[u64]) {
        if !self.up {
            return;
        }
        match msg {
            Msg::SessionOpened { attempt, result } => {
                if !matches!(&self.session, Session::Opening { attempt: a, .. } if *a == attempt) {
                    return;
                }
                match result {
                    Ok(session) => {
                        self.session = Session::Up { manager: from, session, last_ok_ms: now_ms, next_beat_ms: now_ms };
                    }
                    Err(hint) => {
                        self.go_down(now_ms, 200, managers);
                        if let Some(h) = hint.filter(|h| managers.contains(h)) {
                            self.prefer = h;
                        }
                    }
                }
            }
            Msg::HeartbeatAnswer { session, ok } => {
                if let Session::Up { session: s, last_ok_ms, .. } = &mut self.session {
                    if *s == session {
                        if ok {
                            *last_ok_ms = now_ms;
                        } else {
                            self.go_down(now_ms, 0, managers);
                        }
                    }
                }
            }
            Msg::StatusAnswer { session, batch, ok } => {
                if !matches!(&self.session, Session::Up { session: s, .. } if *s == session) {
                    return;
                }
                if let Some((b, sent)) = self.report_in_flight.take() {
                    if b != batch {
                        self.report_in_flight = Some((b, sent));
                        return;
                    }
                    if ok {
                        for (id, state) in sent {
                            if self.unreported.get(&id).is_some_and(|s| s.state == state) {
                                self.unreported.remove(&id);
                            }
                        }
                    }
                }
            }
            Msg::VolumesAnswer { session, ids, ok } => {
                if !matches!(&self.session, Session::Up { session: s, .. } if *s == session) {
                    return;
                }
                self.volumes_report_in_flight = false;
                if ok {
                    for id in ids {
                        self.unpublished.remove(&id);
                    }
                }
            }
            Msg::Assignments { session, complete, changes } => {
                if !matches!(&self.session, Session::Up { session: s, .. } if *s == session) {
                    return;
                }
                self.assign(complete, changes);
            }
            Msg::SessionEnded { session } => {
                if matches!(&self.session, Session::Up { session: s, .. } if *s == session) {
                    self.go_down(now_ms, 0, managers);
                }
            }
            _ => {}
        }
    }

    /// The session's connection broke.
    pub fn connection_broken(&mut self, now_ms: u64, manager: u64, managers: &[u64]) {
        let with = match &self.session {
            Session::Up { manager: m, .. } | Session::Opening { manager: m, .. } => *m == manager,
            Session::Down { .. } => false,
        };
        if with {
            self.go_down(now_ms, 0, managers);
        }
    }

    fn assign(&mut self, complete: bool, changes: Vec<AssignmentChange>) {
        let mut seen = std::collections::BTreeSet::new();
        let mut volumes_seen = std::collections::BTreeSet::new();
        for c in changes {
            let remove = c.action == AssignmentAction::Remove as i32;
            let item = c.assignment.and_then(|a| a.item);
            if let Some(assignment::Item::Volume(v)) = &item {
                // Unpublishing takes no time here; publishing neither.
                if remove {
                    self.volumes.remove(&v.id);
                    self.unpublished.insert(v.id.clone());
                } else {
                    self.volumes.insert(v.id.clone());
                    self.unpublished.remove(&v.id);
                    volumes_seen.insert(v.id.clone());
                }
                continue;
            }
            let Some(assignment::Item::Task(task)) = item else { continue };
            let id = task.id.clone();
            if remove {
                self.tasks.remove(&id);
                self.unreported.remove(&id);
                continue;
            }
            seen.insert(id.clone());
            match self.tasks.get_mut(&id) {
                Some(l) => l.task = task,
                None => {
                    let observed = task.status.as_ref().map(|s| s.state()).unwrap_or(TaskState::New);
                    let state = observed.max(TaskState::Assigned);
                    let lost = self.lost.remove(&id) || (observed > TaskState::Assigned && !observed.is_terminal());
                    self.tasks.insert(id.clone(), Local { task, state, running: false, completes_at_ms: None });
                    if lost && !state.is_terminal() {
                        self.set_state(&id, TaskState::Failed, "the task's process is gone (agent restarted)");
                    }
                }
            }
        }
        if complete {
            self.tasks.retain(|id, _| seen.contains(id));
            self.unreported.retain(|id, _| seen.contains(id));
            self.volumes.retain(|id| volumes_seen.contains(id));
        }
    }
}
