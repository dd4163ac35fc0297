//! The Engine API's `Service`, `Task`, `Node` (and `NodeSpec`) and `ClusterInfo`/`Swarm` JSON, with
//! conversions to and from the stored `shoal_api` objects. Must not depend on HTTP or the store.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use shoal_api::{
    node_spec, node_status, raft_member_status, task_status, update_status, Cluster, ContainerStatus, Meta, Node,
    NodeRole, NodeSpec, Service, Task, TaskState, TaskStatus,
};

use super::common::*;
use super::spec::{DriverJson, EndpointSpecJson, PlatformJson, PortJson, ServiceSpecJson, TaskSpecJson};

pub(crate) fn meta_parts(meta: Option<&Meta>) -> (VersionJson, String, String) {
    (
        VersionJson::from_api(meta.and_then(|m| m.version.as_ref())),
        time_to_json(meta.and_then(|m| m.created_at.as_ref())),
        time_to_json(meta.and_then(|m| m.updated_at.as_ref())),
    )
}

fn meta_from(version: VersionJson, created: &str, updated: &str) -> Result<Meta, ConvertError> {
    Ok(Meta {
        version: Some(version.to_api()),
        created_at: time_from_json("CreatedAt", created)?,
        updated_at: time_from_json("UpdatedAt", updated)?,
    })
}

/// `Service`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ServiceJson {
    /// Service ID.
    #[serde(rename = "ID")]
    pub id: String,
    /// Version to pass to an update.
    pub version: VersionJson,
    /// Creation time.
    pub created_at: String,
    /// Last update time.
    pub updated_at: String,
    /// The current spec.
    pub spec: ServiceSpecJson,
    /// The spec before the last update.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_spec: Option<ServiceSpecJson>,
    /// Endpoint state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<EndpointJson>,
    /// Rolling update state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub update_status: Option<UpdateStatusJson>,
    /// Task counts (only with `status=true` on list).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_status: Option<ServiceStatusJson>,
    /// A job's iteration and last run (job modes only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_status: Option<JobStatusJson>,
}

/// `Service.JobStatus`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct JobStatusJson {
    /// Raised each time the job runs again (each spec update); its tasks carry it as `JobIteration`.
    pub job_iteration: VersionJson,
    /// When the job last started to run.
    pub last_execution: String,
}

/// `Service.Endpoint`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct EndpointJson {
    /// The endpoint spec in effect.
    pub spec: EndpointSpecJson,
    /// Allocated ports.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortJson>,
    /// The service's address on each of its networks (VIP mode).
    #[serde(rename = "VirtualIPs", skip_serializing_if = "Vec::is_empty")]
    pub virtual_ips: Vec<super::network::VirtualIpJson>,
}

/// `Service.UpdateStatus`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct UpdateStatusJson {
    /// "updating", "paused", "completed", "rollback_started", "rollback_paused", "rollback_completed".
    #[serde(skip_serializing_if = "String::is_empty")]
    pub state: String,
    /// When the update started.
    pub started_at: String,
    /// When it finished.
    pub completed_at: String,
    /// Why it is in this state.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// `Service.ServiceStatus`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ServiceStatusJson {
    /// Tasks running (and meant to).
    pub running_tasks: u64,
    /// Tasks wanted.
    pub desired_tasks: u64,
    /// Tasks completed (jobs).
    pub completed_tasks: u64,
}

const UPDATE_STATE: &[(&str, update_status::UpdateState)] = &[
    ("", update_status::UpdateState::Unknown),
    ("updating", update_status::UpdateState::Updating),
    ("paused", update_status::UpdateState::Paused),
    ("completed", update_status::UpdateState::Completed),
    ("rollback_started", update_status::UpdateState::RollbackStarted),
    ("rollback_paused", update_status::UpdateState::RollbackPaused),
    ("rollback_completed", update_status::UpdateState::RollbackCompleted),
];

