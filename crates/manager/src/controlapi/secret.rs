//! Secrets: create, lookup (ID, name, unique ID prefix), list with filters, label updates (compare-and-swap on
//! the version the caller read) and removal, with SwarmKit's Control API rules (`manager/controlapi/secret.go`):
//! names of at most 64 `[a-zA-Z0-9-_.]` characters starting and ending with a letter or digit and unique among
//! secrets, data of 1 byte up to `MAX_SECRET_DATA_BYTES` (exclusive), only the labels changeable, removal
//! refused while a service references the secret (the message names the services). Shoal also refuses what it
//! cannot honour: a secret `Driver` (external secret stores are plugins, which Shoal does not run) and a
//! templating driver other than `golang`.
//!
//! A secret's data never leaves this module in a read: `get_secret`, `list_secrets`, `create_secret` and
//! `update_secret` return the secret with its data cleared, and no error message or log line carries it (the
//! generated `SecretSpec` has a `Debug` that prints only the data's length). Only the dispatcher reads the data,
//! from the store, to send it to the nodes whose tasks use it.
//!
//! The rules shared with configs (names, labels, templating, the in-use message) live here too.
//!
//! Must not depend on HTTP or JSON.

use std::collections::HashMap;
use std::sync::Arc;

use shoal_api::{Annotations, Driver, Secret, SecretSpec};
use shoal_store::{Changes, StoreObject, Tables};
use subtle::ConstantTimeEq;

use super::references::services_using;
use super::{any_prefix, labels_match, resolve, ControlError};
use crate::limits::{invalid, MAX_SECRET_DATA_BYTES, MAX_SECRET_LABEL_BYTES, MAX_SECRET_NAME_LEN};
use crate::state::ClusterState;

/// The only templating driver there is (Go's `text/template` syntax, as SwarmKit's `template` package).
pub const TEMPLATING_DRIVER: &str = "golang";

/// Which secrets (or configs: `ConfigFilters`) to list, as SwarmKit's `ListSecretsRequest.Filters`: an object
/// matches when it matches any of the names, name prefixes and ID prefixes (or when none is given), and has
/// every label.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretFilters {
    /// Exact names (`names`).
    pub names: Vec<String>,
    /// Name prefixes (`name`).
    pub name_prefixes: Vec<String>,
    /// ID prefixes (`id`).
    pub id_prefixes: Vec<String>,
    /// `key` or `key=value` labels; all must match.
    pub labels: Vec<String>,
}

impl SecretFilters {
    pub(super) fn matches(&self, id: &str, annotations: Option<&Annotations>) -> bool {
        let name = annotations.map(|a| a.name.as_str()).unwrap_or("");
        let unfiltered = self.names.is_empty() && self.name_prefixes.is_empty() && self.id_prefixes.is_empty();
        let by_name_or_id = unfiltered
            || self.names.iter().any(|n| n == name)
            || (!self.name_prefixes.is_empty() && any_prefix(&self.name_prefixes, name))
            || (!self.id_prefixes.is_empty() && any_prefix(&self.id_prefixes, id));
        let empty = HashMap::new();
        by_name_or_id && labels_match(annotations.map(|a| &a.labels).unwrap_or(&empty), &self.labels)
    }
}

/// SwarmKit's rule for secret and config names (not the service-name rule: dots are allowed).
pub(super) fn validate_name(kind: &str, name: &str) -> Result<(), ControlError> {
    if name.is_empty() {
        return Err(invalid(format!("Name: a {kind} name must be provided")));
    }
    let bytes = name.as_bytes();
    let ok_char = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.');
    let valid = name.len() <= MAX_SECRET_NAME_LEN
        && bytes.iter().all(ok_char)
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric();
    if !valid {
        return Err(invalid(format!(
            "Name: invalid {kind} name {name:?}: only {MAX_SECRET_NAME_LEN} [a-zA-Z0-9-_.] characters allowed, and \
             the start and end character must be [a-zA-Z0-9]"
        )));
    }
    Ok(())
}

/// The bytes of a string map's keys and values.
pub(super) fn map_bytes(m: &HashMap<String, String>) -> usize {
    m.iter().map(|(k, v)| k.len() + v.len()).sum()
}

