//! Cluster volumes (layer 1 of SwarmKit's CSI support, docs/design/cluster-volumes.md): create, lookup (ID,
//! name, unique ID prefix), list with filters, update and removal, with SwarmKit's Control API rules
//! (`manager/controlapi/volume.go`): a spec, a driver and an access mode with a mount or block access type are
//! required; the secrets a volume passes to its plugin must exist (by name or ID) in the write that stores it;
//! names are unique among volumes; an update may change only the labels and the availability (each other field
//! is a 400 naming it). Beyond SwarmKit, every size is bounded (`limits::MAX_VOLUME_*`) before anything is
//! written, and a removal is refused while a service mounts the volume (`type=cluster` naming it), naming
//! the services, as for secrets and configs.
//!
//! Nothing here calls a plugin: a volume is stored as it is asked for, with no `VolumeInfo`, which the volume
//! manager (`crate::volumes`) writes once the plugin has created it. Removing a created volume marks it
//! `pending_delete` for the volume manager to have the plugin delete it first (as SwarmKit does); `force`, or a
//! volume no plugin created yet, removes it at once. A mount naming a group (`group:<name>`) is not counted as
//! a use of any one volume here: publishing (layer 3) counts the volumes published to tasks.
//!
//! Must not depend on HTTP or JSON.

use std::collections::HashSet;
use std::sync::Arc;

use shoal_api::prost::Message;
use shoal_api::{volume_access_mode, Volume, VolumeSpec};
use shoal_store::{Changes, StoreObject, Tables};

use super::references::services_using;
use super::secret::{in_use, map_bytes, name_taken, out_of_sequence, validate_annotations, validate_labels};
use super::{any_prefix, labels_match, resolve, ControlError};
use crate::limits::{
    invalid, MAX_SECRET_NAME_LEN, MAX_VOLUME_DRIVER_BYTES, MAX_VOLUME_DRIVER_NAME_BYTES, MAX_VOLUME_MOUNT_FLAGS_BYTES,
    MAX_VOLUME_SECRETS, MAX_VOLUME_SECRET_KEY_BYTES, MAX_VOLUME_SPEC_BYTES, MAX_VOLUME_TOPOLOGIES,
    MAX_VOLUME_TOPOLOGY_BYTES,
};
use crate::state::ClusterState;

/// Which volumes to list, as SwarmKit's `ListVolumesRequest.Filters`: a volume matches when it matches any of
/// the names, name prefixes and ID prefixes (or none is given), is in one of the groups and has one of the
/// drivers (when given), and has every label.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeFilters {
    /// Exact names.
    pub names: Vec<String>,
    /// Name prefixes.
    pub name_prefixes: Vec<String>,
    /// ID prefixes.
    pub id_prefixes: Vec<String>,
    /// `key` or `key=value` labels; all must match.
    pub labels: Vec<String>,
    /// Volume groups (exact).
    pub groups: Vec<String>,
    /// Driver (plugin) names (exact).
    pub drivers: Vec<String>,
}

impl VolumeFilters {
    fn matches(&self, v: &Volume) -> bool {
        let spec = v.spec.clone().unwrap_or_default();
        let (name, labels) = spec.annotations.map(|a| (a.name, a.labels)).unwrap_or_default();
        let unfiltered = self.names.is_empty() && self.name_prefixes.is_empty() && self.id_prefixes.is_empty();
        let by_name_or_id = unfiltered
            || self.names.contains(&name)
            || (!self.name_prefixes.is_empty() && any_prefix(&self.name_prefixes, &name))
            || (!self.id_prefixes.is_empty() && any_prefix(&self.id_prefixes, &v.id));
        let driver = spec.driver.map(|d| d.name).unwrap_or_default();
        by_name_or_id
            && (self.groups.is_empty() || self.groups.contains(&spec.group))
            && (self.drivers.is_empty() || self.drivers.contains(&driver))
            && labels_match(&labels, &self.labels)
    }
}