impl ServiceJson {
    /// Converts from a stored service (without `ServiceStatus`).
    pub fn from_api(s: &Service) -> ServiceJson {
        let (version, created_at, updated_at) = meta_parts(s.meta.as_ref());
        ServiceJson {
            id: s.id.clone(),
            version,
            created_at,
            updated_at,
            spec: s.spec.as_ref().map(ServiceSpecJson::from_api).unwrap_or_default(),
            previous_spec: s.previous_spec.as_ref().map(ServiceSpecJson::from_api),
            endpoint: s
                .endpoint
                .as_ref()
                .map(|e| EndpointJson {
                    spec: e.spec.as_ref().map(EndpointSpecJson::from_api).unwrap_or_default(),
                    ports: e.ports.iter().map(PortJson::from_api).collect(),
                    virtual_ips: e
                        .virtual_ips
                        .iter()
                        .map(|v| super::network::VirtualIpJson {
                            network_id: v.network_id.clone(),
                            addr: v.addr.clone(),
                        })
                        .collect(),
                })
                .or_else(|| {
                    // A service with nothing to allocate (no network, no port: a dnsrr one, say) has no endpoint
                    // stored; Docker's engine shows its spec's there all the same (SwarmKit's allocator copies it).
                    let spec = s.spec.as_ref()?.endpoint.as_ref()?;
                    Some(EndpointJson { spec: EndpointSpecJson::from_api(spec), ..Default::default() })
                }),
            update_status: s.update_status.as_ref().map(|u| UpdateStatusJson {
                state: enum_to_str(u.state(), UPDATE_STATE).into(),
                started_at: time_to_json(u.started_at.as_ref()),
                completed_at: time_to_json(u.completed_at.as_ref()),
                message: u.message.clone(),
            }),
            service_status: None,
            job_status: s.job_status.as_ref().map(|j| JobStatusJson {
                job_iteration: VersionJson::from_api(j.job_iteration.as_ref()),
                last_execution: time_to_json(j.last_execution.as_ref()),
            }),
        }
    }

    /// Converts back to a service object (used by tests and clients that cache objects).
    pub fn to_api(&self) -> Result<Service, ConvertError> {
        Ok(Service {
            id: self.id.clone(),
            meta: Some(meta_from(self.version, &self.created_at, &self.updated_at)?),
            spec: Some(self.spec.to_api()?),
            previous_spec: self.previous_spec.as_ref().map(ServiceSpecJson::to_api).transpose()?,
            endpoint: self
                .endpoint
                .as_ref()
                .map(|e| -> Result<_, ConvertError> {
                    Ok(shoal_api::Endpoint {
                        spec: Some(e.spec.to_api()?),
                        ports: e.ports.iter().map(PortJson::to_api).collect::<Result<_, _>>()?,
                        virtual_ips: e
                            .virtual_ips
                            .iter()
                            .map(|v| shoal_api::endpoint::VirtualIp {
                                network_id: v.network_id.clone(),
                                addr: v.addr.clone(),
                            })
                            .collect(),
                    })
                })
                .transpose()?,
            update_status: self
                .update_status
                .as_ref()
                .map(|u| -> Result<_, ConvertError> {
                    let mut out = shoal_api::UpdateStatus {
                        started_at: time_from_json("UpdateStatus.StartedAt", &u.started_at)?,
                        completed_at: time_from_json("UpdateStatus.CompletedAt", &u.completed_at)?,
                        message: u.message.clone(),
                        ..Default::default()
                    };
                    out.set_state(enum_from_str(
                        "UpdateStatus.State",
                        &u.state,
                        UPDATE_STATE,
                        update_status::UpdateState::Unknown,
                    )?);
                    Ok(out)
                })
                .transpose()?,
            job_status: self
                .job_status
                .as_ref()
                .map(|j| -> Result<_, ConvertError> {
                    Ok(shoal_api::JobStatus {
                        job_iteration: Some(j.job_iteration.to_api()),
                        last_execution: time_from_json("JobStatus.LastExecution", &j.last_execution)?,
                    })
                })
                .transpose()?,
            ..Default::default()
        })
    }
}

/// `Task`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct TaskJson {
    /// Task ID.
    #[serde(rename = "ID")]
    pub id: String,
    /// Version.
    pub version: VersionJson,
    /// Creation time.
    pub created_at: String,
    /// Last update time.
    pub updated_at: String,
    /// Name, when the task has one of its own (Docker clients compute `service.slot` otherwise).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Task labels.
    #[serde(skip_serializing_if = "is_empty_map")]
    pub labels: BTreeMap<String, String>,
    /// What the task runs.
    pub spec: TaskSpecJson,
    /// Owning service.
    #[serde(rename = "ServiceID")]
    pub service_id: String,
    /// Slot (replicated services).
    #[serde(skip_serializing_if = "is_zero_u64")]
    pub slot: u64,
    /// Assigned node.
    #[serde(rename = "NodeID", skip_serializing_if = "String::is_empty")]
    pub node_id: String,
    /// Observed status.
    pub status: TaskStatusJson,
    /// The state the orchestrator wants.
    pub desired_state: String,
    /// The job iteration a job's task was made for (job modes only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_iteration: Option<VersionJson>,
    /// The task's addresses on its networks, once the allocator gave them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub networks_attachments: Vec<super::network::NetworkAttachmentStatusJson>,
    /// The generic resource units the scheduler gave the task (named units, or a count of a discrete kind).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub assigned_generic_resources: Vec<super::spec::GenericResourceJson>,
    /// The cluster volumes the scheduler chose for the task's `type=cluster` mounts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeAttachmentJson>,
}

