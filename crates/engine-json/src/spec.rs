//! The Engine API's `ServiceSpec` and `TaskSpec` (TaskTemplate) JSON, with conversions to and from
//! `shoal_api::ServiceSpec`/`TaskSpec`. Field names follow Docker's Go structs exactly; durations are
//! nanoseconds; enums are Docker's lower-case strings. Unknown JSON fields are ignored.
//! Must not depend on HTTP or the store.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use shoal_api::{
    config_reference, container_spec, endpoint_spec, mount, placement_preference, port_config, restart_policy,
    secret_reference, service_spec, task_spec, update_config, Annotations, ConfigReference, ContainerSpec, Driver,
    EndpointSpec, FileTarget, GlobalJob, GlobalService, HealthConfig, Mount, NetworkAttachmentConfig, Placement,
    PlacementPreference, Platform, PortConfig, ReplicatedJob, ReplicatedService, ResourceRequirements, Resources,
    RestartPolicy, RuntimeTarget, SecretReference, ServiceSpec, SpreadOver, TaskSpec, UpdateConfig,
};

use super::common::*;
use shoal_api::mount::bind_options::Propagation;
use shoal_api::privileges::{self, app_armor_opts::AppArmorMode, seccomp_opts::SeccompMode};
use shoal_api::Privileges;

/// `ServiceSpec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ServiceSpecJson {
    /// The service name.
    pub name: String,
    /// User labels.
    #[serde(skip_serializing_if = "is_empty_map")]
    pub labels: BTreeMap<String, String>,
    /// What each task runs.
    pub task_template: TaskSpecJson,
    /// Replicated, global, or a job mode.
    pub mode: ModeJson,
    /// Rolling update settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub update_config: Option<UpdateConfigJson>,
    /// Rollback settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollback_config: Option<UpdateConfigJson>,
    /// Ports and resolution mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint_spec: Option<EndpointSpecJson>,
    /// Networks (deprecated for `TaskTemplate.Networks`, still read and shown as sent).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub networks: Vec<NetworkAttachmentJson>,
}

/// `NetworkAttachmentConfig`: a network a service's tasks attach to (name or ID; the control API stores the ID).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct NetworkAttachmentJson {
    /// The network's ID or name.
    pub target: String,
    /// Extra DNS names of the task on that network.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
    /// Driver options of the attachment: refused (`unsupported.rs`), no driver reads them yet.
    #[serde(skip_serializing_if = "is_empty_map")]
    pub driver_opts: BTreeMap<String, String>,
}

impl NetworkAttachmentJson {
    fn to_api(&self) -> NetworkAttachmentConfig {
        NetworkAttachmentConfig {
            target: self.target.clone(),
            aliases: self.aliases.clone(),
            addresses: Vec::new(),
            driver_attachment_opts: labels_from_json(&self.driver_opts),
        }
    }

    fn from_api(n: &NetworkAttachmentConfig) -> NetworkAttachmentJson {
        NetworkAttachmentJson {
            target: n.target.clone(),
            aliases: n.aliases.clone(),
            driver_opts: labels_to_json(&n.driver_attachment_opts),
        }
    }
}

/// `ServiceSpec.Mode`: exactly one member set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ModeJson {
    /// A fixed number of replicas.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicated: Option<ReplicatedJson>,
    /// One task per node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub global: Option<Empty>,
    /// A job run to a number of completions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicated_job: Option<ReplicatedJobJson>,
    /// A job run once per node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub global_job: Option<Empty>,
}

/// `{}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Empty {}

/// `Mode.Replicated`. Replicas is signed here so that a negative count is reported clearly.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ReplicatedJson {
    /// Desired replica count (1 when absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i64>,
}

/// `Mode.ReplicatedJob`. Absent fields take the engine's defaults: MaxConcurrent 1, TotalCompletions
/// MaxConcurrent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ReplicatedJobJson {
    /// Tasks run at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u64>,
    /// Completions wanted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_completions: Option<u64>,
}

/// `TaskSpec` (a service's `TaskTemplate`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct TaskSpecJson {
    /// The container to run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_spec: Option<ContainerSpecJson>,
    /// Limits and reservations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourcesJson>,
    /// When to restart a task.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<RestartPolicyJson>,
    /// Where tasks may run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<PlacementJson>,
    /// Log driver.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_driver: Option<DriverJson>,
    /// Counter bumped to force a redeploy.
    pub force_update: u64,
    /// "container" (the only runtime).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub runtime: String,
    /// Networks to attach tasks to.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub networks: Vec<NetworkAttachmentJson>,
    /// A plugin's spec (runtime `plugin`): read only to be refused.
    #[serde(skip_serializing)]
    pub plugin_spec: serde_json::Value,
    /// A network attachment's spec (runtime `attachment`): refused in a service's spec, written for a
    /// network attachment task (`{"ContainerID": ...}`, as Docker shows it).
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    pub network_attachment_spec: serde_json::Value,
}

/// `ContainerSpec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ContainerSpecJson {
    /// Image reference.
    pub image: String,
    /// Container labels.
    #[serde(skip_serializing_if = "is_empty_map")]
    pub labels: BTreeMap<String, String>,
    /// Entrypoint override.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Arguments.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Hostname.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub hostname: String,
    /// `KEY=VALUE` environment.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Working directory.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub dir: String,
    /// User.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub user: String,
    /// Extra groups.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// Allocate a TTY.
    #[serde(rename = "TTY", skip_serializing_if = "std::ops::Not::not")]
    pub tty: bool,
    /// Keep stdin open.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub open_stdin: bool,
    /// Read-only root filesystem.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
    /// Mounts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<MountJson>,
    /// Signal to stop the container.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub stop_signal: String,
    /// Time to wait after the stop signal before killing, in nanoseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_grace_period: Option<i64>,
    /// Health check.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub healthcheck: Option<HealthcheckJson>,
    /// `IP hostname` entries for /etc/hosts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    /// DNS settings.
    #[serde(rename = "DNSConfig", skip_serializing_if = "Option::is_none")]
    pub dns_config: Option<DnsConfigJson>,
    /// Run an init process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub init: Option<bool>,
    /// Secrets exposed to the task as files.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<SecretReferenceJson>,
    /// Configs exposed to the task as files.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub configs: Vec<ConfigReferenceJson>,
    /// SELinux labels, seccomp, AppArmor, no-new-privileges (a credential spec is refused:
    /// `json::unsupported`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub privileges: Option<PrivilegesJson>,
    /// Isolation technology: read only to be refused ("default" is accepted: it is what Linux has).
    #[serde(skip_serializing)]
    pub isolation: serde_json::Value,
    /// Namespaced kernel parameters.
    #[serde(skip_serializing_if = "is_empty_map")]
    pub sysctls: BTreeMap<String, String>,
    /// Capabilities added.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub capability_add: Vec<String>,
    /// Capabilities dropped.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub capability_drop: Vec<String>,
    /// Resource limits (`ulimit`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ulimits: Vec<UlimitJson>,
    /// OOM killer score adjustment (-1000..1000).
    #[serde(skip_serializing_if = "is_zero")]
    pub oom_score_adj: i64,
}

