//! The `docker.swarmkit.v1.ResourceAllocator` gRPC service (SwarmKit's manager/resourceapi): how a node's
//! engine puts a container of its own on an attachable overlay network (`docker run --network <attachable
//! overlay>` on a Docker Engine in the swarm). `AttachNetwork` writes a network attachment task: a task of
//! no service, on the caller's node, whose runtime is `NetworkAttachmentSpec` (the container's ID) and whose
//! one network is the one asked for, created NEW so that the allocator gives it an address (NEW -> PENDING,
//! as a service's task); the scheduler then checks the node (a preassigned task) and the dispatcher sends it
//! to that node with its address. `DetachNetwork` removes the task, which frees the address. The task
//! reaper leaves such tasks alone (they belong to no service); they go with `DetachNetwork`.
//!
//! Callers: workers and managers (the authorization table), identified by their certificate's node ID
//! (`ca::node_identity`). A node detaches only its own attachments, and only attachments (never a
//! service's task).
//!
//! Never accept and drop: requested addresses (`docker run --ip`) and driver options are refused, since the
//! allocator does not honour them yet. Bounds: a container ID of at most `MAX_CONTAINER_ID_BYTES`, aliases as
//! a service's (`controlapi::network::MAX_ALIASES`, `MAX_ALIAS_BYTES`), at most
//! `MAX_ATTACHMENTS_PER_NODE` attachments per node.
//!
//! Must not depend on other subsystems; only on `ClusterState`.

use shoal_api::resource_allocator_server::{ResourceAllocator, ResourceAllocatorServer};
use shoal_api::{
    task_spec, AttachNetworkRequest, AttachNetworkResponse, DetachNetworkRequest, DetachNetworkResponse, Meta, Network,
    NetworkAttachmentConfig, NetworkAttachmentSpec, Node, Task, TaskSpec, TaskState, TaskStatus,
};
use shoal_store::{Changes, StoreObject, Tables};
use tonic::{Request, Response, Status};

use crate::ca::node_identity;
use crate::controlapi::network::{MAX_ALIASES, MAX_ALIAS_BYTES};
use crate::state::{ClusterState, WriteError};

/// The longest container ID accepted (Docker's are 64 hex characters).
pub(crate) const MAX_CONTAINER_ID_BYTES: usize = 128;
/// Most network attachments one node holds at once.
pub(crate) const MAX_ATTACHMENTS_PER_NODE: usize = 1024;
/// The status message of a new attachment task (SwarmKit's).
pub(crate) const CREATED_MESSAGE: &str = "created";

pub(crate) use crate::tasks::is_attachment_task;

/// The ResourceAllocator service over a `ClusterState`.
#[derive(Clone, Debug)]
pub struct ResourceAllocatorService {
    state: ClusterState,
}

impl ResourceAllocatorService {
    /// The service.
    pub fn new(state: ClusterState) -> ResourceAllocatorService {
        ResourceAllocatorService { state }
    }

    /// The tonic server for it.
    pub fn server(self) -> ResourceAllocatorServer<ResourceAllocatorService> {
        ResourceAllocatorServer::new(self)
    }
}

fn store_status(e: WriteError<Status>) -> Status {
    match e {
        WriteError::Rejected(s) => s,
        WriteError::Propose(shoal_raft::ProposeError::NotLeader { .. }) => {
            Status::unavailable("this manager is not the leader and could not forward the write; retry")
        }
        other => Status::unavailable(format!("could not write to the cluster store: {other}; retry")),
    }
}

/// What an attachment config may carry: a network and aliases; the rest is refused by name.
fn check_config(config: &NetworkAttachmentConfig, container_id: &str) -> Result<(), Status> {
    if config.target.is_empty() {
        return Err(Status::invalid_argument("config.target is required: name the network to attach to"));
    }
    if container_id.is_empty() {
        return Err(Status::invalid_argument("container_id is required: name the container to attach"));
    }
    if container_id.len() > MAX_CONTAINER_ID_BYTES {
        return Err(Status::invalid_argument(format!(
            "container_id is {} bytes, more than the {MAX_CONTAINER_ID_BYTES} allowed",
            container_id.len()
        )));
    }
    if !config.addresses.is_empty() {
        return Err(Status::invalid_argument(format!(
            "requested addresses ({}) are not supported yet: leave out --ip/--ip6 and let the allocator choose",
            config.addresses.join(", ")
        )));
    }
    if let Some(k) = config.driver_attachment_opts.keys().min() {
        return Err(Status::invalid_argument(format!(
            "driver attachment option {k:?} is not supported; leave the driver options out"
        )));
    }
    if config.aliases.len() > MAX_ALIASES {
        return Err(Status::invalid_argument(format!(
            "{} aliases given, at most {MAX_ALIASES} are allowed",
            config.aliases.len()
        )));
    }
    if let Some(a) = config.aliases.iter().find(|a| a.is_empty() || a.len() > MAX_ALIAS_BYTES) {
        return Err(Status::invalid_argument(format!("alias {a:?} must be 1 to {MAX_ALIAS_BYTES} bytes long")));
    }
    Ok(())
}

