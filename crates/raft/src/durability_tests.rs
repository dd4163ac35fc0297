//! Tests of what a start does with a damaged state dir: real raft-engine logs and snapshot files written by
//! a `RaftNode`, then cut, emptied, removed or flipped the way a bad disk or a careless operator would.
//! Damage that reaches an acknowledged entry must stop the start with `RaftError::Damaged` (one line naming
//! the file and the entries) and leave every byte as it was; only a torn tail holding nothing acknowledged
//! is cut, and the node then starts with every acknowledged write. No sleeps: waits are under a deadline.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use raft::eraftpb::Entry;
use shoal_api::{Annotations, Service, ServiceSpec, StoreSnapshot};
use shoal_store::{Changes, MemoryStore};

use crate::storage::EngineStorage;
use crate::*;

const DEADLINE: Duration = Duration::from_secs(20);
/// raft-engine's file header (magic, version, alignment) before the first record.
const FILE_HEADER_BYTES: usize = 69;

async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, f).await.expect("timed out")
}

fn config(dir: &Path, snapshot_every: Option<u64>) -> RaftConfig {
    let mut cfg = RaftConfig::new(dir.to_path_buf(), 1);
    if let Some(n) = snapshot_every {
        cfg.snapshot_interval_entries = n;
        cfg.log_entries_for_slow_followers = 5;
    }
    cfg
}