/// `ContainerSpec.Ulimits[]` (Go's `units.Ulimit`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct UlimitJson {
    /// The resource, as `ulimit` names it (`nofile`, `nproc`, `core`, ...).
    pub name: String,
    /// The hard limit.
    pub hard: i64,
    /// The soft limit.
    pub soft: i64,
}

/// `ContainerSpec.Privileges`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct PrivilegesJson {
    /// A Windows credential spec: read only to be refused (`json::unsupported`), Linux has none; shown
    /// as `null`, as Docker shows an unset one.
    pub credential_spec: serde_json::Value,
    /// SELinux labels of the container.
    #[serde(rename = "SELinuxContext")]
    pub selinux_context: Option<SeLinuxContextJson>,
    /// Seccomp profile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seccomp: Option<SeccompJson>,
    /// AppArmor profile.
    #[serde(rename = "AppArmor", skip_serializing_if = "Option::is_none")]
    pub apparmor: Option<AppArmorJson>,
    /// Set the no_new_privs bit.
    pub no_new_privileges: bool,
}

/// `Privileges.SELinuxContext`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct SeLinuxContextJson {
    /// Disable labelling.
    pub disable: bool,
    /// SELinux user label.
    pub user: String,
    /// SELinux role label.
    pub role: String,
    /// SELinux type label.
    #[serde(rename = "Type")]
    pub kind: String,
    /// SELinux level label.
    pub level: String,
}

/// `Privileges.Seccomp`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct SeccompJson {
    /// "default", "unconfined" or "custom".
    #[serde(skip_serializing_if = "String::is_empty")]
    pub mode: String,
    /// The custom profile's JSON, base64-encoded (Go's `[]byte`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub profile: String,
}

/// `Privileges.AppArmor`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AppArmorJson {
    /// "default" or "disabled".
    #[serde(skip_serializing_if = "String::is_empty")]
    pub mode: String,
}

/// `ContainerSpec.Secrets[]`: which secret (the docker CLI sends both the ID and the name) and where.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct SecretReferenceJson {
    /// The file the secret becomes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<FileTargetJson>,
    /// The secret's ID.
    #[serde(rename = "SecretID")]
    pub secret_id: String,
    /// The secret's name.
    pub secret_name: String,
}

/// `ContainerSpec.Configs[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ConfigReferenceJson {
    /// The file the config becomes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<FileTargetJson>,
    /// A runtime target (`{}`, Windows credential specs): read only to be refused (`json::unsupported`).
    #[serde(skip_serializing)]
    pub runtime: serde_json::Value,
    /// The config's ID.
    #[serde(rename = "ConfigID")]
    pub config_id: String,
    /// The config's name.
    pub config_name: String,
}

/// `File` of a secret or config reference: the target name (relative ones are under `/run/secrets/` for
/// secrets and `/` for configs), owner and permission bits.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct FileTargetJson {
    /// Target file name.
    pub name: String,
    /// Owner user ID, as a decimal string.
    #[serde(rename = "UID")]
    pub uid: String,
    /// Owner group ID, as a decimal string.
    #[serde(rename = "GID")]
    pub gid: String,
    /// Permission bits (Go's `os.FileMode`, as a number: 0444 is 292).
    pub mode: u32,
}

impl FileTargetJson {
    fn to_api(&self) -> FileTarget {
        FileTarget { name: self.name.clone(), uid: self.uid.clone(), gid: self.gid.clone(), mode: self.mode }
    }
    fn from_api(f: &FileTarget) -> FileTargetJson {
        FileTargetJson { name: f.name.clone(), uid: f.uid.clone(), gid: f.gid.clone(), mode: f.mode }
    }
}

impl SecretReferenceJson {
    fn to_api(&self) -> SecretReference {
        SecretReference {
            secret_id: self.secret_id.clone(),
            secret_name: self.secret_name.clone(),
            target: self.file.as_ref().map(|f| secret_reference::Target::File(f.to_api())),
        }
    }
    fn from_api(r: &SecretReference) -> SecretReferenceJson {
        SecretReferenceJson {
            file: r.target.as_ref().map(|secret_reference::Target::File(f)| FileTargetJson::from_api(f)),
            secret_id: r.secret_id.clone(),
            secret_name: r.secret_name.clone(),
        }
    }
}

impl ConfigReferenceJson {
    /// As the engine's `configReferencesToGRPC`: exactly one of File and Runtime.
    fn to_api(&self, i: usize) -> Result<ConfigReference, ConvertError> {
        let target = match (&self.file, !self.runtime.is_null()) {
            (None, false) => {
                return Err(ConvertError(format!(
                    "invalid Config: TaskTemplate.ContainerSpec.Configs[{i}]: either File or Runtime should be set"
                )))
            }
            (Some(_), true) => {
                return Err(ConvertError(format!(
                    "invalid Config: TaskTemplate.ContainerSpec.Configs[{i}]: cannot specify both File and Runtime"
                )))
            }
            (None, true) => config_reference::Target::Runtime(RuntimeTarget {}),
            (Some(f), false) => config_reference::Target::File(f.to_api()),
        };
        Ok(ConfigReference {
            config_id: self.config_id.clone(),
            config_name: self.config_name.clone(),
            target: Some(target),
        })
    }
    fn from_api(r: &ConfigReference) -> ConfigReferenceJson {
        ConfigReferenceJson {
            file: match &r.target {
                Some(config_reference::Target::File(f)) => Some(FileTargetJson::from_api(f)),
                _ => None,
            },
            runtime: match &r.target {
                Some(config_reference::Target::Runtime(_)) => serde_json::json!({}),
                _ => serde_json::Value::Null,
            },
            config_id: r.config_id.clone(),
            config_name: r.config_name.clone(),
        }
    }
}

/// `ContainerSpec.Mounts[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct MountJson {
    /// "bind", "volume", "tmpfs", "npipe" or "cluster".
    #[serde(rename = "Type")]
    pub kind: String,
    /// Source path or volume name.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub source: String,
    /// Path in the container.
    pub target: String,
    /// Mount read-only.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
    /// Volume options (a volume mount only): the engine creates the named volume with them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_options: Option<VolumeOptionsJson>,
    /// Bind options (a bind mount only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bind_options: Option<BindOptionsJson>,
    /// Tmpfs options (a tmpfs mount only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tmpfs_options: Option<TmpfsOptionsJson>,
    /// Cluster volume options: read only to be refused (`json::unsupported`), as is the field below.
    /// Cluster volume options.
    #[serde(skip_serializing)]
    pub cluster_options: serde_json::Value,
    /// How far the host's and the container's views may differ: "default", "consistent", "cached" or
    /// "delegated" (a Docker Desktop setting; engines on Linux apply nothing for it).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub consistency: String,
}