/// Checks a volume spec against SwarmKit's rules and Shoal's bounds, before anything is written. Each error
/// names the field.
pub fn validate_volume_spec(spec: &VolumeSpec) -> Result<(), ControlError> {
    validate_annotations("volume", spec.annotations.as_ref())?;
    let size = spec.encoded_len();
    if size > MAX_VOLUME_SPEC_BYTES {
        return Err(invalid(format!(
            "the volume spec is {size} bytes encoded, over the limit of {MAX_VOLUME_SPEC_BYTES} bytes (256 KiB)"
        )));
    }
    let group_ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if spec.group.len() > MAX_SECRET_NAME_LEN || !spec.group.chars().all(group_ok) {
        return Err(invalid(format!(
            "Group: invalid volume group {:?}: at most {MAX_SECRET_NAME_LEN} [a-zA-Z0-9-_.] characters",
            spec.group
        )));
    }
    let Some(driver) = spec.driver.as_ref().filter(|d| !d.name.is_empty()) else {
        return Err(invalid(
            "Driver: a cluster volume needs the name of the CSI plugin that provides it (--driver); there is no \
             default plugin",
        ));
    };
    if driver.name.len() > MAX_VOLUME_DRIVER_NAME_BYTES {
        return Err(invalid(format!(
            "Driver: the plugin name is {} bytes, over the limit of {MAX_VOLUME_DRIVER_NAME_BYTES}",
            driver.name.len()
        )));
    }
    let options = map_bytes(&driver.options);
    if options > MAX_VOLUME_DRIVER_BYTES {
        return Err(invalid(format!(
            "DriverOpts: the driver options are {options} bytes, over the limit of {MAX_VOLUME_DRIVER_BYTES} bytes \
             (64 KiB)"
        )));
    }
    validate_access_mode(spec.access_mode.as_ref())?;
    validate_secrets(spec)?;
    if let Some(req) = &spec.accessibility_requirements {
        for (field, list) in [("Requisite", &req.requisite), ("Preferred", &req.preferred)] {
            if list.len() > MAX_VOLUME_TOPOLOGIES {
                return Err(invalid(format!(
                    "AccessibilityRequirements.{field}: {} topologies, over the limit of {MAX_VOLUME_TOPOLOGIES}",
                    list.len()
                )));
            }
            for (i, t) in list.iter().enumerate() {
                let bytes = map_bytes(&t.segments);
                if bytes > MAX_VOLUME_TOPOLOGY_BYTES {
                    return Err(invalid(format!(
                        "AccessibilityRequirements.{field}[{i}]: its segments are {bytes} bytes, over the limit of \
                         {MAX_VOLUME_TOPOLOGY_BYTES} bytes"
                    )));
                }
                if t.segments.keys().any(String::is_empty) {
                    return Err(invalid(format!(
                        "AccessibilityRequirements.{field}[{i}]: a topology segment needs a key (e.g. \"zone\")"
                    )));
                }
            }
        }
    }
    if let Some(c) = &spec.capacity_range {
        if c.required_bytes < 0 || c.limit_bytes < 0 {
            return Err(invalid(format!(
                "CapacityRange: RequiredBytes ({}) and LimitBytes ({}) must not be negative (0: unspecified)",
                c.required_bytes, c.limit_bytes
            )));
        }
        if c.limit_bytes != 0 && c.limit_bytes < c.required_bytes {
            return Err(invalid(format!(
                "CapacityRange: LimitBytes ({}) is less than RequiredBytes ({}): the plugin could satisfy neither",
                c.limit_bytes, c.required_bytes
            )));
        }
    }
    if volume_spec_availability(spec).is_none() {
        return Err(invalid(format!(
            "Availability: unknown availability {}: use active, pause or drain",
            spec.availability
        )));
    }
    Ok(())
}

fn volume_spec_availability(spec: &VolumeSpec) -> Option<shoal_api::volume_spec::VolumeAvailability> {
    shoal_api::volume_spec::VolumeAvailability::try_from(spec.availability).ok()
}

fn validate_access_mode(mode: Option<&shoal_api::VolumeAccessMode>) -> Result<(), ControlError> {
    let Some(mode) = mode else {
        return Err(invalid(
            "AccessMode: a cluster volume needs an access mode (scope, sharing and a mount or block type)",
        ));
    };
    if volume_access_mode::Scope::try_from(mode.scope).is_err() {
        return Err(invalid(format!("AccessMode.Scope: unknown scope {}: use single or multi", mode.scope)));
    }
    if volume_access_mode::Sharing::try_from(mode.sharing).is_err() {
        return Err(invalid(format!(
            "AccessMode.Sharing: unknown sharing {}: use none, readonly, onewriter or all",
            mode.sharing
        )));
    }
    match &mode.access_type {
        None => Err(invalid(
            "AccessMode: a volume's access mode must name either MountVolume or BlockVolume (--type mount or block)",
        )),
        Some(volume_access_mode::AccessType::Block(_)) => Ok(()),
        Some(volume_access_mode::AccessType::Mount(m)) => {
            let bytes = m.fs_type.len() + m.mount_flags.iter().map(String::len).sum::<usize>();
            if bytes > MAX_VOLUME_MOUNT_FLAGS_BYTES {
                return Err(invalid(format!(
                    "AccessMode.MountVolume: the file system type and mount flags are {bytes} bytes, over the limit \
                     of {MAX_VOLUME_MOUNT_FLAGS_BYTES} bytes"
                )));
            }
            Ok(())
        }
    }
}

