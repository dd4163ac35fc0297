//! Tests of `RaftNode` on a real raft-engine log in a temporary directory: leadership of a single member,
//! proposals (results, versions = Raft index, concurrency, conflicts, size limit), restart and crash
//! recovery, snapshots with log compaction. No sleeps: every wait is a future under a deadline.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use shoal_api::{Annotations, Service, ServiceSpec, StoreSnapshot};
use shoal_store::{Action, Changes, MemoryStore, StoreError, StoreObject};

use crate::storage::EngineStorage;
use crate::*;

const DEADLINE: Duration = Duration::from_secs(20);

async fn within<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, f).await.expect("timed out")
}

fn service(id: &str) -> Service {
    Service {
        id: id.into(),
        spec: Some(ServiceSpec {
            annotations: Some(Annotations { name: format!("name-{id}"), ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn create(id: &str) -> Vec<Action> {
    let mut c = Changes::new();
    c.create(service(id));
    c.into_actions()
}

async fn start(dir: &std::path::Path, tweak: impl FnOnce(&mut RaftConfig)) -> (RaftNode, Arc<MemoryStore>) {
    let mut cfg = RaftConfig::new(dir.to_path_buf(), 1);
    tweak(&mut cfg);
    let store = Arc::new(MemoryStore::default());
    let node = within(RaftNode::start(cfg, store.clone())).await.expect("start");
    let mut leader = node.leadership();
    within(leader.wait_for(|s| s.is_leader)).await.expect("leadership channel open");
    (node, store)
}

/// The store's content in a comparable order.
fn sorted(mut s: StoreSnapshot) -> StoreSnapshot {
    s.nodes.sort_by(|a, b| a.id.cmp(&b.id));
    s.services.sort_by(|a, b| a.id.cmp(&b.id));
    s.tasks.sort_by(|a, b| a.id.cmp(&b.id));
    s.clusters.sort_by(|a, b| a.id.cmp(&b.id));
    s
}

fn version_of(store: &MemoryStore, id: &str) -> Option<u64> {
    store.view(|t| t.services().get(id).map(|s| s.version()))
}

#[tokio::test]
async fn single_member_leads_and_applies_with_raft_index_versions() {
    let dir = tempfile::tempdir().unwrap();
    assert!(!RaftNode::has_existing_state(dir.path()));
    let (node, store) = start(dir.path(), |_| {}).await;
    assert!(RaftNode::has_existing_state(dir.path()));
    let st = node.status();
    assert!(st.is_leader && st.leader_id == 1 && st.term >= 1, "{st:?}");

    let commit = within(node.propose(create("s1"))).await.unwrap();
    assert_eq!(commit.changes.len(), 1);
    assert_eq!(version_of(&store, "s1"), Some(commit.index));
    assert_eq!(store.last_index(), commit.index);
    let st = node.status();
    assert_eq!((st.applied, st.commit), (commit.index, commit.index));

    let next = within(node.propose(create("s2"))).await.unwrap();
    assert_eq!(next.index, commit.index + 1);
    node.shutdown().await;
}

#[tokio::test]
async fn concurrent_proposals_all_resolve_with_distinct_indexes() {
    let dir = tempfile::tempdir().unwrap();
    let (node, store) = start(dir.path(), |_| {}).await;
    let syncs_before = node.synced_writes();
    let mut handles = Vec::new();
    for i in 0..200 {
        let node = node.clone();
        handles.push(tokio::spawn(async move { node.propose(create(&format!("s{i}"))).await }));
    }
    let mut indexes = Vec::new();
    for h in handles {
        indexes.push(within(h).await.unwrap().unwrap().index);
    }
    indexes.sort_unstable();
    indexes.dedup();
    assert_eq!(indexes.len(), 200);
    // Group commit: one proposal per Ready would take two synced writes each.
    let syncs = node.synced_writes() - syncs_before;
    assert!(syncs < 200, "{syncs} synced writes for 200 proposals");
    assert_eq!(store.view(|t| t.services().len()), 200);
    for i in 0..200 {
        assert!(version_of(&store, &format!("s{i}")).is_some());
    }
    node.shutdown().await;
}

#[tokio::test]
async fn one_write_costs_one_fsync_and_the_lazily_written_commit_index_is_recovered() {
    let dir = tempfile::tempdir().unwrap();
    let (node, store) = start(dir.path(), |_| {}).await;
    within(node.propose(create("warm-up"))).await.unwrap();
    for i in 0..5 {
        let before = node.synced_writes();
        within(node.propose(create(&format!("s{i}")))).await.unwrap();
        // The entry is synced; the commit index that follows it is not (it is volatile state in Raft).
        assert_eq!(node.synced_writes() - before, 1, "write {i}");
    }
    let before = sorted(store.snapshot().1);
    node.shutdown().await;
    // A power loss could lose the unsynced commit index: put it back to where the first write left it.
    {
        let keys = crate::encryption::load_or_create_plain(dir.path()).unwrap();
        let (mut storage, _) = EngineStorage::open(dir.path(), keys).unwrap();
        let mut hs = storage.hard_state().clone();
        let last = raft::Storage::last_index(&storage).unwrap();
        assert_eq!(hs.commit, last);
        hs.commit = last - 5;
        storage.append(&[], Some(&hs)).unwrap();
        storage.sync().unwrap();
    }
    // Every acknowledged write is in the synced log: the restarted node commits it again, and applies it
    // before the next write (entries apply in log order).
    let (node, store) = start(dir.path(), |_| {}).await;
    within(node.propose(create("after"))).await.unwrap();
    let mut now = store.snapshot().1;
    now.services.retain(|s| s.id != "after");
    assert_eq!(sorted(now), before);
    node.shutdown().await;
}

#[tokio::test]
async fn version_conflict_is_reported_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (node, store) = start(dir.path(), |_| {}).await;
    within(node.propose(create("s1"))).await.unwrap();
    let read = (*store.view(|t| t.services().get("s1").cloned()).unwrap()).clone();

    let mut first = read.clone();
    first.spec.as_mut().unwrap().annotations.as_mut().unwrap().labels.insert("a".into(), "1".into());
    let mut c = Changes::new();
    c.update(first);
    let applied = within(node.propose(c.into_actions())).await.unwrap();

    let mut stale = read;
    stale.spec.as_mut().unwrap().annotations.as_mut().unwrap().labels.insert("b".into(), "2".into());
    let mut c = Changes::new();
    c.update(stale);
    c.create(service("s2"));
    let err = within(node.propose(c.into_actions())).await.unwrap_err();
    assert!(matches!(err, ProposeError::Store(StoreError::VersionConflict { .. })), "{err:?}");

    let now = store.view(|t| t.services().get("s1").cloned()).unwrap();
    assert_eq!(now.version(), applied.index);
    assert!(!now.spec.as_ref().unwrap().annotations.as_ref().unwrap().labels.contains_key("b"));
    assert_eq!(version_of(&store, "s2"), None);
    node.shutdown().await;
}

#[tokio::test]
async fn too_large_proposal_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (node, store) = start(dir.path(), |c| c.max_proposal_bytes = 1024).await;
    let mut big = service("big");
    big.spec.as_mut().unwrap().annotations.as_mut().unwrap().labels.insert("x".into(), "y".repeat(2000));
    let mut c = Changes::new();
    c.create(big);
    let err = within(node.propose(c.into_actions())).await.unwrap_err();
    assert!(matches!(err, ProposeError::TooLarge { limit: 1024, size } if size > 2000), "{err:?}");
    assert_eq!(version_of(&store, "big"), None);
    within(node.propose(create("small"))).await.unwrap();
    node.shutdown().await;
}

#[tokio::test]
async fn proposals_after_shutdown_fail_with_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let (node, _store) = start(dir.path(), |_| {}).await;
    let other = node.clone();
    node.shutdown().await;
    assert_eq!(within(other.propose(create("s1"))).await.unwrap_err(), ProposeError::Stopped);
    assert!(!other.leadership().borrow().is_leader);
}

#[tokio::test]
async fn restart_recovers_the_store_and_continues_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let (node, store) = start(dir.path(), |_| {}).await;
    let mut last = 0;
    for i in 0..25 {
        last = within(node.propose(create(&format!("s{i}")))).await.unwrap().index;
    }
    let before = sorted(store.snapshot().1);
    node.shutdown().await;

    let (node, store) = start(dir.path(), |_| {}).await;
    assert_eq!(sorted(store.snapshot().1), before);
    for i in 0..25 {
        assert!(version_of(&store, &format!("s{i}")).is_some());
    }
    assert_eq!(version_of(&store, "s24"), Some(last));
    let next = within(node.propose(create("after"))).await.unwrap();
    assert!(next.index > last, "{} <= {last}", next.index);
    node.shutdown().await;
}

#[tokio::test]
async fn acknowledged_writes_survive_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let (node, store) = start(dir.path(), |_| {}).await;
    for i in 0..10 {
        within(node.propose(create(&format!("s{i}")))).await.unwrap();
    }
    let before = sorted(store.snapshot().1);
    // No shutdown: dropping the only handle ends the driver as it is, like a killed process would.
    let closed = node.closed();
    drop(node);
    within(closed).await;

    let (_node, store) = start(dir.path(), |_| {}).await;
    assert_eq!(sorted(store.snapshot().1), before);
}

#[tokio::test]
async fn snapshots_compact_the_log_and_restore_identically() {
    let dir = tempfile::tempdir().unwrap();
    let tweak = |c: &mut RaftConfig| {
        c.snapshot_interval_entries = 10;
        c.log_entries_for_slow_followers = 5;
        c.keep_old_snapshots = 1;
    };
    let (node, store) = start(dir.path(), tweak).await;
    for i in 0..35 {
        within(node.propose(create(&format!("s{i}")))).await.unwrap();
    }
    let st = node.status();
    // 35 writes + the election no-op: snapshots at 10, 20, 30.
    assert_eq!(st.applied, 36);
    assert_eq!(st.last_snapshot_index, 30);
    let before = sorted(store.snapshot().1);
    node.shutdown().await;

    let keys = crate::encryption::load_or_create_plain(dir.path()).unwrap();
    let snaps =
        crate::snapshot_files::SnapshotDir::open(dir.path().join("raft").join("snapshots"), keys.clone()).unwrap();
    assert_eq!(snaps.list().unwrap(), vec![20, 30]);
    {
        let (storage, bootstrapped) = EngineStorage::open(dir.path(), keys.clone()).unwrap();
        assert!(bootstrapped);
        assert_eq!(storage.first_log_index(), 26, "the log keeps 5 entries behind snapshot 30");
        assert_eq!(storage.snapshot_metadata().index, 30);
        assert_eq!(raft::Storage::last_index(&storage).unwrap(), 36);
        // The term of the entry before the first kept one still answers (log matching), older ones do not.
        assert!(raft::Storage::term(&storage, 25).unwrap() >= 1);
        assert_eq!(raft::Storage::term(&storage, 30).unwrap(), storage.snapshot_metadata().term);
        let compacted = raft::Error::Store(raft::StorageError::Compacted);
        assert_eq!(raft::Storage::term(&storage, 24).unwrap_err(), compacted);
        let ctx = raft::GetEntriesContext::empty(false);
        assert_eq!(raft::Storage::entries(&storage, 20, 30, None, ctx).unwrap_err(), compacted);
        let ctx = raft::GetEntriesContext::empty(false);
        let kept = raft::Storage::entries(&storage, 26, 37, None, ctx).unwrap();
        assert_eq!(kept.iter().map(|e| e.index).collect::<Vec<_>>(), (26..37).collect::<Vec<_>>());
        let snap = raft::Storage::snapshot(&storage, 30, 2).unwrap();
        assert_eq!(snap.get_metadata().index, 30);
        assert_eq!(snap.get_metadata().get_conf_state().voters, vec![1]);
    }

    let (node, store) = start(dir.path(), tweak).await;
    assert_eq!(sorted(store.snapshot().1), before);
    assert_eq!(node.status().last_snapshot_index, 30);
    let next = within(node.propose(create("after"))).await.unwrap();
    assert!(next.index > 36);
    node.shutdown().await;
}

#[test]
fn the_log_kept_behind_a_snapshot_is_bounded_by_entries_and_by_bytes() {
    // (index, bytes) of entries 1..=10, each 100 bytes but entry 8 (1000).
    let deque: std::collections::VecDeque<(u64, u64)> =
        (1..=10).map(|i| (i, if i == 8 { 1000 } else { 100 })).collect();
    let check = |keep_entries, keep_bytes, want| {
        assert_eq!(
            crate::core::compact_point(10, &deque, keep_entries, keep_bytes),
            want,
            "keep {keep_entries} entries, {keep_bytes} bytes"
        );
    };
    check(5, u64::MAX, 5); // by entries: 6..=10 kept
    check(5, 250, 8); // 9 and 10 fit in 250 bytes; 8 does not
    check(5, 0, 9); // the last entry is always kept
    check(0, u64::MAX, 10); // no entries kept
    check(100, u64::MAX, 0); // everything kept
    check(100, 1200, 7); // 8..=10 are 1200 bytes
                         // Entries the deque does not know (applied before a restart) are kept by count.
    assert_eq!(crate::core::compact_point(10, &Default::default(), 5, 0), 5);
    let recent: std::collections::VecDeque<(u64, u64)> = [(9, 100), (10, 100)].into();
    assert_eq!(crate::core::compact_point(10, &recent, 5, u64::MAX), 5);
    assert_eq!(crate::core::compact_point(10, &recent, 5, 150), 9);
}

#[tokio::test]
async fn large_writes_take_snapshots_by_bytes_and_the_log_keeps_few_bytes_behind_them() {
    let dir = tempfile::tempdir().unwrap();
    let tweak = |c: &mut RaftConfig| {
        c.snapshot_interval_bytes = 256 << 10;
        c.log_bytes_for_slow_followers = 100 << 10;
    };
    let (node, _store) = start(dir.path(), tweak).await;
    let big = "x".repeat(64 << 10);
    for i in 0..20 {
        let mut s = service(&format!("big{i}"));
        s.spec.as_mut().unwrap().annotations.as_mut().unwrap().labels.insert("payload".into(), big.clone());
        let mut c = Changes::new();
        c.create(s);
        within(node.propose(c.into_actions())).await.unwrap();
    }
    let st = node.status();
    // 20 writes of 64 KiB + the no-op, far fewer than 10 000 entries: snapshots every 4 writes by bytes.
    assert_eq!(st.applied, 21);
    assert!(st.last_snapshot_index >= 17, "snapshots by bytes: {st:?}");
    node.shutdown().await;
    let keys = crate::encryption::load_or_create_plain(dir.path()).unwrap();
    let (storage, _) = EngineStorage::open(dir.path(), keys).unwrap();
    let kept = storage.snapshot_metadata().index + 1 - storage.first_log_index();
    assert_eq!(kept, 1, "one 64 KiB entry fits in 100 KiB behind the snapshot, two do not");
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            // A log file purged between the listing and this look holds nothing any more.
            let m = match e.metadata() {
                Ok(m) => m,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => return 0,
                Err(err) => panic!("{}: {err}", e.path().display()),
            };
            if m.is_dir() {
                dir_bytes(&e.path())
            } else {
                m.len()
            }
        })
        .sum()
}