/// `Task.Volumes[]`: the volume chosen for one cluster mount.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct VolumeAttachmentJson {
    /// The swarm's ID of the volume.
    #[serde(rename = "ID")]
    pub id: String,
    /// The mount's source (a volume name, or `group:NAME`).
    pub source: String,
    /// The mount's target in the container.
    pub target: String,
}

fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

/// `Task.Status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct TaskStatusJson {
    /// When this status was observed.
    pub timestamp: String,
    /// Lower-case state name.
    pub state: String,
    /// Human-readable progress.
    pub message: String,
    /// Error, for failed or rejected tasks.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub err: String,
    /// Container details.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_status: Option<ContainerStatusJson>,
    /// Ports published on the node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port_status: Option<PortStatusJson>,
}

/// `Task.Status.ContainerStatus`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ContainerStatusJson {
    /// Container ID (or process ID for the process executor).
    #[serde(rename = "ContainerID")]
    pub container_id: String,
    /// Process ID.
    #[serde(rename = "PID")]
    pub pid: i32,
    /// Exit code.
    pub exit_code: i32,
}

/// `Task.Status.PortStatus`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct PortStatusJson {
    /// Published ports.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortJson>,
}

fn state_from(field: &str, s: &str) -> Result<TaskState, ConvertError> {
    TaskState::from_docker_name(s).ok_or_else(|| ConvertError(format!("invalid {field} {s:?}: not a task state")))
}

impl TaskJson {
    /// Converts from a stored task.
    pub fn from_api(t: &Task) -> TaskJson {
        let (version, created_at, updated_at) = meta_parts(t.meta.as_ref());
        let ann = t.annotations.clone().unwrap_or_default();
        let st = t.status.clone().unwrap_or_default();
        TaskJson {
            id: t.id.clone(),
            version,
            created_at,
            updated_at,
            name: ann.name,
            labels: labels_to_json(&ann.labels),
            spec: t.spec.as_deref().map(TaskSpecJson::from_api).unwrap_or_default(),
            service_id: t.service_id.clone(),
            slot: t.slot,
            node_id: t.node_id.clone(),
            status: TaskStatusJson {
                timestamp: time_to_json(st.timestamp.as_ref()),
                state: TaskState::from_wire(st.state).docker_name().into(),
                message: st.message.clone(),
                err: st.err.clone(),
                container_status: st.runtime_status.as_ref().map(|r| match r {
                    task_status::RuntimeStatus::Container(c) => {
                        ContainerStatusJson { container_id: c.container_id.clone(), pid: c.pid, exit_code: c.exit_code }
                    }
                }),
                port_status: st
                    .port_status
                    .as_ref()
                    .map(|p| PortStatusJson { ports: p.ports.iter().map(PortJson::from_api).collect() }),
            },
            desired_state: TaskState::from_wire(t.desired_state).docker_name().into(),
            job_iteration: t.job_iteration.as_ref().map(|v| VersionJson::from_api(Some(v))),
            networks_attachments: t
                .networks
                .iter()
                .map(super::network::NetworkAttachmentStatusJson::from_api)
                .collect(),
            assigned_generic_resources: t
                .assigned_generic_resources
                .iter()
                .map(super::spec::GenericResourceJson::from_api)
                .collect(),
            volumes: t
                .volumes
                .iter()
                .map(|v| VolumeAttachmentJson { id: v.id.clone(), source: v.source.clone(), target: v.target.clone() })
                .collect(),
        }
    }

    /// Converts back to a task object.
    pub fn to_api(&self) -> Result<Task, ConvertError> {
        let status = TaskStatus {
            timestamp: time_from_json("Status.Timestamp", &self.status.timestamp)?,
            state: state_from("Status.State", &self.status.state)? as i32,
            message: self.status.message.clone(),
            err: self.status.err.clone(),
            runtime_status: self.status.container_status.as_ref().map(|c| {
                task_status::RuntimeStatus::Container(ContainerStatus {
                    container_id: c.container_id.clone(),
                    pid: c.pid,
                    exit_code: c.exit_code,
                })
            }),
            port_status: self
                .status
                .port_status
                .as_ref()
                .map(|p| -> Result<_, ConvertError> {
                    Ok(Box::new(shoal_api::PortStatus {
                        ports: p.ports.iter().map(PortJson::to_api).collect::<Result<_, _>>()?,
                    }))
                })
                .transpose()?,
            ..Default::default()
        };
        let annotations = (!self.name.is_empty() || !self.labels.is_empty()).then(|| shoal_api::Annotations {
            name: self.name.clone(),
            labels: labels_from_json(&self.labels),
            indices: Vec::new(),
        });
        Ok(Task {
            id: self.id.clone(),
            meta: Some(meta_from(self.version, &self.created_at, &self.updated_at)?),
            spec: Some(self.spec.to_api()?.into()),
            service_id: self.service_id.clone(),
            slot: self.slot,
            node_id: self.node_id.clone(),
            annotations: annotations.map(Box::new),
            status: Some(status),
            desired_state: state_from("DesiredState", &self.desired_state)? as i32,
            job_iteration: self.job_iteration.map(VersionJson::to_api),
            assigned_generic_resources: self
                .assigned_generic_resources
                .iter()
                .map(|g| g.to_api("AssignedGenericResources"))
                .collect::<Result<_, _>>()?,
            volumes: self
                .volumes
                .iter()
                .map(|v| shoal_api::VolumeAttachment {
                    id: v.id.clone(),
                    source: v.source.clone(),
                    target: v.target.clone(),
                })
                .collect(),
            ..Default::default()
        })
    }
}

