//! The executor seam: an `Executor` describes the node and makes one `Controller` per task; a controller
//! drives one task's runtime object (a process, later a container) through prepare, start, wait, shutdown,
//! terminate and remove. The task runner (`runner`) decides which call comes next; controllers decide
//! nothing about task states.
//!
//! Must not depend on the session, the worker or any particular runtime (a connection to a manager is a
//! tonic `Channel` the agent hands in).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use shoal_api::{NodeDescription, Task};

pub(crate) use crate::dependencies::TaskFiles;

/// A boxed, sendable future: the controller methods' return type (keeps the traits object-safe).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How a task's runtime object ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitStatus {
    /// The exit code (128 + signal number when killed by a signal).
    pub code: i32,
    /// The process ID it had (0 when not applicable).
    pub pid: i32,
}

/// What a started task's runtime object reports beside its state: SwarmKit's `ContainerStatus.ContainerID`
/// and `PortStatus` (the host-mode ports the task publishes on this node, with the host port in use).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RuntimeReport {
    /// The container's ID (empty for a process).
    pub container_id: String,
    /// The task's host-mode published ports as bound on this node (a port the engine chose included).
    pub ports: Vec<shoal_api::PortConfig>,
}

/// The host-mode ports of `task` as its spec publishes them (what an executor binds or forwards without
/// choosing a number).
pub(crate) fn host_mode_ports(task: &Task) -> Vec<shoal_api::PortConfig> {
    use shoal_api::port_config::PublishMode;
    task.endpoint
        .iter()
        .flat_map(|e| e.ports.iter())
        .filter(|p| p.publish_mode == PublishMode::Host as i32)
        .cloned()
        .collect()
}

/// Why an executor call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecutorError {
    /// The task cannot run on this executor as specified; fix the service spec.
    #[error("{0}")]
    InvalidSpec(String),
    /// Preparing the task's resources failed.
    #[error("preparing the task failed: {0}")]
    Prepare(String),
    /// Starting the task failed.
    #[error("starting the task failed: {0}")]
    Start(String),
    /// Waiting for, stopping or removing the task failed.
    #[error("{0}")]
    Runtime(String),
    /// The call does not apply in the controller's current state (e.g. wait before start).
    #[error("the task is not {0}")]
    NotReady(&'static str),
}

/// The stop grace period from a task's container spec (default 10 s), at most `MAX_STOP_GRACE_PERIOD`.
pub(crate) fn stop_grace_period(task: &Task) -> Duration {
    task.spec
        .as_ref()
        .and_then(|s| match &s.runtime {
            Some(shoal_api::task_spec::Runtime::Container(c)) => c.stop_grace_period.as_ref(),
            _ => None,
        })
        .map(shoal_api::duration_from_proto)
        .unwrap_or(DEFAULT_STOP_GRACE_PERIOD)
        .min(MAX_STOP_GRACE_PERIOD)
}

/// The longest grace the agent gives a task to stop (the control API's bound): a spec stored before the
/// bound existed cannot keep a stopped or removed service's task running for longer.
pub(crate) const MAX_STOP_GRACE_PERIOD: Duration = Duration::from_secs(3600);

/// Grace between the polite stop signal and the kill, when the spec sets none.
pub(crate) const DEFAULT_STOP_GRACE_PERIOD: Duration = Duration::from_secs(10);

/// One line a task printed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLine {
    /// When it was printed (as recorded by the executor).
    pub timestamp: std::time::SystemTime,
    /// True for stderr, false for stdout.
    pub stderr: bool,
    /// The line, without its newline.
    pub data: Vec<u8>,
}

/// Which lines of a task's output to read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// Keep the stream open and send lines as they are printed.
    pub follow: bool,
    /// Only the last this many lines of what was printed so far (all when `None`).
    pub tail: Option<usize>,
    /// Only lines printed after this time.
    pub since: Option<std::time::SystemTime>,
    /// Include stdout.
    pub stdout: bool,
    /// Include stderr.
    pub stderr: bool,
}

/// A task's log lines, in order; ends when the task's output ends (or at once without `follow`).
pub(crate) type LogStream = futures::stream::BoxStream<'static, Result<LogLine, ExecutorError>>;

