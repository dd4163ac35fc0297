//! Configs: create, lookup (ID, name, unique ID prefix), list with filters, label updates (compare-and-swap on
//! the version the caller read) and removal, with SwarmKit's Control API rules (`manager/controlapi/config.go`):
//! the names of secrets (`secret::validate_name`), unique among configs, data of 1 byte up to
//! `MAX_CONFIG_DATA_BYTES` (exclusive), only the labels changeable, removal refused while a service references
//! the config (the message names the services), templating `golang` or none. Unlike a secret's, a config's data
//! is returned by reads, as Docker does.
//!
//! Must not depend on HTTP or JSON.

use std::sync::Arc;

use shoal_api::{Config, ConfigSpec};
use shoal_store::{Changes, StoreObject, Tables};

use super::references::services_using;
use super::secret::{
    in_use, name_taken, only_labels, out_of_sequence, validate_annotations, validate_labels, validate_templating,
    SecretFilters,
};
use super::{resolve, ControlError};
use crate::limits::{invalid, MAX_CONFIG_DATA_BYTES};
use crate::state::ClusterState;

/// Which configs to list: the same filters as secrets.
pub type ConfigFilters = SecretFilters;

/// Checks a config spec: name, labels, data size (SwarmKit's `validateConfigSpec`), templating.
pub fn validate_config_spec(spec: &ConfigSpec) -> Result<(), ControlError> {
    validate_annotations("config", spec.annotations.as_ref())?;
    validate_templating("config", spec.templating.as_ref(), &spec.data)?;
    if spec.data.is_empty() || spec.data.len() >= MAX_CONFIG_DATA_BYTES {
        return Err(invalid(format!(
            "Data: config data must be larger than 0 and less than {MAX_CONFIG_DATA_BYTES} bytes (got {} bytes)",
            spec.data.len()
        )));
    }
    Ok(())
}

pub(super) fn find<'a>(t: &'a Tables, reference: &str) -> Result<&'a Arc<Config>, ControlError> {
    resolve("config", reference, |id| t.configs().get(id), |n| t.configs().by_name(n), t.configs().iter())
}

fn config_name(c: &Config) -> &str {
    c.unique_name().unwrap_or("")
}

/// Validates `spec` and creates a config with a new ID. `Conflict` when the name is taken.
pub async fn create_config(state: &ClusterState, spec: ConfigSpec) -> Result<Config, ControlError> {
    validate_config_spec(&spec)?;
    let now = state.now();
    let config = Config {
        id: state.ids.new_id(),
        meta: Some(shoal_api::Meta { version: None, created_at: Some(now), updated_at: Some(now) }),
        spec: Some(spec),
    };
    let id = config.id.clone();
    state
        .write(|t: &Tables, c: &mut Changes| {
            let name = config_name(&config);
            if let Some(owner) = t.configs().by_name(name) {
                return Err(name_taken("config", name, &owner.id));
            }
            c.create(config);
            Ok(())
        })
        .await?;
    state.store.view(|t| t.configs().get(&id).map(|c| (**c).clone())).ok_or_else(|| {
        ControlError::Unavailable(format!("config {id} was created but removed right after; list configs"))
    })
}

/// The config with this ID, name or unique ID prefix.
pub fn get_config(state: &ClusterState, reference: &str) -> Result<Arc<Config>, ControlError> {
    state.store.view(|t| find(t, reference).cloned())
}

/// Configs matching `filters`, sorted by name.
pub fn list_configs(state: &ClusterState, filters: &ConfigFilters) -> Vec<Arc<Config>> {
    let mut out: Vec<Arc<Config>> = state.store.view(|t| {
        t.configs()
            .iter()
            .filter(|c| filters.matches(&c.id, c.spec.as_ref().and_then(|s| s.annotations.as_ref())))
            .cloned()
            .collect()
    });
    out.sort_by(|a, b| config_name(a).cmp(config_name(b)).then_with(|| a.id.cmp(&b.id)));
    out
}

/// Replaces the labels of config `reference`. `version` must be its current version. The name, data (when
/// sent) and templating must be those it has; each other value is a 400 naming the field.
pub async fn update_config(
    state: &ClusterState,
    reference: &str,
    version: u64,
    spec: ConfigSpec,
) -> Result<Config, ControlError> {
    validate_labels("config", spec.annotations.as_ref())?;
    let now = state.now();
    let (id, _) = state
        .write(|t: &Tables, c: &mut Changes| {
            let current = find(t, reference)?;
            let cur = current.spec.clone().unwrap_or_default();
            let new_ann = spec.annotations.clone().unwrap_or_default();
            if new_ann.name != config_name(current) {
                return Err(only_labels("config", "Name"));
            }
            if !spec.data.is_empty() && spec.data != cur.data {
                return Err(only_labels("config", "Data"));
            }
            if spec.templating != cur.templating {
                return Err(only_labels("config", "Templating"));
            }
            if current.version() != version {
                return Err(out_of_sequence("config", &current.id, current.version(), version));
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
    state
        .store
        .view(|t| t.configs().get(&id).map(|c| (**c).clone()))
        .ok_or_else(|| ControlError::not_found("config", reference))
}

/// Removes config `reference`; refused (400, naming them) while services reference it.
pub async fn remove_config(state: &ClusterState, reference: &str) -> Result<(), ControlError> {
    state
        .write(|t: &Tables, c: &mut Changes| {
            let config = find(t, reference)?;
            let users = services_using(t, |c| c.configs.iter().any(|r| r.config_id == config.id));
            if !users.is_empty() {
                return Err(in_use("config", config_name(config), &users));
            }
            c.remove(config.clone());
            Ok(())
        })
        .await?;
    Ok(())
}