/// `NodeSpec`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct NodeSpecJson {
    /// Node name.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Node labels (what `node.labels.*` constraints match).
    pub labels: BTreeMap<String, String>,
    /// "worker" or "manager".
    pub role: String,
    /// "active", "pause" or "drain".
    pub availability: String,
}

const ROLE: &[(&str, NodeRole)] = &[("worker", NodeRole::Worker), ("manager", NodeRole::Manager)];
const AVAILABILITY: &[(&str, node_spec::Availability)] = &[
    ("active", node_spec::Availability::Active),
    ("pause", node_spec::Availability::Pause),
    ("drain", node_spec::Availability::Drain),
];
const NODE_STATE: &[(&str, node_status::State)] = &[
    ("unknown", node_status::State::Unknown),
    ("down", node_status::State::Down),
    ("ready", node_status::State::Ready),
    ("disconnected", node_status::State::Disconnected),
];
const REACHABILITY: &[(&str, raft_member_status::Reachability)] = &[
    ("unknown", raft_member_status::Reachability::Unknown),
    ("unreachable", raft_member_status::Reachability::Unreachable),
    ("reachable", raft_member_status::Reachability::Reachable),
];

impl NodeSpecJson {
    /// Converts to an API node spec; `membership` is kept from the stored node (clients cannot set it).
    /// Role and availability must be given.
    pub fn to_api(&self, membership: node_spec::Membership) -> Result<NodeSpec, ConvertError> {
        if self.role.is_empty() {
            return Err(ConvertError("NodeSpec.Role is required: \"worker\" or \"manager\"".into()));
        }
        if self.availability.is_empty() {
            return Err(ConvertError("NodeSpec.Availability is required: \"active\", \"pause\" or \"drain\"".into()));
        }
        let mut s = NodeSpec {
            annotations: Some(shoal_api::Annotations {
                name: self.name.clone(),
                labels: labels_from_json(&self.labels),
                indices: Vec::new(),
            }),
            ..Default::default()
        };
        s.set_desired_role(enum_from_str("NodeSpec.Role", &self.role, ROLE, NodeRole::Worker)?);
        s.set_availability(enum_from_str(
            "NodeSpec.Availability",
            &self.availability,
            AVAILABILITY,
            node_spec::Availability::Active,
        )?);
        s.set_membership(membership);
        Ok(s)
    }

    /// Converts from an API node spec.
    pub fn from_api(s: &NodeSpec) -> NodeSpecJson {
        let ann = s.annotations.clone().unwrap_or_default();
        NodeSpecJson {
            name: ann.name,
            labels: labels_to_json(&ann.labels),
            role: enum_to_str(s.desired_role(), ROLE).into(),
            availability: enum_to_str(s.availability(), AVAILABILITY).into(),
        }
    }
}

/// `Node`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct NodeJson {
    /// Node ID.
    #[serde(rename = "ID")]
    pub id: String,
    /// Version to pass to an update.
    pub version: VersionJson,
    /// Creation time.
    pub created_at: String,
    /// Last update time.
    pub updated_at: String,
    /// What an operator set.
    pub spec: NodeSpecJson,
    /// What the node reported about itself.
    pub description: NodeDescriptionJson,
    /// Liveness.
    pub status: NodeStatusJson,
    /// Set on managers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manager_status: Option<ManagerStatusJson>,
}

/// `Node.Description`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct NodeDescriptionJson {
    /// Host name.
    pub hostname: String,
    /// OS and architecture.
    pub platform: PlatformJson,
    /// Capacity.
    pub resources: super::spec::ResourceValuesJson,
    /// Engine (agent) version, labels and plugins.
    pub engine: EngineJson,
    /// TLS details (empty until the CA lands).
    #[serde(rename = "TLSInfo")]
    pub tls_info: TlsInfoJson,
    /// What each CSI plugin on the node answered to `NodeGetInfo`.
    #[serde(rename = "CSIInfo", skip_serializing_if = "Vec::is_empty")]
    pub csi_info: Vec<NodeCsiInfoJson>,
}

