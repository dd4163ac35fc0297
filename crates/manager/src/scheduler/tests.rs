//! Unit tests of the scheduler: spread, each filter, the pending explanation, and the loop reacting to a
//! node that becomes ready. The core runs over a `LocalProposer` store; the loop under tokio's paused time.
#![expect(clippy::cast_possible_truncation, reason = "test data is small: random picks below a few hundred")]

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use shoal_api::node_spec::Availability;
use shoal_api::{node_status, Annotations, Placement, Platform, ResourceRequirements, Resources, Service, TaskState};

use super::*;
use crate::orchestrator::fixture::{node, service, Fx};

/// Creates the service, reconciles it (pending tasks), runs one scheduling pass and applies it.
fn schedule(fx: &Fx, svc: Service) -> SchedulePass {
    let id = svc.id.clone();
    fx.create(svc);
    fx.reconcile(&id);
    run_pass(fx)
}

/// One pass over a node set built from the view; checks that the pass leaves the set as it found it.
fn run_pass(fx: &Fx) -> SchedulePass {
    let mut s = Scheduler::new();
    let now = fx.now();
    let mut set = fx.view(NodeSet::build);
    let before = summary(&set);
    let mut pass = fx.view(|t| s.schedule(t, &mut set, &PendingTasks::All, now));
    assert_eq!(summary(&set), before, "the pass left its placements in the node set");
    let changes = std::mem::take(&mut pass.changes);
    fx.apply(changes);
    pass
}

/// Tasks of the service per node ID ("" for unplaced).
fn placement(fx: &Fx, service_id: &str) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for t in fx.runnable(service_id) {
        *m.entry(t.node_id.clone()).or_default() += 1;
    }
    m
}

fn with_placement(mut s: Service, f: impl FnOnce(&mut Placement)) -> Service {
    let task = s.spec.as_mut().unwrap().task.as_mut().unwrap();
    f(task.placement.get_or_insert_with(Default::default));
    s
}

fn with_reservation(mut s: Service, nano_cpus: i64) -> Service {
    s.spec.as_mut().unwrap().task.as_mut().unwrap().resources = Some(ResourceRequirements {
        reservations: Some(Resources { nano_cpus, ..Default::default() }),
        ..Default::default()
    });
    s
}

#[test]
fn spreads_tasks_evenly_and_prefers_nodes_without_the_service() {
    let fx = Fx::new();
    for n in ["n1", "n2", "n3"] {
        fx.create(node(n));
    }
    let pass = schedule(&fx, service("a", 2));
    assert_eq!(pass.assigned, 2);
    let pass = schedule(&fx, service("b", 7));
    assert_eq!((pass.assigned, pass.unplaced), (7, 0));
    let b = placement(&fx, "b");
    let mut counts: Vec<usize> = b.values().copied().collect();
    counts.sort();
    assert_eq!(counts, vec![2, 2, 3]);
    // The node without a task of "a" takes the seventh (fewest tasks overall breaks the tie).
    let a = placement(&fx, "a");
    let free = ["n1", "n2", "n3"].into_iter().find(|n| !a.contains_key(*n)).unwrap();
    assert_eq!(b[free], 3);
    for t in fx.runnable("b") {
        let st = t.status.unwrap();
        assert_eq!((st.state(), st.message.as_str()), (TaskState::Assigned, ASSIGNED_MESSAGE));
    }
}

#[test]
fn only_ready_active_nodes_take_tasks() {
    // (availability, node state, takes tasks)
    let cases = [
        (Availability::Active, node_status::State::Ready, true),
        (Availability::Pause, node_status::State::Ready, false),
        (Availability::Drain, node_status::State::Ready, false),
        (Availability::Active, node_status::State::Down, false),
        (Availability::Active, node_status::State::Unknown, false),
        (Availability::Active, node_status::State::Disconnected, false),
    ];
    for (availability, state, takes) in cases {
        let fx = Fx::new();
        let mut n = node("n1");
        n.spec.as_mut().unwrap().set_availability(availability);
        n.status.as_mut().unwrap().set_state(state);
        fx.create(n);
        let pass = schedule(&fx, service("s1", 2));
        assert_eq!(pass.assigned == 2, takes, "{availability:?} {state:?}");
        if !takes {
            let err = fx.runnable("s1")[0].status.clone().unwrap().err;
            assert_eq!(err, "no suitable node (1 node not available for new tasks)");
        }
    }
}

#[test]
fn constraints_platforms_and_resources_filter_nodes() {
    let labelled = |id: &str, zone: &str| {
        let mut n = node(id);
        n.spec.as_mut().unwrap().annotations =
            Some(Annotations { labels: [("zone".to_string(), zone.to_string())].into(), ..Default::default() });
        n
    };
    let arm = |id: &str| {
        let mut n = node(id);
        n.description.as_mut().unwrap().platform =
            Some(Platform { architecture: "aarch64".into(), os: "linux".into() });
        n
    };
    // Constraint: only east nodes.
    let fx = Fx::new();
    fx.create(labelled("e1", "east"));
    fx.create(labelled("w1", "west"));
    schedule(&fx, with_placement(service("s1", 3), |p| p.constraints = vec!["node.labels.zone==east".into()]));
    assert_eq!(placement(&fx, "s1"), [("e1".to_string(), 3)].into());

    // Platform: amd64 asked, x86_64 node matches, the arm node does not; an empty list matches any.
    let fx = Fx::new();
    fx.create(node("x1"));
    fx.create(arm("a1"));
    let wanted = Platform { architecture: "amd64".into(), os: "linux".into() };
    schedule(&fx, with_placement(service("s1", 2), |p| p.platforms = vec![wanted]));
    assert_eq!(placement(&fx, "s1"), [("x1".to_string(), 2)].into());
    schedule(&fx, service("s2", 2));
    assert_eq!(placement(&fx, "s2").len(), 2);

    // Resources: 3 CPUs each on 4-CPU nodes: one per node, the rest stays pending.
    let fx = Fx::new();
    fx.create(node("n1"));
    fx.create(node("n2"));
    let pass = schedule(&fx, with_reservation(service("s1", 3), 3_000_000_000));
    assert_eq!((pass.assigned, pass.unplaced), (2, 1));
    assert_eq!(placement(&fx, "s1")[""], 1);
    let pending = fx.runnable("s1").into_iter().find(|t| t.node_id.is_empty()).unwrap();
    assert_eq!(pending.status.unwrap().err, "no suitable node (insufficient resources on 2 nodes)");
    // Freeing a node's resources lets the pending task in.
    let placed = fx.runnable("s1").into_iter().find(|t| !t.node_id.is_empty()).unwrap();
    fx.set_state(&placed.id, TaskState::Failed);
    assert_eq!(run_pass(&fx).assigned, 1);
}

