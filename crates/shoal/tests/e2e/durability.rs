//! Durability that never hides loss, end to end: a real daemon, services created and acknowledged through
//! the Engine API, the daemon stopped or killed, its state dir damaged the way a bad disk or a careless
//! operator would (log cut in half, torn tail, emptied, removed, a flipped byte, a snapshot removed or
//! damaged). Damage that reaches an acknowledged write makes the next start exit at once, non-zero, with
//! one `shoal: ...` line on stderr naming the damage and the way to recover, and changes no file; a torn
//! tail holding nothing acknowledged is cut, logged, and every acknowledged service is served.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use shoal_testkit::daemon::DaemonOptions;

/// Services created (each one acknowledged raft write) before the damage.
const SERVICES: usize = 150;
/// A refused start must exit within this (it used to wait 60 s for a leader before failing).
const EXIT_WITHIN: Duration = Duration::from_secs(15);
/// raft-engine's file header before the first record.
const FILE_HEADER_BYTES: usize = 69;

fn daemon_with(extra: &[&str]) -> DaemonProcess {
    let opts = DaemonOptions { extra_args: extra.iter().map(|s| s.to_string()).collect(), ..DaemonOptions::default() };
    DaemonProcess::start_with(&shoal_bin(), opts)
}

/// Creates `n` services (no replicas), each acknowledged with 201; returns their names, sorted.
fn create_services(d: &DaemonProcess, n: usize) -> Vec<String> {
    let mut names: Vec<String> = (0..n)
        .map(|i| {
            let name = format!("svc-{i:04}");
            shoal_testkit::managers::create_service(d, &name, 0, &["sleep", "1"]).expect("service acknowledged");
            name
        })
        .collect();
    names.sort();
    names
}

fn sorted_service_names(d: &DaemonProcess) -> Vec<String> {
    let mut names = service_names(d);
    names.sort();
    names
}

fn log_file(d: &DaemonProcess) -> PathBuf {
    let dir = d.state_dir().join("raft").join("log");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("raft log dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "raftlog"))
        .collect();
    files.sort();
    files.pop().expect("a raftlog file")
}

/// Every file under `state_dir/raft` but raft-engine's lock, with its bytes.
fn raft_files(state_dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
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
    walk(&state_dir.join("raft"), &mut out);
    out
}

/// The stopped daemon's next start must be refused: non-zero exit within `EXIT_WITHIN`, exactly one
/// `shoal: ` line on stderr holding every needle and the recovery advice, and no file under `raft/` changed.
fn check_refused(d: &mut DaemonProcess, needles: &[&str]) -> String {
    let before = raft_files(d.state_dir());
    let started = std::time::Instant::now();
    let (status, stderr) = d.start_expecting_exit(&[], EXIT_WITHIN);
    assert!(!status.success(), "the damaged state dir must not start; stderr:\n{stderr}");
    assert!(started.elapsed() < EXIT_WITHIN);
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("shoal: ")).collect();
    assert_eq!(lines.len(), 1, "one error line on stderr:\n{stderr}");
    let line = lines[0];
    let advice = ["damaged", "nothing on disk was changed", "--join-addr", "--join-token", "--force-new-cluster"];
    for n in needles.iter().chain(&advice) {
        assert!(line.contains(n), "{n:?} missing from the error line: {line}");
    }
    assert!(before == raft_files(d.state_dir()), "a refused start changed files under raft/");
    line.to_string()
}

#[test]
fn a_log_cut_in_half_refuses_to_start_and_starts_whole_once_restored() {
    let mut d = daemon();
    let names = create_services(&d, SERVICES);
    assert!(d.stop(), "clean stop; log:\n{}", d.log());
    let f = log_file(&d);
    let whole = std::fs::read(&f).unwrap();
    std::fs::write(&f, &whole[..whole.len() / 2]).unwrap();
    // The cut lands inside a record (raft-engine refuses; the message names the file and the lost entries)
    // or, as batches are regular, sometimes on a record boundary (the commit record shows the loss).
    let line = check_refused(&mut d, &[&f.parent().unwrap().display().to_string(), "were acknowledged"]);
    assert!(line.contains("would be lost") || line.contains("are missing"), "{line}");
    // Nothing was rewritten: the operator puts the file back and every service is there.
    std::fs::write(&f, &whole).unwrap();
    d.restart(&[]);
    assert_eq!(sorted_service_names(&d).into_iter().filter(|n| n.starts_with("svc-")).collect::<Vec<_>>(), names);
}

