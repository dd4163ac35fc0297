//! `docker.swarmkit.v1.Control`: each call validates nothing itself; it reads (after the read barrier) or
//! writes through `controlapi` and answers in SwarmKit's shapes. List filters follow SwarmKit's controlapi
//! (names exact, prefixes, `key`/`key=value` label maps where an empty value asks for the key only). A
//! cluster is answered without its CA key and unlock keys, a secret without its data, as SwarmKit does.
//!
//! Not served (no such object in Shoal, or no such operation): task removal, extensions and resources: the
//! node's socket answers UNIMPLEMENTED naming them. Cluster volumes are served as stored objects (layer 1: no
//! CSI plugin is called, docs/design/cluster-volumes.md).

use std::collections::HashMap;

use shoal_api::control_server::Control;
use shoal_api::*;
use tonic::{Request, Response, Status};

use super::{read_barrier, status_of};
use crate::controlapi::{self, ControlError};
use crate::state::ClusterState;

/// The Control service over a manager's cluster state.
#[derive(Clone, Debug)]
pub struct ControlService {
    state: ClusterState,
}

impl ControlService {
    /// The service over `state`.
    pub fn new(state: ClusterState) -> ControlService {
        ControlService { state }
    }

    /// As a tonic service.
    pub fn server(self) -> control_server::ControlServer<ControlService> {
        control_server::ControlServer::new(self)
    }
}

type Answer<T> = Result<Response<T>, Status>;

fn ok<T>(v: T) -> Answer<T> {
    Ok(Response::new(v))
}

fn required<'a>(what: &str, v: &'a str) -> Result<&'a str, Status> {
    if v.is_empty() {
        return Err(Status::invalid_argument(format!("{what} must be provided")));
    }
    Ok(v)
}

fn version_of(what: &str, v: Option<&Version>) -> Result<u64, Status> {
    v.map(|v| v.index).ok_or_else(|| Status::invalid_argument(format!("{what} must be provided: the version you read")))
}

/// SwarmKit's label filter: every key present, with the value when one is given.
fn labels_match(have: &HashMap<String, String>, want: &HashMap<String, String>) -> bool {
    want.iter().all(|(k, v)| have.get(k).is_some_and(|h| v.is_empty() || h == v))
}

/// A SwarmKit label map as controlapi's `key` / `key=value` list.
fn label_list(m: &HashMap<String, String>) -> Vec<String> {
    m.iter().map(|(k, v)| if v.is_empty() { k.clone() } else { format!("{k}={v}") }).collect()
}

fn contains(candidates: &[String], v: &str) -> bool {
    candidates.is_empty() || candidates.iter().any(|c| c == v)
}

fn has_prefix(candidates: &[String], v: &str) -> bool {
    candidates.is_empty() || candidates.iter().any(|c| v.starts_with(c.as_str()))
}

fn annotations(a: Option<&Annotations>) -> (String, HashMap<String, String>) {
    a.map(|a| (a.name.clone(), a.labels.clone())).unwrap_or_default()
}

/// SwarmKit's runtime name of a task spec.
fn runtime_of(spec: Option<&TaskSpec>) -> &'static str {
    match spec.and_then(|s| s.runtime.as_ref()) {
        Some(task_spec::Runtime::Container(_)) => "container",
        Some(task_spec::Runtime::Attachment(_)) => "attachment",
        None => "",
    }
}

/// The cluster as SwarmKit's controlapi shows it: without the CA's key and the managers' unlock keys.
fn redact_cluster(c: &Cluster) -> Cluster {
    let mut c = c.clone();
    if let Some(r) = c.root_ca.as_mut() {
        r.ca_key.clear();
    }
    c.unlock_keys.clear();
    c.network_bootstrap_keys.clear();
    c.encryption_key_lamport_clock = 0;
    c
}

fn no_data_secret(mut s: Secret) -> Secret {
    if let Some(spec) = s.spec.as_mut() {
        spec.data.clear();
    }
    s
}