/// `Mount.BindOptions`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct BindOptionsJson {
    /// "rprivate" (the default), "private", "rshared", "shared", "rslave" or "slave".
    #[serde(skip_serializing_if = "String::is_empty")]
    pub propagation: String,
    /// Do not bind the mounts below the source.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub non_recursive: bool,
    /// Create the source on the node when it is missing (Engine API 1.42+).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub create_mountpoint: bool,
    /// Make only the top mount read-only.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub read_only_non_recursive: bool,
    /// Fail unless every mount below is read-only too (Engine API 1.44+).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub read_only_force_recursive: bool,
}

/// `Mount.TmpfsOptions`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct TmpfsOptionsJson {
    /// Size in bytes (0: the engine's default, half the memory).
    #[serde(skip_serializing_if = "is_zero")]
    pub size_bytes: i64,
    /// Permission bits of its root (Go's `os.FileMode`, as a number).
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub mode: u32,
    /// Extra mount options: `[["noexec"], ["nr_inodes", "1k"]]` (Engine API 1.46+).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<Vec<String>>,
}

/// `Mount.VolumeOptions`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct VolumeOptionsJson {
    /// Do not populate a new volume with the image's files at the target.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub no_copy: bool,
    /// Labels of the volume the engine creates.
    #[serde(skip_serializing_if = "is_empty_map")]
    pub labels: BTreeMap<String, String>,
    /// The volume driver and its options.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_config: Option<DriverJson>,
    /// A path inside the volume (Engine API 1.45+).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub subpath: String,
}

/// `HealthConfig`; durations in nanoseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct HealthcheckJson {
    /// The test (`["CMD", ...]`, `["CMD-SHELL", "..."]` or `["NONE"]`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub test: Vec<String>,
    /// Time between checks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval: Option<i64>,
    /// Time a check may take.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
    /// Consecutive failures to be unhealthy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retries: Option<i32>,
    /// Grace period at start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_period: Option<i64>,
    /// Time between checks during the start period.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_interval: Option<i64>,
}

/// `ContainerSpec.DNSConfig`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct DnsConfigJson {
    /// Name servers.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    /// Search domains.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    /// resolv.conf options.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// `TaskSpec.Resources`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ResourcesJson {
    /// Hard limits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits: Option<ResourceValuesJson>,
    /// What the scheduler reserves.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reservations: Option<ResourceValuesJson>,
}

/// CPU (in 1e-9 CPUs) and memory (bytes).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ResourceValuesJson {
    /// CPU in units of 1e-9 CPUs.
    #[serde(rename = "NanoCPUs", skip_serializing_if = "is_zero")]
    pub nano_cpus: i64,
    /// Memory in bytes.
    #[serde(skip_serializing_if = "is_zero")]
    pub memory_bytes: i64,
    /// Process count limit (`Limits` only; stored as the container spec's `pids_limit`, as Docker does).
    #[serde(skip_serializing_if = "is_zero")]
    pub pids: i64,
    /// Generic resources: what a node offers (node description) or a task reserves (`Reservations` only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub generic_resources: Vec<GenericResourceJson>,
}

/// One generic resource: `{"DiscreteResourceSpec": {"Kind": "ssd", "Value": 2}}` or
/// `{"NamedResourceSpec": {"Kind": "gpu", "Value": "UUID1"}}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct GenericResourceJson {
    /// A named unit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub named_resource_spec: Option<NamedResourceJson>,
    /// A count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discrete_resource_spec: Option<DiscreteResourceJson>,
}

/// `NamedResourceSpec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct NamedResourceJson {
    /// The kind, e.g. "gpu".
    pub kind: String,
    /// The unit's name.
    pub value: String,
}

/// `DiscreteResourceSpec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct DiscreteResourceJson {
    /// The kind, e.g. "ssd".
    pub kind: String,
    /// How many units.
    pub value: i64,
}

impl GenericResourceJson {
    /// Converts to the API form; `field` names the list in errors.
    pub fn to_api(&self, field: &str) -> Result<shoal_api::GenericResource, ConvertError> {
        match (&self.named_resource_spec, &self.discrete_resource_spec) {
            (Some(n), None) => Ok(shoal_api::generic::named(&n.kind, &n.value)),
            (None, Some(d)) => Ok(shoal_api::generic::discrete(&d.kind, d.value)),
            _ => Err(ConvertError(format!(
                "{field}: each entry needs exactly one of NamedResourceSpec and DiscreteResourceSpec"
            ))),
        }
    }

    /// Converts from the API form.
    pub fn from_api(g: &shoal_api::GenericResource) -> GenericResourceJson {
        use shoal_api::generic_resource::Resource;
        match &g.resource {
            Some(Resource::NamedResourceSpec(n)) => GenericResourceJson {
                named_resource_spec: Some(NamedResourceJson { kind: n.kind.clone(), value: n.value.clone() }),
                ..Default::default()
            },
            Some(Resource::DiscreteResourceSpec(d)) => GenericResourceJson {
                discrete_resource_spec: Some(DiscreteResourceJson { kind: d.kind.clone(), value: d.value }),
                ..Default::default()
            },
            None => GenericResourceJson::default(),
        }
    }
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

/// `TaskSpec.RestartPolicy`; durations in nanoseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct RestartPolicyJson {
    /// "none", "on-failure" or "any" (the default).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub condition: String,
    /// Delay between restarts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay: Option<i64>,
    /// Restarts allowed in the window (0: unlimited).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u64>,
    /// Window over which restarts are counted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<i64>,
}

/// `TaskSpec.Placement`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct PlacementJson {
    /// `key==value` / `key!=value` constraints.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub constraints: Vec<String>,
    /// Spread preferences.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub preferences: Vec<PreferenceJson>,
    /// Platforms the image runs on.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub platforms: Vec<PlatformJson>,
    /// Most replicas of this service per node (0: unlimited).
    #[serde(skip_serializing_if = "is_zero_u64")]
    pub max_replicas: u64,
}

fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

/// `Placement.Preferences[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct PreferenceJson {
    /// Spread over the values of a label.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spread: Option<SpreadJson>,
}

/// `{"SpreadDescriptor": "node.labels.zone"}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct SpreadJson {
    /// The label to spread over.
    pub spread_descriptor: String,
}

/// `{"Architecture": ..., "OS": ...}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct PlatformJson {
    /// e.g. "x86_64".
    pub architecture: String,
    /// e.g. "linux".
    #[serde(rename = "OS")]
    pub os: String,
}