/// `Node.Description.CSIInfo[]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct NodeCsiInfoJson {
    /// The plugin's name (a volume's driver).
    pub plugin_name: String,
    /// The plugin's own ID of the node.
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// How many volumes the plugin can publish to the node (0: no limit).
    pub max_volumes_per_node: i64,
    /// Where the node is in the plugin's topology.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accessible_topology: Option<super::volume::TopologyJson>,
}

/// `Node.Description.Engine`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct EngineJson {
    /// Version string.
    pub engine_version: String,
    /// Engine labels.
    #[serde(skip_serializing_if = "is_empty_map")]
    pub labels: BTreeMap<String, String>,
    /// Plugins.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub plugins: Vec<PluginJson>,
}

/// `{"Type": ..., "Name": ...}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct PluginJson {
    /// Plugin type.
    #[serde(rename = "Type")]
    pub kind: String,
    /// Plugin name.
    pub name: String,
}

/// `TLSInfo`: PEM root and the issuer's subject and key, base64 in Docker's JSON.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct TlsInfoJson {
    /// PEM of the trust root.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub trust_root: String,
    /// The certificate issuer's raw subject (DER), base64.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub cert_issuer_subject: String,
    /// The certificate issuer's raw public key (DER `SubjectPublicKeyInfo`), base64.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub cert_issuer_public_key: String,
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(field: &str, text: &str) -> Result<Vec<u8>, ConvertError> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(text).map_err(|_| ConvertError(format!("{field} must be base64")))
}

impl TlsInfoJson {
    /// From a node's reported TLS information.
    pub fn from_api(t: &shoal_api::NodeTlsInfo) -> TlsInfoJson {
        TlsInfoJson {
            trust_root: String::from_utf8_lossy(&t.trust_root).into_owned(),
            cert_issuer_subject: b64(&t.cert_issuer_subject),
            cert_issuer_public_key: b64(&t.cert_issuer_public_key),
        }
    }

    /// The cluster's: its root CA, and the root's own subject and key (what a certificate it issued names).
    pub fn of_root(root_pem: &[u8], derived: &ClusterDerived) -> TlsInfoJson {
        TlsInfoJson {
            trust_root: String::from_utf8_lossy(root_pem).into_owned(),
            cert_issuer_subject: b64(&derived.root_issuer_subject),
            cert_issuer_public_key: b64(&derived.root_issuer_public_key),
        }
    }
}

/// What a swarm's document shows that the daemon works out from the cluster object by its own rules (the
/// CA's certificate parsing, the network's port rule); the caller gives it, so this crate knows neither.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterDerived {
    /// The root CA certificate's own subject (DER): what a certificate it issued names as its issuer.
    pub root_issuer_subject: Vec<u8>,
    /// The root CA certificate's public key (DER).
    pub root_issuer_public_key: Vec<u8>,
    /// The VXLAN (data path) UDP port the cluster uses.
    pub data_path_port: u16,
}

/// `Node.Status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct NodeStatusJson {
    /// "ready", "down", "unknown" or "disconnected".
    pub state: String,
    /// Why.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The node's IP address as the managers see it.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub addr: String,
}

/// `Node.ManagerStatus`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ManagerStatusJson {
    /// True on the leader.
    pub leader: bool,
    /// "reachable", "unreachable" or "unknown".
    pub reachability: String,
    /// Raft address.
    pub addr: String,
}

