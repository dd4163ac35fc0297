//! Autolock on a manager: which key-encryption key (KEK) protects this node's keys at rest, the locked
//! state, unlocking, and following the cluster's unlock key.
//!
//! Two secrets live in the state dir: the Raft data encryption key (`shoal_raft::encryption`, file
//! `raft/dek`) and the node's TLS private key (`certificates/swarm-node.key`). With autolock off both are
//! plain files of mode 0600. With autolock on (the cluster object holds an unlock key) both are sealed with
//! the KEK derived from the unlock key (`shoal_ca::UnlockKey::kek`); the unlock key itself is never written
//! to this node's disk. Every manager, leader and followers, watches the cluster object
//! (`watch_cluster_unlock_key`) and rewraps both files when the key appears, changes (rotation) or goes.
//!
//! A manager restarted with a sealed DEK is locked: `run_daemon` serves only the locked control socket
//! (`shoal_engine_api::locked`) until `POST /swarm/unlock` brings the right key (or the daemon was given it
//! with `--unlock-key-file`); a wrong key is refused and the node stays locked. No gRPC, no Raft meanwhile.
//!
//! The KEK of each state dir that is unlocked in this process is kept in a process-wide table (several
//! in-process nodes in tests each have their own state dir); the certificate files (`join`) read and write
//! the TLS key through `KeyTable`, under the same lock the rewrap holds, so a renewal never writes a key
//! wrapped with a KEK that is being replaced.
//!
//! Turning autolock on also rotates the DEK (it was on disk in the clear): the DEK file first holds the new
//! DEK and the old one, `RaftNode::reencrypt` re-seals the log and the snapshots with the new one, then the
//! old one is dropped; an interrupted rotation is resumed by the next rewrap. The two files are rewrapped
//! together through an intent file (`RewrapIntent`), finished at the next start if a crash cut it short.
//! Must not log key material.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};

use base64::Engine as _;
use parking_lot::{Mutex, MutexGuard};
use shoal_ca::encryption::{looks_sealed, open, seal, EncryptionError};
use shoal_ca::{SecretKey, UnlockKey};
use shoal_engine_api::locked::UnlockError;
use shoal_raft::encryption::{dek_file_bytes, read_dek_file, write_dek_file, DataKeys, DekFile};
use shoal_store::{MemoryStore, Object};
use tokio::sync::watch;

use crate::NodeError;

const WRAPPED_BEGIN: &str = "-----BEGIN SHOAL ENCRYPTED PRIVATE KEY-----";
const WRAPPED_END: &str = "-----END SHOAL ENCRYPTED PRIVATE KEY-----";
/// Associated data of the wrapped TLS key.
const TLS_KEY_AAD: &[u8] = b"shoal node tls key";

static KEKS: LazyLock<Mutex<HashMap<PathBuf, SecretKey>>> = LazyLock::new(Default::default);

