//! What the Docker Engine does differently by the API version a request names (`request::ApiVersion`), for
//! the endpoints Shoal routes, as moby's swarm and system routers do it (`adjustForAPIVersion` and the
//! `versions.LessThan` checks around it). Request fields newer than the version asked for are dropped before
//! the spec is used (a client of that version cannot have meant them); answers leave out or fill in what
//! that version's clients expect. docs/engine-api.md lists every difference, those applied and those that do
//! not apply to what Shoal serves.
//!
//! Must not depend on the store, Raft or the executors.

use crate::json::{InfoJson, ServiceSpecJson};
use crate::request::ApiVersion;

/// Which write a service spec comes with (the engine drops `Healthcheck.StartInterval` below 1.44 on create
/// only; its update path does not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecWrite {
    /// `POST /services/create`.
    Create,
    /// `POST /services/{id}/update`.
    Update,
}

/// Drops from `spec` what API version `v` did not have, as the engine does before converting it.
pub fn adjust_service_spec(v: ApiVersion, spec: &mut ServiceSpecJson, write: SpecWrite) {
    let t = &mut spec.task_template;
    if v.less_than(1, 40) {
        // Placement.MaxReplicas and ContainerSpec.Sysctls came with 1.40.
        if let Some(p) = t.placement.as_mut() {
            p.max_replicas = 0;
        }
        if let Some(c) = t.container_spec.as_mut() {
            c.sysctls.clear();
            // So did the Runtime target of a config reference.
            for r in &mut c.configs {
                r.runtime = serde_json::Value::Null;
            }
        }
    }
    if v.less_than(1, 41) {
        // Capabilities, Ulimits, Limits.Pids and the job modes came with 1.41. A job-mode spec of an older
        // client is left with no mode, which the engine then reads as one replica.
        if let Some(c) = t.container_spec.as_mut() {
            c.capability_add.clear();
            c.capability_drop.clear();
            c.ulimits.clear();
        }
        if let Some(l) = t.resources.as_mut().and_then(|r| r.limits.as_mut()) {
            l.pids = 0;
        }
        spec.mode.replicated_job = None;
        spec.mode.global_job = None;
    }
    if v.less_than(1, 44) && write == SpecWrite::Create {
        // Healthcheck.StartInterval came with 1.44.
        if let Some(h) = t.container_spec.as_mut().and_then(|c| c.healthcheck.as_mut()) {
            h.start_interval = None;
        }
    }
    if v.less_than(1, 44) {
        // Seccomp, AppArmor and NoNewPrivileges (in Privileges) came with 1.44.
        if let Some(p) = t.container_spec.as_mut().and_then(|c| c.privileges.as_mut()) {
            p.seccomp = None;
            p.apparmor = None;
            p.no_new_privileges = false;
        }
    }
}

/// `POST /secrets/create` and `/configs/create` below 1.37 refuse a `Templating` member (any but `null`), as
/// the engine does; `kind` is "secret" or "config".
pub fn refuse_templating_before_1_37(v: ApiVersion, kind: &str, has_templating: bool) -> Result<(), String> {
    if has_templating && v.less_than(1, 37) {
        return Err(format!("{kind} templating is not supported on the specified API version: {}.{}", v.0, v.1));
    }
    Ok(())
}

/// Whether `GET /services` honours its `status` parameter at version `v` (1.41 on; older ones ignore it,
/// unparsed).
pub fn services_status_param_read(v: ApiVersion) -> bool {
    !v.less_than(1, 41)
}

/// `GET /info` as version `v` shows it: below 1.39 an empty kernel version or operating system reads
/// `<unknown>`; below 1.25 the answer also has `ExecutionDriver: "<not supported>"` (and security options
/// by name only, which Shoal's empty list already is).
pub fn adjust_info(v: ApiVersion, info: &mut InfoJson) {
    if v.less_than(1, 39) {
        for field in [&mut info.kernel_version, &mut info.operating_system] {
            if field.is_empty() {
                *field = "<unknown>".into();
            }
        }
    }
    if v.less_than(1, 25) {
        info.execution_driver = Some("<not supported>".into());
    }
}

/// The `Content-Type` of a log stream at version `v`: frames with a stream header (no TTY) are
/// `application/vnd.docker.multiplexed-stream` from 1.42 on; before, and for TTY output, the engine says
/// `application/vnd.docker.raw-stream` (the bytes are the same).
pub fn log_stream_content_type(v: ApiVersion, tty: bool) -> &'static str {
    if !tty && !v.less_than(1, 42) {
        "application/vnd.docker.multiplexed-stream"
    } else {
        "application/vnd.docker.raw-stream"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_by_version() {
        // (version, kernel and OS as found, what the answer shows, ExecutionDriver)
        let unknown = "<unknown>";
        for (v, found, shown, driver) in [
            (ApiVersion(1, 24), "", unknown, Some("<not supported>")),
            (ApiVersion(1, 38), "", unknown, None),
            (ApiVersion(1, 39), "", "", None),
            (ApiVersion(1, 38), "6.1", "6.1", None),
        ] {
            let mut info =
                InfoJson { kernel_version: found.into(), operating_system: found.into(), ..Default::default() };
            adjust_info(v, &mut info);
            assert_eq!((info.kernel_version.as_str(), info.operating_system.as_str()), (shown, shown), "{v:?}");
            assert_eq!(info.execution_driver.as_deref(), driver, "{v:?}");
        }
    }

    #[test]
    fn log_stream_types_by_version() {
        let (raw, mux) = ("application/vnd.docker.raw-stream", "application/vnd.docker.multiplexed-stream");
        for (v, tty, want) in [
            (ApiVersion(1, 41), false, raw),
            (ApiVersion(1, 42), false, mux),
            (ApiVersion(1, 47), false, mux),
            (ApiVersion(1, 47), true, raw),
            (ApiVersion(1, 24), true, raw),
        ] {
            assert_eq!(log_stream_content_type(v, tty), want, "{v:?} tty {tty}");
        }
    }
}
