//! Unit tests of the Prometheus metrics: gauges read from a store view, counts by task state.

use std::time::Instant;

use shoal_api::{Node, NodeStatus, Task, TaskStatus};
use shoal_store::Changes;

use super::*;

fn task(i: usize, state: TaskState) -> Task {
    Task {
        id: format!("task{i:07}"),
        service_id: format!("svc{}", i % 10),
        slot: i as u64,
        node_id: format!("node{}", i % 50),
        desired_state: TaskState::Running as i32,
        status: Some(TaskStatus { state: state as i32, ..Default::default() }),
        ..Default::default()
    }
}

/// A store with `n` tasks (every fourth running, the others pending) and 50 ready nodes.
fn store_with(n: usize) -> Arc<MemoryStore> {
    let store = Arc::new(MemoryStore::default());
    let mut index = 1;
    let mut nodes = Changes::new();
    for i in 0..50 {
        let status = NodeStatus { state: shoal_api::node_status::State::Ready as i32, ..Default::default() };
        nodes.create(Node { id: format!("node{i}"), status: Some(status), ..Default::default() });
    }
    store.apply(index, nodes.actions()).expect("nodes");
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        index += 1;
        let mut c = Changes::new();
        for &i in chunk {
            c.create(task(i, if i % 4 == 0 { TaskState::Running } else { TaskState::Pending }));
        }
        store.apply(index, c.actions()).expect("tasks");
    }
    store
}

fn sample(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' ')?.parse().ok())
}

/// The cheapest of `runs` scrapes, in microseconds.
fn scrape_micros(m: &Metrics, runs: usize) -> u128 {
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(m.encode());
            t.elapsed().as_micros()
        })
        .min()
        .unwrap_or(0)
}

#[test]
fn scrape_cost_does_not_grow_with_tasks() {
    let small = Metrics::new(
        Sources { node_id: "n".into(), store: Some(store_with(10)), ..Default::default() },
        Recorders::new(),
    );
    let big = Metrics::new(
        Sources { node_id: "n".into(), store: Some(store_with(100_000)), ..Default::default() },
        Recorders::new(),
    );
    let text = big.encode();
    assert_eq!(sample(&text, "swarm_manager_tasks_total{state=\"running\"}"), Some(25_000.0), "{text}");
    assert_eq!(sample(&text, "swarm_manager_tasks_total{state=\"pending\"}"), Some(75_000.0));
    assert_eq!(sample(&text, "swarm_manager_tasks_total{state=\"failed\"}"), Some(0.0));
    assert_eq!(sample(&text, "swarm_manager_nodes{state=\"ready\"}"), Some(50.0));
    assert!(text.ends_with("# EOF\n"), "OpenMetrics text ends with # EOF");
    let (small_us, big_us) = (scrape_micros(&small, 20), scrape_micros(&big, 20));
    println!(
        "RESULT scrape of the metrics: {small_us} us at 10 tasks, {big_us} us at 100000 tasks (best of 20, this build)"
    );
    // The same work at both sizes (O(nodes + states)); a generous factor absorbs a busy machine.
    assert!(big_us < small_us * 5 + 2_000, "a scrape at 100k tasks took {big_us} us against {small_us} us at 10");
}

#[test]
fn a_worker_serves_node_and_process_metrics_only() {
    let m = Metrics::new(Sources { node_id: "w1".into(), ..Default::default() }, Recorders::new());
    let text = m.encode();
    assert_eq!(sample(&text, "swarm_node_manager"), Some(0.0), "{text}");
    assert!(text.contains("swarm_node_info{swarm_id=\"\",node_id=\"w1\"} 1"), "{text}");
    assert!(text.contains("process_resident_memory_bytes "), "{text}");
    assert!(text.contains("process_cpu_seconds_total "), "{text}");
    for absent in ["swarm_manager_", "swarm_raft_", "swarm_store_", "swarm_dispatcher_"] {
        assert!(!text.contains(absent), "a worker reports no {absent}*: {text}");
    }
}

#[test]
fn raft_and_dispatcher_readings_are_taken_at_scrape_time() {
    let term = Arc::new(std::sync::atomic::AtomicU64::new(3));
    let t = term.clone();
    let m = Metrics::new(
        Sources {
            node_id: "m1".into(),
            store: Some(store_with(0)),
            raft: Some(Arc::new(move || RaftFigures {
                is_leader: true,
                term: t.load(std::sync::atomic::Ordering::Relaxed),
                applied_index: 7,
                members: 1,
                ..Default::default()
            })),
            dispatcher_sessions: Some(Arc::new(|| 2)),
        },
        Recorders::new(),
    );
    let text = m.encode();
    assert_eq!(sample(&text, "swarm_raft_term"), Some(3.0), "{text}");
    assert_eq!(sample(&text, "swarm_manager_leader"), Some(1.0));
    assert_eq!(sample(&text, "swarm_dispatcher_sessions"), Some(2.0));
    term.store(4, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(sample(&m.encode(), "swarm_raft_term"), Some(4.0));
    m.recorders().write_latency.observe(0.003);
    let text = m.encode();
    assert_eq!(sample(&text, "swarm_store_write_tx_latency_seconds_count"), Some(1.0), "{text}");
}
