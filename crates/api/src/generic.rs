//! Generic resources (`gpu=UUID1,gpu=UUID2,ssd=4`): what a node offers, what a task reserves and what the
//! scheduler gave it, as SwarmKit reads and shows them. A kind given once with an integer is discrete (a count);
//! a kind given with names is a set of named units (each handed to one task at a time).

use crate::{generic_resource, DiscreteGenericResource, GenericResource, NamedGenericResource};

/// Most kinds and named units a node may offer (each named unit is one entry).
pub const MAX_NODE_GENERIC_RESOURCES: usize = 1024;
/// Longest kind or named value, in bytes.
pub const MAX_GENERIC_NAME_BYTES: usize = 128;

/// A discrete resource: `value` units of `kind`.
pub fn discrete(kind: &str, value: i64) -> GenericResource {
    GenericResource {
        resource: Some(generic_resource::Resource::DiscreteResourceSpec(DiscreteGenericResource {
            kind: kind.to_string(),
            value,
        })),
    }
}

/// A named unit `value` of `kind`.
pub fn named(kind: &str, value: &str) -> GenericResource {
    GenericResource {
        resource: Some(generic_resource::Resource::NamedResourceSpec(NamedGenericResource {
            kind: kind.to_string(),
            value: value.to_string(),
        })),
    }
}

/// The resource's kind ("" when unset).
pub fn kind(r: &GenericResource) -> &str {
    match &r.resource {
        Some(generic_resource::Resource::DiscreteResourceSpec(d)) => &d.kind,
        Some(generic_resource::Resource::NamedResourceSpec(n)) => &n.kind,
        None => "",
    }
}

/// The resource's value as text: the count of a discrete one, the name of a named one.
pub fn value(r: &GenericResource) -> String {
    match &r.resource {
        Some(generic_resource::Resource::DiscreteResourceSpec(d)) => d.value.to_string(),
        Some(generic_resource::Resource::NamedResourceSpec(n)) => n.value.clone(),
        None => String::new(),
    }
}

fn check_name(what: &str, s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err(format!("empty {what}"));
    }
    if s.len() > MAX_GENERIC_NAME_BYTES {
        return Err(format!("{what} {s:?} is longer than {MAX_GENERIC_NAME_BYTES} bytes"));
    }
    if !s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c)) {
        return Err(format!("{what} {s:?} may only hold letters, digits, '-', '_', '.' and ':'"));
    }
    Ok(())
}

/// Parses a node's offer, `kind=value` terms separated by commas (swarmd's `--generic-node-resources`): a kind
/// given once with an integer is discrete, a kind given with names is a set of named units; mixing both for one
/// kind, a negative count, a repeated name or a malformed term is an error that names it.
pub fn parse_offer(text: &str) -> Result<Vec<GenericResource>, String> {
    let mut by_kind: Vec<(&str, Vec<&str>)> = Vec::new();
    for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let Some((k, v)) = term.split_once('=') else {
            return Err(format!("generic resource {term:?}: expected kind=value"));
        };
        let (k, v) = (k.trim(), v.trim());
        check_name("generic resource kind", k)?;
        match by_kind.iter_mut().find(|(kind, _)| *kind == k) {
            Some((_, values)) => values.push(v),
            None => by_kind.push((k, vec![v])),
        }
    }
    let mut out = Vec::new();
    for (k, values) in by_kind {
        let counts: Vec<Option<i64>> = values.iter().map(|v| v.parse::<i64>().ok()).collect();
        match (values.len(), counts[0]) {
            (1, Some(n)) if n < 0 => return Err(format!("generic resource {k}: a count cannot be negative ({n})")),
            (1, Some(n)) => out.push(discrete(k, n)),
            _ if counts.iter().any(Option::is_some) => {
                return Err(format!("generic resource {k}: mixes a count and names ({})", values.join(",")))
            }
            _ => {
                for (i, v) in values.iter().enumerate() {
                    check_name(&format!("generic resource {k} value"), v)?;
                    if values[..i].contains(v) {
                        return Err(format!("generic resource {k}: {v:?} is given twice"));
                    }
                    out.push(named(k, v));
                }
            }
        }
    }
    if out.len() > MAX_NODE_GENERIC_RESOURCES {
        return Err(format!("{} generic resources; at most {MAX_NODE_GENERIC_RESOURCES} are allowed", out.len()));
    }
    Ok(out)
}

/// The environment a task gets for the resources assigned to it, as SwarmKit's executors set it:
/// `DOCKER_RESOURCE_<KIND>=<value>,<value>` (kind upper-cased), one variable per kind, in kind order.
pub fn env(assigned: &[GenericResource]) -> Vec<String> {
    let mut by_kind: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for r in assigned {
        by_kind.entry(kind(r).to_ascii_uppercase()).or_default().push(value(r));
    }
    by_kind.into_iter().map(|(k, v)| format!("DOCKER_RESOURCE_{k}={}", v.join(","))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offers_parse_as_swarmd_reads_them() {
        let got = parse_offer("gpu=UUID1, gpu=UUID2,ssd=4").unwrap();
        assert_eq!(got, vec![named("gpu", "UUID1"), named("gpu", "UUID2"), discrete("ssd", 4)]);
        assert_eq!(parse_offer("").unwrap(), vec![]);
        for (bad, fragment) in [
            ("gpu", "expected kind=value"),
            ("ssd=-1", "cannot be negative"),
            ("gpu=a,gpu=2", "mixes a count and names"),
            ("gpu=a,gpu=a", "given twice"),
            ("=3", "empty generic resource kind"),
            ("gpu=a b", "may only hold"),
        ] {
            let err = parse_offer(bad).unwrap_err();
            assert!(err.contains(fragment), "{bad}: {err}");
        }
    }

    #[test]
    fn env_groups_values_by_kind() {
        let env = env(&[named("gpu", "a"), discrete("ssd", 2), named("gpu", "b")]);
        assert_eq!(env, vec!["DOCKER_RESOURCE_GPU=a,b".to_string(), "DOCKER_RESOURCE_SSD=2".to_string()]);
    }
}