/// Refuses to attach a Docker Engine node's container to an IPv6 overlay (`--ipv6`): the engine's swarm overlays
/// do not carry IPv6, and the attachment task would wait for ever on the scheduler's `Ipv6Filter` while
/// `docker run` waits on it.
fn check_ipv6_carried(network: &Network, node: &Node) -> Result<(), Status> {
    if !network.spec.as_ref().is_some_and(|s| s.ipv6_enabled) {
        return Ok(());
    }
    match crate::controlapi::docker_engine_version(node) {
        Some(version) => Err(Status::failed_precondition(format!(
            "network {} is an IPv6 overlay: this node runs Docker Engine {version}, whose swarm overlays do not \
             carry IPv6; attach containers of Shoal nodes, or use a network without --ipv6",
            network.unique_name().unwrap_or(&network.id)
        ))),
        None => Ok(()),
    }
}

/// The network `target` names: an ID, else a name.
fn find_network<'a>(t: &'a Tables, target: &str) -> Option<&'a Network> {
    t.networks().get(target).or_else(|| t.networks().by_name(target)).map(|n| &**n)
}

#[tonic::async_trait]
impl ResourceAllocator for ResourceAllocatorService {
    async fn attach_network(
        &self,
        req: Request<AttachNetworkRequest>,
    ) -> Result<Response<AttachNetworkResponse>, Status> {
        let node_id = node_identity(&req)?;
        let req = req.into_inner();
        let config = req.config.unwrap_or_default();
        check_config(&config, &req.container_id)?;
        let id = self.state.ids.new_id();
        let now = self.state.now();
        self.state
            .write(|t: &Tables, c: &mut Changes| {
                let network = find_network(t, &config.target)
                    .ok_or_else(|| Status::not_found(format!("network {} not found", config.target)))?;
                if !network.spec.as_ref().is_some_and(|s| s.attachable) {
                    return Err(Status::permission_denied(format!(
                        "network {} is not manually attachable: create it with --attachable",
                        config.target
                    )));
                }
                let node =
                    t.nodes().get(&node_id).ok_or_else(|| Status::not_found(format!("node {node_id} not found")))?;
                check_ipv6_carried(network, node)?;
                let held = t.tasks().by_node(&node_id).filter(|t| is_attachment_task(t)).count();
                if held >= MAX_ATTACHMENTS_PER_NODE {
                    return Err(Status::resource_exhausted(format!(
                        "node {node_id} holds {held} network attachments, the most a node may hold; detach some"
                    )));
                }
                c.create(Task {
                    id: id.clone(),
                    meta: Some(Meta { version: None, created_at: Some(now), updated_at: Some(now) }),
                    node_id: node_id.clone(),
                    spec: Some(
                        TaskSpec {
                            runtime: Some(task_spec::Runtime::Attachment(NetworkAttachmentSpec {
                                container_id: req.container_id.clone(),
                            })),
                            networks: vec![NetworkAttachmentConfig {
                                target: network.id.clone(),
                                aliases: config.aliases.clone(),
                                ..Default::default()
                            }],
                            ..Default::default()
                        }
                        .into(),
                    ),
                    status: Some(TaskStatus {
                        timestamp: Some(now),
                        state: TaskState::New as i32,
                        message: CREATED_MESSAGE.into(),
                        ..Default::default()
                    }),
                    desired_state: TaskState::Running as i32,
                    ..Default::default()
                });
                Ok(())
            })
            .await
            .map_err(store_status)?;
        tracing::info!(node = %node_id, attachment = %id, network = %config.target, "network attachment created");
        Ok(Response::new(AttachNetworkResponse { attachment_id: id }))
    }

    async fn detach_network(
        &self,
        req: Request<DetachNetworkRequest>,
    ) -> Result<Response<DetachNetworkResponse>, Status> {
        let node_id = node_identity(&req)?;
        let id = req.into_inner().attachment_id;
        if id.is_empty() {
            return Err(Status::invalid_argument("attachment_id is required: give the ID AttachNetwork returned"));
        }
        self.state
            .write(|t: &Tables, c: &mut Changes| {
                let task = t.tasks().get(&id).ok_or_else(|| Status::not_found(format!("attachment {id} not found")))?;
                if task.node_id != node_id {
                    return Err(Status::permission_denied(format!("attachment {id} doesn't belong to this node")));
                }
                if !is_attachment_task(task) {
                    return Err(Status::permission_denied(format!(
                        "task {id} is not a network attachment; only attachments can be detached"
                    )));
                }
                c.remove(task.clone());
                Ok(())
            })
            .await
            .map_err(store_status)?;
        tracing::info!(node = %node_id, attachment = %id, "network attachment removed");
        Ok(Response::new(DetachNetworkResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Docker Engine node's container is not attached to an IPv6 overlay (its task would never be placed); a
    /// Shoal node's is, and so is an engine's to an IPv4 one.
    #[test]
    fn an_engine_node_is_not_attached_to_an_ipv6_overlay() {
        let engine = |labels: &[(&str, &str)]| Node {
            id: "n1".into(),
            description: Some(shoal_api::NodeDescription {
                engine: Some(shoal_api::EngineDescription {
                    engine_version: "20.10.24".into(),
                    labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let network = |ipv6_enabled: bool| Network {
            id: "net1".into(),
            spec: Some(shoal_api::NetworkSpec {
                annotations: Some(shoal_api::Annotations { name: "v6".into(), ..Default::default() }),
                ipv6_enabled,
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = check_ipv6_carried(&network(true), &engine(&[])).unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(e.message().contains("network v6 is an IPv6 overlay: this node runs Docker Engine 20.10.24"), "{e}");
        assert!(check_ipv6_carried(&network(true), &engine(&[(shoal_api::SHOAL_AGENT_LABEL, "0.1.0")])).is_ok());
        assert!(check_ipv6_carried(&network(false), &engine(&[])).is_ok());
    }
}