/// The labels of a secret or config spec, within their bound.
pub(super) fn validate_labels(kind: &str, a: Option<&Annotations>) -> Result<(), ControlError> {
    let labels = a.map(|a| map_bytes(&a.labels)).unwrap_or(0);
    if labels > MAX_SECRET_LABEL_BYTES {
        return Err(invalid(format!(
            "Labels: the {kind}'s labels are {labels} bytes, over the limit of {MAX_SECRET_LABEL_BYTES} bytes"
        )));
    }
    Ok(())
}

/// The name and labels of a secret or config spec, within their bounds.
pub(super) fn validate_annotations(kind: &str, a: Option<&Annotations>) -> Result<(), ControlError> {
    validate_name(kind, a.map(|a| a.name.as_str()).unwrap_or(""))?;
    validate_labels(kind, a)
}

/// `Templating`: none, or the `golang` driver without options, over a template every rendering can
/// render: one that calls itself, nests too deep or would take too many steps (`shoal_template::check`) is
/// refused here rather than rejecting every task that uses it. Syntax is left to the rendering, as Docker
/// does (the task is then rejected with the engine's message).
pub(super) fn validate_templating(kind: &str, t: Option<&Driver>, data: &[u8]) -> Result<(), ControlError> {
    let Some(t) = t else { return Ok(()) };
    if t.name != TEMPLATING_DRIVER {
        return Err(invalid(format!(
            "Templating.Name: unknown templating driver {:?}: the only one is {TEMPLATING_DRIVER:?} (or leave \
             Templating out for a {kind} used as it is)",
            t.name
        )));
    }
    if !t.options.is_empty() {
        return Err(invalid(format!(
            "Templating.Options: the {TEMPLATING_DRIVER} templating driver takes no options; leave them out"
        )));
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Err(e @ (shoal_template::TemplateError::Recursion(_) | shoal_template::TemplateError::Limit(_))) =
            shoal_template::check(text)
        {
            return Err(invalid(format!(
                "Data: the {kind}'s golang template cannot be rendered: {e}; simplify it (templates may not call \
                 themselves)"
            )));
        }
    }
    Ok(())
}

/// The 400 of a removal refused because services reference the object (SwarmKit's message).
pub(super) fn in_use(kind: &str, name: &str, services: &[String]) -> ControlError {
    let noun = if services.len() == 1 { "service" } else { "services" };
    invalid(format!("{kind} '{name}' is in use by the following {noun}: {}", services.join(", ")))
}

/// The 400 of an update that changes anything but the labels.
pub(super) fn only_labels(kind: &str, field: &str) -> ControlError {
    invalid(format!(
        "{field}: only updates to Labels are allowed; a {kind}'s {} cannot change: create a new {kind} and update \
         the services that use this one",
        field.to_lowercase()
    ))
}

/// Secret data as short as it must be (SwarmKit's `ValidateSecretPayload`): never quoted, only measured.
fn validate_data(data: &[u8]) -> Result<(), ControlError> {
    if data.is_empty() || data.len() >= MAX_SECRET_DATA_BYTES {
        return Err(invalid(format!(
            "Data: secret data must be larger than 0 and less than {MAX_SECRET_DATA_BYTES} bytes (got {} bytes)",
            data.len()
        )));
    }
    Ok(())
}

/// Checks a secret spec: name, labels, data size, templating; a secret driver is refused (no plugins).
pub fn validate_secret_spec(spec: &SecretSpec) -> Result<(), ControlError> {
    validate_annotations("secret", spec.annotations.as_ref())?;
    if let Some(d) = &spec.driver {
        return Err(invalid(format!(
            "Driver: secret drivers are not supported: Shoal runs no plugins, so the secret {:?} cannot come from an \
             external store; leave Driver out and pass the data",
            d.name
        )));
    }
    validate_templating("secret", spec.templating.as_ref(), &spec.data)?;
    validate_data(&spec.data)
}

fn redacted(secret: &Secret) -> Secret {
    let mut s = secret.clone();
    if let Some(spec) = s.spec.as_mut() {
        spec.data = Vec::new();
    }
    s
}

pub(super) fn find<'a>(t: &'a Tables, reference: &str) -> Result<&'a Arc<Secret>, ControlError> {
    resolve("secret", reference, |id| t.secrets().get(id), |n| t.secrets().by_name(n), t.secrets().iter())
}

fn secret_name(s: &Secret) -> &str {
    s.unique_name().unwrap_or("")
}

