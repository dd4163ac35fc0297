//! Unit tests of the live feed: snapshots and deltas turned from store commits.

use shoal_api::{TaskStatus, Version};
use shoal_store::Changes;

use super::*;

fn task(id: &str, state: TaskState, desired: TaskState, version: u64) -> Task {
    Task {
        id: id.into(),
        service_id: "svc".into(),
        desired_state: desired as i32,
        status: Some(TaskStatus { state: state as i32, err: format!("err of {id}"), ..Default::default() }),
        meta: Some(shoal_api::Meta { version: Some(Version { index: version }), ..Default::default() }),
        ..Default::default()
    }
}

fn ids(s: &Snapshot) -> Vec<&str> {
    let mut v: Vec<&str> = s.tasks.iter().map(|t| t.id.as_str()).collect();
    v.sort();
    v
}

#[test]
fn the_page_shows_tasks_meant_to_run_and_failed_ones_and_is_told_when_one_leaves() {
    let store = Arc::new(MemoryStore::default());
    let mut c = Changes::new();
    c.create(task("running", TaskState::Running, TaskState::Running, 0));
    c.create(task("failed", TaskState::Failed, TaskState::Shutdown, 0));
    c.create(task("old", TaskState::Shutdown, TaskState::Shutdown, 0));
    c.create(task("job", TaskState::Complete, TaskState::Complete, 0));
    store.apply(1, c.actions()).unwrap();
    let snap = store.view(snapshot);
    assert_eq!(ids(&snap), ["failed", "job", "running"]);
    assert_eq!((snap.index, snap.tasks_total), (1, 3));

    // Shut down: the page is told it is gone; a write to a task it never showed says nothing.
    let mut c = Changes::new();
    c.update(task("running", TaskState::Running, TaskState::Shutdown, 1));
    c.update(task("old", TaskState::Shutdown, TaskState::Remove, 1));
    let commit = store.apply(2, c.actions()).unwrap();
    let d = delta(commit.index, &commit.changes).expect("a delta");
    assert_eq!(d.changes, vec![PageChange::Gone { of: "task", id: "running".into() }]);
    let mut c = Changes::new();
    c.update(task("old", TaskState::Shutdown, TaskState::Shutdown, 2));
    let commit = store.apply(3, c.actions()).unwrap();
    assert!(delta(commit.index, &commit.changes).is_none());
}

#[tokio::test]
async fn subscribers_are_capped_and_get_deltas_after_their_snapshot() {
    let store = Arc::new(MemoryStore::default());
    let hub = LiveHub::new(store.clone());
    let (stop_tx, stop) = watch::channel(false);
    let run = tokio::spawn(hub.clone().run(crate::metrics::Recorders::new(), stop));
    let mut slots = Vec::new();
    for _ in 0..MAX_SUBSCRIBERS {
        slots.push(hub.subscribe().expect("a place"));
    }
    assert_eq!(hub.subscribe().err(), Some(Refused::Full));
    slots.truncate(1);
    assert_eq!(hub.subscribers(), 1);
    let (_slot, mut rx, snap) = slots.pop().unwrap();
    assert!(snap.tasks.is_empty());
    let mut c = Changes::new();
    c.create(task("t1", TaskState::Pending, TaskState::Running, 0));
    store.apply(1, c.actions()).unwrap();
    match tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv()).await {
        Ok(Ok(LiveEvent::Delta { index, json })) => {
            assert_eq!(index, 1);
            assert!(json.contains("\"kind\":\"task\"") && json.contains("\"id\":\"t1\""), "{json}");
        }
        other => panic!("expected a delta, got {other:?}"),
    }
    // Stopping ends every subscription.
    stop_tx.send(true).unwrap();
    run.await.unwrap();
    assert!(matches!(rx.recv().await, Err(tokio::sync::broadcast::error::RecvError::Closed)));
    assert_eq!(hub.subscribe().err(), Some(Refused::Stopping));
}