fn control<T>(r: Result<T, ControlError>) -> Result<T, Status> {
    r.map_err(status_of)
}

#[tonic::async_trait]
impl Control for ControlService {
    async fn get_node(&self, req: Request<GetNodeRequest>) -> Answer<GetNodeResponse> {
        let id = required("node ID", &req.get_ref().node_id)?.to_string();
        read_barrier(&self.state).await?;
        let node = control(controlapi::get_node(&self.state, &id))?;
        ok(GetNodeResponse { node: Some((*node).clone()) })
    }

    async fn list_nodes(&self, req: Request<ListNodesRequest>) -> Answer<ListNodesResponse> {
        read_barrier(&self.state).await?;
        let f = req.into_inner().filters.unwrap_or_default();
        let nodes = controlapi::list_nodes(&self.state, &Default::default())
            .into_iter()
            .filter(|n| {
                let hostname = n.description.as_ref().map(|d| d.hostname.as_str());
                let engine_labels = n.description.as_ref().and_then(|d| d.engine.as_ref()).map(|e| e.labels.clone());
                let spec = n.spec.clone().unwrap_or_default();
                (f.names.is_empty() || hostname.is_some_and(|h| contains(&f.names, h)))
                    && (f.name_prefixes.is_empty() || hostname.is_some_and(|h| has_prefix(&f.name_prefixes, h)))
                    && has_prefix(&f.id_prefixes, &n.id)
                    && (f.labels.is_empty() || engine_labels.is_some_and(|l| labels_match(&l, &f.labels)))
                    && labels_match(&annotations(spec.annotations.as_ref()).1, &f.node_labels)
                    && (f.roles.is_empty() || f.roles.contains(&n.role))
                    && (f.memberships.is_empty() || f.memberships.contains(&spec.membership))
            })
            .map(|n| (*n).clone())
            .collect();
        ok(ListNodesResponse { nodes })
    }

    async fn update_node(&self, req: Request<UpdateNodeRequest>) -> Answer<UpdateNodeResponse> {
        let r = req.into_inner();
        required("node ID", &r.node_id)?;
        let version = version_of("node version", r.node_version.as_ref())?;
        let spec = r.spec.ok_or_else(|| Status::invalid_argument("spec must be provided"))?;
        let node = control(controlapi::update_node(&self.state, &r.node_id, version, spec).await)?;
        ok(UpdateNodeResponse { node: Some(node) })
    }

    async fn remove_node(&self, req: Request<RemoveNodeRequest>) -> Answer<RemoveNodeResponse> {
        let r = req.into_inner();
        required("node ID", &r.node_id)?;
        control(controlapi::remove_node(&self.state, &r.node_id, r.force).await)?;
        ok(RemoveNodeResponse {})
    }

    async fn get_task(&self, req: Request<GetTaskRequest>) -> Answer<GetTaskResponse> {
        let id = required("task ID", &req.get_ref().task_id)?.to_string();
        read_barrier(&self.state).await?;
        let task = control(controlapi::get_task(&self.state, &id))?;
        ok(GetTaskResponse { task: Some((*task).clone()) })
    }

    async fn list_tasks(&self, req: Request<ListTasksRequest>) -> Answer<ListTasksResponse> {
        read_barrier(&self.state).await?;
        let f = req.into_inner().filters.unwrap_or_default();
        let desired_states = f.desired_states.iter().map(|s| TaskState::from_wire(*s)).collect();
        // controlapi narrows by the indexes (and judges "up to date"); SwarmKit's exact-ID and name rules
        // are applied on what it returns.
        let narrowed = controlapi::TaskFilters { desired_states, up_to_date: f.up_to_date, ..Default::default() };
        let tasks = controlapi::list_tasks(&self.state, &narrowed);
        let tasks = self.state.store.view(|t| {
            tasks
                .into_iter()
                .filter(|task| {
                    let name = controlapi::task_name(t, task);
                    contains(&f.names, &name)
                        && has_prefix(&f.name_prefixes, &name)
                        && has_prefix(&f.id_prefixes, &task.id)
                        && labels_match(&annotations(task.service_annotations.as_deref()).1, &f.labels)
                        && contains(&f.service_ids, &task.service_id)
                        && contains(&f.node_ids, &task.node_id)
                        && contains(&f.runtimes, runtime_of(task.spec.as_deref()))
                })
                .map(|t| (*t).clone())
                .collect()
        });
        ok(ListTasksResponse { tasks })
    }

