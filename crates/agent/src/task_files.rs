//! Where a task's secret and config files live on the node: a directory per task under a root on a tmpfs
//! (`/dev/shm/shoal-<node id>` by default), never on a persistent disk and never in the state dir.
//! `<root>/<task id>/secrets/...` and `<root>/<task id>/configs/...`, every directory mode 0700, each file
//! with the reference's mode and owner. The process executor points the task at the two directories
//! (`SHOAL_SECRETS_DIR`, `SHOAL_CONFIGS_DIR`); the docker executor bind-mounts each file read-only at its
//! target in the container. A task's directory is removed when the task is removed, and the executor sweeps
//! the directories of tasks no longer assigned.
//!
//! Where the root is not on a tmpfs (or ramfs), nothing is written and the task is rejected with that reason.
//! Must not depend on the session, gRPC or the dispatcher.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use crate::dependencies::{FileKind, TaskFile};

/// The environment variable naming a process task's secrets directory.
pub(crate) const SECRETS_DIR_ENV: &str = "SHOAL_SECRETS_DIR";
/// The environment variable naming a process task's configs directory.
pub(crate) const CONFIGS_DIR_ENV: &str = "SHOAL_CONFIGS_DIR";
/// Where Docker puts secrets with a relative target (and where an absolute secret target of a process
/// task may point: it is then taken relative to `SHOAL_SECRETS_DIR`).
pub(crate) const DOCKER_SECRETS_DIR: &str = "/run/secrets";

/// The default root of node `node_id`'s task files.
pub fn default_root(node_id: &str) -> PathBuf {
    PathBuf::from(format!("/dev/shm/shoal-{node_id}"))
}

/// The root of one node's task files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FilesRoot {
    path: PathBuf,
}

/// One file written for a task: where it is on the node, and the reference it came from.
#[derive(Clone, Debug)]
pub struct WrittenFile {
    /// The file on the node's tmpfs.
    pub host_path: PathBuf,
    /// Secret or config.
    pub kind: FileKind,
    /// The reference's target name, as sent.
    pub target: String,
}

fn io(what: &str, path: &Path, e: std::io::Error) -> String {
    format!("{what} {}: {e}", path.display())
}

/// Checks that `path` (or its nearest existing ancestor) is on a tmpfs or ramfs.
pub(crate) fn check_in_memory(path: &Path) -> Result<(), String> {
    let mut probe = path;
    while !probe.exists() {
        probe = probe.parent().unwrap_or(Path::new("/"));
    }
    let fs = nix::sys::statfs::statfs(probe).map_err(|e| format!("cannot inspect {}: {e}", probe.display()))?;
    let kind = fs.filesystem_type();
    // ramfs (0x858458f6) holds files in memory too; nix names no constant for it.
    if kind == nix::sys::statfs::TMPFS_MAGIC || kind.0 as i64 == 0x8584_58f6 {
        Ok(())
    } else {
        Err(format!(
            "this node has no tmpfs for secrets and configs: {} is not on a tmpfs, and they are never written to \
             a persistent disk",
            probe.display()
        ))
    }
}

/// A relative target path made safe: no empty, `.` or `..` components.
pub(crate) fn relative_target(name: &str) -> Result<PathBuf, String> {
    let p = Path::new(name);
    let ok = !name.is_empty()
        && !name.contains('\0')
        && p.components().all(|c| matches!(c, Component::Normal(_)))
        && !name.ends_with('/');
    if ok {
        Ok(p.to_path_buf())
    } else {
        Err(format!("target {name:?} is not a file name (no '..', '.', empty parts or trailing '/')"))
    }
}

fn mkdir(path: &Path) -> Result<(), String> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(path).map_err(|e| io("cannot create", path, e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)).map_err(|e| io("cannot chmod", path, e))
}

fn parse_id(what: &str, v: &str) -> Result<Option<u32>, String> {
    if v.is_empty() {
        return Ok(None);
    }
    v.parse::<u32>().map(Some).map_err(|_| format!("{what} {v:?} is not a numeric ID"))
}

impl FilesRoot {
    /// Task files under `path`.
    pub fn new(path: impl Into<PathBuf>) -> FilesRoot {
        FilesRoot { path: path.into() }
    }

    /// The root directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory of one task's files.
    pub fn task_dir(&self, task_id: &str) -> PathBuf {
        self.path.join(task_id)
    }

    /// The directory of one task's secrets or configs.
    pub fn kind_dir(&self, task_id: &str, kind: FileKind) -> PathBuf {
        self.task_dir(task_id).join(match kind {
            FileKind::Secret => "secrets",
            FileKind::Config => "configs",
        })
    }

