//! What a plain process can have of a container's security and resource settings, applied between fork and
//! exec: `Ulimits` (setrlimit), `OomScoreAdj` (`/proc/self/oom_score_adj`), `Privileges.NoNewPrivileges`
//! (prctl), `CapabilityDrop` (dropped from the bounding and inheritable sets, so the process and its children
//! never regain them) and `CapabilityAdd` (a process has the daemon's capabilities: each asked for must be in
//! the daemon's effective set, else the task is rejected). A seccomp profile or AppArmor left unconfined is
//! what a process already has when the daemon runs unconfined (checked); custom seccomp profiles and SELinux
//! labels are not a process's to have, and reject the task naming them.
//!
//! `ProcessLimits::from_spec` checks everything and prepares every value before the fork; the `pre_exec`
//! closure makes system calls only. Must not depend on the session or gRPC.

use shoal_api::privileges::{app_armor_opts::AppArmorMode, seccomp_opts::SeccompMode};
use shoal_api::ContainerSpec;

/// Linux capability names (without `CAP_`), by number.
const CAPABILITIES: [&str; 41] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// `CAP_SETPCAP`: needed to drop from the bounding set, so dropped last.
const CAP_SETPCAP: u32 = 8;

/// The `ulimit` names Docker accepts, with their resource.
const RLIMITS: [(&str, libc::__rlimit_resource_t); 16] = [
    ("as", libc::RLIMIT_AS),
    ("core", libc::RLIMIT_CORE),
    ("cpu", libc::RLIMIT_CPU),
    ("data", libc::RLIMIT_DATA),
    ("fsize", libc::RLIMIT_FSIZE),
    ("locks", libc::RLIMIT_LOCKS),
    ("memlock", libc::RLIMIT_MEMLOCK),
    ("msgqueue", libc::RLIMIT_MSGQUEUE),
    ("nice", libc::RLIMIT_NICE),
    ("nofile", libc::RLIMIT_NOFILE),
    ("nproc", libc::RLIMIT_NPROC),
    ("rss", libc::RLIMIT_RSS),
    ("rtprio", libc::RLIMIT_RTPRIO),
    ("rttime", libc::RLIMIT_RTTIME),
    ("sigpending", libc::RLIMIT_SIGPENDING),
    ("stack", libc::RLIMIT_STACK),
];

