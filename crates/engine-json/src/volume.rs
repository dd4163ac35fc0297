//! The Engine API's cluster volume JSON (`Volume` with its `ClusterVolume`, `ClusterVolumeSpec`, and the body
//! of `POST /volumes/create`, `VolumeCreateOptions`), with conversions to and from the stored `shoal_api`
//! volume, as moby's `daemon/cluster/convert/volume.go` does: the volume's name, labels, driver and driver
//! options are the `Volume`'s own fields; the rest of the spec is `ClusterVolume.Spec`; `Scope` is `global`
//! and `Mountpoint` empty (a cluster volume is mounted where a task runs).
//!
//! Shapes follow moby's Go types (`api/types/volume`), which the docker CLI and the SDKs send and read, where
//! the v1.47 document differs from them: a `Topology` is `{"Segments": {...}}`, and `Secrets`,
//! `AccessibilityRequirements`, `CapacityRange` and `Availability` are fields of `ClusterVolumeSpec`, beside
//! `AccessMode` (the document's indentation puts them inside it). `CreatedAt` is RFC 3339 as for a local
//! volume.
//!
//! A `ClusterVolumeSpec` field left out (or null) of an update means "unchanged" (`apply_to`); on a create it
//! takes SwarmKit's default.
//!
//! Must not depend on HTTP or the store.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use shoal_api::{
    volume_access_mode, volume_publish_status, volume_spec, Annotations, CapacityRange, Driver, Topology,
    TopologyRequirement, Volume, VolumeAccessMode, VolumeSecret, VolumeSpec,
};

use super::common::*;

/// `VolumeCreateOptions`: the body of `POST /volumes/create`. Only one with a `ClusterVolumeSpec` is
/// Shoal's; the others are the node's engine's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct VolumeCreateJson {
    /// The volume's name.
    pub name: String,
    /// The volume driver: for a cluster volume, the CSI plugin.
    pub driver: String,
    /// Options passed to the driver (the plugin's CreateVolume parameters).
    pub driver_opts: BTreeMap<String, String>,
    /// User labels.
    pub labels: BTreeMap<String, String>,
    /// Present for a cluster volume.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_volume_spec: Option<ClusterVolumeSpecJson>,
}

/// `ClusterVolumeSpec`. Every field is optional so that an update can leave it unchanged.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ClusterVolumeSpecJson {
    /// The volume group (`docker volume create --group`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Scope, sharing, and a mount or block type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access_mode: Option<AccessModeJson>,
    /// Where the volume must (and should) be accessible from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accessibility_requirements: Option<TopologyRequirementJson>,
    /// The size asked of the plugin.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_range: Option<CapacityRangeJson>,
    /// Swarm secrets passed to the plugin.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secrets: Option<Vec<VolumeSecretJson>>,
    /// `active`, `pause` or `drain`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub availability: Option<String>,
}

/// `AccessMode`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AccessModeJson {
    /// `single` or `multi`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub scope: String,
    /// `none`, `readonly`, `onewriter` or `all`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub sharing: String,
    /// Present for a mount-type volume.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mount_volume: Option<MountVolumeJson>,
    /// Present for a block-type volume (empty).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_volume: Option<BTreeMap<String, serde_json::Value>>,
}

/// `AccessMode.MountVolume`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct MountVolumeJson {
    /// The file system type.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub fs_type: String,
    /// Mount flags.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mount_flags: Vec<String>,
}

/// `TopologyRequirement`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct TopologyRequirementJson {
    /// At least one of these.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub requisite: Vec<TopologyJson>,
    /// Tried first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub preferred: Vec<TopologyJson>,
}

/// `Topology`: segment name to value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct TopologyJson {
    /// E.g. `{"zone": "z1"}`.
    #[serde(skip_serializing_if = "is_empty_map")]
    pub segments: BTreeMap<String, String>,
}

/// `CapacityRange`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CapacityRangeJson {
    /// At least this many bytes (0: unspecified).
    pub required_bytes: i64,
    /// At most this many bytes (0: unspecified).
    pub limit_bytes: i64,
}

/// One of `Secrets`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct VolumeSecretJson {
    /// The key the plugin gets the secret's data under.
    pub key: String,
    /// The swarm secret's name or ID.
    pub secret: String,
}

/// `Volume`, as the engine shows a cluster volume.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct VolumeJson {
    /// The volume's name.
    pub name: String,
    /// The CSI plugin.
    pub driver: String,
    /// Empty for a cluster volume.
    pub mountpoint: String,
    /// Creation time.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub created_at: String,
    /// User labels.
    pub labels: BTreeMap<String, String>,
    /// `global` for a cluster volume.
    pub scope: String,
    /// The swarm's part.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_volume: Option<ClusterVolumeJson>,
    /// The driver options.
    pub options: BTreeMap<String, String>,
}