/// Runs tasks of one kind (processes, containers) on this node.
pub trait Executor: Send + Sync + 'static {
    /// What this node offers: hostname, platform, resources, engine.
    fn describe(&self) -> NodeDescription;
    /// A controller for `task`, which gets `files` (its secrets and configs, resolved and rendered by the
    /// worker; empty for most tasks). Fails with `InvalidSpec` when the task cannot run here.
    fn controller(&self, task: &Task, files: TaskFiles) -> Result<Box<dyn Controller>, ExecutorError>;
    /// Short name, for logs ("process", "fake").
    fn name(&self) -> &'static str;
    /// True when task runtime objects outlive the agent (containers): the agent then leaves them running
    /// when it stops, and adopts them when it starts again. False for processes, which die with the agent.
    fn tasks_outlive_agent(&self) -> bool {
        false
    }
    /// A controller for a task whose runtime object already exists on this node (left by an earlier run of
    /// the agent), or `None`. Each runtime object is handed out at most once.
    fn adopt(&self, _task: &Task) -> Option<Box<dyn Controller>> {
        None
    }
    /// Called with the first complete set of tasks assigned to this node: removes runtime objects left by
    /// an earlier run of the agent whose task is not in `assigned`, without waiting for the removal.
    fn remove_unassigned(&self, _assigned: &std::collections::HashSet<String>) {}
    /// Called once the agent stopped and every runner ended (after `tasks_outlive_agent` decided whether the
    /// tasks were stopped): releases what the executor keeps for tasks that no longer run.
    fn agent_stopped(&self) {}
    /// Called when the agent stops, once the runners of tasks that outlive it were aborted: waits (bounded by
    /// the executor) for the runtime objects whose creation is under way, so that what exists is what a
    /// `docker swarm leave` lists and removes next.
    fn settle(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
    /// The node's data plane, when this executor connects tasks to networks through it (the agent feeds it
    /// assignments and the manager's network view). `None`: tasks with networks are rejected.
    fn network_plane(&self) -> Option<std::sync::Arc<crate::network::NetworkPlane>> {
        None
    }
    /// Why this executor connects no task to networks, when it could have (it was given no data plane):
    /// reported with the node's description (`shoal_api::SHOAL_NO_DATA_PLANE_LABEL`).
    fn data_plane_off(&self) -> Option<String> {
        None
    }
    /// The node's side of containers of the engine's own on attachable swarm networks, when this executor
    /// has one (the docker executor with the data plane); network attachment tasks are refused without it.
    fn engine_attachments(&self) -> Option<std::sync::Arc<dyn EngineAttachments>> {
        None
    }
    /// What `task` printed, per `options`. Fails when this executor keeps no output for the task.
    fn logs(&self, task: &Task, _options: &LogOptions) -> Result<LogStream, ExecutorError> {
        Err(ExecutorError::Runtime(format!("the {} executor keeps no logs of task {}", self.name(), task.id)))
    }
}

/// Drives one task's runtime object. Every method is idempotent where it can be, and `wait` is cancel-safe
/// (the runner drops a pending `wait` to react to a new desired state, then calls it again).
pub trait Controller: Send {
    /// Creates what the task needs before it starts (directories, log files; images later).
    fn prepare(&mut self) -> BoxFuture<'_, Result<(), ExecutorError>>;
    /// Starts the task; returns its process ID (0 when not applicable).
    fn start(&mut self) -> BoxFuture<'_, Result<i32, ExecutorError>>;
    /// Waits for the task to exit.
    fn wait(&mut self) -> BoxFuture<'_, Result<ExitStatus, ExecutorError>>;
    /// Stops the task gracefully: the stop signal, then a kill after the task's stop grace period.
    fn shutdown(&mut self) -> BoxFuture<'_, Result<(), ExecutorError>>;
    /// Kills the task at once.
    fn terminate(&mut self) -> BoxFuture<'_, Result<(), ExecutorError>>;
    /// Releases everything the task held (kills it first if it still runs).
    fn remove(&mut self) -> BoxFuture<'_, Result<(), ExecutorError>>;
    /// What the runtime object reports once started (or adopted and waited on); nothing by default.
    fn report(&self) -> RuntimeReport {
        RuntimeReport::default()
    }
}

/// What the agent drives of an executor's containers on attachable swarm networks (the docker executor's
/// `Attacher`): they follow the node's assignments and its session's connection to a manager (through
/// which attachments are made and released), and run until the agent stops.
pub trait EngineAttachments: Send + Sync {
    /// The tasks now assigned to this node.
    fn set_assigned(&self, assigned: crate::assigned::AssignedTasks);
    /// The session's connection to a manager, or none between sessions.
    fn set_channel(&self, channel: Option<tonic::transport::Channel>);
    /// Follows the engine's events until `shutdown` is true.
    fn run(self: std::sync::Arc<Self>, shutdown: tokio::sync::watch::Receiver<bool>) -> BoxFuture<'static, ()>;
}

#[cfg(test)]
mod grace_tests {
    use super::*;

    fn task_with_grace(seconds: i64) -> Task {
        Task {
            spec: Some(
                shoal_api::TaskSpec {
                    runtime: Some(shoal_api::task_spec::Runtime::Container(shoal_api::ContainerSpec {
                        stop_grace_period: Some(shoal_api::prost_types::Duration { seconds, nanos: 0 }),
                        ..Default::default()
                    })),
                    ..Default::default()
                }
                .into(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn a_stored_huge_stop_grace_period_is_clamped() {
        assert_eq!(stop_grace_period(&task_with_grace(30)), Duration::from_secs(30));
        assert_eq!(stop_grace_period(&task_with_grace(i64::MAX / 1_000_000_000)), MAX_STOP_GRACE_PERIOD);
        assert_eq!(stop_grace_period(&Task::default()), DEFAULT_STOP_GRACE_PERIOD);
    }
}