#[tokio::test]
async fn the_raft_directory_stays_bounded_in_bytes_under_large_writes_with_the_default_policy() {
    let dir = tempfile::tempdir().unwrap();
    let (node, store) = start(dir.path(), |_| {}).await;
    let big = "x".repeat(1 << 20);
    let mut most = 0;
    // 160 MiB of writes, far fewer than 10 000 entries: a 1 MiB service created and removed 160 times.
    for i in 0..160 {
        let mut s = service("big");
        s.spec.as_mut().unwrap().annotations.as_mut().unwrap().labels.insert(format!("payload{i}"), big.clone());
        let mut c = Changes::new();
        c.create(s);
        within(node.propose(c.into_actions())).await.unwrap();
        let current = store.view(|t| t.services().get("big").cloned()).unwrap();
        let mut c = Changes::new();
        c.remove(current);
        within(node.propose(c.into_actions())).await.unwrap();
        most = most.max(dir_bytes(&dir.path().join("raft")));
    }
    assert!(most < 80 << 20, "the raft directory reached {} MiB", most >> 20);
    node.shutdown().await;
}

#[tokio::test]
async fn a_second_process_on_the_same_state_dir_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (node, _store) = start(dir.path(), |_| {}).await;
    let err = RaftNode::start(RaftConfig::new(dir.path().to_path_buf(), 1), Arc::new(MemoryStore::default()))
        .await
        .unwrap_err();
    assert!(matches!(err, RaftError::Log { .. }), "{err}");
    node.shutdown().await;
}