/// The capability numbers `names` stand for (`NET_ADMIN`, `CAP_NET_ADMIN`, any case; `ALL`: every one).
pub(crate) fn capability_numbers(names: &[String], field: &str) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    for n in names {
        let upper = n.to_ascii_uppercase();
        let bare = upper.strip_prefix("CAP_").unwrap_or(&upper);
        if bare == "ALL" {
            return Ok((0u32..).zip(CAPABILITIES).map(|(i, _)| i).collect());
        }
        match (0u32..).zip(CAPABILITIES).find(|(_, c)| *c == bare) {
            Some((i, _)) => out.push(i),
            None => return Err(format!("{field}: unknown capability {n:?}")),
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// A hexadecimal capability mask of /proc/<pid>/status (`CapEff:\t000001ffffffffff`).
pub(crate) fn status_mask(status: &str, key: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?;
    u64::from_str_radix(line.trim(), 16).ok()
}

/// What a process task gets of its container spec's limits and privileges, ready for `pre_exec`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ProcessLimits {
    /// (resource, soft, hard).
    rlimits: Vec<(libc::__rlimit_resource_t, u64, u64)>,
    /// `oom_score_adj` as the bytes to write.
    oom_score_adj: Option<Vec<u8>>,
    no_new_privileges: bool,
    /// Capabilities to drop, `CAP_SETPCAP` last.
    drop: Vec<u32>,
}

impl ProcessLimits {
    /// Checks `c` against what a plain process can have (`daemon_status`: the daemon's /proc/self/status;
    /// `apparmor`: its /proc/self/attr/current, if any); `Err` names what it cannot, as the task's rejection.
    pub(crate) fn from_spec(
        c: &ContainerSpec,
        daemon_status: &str,
        apparmor: Option<&str>,
    ) -> Result<ProcessLimits, String> {
        let mut limits = ProcessLimits::default();
        for u in &c.ulimits {
            let resource = RLIMITS
                .iter()
                .find(|(n, _)| *n == u.name)
                .map(|(_, r)| *r)
                .ok_or_else(|| format!("ContainerSpec.Ulimits: invalid ulimit type: {}", u.name))?;
            if u.soft < 0 || u.hard < 0 || u.soft > u.hard {
                return Err(format!(
                    "ContainerSpec.Ulimits: ulimit {}: soft limit {} must be between 0 and the hard limit {}",
                    u.name, u.soft, u.hard
                ));
            }
            limits.rlimits.push((resource, u.soft as u64, u.hard as u64));
        }
        if c.oom_score_adj != 0 {
            if !(-1000..=1000).contains(&c.oom_score_adj) {
                return Err(format!(
                    "ContainerSpec.OomScoreAdj: {} is outside -1000..1000, the kernel's range",
                    c.oom_score_adj
                ));
            }
            limits.oom_score_adj = Some(c.oom_score_adj.to_string().into_bytes());
        }
        let effective = status_mask(daemon_status, "CapEff").unwrap_or(0);
        let missing: Vec<String> = capability_numbers(&c.capability_add, "ContainerSpec.CapabilityAdd")?
            .into_iter()
            .filter(|n| effective & (1 << n) == 0)
            .map(|n| format!("CAP_{}", CAPABILITIES[n as usize]))
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "ContainerSpec.CapabilityAdd: a process task has the daemon's capabilities, and the daemon does not \
                 hold {} (run the daemon as root, or use the docker executor)",
                missing.join(", ")
            ));
        }
        let mut drop = capability_numbers(&c.capability_drop, "ContainerSpec.CapabilityDrop")?;
        // Dropping from the bounding set needs CAP_SETPCAP: it goes last.
        if let Some(i) = drop.iter().position(|n| *n == CAP_SETPCAP) {
            drop.remove(i);
            drop.push(CAP_SETPCAP);
        }
        if !drop.is_empty() && effective & (1 << CAP_SETPCAP) == 0 {
            return Err(
                "ContainerSpec.CapabilityDrop: the daemon lacks CAP_SETPCAP, which dropping a process's capabilities \
                 needs (run the daemon as root, or use the docker executor)"
                    .into(),
            );
        }
        limits.drop = drop;
        if let Some(p) = &c.privileges {
            limits.no_new_privileges = p.no_new_privileges;
            if p.selinux_context.as_ref().is_some_and(|s| *s != Default::default()) {
                return Err("Privileges.SELinuxContext: a process task runs in the daemon's SELinux context; use the \
                            docker executor for labels"
                    .into());
            }
            match p.seccomp.as_ref().map(|s| s.mode()) {
                Some(SeccompMode::Custom) => {
                    return Err("Privileges.Seccomp: a process task gets no seccomp filter, and a custom profile \
                                needs the container runtime; use the docker executor"
                        .into())
                }
                Some(SeccompMode::Unconfined) if status_mask(daemon_status, "Seccomp").is_some_and(|m| m != 0) => {
                    return Err("Privileges.Seccomp: unconfined asked for, but the daemon itself runs under a seccomp \
                                filter its processes inherit"
                        .into())
                }
                _ => {}
            }
            let disabled = p.apparmor.as_ref().is_some_and(|a| a.mode() == AppArmorMode::Disabled);
            if disabled && apparmor.is_some_and(|a| !a.trim().is_empty() && a.trim() != "unconfined") {
                return Err(format!(
                    "Privileges.AppArmor: disabled asked for, but the daemon runs confined by {:?}, which its \
                     processes inherit",
                    apparmor.unwrap_or_default().trim()
                ));
            }
        }
        Ok(limits)
    }

    /// Nothing to apply.
    pub(crate) fn is_empty(&self) -> bool {
        *self == ProcessLimits::default()
    }

    /// Applies the limits in `cmd`'s child, between fork and exec.
    #[allow(unsafe_code)]
    pub(crate) fn apply(self, cmd: &mut std::process::Command) {
        use std::os::unix::process::CommandExt;
        if self.is_empty() {
            return;
        }
        let path = c"/proc/self/oom_score_adj";
        // SAFETY: the closure runs in the forked child before exec; it only makes system calls (setrlimit,
        // open, write, close, prctl, capget, capset) on values prepared before the fork, and allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                let last_err = std::io::Error::last_os_error;
                for (resource, soft, hard) in &self.rlimits {
                    let limit = libc::rlimit { rlim_cur: *soft as libc::rlim_t, rlim_max: *hard as libc::rlim_t };
                    if libc::setrlimit(*resource, &limit) != 0 {
                        return Err(last_err());
                    }
                }
                if let Some(score) = &self.oom_score_adj {
                    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(last_err());
                    }
                    let n = libc::write(fd, score.as_ptr().cast(), score.len());
                    libc::close(fd);
                    if n != score.len() as isize {
                        return Err(last_err());
                    }
                }
                if !self.drop.is_empty() {
                    // Out of the inheritable set first (and so the ambient one): for root, exec gives the
                    // process inheritable | bounding.
                    let mut header = CapHeader { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
                    let mut data = [CapData::default(); 2];
                    if libc::syscall(libc::SYS_capget, &mut header as *mut CapHeader, data.as_mut_ptr()) != 0 {
                        return Err(last_err());
                    }
                    for n in &self.drop {
                        data[(*n / 32) as usize].inheritable &= !(1 << (n % 32));
                    }
                    if libc::syscall(libc::SYS_capset, &mut header as *mut CapHeader, data.as_ptr()) != 0 {
                        return Err(last_err());
                    }
                    for n in &self.drop {
                        if libc::prctl(libc::PR_CAPBSET_DROP, *n as libc::c_ulong, 0, 0, 0) != 0 {
                            // A capability the kernel does not know (older than the list): nothing to drop.
                            if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
                                return Err(last_err());
                            }
                        }
                    }
                }
                if self.no_new_privileges && libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    return Err(last_err());
                }
                Ok(())
            });
        }
    }
}