#[test]
fn explains_every_refusal_and_writes_it_once() {
    let fx = Fx::new();
    let east = |id: &str| {
        let mut n = node(id);
        n.spec.as_mut().unwrap().annotations =
            Some(Annotations { labels: [("zone".to_string(), "east".to_string())].into(), ..Default::default() });
        n
    };
    let mut down = east("d1");
    down.status.as_mut().unwrap().set_state(node_status::State::Down);
    fx.create(down);
    fx.create(east("e1"));
    fx.create(east("e2"));
    // Filters run in order (ready, resources, constraints): w1 has the CPUs but not the label.
    let mut w1 = node("w1");
    w1.description.as_mut().unwrap().resources.as_mut().unwrap().nano_cpus = 8_000_000_000;
    fx.create(w1);
    let svc = with_reservation(service("s1", 2), 5_000_000_000);
    let svc = with_placement(svc, |p| p.constraints = vec!["node.labels.zone==east".into()]);
    let pass = schedule(&fx, svc);
    assert_eq!((pass.assigned, pass.unplaced), (0, 2));
    for t in fx.runnable("s1") {
        let st = t.status.unwrap();
        assert_eq!(st.state(), TaskState::Pending);
        assert_eq!(
            st.err,
            "no suitable node (insufficient resources on 2 nodes; 1 node not available for new tasks; \
             scheduling constraints not satisfied on 1 node)"
        );
    }
    let again = run_pass(&fx);
    assert_eq!((again.unplaced, again.changes.len()), (2, 0), "an unchanged explanation is not rewritten");

    // No node at all.
    let fx = Fx::new();
    schedule(&fx, service("s1", 1));
    assert_eq!(fx.runnable("s1")[0].status.clone().unwrap().err, NO_SUITABLE_NODE);
}

#[tokio::test(start_paused = true)]
async fn loop_places_pending_tasks_when_a_node_becomes_ready() {
    let fx = Fx::new();
    let mut n = node("n1");
    n.status.as_mut().unwrap().set_state(node_status::State::Down);
    fx.create(n);
    fx.create(service("s1", 2));
    fx.reconcile("s1");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(subsystem().run(fx.state.clone(), stop_rx));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !fx.runnable("s1").iter().all(|t| !t.status.clone().unwrap().err.is_empty()) {
        assert!(tokio::time::Instant::now() < deadline, "pending explanation not written");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    fx.set_node("n1", |n| n.status.as_mut().unwrap().set_state(node_status::State::Ready));
    while !fx.runnable("s1").iter().all(|t| t.node_id == "n1") {
        assert!(tokio::time::Instant::now() < deadline, "tasks not placed after the node became ready");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(1), task).await.expect("scheduler stops").unwrap();
}

/// What a node set holds, comparable: per node ID (ready and active, order key, node version, tasks, tasks
/// per service, reserved, available), and the loads kept for absent node IDs.
type Summary = (
    BTreeMap<String, (bool, u128, u64, usize, BTreeMap<String, usize>, Amount, Amount)>,
    BTreeMap<String, (usize, BTreeMap<String, usize>, Amount)>,
);

fn summary(set: &NodeSet) -> Summary {
    let sorted = |m: &HashMap<String, usize>| m.iter().map(|(k, v)| (k.clone(), *v)).collect::<BTreeMap<_, _>>();
    let nodes = set
        .iter()
        .map(|n| {
            let version = n.node().meta.as_ref().and_then(|m| m.version.as_ref()).map_or(0, |v| v.index);
            let l = n.load();
            let counts = (l.total, sorted(&l.by_service), l.reserved, n.available());
            (n.id().to_string(), (n.ready_active(), n.order_key(), version, counts.0, counts.1, counts.2, counts.3))
        })
        .collect();
    let absent =
        set.absent().iter().map(|(id, l)| (id.clone(), (l.total, sorted(&l.by_service), l.reserved))).collect();
    (nodes, absent)
}

/// Applies every commit queued on `watch` to `set`.
fn catch_up(set: &mut NodeSet, watch: &mut shoal_store::Watch) {
    while let Ok(commit) = watch.try_recv() {
        set.apply(&commit);
    }
}

/// A deterministic pseudo-random sequence (xorshift64).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn task_with(id: &str, service_id: &str, node_id: &str, state: TaskState, nano_cpus: i64) -> shoal_api::Task {
    shoal_api::Task {
        id: id.into(),
        service_id: service_id.into(),
        node_id: node_id.into(),
        desired_state: TaskState::Running as i32,
        spec: Some(
            shoal_api::TaskSpec {
                resources: Some(ResourceRequirements {
                    reservations: Some(Resources { nano_cpus, memory_bytes: nano_cpus / 4, ..Default::default() }),
                    ..Default::default()
                }),
                ..Default::default()
            }
            .into(),
        ),
        spec_version: Some(shoal_api::Version { index: 1 }),
        status: Some(shoal_api::TaskStatus { state: state as i32, ..Default::default() }),
        ..Default::default()
    }
}