#[tokio::test]
async fn invalid_config_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let err = RaftNode::start(RaftConfig::new(dir.path().to_path_buf(), 0), Arc::new(MemoryStore::default()))
        .await
        .unwrap_err();
    assert!(matches!(err, RaftError::InvalidConfig(_)), "{err}");
}

#[tokio::test]
async fn a_higher_term_leader_takes_over_and_the_lone_voter_wins_back() {
    use raft::eraftpb::{Message, MessageType};
    let dir = tempfile::tempdir().unwrap();
    let (node, store) = start(dir.path(), |c| c.tick_interval_ms = 10).await;
    let term = node.status().term;
    let in_flight: Vec<_> = (0..50).map(|i| tokio::spawn(node.propose(create(&format!("s{i}"))))).collect();

    // A heartbeat from a leader of a later term makes this member a follower of it.
    let mut hb = Message::default();
    hb.set_msg_type(MessageType::MsgHeartbeat);
    hb.from = 2;
    hb.to = 1;
    hb.term = term + 5;
    node.step(hb).unwrap();

    // Every proposal resolves: applied before the step, failed as unknown when leadership was lost, or
    // refused while another node led.
    for p in in_flight {
        match within(p).await.unwrap() {
            Ok(c) => assert_eq!(version_of(&store, c.changes[0].object.id()), Some(c.index)),
            Err(ProposeError::Unknown(_)) | Err(ProposeError::NotLeader { .. }) => {}
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    // Being the only voter, it campaigns after its election timeout and leads a later term.
    let mut leader = node.leadership();
    let state = *within(leader.wait_for(|s| s.is_leader && s.term > term + 5)).await.unwrap();
    assert_eq!(state.leader_id, 1);
    within(node.propose(create("after"))).await.unwrap();
    node.shutdown().await;
}

#[tokio::test]
async fn a_lone_member_records_its_current_address_on_restart() {
    let dir = tempfile::tempdir().unwrap();
    // State written without an address (as before addresses were recorded).
    let (node, _) = start(dir.path(), |_| {}).await;
    assert_eq!(node.members().addr(1), None);
    node.shutdown().await;
    let (node, _) = start(dir.path(), |c| c.addr = "127.0.0.9:4242".into()).await;
    assert_eq!(node.members().addr(1), Some("127.0.0.9:4242"));
    node.shutdown().await;
    let (node, _) = start(dir.path(), |_| {}).await;
    assert_eq!(node.members().addr(1), Some("127.0.0.9:4242"), "persisted");
    node.shutdown().await;
}

/// Every file under `dir` (recursively) that contains `needle`.
fn files_containing(dir: &std::path::Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut hits = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            hits.extend(files_containing(&p, needle));
        } else if std::fs::read(&p).unwrap().windows(needle.len()).any(|w| w == needle) {
            hits.push(p);
        }
    }
    hits
}

