//! The worker: turns the dispatcher's assignment messages into task runners. A COMPLETE message replaces
//! the set (runners of tasks not in it are stopped and removed); INCREMENTAL messages add, update or
//! remove single tasks. A task that arrives already RUNNING (or STARTING) without a runner here lost its
//! process (the agent restarted): it is reported FAILED (SHUTDOWN when it was being stopped anyway), unless
//! the executor adopts its runtime object (containers outlive the agent).
//!
//! Secrets and configs in a message are applied in message order (the dispatcher sends a task's before the
//! task, and removes them after the last task using them), into `Dependencies` (memory only). A new task's
//! controller gets its files resolved from them; a task whose references cannot be resolved (not sent,
//! template error, ...) is REJECTED with the reason, and so is a task on a network this node's data plane
//! cannot carry (an encrypted one: `network_refusal`). What is held (IDs and names) is published for the
//! node's debug view.
//!
//! Bound: one runner per task assigned to this node. Must not depend on gRPC transport details.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use shoal_api::{
    assignment, assignment_change::AssignmentAction, assignments_message, AssignmentsMessage, Task, TaskState,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::dependencies::{has_references, Dependencies, Held, NodeFacts};
use crate::exec::{Executor, ExecutorError};
use crate::runner::{run_task, status, RunnerInput, StatusReporter};

/// Longest the agent's stop waits for the removals of tasks on their way out when their runtime objects
/// outlive it (under the node's 15 s per part).
pub(crate) const REMOVALS_AT_STOP_MAX: std::time::Duration = std::time::Duration::from_secs(10);

/// The message a lost task is failed with.
pub const LOST_TASK_MESSAGE: &str = "task process was lost (agent restarted)";

struct RunnerHandle {
    input: watch::Sender<RunnerInput>,
    join: JoinHandle<()>,
}

pub(crate) use crate::assigned::AssignedTasks;

/// The set of task runners on this node.
pub(crate) struct Worker {
    executor: Arc<dyn Executor>,
    reporter: Arc<StatusReporter>,
    runners: HashMap<String, RunnerHandle>,
    assigned: HashMap<String, Arc<Task>>,
    assigned_tx: watch::Sender<AssignedTasks>,
    deps: Dependencies,
    node: NodeFacts,
    /// Told what is held whenever it changes, and the last thing it was told.
    held_sink: Option<(HeldSink, Held)>,
    /// The node's cluster volumes, when it runs CSI plugins.
    volumes: Option<crate::volumes::Volumes>,
}

/// Told the IDs and names of the secrets and configs the worker holds whenever they change.
pub type HeldSink = Arc<dyn Fn(&Held) + Send + Sync>;

/// Why this node cannot run `task` on its networks, if it cannot: a network created with `--opt encrypted`
/// is refused with the data plane's reason (`shoal_netplane::check_encryption`, the one place that decides
/// it), before any executor sees the task; so is a network attachment task (`AttachNetwork`, for a container
/// of the engine's own on an attachable network) on a node whose executor has no `Attacher` (`attaches`
/// false: the process executor, or the docker executor without the data plane); so is a task whose
/// attachments ask for interface names the data plane cannot give (`shoal_netplane::check_ifnames`).
fn network_refusal(task: &Task, attaches: bool) -> Option<String> {
    if !attaches
        && matches!(
            task.spec.as_ref().and_then(|s| s.runtime.as_ref()),
            Some(shoal_api::task_spec::Runtime::Attachment(_))
        )
    {
        return Some(
            "a network attachment task is for a container of the node's Docker Engine on an attachable network; \
             this node has no engine with the data plane to plumb it (run the daemon with --executor docker and \
             the data plane on)"
                .into(),
        );
    }
    let encryption = task
        .networks
        .iter()
        .filter_map(|a| a.network.as_ref())
        .find_map(|n| shoal_netplane::check_encryption(&n.id, n.is_encrypted()).err());
    // The interface names the attachments ask for (`com.docker.network.endpoint.ifname`).
    let ifnames = crate::network::desired::attachments(task).ok().and_then(|atts| {
        let atts: Vec<_> = atts.into_iter().map(|(_, a)| a).collect();
        shoal_netplane::check_ifnames(&atts).err()
    });
    encryption.or(ifnames).map(|e| e.to_string())
}

fn observed(task: &Task) -> TaskState {
    TaskState::from_wire(task.status.as_ref().map_or(0, |s| s.state))
}

impl Worker {
    /// A worker with no tasks.
    pub(crate) fn new(executor: Arc<dyn Executor>, reporter: Arc<StatusReporter>) -> Worker {
        let (assigned_tx, _) = watch::channel(AssignedTasks::default());
        Worker {
            executor,
            reporter,
            runners: HashMap::new(),
            assigned: HashMap::new(),
            assigned_tx,
            deps: Dependencies::new(),
            node: NodeFacts::default(),
            held_sink: None,
            volumes: None,
        }
    }

