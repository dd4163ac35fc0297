//! The `ServiceSpec` fields a client may send that Shoal cannot honour yet, refused with a 400 naming the field
//! (`X is not supported yet: why`) rather than accepted and dropped. A field counts as sent when it holds
//! anything but its zero value (`null`, `""`, `0`, `false`, `[]`, or an object of zero values), so what the
//! docker CLI and the SDKs send by default (`"Privileges": {"CredentialSpec": null, ...}`, `"Isolation":
//! "default"`) goes through. Fields Shoal honours on one executor but not the other (mounts, limits on the
//! process executor) are not refused here: the API does not know where tasks will run.
//!
//! Must not depend on HTTP or the store.

use serde_json::Value;

use super::common::ConvertError;
use super::spec::ServiceSpecJson;

/// Whether `v` holds anything but a zero value.
fn is_set(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => o.values().any(is_set),
    }
}

/// `v` set to something other than `""` or "default" (Isolation, Consistency).
fn is_set_beyond_default(v: &Value) -> bool {
    is_set(v) && v.as_str().is_none_or(|s| !s.eq_ignore_ascii_case("default"))
}

/// The first field of `spec` Shoal cannot honour, with why, as the 400 the client gets.
pub fn refuse_unsupported(spec: &ServiceSpecJson) -> Result<(), ConvertError> {
    let t = &spec.task_template;
    let mut checks: Vec<(String, bool, &str)> = vec![
        (
            "TaskTemplate.PluginSpec".into(),
            is_set(&t.plugin_spec),
            "plugin services are not run by Shoal; use a container spec",
        ),
        (
            "TaskTemplate.NetworkAttachmentSpec".into(),
            is_set(&t.network_attachment_spec),
            "network attachment tasks are not run by Shoal; use a container spec",
        ),
    ];
    if let Some(r) = &t.resources {
        let limits = r.limits.as_ref();
        let reservations = r.reservations.as_ref();
        checks.push((
            "TaskTemplate.Resources.Limits.GenericResources".into(),
            limits.is_some_and(|l| !l.generic_resources.is_empty()),
            "generic resources are reserved, not limited (the engine has no limit for them either); set them under \
             Reservations",
        ));
        checks.push((
            "TaskTemplate.Resources.Reservations.Pids".into(),
            reservations.is_some_and(|r| r.pids != 0),
            "a process count is a limit, not a reservation; set it under Limits",
        ));
    }
    if let Some(c) = &t.container_spec {
        checks.push((
            "TaskTemplate.ContainerSpec.Privileges.CredentialSpec".into(),
            c.privileges.as_ref().is_some_and(|p| is_set(&p.credential_spec)),
            "credential specs are for Windows containers (gMSA); a Linux engine refuses them too (Docker's Linux \
             engine rejects the task with `invalid --security-opt 2: \"credentialspec=...\"`); leave it out",
        ));
        for (i, r) in c.configs.iter().enumerate() {
            checks.push((
                format!("TaskTemplate.ContainerSpec.Configs[{i}].Runtime"),
                // `{}` is the set value: the runtime target has no fields.
                !r.runtime.is_null(),
                "runtime targets carry Windows credential specs (Privileges.CredentialSpec.Config); use a File target",
            ));
        }
        checks.push((
            "TaskTemplate.ContainerSpec.Isolation".into(),
            is_set_beyond_default(&c.isolation),
            "Linux has only the default isolation; leave it out",
        ));
        for (i, m) in c.mounts.iter().enumerate() {
            checks.push((
                format!("TaskTemplate.ContainerSpec.Mounts[{i}].ClusterOptions"),
                is_set(&m.cluster_options),
                "cluster (CSI) volumes need a CSI plugin, which Shoal's executors do not drive; use a volume mount",
            ));
        }
    }
    match checks.into_iter().find(|(_, set, _)| *set) {
        Some((field, _, why)) => Err(ConvertError(format!("{field} is not supported yet: {why}"))),
        None => Ok(()),
    }
}