/// Validates `spec` and creates a secret with a new ID; returns it without its data. `Conflict` when the
/// name is taken.
pub async fn create_secret(state: &ClusterState, spec: SecretSpec) -> Result<Secret, ControlError> {
    validate_secret_spec(&spec)?;
    let now = state.now();
    let secret = Secret {
        id: state.ids.new_id(),
        meta: Some(shoal_api::Meta { version: None, created_at: Some(now), updated_at: Some(now) }),
        spec: Some(spec),
        internal: false,
    };
    let id = secret.id.clone();
    state
        .write(|t: &Tables, c: &mut Changes| {
            let name = secret_name(&secret);
            if let Some(owner) = t.secrets().by_name(name) {
                return Err(name_taken("secret", name, &owner.id));
            }
            c.create(secret);
            Ok(())
        })
        .await?;
    state.store.view(|t| t.secrets().get(&id).map(|s| redacted(s))).ok_or_else(|| {
        ControlError::Unavailable(format!("secret {id} was created but removed right after; list secrets"))
    })
}

pub(super) fn name_taken(kind: &str, name: &str, owner: &str) -> ControlError {
    ControlError::AlreadyExists(format!(
        "{kind} {name} already exists (ID {owner}): choose another name or remove that {kind}"
    ))
}

/// The secret with this ID, name or unique ID prefix, without its data.
pub fn get_secret(state: &ClusterState, reference: &str) -> Result<Secret, ControlError> {
    state.store.view(|t| find(t, reference).map(|s| redacted(s)))
}

/// Secrets matching `filters`, sorted by name, without their data.
pub fn list_secrets(state: &ClusterState, filters: &SecretFilters) -> Vec<Secret> {
    let mut out: Vec<Secret> = state.store.view(|t| {
        t.secrets()
            .iter()
            .filter(|s| !s.internal && filters.matches(&s.id, s.spec.as_ref().and_then(|s| s.annotations.as_ref())))
            .map(|s| redacted(s))
            .collect()
    });
    out.sort_by(|a, b| secret_name(a).cmp(secret_name(b)).then_with(|| a.id.cmp(&b.id)));
    out
}

/// Replaces the labels of secret `reference`. `version` must be its current version. The name, data (when
/// sent: an empty data means "unchanged"), templating and driver must be those it has; each other value is a
/// 400 naming the field. Returns the secret without its data.
pub async fn update_secret(
    state: &ClusterState,
    reference: &str,
    version: u64,
    spec: SecretSpec,
) -> Result<Secret, ControlError> {
    validate_labels("secret", spec.annotations.as_ref())?;
    let now = state.now();
    let (id, _) = state
        .write(|t: &Tables, c: &mut Changes| {
            let current = find(t, reference)?;
            let cur = current.spec.clone().unwrap_or_default();
            let new_ann = spec.annotations.clone().unwrap_or_default();
            if new_ann.name != secret_name(current) {
                return Err(only_labels("secret", "Name"));
            }
            if !spec.data.is_empty() && !bool::from(spec.data.ct_eq(&cur.data)) {
                return Err(only_labels("secret", "Data"));
            }
            if spec.templating != cur.templating {
                return Err(only_labels("secret", "Templating"));
            }
            if spec.driver != cur.driver {
                return Err(only_labels("secret", "Driver"));
            }
            if current.version() != version {
                return Err(out_of_sequence("secret", &current.id, current.version(), version));
            }
            let mut next = (**current).clone();
            let mut next_spec = cur;
            next_spec.annotations.get_or_insert_with(Default::default).labels = new_ann.labels;
            next.spec = Some(next_spec);
            next.meta_mut().updated_at = Some(now);
            c.update(next);
            Ok(current.id.clone())
        })
        .await?;
    get_secret(state, &id)
}

pub(super) fn out_of_sequence(kind: &str, id: &str, have: u64, sent: u64) -> ControlError {
    ControlError::out_of_sequence(&format!("{kind} {id}"), "update", have, sent)
}

/// Removes secret `reference`; refused (400, naming them) while services reference it.
pub async fn remove_secret(state: &ClusterState, reference: &str) -> Result<(), ControlError> {
    state
        .write(|t: &Tables, c: &mut Changes| {
            let secret = find(t, reference)?;
            let users = services_using(t, |c| c.secrets.iter().any(|r| r.secret_id == secret.id));
            if !users.is_empty() {
                return Err(in_use("secret", secret_name(secret), &users));
            }
            c.remove(secret.clone());
            Ok(())
        })
        .await?;
    Ok(())
}
