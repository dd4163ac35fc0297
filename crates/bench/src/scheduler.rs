//! `scheduler`: the scheduler's sans-IO core on an in-memory store. N READY nodes are loaded and the
//! scheduler's `NodeSet` is built from them, then M PENDING tasks of one service are loaded and their commits
//! applied to the set, as the scheduler loop keeps it (not timed; the set's build and updates are shown as
//! "node set ms"). Then, timed: one `Scheduler::schedule` pass over a read view and the set, and the
//! resulting task updates written through a `LocalProposer` in writes of `MAX_ACTIONS_PER_WRITE` actions
//! (as the scheduler loop writes them). The run is checked: every task must end ASSIGNED in the store.
//!
//! `--constraints` mirrors SwarmKit's constrained benchmark: every third node carries a label and every
//! task requires it, so two nodes in three fail the constraint filter.
//! Must not depend on the manager's async loops or on IO.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use shoal_api::{
    node_spec, node_status, task_spec, Annotations, ContainerSpec, Node, NodeDescription, NodeSpec, NodeStatus,
    Placement, Platform, Resources, Task, TaskSpec, TaskState, TaskStatus, Version,
};
use shoal_manager::{NodeSet, PendingTasks, Scheduler};
use shoal_raft::{LocalProposer, Proposer};
use shoal_store::{Changes, MemoryStore};

use crate::report::{self, fmt_num, BenchError, Table};

/// Flags of `scheduler`.
#[derive(Debug, clap::Args)]
pub(crate) struct SchedulerArgs {
    /// Nodes (all READY and ACTIVE).
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    /// Pending tasks, of one service.
    #[arg(long, default_value_t = 1000)]
    tasks: usize,
    /// Every task requires a label that one node in three has.
    #[arg(long)]
    constraints: bool,
    /// Timed runs; the RESULT is their median.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// A size that runs in well under a second (100 nodes x 1000 tasks, 2 runs).
    #[arg(long)]
    smoke: bool,
}

/// Actions per write, as the scheduler loop writes (`write::MAX_ACTIONS_PER_WRITE`).
const MAX_ACTIONS_PER_WRITE: usize = 1000;

const LABEL_KEY: &str = "net";
const LABEL_VALUE: &str = "special";

fn node(i: usize) -> Node {
    let mut labels = HashMap::new();
    if i.is_multiple_of(3) {
        labels.insert(LABEL_KEY.to_string(), LABEL_VALUE.to_string());
    }
    Node {
        id: format!("node{i:07}"),
        spec: Some(NodeSpec {
            annotations: Some(Annotations { name: format!("name{i}"), labels, ..Default::default() }),
            availability: node_spec::Availability::Active as i32,
            membership: node_spec::Membership::Accepted as i32,
            ..Default::default()
        }),
        description: Some(NodeDescription {
            hostname: format!("host{i}"),
            platform: Some(Platform { architecture: "x86_64".into(), os: "linux".into() }),
            resources: Some(Resources { nano_cpus: 2_000_000_000, memory_bytes: 8 << 30, ..Default::default() }),
            ..Default::default()
        }),
        status: Some(NodeStatus { state: node_status::State::Ready as i32, ..Default::default() }),
        ..Default::default()
    }
}

fn task(i: usize, constraints: bool) -> Task {
    let placement = constraints.then(|| Placement {
        constraints: vec![format!("node.labels.{LABEL_KEY}=={LABEL_VALUE}")],
        ..Default::default()
    });
    Task {
        id: format!("task{i:07}"),
        service_id: "service1".into(),
        slot: i as u64 + 1,
        desired_state: TaskState::Running as i32,
        spec: Some(
            TaskSpec {
                runtime: Some(task_spec::Runtime::Container(ContainerSpec {
                    image: "busybox".into(),
                    ..Default::default()
                })),
                placement,
                ..Default::default()
            }
            .into(),
        ),
        spec_version: Some(Version { index: 1 }),
        status: Some(TaskStatus { state: TaskState::Pending as i32, ..Default::default() }),
        ..Default::default()
    }
}

/// One measured run.
struct Run {
    node_set_ms: f64,
    schedule_ms: f64,
    write_ms: f64,
    assigned: usize,
}