    async fn get_service(&self, req: Request<GetServiceRequest>) -> Answer<GetServiceResponse> {
        let r = req.into_inner();
        required("service ID", &r.service_id)?;
        if r.insert_defaults {
            return Err(Status::invalid_argument(
                "insert_defaults is not supported by Shoal's Control API: leave it false (the Engine API's \
                 GET /services/{id}?insertDefaults=true shows the defaults)",
            ));
        }
        read_barrier(&self.state).await?;
        let s = control(controlapi::get_service(&self.state, &r.service_id))?;
        ok(GetServiceResponse { service: Some((*s).clone()) })
    }

    async fn list_services(&self, req: Request<ListServicesRequest>) -> Answer<ListServicesResponse> {
        read_barrier(&self.state).await?;
        let f = req.into_inner().filters.unwrap_or_default();
        let services = controlapi::list_services(&self.state, &Default::default())
            .into_iter()
            .filter(|s| {
                let spec = s.spec.as_ref();
                let (name, labels) = annotations(spec.and_then(|s| s.annotations.as_ref()));
                contains(&f.names, &name)
                    && has_prefix(&f.name_prefixes, &name)
                    && has_prefix(&f.id_prefixes, &s.id)
                    && labels_match(&labels, &f.labels)
                    && contains(&f.runtimes, runtime_of(spec.and_then(|s| s.task.as_ref())))
            })
            .map(|s| (*s).clone())
            .collect();
        ok(ListServicesResponse { services })
    }

    async fn create_service(&self, req: Request<CreateServiceRequest>) -> Answer<CreateServiceResponse> {
        let spec = req.into_inner().spec.ok_or_else(|| Status::invalid_argument("spec must be provided"))?;
        let s = control(controlapi::create_service(&self.state, spec).await)?;
        ok(CreateServiceResponse { service: Some(s) })
    }

    async fn update_service(&self, req: Request<UpdateServiceRequest>) -> Answer<UpdateServiceResponse> {
        let r = req.into_inner();
        required("service ID", &r.service_id)?;
        let version = version_of("service version", r.service_version.as_ref())?;
        let s = match update_service_request::Rollback::try_from(r.rollback) {
            Ok(update_service_request::Rollback::Previous) => {
                control(controlapi::rollback_service(&self.state, &r.service_id, version).await)?
            }
            Ok(update_service_request::Rollback::None) => {
                let spec = r.spec.ok_or_else(|| Status::invalid_argument("spec must be provided"))?;
                control(controlapi::update_service(&self.state, &r.service_id, version, spec).await)?
            }
            Err(_) => {
                return Err(Status::invalid_argument(format!(
                    "unknown rollback {}: use NONE (0) or PREVIOUS (1)",
                    r.rollback
                )))
            }
        };
        ok(UpdateServiceResponse { service: Some(s) })
    }

    async fn remove_service(&self, req: Request<RemoveServiceRequest>) -> Answer<RemoveServiceResponse> {
        let id = required("service ID", &req.get_ref().service_id)?.to_string();
        control(controlapi::remove_service(&self.state, &id).await)?;
        ok(RemoveServiceResponse {})
    }

