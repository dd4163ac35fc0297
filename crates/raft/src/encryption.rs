//! Encryption at rest of the Raft state: the data encryption keys (`DataKeys`, DEKs) that seal every log
//! entry's data and every snapshot file, and the DEK file (`state_dir/raft/dek`, mode 0600) that keeps them.
//!
//! Each record is a `shoal_ca::encryption` envelope naming the id of the DEK that sealed it, so a reader
//! holding several DEKs (after a rotation) opens old and new records alike; the associated data binds a
//! log entry to its index and a snapshot to its index, so records cannot be swapped unnoticed.
//!
//! The DEK file is either plain (autolock off: like SwarmKit's DEK kept in the TLS key's PEM headers, the
//! file's mode is its only protection) or sealed with a key-encryption key (autolock: the KEK is derived
//! from the swarm's unlock key, which is never written here). Which KEK applies is the caller's business
//! (the node); this module only reads and writes the file atomically (tmp file, fsync, rename, fsync dir).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use shoal_ca::encryption::{open, seal, sealed_key_id, EncryptionError, SecretKey};

use crate::RaftError;

const PLAIN_TAG: &[u8] = b"SHOAL-RAFT-DEK-PLAIN-1\n";
const SEALED_TAG: &[u8] = b"SHOAL-RAFT-DEK-SEALED-1\n";
/// Associated data of the sealed DEK file.
const DEK_FILE_AAD: &[u8] = b"shoal raft dek file";

/// The DEKs of one node: the one new records are sealed with, and older ones still needed to read.
#[derive(Clone, PartialEq, Eq)]
pub struct DataKeys {
    current: u32,
    keys: BTreeMap<u32, SecretKey>,
}

impl std::fmt::Debug for DataKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataKeys").field("current", &self.current).field("ids", &self.keys.keys()).finish()
    }
}

impl DataKeys {
    /// One fresh random DEK (id 1).
    pub fn generate() -> DataKeys {
        DataKeys { current: 1, keys: [(1, SecretKey::generate(&mut rand::rng()))].into() }
    }

    /// A new random DEK (the next id) becomes current; the present ones are kept to read older records.
    pub fn rotated(&self) -> DataKeys {
        let next = self.keys.keys().max().copied().unwrap_or(0).checked_add(1).expect("fewer than 2^32 DEKs");
        let mut keys = self.keys.clone();
        keys.insert(next, SecretKey::generate(&mut rand::rng()));
        DataKeys { current: next, keys }
    }

    /// Only the current DEK (once `RaftNode::reencrypt` has re-sealed everything with it).
    pub fn current_only(&self) -> DataKeys {
        let key = self.keys.get(&self.current).expect("the current DEK is in the keyring").clone();
        DataKeys { current: self.current, keys: [(self.current, key)].into() }
    }

    /// How many DEKs are held (more than one while a rotation is under way).
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Never true: there is always a current DEK.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The id of the DEK new records are sealed with.
    pub fn current_id(&self) -> u32 {
        self.current
    }

    /// Seals `plain`, binding `aad`, with the current DEK.
    pub fn encrypt(&self, aad: &[u8], plain: &[u8]) -> Vec<u8> {
        let key = self.keys.get(&self.current).expect("the current DEK is in the keyring");
        seal(key, self.current, aad, plain, &mut rand::rng())
    }

    /// Opens a record sealed with any DEK held here.
    pub fn decrypt(&self, aad: &[u8], sealed: &[u8]) -> Result<Vec<u8>, EncryptionError> {
        let id = sealed_key_id(sealed)?;
        let key = self.keys.get(&id).ok_or(EncryptionError::UnknownKey(id))?;
        open(key, aad, sealed)
    }

    fn encode(&self) -> Vec<u8> {
        let mut v = self.current.to_be_bytes().to_vec();
        for (id, key) in &self.keys {
            v.extend_from_slice(&id.to_be_bytes());
            v.extend_from_slice(key.as_bytes());
        }
        v
    }

