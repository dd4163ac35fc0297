//! Docker's `filters` query parameter: a JSON object from filter name to values, either
//! `{"name": {"web": true}}` (current) or `{"name": ["web"]}` (legacy), as moby's `filters.FromJSON` reads it:
//! in the current form every key is a value whatever its boolean (the engine's `Args.Get` lists the keys), a
//! value that is not a boolean is a 400, and so is a legacy list holding anything but strings. Parsed into the
//! control API's filter structs; unknown filter names are refused like Docker does ("invalid filter 'x'").
//! Must not depend on the store.

use std::collections::BTreeMap;

use serde_json::Value;
use shoal_api::TaskState;
use shoal_manager::controlapi::{NodeFilters, SecretFilters, ServiceFilters, TaskFilters};

use crate::error::ApiError;

/// Filter name -> values.
pub type RawFilters = BTreeMap<String, Vec<String>>;

/// Parses the `filters` parameter (absent or empty: no filters), accepting only `allowed` names.
pub fn parse(raw: Option<&str>, allowed: &[&str]) -> Result<RawFilters, ApiError> {
    let mut out = RawFilters::new();
    let Some(raw) = raw.filter(|r| !r.trim().is_empty()) else {
        return Ok(out);
    };
    let bad = |why: &str| ApiError::BadRequest(format!("invalid filter: {why} (in {raw:?})"));
    let doc: Value = serde_json::from_str(raw).map_err(|e| bad(&e.to_string()))?;
    let Value::Object(map) = doc else {
        return Err(bad("expected a JSON object"));
    };
    let (mut current, mut legacy) = (false, false);
    for (name, values) in map {
        if !allowed.contains(&name.as_str()) {
            return Err(ApiError::BadRequest(format!("invalid filter '{name}': use one of {}", allowed.join(", "))));
        }
        let list: Vec<String> = match values {
            Value::Object(m) => {
                current = true;
                m.into_iter()
                    .map(|(k, v)| match v {
                        Value::Bool(_) => Ok(k),
                        _ => Err(bad(&format!(
                            "filter '{name}' maps {k:?} to {v}: the values of a filter are {{\"value\": true}}"
                        ))),
                    })
                    .collect::<Result<_, _>>()?
            }
            Value::Null => Vec::new(),
            Value::Array(a) => {
                legacy = true;
                a.into_iter()
                    .map(|v| v.as_str().map(str::to_string).ok_or_else(|| bad("filter values must be strings")))
                    .collect::<Result<_, _>>()?
            }
            _ => return Err(bad("each filter must map to an object or a list")),
        };
        if current && legacy {
            // moby reads the whole document in one form or the other.
            return Err(bad(
                "use one form for every filter, {\"name\": {\"value\": true}} or the legacy {\"name\": [\"value\"]}",
            ));
        }
        out.entry(name).or_default().extend(list);
    }
    Ok(out)
}

fn take(f: &mut RawFilters, name: &str) -> Vec<String> {
    f.remove(name).unwrap_or_default()
}

/// `GET /services` filters: id, name, label, mode.
pub fn services(raw: Option<&str>) -> Result<ServiceFilters, ApiError> {
    let mut f = parse(raw, &["id", "name", "label", "mode"])?;
    let modes = take(&mut f, "mode");
    if let Some(m) =
        modes.iter().find(|m| !matches!(m.as_str(), "replicated" | "global" | "replicated-job" | "global-job"))
    {
        return Err(ApiError::BadRequest(format!(
            "invalid filter 'mode={m}': use replicated, global, replicated-job or global-job"
        )));
    }
    Ok(ServiceFilters {
        id_prefixes: take(&mut f, "id"),
        name_prefixes: take(&mut f, "name"),
        labels: take(&mut f, "label"),
        modes,
    })
}

/// `GET /secrets` and `GET /configs` filters: names (exact), name (prefix), id (prefix), label, as the engine's
/// `newListSecretsFilters` (the engine's config list takes all but `names`; Shoal takes it there too, as the
/// API document lists it).
pub fn secrets(raw: Option<&str>) -> Result<SecretFilters, ApiError> {
    let mut f = parse(raw, &["names", "name", "id", "label"])?;
    Ok(SecretFilters {
        names: take(&mut f, "names"),
        name_prefixes: take(&mut f, "name"),
        id_prefixes: take(&mut f, "id"),
        labels: take(&mut f, "label"),
    })
}

/// `GET /nodes` filters: id, name, role, membership, label (node.label is accepted as label).
pub fn nodes(raw: Option<&str>) -> Result<NodeFilters, ApiError> {
    let mut f = parse(raw, &["id", "name", "role", "membership", "label", "node.label"])?;
    let roles = take(&mut f, "role");
    if let Some(r) = roles.iter().find(|r| !matches!(r.as_str(), "manager" | "worker")) {
        return Err(ApiError::BadRequest(format!("invalid filter 'role={r}': use manager or worker")));
    }
    let memberships = take(&mut f, "membership");
    if let Some(m) = memberships.iter().find(|m| !matches!(m.as_str(), "accepted" | "pending")) {
        return Err(ApiError::BadRequest(format!("invalid filter 'membership={m}': use accepted or pending")));
    }
    let mut labels = take(&mut f, "label");
    labels.extend(take(&mut f, "node.label"));
    Ok(NodeFilters { id_prefixes: take(&mut f, "id"), name_prefixes: take(&mut f, "name"), roles, memberships, labels })
}