/// `ClusterVolume`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ClusterVolumeJson {
    /// The swarm's ID of the volume.
    #[serde(rename = "ID")]
    pub id: String,
    /// Version to pass to an update.
    pub version: VersionJson,
    /// Creation time.
    pub created_at: String,
    /// Last update time.
    pub updated_at: String,
    /// The spec.
    pub spec: ClusterVolumeSpecJson,
    /// Where it is published (empty in layer 1: nothing is published yet).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub publish_status: Vec<PublishStatusJson>,
    /// What the plugin said of it (absent until its plugin created it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub info: Option<VolumeInfoJson>,
}

/// One of `ClusterVolume.PublishStatus`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct PublishStatusJson {
    /// The node.
    #[serde(rename = "NodeID", skip_serializing_if = "String::is_empty")]
    pub node_id: String,
    /// `pending-publish`, `published`, `pending-node-unpublish` or `pending-controller-unpublish`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub state: String,
    /// The controller plugin's publish context.
    #[serde(skip_serializing_if = "is_empty_map")]
    pub publish_context: BTreeMap<String, String>,
}

/// `ClusterVolume.Info`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct VolumeInfoJson {
    /// Bytes (0: unknown).
    #[serde(skip_serializing_if = "is_zero")]
    pub capacity_bytes: i64,
    /// The plugin's context.
    #[serde(skip_serializing_if = "is_empty_map")]
    pub volume_context: BTreeMap<String, String>,
    /// The plugin's ID of the volume.
    #[serde(rename = "VolumeID", skip_serializing_if = "String::is_empty")]
    pub volume_id: String,
    /// Where it is accessible from.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub accessible_topology: Vec<TopologyJson>,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

const SCOPE: &[(&str, volume_access_mode::Scope)] =
    &[("single", volume_access_mode::Scope::SingleNode), ("multi", volume_access_mode::Scope::MultiNode)];

const SHARING: &[(&str, volume_access_mode::Sharing)] = &[
    ("none", volume_access_mode::Sharing::None),
    ("readonly", volume_access_mode::Sharing::ReadOnly),
    ("onewriter", volume_access_mode::Sharing::OneWriter),
    ("all", volume_access_mode::Sharing::All),
];

const AVAILABILITY: &[(&str, volume_spec::VolumeAvailability)] = &[
    ("active", volume_spec::VolumeAvailability::Active),
    ("pause", volume_spec::VolumeAvailability::Pause),
    ("drain", volume_spec::VolumeAvailability::Drain),
];

const PUBLISH_STATE: &[(&str, volume_publish_status::State)] = &[
    ("pending-publish", volume_publish_status::State::PendingPublish),
    ("published", volume_publish_status::State::Published),
    ("pending-node-unpublish", volume_publish_status::State::PendingNodeUnpublish),
    ("pending-controller-unpublish", volume_publish_status::State::PendingUnpublish),
];

pub(crate) fn topology_to_api(t: &TopologyJson) -> Topology {
    Topology { segments: labels_from_json(&t.segments) }
}

pub(crate) fn topology_from_api(t: &Topology) -> TopologyJson {
    TopologyJson { segments: labels_to_json(&t.segments) }
}

impl AccessModeJson {
    fn to_api(&self) -> Result<VolumeAccessMode, ConvertError> {
        let scope = enum_from_str("AccessMode.Scope", &self.scope, SCOPE, volume_access_mode::Scope::SingleNode)?;
        let sharing = enum_from_str("AccessMode.Sharing", &self.sharing, SHARING, volume_access_mode::Sharing::None)?;
        let access_type = match (&self.mount_volume, &self.block_volume) {
            (Some(_), Some(_)) => {
                return Err(ConvertError(
                    "AccessMode: give either MountVolume or BlockVolume, not both (--type mount or block)".into(),
                ))
            }
            (Some(m), None) => Some(volume_access_mode::AccessType::Mount(volume_access_mode::MountVolume {
                fs_type: m.fs_type.clone(),
                mount_flags: m.mount_flags.clone(),
            })),
            (None, Some(_)) => Some(volume_access_mode::AccessType::Block(Default::default())),
            (None, None) => None,
        };
        Ok(VolumeAccessMode { scope: scope as i32, sharing: sharing as i32, access_type })
    }