    async fn list_service_statuses(
        &self,
        req: Request<ListServiceStatusesRequest>,
    ) -> Answer<ListServiceStatusesResponse> {
        read_barrier(&self.state).await?;
        let ids = req.into_inner().services;
        let statuses = self.state.store.view(|t| {
            ids.into_iter()
                .map(|id| {
                    // As SwarmKit: an unknown service is answered with zero counts.
                    let st = t.services().get(&id).map(|s| controlapi::service_status(t, s)).unwrap_or_default();
                    list_service_statuses_response::ServiceStatus {
                        service_id: id,
                        desired_tasks: st.desired_tasks,
                        running_tasks: st.running_tasks,
                        completed_tasks: st.completed_tasks,
                    }
                })
                .collect()
        });
        ok(ListServiceStatusesResponse { statuses })
    }

    async fn get_network(&self, req: Request<GetNetworkRequest>) -> Answer<GetNetworkResponse> {
        let r = req.into_inner();
        // As SwarmKit: by ID, else by name.
        let reference = if r.network_id.is_empty() { r.name } else { r.network_id };
        required("network ID or name", &reference)?;
        read_barrier(&self.state).await?;
        let n = control(controlapi::get_network(&self.state, &reference))?;
        ok(GetNetworkResponse { network: Some(n) })
    }

    async fn list_networks(&self, req: Request<ListNetworksRequest>) -> Answer<ListNetworksResponse> {
        read_barrier(&self.state).await?;
        let f = req.into_inner().filters.unwrap_or_default();
        let networks = controlapi::list_networks(&self.state, &Default::default())
            .into_iter()
            .filter(|n| {
                let (name, labels) = annotations(n.spec.as_ref().and_then(|s| s.annotations.as_ref()));
                contains(&f.names, &name)
                    && has_prefix(&f.name_prefixes, &name)
                    && has_prefix(&f.id_prefixes, &n.id)
                    && labels_match(&labels, &f.labels)
            })
            .collect();
        ok(ListNetworksResponse { networks })
    }

    async fn create_network(&self, req: Request<CreateNetworkRequest>) -> Answer<CreateNetworkResponse> {
        let spec = req.into_inner().spec.ok_or_else(|| Status::invalid_argument("spec must be provided"))?;
        let n = control(controlapi::create_network(&self.state, spec).await)?;
        ok(CreateNetworkResponse { network: Some(n) })
    }

    async fn remove_network(&self, req: Request<RemoveNetworkRequest>) -> Answer<RemoveNetworkResponse> {
        let r = req.into_inner();
        let reference = if r.network_id.is_empty() { r.name } else { r.network_id };
        required("network ID or name", &reference)?;
        control(controlapi::remove_network(&self.state, &reference).await)?;
        ok(RemoveNetworkResponse {})
    }

    async fn get_cluster(&self, req: Request<GetClusterRequest>) -> Answer<GetClusterResponse> {
        let id = required("cluster ID", &req.get_ref().cluster_id)?.to_string();
        read_barrier(&self.state).await?;
        let c = self.state.store.view(|t| t.clusters().get(&id).cloned());
        let c = c.ok_or_else(|| status_of(ControlError::NotFound { kind: "cluster", reference: id }))?;
        ok(GetClusterResponse { cluster: Some(redact_cluster(&c)) })
    }

    async fn list_clusters(&self, req: Request<ListClustersRequest>) -> Answer<ListClustersResponse> {
        read_barrier(&self.state).await?;
        let f = req.into_inner().filters.unwrap_or_default();
        let mut clusters: Vec<Cluster> = self.state.store.view(|t| {
            t.clusters()
                .iter()
                .filter(|c| {
                    let (name, labels) = annotations(c.spec.as_ref().and_then(|s| s.annotations.as_ref()));
                    contains(&f.names, &name)
                        && has_prefix(&f.name_prefixes, &name)
                        && has_prefix(&f.id_prefixes, &c.id)
                        && labels_match(&labels, &f.labels)
                })
                .map(|c| redact_cluster(c))
                .collect()
        });
        clusters.sort_by(|a, b| a.id.cmp(&b.id));
        ok(ListClustersResponse { clusters })
    }