    /// Publishes the cluster volumes assigned to this node through `volumes`, and runs the tasks that mount
    /// them once they are published.
    pub(crate) fn with_volumes(mut self, volumes: crate::volumes::Volumes) -> Worker {
        self.volumes = Some(volumes);
        self
    }

    /// Renders templates with `node`'s facts (`{{.Node.*}}`).
    pub(crate) fn with_node(mut self, node: NodeFacts) -> Worker {
        self.node = node;
        self
    }

    /// Tells `sink` what secrets and configs the worker holds (IDs and names) whenever that changes.
    pub(crate) fn with_held_sink(mut self, sink: HeldSink) -> Worker {
        sink(&Held::default());
        self.held_sink = Some((sink, Held::default()));
        self
    }

    /// The executor tasks run with.
    pub(crate) fn executor(&self) -> Arc<dyn Executor> {
        self.executor.clone()
    }

    /// Watches the set of tasks assigned to this node (for log subscriptions).
    pub(crate) fn assigned(&self) -> watch::Receiver<AssignedTasks> {
        self.assigned_tx.subscribe()
    }

    /// Applies one assignments message.
    pub(crate) fn apply(&mut self, msg: AssignmentsMessage) {
        self.runners.retain(|_, r| !r.join.is_finished());
        let complete = msg.r#type == assignments_message::Type::Complete as i32;
        let mut seen = HashSet::new();
        if complete {
            self.deps.clear();
        }
        for change in msg.changes {
            let Some(item) = change.assignment.and_then(|a| a.item) else {
                continue;
            };
            if self.deps.apply(&item, change.action == AssignmentAction::Remove as i32) {
                continue;
            }
            if let assignment::Item::Volume(v) = item {
                self.assign_volume(v, change.action == AssignmentAction::Remove as i32);
                continue;
            }
            let assignment::Item::Task(task) = item else {
                continue;
            };
            seen.insert(task.id.clone());
            if change.action == AssignmentAction::Remove as i32 {
                self.assigned.remove(&task.id);
                self.remove(&task.id);
            } else {
                self.assigned.insert(task.id.clone(), Arc::new(task.clone()));
                self.upsert(task);
            }
        }
        if complete {
            self.assigned.retain(|id, _| seen.contains(id));
            self.executor.remove_unassigned(&seen);
            let gone: Vec<String> = self.runners.keys().filter(|id| !seen.contains(*id)).cloned().collect();
            for id in gone {
                self.remove(&id);
            }
        }
        self.assigned_tx.send_replace(Arc::new(self.assigned.clone()));
        if let Some((sink, last)) = &mut self.held_sink {
            let held = self.deps.held();
            if *last != held {
                sink(&held);
                *last = held;
            }
        }
    }

    /// A cluster volume published to this node (or to unpublish): handed to `volumes` with its secrets' data
    /// by key (sent before it as secret assignments). A node without CSI plugins cannot have one; it says so.
    fn assign_volume(&mut self, v: shoal_api::VolumeAssignment, remove: bool) {
        let Some(volumes) = &self.volumes else {
            tracing::warn!(volume = %v.id, "a cluster volume was assigned to this node, which runs no CSI plugin: \
                start its daemon with --csi-plugin NAME=unix:///path/to/the/plugin.sock");
            return;
        };
        let mut secrets = std::collections::HashMap::new();
        for s in &v.secrets {
            match self.deps.secret_data(&s.secret) {
                Some(data) => {
                    secrets.insert(s.key.clone(), String::from_utf8_lossy(data).into_owned());
                }
                // Never called with a credential left out (as the manager's volume manager): its tasks wait, and
                // are rejected after `volumes::PUBLISH_WAIT`, until the volume is sent again with it.
                None if !remove => {
                    tracing::warn!(volume = %v.id, secret = %s.secret, "the secret a cluster volume needs was not \
                        sent to this node: the volume is not published here");
                    return;
                }
                None => {}
            }
        }
        volumes.assign(v, secrets, remove);
    }

