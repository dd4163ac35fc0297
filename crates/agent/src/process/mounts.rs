//! A process task's mounts. A process sees the node's own file system, so a bind mount (and a cluster mount,
//! which the worker turns into a bind of the volume's publish path) is made in a mount namespace of the
//! process's own (`unshare(CLONE_NEWNS)`, every mount made private first): the source appears at the target
//! for the process and its children only, and the node's file system is left as it was. The target must exist
//! on the node (a directory for a directory, a file for a file), unless the mount asks for it to be created
//! (`BindOptions.CreateMountpoint`, Docker's `bind-create-mountpoint`). `readonly` makes the mount itself
//! read-only (its submounts keep their own flags, as `BindOptions.ReadOnlyNonRecursive` says); propagation
//! other than `rprivate` and `ReadOnlyForceRecursive` are refused, and so are volume and tmpfs mounts: those
//! need a container engine. A task on an overlay network also gets its resolv.conf this way
//! (`enter_namespaces`).
//!
//! Must not know the session, the store or gRPC.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use shoal_api::{mount, ContainerSpec};

/// One bind mount for the process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Bind {
    pub(super) source: PathBuf,
    pub(super) target: PathBuf,
    pub(super) readonly: bool,
    /// Only the source itself, not the mounts under it (`BindOptions.NonRecursive`).
    pub(super) non_recursive: bool,
    /// Create the target if it is missing (`BindOptions.CreateMountpoint`).
    pub(super) create_target: bool,
}

/// The spec's mounts as binds, or why a process cannot have them (naming the mount and what to do).
pub(super) fn binds_of(spec: &ContainerSpec) -> Result<Vec<Bind>, String> {
    use shoal_api::mount::bind_options::Propagation;
    spec.mounts
        .iter()
        .map(|m| {
            let kind = mount::Type::try_from(m.r#type).unwrap_or(mount::Type::Bind);
            if kind != mount::Type::Bind {
                return Err(format!(
                    "ContainerSpec.Mounts: a {} mount (target {}) needs a container engine; a process task takes \
                     bind and cluster mounts: run the service on a node with the docker executor",
                    kind.as_str_name().to_lowercase(),
                    m.target
                ));
            }
            let (source, target) = (PathBuf::from(&m.source), PathBuf::from(&m.target));
            if !source.is_absolute() || !target.is_absolute() {
                return Err(format!(
                    "ContainerSpec.Mounts: a bind mount needs absolute paths (source {:?}, target {:?})",
                    m.source, m.target
                ));
            }
            let options = m.bind_options.unwrap_or_default();
            if options.propagation != Propagation::Rprivate as i32 {
                return Err(format!(
                    "ContainerSpec.Mounts: the process executor makes a task's mounts private (rprivate); bind \
                     propagation {} (target {}) needs a container engine",
                    Propagation::try_from(options.propagation).map_or("unknown", |p| p.as_str_name()).to_lowercase(),
                    m.target
                ));
            }
            if options.readonlyforcerecursive {
                return Err(format!(
                    "ContainerSpec.Mounts: the process executor makes a read-only bind read-only on the mount \
                     itself only; ReadOnlyForceRecursive (target {}) needs a container engine",
                    m.target
                ));
            }
            Ok(Bind {
                source,
                target,
                readonly: m.readonly,
                non_recursive: options.nonrecursive,
                create_target: options.createmountpoint,
            })
        })
        .collect()
}

/// Before the process starts: each source exists, and each target exists as the same kind (made when asked).
pub(super) fn check(binds: &[Bind]) -> Result<(), String> {
    for b in binds {
        let source = std::fs::metadata(&b.source)
            .map_err(|e| format!("the bind mount's source {} is not on this node: {e}", b.source.display()))?;
        if !b.target.exists() && b.create_target {
            let made = if source.is_dir() {
                std::fs::create_dir_all(&b.target)
            } else {
                b.target
                    .parent()
                    .map_or(Ok(()), std::fs::create_dir_all)
                    .and_then(|()| std::fs::OpenOptions::new().create(true).append(true).open(&b.target).map(drop))
            };
            made.map_err(|e| format!("cannot create the mount's target {}: {e}", b.target.display()))?;
        }
        let target = std::fs::metadata(&b.target).map_err(|_| {
            format!(
                "the mount's target {} does not exist on this node: a process task's mounts go over the node's own \
                 paths; create it, or ask for it with bind-create-mountpoint",
                b.target.display()
            )
        })?;
        if source.is_dir() != target.is_dir() {
            return Err(format!(
                "the mount's source {} and target {} are not both directories or both files",
                b.source.display(),
                b.target.display()
            ));
        }
    }
    Ok(())
}

/// What the process enters between fork and exec.
#[derive(Debug, Default)]
pub(super) struct Namespaces {
    /// The task's network namespace.
    pub(super) netns: Option<std::fs::File>,
    /// Binds made in a mount namespace of its own, in order.
    pub(super) binds: Vec<Bind>,
}

/// A bind as the child makes it: C strings and flags, prepared before the fork.
struct RawBind {
    source: CString,
    target: CString,
    flags: libc::c_ulong,
    readonly: bool,
}

fn c_path(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| format!("bad path {}", p.display()))
}