    async fn update_cluster(&self, req: Request<UpdateClusterRequest>) -> Answer<UpdateClusterResponse> {
        let r = req.into_inner();
        required("cluster ID", &r.cluster_id)?;
        let version = version_of("cluster version", r.cluster_version.as_ref())?;
        let spec = r.spec.ok_or_else(|| Status::invalid_argument("spec must be provided"))?;
        let rotation = r.rotation.unwrap_or_default();
        if rotation.manager_unlock_key && !controlapi::autolock_on(Some(&spec)) {
            return Err(Status::invalid_argument(
                "cannot rotate the unlock key: autolock is not turned on (set EncryptionConfig.AutoLockManagers)",
            ));
        }
        control(
            controlapi::update_cluster_rotating(&self.state, &r.cluster_id, version, spec, rotation.manager_unlock_key)
                .await,
        )?;
        let tokens =
            crate::ca::RotateTokens { worker: rotation.worker_join_token, manager: rotation.manager_join_token };
        crate::ca::rotate_join_tokens(&self.state, tokens).await.map_err(|e| Status::unavailable(e.to_string()))?;
        let c = self.state.store.view(|t| t.clusters().get(&r.cluster_id).cloned());
        let c = c.ok_or_else(|| status_of(ControlError::NotFound { kind: "cluster", reference: r.cluster_id }))?;
        ok(UpdateClusterResponse { cluster: Some(redact_cluster(&c)) })
    }

    async fn get_secret(&self, req: Request<GetSecretRequest>) -> Answer<GetSecretResponse> {
        let id = required("secret ID", &req.get_ref().secret_id)?.to_string();
        read_barrier(&self.state).await?;
        let s = control(controlapi::get_secret(&self.state, &id))?;
        ok(GetSecretResponse { secret: Some(no_data_secret(s)) })
    }

    async fn update_secret(&self, req: Request<UpdateSecretRequest>) -> Answer<UpdateSecretResponse> {
        let r = req.into_inner();
        required("secret ID", &r.secret_id)?;
        let version = version_of("secret version", r.secret_version.as_ref())?;
        let spec = r.spec.ok_or_else(|| Status::invalid_argument("spec must be provided"))?;
        let s = control(controlapi::update_secret(&self.state, &r.secret_id, version, spec).await)?;
        ok(UpdateSecretResponse { secret: Some(no_data_secret(s)) })
    }

    async fn list_secrets(&self, req: Request<ListSecretsRequest>) -> Answer<ListSecretsResponse> {
        read_barrier(&self.state).await?;
        let f = req.into_inner().filters.unwrap_or_default();
        let filters = controlapi::SecretFilters {
            names: f.names,
            name_prefixes: f.name_prefixes,
            id_prefixes: f.id_prefixes,
            labels: label_list(&f.labels),
        };
        let secrets = controlapi::list_secrets(&self.state, &filters).into_iter().map(no_data_secret).collect();
        ok(ListSecretsResponse { secrets })
    }

    async fn create_secret(&self, req: Request<CreateSecretRequest>) -> Answer<CreateSecretResponse> {
        let spec = req.into_inner().spec.ok_or_else(|| Status::invalid_argument("spec must be provided"))?;
        let s = control(controlapi::create_secret(&self.state, spec).await)?;
        ok(CreateSecretResponse { secret: Some(no_data_secret(s)) })
    }

    async fn remove_secret(&self, req: Request<RemoveSecretRequest>) -> Answer<RemoveSecretResponse> {
        let id = required("secret ID", &req.get_ref().secret_id)?.to_string();
        control(controlapi::remove_secret(&self.state, &id).await)?;
        ok(RemoveSecretResponse {})
    }

    async fn get_config(&self, req: Request<GetConfigRequest>) -> Answer<GetConfigResponse> {
        let id = required("config ID", &req.get_ref().config_id)?.to_string();
        read_barrier(&self.state).await?;
        let c = control(controlapi::get_config(&self.state, &id))?;
        ok(GetConfigResponse { config: Some((*c).clone()) })
    }