impl NodeJson {
    /// Converts from a stored node.
    pub fn from_api(n: &Node) -> NodeJson {
        let (version, created_at, updated_at) = meta_parts(n.meta.as_ref());
        let d = n.description.clone().unwrap_or_default();
        let platform = d.platform.clone().unwrap_or_default();
        let res = d.resources.clone().unwrap_or_default();
        let engine = d.engine.clone().unwrap_or_default();
        let st = n.status.clone().unwrap_or_default();
        NodeJson {
            id: n.id.clone(),
            version,
            created_at,
            updated_at,
            spec: n.spec.as_ref().map(NodeSpecJson::from_api).unwrap_or_default(),
            description: NodeDescriptionJson {
                hostname: d.hostname.clone(),
                platform: PlatformJson { architecture: platform.architecture, os: platform.os },
                resources: super::spec::ResourceValuesJson::from_api(&res),
                engine: EngineJson {
                    engine_version: engine.engine_version.clone(),
                    labels: labels_to_json(&engine.labels),
                    plugins: engine
                        .plugins
                        .iter()
                        .map(|p| PluginJson { kind: p.r#type.clone(), name: p.name.clone() })
                        .collect(),
                },
                tls_info: d.tls_info.as_ref().map(TlsInfoJson::from_api).unwrap_or_default(),
                csi_info: d
                    .csi_info
                    .iter()
                    .map(|c| NodeCsiInfoJson {
                        plugin_name: c.plugin_name.clone(),
                        node_id: c.node_id.clone(),
                        max_volumes_per_node: c.max_volumes_per_node,
                        accessible_topology: c.accessible_topology.as_ref().map(super::volume::topology_from_api),
                    })
                    .collect(),
            },
            status: NodeStatusJson {
                state: enum_to_str(st.state(), NODE_STATE).into(),
                message: st.message.clone(),
                addr: st.addr.clone(),
            },
            manager_status: n.manager_status.as_ref().map(|m| ManagerStatusJson {
                leader: m.leader,
                reachability: enum_to_str(m.reachability(), REACHABILITY).into(),
                addr: m.addr.clone(),
            }),
        }
    }

    /// Converts back to a node object.
    pub fn to_api(&self) -> Result<Node, ConvertError> {
        let mut status = shoal_api::NodeStatus {
            message: self.status.message.clone(),
            addr: self.status.addr.clone(),
            ..Default::default()
        };
        status.set_state(enum_from_str("Status.State", &self.status.state, NODE_STATE, node_status::State::Unknown)?);
        let manager_status = self
            .manager_status
            .as_ref()
            .map(|m| -> Result<_, ConvertError> {
                let mut out = shoal_api::ManagerStatus { leader: m.leader, addr: m.addr.clone(), ..Default::default() };
                out.set_reachability(enum_from_str(
                    "ManagerStatus.Reachability",
                    &m.reachability,
                    REACHABILITY,
                    raft_member_status::Reachability::Unknown,
                )?);
                Ok(out)
            })
            .transpose()?;
        let d = &self.description;
        let mut node = Node {
            id: self.id.clone(),
            meta: Some(meta_from(self.version, &self.created_at, &self.updated_at)?),
            spec: Some(self.spec.to_api(node_spec::Membership::Accepted)?),
            description: Some(shoal_api::NodeDescription {
                hostname: d.hostname.clone(),
                platform: Some(shoal_api::Platform {
                    architecture: d.platform.architecture.clone(),
                    os: d.platform.os.clone(),
                }),
                resources: Some(d.resources.to_api("Description.Resources")?),
                engine: Some(shoal_api::EngineDescription {
                    engine_version: d.engine.engine_version.clone(),
                    labels: labels_from_json(&d.engine.labels),
                    plugins: d
                        .engine
                        .plugins
                        .iter()
                        .map(|p| shoal_api::PluginDescription { r#type: p.kind.clone(), name: p.name.clone() })
                        .collect(),
                }),
                tls_info: if d.tls_info == TlsInfoJson::default() {
                    None
                } else {
                    Some(shoal_api::NodeTlsInfo {
                        trust_root: d.tls_info.trust_root.clone().into_bytes(),
                        cert_issuer_subject: unb64(
                            "Description.TLSInfo.CertIssuerSubject",
                            &d.tls_info.cert_issuer_subject,
                        )?,
                        cert_issuer_public_key: unb64(
                            "Description.TLSInfo.CertIssuerPublicKey",
                            &d.tls_info.cert_issuer_public_key,
                        )?,
                    })
                },
                fips: false,
                csi_info: d
                    .csi_info
                    .iter()
                    .map(|c| shoal_api::NodeCsiInfo {
                        plugin_name: c.plugin_name.clone(),
                        node_id: c.node_id.clone(),
                        max_volumes_per_node: c.max_volumes_per_node,
                        accessible_topology: c.accessible_topology.as_ref().map(super::volume::topology_to_api),
                    })
                    .collect(),
            }),
            status: Some(status),
            manager_status,
            ..Default::default()
        };
        node.set_role(if manager_status_is_some(&self.manager_status) { NodeRole::Manager } else { NodeRole::Worker });
        Ok(node)
    }
}

fn manager_status_is_some(m: &Option<ManagerStatusJson>) -> bool {
    m.is_some()
}

/// `ClusterInfo` (the body of `GET /swarm` adds `JoinTokens`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ClusterInfoJson {
    /// Cluster ID.
    #[serde(rename = "ID")]
    pub id: String,
    /// Version.
    pub version: VersionJson,
    /// Creation time.
    pub created_at: String,
    /// Last update time.
    pub updated_at: String,
    /// Cluster settings.
    pub spec: SwarmSpecJson,
    /// The cluster's root CA (`docker swarm ca` prints its `TrustRoot`).
    #[serde(rename = "TLSInfo")]
    pub tls_info: TlsInfoJson,
    /// Root CA rotation in progress.
    pub root_rotation_in_progress: bool,
    /// The UDP port of the swarm's VXLAN traffic (set at init; Docker's default 4789).
    pub data_path_port: u32,
    /// Address pools networks get their subnets from: the cluster's, else Docker's default `["10.0.0.0/8"]`.
    pub default_addr_pool: Vec<String>,
    /// Subnet size carved from the pools: the cluster's, else Docker's default 24.
    pub subnet_size: u32,
}

/// Docker's default network address pool.
pub const DEFAULT_ADDR_POOL: &str = "10.0.0.0/8";
/// Docker's default subnet size.
pub const SUBNET_SIZE: u32 = 24;

/// `Swarm`: `ClusterInfo` plus the join tokens.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct SwarmJson {
    /// The cluster.
    #[serde(flatten)]
    pub cluster: ClusterInfoJson,
    /// Tokens to join as a worker or a manager (empty until the CA lands).
    pub join_tokens: JoinTokensJson,
}

/// `JoinTokens`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct JoinTokensJson {
    /// Worker join token.
    pub worker: String,
    /// Manager join token.
    pub manager: String,
}

/// `SwarmSpec`; durations in nanoseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct SwarmSpecJson {
    /// Cluster name ("default").
    pub name: String,
    /// Cluster labels.
    pub labels: BTreeMap<String, String>,
    /// `{"TaskHistoryRetentionLimit": N}`.
    pub orchestration: OrchestrationJson,
    /// Raft settings.
    pub raft: RaftJson,
    /// `{"HeartbeatPeriod": ns}`.
    pub dispatcher: DispatcherJson,
    /// `{"NodeCertExpiry": ns}`.
    #[serde(rename = "CAConfig")]
    pub ca_config: CaConfigJson,
    /// `{"AutoLockManagers": bool}`.
    pub encryption_config: EncryptionConfigJson,
    /// `{"LogDriver": ...}`.
    pub task_defaults: TaskDefaultsJson,
}