#[tokio::test]
async fn log_and_snapshots_are_encrypted_at_rest_and_recover_with_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let tweak = |c: &mut RaftConfig| {
        c.snapshot_interval_entries = 4;
        c.log_entries_for_slow_followers = 2;
    };
    let (node, store) = start(dir.path(), tweak).await;
    for i in 0..10 {
        within(node.propose(create(&format!("secret-marker-{i}")))).await.unwrap();
    }
    assert!(node.status().last_snapshot_index >= 8);
    let before = sorted(store.snapshot().1);
    node.shutdown().await;
    assert!(files_containing(dir.path(), b"secret-marker").is_empty(), "plain text found on disk");
    assert!(std::fs::read_dir(dir.path().join("raft").join("snapshots")).unwrap().count() > 0);

    // The same key (the DEK file) recovers everything.
    let (node, store) = start(dir.path(), tweak).await;
    assert_eq!(sorted(store.snapshot().1), before);
    node.shutdown().await;

    // Another key refuses to start rather than reading garbage.
    let mut cfg = RaftConfig::new(dir.path().to_path_buf(), 1);
    tweak(&mut cfg);
    cfg.data_keys = Some(crate::encryption::DataKeys::generate());
    let err = within(RaftNode::start(cfg, Arc::new(MemoryStore::default()))).await.unwrap_err();
    assert!(err.to_string().contains("cannot decrypt"), "{err}");
}