    async fn update_config(&self, req: Request<UpdateConfigRequest>) -> Answer<UpdateConfigResponse> {
        let r = req.into_inner();
        required("config ID", &r.config_id)?;
        let version = version_of("config version", r.config_version.as_ref())?;
        let spec = r.spec.ok_or_else(|| Status::invalid_argument("spec must be provided"))?;
        let c = control(controlapi::update_config(&self.state, &r.config_id, version, spec).await)?;
        ok(UpdateConfigResponse { config: Some(c) })
    }

    async fn list_configs(&self, req: Request<ListConfigsRequest>) -> Answer<ListConfigsResponse> {
        read_barrier(&self.state).await?;
        let f = req.into_inner().filters.unwrap_or_default();
        let filters = controlapi::ConfigFilters {
            names: f.names,
            name_prefixes: f.name_prefixes,
            id_prefixes: f.id_prefixes,
            labels: label_list(&f.labels),
        };
        let configs = controlapi::list_configs(&self.state, &filters).into_iter().map(|c| (*c).clone()).collect();
        ok(ListConfigsResponse { configs })
    }

    async fn create_config(&self, req: Request<CreateConfigRequest>) -> Answer<CreateConfigResponse> {
        let spec = req.into_inner().spec.ok_or_else(|| Status::invalid_argument("spec must be provided"))?;
        let c = control(controlapi::create_config(&self.state, spec).await)?;
        ok(CreateConfigResponse { config: Some(c) })
    }

    async fn remove_config(&self, req: Request<RemoveConfigRequest>) -> Answer<RemoveConfigResponse> {
        let id = required("config ID", &req.get_ref().config_id)?.to_string();
        control(controlapi::remove_config(&self.state, &id).await)?;
        ok(RemoveConfigResponse {})
    }

    async fn create_volume(&self, req: Request<CreateVolumeRequest>) -> Answer<CreateVolumeResponse> {
        let spec = req.into_inner().spec.ok_or_else(|| Status::invalid_argument("spec must be provided"))?;
        let v = control(controlapi::create_volume(&self.state, spec).await)?;
        ok(CreateVolumeResponse { volume: Some(v) })
    }

    async fn get_volume(&self, req: Request<GetVolumeRequest>) -> Answer<GetVolumeResponse> {
        let id = required("volume ID", &req.get_ref().volume_id)?.to_string();
        read_barrier(&self.state).await?;
        let v = control(controlapi::get_volume(&self.state, &id))?;
        ok(GetVolumeResponse { volume: Some((*v).clone()) })
    }

    async fn update_volume(&self, req: Request<UpdateVolumeRequest>) -> Answer<UpdateVolumeResponse> {
        let r = req.into_inner();
        required("volume ID", &r.volume_id)?;
        let version = version_of("volume version", r.volume_version.as_ref())?;
        let spec = r.spec.ok_or_else(|| Status::invalid_argument("spec must be provided"))?;
        let v = control(controlapi::update_volume(&self.state, &r.volume_id, version, spec).await)?;
        ok(UpdateVolumeResponse { volume: Some(v) })
    }

    async fn list_volumes(&self, req: Request<ListVolumesRequest>) -> Answer<ListVolumesResponse> {
        read_barrier(&self.state).await?;
        let f = req.into_inner().filters.unwrap_or_default();
        let filters = controlapi::VolumeFilters {
            names: f.names,
            name_prefixes: f.name_prefixes,
            id_prefixes: f.id_prefixes,
            labels: label_list(&f.labels),
            groups: f.groups,
            drivers: f.drivers,
        };
        let volumes = controlapi::list_volumes(&self.state, &filters).into_iter().map(|v| (*v).clone()).collect();
        ok(ListVolumesResponse { volumes })
    }

    async fn remove_volume(&self, req: Request<RemoveVolumeRequest>) -> Answer<RemoveVolumeResponse> {
        let r = req.get_ref();
        let id = required("volume ID", &r.volume_id)?.to_string();
        control(controlapi::remove_volume(&self.state, &id, r.force).await)?;
        ok(RemoveVolumeResponse {})
    }
}