#[test]
fn after_kill9_and_a_torn_tail_every_service_is_served_and_the_cut_is_logged() {
    let mut d = daemon();
    let names = create_services(&d, SERVICES);
    let served = |d: &DaemonProcess| -> Vec<String> {
        sorted_service_names(d).into_iter().filter(|n| n.starts_with("svc-")).collect()
    };
    // A crash leaves the log's preallocated space as zeros after the last record: cut, said so, no loss.
    d.kill9();
    d.restart(&[]);
    assert_eq!(served(&d), names, "every acknowledged service after kill -9");
    let log = d.log();
    assert!(!log.contains("repaired a torn write"), "kill -9 tears no write; log:\n{log}");
    assert!(log.contains("cut the unused, preallocated tail of the raft log"), "log:\n{log}");
    // A write torn by a power loss: the first bytes of a record after the last one, never acknowledged.
    assert!(d.stop());
    let f = log_file(&d);
    let len = std::fs::metadata(&f).unwrap().len();
    let head = std::fs::read(&f).unwrap()[FILE_HEADER_BYTES..FILE_HEADER_BYTES + 24].to_vec();
    {
        use std::io::Write;
        std::fs::OpenOptions::new().append(true).open(&f).unwrap().write_all(&head).unwrap();
    }
    d.restart(&[]);
    assert_eq!(served(&d), names, "every acknowledged service after the torn write");
    let log = d.log();
    let repair = log.lines().find(|l| l.contains("repaired a torn write at the tail of the raft log"));
    let repair = repair.unwrap_or_else(|| panic!("the repair is logged; log:\n{log}"));
    let expected = format!("{} is readable only up to byte {len} of {}", f.display(), len + 24);
    assert!(repair.contains(&expected), "{expected:?} not in {repair}");
    assert!(repair.contains("every acknowledged entry (through index"), "{repair}");
    assert!(!d.state_dir().join("raft").join("log.check").exists(), "the scratch copy is gone");
}

#[test]
fn an_empty_log_refuses_at_once_and_is_not_rewritten() {
    let mut d = daemon();
    create_services(&d, 20);
    assert!(d.stop());
    let f = log_file(&d);
    std::fs::write(&f, b"").unwrap();
    check_refused(&mut d, &["are empty", "acknowledged entries through index"]);
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 0);
}

#[test]
fn a_missing_log_is_damage_not_a_new_cluster() {
    let mut d = daemon();
    create_services(&d, 20);
    d.kill9();
    std::fs::remove_dir_all(d.state_dir().join("raft").join("log")).unwrap();
    check_refused(&mut d, &["is missing", "acknowledged entries through index"]);
}

#[test]
fn a_flipped_byte_in_the_log_refuses_to_start() {
    let mut d = daemon();
    create_services(&d, SERVICES);
    assert!(d.stop());
    let f = log_file(&d);
    let mut bytes = std::fs::read(&f).unwrap();
    let at = bytes.len() / 3;
    bytes[at] ^= 0x20;
    std::fs::write(&f, &bytes).unwrap();
    // A record's checksum (the file is cut there on a copy: entries would be lost) or an entry's checksum
    // (the entry is named) catches it, depending on where the byte is; the message names the log either way.
    let log_dir = d.state_dir().join("raft").join("log").display().to_string();
    let line = check_refused(&mut d, &[&log_dir]);
    assert!(line.contains("would be lost") || line.contains("of the raft log (an acknowledged entry)"), "{line}");
}

#[test]
fn a_missing_or_damaged_snapshot_refuses_to_start() {
    let mut d = daemon_with(&["--raft-snapshot-interval-entries", "40"]);
    let names = create_services(&d, 100);
    assert!(d.stop());
    let dir = d.state_dir().join("raft").join("snapshots");
    let newest = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).max().expect("a snapshot file");
    let saved = std::fs::read(&newest).unwrap();
    let mut damaged = saved.clone();
    let at = damaged.len() / 2;
    damaged[at] ^= 0x01;
    std::fs::write(&newest, &damaged).unwrap();
    check_refused(&mut d, &[&newest.display().to_string(), "cannot be opened"]);
    std::fs::remove_file(&newest).unwrap();
    check_refused(&mut d, &[&newest.display().to_string(), "its file is missing"]);
    std::fs::write(&newest, &saved).unwrap();
    d.restart(&["--raft-snapshot-interval-entries".to_string(), "40".to_string()]);
    let served: Vec<String> = sorted_service_names(&d).into_iter().filter(|n| n.starts_with("svc-")).collect();
    assert_eq!(served, names);
}

#[test]
fn a_cut_through_the_last_commit_index_record_is_repaired_with_every_service() {
    // After a clean stop the log ends with the commit index written after the last entries (unsynced, never
    // what acknowledges a write): cutting into it is a torn tail that loses nothing acknowledged.
    let mut d = daemon();
    let names = create_services(&d, SERVICES);
    assert!(d.stop());
    let f = log_file(&d);
    let len = std::fs::metadata(&f).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&f).unwrap().set_len(len - 10).unwrap();
    d.restart(&[]);
    let served: Vec<String> = sorted_service_names(&d).into_iter().filter(|n| n.starts_with("svc-")).collect();
    assert_eq!(served, names, "every acknowledged service");
    let log = d.log();
    assert!(log.contains("repaired a torn write at the tail of the raft log"), "log:\n{log}");
}