    fn from_api(m: &VolumeAccessMode) -> AccessModeJson {
        let (mount_volume, block_volume) = match &m.access_type {
            Some(volume_access_mode::AccessType::Mount(v)) => {
                (Some(MountVolumeJson { fs_type: v.fs_type.clone(), mount_flags: v.mount_flags.clone() }), None)
            }
            Some(volume_access_mode::AccessType::Block(_)) => (None, Some(BTreeMap::new())),
            None => (None, None),
        };
        AccessModeJson {
            scope: enum_to_str(m.scope(), SCOPE).into(),
            sharing: enum_to_str(m.sharing(), SHARING).into(),
            mount_volume,
            block_volume,
        }
    }
}

impl ClusterVolumeSpecJson {
    /// Sets the fields this document gives on `spec` (leaving the others as they are).
    pub fn apply_to(&self, spec: &mut VolumeSpec) -> Result<(), ConvertError> {
        if let Some(g) = &self.group {
            spec.group = g.clone();
        }
        if let Some(m) = &self.access_mode {
            spec.access_mode = Some(m.to_api()?);
        }
        if let Some(r) = &self.accessibility_requirements {
            spec.accessibility_requirements = Some(TopologyRequirement {
                requisite: r.requisite.iter().map(topology_to_api).collect(),
                preferred: r.preferred.iter().map(topology_to_api).collect(),
            });
        }
        if let Some(c) = &self.capacity_range {
            spec.capacity_range = Some(CapacityRange { required_bytes: c.required_bytes, limit_bytes: c.limit_bytes });
        }
        if let Some(s) = &self.secrets {
            spec.secrets = s.iter().map(|s| VolumeSecret { key: s.key.clone(), secret: s.secret.clone() }).collect();
        }
        if let Some(a) = &self.availability {
            let a = enum_from_str("Availability", a, AVAILABILITY, volume_spec::VolumeAvailability::Active)?;
            spec.availability = a as i32;
        }
        Ok(())
    }

    /// The cluster part of a stored spec.
    pub fn from_api(spec: &VolumeSpec) -> ClusterVolumeSpecJson {
        ClusterVolumeSpecJson {
            group: Some(spec.group.clone()).filter(|g| !g.is_empty()),
            access_mode: spec.access_mode.as_ref().map(AccessModeJson::from_api),
            accessibility_requirements: spec.accessibility_requirements.as_ref().map(|r| TopologyRequirementJson {
                requisite: r.requisite.iter().map(topology_from_api).collect(),
                preferred: r.preferred.iter().map(topology_from_api).collect(),
            }),
            capacity_range: spec
                .capacity_range
                .map(|c| CapacityRangeJson { required_bytes: c.required_bytes, limit_bytes: c.limit_bytes }),
            secrets: Some(
                spec.secrets
                    .iter()
                    .map(|s| VolumeSecretJson { key: s.key.clone(), secret: s.secret.clone() })
                    .collect(),
            )
            .filter(|s: &Vec<VolumeSecretJson>| !s.is_empty()),
            availability: Some(enum_to_str(spec.availability(), AVAILABILITY).to_string()),
        }
    }
}

impl VolumeCreateJson {
    /// True when this asks for a cluster volume (a `ClusterVolumeSpec` is given).
    pub fn is_cluster(&self) -> bool {
        self.cluster_volume_spec.is_some()
    }

    /// To the API spec of a cluster volume; an error when no `ClusterVolumeSpec` is given.
    pub fn to_api(&self) -> Result<VolumeSpec, ConvertError> {
        let Some(cluster) = &self.cluster_volume_spec else {
            return Err(ConvertError(
                "ClusterVolumeSpec: this is a local volume (no ClusterVolumeSpec): the node's Docker Engine creates \
                 those"
                    .into(),
            ));
        };
        let mut spec = VolumeSpec {
            annotations: Some(Annotations {
                name: self.name.clone(),
                labels: labels_from_json(&self.labels),
                ..Default::default()
            }),
            driver: (!self.driver.is_empty() || !self.driver_opts.is_empty())
                .then(|| Driver { name: self.driver.clone(), options: labels_from_json(&self.driver_opts) }),
            ..Default::default()
        };
        cluster.apply_to(&mut spec)?;
        Ok(spec)
    }
}

