//! The task runner: one tokio task per assigned task, driving its `Controller` through the task states.
//! `next_step` is the pure rule (observed state + desired state -> what to do next); `run_task` is the thin
//! async loop that performs the step and reports the new status.
//!
//! Rules: a state never moves backwards; the runner never goes past the desired state (desired READY holds
//! at READY); desired >= SHUTDOWN stops the task and reports SHUTDOWN; an error while preparing is
//! REJECTED, while starting or running FAILED. Must not depend on gRPC or the session: statuses go to the
//! `StatusReporter`, which the session drains.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use shoal_api::{task_status, ContainerStatus, Task, TaskState, TaskStatus};
use tokio::sync::{watch, Notify};

use crate::exec::{Controller, ExecutorError, ExitStatus, RuntimeReport};

/// What the runner does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Move to this state; no controller call.
    Report(TaskState),
    /// Call `prepare`, then READY (or REJECTED).
    Prepare,
    /// Call `start`, then RUNNING (or FAILED).
    Start,
    /// Wait for the task to exit: COMPLETE or FAILED.
    Wait,
    /// Stop the task (if it may run), then SHUTDOWN.
    Shutdown,
    /// Nothing to do until the desired state changes.
    Hold,
    /// The task has reached a terminal state.
    Done,
}

/// The next step for a task in `observed` state whose desired state is `desired`.
pub(crate) fn next_step(observed: TaskState, desired: TaskState) -> Step {
    use TaskState::*;
    if observed.is_terminal() {
        return Step::Done;
    }
    if desired as i32 >= Shutdown as i32 {
        return Step::Shutdown;
    }
    let (next, step) = match observed {
        s if (s as i32) < Accepted as i32 => (Accepted, Step::Report(Accepted)),
        Accepted => (Preparing, Step::Report(Preparing)),
        Preparing => (Ready, Step::Prepare),
        Ready => (Starting, Step::Report(Starting)),
        Starting => (Running, Step::Start),
        _ => return Step::Wait,
    };
    if next as i32 > desired as i32 {
        Step::Hold
    } else {
        step
    }
}

/// Latest status per task, waiting to be sent to the dispatcher. Coalescing: a newer status for a task
/// replaces an unsent older one. Bound: one entry per task the agent runs.
#[derive(Debug, Default)]
pub(crate) struct StatusReporter {
    pending: Mutex<BTreeMap<String, TaskStatus>>,
    notify: Notify,
}

impl StatusReporter {
    /// An empty reporter.
    pub(crate) fn new() -> StatusReporter {
        StatusReporter::default()
    }

    /// Queues `status` for `task_id`.
    pub(crate) fn report(&self, task_id: &str, status: TaskStatus) {
        self.pending.lock().insert(task_id.to_string(), status);
        self.notify.notify_one();
    }

    /// Takes up to `max` queued statuses.
    pub(crate) fn take_batch(&self, max: usize) -> Vec<(String, TaskStatus)> {
        let mut pending = self.pending.lock();
        let keys: Vec<String> = pending.keys().take(max).cloned().collect();
        keys.into_iter().filter_map(|k| pending.remove(&k).map(|s| (k, s))).collect()
    }

    /// Puts back a batch that could not be sent, unless a newer status arrived meanwhile.
    pub(crate) fn put_back(&self, batch: Vec<(String, TaskStatus)>) {
        let mut pending = self.pending.lock();
        for (id, st) in batch {
            pending.entry(id).or_insert(st);
        }
    }

    /// True when nothing is queued.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.pending.lock().is_empty()
    }

    /// Resolves when a status is queued (immediately if one was queued since the last wait).
    pub(crate) async fn changed(&self) {
        self.notify.notified().await
    }
}

/// What the worker tells a runner: the latest task, and whether to wind down.
#[derive(Clone, Debug)]
pub(crate) struct RunnerInput {
    /// The task as last assigned (desired state, spec).
    pub task: Arc<Task>,
    /// The task left the node's assignments: stop it and remove it.
    pub removed: bool,
    /// The agent is shutting down: stop the task, keep its files, report nothing more.
    pub agent_stopping: bool,
}

