//! A service's references to secrets and configs (`ContainerSpec.secrets` / `configs`): their shape, checked
//! with the rest of the spec (SwarmKit's `validateSecretRefsSpec` / `validateConfigRefsSpec`: a file target
//! with a name, no two references of a kind on one target), and their existence, checked in the write that
//! stores the service (SwarmKit's `checkSecretExistence` / `checkConfigExistence`: an unknown one is a 400
//! naming it). Where SwarmKit requires both the ID and the name (the docker CLI sends both), Shoal takes either
//! and fills in the other from the store; with both, they must name the same object.
//!
//! Beyond SwarmKit, each within `limits`: at most `MAX_REFERENCES_PER_SERVICE` references of a kind, target
//! names of at most `MAX_TARGET_NAME_BYTES` without NUL bytes or `..` components (a target stays inside the
//! task's secrets directory or the container), numeric `UID` / `GID`, permission bits only in `Mode`, and no
//! `Runtime` target (it carries Windows credential specs, which Shoal has no use for).
//!
//! Must not depend on HTTP or JSON.

use std::collections::HashMap;

use shoal_api::{config_reference, secret_reference, ContainerSpec, FileTarget};
use shoal_store::Tables;

use super::ControlError;
use crate::limits::{invalid, MAX_REFERENCES_PER_SERVICE, MAX_TARGET_NAME_BYTES};

/// Names of the services whose container spec `uses` (the current spec; a previous spec is not run unless
/// rolled back to, which checks its references again), sorted.
pub(crate) fn services_using(t: &Tables, uses: impl Fn(&ContainerSpec) -> bool) -> Vec<String> {
    let mut names: Vec<String> = t
        .services()
        .iter()
        .filter(|s| {
            s.spec
                .as_ref()
                .and_then(|s| s.task.as_ref())
                .and_then(|t| t.runtime.as_ref())
                .and_then(|r| match r {
                    shoal_api::task_spec::Runtime::Container(c) => Some(c),
                    shoal_api::task_spec::Runtime::Attachment(_) => None,
                })
                .is_some_and(&uses)
        })
        .map(|s| s.spec.as_ref().and_then(|s| s.annotations.as_ref()).map(|a| a.name.clone()).unwrap_or_default())
        .collect();
    names.sort();
    names
}

fn validate_file(field: &str, kind: &str, f: &FileTarget) -> Result<(), ControlError> {
    if f.name.is_empty() {
        return Err(invalid(format!(
            "{field}.File.Name: malformed file {kind} reference, invalid target file name provided"
        )));
    }
    if f.name.len() > MAX_TARGET_NAME_BYTES {
        return Err(invalid(format!(
            "{field}.File.Name is {} bytes long, over the limit of {MAX_TARGET_NAME_BYTES} bytes",
            f.name.len()
        )));
    }
    if f.name.contains('\0') {
        return Err(invalid(format!("{field}.File.Name must not contain a NUL byte")));
    }
    if f.name.split('/').any(|c| c == "..") {
        return Err(invalid(format!(
            "{field}.File.Name {:?} must not contain a '..' component: a target stays where the {kind}s of the task \
             are put",
            f.name
        )));
    }
    for (what, v) in [("UID", &f.uid), ("GID", &f.gid)] {
        if !v.is_empty() && v.parse::<u32>().is_err() {
            return Err(invalid(format!("{field}.File.{what} {v:?} is not a numeric ID (e.g. \"0\")")));
        }
    }
    if f.mode > 0o777 {
        return Err(invalid(format!(
            "{field}.File.Mode {:#o} has bits beyond the permission bits (0777); use e.g. 0444",
            f.mode
        )));
    }
    Ok(())
}

/// One reference's parts, whatever its kind.
struct Ref<'a> {
    id: &'a str,
    name: &'a str,
    file: Option<&'a FileTarget>,
    runtime: bool,
}