    /// Writes `files` for `task_id`, each at `<kind dir>/<rel>` where `rel` is what `place` makes of it
    /// (an error rejects the task). Replaces what an earlier attempt wrote. Nothing is written when the root
    /// is not on a tmpfs.
    pub fn write(
        &self,
        task_id: &str,
        files: &[TaskFile],
        place: impl Fn(usize, &TaskFile) -> Result<PathBuf, String>,
    ) -> Result<Vec<WrittenFile>, String> {
        relative_target(task_id)?;
        check_in_memory(&self.path)?;
        let placed: Vec<PathBuf> = files.iter().enumerate().map(|(i, f)| place(i, f)).collect::<Result<_, _>>()?;
        self.remove(task_id)?;
        mkdir(&self.path)?;
        mkdir(&self.task_dir(task_id))?;
        let mut out = Vec::with_capacity(files.len());
        for (f, rel) in files.iter().zip(placed) {
            let dir = self.kind_dir(task_id, f.kind);
            let path = dir.join(&rel);
            mkdir(path.parent().unwrap_or(&dir))?;
            let uid = parse_id("uid", &f.uid)?;
            let gid = parse_id("gid", &f.gid)?;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| io("cannot create", &path, e))?;
            file.write_all(f.data.expose()).map_err(|e| io("cannot write", &path, e))?;
            drop(file);
            // Only a change of owner needs the privilege to chown (a daemon running as the owner asked for
            // needs none); a change it cannot make rejects the task.
            let meta = std::fs::metadata(&path).map_err(|e| io("cannot inspect", &path, e))?;
            let uid = uid.filter(|&u| u != meta.uid());
            let gid = gid.filter(|&g| g != meta.gid());
            if uid.is_some() || gid.is_some() {
                std::os::unix::fs::chown(&path, uid, gid).map_err(|e| io("cannot chown", &path, e))?;
            }
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(f.mode & 0o7777))
                .map_err(|e| io("cannot chmod", &path, e))?;
            out.push(WrittenFile { host_path: path, kind: f.kind, target: f.target.clone() });
        }
        Ok(out)
    }

    /// Removes one task's files (nothing to do when there are none).
    pub fn remove(&self, task_id: &str) -> Result<(), String> {
        let dir = self.task_dir(task_id);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io("cannot remove", &dir, e)),
        }
    }

    /// Removes the files of every task not in `keep`, and the root when nothing is left.
    pub fn sweep(&self, keep: &std::collections::HashSet<String>) {
        let Ok(entries) = std::fs::read_dir(&self.path) else { return };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !keep.contains(&name) {
                if let Err(e) = self.remove(&name) {
                    tracing::warn!("cannot remove the files of a task no longer here: {e}");
                }
            }
        }
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// Where a process task finds a file, relative to its secrets or configs directory: a relative target as
/// it is; a secret's absolute target under `/run/secrets/` relative to that; any other absolute target
/// cannot be honoured by a process (it would have to write outside its directory).
pub(crate) fn process_place(f: &TaskFile) -> Result<PathBuf, String> {
    let what = match f.kind {
        FileKind::Secret => "secret",
        FileKind::Config => "config",
    };
    let rel = match (f.kind, f.target.strip_prefix('/')) {
        (_, None) => f.target.as_str(),
        (FileKind::Secret, Some(_)) if f.target.starts_with("/run/secrets/") => &f.target["/run/secrets/".len()..],
        (_, Some(_)) => {
            return Err(format!(
                "{what} {}: the process executor cannot put a file at the absolute path {}; use a relative target \
                 (the task finds it under ${})",
                f.source,
                f.target,
                match f.kind {
                    FileKind::Secret => SECRETS_DIR_ENV,
                    FileKind::Config => CONFIGS_DIR_ENV,
                }
            ))
        }
    };
    relative_target(rel).map_err(|e| format!("{what} {}: {e}", f.source))
}