/// `{"Name": ..., "Options": {...}}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct DriverJson {
    /// Driver name.
    pub name: String,
    /// Driver options.
    #[serde(skip_serializing_if = "is_empty_map")]
    pub options: BTreeMap<String, String>,
}

/// `UpdateConfig` / `RollbackConfig`; durations in nanoseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct UpdateConfigJson {
    /// Tasks updated at once (0: all).
    pub parallelism: u64,
    /// Delay between batches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay: Option<i64>,
    /// "pause", "continue" or "rollback".
    #[serde(skip_serializing_if = "String::is_empty")]
    pub failure_action: String,
    /// How long to watch a task after its update.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub monitor: Option<i64>,
    /// Failure ratio tolerated.
    pub max_failure_ratio: f32,
    /// "stop-first" or "start-first".
    #[serde(skip_serializing_if = "String::is_empty")]
    pub order: String,
}

/// `EndpointSpec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct EndpointSpecJson {
    /// "vip" or "dnsrr".
    #[serde(skip_serializing_if = "String::is_empty")]
    pub mode: String,
    /// Published ports.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortJson>,
}

/// `EndpointPortConfig`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct PortJson {
    /// Port name.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// "tcp", "udp" or "sctp".
    pub protocol: String,
    /// Port inside the container.
    pub target_port: u32,
    /// Port published on the node(s).
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub published_port: u32,
    /// "ingress" or "host".
    pub publish_mode: String,
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

const RESTART: &[(&str, restart_policy::RestartCondition)] = &[
    ("none", restart_policy::RestartCondition::None),
    ("on-failure", restart_policy::RestartCondition::OnFailure),
    ("any", restart_policy::RestartCondition::Any),
];
const FAILURE_ACTION: &[(&str, update_config::FailureAction)] = &[
    ("pause", update_config::FailureAction::Pause),
    ("continue", update_config::FailureAction::Continue),
    ("rollback", update_config::FailureAction::Rollback),
];
const ORDER: &[(&str, update_config::UpdateOrder)] =
    &[("stop-first", update_config::UpdateOrder::StopFirst), ("start-first", update_config::UpdateOrder::StartFirst)];
const ENDPOINT_MODE: &[(&str, endpoint_spec::ResolutionMode)] =
    &[("vip", endpoint_spec::ResolutionMode::Vip), ("dnsrr", endpoint_spec::ResolutionMode::Dnsrr)];
const PROTOCOL: &[(&str, port_config::Protocol)] =
    &[("tcp", port_config::Protocol::Tcp), ("udp", port_config::Protocol::Udp), ("sctp", port_config::Protocol::Sctp)];
const PUBLISH_MODE: &[(&str, port_config::PublishMode)] =
    &[("ingress", port_config::PublishMode::Ingress), ("host", port_config::PublishMode::Host)];
const MOUNT_TYPE: &[(&str, mount::Type)] = &[
    ("bind", mount::Type::Bind),
    ("volume", mount::Type::Volume),
    ("tmpfs", mount::Type::Tmpfs),
    ("npipe", mount::Type::Npipe),
    ("cluster", mount::Type::Cluster),
];

impl ServiceSpecJson {
    /// Converts to the API spec. Unknown enum strings and negative replica counts are errors; a missing mode
    /// means one replica (as Docker does).
    pub fn to_api(&self) -> Result<ServiceSpec, ConvertError> {
        let m = &self.mode;
        let modes = [m.replicated.is_some(), m.global.is_some(), m.replicated_job.is_some(), m.global_job.is_some()];
        if modes.iter().filter(|set| **set).count() > 1 {
            // The engine's words (daemon/cluster/convert): one of Replicated, Global, ReplicatedJob, GlobalJob.
            return Err(ConvertError(
                "must specify only one service mode: set one of Mode.Replicated, Mode.Global, Mode.ReplicatedJob, \
                 Mode.GlobalJob"
                    .into(),
            ));
        }
        let mode = if let Some(r) = &self.mode.replicated {
            let replicas = r.replicas.unwrap_or(1);
            if replicas < 0 {
                return Err(ConvertError(format!(
                    "invalid Mode.Replicated.Replicas {replicas}: the replica count must be 0 or more"
                )));
            }
            service_spec::Mode::Replicated(ReplicatedService { replicas: replicas as u64 })
        } else if self.mode.global.is_some() {
            service_spec::Mode::Global(GlobalService {})
        } else if let Some(j) = &self.mode.replicated_job {
            {
                // As the engine (daemon/cluster/convert): MaxConcurrent defaults to 1, TotalCompletions to
                // MaxConcurrent.
                let max_concurrent = j.max_concurrent.unwrap_or(1);
                service_spec::Mode::ReplicatedJob(ReplicatedJob {
                    max_concurrent,
                    total_completions: j.total_completions.unwrap_or(max_concurrent),
                })
            }
        } else if self.mode.global_job.is_some() {
            service_spec::Mode::GlobalJob(GlobalJob {})
        } else {
            service_spec::Mode::Replicated(ReplicatedService { replicas: 1 })
        };
        Ok(ServiceSpec {
            annotations: Some(Annotations {
                name: self.name.clone(),
                labels: labels_from_json(&self.labels),
                indices: Vec::new(),
            }),
            task: Some(self.task_template.to_api()?),
            mode: Some(mode),
            update: self.update_config.as_ref().map(|u| u.to_api("UpdateConfig")).transpose()?,
            rollback: self.rollback_config.as_ref().map(|u| u.to_api("RollbackConfig")).transpose()?,
            endpoint: self.endpoint_spec.as_ref().map(EndpointSpecJson::to_api).transpose()?,
            networks: self.networks.iter().map(NetworkAttachmentJson::to_api).collect(),
        })
    }

    /// Converts from the API spec.
    pub fn from_api(s: &ServiceSpec) -> ServiceSpecJson {
        let ann = s.annotations.clone().unwrap_or_default();
        let mut mode = ModeJson::default();
        match &s.mode {
            Some(service_spec::Mode::Replicated(r)) => {
                mode.replicated = Some(ReplicatedJson { replicas: Some(r.replicas as i64) })
            }
            Some(service_spec::Mode::Global(_)) => mode.global = Some(Empty {}),
            Some(service_spec::Mode::ReplicatedJob(j)) => {
                mode.replicated_job = Some(ReplicatedJobJson {
                    max_concurrent: Some(j.max_concurrent),
                    total_completions: Some(j.total_completions),
                })
            }
            Some(service_spec::Mode::GlobalJob(_)) => mode.global_job = Some(Empty {}),
            None => {}
        }
        ServiceSpecJson {
            name: ann.name,
            labels: labels_to_json(&ann.labels),
            task_template: s.task.as_ref().map(TaskSpecJson::from_api).unwrap_or_default(),
            mode,
            update_config: s.update.as_ref().map(UpdateConfigJson::from_api),
            rollback_config: s.rollback.as_ref().map(UpdateConfigJson::from_api),
            endpoint_spec: s.endpoint.as_ref().map(EndpointSpecJson::from_api),
            networks: s.networks.iter().map(NetworkAttachmentJson::from_api).collect(),
        }
    }
}