fn validate_refs<'a>(
    kind: &str,
    field: &str,
    refs: impl ExactSizeIterator<Item = Ref<'a>>,
) -> Result<(), ControlError> {
    if refs.len() > MAX_REFERENCES_PER_SERVICE {
        return Err(invalid(format!(
            "{field}: {} {kind} references, over the limit of {MAX_REFERENCES_PER_SERVICE}",
            refs.len()
        )));
    }
    let mut targets: HashMap<&str, &str> = HashMap::new();
    for (i, r) in refs.enumerate() {
        let field = format!("{field}[{i}]");
        if r.id.is_empty() && r.name.is_empty() {
            return Err(invalid(format!("{field}: malformed {kind} reference: give the {kind}'s ID or name")));
        }
        if r.runtime {
            return Err(invalid(format!(
                "{field}.Runtime is not supported: runtime targets carry Windows credential specs; use a File target"
            )));
        }
        let Some(f) = r.file else {
            return Err(invalid(format!("{field}: malformed {kind} reference, no target provided: set File")));
        };
        validate_file(&field, kind, f)?;
        let this = if r.name.is_empty() { r.id } else { r.name };
        if let Some(prev) = targets.insert(f.name.as_str(), this) {
            return Err(invalid(format!(
                "{field}: {kind} references '{prev}' and '{this}' have a conflicting target: '{}'",
                f.name
            )));
        }
    }
    Ok(())
}

/// The shape of a container spec's secret and config references (no store access).
pub(super) fn validate_references(c: &ContainerSpec) -> Result<(), ControlError> {
    validate_refs(
        "secret",
        "ContainerSpec.Secrets",
        c.secrets.iter().map(|r| Ref {
            id: &r.secret_id,
            name: &r.secret_name,
            file: match &r.target {
                Some(secret_reference::Target::File(f)) => Some(f),
                None => None,
            },
            runtime: false,
        }),
    )?;
    validate_refs(
        "config",
        "ContainerSpec.Configs",
        c.configs.iter().map(|r| Ref {
            id: &r.config_id,
            name: &r.config_name,
            file: match &r.target {
                Some(config_reference::Target::File(f)) => Some(f),
                _ => None,
            },
            runtime: matches!(r.target, Some(config_reference::Target::Runtime(_))),
        }),
    )
}

/// Looks one reference up: by ID (whose name must then match the one given, if any), else by name (names
/// are unique ignoring case: the stored spelling is kept); fills in the part that was not given. False when
/// nothing matches.
fn resolve_one<'a>(
    id: &mut String,
    name: &mut String,
    by_id: impl Fn(&str) -> Option<&'a str>,
    by_name: impl Fn(&str) -> Option<(&'a str, &'a str)>,
) -> bool {
    if !id.is_empty() {
        match by_id(id) {
            Some(n) if name.is_empty() || n == name => {
                *name = n.to_string();
                true
            }
            _ => false,
        }
    } else {
        match by_name(name) {
            Some((found_id, found_name)) => {
                *id = found_id.to_string();
                *name = found_name.to_string();
                true
            }
            None => false,
        }
    }
}

fn not_found(kind: &str, missing: &[String]) -> ControlError {
    let noun = if missing.len() == 1 { kind.to_string() } else { format!("{kind}s") };
    invalid(format!(
        "{noun} not found: {} (create it first with `docker {kind} create`, or check the name and ID)",
        missing.join(", ")
    ))
}

/// Checks that every secret and config `c` references exists in `t`, filling in missing IDs or names.
/// An unknown one is a 400 naming it.
pub(super) fn resolve_references(t: &Tables, c: &mut ContainerSpec) -> Result<(), ControlError> {
    let name_of_secret =
        |id: &str| t.secrets().get(id).and_then(|s| s.spec.as_ref()?.annotations.as_ref()).map(|a| a.name.as_str());
    let secret_by_name = |n: &str| {
        let s = t.secrets().by_name(n)?;
        Some((s.id.as_str(), s.spec.as_ref()?.annotations.as_ref()?.name.as_str()))
    };
    let mut missing = Vec::new();
    for r in &mut c.secrets {
        let shown = if r.secret_name.is_empty() { r.secret_id.clone() } else { r.secret_name.clone() };
        if !resolve_one(&mut r.secret_id, &mut r.secret_name, name_of_secret, secret_by_name) {
            missing.push(shown);
        }
    }
    if !missing.is_empty() {
        return Err(not_found("secret", &missing));
    }
    let name_of_config =
        |id: &str| t.configs().get(id).and_then(|s| s.spec.as_ref()?.annotations.as_ref()).map(|a| a.name.as_str());
    let config_by_name = |n: &str| {
        let c = t.configs().by_name(n)?;
        Some((c.id.as_str(), c.spec.as_ref()?.annotations.as_ref()?.name.as_str()))
    };
    for r in &mut c.configs {
        let shown = if r.config_name.is_empty() { r.config_id.clone() } else { r.config_name.clone() };
        if !resolve_one(&mut r.config_id, &mut r.config_name, name_of_config, config_by_name) {
            missing.push(shown);
        }
    }
    if !missing.is_empty() {
        return Err(not_found("config", &missing));
    }
    Ok(())
}