/// Makes `cmd`'s process enter `ns`: the network namespace, then (with any bind) a mount namespace of its own
/// with every mount private and the binds made.
#[allow(unsafe_code)]
pub(super) fn enter_namespaces(cmd: &mut std::process::Command, ns: Namespaces) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    if ns.netns.is_none() && ns.binds.is_empty() {
        return Ok(());
    }
    let binds = ns
        .binds
        .iter()
        .map(|b| {
            let flags = if b.non_recursive { libc::MS_BIND } else { libc::MS_BIND | libc::MS_REC };
            Ok(RawBind { source: c_path(&b.source)?, target: c_path(&b.target)?, flags, readonly: b.readonly })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let root = CString::new("/").expect("no NUL");
    let netns = ns.netns;
    // SAFETY: the closure runs in the forked child before exec and only makes system calls (setns, unshare,
    // mount) on values prepared before the fork; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(netns) = &netns {
                if libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if binds.is_empty() {
                return Ok(());
            }
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let none = std::ptr::null();
            if libc::mount(none, root.as_ptr(), none, libc::MS_REC | libc::MS_PRIVATE, std::ptr::null()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            for b in &binds {
                if libc::mount(b.source.as_ptr(), b.target.as_ptr(), none, b.flags, std::ptr::null()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let read_only = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY;
                if b.readonly && libc::mount(none, b.target.as_ptr(), none, read_only, std::ptr::null()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_api::mount::BindOptions;
    use shoal_api::Mount;

    fn spec(mounts: Vec<Mount>) -> ContainerSpec {
        ContainerSpec { mounts, ..Default::default() }
    }

    fn bind(source: &str, target: &str) -> Mount {
        Mount { r#type: mount::Type::Bind as i32, source: source.into(), target: target.into(), ..Default::default() }
    }

    #[test]
    fn binds_are_taken_and_what_needs_an_engine_is_refused_naming_the_mount() {
        let mut ro = bind("/srv/a", "/data");
        ro.readonly = true;
        ro.bind_options = Some(BindOptions { nonrecursive: true, createmountpoint: true, ..Default::default() });
        let binds = binds_of(&spec(vec![ro])).unwrap();
        assert_eq!(
            binds,
            vec![Bind {
                source: "/srv/a".into(),
                target: "/data".into(),
                readonly: true,
                non_recursive: true,
                create_target: true
            }]
        );
        let refused = |m: Mount, fragment: &str| {
            let why = binds_of(&spec(vec![bind("/srv/ok", "/ok"), m])).unwrap_err();
            assert!(why.contains(fragment), "{why:?} should contain {fragment:?}");
        };
        let typed = |t: mount::Type| Mount { r#type: t as i32, ..bind("vol", "/v") };
        refused(typed(mount::Type::Volume), "a volume mount (target /v) needs a container engine");
        refused(typed(mount::Type::Tmpfs), "a tmpfs mount (target /v) needs a container engine");
        refused(bind("relative", "/x"), "absolute paths");
        refused(bind("/x", "y"), "absolute paths");
        let with = |o: BindOptions| Mount { bind_options: Some(o), ..bind("/s", "/t") };
        let shared =
            BindOptions { propagation: mount::bind_options::Propagation::Rshared as i32, ..Default::default() };
        refused(with(shared), "bind propagation rshared (target /t) needs a container engine");
        refused(with(BindOptions { readonlyforcerecursive: true, ..Default::default() }), "ReadOnlyForceRecursive");
    }

    #[test]
    fn a_missing_target_is_refused_unless_asked_for_and_kinds_must_match() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("src");
        std::fs::create_dir(&source).unwrap();
        let b = |target: &Path, create_target: bool| Bind {
            source: source.clone(),
            target: target.to_path_buf(),
            readonly: false,
            non_recursive: false,
            create_target,
        };
        let missing = dir.path().join("a/b");
        let why = check(&[b(&missing, false)]).unwrap_err();
        assert!(why.contains("does not exist on this node") && why.contains("bind-create-mountpoint"), "{why}");
        assert!(!missing.exists(), "nothing made when not asked");
        check(&[b(&missing, true)]).unwrap();
        assert!(missing.is_dir());
        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        assert!(check(&[b(&file, false)]).unwrap_err().contains("not both directories or both files"));
        let gone = Bind { source: dir.path().join("gone"), ..b(&missing, false) };
        assert!(check(&[gone]).unwrap_err().contains("is not on this node"));
    }
}