/// SwarmKit's defaults (`api/defaults`), which `GET /services/{id}?insertDefaults=true` fills into what a
/// spec leaves unset, as the engine does for `docker service inspect` and `docker service update`.
const DEFAULT_STOP_GRACE_NS: i64 = 10_000_000_000;
const DEFAULT_RESTART_DELAY_NS: i64 = 5_000_000_000;
const DEFAULT_MONITOR_NS: i64 = 5_000_000_000;

fn default_update_config() -> UpdateConfigJson {
    UpdateConfigJson {
        parallelism: 1,
        failure_action: "pause".into(),
        monitor: Some(DEFAULT_MONITOR_NS),
        order: "stop-first".into(),
        ..Default::default()
    }
}

impl ServiceSpecJson {
    /// This spec with SwarmKit's defaults where it leaves a setting unset (`insertDefaults=true`).
    pub fn with_defaults(mut self) -> ServiceSpecJson {
        let t = &mut self.task_template;
        if let Some(c) = t.container_spec.as_mut() {
            c.stop_grace_period.get_or_insert(DEFAULT_STOP_GRACE_NS);
            c.dns_config.get_or_insert_with(Default::default);
        }
        t.resources.get_or_insert_with(|| ResourcesJson {
            limits: Some(Default::default()),
            reservations: Some(Default::default()),
        });
        let restart =
            t.restart_policy.get_or_insert_with(|| RestartPolicyJson { condition: "any".into(), ..Default::default() });
        restart.delay.get_or_insert(DEFAULT_RESTART_DELAY_NS);
        t.placement.get_or_insert_with(Default::default);
        self.update_config.get_or_insert_with(default_update_config);
        self.rollback_config.get_or_insert_with(default_update_config);
        self
    }
}

impl TaskSpecJson {
    /// Converts to the API task spec.
    pub fn to_api(&self) -> Result<TaskSpec, ConvertError> {
        if !self.runtime.is_empty() && self.runtime != "container" {
            return Err(ConvertError::bad_value("TaskTemplate.Runtime", &self.runtime, &["container"]));
        }
        let mut runtime = self.container_spec.as_ref().map(|c| c.to_api()).transpose()?;
        // Docker keeps the process count limit in the container spec (SwarmKit's `pidsLimit`).
        let pids = self.resources.as_ref().and_then(|r| r.limits.as_ref()).map_or(0, |l| l.pids);
        if let Some(c) = runtime.as_mut() {
            c.pids_limit = pids;
        }
        Ok(TaskSpec {
            runtime: runtime.map(task_spec::Runtime::Container),
            resources: self
                .resources
                .as_ref()
                .map(|r| -> Result<_, ConvertError> {
                    Ok(ResourceRequirements {
                        limits: r.limits.as_ref().map(|l| l.to_api("Resources.Limits")).transpose()?,
                        reservations: r
                            .reservations
                            .as_ref()
                            .map(|l| l.to_api("Resources.Reservations"))
                            .transpose()?,
                        ..Default::default()
                    })
                })
                .transpose()?,
            restart: self.restart_policy.as_ref().map(RestartPolicyJson::to_api).transpose()?,
            placement: self.placement.as_ref().map(PlacementJson::to_api),
            log_driver: self.log_driver.as_ref().map(DriverJson::to_api),
            networks: self.networks.iter().map(NetworkAttachmentJson::to_api).collect(),
            force_update: self.force_update,
        })
    }

    /// Converts from the API task spec.
    pub fn from_api(t: &TaskSpec) -> TaskSpecJson {
        TaskSpecJson {
            container_spec: match &t.runtime {
                Some(task_spec::Runtime::Container(c)) => Some(ContainerSpecJson::from_api(c)),
                _ => None,
            },
            network_attachment_spec: match &t.runtime {
                Some(task_spec::Runtime::Attachment(a)) => serde_json::json!({"ContainerID": a.container_id}),
                _ => serde_json::Value::Null,
            },
            resources: {
                let pids = match &t.runtime {
                    Some(task_spec::Runtime::Container(c)) => c.pids_limit,
                    _ => 0,
                };
                let mut resources = t.resources.as_ref().map(|r| ResourcesJson {
                    limits: r.limits.as_ref().map(ResourceValuesJson::from_api),
                    reservations: r.reservations.as_ref().map(ResourceValuesJson::from_api),
                });
                if pids != 0 {
                    let r = resources.get_or_insert_with(Default::default);
                    r.limits.get_or_insert_with(Default::default).pids = pids;
                }
                resources
            },
            restart_policy: t.restart.as_ref().map(RestartPolicyJson::from_api),
            placement: t.placement.as_ref().map(PlacementJson::from_api),
            log_driver: t.log_driver.as_ref().map(DriverJson::from_api),
            networks: t.networks.iter().map(NetworkAttachmentJson::from_api).collect(),
            force_update: t.force_update,
            runtime: match &t.runtime {
                Some(task_spec::Runtime::Container(_)) => "container".into(),
                Some(task_spec::Runtime::Attachment(_)) => "attachment".into(),
                None => String::new(),
            },
            ..Default::default()
        }
    }
}

impl ContainerSpecJson {
    fn to_api(&self) -> Result<ContainerSpec, ConvertError> {
        Ok(ContainerSpec {
            image: self.image.clone(),
            labels: labels_from_json(&self.labels),
            command: self.command.clone(),
            args: self.args.clone(),
            env: self.env.clone(),
            dir: self.dir.clone(),
            user: self.user.clone(),
            mounts: self.mounts.iter().map(MountJson::to_api).collect::<Result<_, _>>()?,
            stop_grace_period: self.stop_grace_period.map(duration_from_ns),
            // From the `X-Registry-Auth` header, never the body (`handlers::carry_registry_auth`).
            pull_options: None,
            groups: self.groups.clone(),
            tty: self.tty,
            hostname: self.hostname.clone(),
            dns_config: self.dns_config.as_ref().map(|d| container_spec::DnsConfig {
                nameservers: d.nameservers.clone(),
                search: d.search.clone(),
                options: d.options.clone(),
            }),
            healthcheck: self.healthcheck.as_ref().map(|h| HealthConfig {
                test: h.test.clone(),
                interval: h.interval.map(duration_from_ns),
                timeout: h.timeout.map(duration_from_ns),
                retries: h.retries.unwrap_or(0),
                start_period: h.start_period.map(duration_from_ns),
                start_interval: h.start_interval.map(duration_from_ns),
            }),
            hosts: self.hosts.clone(),
            open_stdin: self.open_stdin,
            read_only: self.read_only,
            stop_signal: self.stop_signal.clone(),
            secrets: self.secrets.iter().map(SecretReferenceJson::to_api).collect(),
            configs: self.configs.iter().enumerate().map(|(i, c)| c.to_api(i)).collect::<Result<_, _>>()?,
            // Set by the task spec's conversion, from `Resources.Limits.Pids`.
            pids_limit: 0,
            init: self.init,
            privileges: self.privileges.as_ref().map(PrivilegesJson::to_api).transpose()?,
            // Anything but the default is refused (`json::unsupported`).
            isolation: container_spec::Isolation::Default as i32,
            sysctls: labels_from_json(&self.sysctls),
            capability_add: self.capability_add.clone(),
            capability_drop: self.capability_drop.clone(),
            ulimits: self
                .ulimits
                .iter()
                .map(|u| container_spec::Ulimit { name: u.name.clone(), soft: u.soft, hard: u.hard })
                .collect(),
            oom_score_adj: self.oom_score_adj,
        })
    }