/// The table of KEKs of the unlocked state dirs, locked for the caller's use.
pub(crate) struct KeyTable(MutexGuard<'static, HashMap<PathBuf, SecretKey>>);

/// Locks the KEK table (hold it across reading or writing a wrapped key file).
pub(crate) fn key_table() -> KeyTable {
    KeyTable(KEKS.lock())
}

impl KeyTable {
    /// The KEK in use for `state_dir`, if autolock applies to it.
    pub(crate) fn kek(&self, state_dir: &Path) -> Option<&SecretKey> {
        self.0.get(state_dir)
    }

    fn set(&mut self, state_dir: &Path, kek: Option<SecretKey>) {
        match kek {
            Some(k) => self.0.insert(state_dir.to_path_buf(), k),
            None => self.0.remove(state_dir),
        };
    }

    /// The TLS key file's content for `pem`: wrapped with the state dir's KEK when there is one.
    pub(crate) fn node_key_to_disk(&self, state_dir: &Path, pem: &str) -> String {
        match self.kek(state_dir) {
            Some(kek) => wrap_pem(kek, pem),
            None => pem.to_string(),
        }
    }

    /// The TLS key (PEM) from the key file's content, unwrapping it with the state dir's KEK.
    pub(crate) fn node_key_from_disk(&self, state_dir: &Path, text: &str) -> Result<String, String> {
        if !text.trim_start().starts_with(WRAPPED_BEGIN) {
            return Ok(text.to_string());
        }
        let kek = self.kek(state_dir).ok_or_else(|| {
            "the node's TLS key is encrypted (autolock): unlock this manager with `docker swarm unlock`".to_string()
        })?;
        unwrap_pem(kek, text).map_err(|e| format!("cannot decrypt the node's TLS key: {e}"))
    }
}

fn wrap_pem(kek: &SecretKey, pem: &str) -> String {
    let sealed = seal(kek, 0, TLS_KEY_AAD, pem.as_bytes(), &mut rand::rng());
    let b64 = base64::engine::general_purpose::STANDARD.encode(sealed);
    let mut out = String::from(WRAPPED_BEGIN);
    out.push('\n');
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str(WRAPPED_END);
    out.push('\n');
    out
}

fn unwrap_pem(kek: &SecretKey, text: &str) -> Result<String, EncryptionError> {
    let body: String =
        text.lines().map(str::trim).filter(|l| !l.is_empty() && *l != WRAPPED_BEGIN && *l != WRAPPED_END).collect();
    let sealed = base64::engine::general_purpose::STANDARD
        .decode(body)
        .map_err(|e| EncryptionError::NotSealed(format!("bad base64: {e}")))?;
    if !looks_sealed(&sealed) {
        return Err(EncryptionError::NotSealed("not an envelope".into()));
    }
    let plain = open(kek, TLS_KEY_AAD, &sealed)?;
    String::from_utf8(plain).map_err(|_| EncryptionError::NotSealed("the key is not text".into()))
}

fn tls_key_path(state_dir: &Path) -> PathBuf {
    crate::statedir::certs_dir(state_dir).join("swarm-node.key")
}

fn security(e: impl std::fmt::Display) -> NodeError {
    NodeError::Security(e.to_string())
}

/// True when the state dir's DEK is sealed and this process holds no KEK for it: the manager is locked.
pub(crate) fn is_locked(state_dir: &Path) -> Result<bool, NodeError> {
    finish_interrupted_rewrap(state_dir)?;
    let sealed = matches!(read_dek_file(state_dir)?, Some(DekFile::Sealed(_)));
    Ok(sealed && key_table().kek(state_dir).is_none())
}

/// The DEKs for Raft: `None` when the state dir has no DEK file yet (Raft creates a plain one).
pub(crate) fn data_keys(state_dir: &Path) -> Result<Option<DataKeys>, NodeError> {
    finish_interrupted_rewrap(state_dir)?;
    match read_dek_file(state_dir)? {
        None => Ok(None),
        Some(DekFile::Plain(keys)) => Ok(Some(keys)),
        Some(DekFile::Sealed(sealed)) => {
            let table = key_table();
            let kek = table.kek(state_dir).ok_or(NodeError::Raft(shoal_raft::RaftError::Locked))?;
            DekFile::unseal(&sealed, kek)
                .map(Some)
                .map_err(|e| security(format!("cannot unseal the raft data key: {e}")))
        }
    }
}

/// Tries an unlock key (as typed): on success the state dir's KEK is recorded and the node is unlocked.
pub fn unlock(state_dir: &Path, key: &str) -> Result<(), UnlockError> {
    let key = UnlockKey::parse(key).map_err(|e| UnlockError::BadFormat(e.to_string()))?;
    let kek = key.kek();
    let mut table = key_table();
    match read_dek_file(state_dir).map_err(|e| UnlockError::Failed(e.to_string()))? {
        Some(DekFile::Sealed(sealed)) => match DekFile::unseal(&sealed, &kek) {
            Ok(_) => {}
            Err(EncryptionError::Authentication) => return Err(UnlockError::WrongKey),
            Err(e) => return Err(UnlockError::Failed(format!("cannot unseal the raft data key: {e}"))),
        },
        _ => return Err(UnlockError::Failed("this node is not locked".into())),
    }
    table.set(state_dir, Some(kek));
    Ok(())
}

/// The state dir's DEKs as on disk (unsealed with the table's KEK), and whether the file was plain.
fn current_data_keys(table: &KeyTable, state_dir: &Path) -> Result<(DataKeys, bool), NodeError> {
    match read_dek_file(state_dir)? {
        Some(DekFile::Plain(keys)) => Ok((keys, true)),
        Some(DekFile::Sealed(sealed)) => {
            let kek = table.kek(state_dir).ok_or(NodeError::Raft(shoal_raft::RaftError::Locked))?;
            let keys =
                DekFile::unseal(&sealed, kek).map_err(|e| security(format!("cannot unseal the raft data key: {e}")))?;
            Ok((keys, false))
        }
        None => Err(NodeError::State("the raft data key file is missing".into())),
    }
}

/// Seals (or, with `None`, unseals) the TLS key file and the DEK file with `kek`, unless they already are.
/// When autolock is turned on the DEK, which was on disk in the clear, is rotated: the DEK file then holds
/// the new DEK (current) and the old one, and the keys returned must be given to
/// `RaftNode::reencrypt`, after which `finish_dek_rotation` drops the old DEK. Also returned when an earlier
/// rotation was interrupted (more than one DEK on disk).
fn rewrap(state_dir: &Path, kek: Option<SecretKey>) -> Result<Option<DataKeys>, NodeError> {
    let mut table = key_table();
    let (keys, was_plain) = current_data_keys(&table, state_dir)?;
    let same_kek = table.kek(state_dir) == kek.as_ref();
    if same_kek && keys.len() == 1 {
        return Ok(None);
    }
    let rotate = keys.len() > 1 || (was_plain && kek.is_some());
    let keys = if keys.len() == 1 && rotate { keys.rotated() } else { keys };
    let key_path = tls_key_path(state_dir);
    let text = std::fs::read_to_string(&key_path).map_err(|e| NodeError::io(&key_path, e))?;
    let pem = table.node_key_from_disk(state_dir, &text).map_err(NodeError::Security)?;
    let new_text = match &kek {
        Some(k) => wrap_pem(k, &pem),
        None => pem,
    };
    // Both files change together (see `RewrapIntent`): never one under the old KEK and one under the new.
    RewrapIntent { tls_key: new_text.into_bytes(), dek: dek_file_bytes(&keys, kek.as_ref()) }.apply(state_dir)?;
    let on = kek.is_some();
    table.set(state_dir, kek);
    tracing::info!(autolock = on, "the raft data key and the node's TLS key were rewrapped");
    Ok(rotate.then_some(keys))
}

/// After `RaftNode::reencrypt`: keeps only the current DEK in the DEK file.
fn finish_dek_rotation(state_dir: &Path) -> Result<(), NodeError> {
    let table = key_table();
    let (keys, _) = current_data_keys(&table, state_dir)?;
    if keys.len() > 1 {
        write_dek_file(state_dir, &keys.current_only(), table.kek(state_dir))?;
        tracing::info!("the raft data key was rotated: the log and snapshots are sealed with the new one only");
    }
    Ok(())
}

/// `rewrap`, then the DEK rotation it asks for, if any.
async fn apply_kek(state_dir: &Path, raft: &shoal_raft::RaftNode, kek: Option<SecretKey>) -> Result<(), NodeError> {
    let dir = state_dir.to_path_buf();
    let rotation = tokio::task::spawn_blocking(move || rewrap(&dir, kek))
        .await
        .map_err(|e| NodeError::State(format!("the key rewrap stopped: {e}")))??;
    if let Some(keys) = rotation {
        raft.reencrypt(keys).await?;
        let dir = state_dir.to_path_buf();
        tokio::task::spawn_blocking(move || finish_dek_rotation(&dir))
            .await
            .map_err(|e| NodeError::State(format!("the key rewrap stopped: {e}")))??;
    }
    Ok(())
}

/// The new content of the TLS key file and the DEK file, written first to `<state dir>/keys.rewrap` (fsync'd)
/// and then to the two files: a crash in between is finished from the intent at the next start
/// (`finish_interrupted_rewrap`), so the two files never end up under different KEKs. The intent holds
/// exactly what the two files will hold (sealed when they are), with the same mode.
struct RewrapIntent {
    tls_key: Vec<u8>,
    dek: Vec<u8>,
}

const INTENT_MAGIC: &[u8] = b"SHOAL-REWRAP-1\n";

fn intent_path(state_dir: &Path) -> PathBuf {
    state_dir.join("keys.rewrap")
}

impl RewrapIntent {
    fn encode(&self) -> Vec<u8> {
        let mut v = INTENT_MAGIC.to_vec();
        v.extend_from_slice(&(self.tls_key.len() as u64).to_be_bytes());
        v.extend_from_slice(&self.tls_key);
        v.extend_from_slice(&self.dek);
        v
    }

    fn decode(b: &[u8]) -> Option<RewrapIntent> {
        let rest = b.strip_prefix(INTENT_MAGIC)?;
        // A length read off the disk: one past the file's end (or past usize) is a torn or corrupt intent.
        let len = usize::try_from(u64::from_be_bytes(rest.get(..8)?.try_into().ok()?)).ok()?;
        let end = len.checked_add(8)?;
        let tls_key = rest.get(8..end)?.to_vec();
        let dek = rest.get(end..)?.to_vec();
        (!dek.is_empty()).then_some(RewrapIntent { tls_key, dek })
    }

    /// Records the intent, writes both files, then drops the intent.
    fn apply(&self, state_dir: &Path) -> Result<(), NodeError> {
        let intent = intent_path(state_dir);
        write_private(&intent, &self.encode())?;
        self.write_files(state_dir)?;
        std::fs::remove_file(&intent).map_err(|e| NodeError::io(&intent, e))?;
        fsync_dir(state_dir)
    }

    fn write_files(&self, state_dir: &Path) -> Result<(), NodeError> {
        write_private(&tls_key_path(state_dir), &self.tls_key)?;
        write_private(&shoal_raft::encryption::dek_path(state_dir), &self.dek)
    }
}

/// Finishes a rewrap a crash interrupted (see `RewrapIntent`); an intent cut short while being written
/// (the files were not touched yet) is dropped.
fn finish_interrupted_rewrap(state_dir: &Path) -> Result<(), NodeError> {
    let intent = intent_path(state_dir);
    let bytes = match std::fs::read(&intent) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(NodeError::io(&intent, e)),
    };
    if let Some(i) = RewrapIntent::decode(&bytes) {
        i.write_files(state_dir)?;
        tracing::info!("finished rewrapping the node's keys, interrupted by the last stop");
    }
    std::fs::remove_file(&intent).map_err(|e| NodeError::io(&intent, e))?;
    fsync_dir(state_dir)
}