/// What `load` made: the store, the scheduler's node set in step with it, the time spent building and
/// updating the set, and the change lists the store was loaded from.
struct Loaded {
    store: Arc<MemoryStore>,
    set: NodeSet,
    set_time: std::time::Duration,
    /// Dropped only after the timed section: freeing 100k objects leaves glibc malloc's fast bins full, and
    /// the next large allocation consolidates them (tens of ms), which would be charged to the pass.
    changes: Vec<Changes>,
}

/// Loads the nodes, builds the scheduler's node set from them (as the scheduler loop holds it from before the
/// tasks arrive), then loads the tasks and applies their commits to the set.
fn load(nodes: usize, tasks: usize, constraints: bool) -> Loaded {
    let store = Arc::new(MemoryStore::default());
    let mut c = Changes::new();
    for i in 0..nodes {
        c.create(node(i));
    }
    store.apply(1, c.actions()).expect("load nodes");
    let mut changes = vec![c];
    let start = Instant::now();
    let mut set = store.view(NodeSet::build);
    let mut set_time = start.elapsed();
    let mut apply = |index: u64, c: Changes| {
        let commit = store.apply(index, c.actions()).expect("load tasks");
        changes.push(c);
        let start = Instant::now();
        set.apply(&commit);
        set_time += start.elapsed();
    };
    let mut index = 2;
    let mut c = Changes::new();
    for i in 0..tasks {
        c.create(task(i, constraints));
        if c.len() == 10_000 {
            apply(index, std::mem::take(&mut c));
            index += 1;
        }
    }
    apply(index, c);
    Loaded { store, set, set_time, changes }
}

fn one_run(nodes: usize, tasks: usize, constraints: bool, rt: &tokio::runtime::Runtime) -> Result<Run, BenchError> {
    let Loaded { store, mut set, set_time, changes } = load(nodes, tasks, constraints);
    let proposer = LocalProposer::new(store.clone());
    let mut scheduler = Scheduler::new();
    let start = Instant::now();
    let pass = store.view(|t| scheduler.schedule(t, &mut set, &PendingTasks::All, 1_700_000_000_000));
    let scheduled = start.elapsed();
    let assigned = pass.assigned;
    let mut actions = pass.changes.into_actions();
    rt.block_on(async {
        while !actions.is_empty() {
            let rest = actions.split_off(actions.len().min(MAX_ACTIONS_PER_WRITE));
            proposer
                .propose(std::mem::replace(&mut actions, rest))
                .await
                .map_err(|e| BenchError::Request(e.to_string()))?;
        }
        Ok::<(), BenchError>(())
    })?;
    let total = start.elapsed();
    let in_store = store.view(|t| t.tasks().by_state(TaskState::Assigned).count());
    let expected = if constraints && nodes == 0 { 0 } else { tasks };
    if assigned != expected || in_store != expected {
        return Err(BenchError::Request(format!(
            "expected {expected} tasks assigned, the pass assigned {assigned} and the store holds {in_store}"
        )));
    }
    drop(changes);
    drop(store);
    Ok(Run { node_set_ms: ms(set_time), schedule_ms: ms(scheduled), write_ms: ms(total - scheduled), assigned })
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Runs the scenario.
pub(crate) fn run(a: SchedulerArgs) -> Result<(), BenchError> {
    let (nodes, tasks, runs) = if a.smoke { (100, 1000, 2) } else { (a.nodes, a.tasks, a.runs.max(1)) };
    let rt = tokio::runtime::Builder::new_current_thread().build().map_err(|e| BenchError::Setup(e.to_string()))?;
    let mut table = Table::new(&[
        "run",
        "nodes",
        "tasks",
        "constraints",
        "node set ms",
        "schedule ms",
        "write ms",
        "total ms",
        "assigned",
    ]);
    let mut totals = Vec::new();
    for r in 1..=runs {
        let run = one_run(nodes, tasks, a.constraints, &rt)?;
        let total = run.schedule_ms + run.write_ms;
        totals.push(total);
        table.row(vec![
            r.to_string(),
            nodes.to_string(),
            tasks.to_string(),
            a.constraints.to_string(),
            fmt_num(run.node_set_ms),
            fmt_num(run.schedule_ms),
            fmt_num(run.write_ms),
            fmt_num(total),
            run.assigned.to_string(),
        ]);
    }
    let med = report::median(&totals);
    table.row(vec![
        "median".into(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        fmt_num(med),
        format!("{} tasks/s", fmt_num(tasks as f64 / (med / 1000.0).max(1e-9))),
    ]);
    report::finish(&table, "scheduler", med, "ms");
    Ok(())
}