    fn from_api(c: &ContainerSpec) -> ContainerSpecJson {
        ContainerSpecJson {
            image: c.image.clone(),
            labels: labels_to_json(&c.labels),
            command: c.command.clone(),
            args: c.args.clone(),
            hostname: c.hostname.clone(),
            env: c.env.clone(),
            dir: c.dir.clone(),
            user: c.user.clone(),
            groups: c.groups.clone(),
            tty: c.tty,
            open_stdin: c.open_stdin,
            read_only: c.read_only,
            mounts: c.mounts.iter().map(MountJson::from_api).collect(),
            stop_signal: c.stop_signal.clone(),
            stop_grace_period: opt_ns(c.stop_grace_period.as_ref()),
            healthcheck: c.healthcheck.as_ref().map(|h| HealthcheckJson {
                test: h.test.clone(),
                interval: opt_ns(h.interval.as_ref()),
                timeout: opt_ns(h.timeout.as_ref()),
                retries: (h.retries != 0).then_some(h.retries),
                start_period: opt_ns(h.start_period.as_ref()),
                start_interval: opt_ns(h.start_interval.as_ref()),
            }),
            hosts: c.hosts.clone(),
            dns_config: c.dns_config.as_ref().map(|d| DnsConfigJson {
                nameservers: d.nameservers.clone(),
                search: d.search.clone(),
                options: d.options.clone(),
            }),
            init: c.init,
            secrets: c.secrets.iter().map(SecretReferenceJson::from_api).collect(),
            configs: c.configs.iter().map(ConfigReferenceJson::from_api).collect(),
            privileges: c.privileges.as_ref().map(PrivilegesJson::from_api),
            sysctls: labels_to_json(&c.sysctls),
            capability_add: c.capability_add.clone(),
            capability_drop: c.capability_drop.clone(),
            ulimits: c
                .ulimits
                .iter()
                .map(|u| UlimitJson { name: u.name.clone(), hard: u.hard, soft: u.soft })
                .collect(),
            oom_score_adj: c.oom_score_adj,
            ..Default::default()
        }
    }
}

impl PrivilegesJson {
    /// As the engine's `containerToGRPC`: the credential spec is left out (refused before: Linux has none).
    fn to_api(&self) -> Result<Privileges, ConvertError> {
        let mut p = Privileges {
            credential_spec: None,
            selinux_context: self.selinux_context.as_ref().map(|c| privileges::SeLinuxContext {
                disable: c.disable,
                user: c.user.clone(),
                role: c.role.clone(),
                r#type: c.kind.clone(),
                level: c.level.clone(),
            }),
            seccomp: None,
            apparmor: None,
            no_new_privileges: self.no_new_privileges,
        };
        if let Some(sc) = &self.seccomp {
            let mut o = privileges::SeccompOpts::default();
            o.set_mode(enum_from_str("Privileges.Seccomp.Mode", &sc.mode, SECCOMP_MODE, SeccompMode::Default)?);
            if !sc.profile.is_empty() {
                use base64::Engine as _;
                o.profile = base64::engine::general_purpose::STANDARD.decode(&sc.profile).map_err(|e| {
                    ConvertError(format!(
                        "Privileges.Seccomp.Profile: expected the profile's JSON in base64 (a []byte, as Go encodes \
                         it): {e}"
                    ))
                })?;
            }
            // As the engine's: a profile only with mode custom, and custom only with one.
            match (o.mode(), o.profile.is_empty()) {
                (SeccompMode::Custom, true) => {
                    return Err(ConvertError("invalid privileges: custom seccomp mode requires a profile".into()))
                }
                (SeccompMode::Default | SeccompMode::Unconfined, false) => {
                    return Err(ConvertError(format!(
                        "invalid privileges: seccomp mode {} takes no profile; use mode custom",
                        enum_to_str(o.mode(), SECCOMP_MODE)
                    )))
                }
                _ => {}
            }
            p.seccomp = Some(o);
        }
        if let Some(a) = &self.apparmor {
            let mut o = privileges::AppArmorOpts::default();
            o.set_mode(enum_from_str("Privileges.AppArmor.Mode", &a.mode, APPARMOR_MODE, AppArmorMode::Default)?);
            p.apparmor = Some(o);
        }
        Ok(p)
    }

    fn from_api(p: &Privileges) -> PrivilegesJson {
        use base64::Engine as _;
        PrivilegesJson {
            credential_spec: serde_json::Value::Null,
            selinux_context: p.selinux_context.as_ref().map(|c| SeLinuxContextJson {
                disable: c.disable,
                user: c.user.clone(),
                role: c.role.clone(),
                kind: c.r#type.clone(),
                level: c.level.clone(),
            }),
            seccomp: p.seccomp.as_ref().map(|o| SeccompJson {
                mode: enum_to_str(o.mode(), SECCOMP_MODE).into(),
                profile: if o.profile.is_empty() {
                    String::new()
                } else {
                    base64::engine::general_purpose::STANDARD.encode(&o.profile)
                },
            }),
            apparmor: p.apparmor.as_ref().map(|o| AppArmorJson { mode: enum_to_str(o.mode(), APPARMOR_MODE).into() }),
            no_new_privileges: p.no_new_privileges,
        }
    }
}

const SECCOMP_MODE: &[(&str, SeccompMode)] =
    &[("default", SeccompMode::Default), ("unconfined", SeccompMode::Unconfined), ("custom", SeccompMode::Custom)];
const APPARMOR_MODE: &[(&str, AppArmorMode)] =
    &[("default", AppArmorMode::Default), ("disabled", AppArmorMode::Disabled)];