fn create(id: &str) -> Vec<shoal_store::Action> {
    let mut c = Changes::new();
    c.create(Service {
        id: id.into(),
        spec: Some(ServiceSpec {
            annotations: Some(Annotations { name: format!("name-{id}"), ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    });
    c.into_actions()
}

fn service_ids(s: StoreSnapshot) -> Vec<String> {
    let mut ids: Vec<String> = s.services.into_iter().map(|s| s.id).collect();
    ids.sort();
    ids
}

async fn start(dir: &Path, snapshot_every: Option<u64>) -> Result<(RaftNode, Arc<MemoryStore>), RaftError> {
    let store = Arc::new(MemoryStore::default());
    let node = within(RaftNode::start(config(dir, snapshot_every), store.clone())).await?;
    let mut leader = node.leadership();
    within(leader.wait_for(|s| s.is_leader)).await.expect("leadership channel open");
    Ok((node, store))
}

/// A state dir with `n` acknowledged writes, stopped cleanly; returns the service IDs it holds.
async fn written(dir: &Path, n: usize, snapshot_every: Option<u64>) -> Vec<String> {
    let (node, store) = start(dir, snapshot_every).await.expect("start");
    for i in 0..n {
        within(node.propose(create(&format!("s{i:04}")))).await.expect("acknowledged");
    }
    let ids = service_ids(store.snapshot().1);
    node.shutdown().await;
    ids
}

fn log_file(dir: &Path) -> PathBuf {
    let log = crate::storage::log_dir(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&log)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "raftlog"))
        .collect();
    files.sort();
    files.pop().expect("a raftlog file")
}

/// Every file under `state_dir/raft` (but raft-engine's lock file) with its bytes.
fn raft_files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(p: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
            let path = e.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.file_name().is_some_and(|n| n != "LOCK") {
                out.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(&dir.join("raft"), &mut out);
    out
}

/// The start is refused with `Damaged` whose one-line message holds every `needles`, and nothing under
/// `raft/` changed.
async fn check_refused(dir: &Path, snapshot_every: Option<u64>, needles: &[&str]) -> String {
    let before = raft_files(dir);
    let err = match start(dir, snapshot_every).await {
        Ok((node, _)) => {
            node.shutdown().await;
            panic!("the damaged state dir started");
        }
        Err(e) => e,
    };
    let msg = err.to_string();
    assert!(matches!(err, RaftError::Damaged { .. }), "{msg}");
    assert!(!msg.contains('\n'), "one line: {msg}");
    let advice = ["nothing on disk was changed", "rejoin from the other managers", "--force-new-cluster"];
    for n in needles.iter().chain(&advice) {
        assert!(msg.contains(n), "{n:?} missing from: {msg}");
    }
    assert!(before == raft_files(dir), "a refused start changed files under raft/");
    msg
}

fn cut(path: &Path, len: u64) {
    std::fs::OpenOptions::new().write(true).open(path).unwrap().set_len(len).unwrap();
}

fn flip(path: &Path, at: usize) {
    let mut b = std::fs::read(path).unwrap();
    b[at] ^= 0x5a;
    std::fs::write(path, b).unwrap();
}

fn append_bytes(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    std::fs::OpenOptions::new().append(true).open(path).unwrap().write_all(bytes).unwrap();
}

#[tokio::test]
async fn a_log_cut_in_half_is_refused_naming_the_lost_entries() {
    let dir = tempfile::tempdir().unwrap();
    written(dir.path(), 60, None).await;
    let f = log_file(dir.path());
    let len = std::fs::metadata(&f).unwrap().len();
    cut(&f, len / 2);
    let log_dir = crate::storage::log_dir(dir.path()).display().to_string();
    let msg = check_refused(dir.path(), None, &["were acknowledged", &log_dir]).await;
    // Inside a record raft-engine refuses and the file is named; on a record boundary (batches are regular
    // in size) the commit record shows the loss.
    let inside = msg.contains("would be lost") && msg.contains(&format!("{} is readable only up to byte", f.display()));
    assert!(inside || msg.contains("are missing"), "{msg}");
}

#[tokio::test]
async fn a_log_cut_at_a_record_boundary_is_refused_by_the_commit_record() {
    // A cut raft-engine cannot see (the file ends cleanly after an earlier record) still loses entries.
    let dir = tempfile::tempdir().unwrap();
    written(dir.path(), 20, None).await;
    let f = log_file(dir.path());
    let whole = std::fs::read(&f).unwrap();
    // Find a shorter length that raft-engine opens without complaint: the end of an earlier record.
    let mut boundary = None;
    for len in (FILE_HEADER_BYTES..whole.len() - 1).rev() {
        let probe = tempfile::tempdir().unwrap();
        std::fs::write(probe.path().join(f.file_name().unwrap()), &whole[..len]).unwrap();
        let cfg = raft_engine::Config {
            dir: probe.path().to_string_lossy().into_owned(),
            recovery_mode: raft_engine::RecoveryMode::AbsoluteConsistency,
            ..Default::default()
        };
        if raft_engine::Engine::open(cfg).ok().and_then(|e| e.last_index(1)).is_some_and(|l| l < 15) {
            boundary = Some(len);
            break;
        }
    }
    cut(&f, boundary.expect("a record boundary") as u64);
    check_refused(dir.path(), None, &["holds entries through index", "are missing"]).await;
}

#[tokio::test]
async fn a_torn_tail_of_garbage_is_cut_logged_and_every_write_kept() {
    let dir = tempfile::tempdir().unwrap();
    let ids = written(dir.path(), 30, None).await;
    let f = log_file(dir.path());
    let len = std::fs::metadata(&f).unwrap().len();
    // A write that began and never finished: the first 20 bytes of a real record, replayed at the end.
    let head = std::fs::read(&f).unwrap()[FILE_HEADER_BYTES..FILE_HEADER_BYTES + 20].to_vec();
    append_bytes(&f, &head);
    let (node, store) = start(dir.path(), None).await.expect("a torn tail beyond what was acknowledged is repaired");
    assert_eq!(service_ids(store.snapshot().1), ids);
    assert!(!crate::storage::log_dir(dir.path()).with_file_name("log.check").exists(), "the scratch copy is removed");
    node.shutdown().await;
    assert!(std::fs::metadata(&f).unwrap().len() >= len, "only the torn bytes were cut");
}

#[tokio::test]
async fn torn_unacknowledged_entries_are_cut_but_torn_acknowledged_ones_refuse_the_start() {
    for acknowledged in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let ids = written(dir.path(), 10, None).await;
        // A last write of two entries, synced; acknowledged only when the commit index (and with it the
        // commit record) moved over them.
        {
            let keys = crate::encryption::load_or_create_plain(dir.path()).unwrap();
            let (mut storage, _) = EngineStorage::open(dir.path(), keys).unwrap();
            let last = raft::Storage::last_index(&storage).unwrap();
            let mut hs = storage.hard_state().clone();
            let entries: Vec<Entry> = (1..=2)
                .map(|i| Entry { index: last + i, term: hs.term, data: vec![7; 300].into(), ..Default::default() })
                .collect();
            if acknowledged {
                hs.commit = last + 2;
            }
            storage.append(&entries, Some(&hs)).unwrap();
            storage.sync().unwrap();
        }
        let f = log_file(dir.path());
        let len = std::fs::metadata(&f).unwrap().len();
        cut(&f, len - 7);
        if acknowledged {
            check_refused(dir.path(), None, &["would be lost", "were acknowledged"]).await;
        } else {
            let (node, store) = start(dir.path(), None).await.expect("torn unacknowledged entries are cut");
            assert_eq!(service_ids(store.snapshot().1), ids);
            node.shutdown().await;
        }
    }
}

#[tokio::test]
async fn an_empty_or_missing_log_with_a_commit_record_is_damage_not_a_new_cluster() {
    for remove in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        written(dir.path(), 5, None).await;
        let f = log_file(dir.path());
        if remove {
            std::fs::remove_dir_all(crate::storage::log_dir(dir.path())).unwrap();
            assert!(RaftNode::has_existing_state(dir.path()), "the commit record says this member had state");
            check_refused(dir.path(), None, &["is missing", "acknowledged entries through index"]).await;
        } else {
            cut(&f, 0);
            check_refused(dir.path(), None, &["are empty", "acknowledged entries through index"]).await;
            assert_eq!(std::fs::metadata(&f).unwrap().len(), 0, "the empty file is not rewritten");
        }
    }
}

#[tokio::test]
async fn a_flipped_byte_anywhere_in_the_log_stops_the_start_without_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    written(dir.path(), 40, None).await;
    let f = log_file(dir.path());
    let len = usize::try_from(std::fs::metadata(&f).unwrap().len()).unwrap();
    let pristine = raft_files(dir.path());
    // The file header, a record in the middle, and one near the end (all acknowledged records).
    for at in [10, len / 2, len * 3 / 4] {
        flip(&f, at);
        check_refused(dir.path(), None, &["raft"]).await;
        flip(&f, at);
        assert!(raft_files(dir.path()) == pristine);
    }
}