#[tokio::test]
async fn reencrypt_rotates_the_dek_of_every_record_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let tweak = |c: &mut RaftConfig| {
        c.snapshot_interval_entries = 6;
        c.log_entries_for_slow_followers = 3;
    };
    let old = crate::encryption::load_or_create_plain(dir.path()).unwrap();
    let (node, store) = start(dir.path(), tweak).await;
    for i in 0..10 {
        within(node.propose(create(&format!("before-{i}")))).await.unwrap();
    }
    let rotated = old.rotated();
    assert_eq!((rotated.len(), old.len()), (2, 1));
    within(node.reencrypt(rotated.clone())).await.unwrap();
    for i in 0..3 {
        within(node.propose(create(&format!("after-{i}")))).await.unwrap();
    }
    let before = sorted(store.snapshot().1);
    node.shutdown().await;
    assert!(!dir.path().join("raft").join("log.rekey").exists());
    assert!(!dir.path().join("raft").join("log.old").exists());

    let with_keys = |keys: crate::encryption::DataKeys| {
        let mut cfg = RaftConfig::new(dir.path().to_path_buf(), 1);
        tweak(&mut cfg);
        cfg.data_keys = Some(keys);
        cfg
    };
    // The new DEK alone reads everything: nothing sealed with the old one is left.
    let store = Arc::new(MemoryStore::default());
    let node = within(RaftNode::start(with_keys(rotated.current_only()), store.clone())).await.unwrap();
    assert_eq!(sorted(store.snapshot().1), before);
    node.shutdown().await;
    // And the old DEK alone reads nothing.
    let err = within(RaftNode::start(with_keys(old), Arc::new(MemoryStore::default()))).await.unwrap_err();
    assert!(err.to_string().contains("not available") || err.to_string().contains("cannot decrypt"), "{err}");
}

