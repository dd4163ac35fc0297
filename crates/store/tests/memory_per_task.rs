//! Heap bytes per task held by the store, counted by a counting allocator: tasks shaped as the orchestrator
//! makes them (a copy of the service's task spec each, PENDING, then updated once by the scheduler with its
//! "no suitable node" error), applied as a leader applies its own writes and as a follower applies them
//! decoded from the log, and restored from a snapshot. Prints `RESULT store-bytes-per-task ...` lines and
//! fails past `MAX_BYTES_PER_TASK` (requested bytes; the allocator's size classes add about a tenth).

// The counting allocator below is the one unsafe block: it forwards to the system allocator unchanged.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use shoal_api::{
    task_spec, Annotations, ContainerSpec, Endpoint, EndpointSpec, Meta, Placement, Service, ServiceSpec, Task,
    TaskSpec, TaskState, TaskStatus, Version,
};
use shoal_store::{decode_request, decode_snapshot, encode_request, encode_snapshot, Action, Changes, MemoryStore};

static LIVE: AtomicUsize = AtomicUsize::new(0);

struct Counting;

// SAFETY: every call is forwarded to `System` with the same arguments; the counter is only arithmetic.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(new_size, Ordering::Relaxed);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Services of `REPLICAS` tasks each.
const SERVICES: usize = 20;
const REPLICAS: usize = 1000;
/// Tasks per write, as the orchestrator batches its creates.
const BATCH: usize = 100;
/// Fails past this many heap bytes per task (the store's tables, indexes and shared specs): 670 measured
/// as the leader and as a follower, 656 restored (session 10; 1,223 before, 2,727 in session 8).
const MAX_BYTES_PER_TASK: usize = 700;

fn service(i: usize) -> Service {
    let task = TaskSpec {
        runtime: Some(task_spec::Runtime::Container(ContainerSpec {
            image: "busybox".into(),
            args: vec!["sleep".into(), "3600".into()],
            ..Default::default()
        })),
        placement: Some(Placement {
            constraints: vec!["node.labels.shoal-bench==nowhere".into()],
            ..Default::default()
        }),
        ..Default::default()
    };
    Service {
        id: format!("svc{i:022}"),
        spec: Some(ServiceSpec {
            annotations: Some(Annotations { name: format!("mem-{i}"), ..Default::default() }),
            task: Some(task),
            ..Default::default()
        }),
        endpoint: Some(Endpoint { spec: Some(EndpointSpec::default()), ..Default::default() }),
        ..Default::default()
    }
}

/// A task as the orchestrator makes one: its own copy of the service's task spec.
fn new_task(s: &Service, slot: usize, n: usize) -> Task {
    let now = shoal_api::timestamp_from_unix_ms(1_700_000_000_000 + n as u64);
    let spec = s.spec.as_ref().expect("spec");
    let mut t = Task {
        id: format!("{n:025}"),
        meta: Some(Meta { version: None, created_at: Some(now), updated_at: Some(now) }),
        spec: spec.task.clone().map(Into::into),
        service_id: s.id.clone(),
        slot: slot as u64,
        service_annotations: spec.annotations.clone().map(Into::into),
        status: Some(TaskStatus {
            timestamp: Some(now),
            state: TaskState::Pending as i32,
            message: "pending task scheduling".into(),
            ..Default::default()
        }),
        endpoint: s.endpoint.clone().map(Into::into),
        spec_version: Some(Version { index: 1 }),
        ..Default::default()
    };
    t.set_desired_state(TaskState::Running);
    t
}

/// The writes that make the tasks (creates, then the scheduler's update of each), as action lists.
fn writes() -> Vec<Vec<Action>> {
    let services: Vec<Service> = (0..SERVICES).map(service).collect();
    let mut out = Vec::new();
    let mut c = Changes::new();
    for s in &services {
        c.create(s.clone());
    }
    out.push(c.into_actions());
    let mut n = 0;
    for s in &services {
        for first in (0..REPLICAS).step_by(BATCH) {
            let mut c = Changes::new();
            for slot in first..first + BATCH {
                c.create(new_task(s, slot + 1, n));
                n += 1;
            }
            out.push(c.into_actions());
        }
    }
    out
}

fn apply_all(store: &MemoryStore, first_index: u64, writes: Vec<Vec<Action>>) -> u64 {
    let mut index = first_index;
    for w in writes {
        store.apply(index, &w).expect("apply");
        index += 1;
    }
    index
}

/// The scheduler's update of every task: the error that no node fits, read from the store (so the
/// versions match), in batches.
fn schedule_updates(store: &MemoryStore) -> Vec<Vec<Action>> {
    let tasks: Vec<Arc<Task>> = store.view(|t| {
        let mut v: Vec<Arc<Task>> = t.tasks().iter().cloned().collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    });
    tasks
        .chunks(BATCH)
        .map(|chunk| {
            let mut c = Changes::new();
            for t in chunk {
                let mut t = (**t).clone();
                if let Some(st) = t.status.as_mut() {
                    st.err = "no suitable node (scheduling constraints not satisfied on 1 node)".into();
                }
                c.update(t);
            }
            c.into_actions()
        })
        .collect()
}

fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

fn per_task(before: usize, after: usize) -> usize {
    after.saturating_sub(before) / (SERVICES * REPLICAS)
}

#[test]
fn store_bytes_per_task() {
    let tasks = SERVICES * REPLICAS;

    // The leader: applies the objects it built.
    let before = live();
    let leader = MemoryStore::default();
    let w = writes();
    let next = apply_all(&leader, 1, w);
    let u = schedule_updates(&leader);
    let _ = apply_all(&leader, next, u);
    let leader_bytes = per_task(before, live());
    assert_eq!(leader.view(|t| t.tasks().len()), tasks);

    // A follower: applies the same writes decoded from the log.
    let before = live();
    let follower = MemoryStore::default();
    let mut index = 1;
    for w in writes() {
        let (_, actions) = decode_request(&encode_request(index, &w)).expect("decode");
        follower.apply(index, &actions).expect("apply");
        index += 1;
    }
    for w in schedule_updates(&follower) {
        let (_, actions) = decode_request(&encode_request(index, &w)).expect("decode");
        follower.apply(index, &actions).expect("apply");
        index += 1;
    }
    let follower_bytes = per_task(before, live());
    drop(follower);

    // A member restored from the leader's snapshot.
    let (at, snap) = leader.snapshot();
    let bytes = encode_snapshot(snap);
    drop(leader);
    let before = live();
    let restored = MemoryStore::default();
    restored.restore(at, decode_snapshot(&bytes).expect("decode snapshot"));
    let restored_bytes = per_task(before, live());
    drop(bytes);
    assert_eq!(restored.view(|t| t.tasks().len()), tasks);

    println!("RESULT store-bytes-per-task-leader {leader_bytes} bytes");
    println!("RESULT store-bytes-per-task-follower {follower_bytes} bytes");
    println!("RESULT store-bytes-per-task-restored {restored_bytes} bytes");
    for (what, b) in [("leader", leader_bytes), ("follower", follower_bytes), ("restored", restored_bytes)] {
        assert!(b <= MAX_BYTES_PER_TASK, "{what}: {b} heap bytes per task, more than {MAX_BYTES_PER_TASK}");
    }
}