    fn decode(b: &[u8]) -> Result<DataKeys, String> {
        if b.len() < 4 || !(b.len() - 4).is_multiple_of(36) {
            return Err(format!("{} bytes is not a list of keys", b.len()));
        }
        let current = u32::from_be_bytes(b[..4].try_into().expect("4 bytes"));
        let keys: BTreeMap<u32, SecretKey> = b[4..]
            .chunks(36)
            .map(|c| {
                let id = u32::from_be_bytes(c[..4].try_into().expect("4 bytes"));
                (id, SecretKey::from_bytes(c[4..].try_into().expect("32 bytes")))
            })
            .collect();
        if !keys.contains_key(&current) {
            return Err(format!("the current key {current} is missing"));
        }
        Ok(DataKeys { current, keys })
    }
}

/// The DEK file as found on disk.
#[derive(Debug)]
pub enum DekFile {
    /// Not sealed (autolock off).
    Plain(DataKeys),
    /// Sealed with a KEK (autolock on): `unseal` it with the KEK from the unlock key.
    Sealed(Vec<u8>),
}

impl DekFile {
    /// The keys of a sealed file, with `kek`. A wrong KEK fails with `EncryptionError::Authentication`.
    pub fn unseal(sealed: &[u8], kek: &SecretKey) -> Result<DataKeys, EncryptionError> {
        let plain = open(kek, DEK_FILE_AAD, sealed)?;
        DataKeys::decode(&plain).map_err(EncryptionError::NotSealed)
    }
}

/// `state_dir/raft/dek`.
pub fn dek_path(state_dir: &Path) -> PathBuf {
    state_dir.join("raft").join("dek")
}

fn corrupted(path: &Path, reason: String) -> RaftError {
    RaftError::Corrupted { path: path.to_path_buf(), reason }
}

/// Reads the DEK file; `None` when there is none yet.
pub fn read_dek_file(state_dir: &Path) -> Result<Option<DekFile>, RaftError> {
    let path = dek_path(state_dir);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(RaftError::StateDir { path, source: e }),
    };
    if let Some(rest) = bytes.strip_prefix(PLAIN_TAG) {
        let keys = DataKeys::decode(rest).map_err(|e| corrupted(&path, format!("the data key file: {e}")))?;
        return Ok(Some(DekFile::Plain(keys)));
    }
    if let Some(rest) = bytes.strip_prefix(SEALED_TAG) {
        return Ok(Some(DekFile::Sealed(rest.to_vec())));
    }
    Err(corrupted(&path, "the data key file has an unknown format".into()))
}

/// The content of the DEK file for `keys`: sealed with `kek` when given, plain otherwise.
pub fn dek_file_bytes(keys: &DataKeys, kek: Option<&SecretKey>) -> Vec<u8> {
    match kek {
        Some(kek) => [SEALED_TAG, &seal(kek, 0, DEK_FILE_AAD, &keys.encode(), &mut rand::rng())].concat(),
        None => [PLAIN_TAG, &keys.encode()].concat(),
    }
}

/// Writes the DEK file atomically with mode 0600: sealed with `kek` when given, plain otherwise.
pub fn write_dek_file(state_dir: &Path, keys: &DataKeys, kek: Option<&SecretKey>) -> Result<(), RaftError> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dek_path(state_dir);
    let dir = path.parent().expect("the DEK file has a parent").to_path_buf();
    std::fs::create_dir_all(&dir).map_err(|e| RaftError::StateDir { path: dir.clone(), source: e })?;
    let bytes = dek_file_bytes(keys, kek);
    let tmp = path.with_extension("tmp");
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |e| RaftError::StateDir { path: p, source: e }
    };
    let mut f =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp).map_err(io(&tmp))?;
    f.write_all(&bytes).and_then(|_| f.sync_all()).map_err(io(&tmp))?;
    std::fs::rename(&tmp, &path).map_err(io(&path))?;
    std::fs::File::open(&dir).and_then(|d| d.sync_all()).map_err(io(&dir))
}