/// `_LINUX_CAPABILITY_VERSION_3`: 64-bit capability sets in two words.
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_api::{container_spec::Ulimit, privileges, Privileges};

    const ROOT: &str = "Name:\tx\nCapEff:\t000001ffffffffff\nCapBnd:\t000001ffffffffff\nSeccomp:\t0\n";
    const USER: &str = "Name:\tx\nCapEff:\t0000000000000000\nCapBnd:\t000001ffffffffff\nSeccomp:\t0\n";

    fn check(c: ContainerSpec, status: &str, want_err: Option<&str>) {
        match (ProcessLimits::from_spec(&c, status, None), want_err) {
            (Ok(_), None) => {}
            (Err(e), Some(w)) => assert!(e.contains(w), "{e} does not name {w}"),
            (got, want) => panic!("{c:?}: got {got:?}, wanted an error naming {want:?}"),
        }
    }

    #[test]
    fn what_a_process_can_have_is_accepted_and_the_rest_named() {
        let ulimit = |name: &str, soft, hard| ContainerSpec {
            ulimits: vec![Ulimit { name: name.into(), soft, hard }],
            ..Default::default()
        };
        let caps = |add: &[&str], drop: &[&str]| ContainerSpec {
            capability_add: add.iter().map(|s| s.to_string()).collect(),
            capability_drop: drop.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let privs = |p: Privileges| ContainerSpec { privileges: Some(p), ..Default::default() };
        let seccomp = |mode: privileges::seccomp_opts::SeccompMode| {
            let mut s = privileges::SeccompOpts::default();
            s.set_mode(mode);
            privs(Privileges { seccomp: Some(s), ..Default::default() })
        };
        for (spec, status, err) in [
            (ulimit("nofile", 100, 200), ROOT, None),
            (ulimit("files", 100, 200), ROOT, Some("invalid ulimit type: files")),
            (ulimit("nofile", 300, 200), ROOT, Some("hard limit 200")),
            (ContainerSpec { oom_score_adj: 500, ..Default::default() }, ROOT, None),
            (ContainerSpec { oom_score_adj: 5000, ..Default::default() }, ROOT, Some("OomScoreAdj")),
            (caps(&["NET_ADMIN", "cap_sys_time"], &["CHOWN", "SETPCAP"]), ROOT, None),
            (caps(&["NET_ADMIN"], &[]), USER, Some("does not hold CAP_NET_ADMIN")),
            (caps(&[], &["CHOWN"]), USER, Some("CAP_SETPCAP")),
            (caps(&["FLY"], &[]), ROOT, Some("unknown capability \"FLY\"")),
            (privs(Privileges { no_new_privileges: true, ..Default::default() }), USER, None),
            (seccomp(privileges::seccomp_opts::SeccompMode::Unconfined), ROOT, None),
            (seccomp(privileges::seccomp_opts::SeccompMode::Custom), ROOT, Some("Privileges.Seccomp")),
            (
                privs(Privileges {
                    selinux_context: Some(privileges::SeLinuxContext { level: "s0".into(), ..Default::default() }),
                    ..Default::default()
                }),
                ROOT,
                Some("Privileges.SELinuxContext"),
            ),
        ] {
            check(spec, status, err);
        }
        let l = ProcessLimits::from_spec(&caps(&[], &["setpcap", "chown", "all"]), ROOT, None).unwrap();
        assert_eq!(l.drop.len(), CAPABILITIES.len());
        assert_eq!(l.drop.last(), Some(&CAP_SETPCAP), "SETPCAP dropped last");
    }
}