/// `GET /tasks` filters: id, name, service, node, desired-state, label.
pub fn tasks(raw: Option<&str>) -> Result<TaskFilters, ApiError> {
    let mut f = parse(raw, &["id", "name", "service", "node", "desired-state", "label", "_up-to-date"])?;
    let up_to_date = !take(&mut f, "_up-to-date").is_empty();
    let desired_states = take(&mut f, "desired-state")
        .iter()
        .map(|s| {
            TaskState::from_docker_name(s).ok_or_else(|| {
                ApiError::BadRequest(format!("invalid filter 'desired-state={s}': use running, shutdown or accepted"))
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(TaskFilters {
        id_prefixes: take(&mut f, "id"),
        name_prefixes: take(&mut f, "name"),
        services: take(&mut f, "service"),
        nodes: take(&mut f, "node"),
        desired_states,
        labels: take(&mut f, "label"),
        up_to_date,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_filter_forms_parse() {
        let f = services(Some(r#"{"name":{"web":true},"label":null}"#)).unwrap();
        assert_eq!(f.name_prefixes, ["web"]);
        assert!(f.labels.is_empty());
        let f = services(Some(r#"{"id":["abc"],"label":null}"#)).unwrap();
        assert_eq!(f.id_prefixes, ["abc"]);
        // As the engine's Args.Get: every key counts, whatever its boolean.
        let f = services(Some(r#"{"name":{"web":true,"db":false}}"#)).unwrap();
        assert_eq!(f.name_prefixes, ["db", "web"]);
        assert!(services(None).unwrap() == ServiceFilters::default());
        let t = tasks(Some(r#"{"desired-state":{"running":true}}"#)).unwrap();
        assert_eq!(t.desired_states, [TaskState::Running]);
    }

    #[test]
    fn bad_filters_are_400_with_a_reason() {
        for (raw, fragment) in [
            ("{", "invalid filter"),
            (r#"{"name":{"web":"yes"}}"#, "the values of a filter are"),
            (r#"{"name":[1]}"#, "filter values must be strings"),
            (r#"{"name":{"web":true},"id":["abc"]}"#, "one form"),
            ("[1]", "JSON object"),
            (r#"{"colour":{"red":true}}"#, "invalid filter 'colour'"),
            (r#"{"mode":{"sometimes":true}}"#, "mode=sometimes"),
            (r#"{"name":"web"}"#, "object or a list"),
        ] {
            let e = services(Some(raw)).unwrap_err();
            assert!(matches!(&e, ApiError::BadRequest(m) if m.contains(fragment)), "{raw}: {e:?}");
        }
        assert!(tasks(Some(r#"{"desired-state":{"dancing":true}}"#)).is_err());
        assert!(nodes(Some(r#"{"role":{"boss":true}}"#)).is_err());
    }
}

/// `GET /networks` filters: id (prefix), name (substring), label, driver, scope, type; `dangling` is
/// refused (the manager does not know which containers use a network).
pub fn networks(raw: Option<&str>) -> Result<NetworkListFilters, ApiError> {
    let mut f = parse(raw, &["id", "name", "label", "driver", "scope", "type"])?;
    let types = take(&mut f, "type");
    if let Some(t) = types.iter().find(|t| !matches!(t.as_str(), "custom" | "builtin")) {
        return Err(ApiError::BadRequest(format!("invalid filter 'type={t}': use custom or builtin")));
    }
    let scopes = take(&mut f, "scope");
    if let Some(s) = scopes.iter().find(|s| !matches!(s.as_str(), "swarm" | "global" | "local")) {
        return Err(ApiError::BadRequest(format!("invalid filter 'scope={s}': use swarm, global or local")));
    }
    Ok(NetworkListFilters {
        control: shoal_manager::controlapi::NetworkFilters {
            ids: take(&mut f, "id"),
            names: take(&mut f, "name"),
            labels: take(&mut f, "label"),
        },
        drivers: take(&mut f, "driver"),
        scopes,
        types,
    })
}

/// `GET /networks` filters: the control API's, and those decided on the network resource.
#[derive(Debug, Clone, Default)]
pub struct NetworkListFilters {
    /// ID, name and label filters.
    pub control: shoal_manager::controlapi::NetworkFilters,
    /// Driver names (any).
    pub drivers: Vec<String>,
    /// Scopes (any): every Shoal network is "swarm".
    pub scopes: Vec<String>,
    /// "custom" (every Shoal network) or "builtin" (none).
    pub types: Vec<String>,
}