#[test]
fn node_set_follows_commits_as_a_fresh_build_would() {
    const NODES: [&str; 5] = ["n0", "n1", "n2", "n3", "n4"];
    const STATES: [TaskState; 6] = [
        TaskState::Pending,
        TaskState::Assigned,
        TaskState::Running,
        TaskState::Failed,
        TaskState::Complete,
        TaskState::Orphaned,
    ];
    let fx = Fx::new();
    let mut watch = fx.store.watch();
    let mut set = fx.view(NodeSet::build);
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut scheduler = Scheduler::new();
    let mut passes_that_placed = 0;
    for step in 0..600 {
        let node_id = NODES[rng.below(NODES.len() as u64) as usize];
        let task_id = format!("t{}", rng.below(24));
        let current_node = fx.view(|t| t.nodes().get(node_id).cloned());
        let current_task = fx.view(|t| t.tasks().get(&task_id).cloned());
        let mut c = shoal_store::Changes::new();
        // A node change and a task change, sometimes both in one commit.
        let (node_op, task_op) = match rng.below(4) {
            0 => (true, false),
            1 => (true, true),
            _ => (false, true),
        };
        if node_op {
            match (current_node, rng.below(4)) {
                (None, _) => {
                    let mut n = node(node_id);
                    n.description.as_mut().unwrap().resources.as_mut().unwrap().nano_cpus =
                        1_000_000_000 * (1 + rng.below(4) as i64);
                    c.create(n);
                }
                (Some(n), 0) => {
                    c.remove(n);
                }
                (Some(n), op) => {
                    let mut n = (*n).clone();
                    match op {
                        1 => n.spec.as_mut().unwrap().set_availability(
                            [Availability::Active, Availability::Pause, Availability::Drain][rng.below(3) as usize],
                        ),
                        2 => n
                            .status
                            .as_mut()
                            .unwrap()
                            .set_state([node_status::State::Ready, node_status::State::Down][rng.below(2) as usize]),
                        _ => n.description.as_mut().unwrap().resources.as_mut().unwrap().nano_cpus += 500_000_000,
                    }
                    c.update(n);
                }
            }
        }
        if task_op {
            let service_id = format!("s{}", rng.below(3));
            let state = STATES[rng.below(STATES.len() as u64) as usize];
            // Tasks name nodes that exist, that were removed or never created, or none.
            let on = if state == TaskState::Pending || rng.below(5) == 0 { "" } else { node_id };
            let cpus = 250_000_000 * rng.below(4) as i64;
            match (current_task, rng.below(5)) {
                (None, _) => {
                    c.create(task_with(&task_id, &service_id, on, state, cpus));
                }
                (Some(t), 0) => {
                    c.remove(t);
                }
                (Some(t), op) => {
                    let mut t = (*t).clone();
                    match op {
                        1 => t.node_id = on.to_string(),
                        2 => t.status.as_mut().unwrap().state = state as i32,
                        3 => t.spec = task_with("", "", "", state, cpus).spec,
                        _ => {
                            // Reassigned: another node and a live state.
                            t.node_id = node_id.to_string();
                            t.status.as_mut().unwrap().state = TaskState::Assigned as i32;
                        }
                    }
                    c.update(t);
                }
            }
        }
        fx.apply(c);
        catch_up(&mut set, &mut watch);
        assert_eq!(summary(&set), summary(&fx.view(NodeSet::build)), "after step {step}");
        if step % 20 == 19 {
            // A pass leaves the set as it was; its placements come back as commits.
            let before = summary(&set);
            let now = fx.now();
            let mut pass = fx.view(|t| scheduler.schedule(t, &mut set, &PendingTasks::All, now));
            assert_eq!(summary(&set), before, "a pass changed the set (step {step})");
            passes_that_placed += usize::from(pass.assigned > 0);
            fx.apply(std::mem::take(&mut pass.changes));
            catch_up(&mut set, &mut watch);
            assert_eq!(summary(&set), summary(&fx.view(NodeSet::build)), "after the pass of step {step}");
        }
    }
    assert!(passes_that_placed > 0, "no pass placed a task: the sequence does not exercise placements");
    assert!(fx.view(|t| t.tasks().len()) > 10);
}

#[test]
fn node_id_breaks_ties_beyond_its_16_byte_prefix() {
    let a15 = "a".repeat(15);
    let a16 = "a".repeat(16);
    let ids = ["b".to_string(), format!("{a16}-2"), format!("{a16}-1"), a16.clone(), a15.clone()];
    assert_eq!(nodeinfo::id_order_key(&ids[1]), nodeinfo::id_order_key(&ids[3]), "the test needs equal prefixes");
    let fx = Fx::new();
    for id in &ids {
        fx.create(node(id));
    }
    schedule(&fx, service("s1", 6));
    let mut by_slot: Vec<(u64, String)> = fx.runnable("s1").into_iter().map(|t| (t.slot, t.node_id)).collect();
    by_slot.sort();
    let nodes: Vec<&str> = by_slot.iter().map(|(_, n)| n.as_str()).collect();
    // Every node has the same counts, so slots go in ID order; the sixth finds all at one and takes the first.
    assert_eq!(nodes, [a15.as_str(), &a16, &format!("{a16}-1"), &format!("{a16}-2"), "b", &a15]);
}