#[tokio::test]
async fn an_interrupted_reencrypt_is_undone_without_its_marker() {
    let dir = tempfile::tempdir().unwrap();
    let (node, store) = start(dir.path(), |_| {}).await;
    within(node.propose(create("kept"))).await.unwrap();
    let before = sorted(store.snapshot().1);
    node.shutdown().await;
    // A crash while the new log was being written: a partial directory and no completion marker.
    let partial = dir.path().join("raft").join("log.rekey");
    std::fs::create_dir_all(&partial).unwrap();
    std::fs::write(partial.join("0000000000000001.raftlog"), b"garbage").unwrap();
    let (node, store) = start(dir.path(), |_| {}).await;
    assert_eq!(sorted(store.snapshot().1), before);
    assert!(!partial.exists());
    node.shutdown().await;
}

#[tokio::test]
async fn committed_writes_read_back_from_the_log_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let tweak = |c: &mut RaftConfig| {
        c.snapshot_interval_entries = 10;
        c.log_entries_for_slow_followers = 5;
    };
    let (node, store) = start(dir.path(), tweak).await;
    // The election no-op is index 1; these are 2..=15, and a create that fails (the ID is taken) is 16.
    for i in 0..14 {
        within(node.propose(create(&format!("s{i}")))).await.unwrap();
    }
    assert!(matches!(within(node.propose(create("s0"))).await, Err(ProposeError::Store(_))));
    assert_eq!(node.status().last_snapshot_index, 10);
    let check = |node: RaftNode, store: Arc<MemoryStore>| async move {
        let writes = within(node.read_committed(6, 1000, 100)).await.unwrap();
        assert_eq!(
            writes.iter().map(|w| w.index).collect::<Vec<_>>(),
            (6..=16).collect::<Vec<_>>(),
            "up to the last applied"
        );
        assert_eq!(writes[0].actions, create("s4"), "the actions as proposed");
        assert!(store.apply_failed(16) && !store.apply_failed(15), "the store knows which write failed");
        let three = within(node.read_committed(6, 17, 3)).await.unwrap();
        assert_eq!(three.iter().map(|w| w.index).collect::<Vec<_>>(), vec![6, 7, 8]);
        let old = within(node.read_committed(2, 17, 100)).await.unwrap_err();
        assert_eq!(old, LogReadError::Compacted { asked: 2, first: 6 });
        node
    };
    let node = check(node, store).await;
    node.shutdown().await;

    let (node, store) = start(dir.path(), tweak).await;
    assert_eq!(store.apply_outcomes_known_from(), 11, "restored from snapshot 10, replayed after it");
    let node = check(node, store).await;
    node.shutdown().await;
}