fn validate_secrets(spec: &VolumeSpec) -> Result<(), ControlError> {
    if spec.secrets.len() > MAX_VOLUME_SECRETS {
        return Err(invalid(format!(
            "Secrets: {} secrets, over the limit of {MAX_VOLUME_SECRETS} per volume",
            spec.secrets.len()
        )));
    }
    let mut keys = HashSet::new();
    for s in &spec.secrets {
        if s.key.is_empty() || s.key.len() > MAX_VOLUME_SECRET_KEY_BYTES {
            return Err(invalid(format!(
                "Secrets: each secret needs a key of 1 to {MAX_VOLUME_SECRET_KEY_BYTES} bytes (got {} bytes)",
                s.key.len()
            )));
        }
        if s.secret.is_empty() {
            return Err(invalid(format!("Secrets: the secret of key {:?} needs a secret name or ID", s.key)));
        }
        if !keys.insert(s.key.as_str()) {
            return Err(invalid(format!("Secrets: key {:?} is given twice; give each key once", s.key)));
        }
    }
    Ok(())
}

/// The secrets a volume names that the store does not hold (by ID or name), SwarmKit's message.
fn check_secrets_exist(t: &Tables, spec: &VolumeSpec) -> Result<(), ControlError> {
    let missing: Vec<&str> = spec
        .secrets
        .iter()
        .map(|s| s.secret.as_str())
        .filter(|s| t.secrets().get(s).is_none() && t.secrets().by_name(s).is_none())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let noun = if missing.len() == 1 { "secret" } else { "secrets" };
    Err(invalid(format!("Secrets: {noun} not found: {}: create them first (docker secret create)", missing.join(", "))))
}

pub(super) fn find<'a>(t: &'a Tables, reference: &str) -> Result<&'a Arc<Volume>, ControlError> {
    resolve("volume", reference, |id| t.volumes().get(id), |n| t.volumes().by_name(n), t.volumes().iter())
}

/// The volume with this exact ID or name (no prefix match), if any: what the Engine API asks before it
/// relays a `/volumes/{name}` to the node's engine, whose local volumes may share a prefix.
pub fn find_volume_exact(state: &ClusterState, reference: &str) -> Option<Arc<Volume>> {
    state.store.view(|t| t.volumes().get(reference).or_else(|| t.volumes().by_name(reference)).cloned())
}

fn volume_name(v: &Volume) -> &str {
    v.unique_name().unwrap_or("")
}

/// Validates `spec` and creates a cluster volume with a new ID. `AlreadyExists` when the name is taken.
pub async fn create_volume(state: &ClusterState, spec: VolumeSpec) -> Result<Volume, ControlError> {
    validate_volume_spec(&spec)?;
    let now = state.now();
    let volume = Volume {
        id: state.ids.new_id(),
        meta: Some(shoal_api::Meta { version: None, created_at: Some(now), updated_at: Some(now) }),
        spec: Some(spec),
        ..Default::default()
    };
    let id = volume.id.clone();
    state
        .write(|t: &Tables, c: &mut Changes| {
            let name = volume_name(&volume);
            if let Some(owner) = t.volumes().by_name(name) {
                return Err(name_taken("volume", name, &owner.id));
            }
            check_secrets_exist(t, volume.spec.as_ref().unwrap_or(&VolumeSpec::default()))?;
            c.create(volume);
            Ok(())
        })
        .await?;
    state.store.view(|t| t.volumes().get(&id).map(|v| (**v).clone())).ok_or_else(|| {
        ControlError::Unavailable(format!("volume {id} was created but removed right after; list volumes"))
    })
}

/// The volume with this ID, name or unique ID prefix.
pub fn get_volume(state: &ClusterState, reference: &str) -> Result<Arc<Volume>, ControlError> {
    state.store.view(|t| find(t, reference).cloned())
}