const CONSISTENCY: &[(&str, mount::Consistency)] = &[
    ("default", mount::Consistency::Default),
    ("consistent", mount::Consistency::Consistent),
    ("cached", mount::Consistency::Cached),
    ("delegated", mount::Consistency::Delegated),
];
const PROPAGATION: &[(&str, Propagation)] = &[
    ("rprivate", Propagation::Rprivate),
    ("private", Propagation::Private),
    ("rshared", Propagation::Rshared),
    ("shared", Propagation::Shared),
    ("rslave", Propagation::Rslave),
    ("slave", Propagation::Slave),
];

/// Go's `[][]string` tmpfs options as SwarmKit's one string (`noexec,nr_inodes=1k`).
fn tmpfs_options_to_api(i: &[Vec<String>]) -> Result<String, ConvertError> {
    let mut parts = Vec::with_capacity(i.len());
    for o in i {
        match o.as_slice() {
            [flag] if !flag.is_empty() && !flag.contains([',', '=']) => parts.push(flag.clone()),
            [k, v] if !k.is_empty() && !k.contains([',', '=']) && !v.contains(',') => parts.push(format!("{k}={v}")),
            _ => {
                return Err(ConvertError(format!(
                    "TmpfsOptions.Options: invalid option {o:?}: each is [\"flag\"] or [\"key\", \"value\"], \
                     without commas"
                )))
            }
        }
    }
    Ok(parts.join(","))
}

/// SwarmKit's tmpfs options string as Go's `[][]string`.
fn tmpfs_options_from_api(s: &str) -> Vec<Vec<String>> {
    s.split(',')
        .filter(|o| !o.is_empty())
        .map(|o| match o.split_once('=') {
            Some((k, v)) => vec![k.to_string(), v.to_string()],
            None => vec![o.to_string()],
        })
        .collect()
}