fn snapshot_indexes(dir: &std::path::Path) -> Vec<u64> {
    let mut v: Vec<u64> = std::fs::read_dir(dir.join("raft").join("snapshots"))
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("snapshot-")?.strip_suffix(".bin")?.parse().ok())
        .collect();
    v.sort_unstable();
    v
}

/// The cluster's snapshot settings take effect on a running member: a snapshot after `interval_entries`
/// writes, `keep_old_snapshots` files kept beyond the newest one, and `log_entries_for_slow_followers` entries
/// left in the log behind it (what a Watch resumed from an older version finds compacted).
#[tokio::test]
async fn the_snapshot_policy_applies_live() {
    use crate::CommittedLog;
    let dir = tempfile::tempdir().unwrap();
    let (node, _store) = start(dir.path(), |_| {}).await;
    for i in 0..30 {
        within(node.propose(create(&format!("a{i}")))).await.unwrap();
    }
    assert!(snapshot_indexes(dir.path()).is_empty(), "no snapshot before 10,000 entries");
    let policy = SnapshotPolicy { interval_entries: 20, keep_old_snapshots: 2, log_entries_for_slow_followers: 5 };
    within(node.set_snapshot_policy(policy)).await.unwrap();
    let mut last = 0;
    for i in 0..100 {
        last = within(node.propose(create(&format!("b{i}")))).await.unwrap().index;
    }
    let snaps = snapshot_indexes(dir.path());
    assert_eq!(snaps.len(), 3, "the newest and 2 old ones: {snaps:?}");
    let newest = *snaps.last().unwrap();
    assert!(newest + 20 > last && newest == node.status().last_snapshot_index, "{snaps:?}, last {last}");
    assert!(snaps.windows(2).all(|w| w[1] - w[0] == 20), "one every 20 entries: {snaps:?}");
    match within(node.read_committed(1, last + 1, 10)).await {
        Err(LogReadError::Compacted { first, .. }) => assert_eq!(first, newest - 5 + 1, "5 entries kept"),
        other => panic!("{other:?}"),
    }
    // Interval 0 (SwarmKit: none by count) and no old snapshot kept.
    let policy = SnapshotPolicy { interval_entries: 0, keep_old_snapshots: 0, log_entries_for_slow_followers: 5 };
    within(node.set_snapshot_policy(policy)).await.unwrap();
    for i in 0..50 {
        within(node.propose(create(&format!("c{i}")))).await.unwrap();
    }
    assert_eq!(snapshot_indexes(dir.path()), snaps, "no snapshot by count with interval 0");
    node.shutdown().await;
}