fn fsync_dir(dir: &Path) -> Result<(), NodeError> {
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| NodeError::io(dir, e))
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), NodeError> {
    crate::statedir::replace_private(path, "rewrap.tmp", bytes).map_err(|(p, e)| NodeError::io(&p, e))?;
    fsync_dir(path.parent().expect("a key file has a directory"))
}

/// The KEK the cluster object asks for: the one of its managers' unlock key while autolock is on.
fn wanted_kek(store: &MemoryStore) -> Result<Option<SecretKey>, String> {
    let Some(cluster) = store.view(|t| t.clusters().iter().min_by(|a, b| a.id.cmp(&b.id)).cloned()) else {
        return Ok(None);
    };
    match shoal_manager::controlapi::manager_unlock_key(&cluster) {
        None => Ok(None),
        Some(raw) => UnlockKey::from_raw(raw)
            .map(|k| Some(k.kek()))
            .ok_or_else(|| format!("the cluster's unlock key has {} bytes, not 32; not applied", raw.len())),
    }
}

/// Follows the cluster object's unlock key until `stop`: rewraps this manager's keys whenever it changes
/// (and rotates the DEK through `raft` when autolock is turned on).
pub(crate) async fn watch_cluster_unlock_key(
    state_dir: PathBuf,
    store: Arc<MemoryStore>,
    raft: shoal_raft::RaftNode,
    mut stop: watch::Receiver<bool>,
) {
    // Subscribed before the first read, so no change of the cluster object is missed.
    let ((), mut events) = store.view_and_watch(|_| ());
    loop {
        match wanted_kek(&store) {
            Ok(kek) => {
                if let Err(e) = apply_kek(&state_dir, &raft, kek).await {
                    tracing::error!(error = %e, "cannot apply the cluster's autolock setting to this manager's keys");
                }
            }
            Err(e) => tracing::error!("{e}"),
        }
        // Wait for a commit that touches the cluster object (or a lag, after which the view is re-read).
        loop {
            tokio::select! {
                _ = shoal_manager::stopped(&mut stop) => return,
                r = events.recv() => match r {
                    Ok(commit) if commit.changes.iter().any(|c| matches!(c.object, Object::Cluster(_))) => break,
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrapped_tls_key_opens_only_with_its_kek() {
        let kek = UnlockKey::generate(&mut rand::rng()).kek();
        let pem = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg\n-----END PRIVATE \
                   KEY-----\n";
        let wrapped = wrap_pem(&kek, pem);
        assert!(!wrapped.contains("MIGHAgEA"));
        assert_eq!(unwrap_pem(&kek, &wrapped).unwrap(), pem);
        let other = UnlockKey::generate(&mut rand::rng()).kek();
        assert_eq!(unwrap_pem(&other, &wrapped), Err(EncryptionError::Authentication));
        let mut lines: Vec<String> = wrapped.lines().map(String::from).collect();
        lines[1] = lines[1].chars().rev().collect();
        assert!(unwrap_pem(&kek, &lines.join("\n")).is_err(), "tampering is detected");
    }

    /// A state dir as an unlocked manager leaves it: a plain TLS key and a plain DEK file; returns the DEK.
    fn unlocked_state(state: &std::path::Path) -> shoal_raft::encryption::DataKeys {
        std::fs::create_dir_all(crate::statedir::certs_dir(state)).unwrap();
        std::fs::write(tls_key_path(state), "-----BEGIN PRIVATE KEY-----\nabc\n-----END PRIVATE KEY-----\n").unwrap();
        shoal_raft::encryption::load_or_create_plain(state).unwrap()
    }

    #[test]
    fn a_rewrap_cut_short_is_finished_or_dropped_at_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path();
        let keys = unlocked_state(state);
        let kek = UnlockKey::generate(&mut rand::rng()).kek();
        let intent = RewrapIntent {
            tls_key: wrap_pem(&kek, "-----BEGIN PRIVATE KEY-----\nabc\n-----END PRIVATE KEY-----\n").into_bytes(),
            dek: dek_file_bytes(&keys, Some(&kek)),
        };
        // Cut short while the intent itself was written: dropped, nothing changes.
        let full = intent.encode();
        std::fs::write(intent_path(state), &full[..20]).unwrap();
        assert!(!is_locked(state).unwrap());
        assert!(!intent_path(state).exists());
        // Cut short after the intent, before (or between) the two files: both are written from it.
        std::fs::write(intent_path(state), &full).unwrap();
        assert!(is_locked(state).unwrap(), "the DEK is sealed now");
        assert!(!intent_path(state).exists());
        assert_eq!(std::fs::read(tls_key_path(state)).unwrap(), intent.tls_key);
        key_table().set(state, Some(kek));
        assert_eq!(data_keys(state).unwrap(), Some(keys));
        key_table().set(state, None);
    }

    #[test]
    fn an_intent_with_a_length_past_its_end_is_refused_without_a_panic() {
        let intent = RewrapIntent { tls_key: b"key".to_vec(), dek: b"dek".to_vec() };
        assert_eq!(
            RewrapIntent::decode(&intent.encode()).map(|i| (i.tls_key, i.dek)),
            Some((intent.tls_key, intent.dek))
        );
        for len in [u64::MAX, u64::MAX - 7, 1 << 40, 7] {
            let mut bytes = INTENT_MAGIC.to_vec();
            bytes.extend_from_slice(&len.to_be_bytes());
            bytes.extend_from_slice(b"keydek");
            assert!(RewrapIntent::decode(&bytes).is_none(), "length {len}");
        }
    }

    #[test]
    fn certificate_files_written_while_autolocked_keep_the_key_wrapped() {
        // What a renewal does: `join::store_certs`, then a later `join::load_certs`.
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path();
        let certs = crate::join::NodeCerts {
            root_pem: "root".into(),
            cert_pem: "cert".into(),
            key_pem: "-----BEGIN PRIVATE KEY-----\nsecret-key-bytes\n-----END PRIVATE KEY-----\n".into(),
        };
        key_table().set(state, Some(UnlockKey::generate(&mut rand::rng()).kek()));
        crate::join::store_certs(state, &certs).unwrap();
        let on_disk = std::fs::read_to_string(tls_key_path(state)).unwrap();
        assert!(on_disk.starts_with(WRAPPED_BEGIN) && !on_disk.contains("secret-key-bytes"), "{on_disk}");
        assert_eq!(crate::join::load_certs(state).unwrap().unwrap().key_pem, certs.key_pem);
        // Without the KEK (a restart, still locked) the key cannot be read, and the error says why.
        key_table().set(state, None);
        let err = crate::join::load_certs(state).unwrap_err().to_string();
        assert!(err.contains("unlock"), "{err}");
    }

    #[test]
    fn unlocking_checks_the_key_against_the_sealed_dek_and_rewrap_follows_the_cluster() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path();
        let keys = unlocked_state(state);
        assert!(!is_locked(state).unwrap());

        let key = UnlockKey::generate(&mut rand::rng());
        // Turning autolock on rotates the DEK: both on disk until Raft re-sealed everything.
        let rotated = rewrap(state, Some(key.kek())).unwrap().expect("a DEK rotation");
        assert_eq!((rotated.len(), rotated.current_only().len()), (2, 1));
        assert_ne!(rotated.current_only(), keys);
        assert_eq!(data_keys(state).unwrap(), Some(rotated.clone()));
        finish_dek_rotation(state).unwrap();
        let keys = rotated.current_only();
        assert_eq!(data_keys(state).unwrap(), Some(keys.clone()));
        assert!(std::fs::read_to_string(tls_key_path(state)).unwrap().starts_with(WRAPPED_BEGIN));
        assert!(!is_locked(state).unwrap(), "unlocked in this process");
        // A restart forgets the KEK: locked.
        key_table().set(state, None);
        assert!(is_locked(state).unwrap());
        assert!(matches!(data_keys(state), Err(NodeError::Raft(shoal_raft::RaftError::Locked))));
        let wrong = UnlockKey::generate(&mut rand::rng()).to_human();
        assert_eq!(unlock(state, &wrong), Err(UnlockError::WrongKey));
        assert!(matches!(unlock(state, "SWMKEY-1-short"), Err(UnlockError::BadFormat(_))));
        assert!(is_locked(state).unwrap(), "still locked after bad keys");
        unlock(state, &key.to_human()).unwrap();
        assert!(!is_locked(state).unwrap());
        assert_eq!(data_keys(state).unwrap(), Some(keys.clone()));
        let pem =
            key_table().node_key_from_disk(state, &std::fs::read_to_string(tls_key_path(state)).unwrap()).unwrap();
        assert!(pem.contains("abc"));

        // Rotation, then autolock off: plain files again, the same DEK throughout.
        let next = UnlockKey::generate(&mut rand::rng());
        assert_eq!(rewrap(state, Some(next.kek())).unwrap(), None, "a new KEK alone rotates no DEK");
        key_table().set(state, None);
        assert_eq!(unlock(state, &key.to_human()), Err(UnlockError::WrongKey), "the old key no longer opens");
        unlock(state, &next.to_human()).unwrap();
        assert_eq!(rewrap(state, None).unwrap(), None);
        assert!(!is_locked(state).unwrap());
        assert!(std::fs::read_to_string(tls_key_path(state)).unwrap().contains("abc"));
        assert_eq!(shoal_raft::encryption::load_or_create_plain(state).unwrap(), keys);
    }
}