    fn upsert(&mut self, task: Task) {
        if let Some(r) = self.runners.get(&task.id) {
            let task = Arc::new(task);
            r.input.send_modify(|i| i.task = task);
            return;
        }
        // Service templates (`{{.Task.Slot}}` ...) in the container spec, expanded once for the executor.
        let expanded = crate::dependencies::expand::expand_container_spec(&task, &self.node);
        if let Some(ctlr) = self.executor.adopt(expanded.as_ref().unwrap_or(&task)) {
            // The runtime object outlived an earlier run of the agent: carry on from the task's state.
            tracing::info!(task = %task.id, "adopted the task's existing runtime object");
            self.spawn_runner(task, Ok(ctlr));
            return;
        }
        let state = observed(&task);
        if state.is_terminal() {
            return;
        }
        if state as i32 >= TaskState::Starting as i32 {
            let desired = task.desired_state;
            let to = if desired >= TaskState::Shutdown as i32 { TaskState::Shutdown } else { TaskState::Failed };
            tracing::warn!(task = %task.id, "{LOST_TASK_MESSAGE}");
            self.reporter.report(&task.id, status(to, LOST_TASK_MESSAGE, LOST_TASK_MESSAGE));
            return;
        }
        // Cluster mounts become bind mounts of their volumes' publish paths; the task waits for them.
        let (expanded, awaited) = match expanded {
            Ok(e) => match crate::volumes::bind_cluster_mounts(&e, self.volumes.as_ref()) {
                None => (Ok(e), None),
                Some(Ok((bound, ids))) => (Ok(bound), Some(ids)),
                Some(Err(why)) => (Err(why), None),
            },
            Err(why) => (Err(why), None),
        };
        let ctlr = match (network_refusal(&task, self.executor.engine_attachments().is_some()), expanded) {
            (Some(why), _) | (None, Err(why)) => Err(ExecutorError::InvalidSpec(why)),
            (None, Ok(expanded)) if has_references(&expanded) => match self.deps.files_for(&expanded, &self.node) {
                Ok(files) => self.executor.controller(&expanded, files),
                Err(why) => Err(ExecutorError::InvalidSpec(why)),
            },
            (None, Ok(expanded)) => self.executor.controller(&expanded, Vec::new()),
        };
        let ctlr = match (ctlr, awaited, &self.volumes) {
            (Ok(inner), Some(ids), Some(v)) => {
                Ok(Box::new(crate::volumes::AwaitVolumes::new(inner, ids, v.clone()))
                    as Box<dyn crate::exec::Controller>)
            }
            (other, _, _) => other,
        };
        self.spawn_runner(task, ctlr);
    }

    fn spawn_runner(&mut self, task: Task, ctlr: Result<Box<dyn crate::exec::Controller>, crate::exec::ExecutorError>) {
        let initial = task.status.clone().unwrap_or_default();
        let id = task.id.clone();
        let (input, rx) = watch::channel(RunnerInput { task: Arc::new(task), removed: false, agent_stopping: false });
        let join = tokio::spawn(run_task(initial, ctlr, self.reporter.clone(), rx));
        self.runners.insert(id, RunnerHandle { input, join });
    }

    fn remove(&mut self, id: &str) {
        if let Some(r) = self.runners.get(id) {
            r.input.send_modify(|i| i.removed = true);
        }
    }

    /// Stops every task (graceful stop, then kill) and waits for the runners to end. When the executor's
    /// tasks outlive the agent, only the runners end and the tasks keep running, but for those on their way
    /// out, which are removed first (bounded).
    pub(crate) async fn stop_all(&mut self) {
        if self.executor.tasks_outlive_agent() {
            // Containers keep running without the agent; the next agent adopts them. Those of tasks on their
            // way out (removed, or desired REMOVE: a `service rm`, a scale-down) are stopped and removed now,
            // with their holders and namespaces, within `REMOVALS_AT_STOP_MAX`: a stop in the middle of their
            // grace would leave them to the next start.
            let mut leaving = Vec::new();
            for (id, r) in self.runners.drain() {
                let going = {
                    let i = r.input.borrow();
                    i.removed || i.task.desired_state >= TaskState::Remove as i32
                };
                if going && !r.join.is_finished() {
                    r.input.send_modify(|i| i.removed = true);
                    leaving.push((id, r));
                } else {
                    r.join.abort();
                }
            }
            let deadline = tokio::time::Instant::now() + REMOVALS_AT_STOP_MAX;
            for (id, r) in leaving {
                let abort = r.join.abort_handle();
                if tokio::time::timeout_at(deadline, r.join).await.is_err() {
                    tracing::warn!(task = %id, "the task's removal did not finish within {REMOVALS_AT_STOP_MAX:?} of \
                                                the agent's stop; the next start removes what is left");
                    abort.abort();
                }
            }
            self.executor.settle().await;
            self.executor.agent_stopped();
            return;
        }
        for r in self.runners.values() {
            r.input.send_modify(|i| i.agent_stopping = true);
        }
        for (id, r) in self.runners.drain() {
            if let Err(e) = r.join.await {
                tracing::warn!(task = %id, "task runner ended abnormally: {e}");
            }
        }
        self.executor.agent_stopped();
    }
}