#[tokio::test]
async fn a_missing_or_damaged_snapshot_named_by_the_log_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    written(dir.path(), 25, Some(10)).await;
    let snaps = dir.path().join("raft").join("snapshots");
    let newest = std::fs::read_dir(&snaps).unwrap().flatten().map(|e| e.path()).max().expect("a snapshot");
    let name = newest.display().to_string();
    let saved = std::fs::read(&newest).unwrap();
    let len = saved.len();
    flip(&newest, len / 2);
    check_refused(dir.path(), Some(10), &["cannot be opened", &name]).await;
    std::fs::remove_file(&newest).unwrap();
    check_refused(dir.path(), Some(10), &["its file is missing", &name]).await;
    std::fs::write(&newest, &saved).unwrap();
    let (node, _) = start(dir.path(), Some(10)).await.expect("the restored snapshot starts");
    node.shutdown().await;
}

#[tokio::test]
async fn a_damaged_commit_record_is_damage_and_a_missing_one_is_rebuilt_from_an_intact_log() {
    let dir = tempfile::tempdir().unwrap();
    let ids = written(dir.path(), 5, None).await;
    let record = crate::commit_record::path(dir.path());
    let saved = std::fs::read(&record).unwrap();
    flip(&record, 20);
    flip(&record, 64 + 20);
    check_refused(dir.path(), None, &["commit record", "no valid slot"]).await;
    // A state dir from before the record: an intact log starts and the record is written from it.
    std::fs::remove_file(&record).unwrap();
    let (node, store) = start(dir.path(), None).await.expect("an intact log without a record starts");
    assert_eq!(service_ids(store.snapshot().1), ids);
    node.shutdown().await;
    assert!(record.exists());
    assert_eq!(saved.len(), std::fs::read(&record).unwrap().len());
}

#[tokio::test]
async fn without_a_commit_record_a_damaged_log_is_refused_as_unknowable() {
    let dir = tempfile::tempdir().unwrap();
    written(dir.path(), 5, None).await;
    std::fs::remove_file(crate::commit_record::path(dir.path())).unwrap();
    let f = log_file(dir.path());
    append_bytes(&f, &[0xab; 20]);
    check_refused(dir.path(), None, &["no commit record", "cannot be told"]).await;
}
