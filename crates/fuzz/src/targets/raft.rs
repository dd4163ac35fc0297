//! What a manager reads from other managers' Raft traffic and from its own state dir: raft-rs messages
//! (protobuf 2, inside `ProcessRaftMessage`/`StreamRaftMessage`), the commit record, the DEK file (plain
//! or sealed), sealed log entries and snapshot files, and the membership carried by conf changes.

use std::cell::RefCell;
use std::path::PathBuf;

use protobuf::Message as _;
use shoal_ca::encryption::{looks_sealed, open, sealed_key_id};
use shoal_ca::SecretKey;
use shoal_raft::encryption::{read_dek_file, DekFile};
use shoal_raft::eraftpb::Message;
use shoal_raft::fuzz_hooks;

use super::split_selector;

/// A raft-rs message as the `Raft` service parses it before stepping it, re-encoded and parsed again.
pub fn message(data: &[u8]) {
    let Ok(m) = Message::parse_from_bytes(data) else { return };
    let bytes = m.write_to_bytes().expect("a parsed message encodes");
    let again = Message::parse_from_bytes(&bytes).expect("an encoded message parses");
    assert_eq!(again.get_msg_type(), m.get_msg_type());
    assert_eq!(again.get_entries().len(), m.get_entries().len());
}

thread_local! {
    /// A private directory per thread for targets that read files (`raft/` inside it).
    static STATE_DIR: RefCell<Option<tempfile::TempDir>> = const { RefCell::new(None) };
}

/// The thread's state dir, with `raft/` created.
fn state_dir() -> PathBuf {
    STATE_DIR.with(|d| {
        let mut d = d.borrow_mut();
        let dir = d.get_or_insert_with(|| tempfile::tempdir().expect("a temporary directory"));
        let raft = dir.path().join("raft");
        std::fs::create_dir_all(&raft).expect("raft dir");
        dir.path().to_path_buf()
    })
}

/// A fixed key for the sealed inputs (the fuzzer cannot forge its tag; it can damage every other part).
pub fn fixed_key() -> SecretKey {
    SecretKey::from_bytes([7; 32])
}

/// State-dir records, chosen by the first byte: the commit record file, the DEK file (and unsealing a sealed
/// one), a sealed log entry or snapshot, a conf change's membership.
pub fn records(data: &[u8]) {
    let (sel, bytes) = split_selector(data);
    match sel % 5 {
        0 => {
            let path = state_dir().join("raft").join("commit-record");
            std::fs::write(&path, bytes).expect("write the commit record");
            let _ = fuzz_hooks::read_commit_record(&path);
        }
        1 => {
            let dir = state_dir();
            std::fs::write(shoal_raft::encryption::dek_path(&dir), bytes).expect("write the DEK file");
            if let Ok(Some(DekFile::Sealed(sealed))) = read_dek_file(&dir) {
                let _ = DekFile::unseal(&sealed, &fixed_key());
            }
        }
        2 => {
            // A DEK file (length-prefixed) and a record sealed with its keys, as a log entry or snapshot.
            let Some((len, rest)) = bytes.split_first_chunk::<2>() else { return };
            let len = usize::from(u16::from_be_bytes(*len)).min(rest.len());
            let (dek, record) = rest.split_at(len);
            let dir = state_dir();
            std::fs::write(shoal_raft::encryption::dek_path(&dir), dek).expect("write the DEK file");
            if let Ok(Some(DekFile::Plain(keys))) = read_dek_file(&dir) {
                let _ = keys.decrypt(b"entry", record);
            }
        }
        3 => {
            let _ = (looks_sealed(bytes), sealed_key_id(bytes));
            let _ = open(&fixed_key(), b"aad", bytes);
        }
        _ => {
            let _ = fuzz_hooks::decode_membership(bytes);
        }
    }
}

/// A follower (Raft ID 2 of 1, 2, 3, five entries of term 1, three committed) stepping a sequence of
/// raft-rs messages (each `u16` length-prefixed) as the driver does: addressed to it, screened, stepped,
/// and each `Ready` persisted and advanced.
pub fn step(data: &[u8]) {
    use raft::storage::MemStorage;
    use raft::{Config, RawNode};
    use shoal_raft::eraftpb::{Entry, HardState};

    let storage = MemStorage::new_with_conf_state((vec![1, 2, 3], vec![]));
    let entries: Vec<Entry> = (1..=5)
        .map(|i| {
            let mut e = Entry::default();
            e.set_index(i);
            e.set_term(1);
            e
        })
        .collect();
    storage.wl().append(&entries).expect("seed entries");
    let mut hs = HardState::default();
    hs.set_term(1);
    hs.set_commit(3);
    storage.wl().set_hardstate(hs);
    let cfg = Config { id: 2, applied: 3, ..Default::default() };
    let logger = slog::Logger::root(slog::Discard, slog::o!());
    let mut raw = RawNode::new(&cfg, storage.clone(), &logger).expect("a follower");
    let mut rest = data;
    for _ in 0..16 {
        let Some((len, tail)) = rest.split_first_chunk::<2>() else { break };
        let len = usize::from(u16::from_be_bytes(*len)).min(tail.len());
        let (msg, tail) = tail.split_at(len);
        rest = tail;
        let Ok(mut m) = Message::parse_from_bytes(msg) else { continue };
        m.to = 2;
        if !fuzz_hooks::screen_inbound(&mut m, raw.raft.raft_log.last_index()) {
            continue;
        }
        let _ = raw.step(m);
        if raw.has_ready() {
            let mut rd = raw.ready();
            if !rd.snapshot().is_empty() {
                let _ = storage.wl().apply_snapshot(rd.snapshot().clone());
            }
            let _ = storage.wl().append(rd.entries());
            if let Some(hs) = rd.hs() {
                storage.wl().set_hardstate(hs.clone());
            }
            let _ = rd.take_messages();
            let mut light = raw.advance(rd);
            let _ = light.take_messages();
            raw.advance_apply();
        }
    }
}