/// `SwarmSpec.Orchestration`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct OrchestrationJson {
    /// Tasks kept per slot (a pointer in Docker's Go struct: absent or null keeps the current value on update).
    pub task_history_retention_limit: Option<i64>,
    /// Shoal's own setting, not Docker's: move replicated tasks to nodes that joined later when the spread is
    /// uneven by more than one task per node (`shoal swarm update --rebalance`). Absent keeps the current value,
    /// so Docker's clients, which do not know it, never change it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shoal_rebalance: Option<bool>,
}

/// `SwarmSpec.Raft`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct RaftJson {
    /// Entries between snapshots.
    pub snapshot_interval: u64,
    /// Snapshots kept (a pointer in Docker's Go struct, as above).
    pub keep_old_snapshots: Option<u64>,
    /// Entries kept for slow followers.
    pub log_entries_for_slow_followers: u64,
    /// Election timeout, in ticks.
    pub election_tick: u32,
    /// Heartbeat interval, in ticks.
    pub heartbeat_tick: u32,
}

/// `SwarmSpec.Dispatcher`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct DispatcherJson {
    /// Agent heartbeat period (ns).
    pub heartbeat_period: i64,
}

/// `SwarmSpec.CAConfig`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CaConfigJson {
    /// Node certificate lifetime (ns).
    pub node_cert_expiry: i64,
    /// Counter bumped to force a CA rotation.
    pub force_rotate: u64,
    /// External CAs (`docker swarm update --external-ca`): CFSSL signers over HTTPS.
    #[serde(rename = "ExternalCAs", skip_serializing_if = "Vec::is_empty")]
    pub external_cas: Vec<ExternalCaJson>,
    /// A root CA certificate to rotate to (`docker swarm ca --rotate --ca-cert`): taken, never shown back.
    #[serde(rename = "SigningCACert", skip_serializing)]
    pub signing_ca_cert: String,
    /// Its key (`--ca-key`): taken, never shown back.
    #[serde(rename = "SigningCAKey", skip_serializing)]
    pub signing_ca_key: String,
}

/// `CAConfig.ExternalCAs[]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ExternalCaJson {
    /// "cfssl".
    pub protocol: String,
    /// Where the CA is.
    #[serde(rename = "URL")]
    pub url: String,
    /// Protocol options.
    pub options: BTreeMap<String, String>,
    /// The CA's certificate (PEM).
    #[serde(rename = "CACert")]
    pub ca_cert: String,
}

