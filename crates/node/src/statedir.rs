//! Where a node keeps its files under the state dir, and how a private file is replaced: atomically,
//! mode 0600, synced. Shared by the certificate files (`join`), autolock's rewrap (`lock`) and the leave
//! marker (`lifecycle`).
//!
//! Must not depend on any other module of this crate.

use std::io::Write;
use std::path::{Path, PathBuf};

/// `<state dir>/certificates`.
pub fn certs_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("certificates")
}

/// Replaces `path` with `bytes` atomically: written (mode 0600) and synced to `path` with extension
/// `tmp_ext`, then renamed over it. The error names the file that failed. The caller syncs the directory.
pub(crate) fn replace_private(path: &Path, tmp_ext: &str, bytes: &[u8]) -> Result<(), (PathBuf, std::io::Error)> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension(tmp_ext);
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|_| f.sync_all()))
        .map_err(|e| (tmp.clone(), e))?;
    std::fs::rename(&tmp, path).map_err(|e| (path.to_path_buf(), e))
}
