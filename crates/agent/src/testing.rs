//! `FakeExecutor`: a scriptable executor for tests and benchmarks. Tasks run until told to exit (with a
//! code), or exit at once, or fail to prepare; every controller call is recorded, and so are the secret and
//! config files each task was given (in memory, as the executors get them). No processes, no IO.
//!
//! Bound: the call log keeps the last `CALL_LOG_MAX` calls; files are kept for the tasks controllers were
//! made for.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use shoal_api::{EngineDescription, NodeDescription, Platform, Resources, Task};
use tokio::sync::watch;

use crate::exec::{BoxFuture, Controller, Executor, ExecutorError, ExitStatus};

/// Most controller calls the log keeps.
pub const CALL_LOG_MAX: usize = 10_000;

/// What a fake task does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FakeBehavior {
    /// Runs until `FakeExecutor::exit` (or a stop).
    RunUntilExited,
    /// Exits with this code as soon as it starts.
    ExitImmediately(i32),
    /// `prepare` fails with this message.
    FailPrepare(String),
}

#[derive(Default)]
struct FakeState {
    default: Option<FakeBehavior>,
    behaviors: HashMap<String, FakeBehavior>,
    exits: HashMap<String, watch::Sender<Option<i32>>>,
    calls: VecDeque<(String, &'static str)>,
    files: HashMap<String, crate::exec::TaskFiles>,
}

impl FakeState {
    fn record(&mut self, task: &str, call: &'static str) {
        if self.calls.len() >= CALL_LOG_MAX {
            self.calls.pop_front();
        }
        self.calls.push_back((task.to_string(), call));
    }
}

/// The fake executor. Clones share state.
#[derive(Clone, Default)]
pub struct FakeExecutor {
    state: Arc<Mutex<FakeState>>,
}

impl FakeExecutor {
    /// Tasks run until told to exit.
    pub fn new() -> FakeExecutor {
        FakeExecutor::default()
    }

    /// Sets what tasks without their own behavior do.
    pub fn set_default(&self, b: FakeBehavior) {
        self.state.lock().default = Some(b);
    }

    /// Sets what one task does (before it is assigned).
    pub fn set_behavior(&self, task_id: &str, b: FakeBehavior) {
        self.state.lock().behaviors.insert(task_id.to_string(), b);
    }

    /// Makes a running task exit with `code`. False when the task is not running here.
    pub fn exit(&self, task_id: &str, code: i32) -> bool {
        match self.state.lock().exits.get(task_id) {
            Some(tx) => {
                tx.send_replace(Some(code));
                true
            }
            None => false,
        }
    }

    /// Tasks started and not yet exited.
    pub fn running(&self) -> Vec<String> {
        let st = self.state.lock();
        let mut v: Vec<String> =
            st.exits.iter().filter(|(_, tx)| tx.borrow().is_none()).map(|(id, _)| id.clone()).collect();
        v.sort();
        v
    }

    /// The secret and config files the last controller of `task_id` was given (empty when none was made).
    pub fn files(&self, task_id: &str) -> crate::exec::TaskFiles {
        self.state.lock().files.get(task_id).cloned().unwrap_or_default()
    }

    /// The controller calls made for `task_id`, in order ("prepare", "start", "wait", ...).
    pub fn calls(&self, task_id: &str) -> Vec<&'static str> {
        self.state.lock().calls.iter().filter(|(t, _)| t == task_id).map(|(_, c)| *c).collect()
    }
}

impl Executor for FakeExecutor {
    fn describe(&self) -> NodeDescription {
        NodeDescription {
            hostname: "fake".into(),
            platform: Some(Platform { architecture: "x86_64".into(), os: "linux".into() }),
            resources: Some(Resources { nano_cpus: 4_000_000_000, memory_bytes: 8 << 30, generic: vec![] }),
            // A simulated node simulates the overlay data plane too, so tasks on networks are placed on it.
            engine: Some(EngineDescription {
                engine_version: "shoal-fake".into(),
                plugins: vec![shoal_api::PluginDescription { r#type: "Network".into(), name: "overlay".into() }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn controller(&self, task: &Task, files: crate::exec::TaskFiles) -> Result<Box<dyn Controller>, ExecutorError> {
        let mut st = self.state.lock();
        if !files.is_empty() {
            st.files.insert(task.id.clone(), files);
        }
        let behavior =
            st.behaviors.get(&task.id).or(st.default.as_ref()).cloned().unwrap_or(FakeBehavior::RunUntilExited);
        Ok(Box::new(FakeController { task_id: task.id.clone(), behavior, state: self.state.clone(), exit: None }))
    }

    fn name(&self) -> &'static str {
        "fake"
    }
}

struct FakeController {
    task_id: String,
    behavior: FakeBehavior,
    state: Arc<Mutex<FakeState>>,
    exit: Option<watch::Receiver<Option<i32>>>,
}

impl FakeController {
    fn record(&self, call: &'static str) {
        self.state.lock().record(&self.task_id, call);
    }

    fn stop_with(&self, code: i32) {
        if let Some(tx) = self.state.lock().exits.get(&self.task_id) {
            tx.send_if_modified(|c| {
                if c.is_none() {
                    *c = Some(code);
                    true
                } else {
                    false
                }
            });
        }
    }
}

impl Controller for FakeController {
    fn prepare(&mut self) -> BoxFuture<'_, Result<(), ExecutorError>> {
        self.record("prepare");
        let r = match &self.behavior {
            FakeBehavior::FailPrepare(msg) => Err(ExecutorError::Prepare(msg.clone())),
            _ => Ok(()),
        };
        Box::pin(async move { r })
    }

    fn start(&mut self) -> BoxFuture<'_, Result<i32, ExecutorError>> {
        self.record("start");
        let initial = match self.behavior {
            FakeBehavior::ExitImmediately(code) => Some(code),
            _ => None,
        };
        let (tx, rx) = watch::channel(initial);
        self.state.lock().exits.insert(self.task_id.clone(), tx);
        self.exit = Some(rx);
        Box::pin(async move { Ok(0) })
    }

    fn wait(&mut self) -> BoxFuture<'_, Result<ExitStatus, ExecutorError>> {
        self.record("wait");
        Box::pin(async move {
            let rx = self.exit.as_mut().ok_or(ExecutorError::NotReady("started"))?;
            let code = rx
                .wait_for(Option::is_some)
                .await
                .map_err(|_| ExecutorError::Runtime("the fake executor was dropped".into()))?
                .expect("waited for Some");
            Ok(ExitStatus { code, pid: 0 })
        })
    }

    fn shutdown(&mut self) -> BoxFuture<'_, Result<(), ExecutorError>> {
        self.record("shutdown");
        self.stop_with(143);
        Box::pin(async { Ok(()) })
    }

    fn terminate(&mut self) -> BoxFuture<'_, Result<(), ExecutorError>> {
        self.record("terminate");
        self.stop_with(137);
        Box::pin(async { Ok(()) })
    }

    fn remove(&mut self) -> BoxFuture<'_, Result<(), ExecutorError>> {
        self.record("remove");
        self.stop_with(137);
        self.state.lock().exits.remove(&self.task_id);
        Box::pin(async { Ok(()) })
    }
}