/// Where a file appears in a container (Docker's rule): an absolute target as it is; a relative one under
/// `/run/secrets/` for a secret and under `/` for a config.
pub(crate) fn container_path(f: &TaskFile) -> Result<String, String> {
    if f.target.starts_with('/') {
        relative_target(&f.target[1..]).map_err(|e| format!("{}: {e}", f.source))?;
        return Ok(f.target.clone());
    }
    relative_target(&f.target).map_err(|e| format!("{}: {e}", f.source))?;
    Ok(match f.kind {
        FileKind::Secret => format!("{DOCKER_SECRETS_DIR}/{}", f.target),
        FileKind::Config => format!("/{}", f.target),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dependencies::Sensitive;

    fn f(kind: FileKind, target: &str, mode: u32, data: &str) -> TaskFile {
        TaskFile {
            kind,
            source: format!("src-{target}"),
            target: target.into(),
            uid: "1234".into(),
            gid: "5678".into(),
            mode,
            data: Sensitive::new(data.as_bytes().to_vec()),
        }
    }

    fn libc_euid() -> u32 {
        std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(u32::MAX)
    }

    /// A root on /dev/shm removed at the end of the test, whatever happens.
    fn shm_root() -> tempfile::TempDir {
        tempfile::Builder::new().prefix("shoal-files-test-").tempdir_in("/dev/shm").expect("a dir on /dev/shm")
    }

    #[test]
    fn files_land_on_tmpfs_with_their_mode_and_owner_and_go_with_the_task() {
        let tmp = shm_root();
        let root = FilesRoot::new(tmp.path().join("node"));
        let files = vec![f(FileKind::Secret, "db_pw", 0o400, "pw"), f(FileKind::Config, "sub/app.conf", 0o444, "x=1")];
        let written = root.write("t1", &files, |_, f| process_place(f)).unwrap();
        let secret = root.kind_dir("t1", FileKind::Secret).join("db_pw");
        assert_eq!(written[0].host_path, secret);
        assert_eq!(std::fs::read(&secret).unwrap(), b"pw");
        let m = std::fs::metadata(&secret).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o400);
        if libc_euid() == 0 {
            assert_eq!((m.uid(), m.gid()), (1234, 5678));
        }
        let conf = root.kind_dir("t1", FileKind::Config).join("sub/app.conf");
        assert_eq!(std::fs::read(conf).unwrap(), b"x=1");
        for dir in [root.path().to_path_buf(), root.task_dir("t1"), root.kind_dir("t1", FileKind::Secret)] {
            assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700, "{}", dir.display());
        }
        // Written again (a retried prepare): the same files, no error.
        root.write("t1", &files, |_, f| process_place(f)).unwrap();
        root.write("t2", &files[..1], |_, f| process_place(f)).unwrap();
        root.remove("t1").unwrap();
        assert!(!root.task_dir("t1").exists());
        root.sweep(&Default::default());
        assert!(!root.path().exists());
    }

    #[test]
    fn nothing_is_written_off_tmpfs() {
        let disk = tempfile::tempdir().unwrap();
        if check_in_memory(disk.path()).is_ok() {
            eprintln!("the test's temporary directory is itself on a tmpfs: nothing to check");
            return;
        }
        let root = FilesRoot::new(disk.path().join("node"));
        let e = root.write("t1", &[f(FileKind::Secret, "db_pw", 0o400, "pw")], |_, f| process_place(f)).unwrap_err();
        assert!(e.contains("no tmpfs"), "{e}");
        assert!(!root.path().exists());
    }

    #[test]
    fn targets_are_placed_as_docker_does_and_processes_refuse_absolute_paths() {
        let check = |kind, target: &str, process: Result<&str, &str>, container: Result<&str, &str>| {
            let file = f(kind, target, 0o444, "");
            match (process_place(&file), process) {
                (Ok(p), Ok(want)) => assert_eq!(p, PathBuf::from(want), "{target}"),
                (Err(e), Err(frag)) => assert!(e.contains(frag), "{target}: {e}"),
                (got, want) => panic!("{target}: process placement {got:?}, expected {want:?}"),
            }
            match (container_path(&file), container) {
                (Ok(p), Ok(want)) => assert_eq!(p, want, "{target}"),
                (Err(e), Err(frag)) => assert!(e.contains(frag), "{target}: {e}"),
                (got, want) => panic!("{target}: container path {got:?}, expected {want:?}"),
            }
        };
        use FileKind::*;
        check(Secret, "db_pw", Ok("db_pw"), Ok("/run/secrets/db_pw"));
        check(Secret, "/run/secrets/a/b", Ok("a/b"), Ok("/run/secrets/a/b"));
        check(Secret, "/etc/pw", Err("cannot put a file at the absolute path /etc/pw"), Ok("/etc/pw"));
        check(Config, "app.conf", Ok("app.conf"), Ok("/app.conf"));
        check(Config, "/etc/app.conf", Err("$SHOAL_CONFIGS_DIR"), Ok("/etc/app.conf"));
        check(Secret, "../escape", Err("not a file name"), Err("not a file name"));
        check(Config, "/etc/../x", Err("absolute path"), Err("not a file name"));
    }
}