/// The DEKs to start with when the caller gave none: the plain DEK file, or a new one (written before any
/// record is sealed with it). A sealed file cannot be used without its KEK: the node is locked.
pub fn load_or_create_plain(state_dir: &Path) -> Result<DataKeys, RaftError> {
    match read_dek_file(state_dir)? {
        Some(DekFile::Plain(keys)) => Ok(keys),
        Some(DekFile::Sealed(_)) => Err(RaftError::Locked),
        None => {
            let keys = DataKeys::generate();
            write_dek_file(state_dir, &keys, None)?;
            Ok(keys)
        }
    }
}

/// What a failed decryption means, and what to do, for an error message.
pub(crate) fn decrypt_failure(e: &EncryptionError) -> String {
    match e {
        EncryptionError::NotSealed(_) => format!(
            "{e}: the record is not encrypted, so this state dir was written by a Shoal without encryption at \
             rest, which this version cannot read; start this manager with an empty state dir and join it again"
        ),
        _ => format!("{e}; the data key does not match this state dir, or the files were altered"),
    }
}

/// Associated data of a log entry's sealed data.
pub(crate) fn entry_aad(index: u64) -> [u8; 14] {
    let mut a = [0u8; 14];
    a[..6].copy_from_slice(b"entry:");
    a[6..].copy_from_slice(&index.to_be_bytes());
    a
}

/// Associated data of a sealed snapshot file.
pub(crate) fn snapshot_aad(index: u64) -> [u8; 17] {
    let mut a = [0u8; 17];
    a[..9].copy_from_slice(b"snapshot:");
    a[9..].copy_from_slice(&index.to_be_bytes());
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dek_file_round_trips_plain_and_sealed_and_refuses_a_wrong_kek() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read_dek_file(dir.path()).unwrap().is_none());
        let keys = load_or_create_plain(dir.path()).unwrap();
        assert_eq!(load_or_create_plain(dir.path()).unwrap(), keys, "a second start reads the same key");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dek_path(dir.path())).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);

        let kek = SecretKey::from_bytes([9; 32]);
        write_dek_file(dir.path(), &keys, Some(&kek)).unwrap();
        let raw = std::fs::read(dek_path(dir.path())).unwrap();
        for k in keys.keys.values() {
            assert!(!raw.windows(32).any(|w| w == k.as_bytes()), "the sealed file holds the DEK in the clear");
        }
        assert!(matches!(load_or_create_plain(dir.path()), Err(RaftError::Locked)));
        let Some(DekFile::Sealed(sealed)) = read_dek_file(dir.path()).unwrap() else { panic!("not sealed") };
        assert_eq!(DekFile::unseal(&sealed, &kek).unwrap(), keys);
        assert_eq!(DekFile::unseal(&sealed, &SecretKey::from_bytes([8; 32])), Err(EncryptionError::Authentication));
    }

    #[test]
    fn records_open_only_with_their_key_and_context() {
        let keys = DataKeys::generate();
        let sealed = keys.encrypt(&entry_aad(5), b"service marker");
        assert_eq!(keys.decrypt(&entry_aad(5), &sealed).unwrap(), b"service marker");
        assert!(keys.decrypt(&entry_aad(6), &sealed).is_err(), "moved to another index");
        assert!(keys.decrypt(&snapshot_aad(5), &sealed).is_err());
        assert!(DataKeys::generate().decrypt(&entry_aad(5), &sealed).is_err(), "another node's key");
        let mut other = DataKeys::generate();
        other.current = 2;
        other.keys.insert(2, SecretKey::from_bytes([1; 32]));
        other.keys.remove(&1);
        assert_eq!(other.decrypt(&entry_aad(5), &sealed), Err(EncryptionError::UnknownKey(1)));
        // A record from before encryption at rest says so.
        let old_record =
            keys.decrypt(&entry_aad(5), b"\x0a\x07service-spec-in-the-clear-from-an-old-version").unwrap_err();
        assert!(decrypt_failure(&old_record).contains("without encryption at rest"), "{old_record}");
        assert!(decrypt_failure(&EncryptionError::Authentication).contains("does not match"));
    }
}