#[test]
fn a_manager_whose_raft_dir_is_gone_refuses_to_create_a_new_cluster() {
    let mut d = daemon();
    create_services(&d, 5);
    assert!(d.stop());
    std::fs::remove_dir_all(d.state_dir().join("raft")).unwrap();
    let (status, stderr) = d.start_expecting_exit(&[], EXIT_WITHIN);
    assert!(!status.success());
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("shoal: ")).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains("certificate but no raft state") && lines[0].contains("--join-addr"), "{}", lines[0]);
    assert!(!d.state_dir().join("raft").join("log").exists(), "nothing was bootstrapped");
}

#[test]
fn a_follower_with_a_cut_log_refuses_then_rejoins_as_its_message_says() {
    let m1 = manager_at(71, None);
    let m2 = manager_at(72, Some(&m1));
    let mut m3 = manager_at(73, Some(&m1));
    let names = create_services(&m1, 60);
    let served = |d: &DaemonProcess| -> Result<Vec<String>, String> {
        let services = shoal_testkit::managers::try_get(d, "/v1.47/services")?;
        let mut got: Vec<String> = services
            .as_array()
            .ok_or("no list")?
            .iter()
            .filter_map(|s| s["Spec"]["Name"].as_str().map(str::to_string))
            .filter(|n| n.starts_with("svc-"))
            .collect();
        got.sort();
        if got == names {
            Ok(got)
        } else {
            Err(format!("{} of {} services", got.len(), names.len()))
        }
    };
    wait_until("manager-73 serves every service", Duration::from_secs(30), || served(&m3));
    assert!(m3.stop());
    let f = log_file(&m3);
    let whole = std::fs::read(&f).unwrap();
    std::fs::write(&f, &whole[..whole.len() / 2]).unwrap();
    check_refused(&mut m3, &["were acknowledged"]);

    // As the message says: move the state dir away, start with --join-addr and a manager join token.
    wait_until("the others see manager-73 unreachable", Duration::from_secs(30), || {
        let seen = shoal_testkit::managers::managers_seen_by(&m1)?;
        if seen.iter().any(|(h, s)| h == "manager-73" && s == "unreachable") {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    });
    let moved = m3.state_dir().with_extension("damaged");
    std::fs::rename(m3.state_dir(), &moved).unwrap();
    let token = shoal_testkit::managers::join_token(&m1, "Manager");
    m3.restart(&["--join-addr".to_string(), m2.remote_addr(), "--join-token".to_string(), token]);
    wait_until("the rejoined manager-73 serves every service", Duration::from_secs(30), || served(&m3));
    std::fs::remove_dir_all(&moved).unwrap();
}

/// The Raft snapshot indexes in `d`'s state dir (its `snapshot-<index>.bin` files), ascending.
fn snapshot_indexes(d: &DaemonProcess) -> Vec<u64> {
    let dir = d.state_dir().join("raft").join("snapshots");
    let mut v: Vec<u64> = std::fs::read_dir(dir)
        .map(|r| {
            r.flatten()
                .filter_map(|e| e.file_name().to_str()?.strip_prefix("snapshot-")?.strip_suffix(".bin")?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    v
}

/// `docker swarm update --snapshot-interval 50 --max-snapshots 2` takes effect at once (a snapshot every 50
/// entries, the newest and two older files kept) and again after a restart (issue 32: it was stored only).
#[test]
fn swarm_update_snapshot_settings_apply_live_and_after_a_restart() {
    if no_docker_cli() {
        return;
    }
    let mut d = daemon();
    create_services(&d, 20);
    assert!(snapshot_indexes(&d).is_empty(), "no snapshot before 10,000 entries");
    docker(&d, &["swarm", "update", "--snapshot-interval", "50", "--max-snapshots", "2"]);
    let raft = d.get("/v1.47/swarm")["Spec"]["Raft"].clone();
    assert_eq!((raft["SnapshotInterval"].as_u64(), raft["KeepOldSnapshots"].as_u64()), (Some(50), Some(2)));
    let mut names: Vec<String> = (0..200)
        .map(|i| {
            let name = format!("live-{i:04}");
            shoal_testkit::managers::create_service(&d, &name, 0, &["sleep", "1"]).expect("service acknowledged");
            name
        })
        .collect();
    let snaps = snapshot_indexes(&d);
    assert_eq!(snaps.len(), 3, "the newest and 2 old ones: {snaps:?}");
    assert!(snaps.windows(2).all(|w| w[1] - w[0] == 50), "one every 50 entries: {snaps:?}");
    let newest = *snaps.last().unwrap();
    assert!(d.stop());
    d.restart(&[]);
    for i in 0..60 {
        let name = format!("after-{i:04}");
        shoal_testkit::managers::create_service(&d, &name, 0, &["sleep", "1"]).expect("service acknowledged");
        names.push(name);
    }
    let after = snapshot_indexes(&d);
    assert_eq!(after.len(), 3, "{after:?}");
    assert!(*after.last().unwrap() > newest, "a snapshot after the restart: {after:?}, before {newest}");
    let served = sorted_service_names(&d);
    assert!(names.iter().all(|n| served.contains(n)), "every service is served");
}
