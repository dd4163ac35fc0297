//! Unit tests of the store: indexes, compare-and-swap, atomicity, watch-before-view, snapshots, references.

use std::sync::Arc;

use shoal_api::{Annotations, Service, ServiceSpec, Task, TaskState, TaskStatus};

use crate::*;

fn service(id: &str, name: &str) -> Service {
    Service {
        id: id.into(),
        spec: Some(ServiceSpec {
            annotations: Some(Annotations { name: name.into(), ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn task(id: &str, service_id: &str, slot: u64, node: &str) -> Task {
    let mut t = Task { id: id.into(), service_id: service_id.into(), slot, node_id: node.into(), ..Default::default() };
    t.set_desired_state(TaskState::Running);
    t.status = Some(TaskStatus { state: TaskState::Pending as i32, ..Default::default() });
    t
}

fn apply(store: &MemoryStore, index: u64, changes: Changes) -> Result<Arc<Commit>, StoreError> {
    store.apply(index, changes.actions())
}

#[test]
fn create_sets_version_to_the_raft_index() {
    let store = MemoryStore::default();
    let mut c = Changes::new();
    c.create(service("s1", "web"));
    apply(&store, 7, c).unwrap();
    let got = store.view(|t| t.services().get("s1").cloned()).unwrap();
    assert_eq!(got.version(), 7);
    assert_eq!(store.last_index(), 7);
    assert_eq!(store.view(|t| t.services().by_name("WEB").map(|s| s.id.clone())), Some("s1".into()));
}

#[test]
fn update_is_compare_and_swap_on_version() {
    let store = MemoryStore::default();
    let mut c = Changes::new();
    c.create(service("s1", "web"));
    apply(&store, 1, c).unwrap();
    let read = (*store.view(|t| t.services().get("s1").cloned()).unwrap()).clone();

    let mut first = read.clone();
    first.spec.as_mut().unwrap().annotations.as_mut().unwrap().labels.insert("a".into(), "1".into());
    let mut c = Changes::new();
    c.update(first);
    apply(&store, 2, c).unwrap();

    // A second writer that read version 1 loses.
    let mut stale = read;
    stale.spec.as_mut().unwrap().annotations.as_mut().unwrap().labels.insert("b".into(), "2".into());
    let mut c = Changes::new();
    c.update(stale);
    let err = apply(&store, 3, c).unwrap_err();
    assert!(matches!(err, StoreError::VersionConflict { expected: 1, actual: 2, .. }), "{err}");
    let now = store.view(|t| t.services().get("s1").cloned()).unwrap();
    assert_eq!(now.version(), 2);
    assert!(!now.spec.as_ref().unwrap().annotations.as_ref().unwrap().labels.contains_key("b"));
}

#[test]
fn a_failing_action_undoes_the_whole_write() {
    let store = MemoryStore::default();
    let mut c = Changes::new();
    c.create(service("s1", "web"));
    apply(&store, 1, c).unwrap();
    let mut c = Changes::new();
    c.create(task("t1", "s1", 1, "")).create(service("s2", "Web"));
    let err = apply(&store, 2, c).unwrap_err();
    assert!(matches!(err, StoreError::NameConflict { .. }), "{err}");
    assert_eq!(store.view(|t| t.tasks().len()), 0);
    assert_eq!(store.view(|t| t.services().len()), 1);
}

#[test]
fn task_indexes_follow_updates_and_removes() {
    let store = MemoryStore::default();
    let mut c = Changes::new();
    c.create(task("t1", "s1", 1, "")).create(task("t2", "s1", 2, "n1")).create(task("t3", "s2", 1, "n1"));
    apply(&store, 1, c).unwrap();
    let ids = |f: &dyn Fn(&Tables) -> Vec<String>| {
        let mut v = store.view(f);
        v.sort();
        v
    };
    assert_eq!(ids(&|t| t.tasks().by_service("s1").map(|t| t.id.clone()).collect()), ["t1", "t2"]);
    assert_eq!(ids(&|t| t.tasks().by_node("n1").map(|t| t.id.clone()).collect()), ["t2", "t3"]);
    assert_eq!(ids(&|t| t.tasks().by_state(TaskState::Pending).map(|t| t.id.clone()).collect()).len(), 3);

    let mut t1 = (*store.view(|t| t.tasks().get("t1").cloned()).unwrap()).clone();
    t1.node_id = "n2".into();
    t1.status.as_mut().unwrap().state = TaskState::Assigned as i32;
    let mut c = Changes::new();
    c.update(t1);
    apply(&store, 2, c).unwrap();
    assert_eq!(ids(&|t| t.tasks().by_node("n2").map(|t| t.id.clone()).collect()), ["t1"]);
    assert_eq!(ids(&|t| t.tasks().by_state(TaskState::Pending).map(|t| t.id.clone()).collect()), ["t2", "t3"]);
    assert_eq!(ids(&|t| t.tasks().by_slot("s1", 1).map(|t| t.id.clone()).collect()), ["t1"]);

    let t3 = store.view(|t| t.tasks().get("t3").cloned()).unwrap();
    let mut c = Changes::new();
    c.remove(t3);
    apply(&store, 3, c).unwrap();
    assert_eq!(ids(&|t| t.tasks().by_node("n1").map(|t| t.id.clone()).collect()), ["t2"]);
    assert_eq!(store.view(|t| t.tasks().count_by_service("s2")), 0);
}

/// The indexes hold the tasks themselves: after an update that changes no index key (a new status
/// message) and one that changes some (a slot, a node, the states), every index answers with the current
/// version, the one the ID map holds, and the old version is released.
#[test]
fn indexes_answer_with_the_current_version_of_a_task() {
    let store = MemoryStore::default();
    let mut c = Changes::new();
    for i in 0..40 {
        c.create(task(&format!("t{i:02}"), "s1", i % 2, "n1"));
    }
    apply(&store, 1, c).unwrap();
    let current = |id: &str| store.view(|t| t.tasks().get(id).cloned()).unwrap();
    let check = |id: &str, slot: u64, node: &str, desired: TaskState, state: TaskState| {
        let now = current(id);
        store.view(|t| {
            let tt = t.tasks();
            let is_now = |x: &&Arc<Task>| x.id == id;
            for (what, found) in [
                ("service", tt.by_service("s1").find(is_now)),
                ("slot", tt.by_slot("s1", slot).find(is_now)),
                ("node", tt.by_node(node).find(is_now)),
                ("desired state", tt.by_desired_state(desired).find(is_now)),
                ("state", tt.by_state(state).find(is_now)),
            ] {
                assert!(found.is_some_and(|f| Arc::ptr_eq(f, &now)), "{what} index of {id}: not the current version");
            }
        });
    };
    // No index key changes (both the small and the large form of a set: 40 tasks on n1, 20 per slot).
    for id in ["t03", "t38"] {
        let before = current(id);
        let mut t = (*before).clone();
        t.status.as_mut().unwrap().message = "new message".into();
        let mut c = Changes::new();
        c.update(t);
        apply(&store, 2 + id[1..].parse::<u64>().unwrap(), c).unwrap();
        check(id, id[1..].parse::<u64>().unwrap() % 2, "n1", TaskState::Running, TaskState::Pending);
        assert_eq!(Arc::strong_count(&before), 1, "no index keeps the old version of {id}");
    }
    // Every key changes.
    let mut t = (*current("t05")).clone();
    t.slot = 7;
    t.node_id = "n2".into();
    t.set_desired_state(TaskState::Shutdown);
    t.status.as_mut().unwrap().state = TaskState::Assigned as i32;
    let mut c = Changes::new();
    c.update(t);
    apply(&store, 100, c).unwrap();
    check("t05", 7, "n2", TaskState::Shutdown, TaskState::Assigned);
    assert_eq!(store.view(|t| t.tasks().by_slot("s1", 1).count()), 19);
    assert_eq!(store.view(|t| t.tasks().by_node("n1").count()), 39);
    assert_eq!(store.view(|t| t.tasks().count_by_state(TaskState::Pending)), 39);
}

#[test]
fn watch_before_view_misses_nothing() {
    let store = MemoryStore::default();
    let mut c = Changes::new();
    c.create(service("s1", "web"));
    apply(&store, 1, c).unwrap();
    let (count, mut watch) = store.view_and_watch(|t| t.services().len());
    assert_eq!(count, 1);
    let mut c = Changes::new();
    c.create(service("s2", "db"));
    apply(&store, 2, c).unwrap();
    let commit = watch.try_recv().unwrap();
    assert_eq!(commit.index, 2);
    assert_eq!(commit.changes.len(), 1);
    assert_eq!(commit.changes[0].kind, ActionKind::Create);
    assert_eq!(commit.changes[0].object.id(), "s2");
    assert!(watch.try_recv().is_err());
}

#[test]
fn a_slow_watcher_is_told_it_lagged() {
    let store = MemoryStore::new(2);
    let mut watch = store.watch();
    for i in 1..=5u64 {
        let mut c = Changes::new();
        c.create(task(&format!("t{i}"), "s", i, ""));
        apply(&store, i, c).unwrap();
    }
    // The queued commits first, in order; then the gap; then what comes after it.
    assert_eq!(watch.try_recv().unwrap().index, 1);
    assert_eq!(watch.try_recv().unwrap().index, 2);
    assert!(matches!(watch.try_recv(), Err(tokio::sync::broadcast::error::TryRecvError::Lagged(3))));
    assert!(matches!(watch.try_recv(), Err(tokio::sync::broadcast::error::TryRecvError::Empty)));
    let mut c = Changes::new();
    c.create(task("t6", "s", 6, ""));
    apply(&store, 6, c).unwrap();
    assert_eq!(watch.try_recv().unwrap().index, 6);
}

#[test]
fn a_commit_is_kept_only_until_every_watcher_took_it() {
    let store = MemoryStore::default();
    let mut watch = store.watch();
    let gone = store.watch();
    drop(gone);
    let mut c = Changes::new();
    c.create(task("t1", "s", 1, ""));
    let commit = apply(&store, 1, c).unwrap();
    // Ours and the live watcher's queue; the dropped watcher holds none.
    assert_eq!(Arc::strong_count(&commit), 2);
    drop(watch.try_recv().unwrap());
    assert_eq!(Arc::strong_count(&commit), 1, "a consumed commit is still held by the store");
}

#[tokio::test]
async fn a_waiting_watcher_wakes_for_the_next_commit_and_sees_the_store_close() {
    let store = Arc::new(MemoryStore::default());
    let mut watch = store.watch();
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut c = Changes::new();
            c.create(task("t1", "s", 1, ""));
            apply(&store, 1, c).unwrap();
        })
    };
    assert_eq!(watch.recv().await.unwrap().index, 1);
    writer.await.unwrap();
    drop(store);
    assert!(matches!(watch.recv().await, Err(tokio::sync::broadcast::error::RecvError::Closed)));
}

#[test]
fn snapshot_round_trips_through_the_codec() {
    let store = MemoryStore::default();
    let mut c = Changes::new();
    c.create(service("s1", "web")).create(task("t1", "s1", 1, "n1"));
    apply(&store, 5, c).unwrap();
    let (index, snap) = store.snapshot();
    let bytes = encode_snapshot(snap);
    let other = MemoryStore::default();
    other.restore(index, decode_snapshot(&bytes).unwrap());
    assert_eq!(other.last_index(), 5);
    assert_eq!(other.view(|t| t.tasks().by_node("n1").count()), 1);
    assert_eq!(other.view(|t| t.services().by_name("web").map(|s| s.version())), Some(5));
}

#[test]
fn requests_round_trip_through_the_codec() {
    let mut c = Changes::new();
    c.create(service("s1", "web")).update(task("t1", "s1", 1, ""));
    let bytes = encode_request(42, c.actions());
    let (id, actions) = decode_request(&bytes).unwrap();
    assert_eq!(id, 42);
    assert_eq!(actions, c.actions());
    assert!(decode_request(&[0xff, 0xff]).is_err());
}

#[test]
fn an_action_s_encoded_len_bounds_its_share_of_an_encoded_write() {
    let mut big = task("t1", "s1", 1, "n1");
    big.service_annotations = Some(
        Annotations {
            name: "web".into(),
            labels: [("k".to_string(), "v".repeat(300_000))].into(),
            ..Default::default()
        }
        .into(),
    );
    let mut c = Changes::new();
    c.create(service("s1", "web")).update(big).remove(Arc::new(task("t2", "s1", 2, "")));
    let sum: usize = c.actions().iter().map(Action::encoded_len).sum();
    let bytes = encode_request(u64::MAX, c.actions());
    assert!(bytes.len() <= sum + 16, "{} encoded > {sum} + 16", bytes.len());
    assert!(bytes.len() + c.actions().len() * ACTION_OVERHEAD_BYTES >= sum, "the bound is tight enough to be useful");
}

fn secret(id: &str, name: &str, data: &[u8]) -> shoal_api::Secret {
    shoal_api::Secret {
        id: id.into(),
        spec: Some(shoal_api::SecretSpec {
            annotations: Some(Annotations { name: name.into(), ..Default::default() }),
            data: data.to_vec(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn config(id: &str, name: &str, data: &[u8]) -> shoal_api::Config {
    shoal_api::Config {
        id: id.into(),
        spec: Some(shoal_api::ConfigSpec {
            annotations: Some(Annotations { name: name.into(), ..Default::default() }),
            data: data.to_vec(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn secrets_and_configs_have_unique_names_per_kind_and_survive_snapshots_and_proposals() {
    let store = MemoryStore::default();
    let mut c = Changes::new();
    // The same name in two kinds (and as a service name) is allowed: names are unique per table.
    c.create(secret("sec1", "db", b"pw")).create(config("cfg1", "db", b"conf")).create(service("s1", "db"));
    apply(&store, 3, c).unwrap();

    let mut dup = Changes::new();
    dup.create(secret("sec2", "DB", b"other"));
    assert!(matches!(apply(&store, 4, dup), Err(StoreError::NameConflict { kind: ObjectKind::Secret, .. })));
    let mut dup = Changes::new();
    dup.create(config("cfg2", "db", b"other"));
    assert!(matches!(apply(&store, 5, dup), Err(StoreError::NameConflict { kind: ObjectKind::Config, .. })));

    let bytes = encode_request(9, Changes::new().create(secret("sec3", "x", b"y")).actions());
    let (_, actions) = decode_request(&bytes).unwrap();
    assert_eq!(actions[0].object.kind(), ObjectKind::Secret);

    let (index, snap) = store.snapshot();
    let other = MemoryStore::default();
    other.restore(index, decode_snapshot(&encode_snapshot(snap)).unwrap());
    assert_eq!(other.view(|t| t.secrets().by_name("db").map(|s| s.spec.clone().unwrap().data)), Some(b"pw".to_vec()));
    assert_eq!(other.view(|t| t.configs().get("cfg1").map(|s| s.version())), Some(3));
}

fn volume(id: &str, name: &str) -> shoal_api::Volume {
    shoal_api::Volume {
        id: id.into(),
        spec: Some(shoal_api::VolumeSpec {
            annotations: Some(Annotations { name: name.into(), ..Default::default() }),
            driver: Some(shoal_api::Driver { name: "csi.example.com".into(), ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn mounting(id: &str, source: &str) -> Service {
    let mut s = service(id, id);
    s.spec.as_mut().unwrap().task = Some(shoal_api::TaskSpec {
        runtime: Some(shoal_api::task_spec::Runtime::Container(shoal_api::ContainerSpec {
            mounts: vec![shoal_api::Mount {
                r#type: shoal_api::mount::Type::Cluster as i32,
                source: source.into(),
                target: "/data".into(),
                ..Default::default()
            }],
            ..Default::default()
        })),
        ..Default::default()
    });
    s
}

#[test]
fn cluster_volumes_have_unique_names_survive_snapshots_and_proposals_and_stay_while_mounted() {
    let store = MemoryStore::default();
    let mut c = Changes::new();
    // A volume may share its name with a secret: names are unique per table.
    c.create(volume("vol1", "data")).create(volume("vol2", "logs")).create(secret("sec1", "data", b"pw"));
    apply(&store, 3, c).unwrap();
    let mut dup = Changes::new();
    dup.create(volume("vol3", "DATA"));
    assert!(matches!(apply(&store, 4, dup), Err(StoreError::NameConflict { kind: ObjectKind::Volume, .. })));

    let bytes = encode_request(9, Changes::new().create(volume("vol4", "x")).actions());
    let (_, actions) = decode_request(&bytes).unwrap();
    assert_eq!(actions[0].object.kind(), ObjectKind::Volume);
    let (index, snap) = store.snapshot();
    let other = MemoryStore::default();
    other.restore(index, decode_snapshot(&encode_snapshot(snap)).unwrap());
    assert_eq!(
        other.view(|t| t.volumes().by_name("data").map(|v| (v.id.clone(), v.version()))),
        Some(("vol1".into(), 3))
    );

    // A service mounting one (type=cluster, by name in any case or by ID) holds it; an unmounted one goes.
    let mut c = Changes::new();
    c.create(mounting("s1", "Data")).create(mounting("s2", "vol2"));
    apply(&store, 5, c).unwrap();
    for (index, id) in [(6, "vol1"), (7, "vol2")] {
        let v = store.view(|t| t.volumes().get(id).cloned()).unwrap();
        let mut c = Changes::new();
        c.remove(v);
        let err = apply(&store, index, c).unwrap_err();
        assert!(matches!(err, StoreError::DanglingReference(ref m) if m.contains("is in use by service")), "{err}");
    }
    let mut c = Changes::new();
    c.remove(store.view(|t| t.services().get("s2").cloned()).unwrap());
    c.remove(store.view(|t| t.volumes().get("vol2").cloned()).unwrap());
    apply(&store, 8, c).unwrap();
    assert_eq!(store.view(|t| t.volumes().len()), 1);
}

#[test]
fn service_totals_follow_writes_and_snapshots() {
    use shoal_api::{service_spec::Mode, GlobalService, ReplicatedService, TaskSpec};
    let with_mode = |id: &str, mode: Mode| {
        let mut s = service(id, id);
        let spec = s.spec.as_mut().unwrap();
        spec.mode = Some(mode);
        spec.task = Some(TaskSpec { force_update: 7, ..Default::default() });
        s
    };
    let store = MemoryStore::default();
    let mut c = Changes::new();
    c.create(with_mode("a", Mode::Replicated(ReplicatedService { replicas: 5 })))
        .create(with_mode("g", Mode::Global(GlobalService {})));
    apply(&store, 1, c).unwrap();
    let t = store.view(|t| t.service_totals());
    assert_eq!((t.tasks, t.task_bytes, t.global_services, t.global_task_bytes), (5, 10, 1, 2));

    let a = store.view(|t| t.services().get("a").cloned()).unwrap();
    let mut scaled = (*a).clone();
    scaled.spec.as_mut().unwrap().mode = Some(Mode::Replicated(ReplicatedService { replicas: 2 }));
    let mut c = Changes::new();
    c.update(scaled);
    apply(&store, 2, c).unwrap();
    assert_eq!(store.view(|t| t.service_totals()).tasks, 2);

    let (index, snap) = store.snapshot();
    let other = MemoryStore::default();
    other.restore(index, snap);
    assert_eq!(other.view(|t| t.service_totals()), store.view(|t| t.service_totals()));

    let g = store.view(|t| t.services().get("g").cloned()).unwrap();
    let mut c = Changes::new();
    c.remove(g);
    apply(&store, 3, c).unwrap();
    let t = store.view(|t| t.service_totals());
    assert_eq!((t.tasks, t.global_services, t.global_task_bytes), (2, 0, 0));
}

fn service_using(id: &str, name: &str, secret_id: &str, config_id: &str) -> Service {
    let mut s = service(id, name);
    let container = shoal_api::ContainerSpec {
        secrets: vec![shoal_api::SecretReference { secret_id: secret_id.into(), ..Default::default() }],
        configs: vec![shoal_api::ConfigReference { config_id: config_id.into(), ..Default::default() }],
        ..Default::default()
    };
    s.spec.as_mut().unwrap().task = Some(shoal_api::TaskSpec {
        runtime: Some(shoal_api::task_spec::Runtime::Container(container)),
        ..Default::default()
    });
    s
}

#[test]
fn no_write_leaves_a_service_referring_to_a_missing_secret_or_config() {
    let store = MemoryStore::default();
    let mut c = Changes::new();
    c.create(secret("sec1", "pw", b"x")).create(config("cfg1", "conf", b"y"));
    apply(&store, 2, c).unwrap();
    // A service naming a missing secret or config is refused when applied, whatever its writer saw.
    for (index, s, missing) in [
        (3, service_using("s1", "web", "gone", "cfg1"), "secret"),
        (4, service_using("s1", "web", "sec1", "gone"), "config"),
    ] {
        let mut c = Changes::new();
        c.create(s);
        match apply(&store, index, c) {
            Err(StoreError::DanglingReference(m)) => {
                assert!(m.starts_with(&format!("{missing} not found: gone")), "{m}")
            }
            other => panic!("{other:?}"),
        }
    }
    let mut c = Changes::new();
    c.create(service_using("s1", "web", "sec1", "cfg1"));
    apply(&store, 5, c).unwrap();
    // Removing what a service refers to is refused, and changes nothing.
    for (index, removed) in [
        (6, Object::Secret(store.view(|t| t.secrets().get("sec1").cloned()).unwrap())),
        (7, Object::Config(store.view(|t| t.configs().get("cfg1").cloned()).unwrap())),
    ] {
        let action = Action { kind: ActionKind::Remove, object: removed };
        match store.apply(index, std::slice::from_ref(&action)) {
            Err(StoreError::DanglingReference(m)) => assert!(m.contains("is in use by service web"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(store.view(|t| (t.secrets().len(), t.configs().len())), (1, 1));
    // An update dropping the references (the old spec kept as the previous one), then the removal: both fine.
    let mut s = (*store.view(|t| t.services().get("s1").cloned()).unwrap()).clone();
    s.previous_spec = s.spec.clone();
    s.spec.as_mut().unwrap().task = None;
    let mut c = Changes::new();
    c.update(s);
    apply(&store, 8, c).unwrap();
    let mut c = Changes::new();
    c.remove(store.view(|t| t.secrets().get("sec1").cloned()).unwrap());
    apply(&store, 9, c).unwrap();
    // Going back to the previous spec (a rollback) is not refused for what it already referred to; adding a
    // new missing reference is.
    let mut s = (*store.view(|t| t.services().get("s1").cloned()).unwrap()).clone();
    std::mem::swap(&mut s.spec, &mut s.previous_spec);
    let mut c = Changes::new();
    c.update(s.clone());
    apply(&store, 10, c).unwrap();
    let mut s = (*store.view(|t| t.services().get("s1").cloned()).unwrap()).clone();
    s.spec = service_using("s1", "web", "new-gone", "cfg1").spec;
    let mut c = Changes::new();
    c.update(s);
    assert!(matches!(apply(&store, 11, c), Err(StoreError::DanglingReference(m)) if m.starts_with("secret not found: \
                                                                                               new-gone")));
}

fn network(id: &str, name: &str, subnet: &str) -> shoal_api::Network {
    shoal_api::Network {
        id: id.into(),
        spec: Some(shoal_api::NetworkSpec {
            annotations: Some(Annotations { name: name.into(), ..Default::default() }),
            ..Default::default()
        }),
        ipam: Some(shoal_api::IpamOptions {
            driver: None,
            configs: vec![shoal_api::IpamConfig { subnet: subnet.into(), ..Default::default() }],
        }),
        ..Default::default()
    }
}

#[test]
fn networks_never_overlap_survive_snapshots_and_stay_while_a_service_uses_them() {
    let store = MemoryStore::default();
    let mut c = Changes::new();
    c.create(network("n1", "appnet", "10.0.1.0/24"));
    apply(&store, 1, c).unwrap();
    // Two networks proposed from one view cannot both get overlapping ranges.
    for (i, subnet) in ["10.0.1.0/24", "10.0.0.0/16", "10.0.1.128/25"].into_iter().enumerate() {
        let mut c = Changes::new();
        c.create(network(&format!("x{i}"), &format!("other{i}"), subnet));
        let e = apply(&store, 2 + i as u64, c).unwrap_err();
        assert!(e.to_string().contains("overlaps subnet 10.0.1.0/24 of network appnet"), "{e}");
    }
    let mut c = Changes::new();
    c.create(network("n2", "APPNET", "10.0.2.0/24"));
    assert!(matches!(apply(&store, 9, c), Err(StoreError::NameConflict { kind: ObjectKind::Network, .. })));

    // A service attached to a missing network is refused; one attached to n1 holds it.
    let attached = |id: &str, name: &str, net: &str| {
        let mut s = service(id, name);
        s.spec.as_mut().unwrap().task = Some(shoal_api::TaskSpec {
            networks: vec![shoal_api::NetworkAttachmentConfig { target: net.into(), ..Default::default() }],
            ..Default::default()
        });
        s
    };
    let mut c = Changes::new();
    c.create(attached("s0", "lost", "nope"));
    assert!(apply(&store, 10, c).unwrap_err().to_string().contains("network not found: nope"));
    let mut c = Changes::new();
    c.create(attached("s1", "web", "n1"));
    apply(&store, 11, c).unwrap();
    let mut c = Changes::new();
    c.remove(store.view(|t| t.networks().get("n1").cloned()).unwrap());
    let e = apply(&store, 12, c).unwrap_err();
    assert!(e.to_string().contains("network appnet is in use by service web"), "{e}");

    let (index, snap) = store.snapshot();
    let again = MemoryStore::default();
    again.restore(index, decode_snapshot(&encode_snapshot(snap)).unwrap());
    assert_eq!(again.view(|t| t.networks().by_name("appnet").map(|n| n.id.clone())), Some("n1".into()));
}

#[test]
fn failed_applies_are_remembered_until_a_restore() {
    let store = MemoryStore::default();
    assert_eq!(store.apply_outcomes_known_from(), 1);
    let mut c = Changes::new();
    c.create(service("s1", "web"));
    apply(&store, 3, c).unwrap();
    let mut dup = Changes::new();
    dup.create(service("s2", "web"));
    assert!(apply(&store, 4, dup).is_err());
    assert!(!store.apply_failed(3));
    assert!(store.apply_failed(4));
    let (index, snap) = store.snapshot();
    store.restore(index, snap);
    assert_eq!(store.apply_outcomes_known_from(), 5);
    assert!(!store.apply_failed(4));
}

fn spec_of(image: &str) -> shoal_api::TaskSpec {
    shoal_api::TaskSpec {
        runtime: Some(shoal_api::task_spec::Runtime::Container(shoal_api::ContainerSpec {
            image: image.into(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// A task as the orchestrator makes one: its own copies of the spec, the service's annotations and endpoint.
fn with_spec(id: &str, service_id: &str, slot: u64, image: &str) -> Task {
    Task {
        spec: Some(spec_of(image).into()),
        service_annotations: Some(Annotations { name: format!("name-{service_id}"), ..Default::default() }.into()),
        endpoint: Some(
            shoal_api::Endpoint {
                ports: vec![shoal_api::PortConfig { target_port: 80, ..Default::default() }],
                ..Default::default()
            }
            .into(),
        ),
        ..task(id, service_id, slot, "")
    }
}

fn spec_ptr(store: &MemoryStore, id: &str) -> *const shoal_api::TaskSpec {
    store.view(|t| Arc::as_ptr(t.tasks().get(id).unwrap().spec.as_ref().unwrap().arc()))
}

/// Where a task's service annotations and endpoint are held.
fn shared_ptrs(store: &MemoryStore, id: &str) -> (*const Annotations, *const shoal_api::Endpoint) {
    store.view(|t| {
        let task = t.tasks().get(id).unwrap();
        (
            Arc::as_ptr(task.service_annotations.as_ref().unwrap().arc()),
            Arc::as_ptr(task.endpoint.as_ref().unwrap().arc()),
        )
    })
}

/// The tasks of one service with equal specs hold one copy between them, whether applied as built (the
/// leader), decoded from the log (a follower) or restored from a snapshot; a different spec (a new service
/// version) or another service gets its own; what the store publishes is the shared copy. The service's
/// annotations and endpoint as copied into its tasks are shared the same way.
#[test]
fn tasks_of_one_service_version_share_their_spec() {
    let leader = MemoryStore::default();
    let follower = MemoryStore::default();
    let mut watch = leader.watch();
    let mut writes = Vec::new();
    let mut c = Changes::new();
    c.create(with_spec("t1", "s1", 1, "busybox")).create(with_spec("t2", "s1", 2, "busybox"));
    writes.push(c);
    let mut c = Changes::new();
    c.create(with_spec("t3", "s1", 3, "busybox")).create(with_spec("t4", "s1", 1, "alpine"));
    c.create(with_spec("t5", "s2", 1, "busybox"));
    writes.push(c);
    for (i, c) in writes.into_iter().enumerate() {
        let index = i as u64 + 1;
        leader.apply(index, c.actions()).unwrap();
        let (_, decoded) = decode_request(&encode_request(index, c.actions())).unwrap();
        follower.apply(index, &decoded).unwrap();
    }
    let (at, snap) = leader.snapshot();
    let restored = MemoryStore::default();
    restored.restore(at, decode_snapshot(&encode_snapshot(snap)).unwrap());
    for store in [&leader, &follower, &restored] {
        let p = |id| spec_ptr(store, id);
        assert_eq!(p("t1"), p("t2"));
        assert_eq!(p("t1"), p("t3"), "a later write shares the earlier tasks' spec");
        assert_ne!(p("t1"), p("t4"), "another spec is not merged");
        assert_ne!(p("t1"), p("t5"), "specs are shared within a service");
        assert_eq!(store.view(|t| t.tasks().get("t4").unwrap().spec.as_deref().cloned()), Some(spec_of("alpine")));
        let q = |id| shared_ptrs(store, id);
        assert_eq!(q("t1"), q("t2"));
        assert_eq!(q("t1"), q("t3"));
        assert_eq!(q("t1"), q("t4"), "a task of another spec shares the service's annotations and endpoint");
        assert_ne!(q("t1").0, q("t5").0, "annotations are shared within a service");
        assert_ne!(q("t1").1, q("t5").1, "endpoints are shared within a service");
        assert_eq!(
            store.view(|t| t.tasks().get("t5").unwrap().service_annotations.as_ref().unwrap().name.clone()),
            "name-s2"
        );
    }
    let first = watch.try_recv().unwrap();
    let Object::Task(published) = &first.changes[1].object else { panic!("a task") };
    assert_eq!(Arc::as_ptr(published.spec.as_ref().unwrap().arc()), spec_ptr(&leader, "t2"));

    // A write to one task's spec (copy-on-write) leaves the others' alone.
    let mut t2 = (*leader.view(|t| t.tasks().get("t2").cloned()).unwrap()).clone();
    if let Some(shoal_api::task_spec::Runtime::Container(c)) = &mut t2.spec.as_mut().unwrap().runtime {
        c.image = "nginx".into();
    }
    let mut c = Changes::new();
    c.update(t2);
    leader.apply(3, c.actions()).unwrap();
    let image = |id| {
        leader.view(|t| match t.tasks().get(id).unwrap().spec.as_ref().unwrap().runtime.clone() {
            Some(shoal_api::task_spec::Runtime::Container(c)) => c.image,
            _ => String::new(),
        })
    };
    assert_eq!((image("t1"), image("t2"), image("t3")), ("busybox".into(), "nginx".into(), "busybox".into()));

    // Removing every task of a service forgets its specs; a new task starts a new copy.
    let mut c = Changes::new();
    for id in ["t1", "t2", "t3", "t4"] {
        c.remove(leader.view(|t| t.tasks().get(id).cloned()).unwrap());
    }
    leader.apply(4, c.actions()).unwrap();
    let mut c = Changes::new();
    c.create(with_spec("t6", "s1", 1, "busybox"));
    leader.apply(5, c.actions()).unwrap();
    assert_eq!(leader.view(|t| t.tasks().by_service("s1").count()), 1);
}

/// The indexes answer the same after a set outgrows its small form and shrinks again: a service with more
/// tasks than `SMALL_SET_MAX`, in (slot, ID) order, by slot (in ID order), a node's in ID order, and after
/// removals.
#[test]
fn index_sets_keep_their_order_past_their_small_form() {
    let store = MemoryStore::default();
    let mut c = Changes::new();
    for i in (0..100).rev() {
        c.create(task(&format!("t{i:03}"), "s1", i % 3, "n1"));
    }
    store.apply(1, c.actions()).unwrap();
    let ids = |f: &dyn Fn(&Tables) -> Vec<String>| store.view(f);
    let all = ids(&|t| t.tasks().by_service("s1").map(|t| t.id.clone()).collect());
    let want: Vec<String> = (0..100).map(|i| format!("t{i:03}")).collect();
    let mut by_slot_then_id = want.clone();
    by_slot_then_id.sort_by_key(|id| (id[1..].parse::<u64>().unwrap() % 3, id.clone()));
    assert_eq!(all, by_slot_then_id);
    for slot in [0, 2, 3] {
        let n = ids(&|t| t.tasks().by_slot("s1", slot).map(|t| t.id.clone()).collect()).len();
        assert_eq!(n, if slot == 3 { 0 } else { (0..100).filter(|i| i % 3 == slot).count() });
    }
    let slot1 = ids(&|t| t.tasks().by_slot("s1", 1).map(|t| t.id.clone()).collect());
    assert_eq!(slot1, want.iter().enumerate().filter(|(i, _)| i % 3 == 1).map(|(_, s)| s.clone()).collect::<Vec<_>>());
    assert_eq!(ids(&|t| t.tasks().by_node("n1").map(|t| t.id.clone()).collect()), want);
    let mut c = Changes::new();
    for i in 0..95 {
        c.remove(store.view(|t| t.tasks().get(&format!("t{i:03}")).cloned()).unwrap());
    }
    store.apply(2, c.actions()).unwrap();
    assert_eq!(ids(&|t| t.tasks().by_node("n1").map(|t| t.id.clone()).collect()), want[95..].to_vec());
    assert_eq!(store.view(|t| t.tasks().count_by_state(TaskState::Pending)), 5);
    assert_eq!(store.view(|t| t.tasks().count_by_service("s1")), 5);
    let rest = ids(&|t| t.tasks().by_service("s1").map(|t| t.id.clone()).collect());
    assert_eq!(rest, ["t096", "t099", "t097", "t095", "t098"], "slot 0, then 1, then 2");
    assert_eq!(ids(&|t| t.tasks().by_slot("s1", 1).map(|t| t.id.clone()).collect()), ["t097"]);
}