impl ExternalCaJson {
    /// Docker's protocol names Shoal speaks.
    pub const PROTOCOLS: &'static [&'static str] = &["cfssl"];

    /// Checks the protocol (the rest is checked by the control API).
    pub fn check(&self) -> Result<(), ConvertError> {
        if !self.protocol.eq_ignore_ascii_case("cfssl") {
            return Err(ConvertError::bad_value("CAConfig.ExternalCAs.Protocol", &self.protocol, Self::PROTOCOLS));
        }
        Ok(())
    }

    /// The stored form.
    pub fn to_api(&self) -> shoal_api::ExternalCa {
        shoal_api::ExternalCa {
            protocol: shoal_api::external_ca::CaProtocol::Cfssl as i32,
            url: self.url.clone(),
            options: self.options.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            ca_cert: self.ca_cert.as_bytes().to_vec(),
        }
    }

    /// From the stored form.
    pub fn from_api(e: &shoal_api::ExternalCa) -> ExternalCaJson {
        ExternalCaJson {
            protocol: "cfssl".into(),
            url: e.url.clone(),
            options: e.options.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            ca_cert: String::from_utf8_lossy(&e.ca_cert).into_owned(),
        }
    }
}

/// `SwarmSpec.EncryptionConfig`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct EncryptionConfigJson {
    /// Lock managers' keys at rest.
    pub auto_lock_managers: bool,
}

/// `SwarmSpec.TaskDefaults`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct TaskDefaultsJson {
    /// Default log driver.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_driver: Option<DriverJson>,
}

impl SwarmJson {
    /// Converts from the stored cluster object, with what the daemon derived from it.
    pub fn from_api(c: &Cluster, derived: &ClusterDerived) -> SwarmJson {
        let (version, created_at, updated_at) = meta_parts(c.meta.as_ref());
        let spec = c.spec.clone().unwrap_or_default();
        let ann = spec.annotations.clone().unwrap_or_default();
        let tokens = c.root_ca.as_ref().and_then(|r| r.join_tokens.clone()).unwrap_or_default();
        let raft = spec.raft.unwrap_or_default();
        SwarmJson {
            cluster: ClusterInfoJson {
                id: c.id.clone(),
                version,
                created_at,
                updated_at,
                spec: SwarmSpecJson {
                    name: ann.name,
                    labels: labels_to_json(&ann.labels),
                    orchestration: OrchestrationJson {
                        task_history_retention_limit: Some(
                            spec.orchestration.as_ref().map(|o| o.task_history_retention_limit).unwrap_or(0),
                        ),
                        shoal_rebalance: Some(spec.orchestration.as_ref().is_some_and(|o| o.shoal_rebalance)),
                    },
                    raft: RaftJson {
                        snapshot_interval: raft.snapshot_interval,
                        keep_old_snapshots: Some(raft.keep_old_snapshots),
                        log_entries_for_slow_followers: raft.log_entries_for_slow_followers,
                        election_tick: raft.election_tick,
                        heartbeat_tick: raft.heartbeat_tick,
                    },
                    dispatcher: DispatcherJson {
                        heartbeat_period: spec
                            .dispatcher
                            .as_ref()
                            .and_then(|d| opt_ns(d.heartbeat_period.as_ref()))
                            .unwrap_or(0),
                    },
                    ca_config: CaConfigJson {
                        node_cert_expiry: spec
                            .ca_config
                            .as_ref()
                            .and_then(|c| opt_ns(c.node_cert_expiry.as_ref()))
                            .unwrap_or(0),
                        force_rotate: spec.ca_config.as_ref().map(|c| c.force_rotate).unwrap_or(0),
                        external_cas: spec
                            .ca_config
                            .as_ref()
                            .map(|c| c.external_cas.iter().map(ExternalCaJson::from_api).collect())
                            .unwrap_or_default(),
                        ..Default::default()
                    },
                    encryption_config: EncryptionConfigJson {
                        auto_lock_managers: spec.encryption_config.as_ref().is_some_and(|e| e.auto_lock_managers),
                    },
                    task_defaults: TaskDefaultsJson {
                        log_driver: spec
                            .task_defaults
                            .as_ref()
                            .and_then(|t| t.log_driver.as_ref())
                            .map(|d| DriverJson { name: d.name.clone(), options: labels_to_json(&d.options) }),
                    },
                },
                tls_info: c.root_ca.as_ref().map(|r| TlsInfoJson::of_root(&r.ca_cert, derived)).unwrap_or_default(),
                root_rotation_in_progress: c.root_ca.as_ref().is_some_and(|r| r.root_rotation.is_some()),
                data_path_port: u32::from(derived.data_path_port),
                // The cluster's pools when it sets them (networks get their subnets there), else Docker's.
                default_addr_pool: if c.default_address_pool.is_empty() {
                    vec![DEFAULT_ADDR_POOL.to_string()]
                } else {
                    c.default_address_pool.clone()
                },
                subnet_size: if c.subnet_size == 0 { SUBNET_SIZE } else { c.subnet_size },
            },
            join_tokens: JoinTokensJson { worker: tokens.worker, manager: tokens.manager },
        }
    }
}