impl VolumeJson {
    /// From a stored cluster volume (moby's `VolumeFromGRPC`).
    pub fn from_api(v: &Volume) -> VolumeJson {
        let spec = v.spec.clone().unwrap_or_default();
        let (version, created_at, updated_at) = super::objects::meta_parts(v.meta.as_ref());
        let ann = spec.annotations.clone().unwrap_or_default();
        let driver = spec.driver.clone().unwrap_or_default();
        let info = v.volume_info.as_ref().map(|i| VolumeInfoJson {
            capacity_bytes: i.capacity_bytes,
            volume_context: labels_to_json(&i.volume_context),
            volume_id: i.volume_id.clone(),
            accessible_topology: i.accessible_topology.iter().map(topology_from_api).collect(),
        });
        let publish_status = v
            .publish_status
            .iter()
            .map(|p| PublishStatusJson {
                node_id: p.node_id.clone(),
                state: enum_to_str(p.state(), PUBLISH_STATE).into(),
                publish_context: labels_to_json(&p.publish_context),
            })
            .collect();
        VolumeJson {
            name: ann.name.clone(),
            driver: driver.name.clone(),
            mountpoint: String::new(),
            created_at: created_at.clone(),
            labels: labels_to_json(&ann.labels),
            scope: "global".into(),
            options: labels_to_json(&driver.options),
            cluster_volume: Some(ClusterVolumeJson {
                id: v.id.clone(),
                version,
                created_at,
                updated_at,
                spec: ClusterVolumeSpecJson::from_api(&spec),
                publish_status,
                info,
            }),
        }
    }
}

/// The body of `PUT /volumes/{name}` (moby's `volume.UpdateOptions`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct VolumeUpdateJson {
    /// The cluster volume's spec as it should be (only `Availability` may differ).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spec: Option<ClusterVolumeSpecJson>,
}

/// The answer of `GET /volumes` (`VolumeListResponse`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct VolumeListJson {
    /// The volumes.
    pub volumes: Vec<VolumeJson>,
    /// Warnings.
    pub warnings: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create_body() -> serde_json::Value {
        serde_json::json!({
            "Name": "data",
            "Driver": "csi.example",
            "DriverOpts": {"size": "1G"},
            "Labels": {"tier": "gold"},
            "ClusterVolumeSpec": {
                "Group": "db",
                "AccessMode": {"Scope": "single", "Sharing": "onewriter", "MountVolume": {"FsType": "ext4"}},
                "AccessibilityRequirements": {"Requisite": [{"Segments": {"zone": "z1"}}]},
                "CapacityRange": {"RequiredBytes": 1024, "LimitBytes": 0},
                "Secrets": [{"Key": "password", "Secret": "pw"}],
                "Availability": "active"
            }
        })
    }

    #[test]
    fn a_create_converts_both_ways_and_an_inspected_spec_applies_as_no_change() {
        let req: VolumeCreateJson = crate::decode(create_body().to_string().as_bytes()).unwrap();
        assert!(req.is_cluster());
        let spec = req.to_api().unwrap();
        assert_eq!(spec.group, "db");
        assert_eq!(spec.driver.as_ref().unwrap().options["size"], "1G");
        let mode = spec.access_mode.as_ref().unwrap();
        assert_eq!(mode.sharing(), volume_access_mode::Sharing::OneWriter);
        assert!(matches!(&mode.access_type, Some(volume_access_mode::AccessType::Mount(m)) if m.fs_type == "ext4"));
        assert_eq!(spec.accessibility_requirements.as_ref().unwrap().requisite[0].segments["zone"], "z1");

        let volume = Volume { id: "v1".into(), spec: Some(spec.clone()), ..Default::default() };
        let json = VolumeJson::from_api(&volume);
        assert_eq!((json.name.as_str(), json.driver.as_str(), json.scope.as_str()), ("data", "csi.example", "global"));
        let cluster = json.cluster_volume.clone().unwrap();
        let text = serde_json::to_value(&json).unwrap();
        assert_eq!(text["ClusterVolume"]["Spec"], create_body()["ClusterVolumeSpec"], "the same shape both ways");
        // What `docker volume update` sends (the inspected spec) changes nothing but what it changes.
        let mut again = spec.clone();
        cluster.spec.apply_to(&mut again).unwrap();
        assert_eq!(again, spec);
        let drain = ClusterVolumeSpecJson { availability: Some("drain".into()), ..cluster.spec.clone() };
        drain.apply_to(&mut again).unwrap();
        assert_eq!(again.availability(), volume_spec::VolumeAvailability::Drain);
    }

    #[test]
    fn bad_values_name_the_field() {
        let mut body = create_body();
        body["ClusterVolumeSpec"]["AccessMode"]["Sharing"] = "some".into();
        let req: VolumeCreateJson = crate::decode(body.to_string().as_bytes()).unwrap();
        assert!(req.to_api().unwrap_err().0.contains("AccessMode.Sharing"));
        let mut body = create_body();
        body["ClusterVolumeSpec"]["AccessMode"]["BlockVolume"] = serde_json::json!({});
        let req: VolumeCreateJson = crate::decode(body.to_string().as_bytes()).unwrap();
        assert!(req.to_api().unwrap_err().0.contains("not both"));
        let local: VolumeCreateJson = crate::decode(br#"{"Name": "x"}"#).unwrap();
        assert!(!local.is_cluster());
        assert!(local.to_api().unwrap_err().0.starts_with("ClusterVolumeSpec:"));
    }
}