fn now() -> shoal_api::prost_types::Timestamp {
    shoal_api::timestamp_from_system_time(std::time::SystemTime::now())
}

/// A status with state, message and optional error text.
pub(crate) fn status(state: TaskState, message: &str, err: &str) -> TaskStatus {
    TaskStatus {
        timestamp: Some(now()),
        state: state as i32,
        message: message.to_string(),
        err: err.to_string(),
        ..Default::default()
    }
}

struct Runner {
    task_id: String,
    current: TaskStatus,
    pid: i32,
    /// The controller's container ID and ports, known once started.
    runtime: RuntimeReport,
    prepared: bool,
    reporter: Arc<StatusReporter>,
}

impl Runner {
    fn state(&self) -> TaskState {
        TaskState::from_wire(self.current.state)
    }

    fn set(&mut self, mut st: TaskStatus) {
        debug_assert!(st.state >= self.current.state, "task state must not move backwards");
        if st.state < self.current.state {
            return;
        }
        if (self.pid != 0 || !self.runtime.container_id.is_empty()) && st.runtime_status.is_none() {
            st.runtime_status = Some(task_status::RuntimeStatus::Container(ContainerStatus {
                container_id: self.runtime.container_id.clone(),
                pid: self.pid,
                ..Default::default()
            }));
        }
        // Ports are bound while the task runs (as SwarmKit's, read from the engine: none once it stopped).
        if !self.runtime.ports.is_empty() && st.state <= TaskState::Running as i32 && st.port_status.is_none() {
            st.port_status = Some(Box::new(shoal_api::PortStatus { ports: self.runtime.ports.clone() }));
        }
        self.current = st.clone();
        self.reporter.report(&self.task_id, st);
    }

    fn exited(&mut self, exit: ExitStatus) {
        let pid = if exit.pid != 0 { exit.pid } else { self.pid };
        let container = ContainerStatus { container_id: self.runtime.container_id.clone(), pid, exit_code: exit.code };
        let mut st = if exit.code == 0 {
            status(TaskState::Complete, "finished", "")
        } else {
            let msg = format!("task: non-zero exit ({})", exit.code);
            status(TaskState::Failed, &msg, &msg)
        };
        st.runtime_status = Some(task_status::RuntimeStatus::Container(container));
        self.set(st);
    }

    fn failed(&mut self, state: TaskState, e: &ExecutorError) {
        let msg = e.to_string();
        self.set(status(state, &msg, &msg));
    }

    /// Stops a task that may be running: graceful shutdown, then a kill if that failed.
    async fn stop(&mut self, ctlr: &mut dyn Controller) {
        if (self.state() as i32) < TaskState::Starting as i32 {
            return;
        }
        if let Err(e) = ctlr.shutdown().await {
            tracing::warn!(task = %self.task_id, "graceful stop failed ({e}); killing");
            if let Err(e) = ctlr.terminate().await {
                tracing::warn!(task = %self.task_id, "kill failed: {e}");
            }
        }
    }
}