/// Volumes matching `filters`, sorted by name.
pub fn list_volumes(state: &ClusterState, filters: &VolumeFilters) -> Vec<Arc<Volume>> {
    let mut out: Vec<Arc<Volume>> =
        state.store.view(|t| t.volumes().iter().filter(|v| filters.matches(v)).cloned().collect());
    out.sort_by(|a, b| volume_name(a).cmp(volume_name(b)).then_with(|| a.id.cmp(&b.id)));
    out
}

/// The 400 of an update that changes what cannot change.
fn fixed(field: &str) -> ControlError {
    invalid(format!(
        "{field}: a cluster volume's {field} cannot be updated; only its availability (and labels) can change: \
         create a new volume for a different {field}"
    ))
}

/// Updates volume `reference` to `spec`: only the labels and the availability may differ from what it has
/// (SwarmKit's rule); each other field is a 400 naming it. `version` must be its current version.
pub async fn update_volume(
    state: &ClusterState,
    reference: &str,
    version: u64,
    spec: VolumeSpec,
) -> Result<Volume, ControlError> {
    validate_labels("volume", spec.annotations.as_ref())?;
    if volume_spec_availability(&spec).is_none() {
        return Err(invalid(format!(
            "Availability: unknown availability {}: use active, pause or drain",
            spec.availability
        )));
    }
    let now = state.now();
    let (id, _) = state
        .write(|t: &Tables, c: &mut Changes| {
            let current = find(t, reference)?;
            let cur = current.spec.clone().unwrap_or_default();
            let new_ann = spec.annotations.clone().unwrap_or_default();
            if new_ann.name != volume_name(current) {
                return Err(fixed("Name"));
            }
            let checks = [
                ("Group", spec.group == cur.group),
                ("Driver", spec.driver == cur.driver),
                ("AccessMode", spec.access_mode == cur.access_mode),
                ("Secrets", spec.secrets == cur.secrets),
                ("AccessibilityRequirements", spec.accessibility_requirements == cur.accessibility_requirements),
                ("CapacityRange", spec.capacity_range == cur.capacity_range),
            ];
            if let Some((field, _)) = checks.iter().find(|(_, same)| !same) {
                return Err(fixed(field));
            }
            if current.version() != version {
                return Err(out_of_sequence("volume", &current.id, current.version(), version));
            }
            let mut next = (**current).clone();
            let mut next_spec = cur;
            next_spec.annotations.get_or_insert_with(Default::default).labels = new_ann.labels;
            next_spec.availability = spec.availability;
            next.spec = Some(next_spec);
            next.meta_mut().updated_at = Some(now);
            c.update(next);
            Ok(current.id.clone())
        })
        .await?;
    state
        .store
        .view(|t| t.volumes().get(&id).map(|v| (**v).clone()))
        .ok_or_else(|| ControlError::not_found("volume", reference))
}

/// Removes volume `reference`: at once when forced or when no plugin created it yet, else marks it pending
/// deletion for the volume manager (refused, naming the nodes, while it is published). Refused (400, naming
/// them) while services mount it, `force` or not.
pub async fn remove_volume(state: &ClusterState, reference: &str, force: bool) -> Result<(), ControlError> {
    state
        .write(|t: &Tables, c: &mut Changes| {
            let volume = find(t, reference)?;
            let users = services_using(t, |c| shoal_store::mounts_volume(c, volume));
            if !users.is_empty() {
                return Err(in_use("volume", volume_name(volume), &users));
            }
            if force || !volume.created_by_plugin() {
                // Forced, or no plugin made it yet: nothing to ask of a plugin (a create answered after this
                // is undone by the volume manager, which finds the object gone).
                c.remove(volume.clone());
                return Ok(());
            }
            if !volume.publish_status.is_empty() {
                let nodes: Vec<&str> = volume.publish_status.iter().map(|p| p.node_id.as_str()).collect();
                return Err(ControlError::FailedPrecondition(format!(
                    "volume {} is still in use: it is published to node {}; remove the tasks that use it first, or \
                     remove it with --force (its plugin is then not asked to delete it)",
                    volume_name(volume),
                    nodes.join(", ")
                )));
            }
            if !volume.pending_delete {
                let mut v = (**volume).clone();
                v.pending_delete = true;
                c.update(v);
            }
            Ok(())
        })
        .await?;
    Ok(())
}