#[test]
fn order_key_orders_as_the_id_when_keys_differ() {
    let ids = ["", "a", "a\u{1}", "ab", "abcdefghijklmnop", "abcdefghijklmnoq", "b", "node0000001", "node0000010"];
    for x in ids {
        for y in ids {
            let (kx, ky) = (nodeinfo::id_order_key(x), nodeinfo::id_order_key(y));
            if kx != ky {
                assert_eq!(kx.cmp(&ky), x.cmp(y), "{x:?} vs {y:?}");
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn loop_counts_freed_resources_from_commits() {
    let fx = Fx::new();
    fx.create(node("n1"));
    fx.create(with_reservation(service("s1", 2), 3_000_000_000));
    fx.reconcile("s1");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(subsystem().run(fx.state.clone(), stop_rx));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let settled = |fx: &Fx| {
        let tasks = fx.runnable("s1");
        let placed: Vec<_> = tasks.iter().filter(|t| !t.node_id.is_empty()).cloned().collect();
        let waiting = tasks.iter().any(|t| t.node_id.is_empty() && !t.status.clone().unwrap().err.is_empty());
        (placed, waiting)
    };
    // 4 CPUs, 3 asked per task: one placed, one explained.
    let placed = loop {
        let (placed, waiting) = settled(&fx);
        if placed.len() == 1 && waiting {
            break placed[0].clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "first placement not made");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // The loop learns of the failure only through the commit; its node set must give the CPUs back.
    fx.set_state(&placed.id, TaskState::Failed);
    loop {
        if fx.runnable("s1").iter().filter(|t| t.id != placed.id).all(|t| t.node_id == "n1") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the freed CPUs were not used");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(1), task).await.expect("scheduler stops").unwrap();
}

#[test]
fn placements_match_a_plain_greedy_spread_with_few_or_many_tasks() {
    // The heap (bounded to the best `tasks` candidates when there are more nodes) must place each task, in
    // slot order, on the passing node with the fewest tasks of the service, then overall, then lowest ID.
    let mut rng = Rng(0x0dd_ba11_cafe_f00d);
    for round in 0..12 {
        let fx = Fx::new();
        let node_count = 5 + rng.below(40) as usize;
        let task_count = 1 + rng.below(if round % 2 == 0 { 4 } else { 120 }) as usize;
        // (id, ready, CPUs free, tasks of s1, tasks overall)
        let mut model: Vec<(String, bool, i64, usize, usize)> = Vec::new();
        for i in 0..node_count {
            let id = format!("n{:03}", rng.below(1000) * 100 + i as u64);
            let mut n = node(&id);
            let ready = rng.below(6) != 0;
            if !ready {
                n.status.as_mut().unwrap().set_state(node_status::State::Down);
            }
            let cpus = 1_000_000_000 * (1 + rng.below(6) as i64);
            n.description.as_mut().unwrap().resources.as_mut().unwrap().nano_cpus = cpus;
            fx.create(n);
            let (mut free, mut same, mut total) = (cpus, 0, 0);
            for k in 0..rng.below(3) {
                let service_id = if rng.below(2) == 0 { "s1" } else { "s0" };
                fx.create(task_with(&format!("{id}-t{k}"), service_id, &id, TaskState::Running, 500_000_000));
                free -= 500_000_000;
                total += 1;
                same += usize::from(service_id == "s1");
            }
            model.push((id, ready, free, same, total));
        }
        let need = 250_000_000 * rng.below(5) as i64;
        for k in 0..task_count {
            let mut t = task_with(&format!("p{k:04}"), "s1", "", TaskState::Pending, need);
            t.slot = k as u64 + 1;
            fx.create(t);
        }
        let mut expected = Vec::new();
        for _ in 0..task_count {
            let best =
                model.iter_mut().filter(|n| n.1 && n.2 >= need).min_by(|a, b| (a.3, a.4, &a.0).cmp(&(b.3, b.4, &b.0)));
            match best {
                Some(n) => {
                    n.2 -= need;
                    n.3 += 1;
                    n.4 += 1;
                    expected.push(n.0.clone());
                }
                None => expected.push(String::new()),
            }
        }
        run_pass(&fx);
        let pending = fx.tasks("s1").into_iter().filter(|t| t.id.starts_with('p'));
        let mut placed: Vec<(u64, String)> = pending.map(|t| (t.slot, t.node_id)).collect();
        placed.sort();
        let placed: Vec<String> = placed.into_iter().map(|(_, n)| n).collect();
        assert_eq!(placed, expected, "round {round}: {node_count} nodes, {task_count} tasks needing {need}");
    }
}

fn with_labels(id: &str, labels: &[(&str, &str)]) -> shoal_api::Node {
    let mut n = node(id);
    n.spec.as_mut().unwrap().annotations = Some(Annotations {
        labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..Default::default()
    });
    n
}

fn spread_over(s: Service, descriptors: &[&str]) -> Service {
    with_placement(s, |p| {
        p.preferences = descriptors
            .iter()
            .map(|d| shoal_api::PlacementPreference {
                preference: Some(shoal_api::placement_preference::Preference::Spread(shoal_api::SpreadOver {
                    spread_descriptor: d.to_string(),
                })),
            })
            .collect()
    })
}

/// Tasks of the service per value of the node label `key` ("" for nodes without it).
fn per_label(fx: &Fx, service_id: &str, key: &str) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for t in fx.runnable(service_id).into_iter().filter(|t| !t.node_id.is_empty()) {
        let n = fx.view(|v| v.nodes().get(&t.node_id).cloned()).unwrap();
        let value = n.spec.as_ref().and_then(|s| s.annotations.as_ref()).and_then(|a| a.labels.get(key)).cloned();
        *m.entry(value.unwrap_or_default()).or_default() += 1;
    }
    m
}

#[test]
fn spread_preference_fills_label_values_evenly_before_nodes() {
    // The case: zones a, a, b and 4 replicas: 2 in a (one per node), 2 in b (both on its one node).
    let fx = Fx::new();
    fx.create(with_labels("n1", &[("zone", "a")]));
    fx.create(with_labels("n2", &[("zone", "a")]));
    fx.create(with_labels("n3", &[("zone", "b")]));
    let pass = schedule(&fx, spread_over(service("s1", 4), &["node.labels.zone"]));
    assert_eq!((pass.assigned, pass.unplaced), (4, 0));
    assert_eq!(per_label(&fx, "s1", "zone"), [("a".to_string(), 2), ("b".to_string(), 2)].into());
    assert_eq!(placement(&fx, "s1"), [("n1".to_string(), 1), ("n2".to_string(), 1), ("n3".to_string(), 2)].into());

    // Without the preference the same nodes get 2, 1, 1 (spread over nodes only).
    let pass = schedule(&fx, service("s2", 4));
    assert_eq!(pass.assigned, 4);
    assert_eq!(per_label(&fx, "s2", "zone"), [("a".to_string(), 3), ("b".to_string(), 1)].into());

    // Scaling up later keeps zones even, counting the tasks already placed.
    fx.update_service("s1", |s| {
        s.mode = Some(shoal_api::service_spec::Mode::Replicated(shoal_api::ReplicatedService { replicas: 6 }))
    });
    fx.reconcile("s1");
    run_pass(&fx);
    assert_eq!(per_label(&fx, "s1", "zone"), [("a".to_string(), 3), ("b".to_string(), 3)].into());
}

#[test]
fn unlabelled_nodes_form_their_own_group_and_levels_nest() {
    let fx = Fx::new();
    fx.create(with_labels("n1", &[("zone", "a"), ("rack", "1")]));
    fx.create(with_labels("n2", &[("zone", "a"), ("rack", "2")]));
    fx.create(with_labels("n3", &[("zone", "a"), ("rack", "2")]));
    fx.create(with_labels("n4", &[("zone", "b"), ("rack", "1")]));
    fx.create(node("n5"));
    // 6 tasks over zones a, b and "" (n5): 2 each; within zone a over racks 1 and 2: 1 each.
    schedule(&fx, spread_over(service("s1", 6), &["node.labels.zone", "node.labels.rack"]));
    assert_eq!(per_label(&fx, "s1", "zone"), [("".to_string(), 2), ("a".to_string(), 2), ("b".to_string(), 2)].into());
    let p = placement(&fx, "s1");
    assert_eq!((p["n1"], p.get("n2").unwrap_or(&0) + p.get("n3").unwrap_or(&0)), (1, 1));
    assert_eq!((p["n4"], p["n5"]), (2, 2));
}

#[test]
fn a_full_branch_overflows_to_the_others_and_explains_what_is_left() {
    // Zone a's one node fits one 3-CPU task; zone b's two nodes take the rest; the last stays pending.
    let fx = Fx::new();
    fx.create(with_labels("a1", &[("zone", "a")]));
    fx.create(with_labels("b1", &[("zone", "b")]));
    fx.create(with_labels("b2", &[("zone", "b")]));
    let pass = schedule(&fx, with_reservation(spread_over(service("s1", 4), &["node.labels.zone"]), 3_000_000_000));
    assert_eq!((pass.assigned, pass.unplaced), (3, 1));
    assert_eq!(per_label(&fx, "s1", "zone"), [("a".to_string(), 1), ("b".to_string(), 2)].into());
    let pending = fx.runnable("s1").into_iter().find(|t| t.node_id.is_empty()).unwrap();
    assert!(pending.status.unwrap().err.starts_with(NO_SUITABLE_NODE), "explained");

    // A constraint that leaves out a zone: its branch gets nothing, the others stay even.
    let fx = Fx::new();
    fx.create(with_labels("a1", &[("zone", "a"), ("ssd", "yes")]));
    fx.create(with_labels("b1", &[("zone", "b"), ("ssd", "yes")]));
    fx.create(with_labels("c1", &[("zone", "c")]));
    let svc = with_placement(spread_over(service("s1", 4), &["node.labels.zone"]), |p| {
        p.constraints = vec!["node.labels.ssd==yes".into()]
    });
    let pass = schedule(&fx, svc);
    assert_eq!(pass.assigned, 4);
    assert_eq!(placement(&fx, "s1"), [("a1".to_string(), 2), ("b1".to_string(), 2)].into());
}

fn offering(id: &str, generic: Vec<shoal_api::GenericResource>) -> shoal_api::Node {
    let mut n = node(id);
    n.description.as_mut().unwrap().resources.as_mut().unwrap().generic = generic;
    n
}

fn reserving(mut s: Service, need: &[(&str, i64)]) -> Service {
    let task = s.spec.as_mut().unwrap().task.as_mut().unwrap();
    task.resources = Some(ResourceRequirements {
        reservations: Some(Resources {
            generic: need.iter().map(|(k, v)| shoal_api::generic::discrete(k, *v)).collect(),
            ..Default::default()
        }),
        ..Default::default()
    });
    s
}

#[test]
fn generic_resources_are_claimed_unit_by_unit_and_freed_with_the_task() {
    use shoal_api::generic::{discrete, named};
    let fx = Fx::new();
    fx.create(offering("g1", vec![named("gpu", "GPU-a"), named("gpu", "GPU-b"), discrete("ssd", 1)]));
    fx.create(offering("g2", vec![discrete("ssd", 3)]));
    fx.create(node("plain"));

    // One GPU each: the two named units of g1 go to two tasks; the third has no node.
    let pass = schedule(&fx, reserving(service("s1", 3), &[("gpu", 1)]));
    assert_eq!((pass.assigned, pass.unplaced), (2, 1));
    let mut gpus: Vec<String> = fx
        .runnable("s1")
        .iter()
        .filter(|t| !t.node_id.is_empty())
        .map(|t| {
            assert_eq!(t.node_id, "g1");
            assert_eq!(t.assigned_generic_resources.len(), 1);
            shoal_api::generic::value(&t.assigned_generic_resources[0])
        })
        .collect();
    gpus.sort();
    assert_eq!(gpus, vec!["GPU-a", "GPU-b"]);
    let pending = fx.runnable("s1").into_iter().find(|t| t.node_id.is_empty()).unwrap();
    assert_eq!(pending.status.unwrap().err, "no suitable node (insufficient resources on 3 nodes)");

    // A task that ends gives its GPU back: the pending one gets exactly that unit.
    let done = fx.runnable("s1").into_iter().find(|t| !t.node_id.is_empty()).unwrap();
    fx.set_state(&done.id, TaskState::Failed);
    assert_eq!(run_pass(&fx).assigned, 1);
    let t = fx.task(&pending.id);
    assert_eq!(t.assigned_generic_resources, done.assigned_generic_resources);

    // Counted kinds: 2 units each; g2 has 3 (one task), g1 has 1 (none), so one of two is placed.
    let pass = schedule(&fx, reserving(service("s2", 2), &[("ssd", 2)]));
    assert_eq!((pass.assigned, pass.unplaced), (1, 1));
    let placed = fx.runnable("s2").into_iter().find(|t| !t.node_id.is_empty()).unwrap();
    assert_eq!((placed.node_id.as_str(), placed.assigned_generic_resources.clone()), ("g2", vec![discrete("ssd", 2)]));
    // And the node set counts the commit's claim: one unit of ssd left on g2.
    let set = fx.view(NodeSet::build);
    let g2 = set.get("g2").unwrap();
    assert!(g2.generic_fits(&[("ssd", 1)]) && !g2.generic_fits(&[("ssd", 2)]));
}

/// A proposer whose first `conflicts` writes fail as if another writer had changed a task first (what the
/// orchestrator's writes to the same pending tasks do), then applies through `inner`.
struct ConflictingProposer {
    inner: Arc<shoal_raft::LocalProposer>,
    conflicts: std::sync::atomic::AtomicUsize,
}

impl shoal_raft::Proposer for ConflictingProposer {
    fn propose(&self, actions: Vec<shoal_store::Action>) -> shoal_raft::ProposeFuture {
        use std::sync::atomic::Ordering;
        let left = self.conflicts.load(Ordering::SeqCst);
        if left > 0 {
            self.conflicts.store(left - 1, Ordering::SeqCst);
            let e = shoal_store::StoreError::VersionConflict {
                kind: shoal_store::ObjectKind::Task,
                id: "t".into(),
                expected: 1,
                actual: 2,
            };
            return Box::pin(std::future::ready(Err(shoal_raft::ProposeError::Store(e))));
        }
        self.inner.propose(actions)
    }

    fn leadership(&self) -> tokio::sync::watch::Receiver<shoal_raft::LeaderState> {
        self.inner.leadership()
    }

    fn read_barrier(&self) -> shoal_raft::ReadBarrierFuture {
        self.inner.read_barrier()
    }
}

/// Found by the simulation (`shoal-sim`, seed 42): a pass whose writes conflicted `MAX_ATTEMPTS` times in a
/// row dropped its tasks, and since the commits that conflicted were already taken in, nothing brought them
/// back: in a quiet cluster they stayed PENDING for good. They must be placed once the writes go through.
#[tokio::test(start_paused = true)]
async fn loop_places_tasks_whose_writes_kept_conflicting() {
    let fx = Fx::new();
    fx.create(node("n1"));
    fx.create(service("s1", 2));
    fx.reconcile("s1");
    let proposer = Arc::new(ConflictingProposer {
        inner: fx.proposer.clone(),
        conflicts: (runner::MAX_ATTEMPTS as usize + 1).into(),
    });
    let state =
        crate::ClusterState::new(fx.store.clone(), proposer, fx.clock.clone(), Arc::new(crate::RandomIds::seeded(3)));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(subsystem().run(state, stop_rx));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !fx.runnable("s1").iter().all(|t| t.node_id == "n1") {
        assert!(tokio::time::Instant::now() < deadline, "tasks left pending after their writes conflicted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(1), task).await.expect("scheduler stops").unwrap();
}

/// A pending task of service `s` publishing host-mode `port` (0: none) and attached to a network of
/// `driver` (empty: none), as the allocator leaves it.
fn net_task(id: &str, s: &str, port: u32, driver: &str) -> shoal_api::Task {
    let mut t = task_with(id, s, "", TaskState::Pending, 0);
    if port != 0 {
        t.endpoint = Some(shoal_api::Shared::new(shoal_api::Endpoint {
            ports: vec![shoal_api::PortConfig {
                target_port: 80,
                published_port: port,
                publish_mode: shoal_api::port_config::PublishMode::Host as i32,
                ..Default::default()
            }],
            ..Default::default()
        }));
    }
    if !driver.is_empty() {
        let network = shoal_api::Network {
            id: "appnet".into(),
            driver_state: Some(shoal_api::Driver { name: driver.into(), ..Default::default() }),
            ..Default::default()
        };
        t.networks = vec![shoal_api::NetworkAttachment {
            network: Some(network),
            addresses: vec!["10.0.1.3/24".into()],
            ..Default::default()
        }];
    }
    t
}

fn with_overlay_plugin(mut n: shoal_api::Node) -> shoal_api::Node {
    n.description.as_mut().unwrap().engine = Some(shoal_api::EngineDescription {
        plugins: vec![shoal_api::PluginDescription { r#type: "Network".into(), name: "overlay".into() }],
        ..Default::default()
    });
    n
}

#[test]
fn a_host_mode_port_is_taken_once_per_node() {
    let fx = Fx::new();
    fx.create(node("n1"));
    fx.create(node("n2"));
    for i in 0..3 {
        fx.create(net_task(&format!("h{i}"), "h", 9000, ""));
    }
    fx.create(net_task("other", "o", 9001, ""));
    let pass = run_pass(&fx);
    assert_eq!((pass.assigned, pass.unplaced), (3, 1));
    let h = placement(&fx, "h");
    assert_eq!((h.get("n1"), h.get("n2")), (Some(&1), Some(&1)), "{h:?}");
    let waiting = fx.runnable("h").into_iter().find(|t| t.node_id.is_empty()).unwrap();
    assert_eq!(waiting.status.as_ref().unwrap().err, "no suitable node (host-mode port already in use on 2 nodes)");
    // The port is free again once the task on n1 stops.
    let on_n1 = fx.runnable("h").into_iter().find(|t| t.node_id == "n1").unwrap();
    fx.set_state(&on_n1.id, TaskState::Failed);
    assert_eq!(run_pass(&fx).assigned, 1);
}

#[test]
fn a_task_on_an_overlay_network_goes_only_to_nodes_with_the_overlay_plugin() {
    let fx = Fx::new();
    fx.create(node("n1"));
    fx.create(net_task("t1", "s", 0, "overlay"));
    fx.create(net_task("t2", "plain", 0, ""));
    let pass = run_pass(&fx);
    assert_eq!((pass.assigned, pass.unplaced), (1, 1));
    let t1 = fx.view(|t| t.tasks().get("t1").cloned()).unwrap();
    assert_eq!(t1.status.as_ref().unwrap().err, "no suitable node (missing plugin on 1 node)");
    fx.create(with_overlay_plugin(node("n2")));
    assert_eq!(run_pass(&fx).assigned, 1);
    assert_eq!(fx.view(|t| t.tasks().get("t1").unwrap().node_id.clone()), "n2");
}

#[test]
fn a_pending_network_task_names_why_a_node_has_no_data_plane() {
    let fx = Fx::new();
    let mut n1 = node("n1");
    let why = "another Shoal daemon (pid 7, state dir /srv/a) carries this network namespace's data plane";
    let d = n1.description.as_mut().unwrap();
    d.hostname = "host-a".into();
    d.engine
        .get_or_insert_with(Default::default)
        .labels
        .insert(shoal_api::SHOAL_NO_DATA_PLANE_LABEL.into(), why.into());
    fx.create(n1);
    fx.create(net_task("t1", "s", 0, "overlay"));
    assert_eq!(run_pass(&fx).unplaced, 1);
    let t1 = fx.view(|t| t.tasks().get("t1").cloned()).unwrap();
    assert_eq!(
        t1.status.as_ref().unwrap().err,
        format!("no suitable node (missing plugin on 1 node (no data plane on node host-a: {why}))")
    );
}

mod cluster_volumes {
    use shoal_api::volume_access_mode::{Scope, Sharing};
    use shoal_api::volume_publish_status::State;
    use shoal_api::volume_spec::VolumeAvailability;
    use shoal_api::{mount, Mount, NodeCsiInfo, Topology, Volume, VolumeAccessMode, VolumeInfo, VolumeSpec};

    use super::*;

    /// A node running the test plugin (`zone`: its place in the plugin's topology).
    fn csi_node(id: &str, zone: Option<&str>) -> shoal_api::Node {
        let mut n = node(id);
        n.description.as_mut().unwrap().csi_info = vec![NodeCsiInfo {
            plugin_name: "csi.test".into(),
            node_id: format!("csi-{id}"),
            max_volumes_per_node: 0,
            accessible_topology: zone.map(|z| Topology { segments: [("zone".into(), z.into())].into() }),
        }];
        n
    }

    fn volume(id: &str, group: &str, scope: Scope, sharing: Sharing) -> Volume {
        Volume {
            id: id.into(),
            spec: Some(VolumeSpec {
                annotations: Some(Annotations { name: format!("vol-{id}"), ..Default::default() }),
                group: group.into(),
                driver: Some(shoal_api::Driver { name: "csi.test".into(), ..Default::default() }),
                access_mode: Some(VolumeAccessMode { scope: scope as i32, sharing: sharing as i32, access_type: None }),
                ..Default::default()
            }),
            volume_info: Some(VolumeInfo { volume_id: format!("plugin-{id}"), ..Default::default() }),
            ..Default::default()
        }
    }

    fn mounting(mut s: Service, source: &str, readonly: bool) -> Service {
        let task = s.spec.as_mut().unwrap().task.as_mut().unwrap();
        if let Some(shoal_api::task_spec::Runtime::Container(c)) = task.runtime.as_mut() {
            c.mounts.push(Mount {
                r#type: mount::Type::Cluster as i32,
                source: source.into(),
                target: "/data".into(),
                readonly,
                ..Default::default()
            });
        }
        s
    }

    /// Runs a pass and applies all it writes, the volume write included.
    fn pass(fx: &Fx) -> SchedulePass {
        let mut s = Scheduler::new();
        let now = fx.now();
        let mut set = fx.view(NodeSet::build);
        let mut pass = fx.view(|t| s.schedule(t, &mut set, &PendingTasks::All, now));
        fx.apply(std::mem::take(&mut pass.changes));
        fx.apply(std::mem::take(&mut pass.volume_changes));
        pass
    }

    fn add(fx: &Fx, svc: Service) -> SchedulePass {
        let id = svc.id.clone();
        fx.create(svc);
        fx.reconcile(&id);
        pass(fx)
    }

    fn publications(fx: &Fx, id: &str) -> Vec<(String, i32)> {
        fx.view(|t| t.volumes().get(id).unwrap().publish_status.iter().map(|p| (p.node_id.clone(), p.state)).collect())
    }

    fn err(fx: &Fx, service: &str) -> Vec<String> {
        fx.runnable(service).iter().filter(|t| t.node_id.is_empty()).map(|t| t.status.clone().unwrap().err).collect()
    }

    /// A task mounting a cluster volume goes only to a node running its plugin, carries the volume chosen for
    /// its mount, and the volume is marked PENDING_PUBLISH for that node in the same write.
    #[test]
    fn a_task_goes_where_its_volume_can_be_published_and_the_publication_is_written_with_it() {
        let fx = Fx::new();
        fx.create(node("plain"));
        fx.create(csi_node("n1", None));
        fx.create(volume("v1", "", Scope::SingleNode, Sharing::All));
        let p = add(&fx, mounting(service("s", 1), "vol-v1", false));
        assert_eq!((p.assigned, p.unplaced), (1, 0));
        let t = &fx.runnable("s")[0];
        assert_eq!(t.node_id, "n1");
        assert_eq!(t.volumes.len(), 1);
        assert_eq!(
            (t.volumes[0].id.as_str(), t.volumes[0].source.as_str(), t.volumes[0].target.as_str()),
            ("v1", "vol-v1", "/data")
        );
        assert_eq!(publications(&fx, "v1"), vec![("n1".into(), State::PendingPublish as i32)]);
        // A second task on the same node and volume adds no second publication.
        fx.create(mounting(service("s2", 1), "vol-v1", false));
        fx.reconcile("s2");
        pass(&fx);
        assert_eq!(fx.runnable("s2")[0].node_id, "n1");
        assert_eq!(publications(&fx, "v1"), vec![("n1".into(), State::PendingPublish as i32)]);
    }

    /// What keeps a task off a volume, each with its reason on the pending task: a name no created volume
    /// has, a volume not active, no node with the plugin, sharing none already used, a single-node volume on
    /// another node, a read-only volume mounted read-write, a node outside the volume's topology.
    #[test]
    fn a_task_waits_with_the_reason_its_volume_cannot_be_used() {
        let fx = Fx::new();
        fx.create(node("plain"));
        let p = add(&fx, mounting(service("a", 1), "vol-nope", false));
        assert_eq!(p.unplaced, 1);
        assert!(
            err(&fx, "a")[0].contains("no created cluster volume named \"vol-nope\" on 1 node"),
            "{:?}",
            err(&fx, "a")
        );

        fx.create(volume("v1", "", Scope::MultiNode, Sharing::None));
        add(&fx, mounting(service("b", 1), "vol-v1", false));
        assert!(err(&fx, "b")[0].contains("does not run the CSI plugin \"csi.test\""), "{:?}", err(&fx, "b"));

        fx.create(csi_node("n1", Some("z1")));
        fx.create(csi_node("n2", Some("z2")));
        pass(&fx);
        assert_eq!(err(&fx, "b"), Vec::<String>::new(), "placed once a node runs the plugin");
        // Sharing none: one task at a time.
        add(&fx, mounting(service("c", 1), "vol-v1", false));
        assert!(err(&fx, "c")[0].contains("is in use (sharing: none)"), "{:?}", err(&fx, "c"));

        // Single node: a second task goes to the same node only.
        let mut single = volume("v2", "", Scope::SingleNode, Sharing::All);
        single.volume_info.as_mut().unwrap().accessible_topology =
            vec![Topology { segments: [("zone".into(), "z2".into())].into() }];
        fx.create(single);
        add(&fx, mounting(service("d", 3), "vol-v2", false));
        let nodes: Vec<String> = fx.runnable("d").iter().map(|t| t.node_id.clone()).collect();
        assert_eq!(nodes, vec!["n2"; 3], "the topology allows only n2, and all share it");

        // Read-only sharing refuses a read-write mount and takes a read-only one.
        fx.create(volume("v3", "", Scope::MultiNode, Sharing::ReadOnly));
        add(&fx, mounting(service("e", 1), "vol-v3", false));
        assert!(err(&fx, "e")[0].contains("is read-only: mount it with readonly"), "{:?}", err(&fx, "e"));
        let p = add(&fx, mounting(service("f", 2), "vol-v3", true));
        assert_eq!(p.assigned, 2);

        // Paused: no new task.
        let mut paused = volume("v4", "", Scope::MultiNode, Sharing::All);
        paused.spec.as_mut().unwrap().availability = VolumeAvailability::Pause as i32;
        fx.create(paused);
        add(&fx, mounting(service("g", 1), "vol-v4", false));
        assert!(err(&fx, "g")[0].contains("is not active"), "{:?}", err(&fx, "g"));
    }

    /// A group mount takes any volume of the group that is free; a volume being unpublished from a node is
    /// not used there until it is done.
    #[test]
    fn a_group_mount_takes_a_free_volume_and_unpublishing_volumes_are_not_used() {
        let fx = Fx::new();
        fx.create(csi_node("n1", None));
        fx.create(volume("g1", "pool", Scope::MultiNode, Sharing::None));
        fx.create(volume("g2", "pool", Scope::MultiNode, Sharing::None));
        let p = add(&fx, mounting(service("s", 3), "group:pool", false));
        assert_eq!((p.assigned, p.unplaced), (2, 1));
        let mut used: Vec<String> =
            fx.runnable("s").iter().flat_map(|t| t.volumes.iter().map(|a| a.id.clone()).collect::<Vec<_>>()).collect();
        used.sort();
        assert_eq!(used, vec!["g1", "g2"]);

        let mut v = volume("u", "", Scope::MultiNode, Sharing::All);
        v.publish_status = vec![shoal_api::VolumePublishStatus {
            node_id: "n1".into(),
            state: State::PendingNodeUnpublish as i32,
            ..Default::default()
        }];
        fx.create(v);
        add(&fx, mounting(service("u", 1), "vol-u", false));
        assert!(err(&fx, "u")[0].contains("being unpublished from the node"), "{:?}", err(&fx, "u"));
    }

    /// A plugin's `max_volumes_per_node` is honoured: a node holding that many of its volumes takes no task
    /// needing another one (it may still take one using a volume it already holds).
    #[test]
    fn a_node_takes_no_more_volumes_than_its_plugin_allows() {
        let fx = Fx::new();
        let mut n = csi_node("n1", None);
        n.description.as_mut().unwrap().csi_info[0].max_volumes_per_node = 1;
        fx.create(n);
        fx.create(volume("a", "", Scope::MultiNode, Sharing::All));
        fx.create(volume("b", "", Scope::MultiNode, Sharing::All));
        assert_eq!(add(&fx, mounting(service("s1", 1), "vol-a", false)).assigned, 1);
        add(&fx, mounting(service("s2", 1), "vol-b", false));
        assert!(
            err(&fx, "s2")[0].contains("holds 1 volumes of the CSI plugin \"csi.test\", its limit"),
            "{:?}",
            err(&fx, "s2")
        );
        assert_eq!(add(&fx, mounting(service("s3", 1), "vol-a", false)).assigned, 1, "a volume it holds");
    }
}

/// A task on an IPv6 overlay goes to Shoal nodes only: a stock Docker Engine worker (no `shoal.agent` label)
/// is refused, naming its engine's version; its IPv4-only tasks it still takes.
#[test]
fn a_task_on_an_ipv6_overlay_goes_only_to_shoal_nodes() {
    let fx = Fx::new();
    let mut engine = with_overlay_plugin(node("n1"));
    engine.description.as_mut().unwrap().engine.as_mut().unwrap().engine_version = "20.10.24".into();
    fx.create(engine);
    let mut t1 = net_task("t1", "s", 0, "overlay");
    let n = t1.networks[0].network.as_mut().unwrap();
    n.spec = Some(shoal_api::NetworkSpec { ipv6_enabled: true, ..Default::default() });
    // A task preassigned to the engine (a global service's) is checked there too.
    let mut t3 = t1.clone();
    t3.id = "t3".into();
    t3.node_id = "n1".into();
    fx.create(t1);
    fx.create(t3);
    fx.create(net_task("t2", "plain", 0, "overlay"));
    let pass = run_pass(&fx);
    assert_eq!((pass.assigned, pass.unplaced), (1, 2));
    for id in ["t1", "t3"] {
        let t = fx.view(|t| t.tasks().get(id).cloned()).unwrap();
        assert_eq!(
            t.status.as_ref().unwrap().err,
            "no suitable node (IPv6 overlay not carried on 1 node: Docker Engine workers (20.10.24) do not carry \
             swarm IPv6 overlays, Shoal nodes do)",
            "{id}"
        );
    }
    let mut shoal = with_overlay_plugin(node("n2"));
    shoal.description.as_mut().unwrap().engine.as_mut().unwrap().labels =
        [(shoal_api::SHOAL_AGENT_LABEL.to_string(), "0.1.0".to_string())].into();
    fx.create(shoal);
    assert_eq!(run_pass(&fx).assigned, 1);
    assert_eq!(fx.view(|t| t.tasks().get("t1").unwrap().node_id.clone()), "n2");
}