/// Runs one task until it is removed or the agent stops. `ctlr` is `Err` when the executor refused the
/// task (it is then REJECTED).
pub(crate) async fn run_task(
    initial: TaskStatus,
    ctlr: Result<Box<dyn Controller>, ExecutorError>,
    reporter: Arc<StatusReporter>,
    mut input: watch::Receiver<RunnerInput>,
) {
    let task_id = input.borrow().task.id.clone();
    let mut r =
        Runner { task_id, current: initial, pid: 0, runtime: RuntimeReport::default(), prepared: false, reporter };
    let mut ctlr = match ctlr {
        Ok(c) => Some(c),
        Err(e) => {
            r.failed(TaskState::Rejected, &e);
            None
        }
    };
    loop {
        let inp = input.borrow_and_update().clone();
        let Some(c) = ctlr.as_deref_mut() else {
            // Rejected before a controller existed: nothing to stop or remove.
            if inp.removed || inp.agent_stopping || input.changed().await.is_err() {
                return;
            }
            continue;
        };
        if inp.agent_stopping {
            if !r.state().is_terminal() {
                r.stop(c).await;
            }
            return;
        }
        if inp.removed {
            if !r.state().is_terminal() {
                r.stop(c).await;
            }
            if let Err(e) = c.remove().await {
                tracing::warn!(task = %r.task_id, "removing the task failed: {e}");
            }
            return;
        }
        let desired = TaskState::from_wire(inp.task.desired_state);
        match next_step(r.state(), desired) {
            Step::Hold | Step::Done => {
                if input.changed().await.is_err() {
                    // The worker went away without a word: behave as on agent stop.
                    if !r.state().is_terminal() {
                        r.stop(c).await;
                    }
                    return;
                }
            }
            Step::Report(s) => r.set(status(s, s.docker_name(), "")),
            Step::Prepare => match c.prepare().await {
                Ok(()) => {
                    r.prepared = true;
                    r.set(status(TaskState::Ready, "prepared", ""));
                }
                Err(e) => r.failed(TaskState::Rejected, &e),
            },
            Step::Start => {
                if !r.prepared {
                    // Picked up after an agent restart past PREPARING: prepare again, silently.
                    if let Err(e) = c.prepare().await {
                        r.failed(TaskState::Rejected, &e);
                        continue;
                    }
                    r.prepared = true;
                }
                match c.start().await {
                    Ok(pid) => {
                        r.pid = pid;
                        r.runtime = c.report();
                        r.set(status(TaskState::Running, "started", ""));
                    }
                    Err(e) => r.failed(TaskState::Failed, &e),
                }
            }
            Step::Wait => {
                tokio::select! {
                    res = c.wait() => match res {
                        Ok(exit) => {
                            if r.runtime.container_id.is_empty() {
                                // Adopted after an agent restart: the wait learnt the container.
                                r.runtime = c.report();
                            }
                            r.exited(exit)
                        }
                        Err(e) => r.failed(TaskState::Failed, &e),
                    },
                    _ = input.changed() => {}
                }
            }
            Step::Shutdown => {
                r.stop(c).await;
                r.set(status(TaskState::Shutdown, "shutdown", ""));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TaskState::*;

    fn check(observed: TaskState, desired: TaskState, expected: Step) {
        assert_eq!(next_step(observed, desired), expected, "observed {observed:?}, desired {desired:?}");
    }

    #[test]
    fn steps_follow_the_state_order_and_stop_at_the_desired_state() {
        check(Assigned, Running, Step::Report(Accepted));
        check(Accepted, Running, Step::Report(Preparing));
        check(Preparing, Running, Step::Prepare);
        check(Ready, Running, Step::Report(Starting));
        check(Starting, Running, Step::Start);
        check(Running, Running, Step::Wait);
        // Desired READY: prepare, then hold.
        check(Preparing, Ready, Step::Prepare);
        check(Ready, Ready, Step::Hold);
        // Shutdown wins over anything not terminal; terminal stays terminal.
        check(Assigned, Shutdown, Step::Shutdown);
        check(Running, Remove, Step::Shutdown);
        check(Complete, Running, Step::Done);
        check(Failed, Shutdown, Step::Done);
    }

    #[test]
    fn the_reporter_coalesces_and_keeps_newer_statuses_on_put_back() {
        let rep = StatusReporter::new();
        rep.report("a", status(Preparing, "", ""));
        rep.report("a", status(Running, "", ""));
        rep.report("b", status(Accepted, "", ""));
        let batch = rep.take_batch(10);
        assert_eq!(batch.len(), 2);
        assert_eq!(batch[0].1.state, Running as i32);
        rep.report("a", status(Complete, "", ""));
        rep.put_back(batch);
        let again = rep.take_batch(10);
        assert_eq!(again.iter().find(|(id, _)| id == "a").unwrap().1.state, Complete as i32);
        assert!(again.iter().any(|(id, _)| id == "b"));
        assert!(rep.is_empty());
    }
}