impl MountJson {
    fn to_api(&self) -> Result<Mount, ConvertError> {
        let mut m = Mount {
            source: self.source.clone(),
            target: self.target.clone(),
            readonly: self.read_only,
            ..Default::default()
        };
        m.set_type(enum_from_str("Mount.Type", &self.kind, MOUNT_TYPE, mount::Type::Volume)?);
        m.set_consistency(enum_from_str(
            "Mount.Consistency",
            &self.consistency,
            CONSISTENCY,
            mount::Consistency::Default,
        )?);
        if let Some(v) = &self.volume_options {
            // As the engine answers for a container's mount.
            if m.r#type() != mount::Type::Volume {
                return Err(ConvertError(format!(
                    "VolumeOptions must not be specified on mount type {:?}: only a volume mount takes them",
                    enum_to_str(m.r#type(), MOUNT_TYPE)
                )));
            }
            m.volume_options = Some(mount::VolumeOptions {
                nocopy: v.no_copy,
                labels: labels_from_json(&v.labels),
                driver_config: v
                    .driver_config
                    .as_ref()
                    .filter(|d| !d.name.is_empty() || !d.options.is_empty())
                    .map(|d| Driver { name: d.name.clone(), options: labels_from_json(&d.options) }),
                subpath: v.subpath.clone(),
            });
        }
        // As the engine answers for a container's mount.
        let kind_sent = m.r#type();
        let only_on = |field: &str, kind: mount::Type| {
            ConvertError(format!(
                "{field} must not be specified on mount type {:?}: only a {} mount takes them",
                enum_to_str(kind_sent, MOUNT_TYPE),
                enum_to_str(kind, MOUNT_TYPE)
            ))
        };
        if let Some(b) = &self.bind_options {
            if kind_sent != mount::Type::Bind {
                return Err(only_on("BindOptions", mount::Type::Bind));
            }
            let mut o = mount::BindOptions {
                nonrecursive: b.non_recursive,
                createmountpoint: b.create_mountpoint,
                readonlynonrecursive: b.read_only_non_recursive,
                readonlyforcerecursive: b.read_only_force_recursive,
                ..Default::default()
            };
            o.set_propagation(enum_from_str(
                "BindOptions.Propagation",
                &b.propagation.to_ascii_lowercase(),
                PROPAGATION,
                Propagation::Rprivate,
            )?);
            m.bind_options = Some(o);
        }
        if let Some(t) = &self.tmpfs_options {
            if kind_sent != mount::Type::Tmpfs {
                return Err(only_on("TmpfsOptions", mount::Type::Tmpfs));
            }
            if t.size_bytes < 0 {
                return Err(ConvertError(format!("invalid tmpfs size: {} bytes: it cannot be negative", t.size_bytes)));
            }
            m.tmpfs_options = Some(mount::TmpfsOptions {
                size_bytes: t.size_bytes,
                mode: t.mode,
                options: tmpfs_options_to_api(&t.options)?,
            });
        }
        Ok(m)
    }
    fn from_api(m: &Mount) -> MountJson {
        MountJson {
            kind: enum_to_str(m.r#type(), MOUNT_TYPE).into(),
            source: m.source.clone(),
            target: m.target.clone(),
            read_only: m.readonly,
            volume_options: m.volume_options.as_ref().map(|v| VolumeOptionsJson {
                no_copy: v.nocopy,
                labels: labels_to_json(&v.labels),
                driver_config: v
                    .driver_config
                    .as_ref()
                    .map(|d| DriverJson { name: d.name.clone(), options: labels_to_json(&d.options) }),
                subpath: v.subpath.clone(),
            }),
            bind_options: m.bind_options.as_ref().map(|b| BindOptionsJson {
                propagation: enum_to_str(b.propagation(), PROPAGATION).into(),
                non_recursive: b.nonrecursive,
                create_mountpoint: b.createmountpoint,
                read_only_non_recursive: b.readonlynonrecursive,
                read_only_force_recursive: b.readonlyforcerecursive,
            }),
            tmpfs_options: m.tmpfs_options.as_ref().map(|t| TmpfsOptionsJson {
                size_bytes: t.size_bytes,
                mode: t.mode,
                options: tmpfs_options_from_api(&t.options),
            }),
            consistency: match m.consistency() {
                mount::Consistency::Default => String::new(),
                other => enum_to_str(other, CONSISTENCY).into(),
            },
            ..Default::default()
        }
    }
}

impl ResourceValuesJson {
    /// Converts to the API form (`Pids` is not part of it: it goes to the container spec); `field` names the
    /// object in errors.
    pub fn to_api(&self, field: &str) -> Result<Resources, ConvertError> {
        Ok(Resources {
            nano_cpus: self.nano_cpus,
            memory_bytes: self.memory_bytes,
            generic: self
                .generic_resources
                .iter()
                .map(|g| g.to_api(&format!("{field}.GenericResources")))
                .collect::<Result<_, _>>()?,
        })
    }
    /// Converts from the API form.
    pub fn from_api(r: &Resources) -> ResourceValuesJson {
        ResourceValuesJson {
            nano_cpus: r.nano_cpus,
            memory_bytes: r.memory_bytes,
            generic_resources: r.generic.iter().map(GenericResourceJson::from_api).collect(),
            ..Default::default()
        }
    }
}

impl RestartPolicyJson {
    fn to_api(&self) -> Result<RestartPolicy, ConvertError> {
        let mut r = RestartPolicy {
            delay: self.delay.map(duration_from_ns),
            max_attempts: self.max_attempts.unwrap_or(0),
            window: self.window.map(duration_from_ns),
            ..Default::default()
        };
        r.set_condition(enum_from_str(
            "RestartPolicy.Condition",
            &self.condition,
            RESTART,
            restart_policy::RestartCondition::Any,
        )?);
        Ok(r)
    }
    fn from_api(r: &RestartPolicy) -> RestartPolicyJson {
        RestartPolicyJson {
            condition: enum_to_str(r.condition(), RESTART).into(),
            delay: opt_ns(r.delay.as_ref()),
            max_attempts: Some(r.max_attempts),
            window: opt_ns(r.window.as_ref()),
        }
    }
}

impl PlacementJson {
    fn to_api(&self) -> Placement {
        Placement {
            constraints: self.constraints.clone(),
            preferences: self
                .preferences
                .iter()
                .filter_map(|p| p.spread.as_ref())
                .map(|s| PlacementPreference {
                    preference: Some(placement_preference::Preference::Spread(SpreadOver {
                        spread_descriptor: s.spread_descriptor.clone(),
                    })),
                })
                .collect(),
            platforms: self
                .platforms
                .iter()
                .map(|p| Platform { architecture: p.architecture.clone(), os: p.os.clone() })
                .collect(),
            max_replicas: self.max_replicas,
        }
    }
    fn from_api(p: &Placement) -> PlacementJson {
        PlacementJson {
            constraints: p.constraints.clone(),
            preferences: p
                .preferences
                .iter()
                .map(|pref| PreferenceJson {
                    spread: pref.preference.as_ref().map(|p| match p {
                        placement_preference::Preference::Spread(s) => {
                            SpreadJson { spread_descriptor: s.spread_descriptor.clone() }
                        }
                    }),
                })
                .collect(),
            platforms: p
                .platforms
                .iter()
                .map(|x| PlatformJson { architecture: x.architecture.clone(), os: x.os.clone() })
                .collect(),
            max_replicas: p.max_replicas,
        }
    }
}

impl DriverJson {
    fn to_api(&self) -> Driver {
        Driver { name: self.name.clone(), options: labels_from_json(&self.options) }
    }
    fn from_api(d: &Driver) -> DriverJson {
        DriverJson { name: d.name.clone(), options: labels_to_json(&d.options) }
    }
}

impl UpdateConfigJson {
    fn to_api(&self, field: &str) -> Result<UpdateConfig, ConvertError> {
        let mut u = UpdateConfig {
            parallelism: self.parallelism,
            delay: self.delay.map(duration_from_ns),
            monitor: self.monitor.map(duration_from_ns),
            max_failure_ratio: self.max_failure_ratio,
            ..Default::default()
        };
        u.set_failure_action(enum_from_str(
            &format!("{field}.FailureAction"),
            &self.failure_action,
            FAILURE_ACTION,
            update_config::FailureAction::Pause,
        )?);
        u.set_order(enum_from_str(
            &format!("{field}.Order"),
            &self.order,
            ORDER,
            update_config::UpdateOrder::StopFirst,
        )?);
        Ok(u)
    }
    fn from_api(u: &UpdateConfig) -> UpdateConfigJson {
        UpdateConfigJson {
            parallelism: u.parallelism,
            delay: opt_ns(u.delay.as_ref()),
            failure_action: enum_to_str(u.failure_action(), FAILURE_ACTION).into(),
            monitor: opt_ns(u.monitor.as_ref()),
            max_failure_ratio: u.max_failure_ratio,
            order: enum_to_str(u.order(), ORDER).into(),
        }
    }
}

impl EndpointSpecJson {
    /// Converts to the API endpoint spec.
    /// Refused as SwarmKit's control API refuses them: an ingress-published port with DNS round robin, and
    /// two ports published on the same port number and protocol.
    pub fn to_api(&self) -> Result<EndpointSpec, ConvertError> {
        let mut e = EndpointSpec {
            ports: self.ports.iter().map(PortJson::to_api).collect::<Result<_, _>>()?,
            ..Default::default()
        };
        e.set_mode(enum_from_str("EndpointSpec.Mode", &self.mode, ENDPOINT_MODE, endpoint_spec::ResolutionMode::Vip)?);
        let mut published = std::collections::BTreeSet::new();
        for p in &e.ports {
            if p.publish_mode() == port_config::PublishMode::Ingress && e.mode() == endpoint_spec::ResolutionMode::Dnsrr
            {
                return Err(ConvertError(format!(
                    "EndpointSpec: port published with ingress mode can't be used with dnsrr mode (port {}): publish \
                     it in host mode or use vip",
                    p.published_port
                )));
            }
            if p.published_port != 0 && !published.insert((p.published_port, p.protocol)) {
                return Err(ConvertError(format!(
                    "EndpointSpec: duplicate published ports provided ({}/{})",
                    p.published_port,
                    enum_to_str(p.protocol(), PROTOCOL)
                )));
            }
        }
        Ok(e)
    }
    /// Converts from the API endpoint spec.
    pub fn from_api(e: &EndpointSpec) -> EndpointSpecJson {
        EndpointSpecJson {
            mode: enum_to_str(e.mode(), ENDPOINT_MODE).into(),
            ports: e.ports.iter().map(PortJson::from_api).collect(),
        }
    }
}

impl PortJson {
    /// Converts to the API port.
    pub fn to_api(&self) -> Result<PortConfig, ConvertError> {
        let mut p = PortConfig {
            name: self.name.clone(),
            target_port: self.target_port,
            published_port: self.published_port,
            ..Default::default()
        };
        p.set_protocol(enum_from_str("Port.Protocol", &self.protocol, PROTOCOL, port_config::Protocol::Tcp)?);
        p.set_publish_mode(enum_from_str(
            "Port.PublishMode",
            &self.publish_mode,
            PUBLISH_MODE,
            port_config::PublishMode::Ingress,
        )?);
        Ok(p)
    }
    /// Converts from the API port.
    pub fn from_api(p: &PortConfig) -> PortJson {
        PortJson {
            name: p.name.clone(),
            protocol: enum_to_str(p.protocol(), PROTOCOL).into(),
            target_port: p.target_port,
            published_port: p.published_port,
            publish_mode: enum_to_str(p.publish_mode(), PUBLISH_MODE).into(),
        }
    }
}
