//! Nodes: lookup (ID, then name or hostname, then ID prefix), list with filters, spec updates
//! (availability, labels, role; the last manager cannot be demoted, a stock Docker Engine that joined as a
//! worker cannot be promoted) and removal (refused for a ready node unless forced, and always for a
//! manager; the node's network attachment tasks go with it). Must not depend on HTTP or JSON.

use std::sync::Arc;

use shoal_api::{node_spec, node_status, Node, NodeRole, NodeSpec};
use shoal_store::{Changes, StoreObject, Tables};

use super::{any_prefix, labels_match, resolve, ControlError};
use crate::ca::is_blacklisted;
use crate::state::ClusterState;

/// The name a node goes by: its spec name, else its hostname.
pub fn node_name(node: &Node) -> &str {
    let spec_name = node.spec.as_ref().and_then(|s| s.annotations.as_ref()).map(|a| a.name.as_str()).unwrap_or("");
    if !spec_name.is_empty() {
        return spec_name;
    }
    node.description.as_ref().map(|d| d.hostname.as_str()).unwrap_or("")
}

pub(crate) fn find<'a>(t: &'a Tables, reference: &str) -> Result<&'a Arc<Node>, ControlError> {
    // Nodes may share a hostname (two VMs both called `vm`): a name that several carry is ambiguous, with
    // Docker's message, rather than "not found".
    if t.nodes().get(reference).is_none() {
        let named = t.nodes().iter().filter(|n| node_name(n) == reference).count();
        if named > 1 {
            return Err(ControlError::InvalidArgument(format!(
                "node {reference} is ambiguous ({named} matches found)"
            )));
        }
    }
    resolve(
        "node",
        reference,
        |id| t.nodes().get(id),
        |name| {
            let mut named = t.nodes().iter().filter(|n| node_name(n) == name);
            match (named.next(), named.next()) {
                (Some(n), None) => Some(n),
                _ => None,
            }
        },
        t.nodes().iter(),
    )
}

/// The node with this ID, name (or hostname) or unique ID prefix.
pub fn get_node(state: &ClusterState, reference: &str) -> Result<Arc<Node>, ControlError> {
    state.store.view(|t| find(t, reference).cloned())
}

/// Which nodes to list. Empty fields match everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFilters {
    /// ID prefixes.
    pub id_prefixes: Vec<String>,
    /// Name (or hostname) prefixes.
    pub name_prefixes: Vec<String>,
    /// "manager" or "worker".
    pub roles: Vec<String>,
    /// "accepted" or "pending".
    pub memberships: Vec<String>,
    /// `key` or `key=value` node (spec) labels; all must match.
    pub labels: Vec<String>,
}

fn role_name(r: NodeRole) -> &'static str {
    match r {
        NodeRole::Manager => "manager",
        NodeRole::Worker => "worker",
    }
}

/// Nodes matching `filters`, sorted by name then ID.
pub fn list_nodes(state: &ClusterState, filters: &NodeFilters) -> Vec<Arc<Node>> {
    let mut out: Vec<Arc<Node>> = state.store.view(|t| {
        t.nodes()
            .iter()
            .filter(|n| {
                let spec = n.spec.clone().unwrap_or_default();
                let labels = spec.annotations.as_ref().map(|a| a.labels.clone()).unwrap_or_default();
                let membership = match spec.membership() {
                    node_spec::Membership::Accepted => "accepted",
                    node_spec::Membership::Pending => "pending",
                };
                any_prefix(&filters.id_prefixes, &n.id)
                    && any_prefix(&filters.name_prefixes, node_name(n))
                    && (filters.roles.is_empty() || filters.roles.iter().any(|r| r == role_name(n.role())))
                    && (filters.memberships.is_empty() || filters.memberships.iter().any(|m| m == membership))
                    && labels_match(&labels, &filters.labels)
            })
            .cloned()
            .collect()
    });
    out.sort_by(|a, b| node_name(a).cmp(node_name(b)).then_with(|| a.id.cmp(&b.id)));
    out
}

/// The engine version of a node that described itself as a stock Docker Engine (an engine description
/// without Shoal's agent label), `None` for a Shoal node or one that has not described itself yet.
pub(crate) fn docker_engine_version(node: &Node) -> Option<String> {
    let engine = node.description.as_ref()?.engine.as_ref()?;
    if engine.labels.contains_key(shoal_api::SHOAL_AGENT_LABEL) {
        return None;
    }
    Some(if engine.engine_version.is_empty() { "(no version)".to_string() } else { engine.engine_version.clone() })
}

/// Why demoting `node` would leave the other Raft members without a reachable quorum (SwarmKit's
/// `CanRemoveMember`), from the manager statuses the leader keeps (reachability as of its last pass, at
/// most `MANAGER_STATUS_PERIOD` old); `None` when it would not, or when `node` is not a Raft member.
fn demotion_loses_quorum(t: &Tables, node: &Node) -> Option<String> {
    use shoal_api::raft_member_status::Reachability;
    node.manager_status.as_ref()?;
    let others: Vec<&Node> =
        t.nodes().iter().map(|n| &**n).filter(|n| n.id != node.id && n.manager_status.is_some()).collect();
    let reachable = others
        .iter()
        .filter(|n| {
            n.manager_status.as_ref().is_some_and(|m| m.leader || m.reachability == Reachability::Reachable as i32)
        })
        .count();
    let quorum = others.len() / 2 + 1;
    (reachable < quorum)
        .then(|| format!("{reachable} of the {} other managers are reachable, and {quorum} are needed", others.len()))
}

/// Replaces node `reference`'s spec. `version` must be the node's current version. Labels and name are
/// bounded (`limits::check_node_spec`). Demoting the last manager is refused, and so is a demotion that
/// would leave the other managers without a reachable quorum (both with SwarmKit's messages), and promoting
/// a Docker Engine that joined as a worker.
pub async fn update_node(
    state: &ClusterState,
    reference: &str,
    version: u64,
    spec: NodeSpec,
) -> Result<Node, ControlError> {
    crate::limits::check_node_spec(&spec)?;
    let now = state.now();
    let (id, _) = state
        .write(|t: &Tables, c: &mut Changes| {
            let current = find(t, reference)?;
            if current.version() != version {
                return Err(ControlError::out_of_sequence(
                    &format!("node {}", current.id),
                    "update",
                    current.version(),
                    version,
                ));
            }
            let was_manager = current.spec.as_ref().map(|s| s.desired_role()) == Some(NodeRole::Manager)
                || current.role() == NodeRole::Manager;
            if was_manager && spec.desired_role() == NodeRole::Worker {
                let managers = t
                    .nodes()
                    .iter()
                    .filter(|n| {
                        n.spec.as_ref().map(|s| s.desired_role()) == Some(NodeRole::Manager)
                            || n.role() == NodeRole::Manager
                    })
                    .count();
                if managers <= 1 {
                    return Err(ControlError::FailedPrecondition(format!(
                        "attempting to demote the last manager of the swarm (node {}): promote another node first",
                        current.id
                    )));
                }
                if let Some(why) = demotion_loses_quorum(t, current) {
                    return Err(ControlError::FailedPrecondition(format!(
                        "can't remove member from the raft: this would result in a loss of quorum ({why}); bring \
                         the unreachable managers back, or promote another node, then demote node {} again",
                        current.id
                    )));
                }
            }
            if !was_manager && spec.desired_role() == NodeRole::Manager {
                if let Some(version) = docker_engine_version(current) {
                    return Err(ControlError::FailedPrecondition(format!(
                        "node {} ({}) runs Docker Engine {version}, not Shoal: a Docker Engine can only be a worker \
                         of a Shoal cluster (as a manager it would join Shoal's Raft without being able to take \
                         part, and the cluster could lose quorum); to add a manager, run `shoal daemon` on a machine \
                         and join it with the manager token",
                        current.id,
                        node_name(current)
                    )));
                }
            }
            let mut next = (**current).clone();
            next.spec = Some(spec);
            next.meta_mut().updated_at = Some(now);
            c.update(next);
            Ok(current.id.clone())
        })
        .await?;
    state
        .store
        .view(|t| t.nodes().get(&id).map(|n| (**n).clone()))
        .ok_or_else(|| ControlError::not_found("node", reference))
}

/// Removes node `reference` from the cluster, with its network attachment tasks (their addresses are freed).
/// A manager must be demoted first; a node that is up (READY) is only removed with `force`.
pub async fn remove_node(state: &ClusterState, reference: &str, force: bool) -> Result<(), ControlError> {
    let now_sys = std::time::SystemTime::try_from(state.now()).unwrap_or(std::time::UNIX_EPOCH);
    state
        .write(|t: &Tables, c: &mut Changes| {
            let node = find(t, reference)?;
            if node.role() == NodeRole::Manager
                || node.spec.as_ref().map(|s| s.desired_role()) == Some(NodeRole::Manager)
            {
                return Err(ControlError::FailedPrecondition(format!(
                    "node {} is a manager; demote it to a worker before removing it",
                    node.id
                )));
            }
            let ready = node.status.as_ref().map(|s| s.state()) == Some(node_status::State::Ready);
            if ready && !force {
                return Err(ControlError::FailedPrecondition(format!(
                    "node {} is not down and can't be removed; stop it first, or use force to remove it anyway",
                    node.id
                )));
            }
            // SwarmKit's blacklist: the removed node's certificate stays refused until it expires.
            if let Some(cluster) = t.clusters().iter().min_by(|a, b| a.id.cmp(&b.id)) {
                let mut next = (**cluster).clone();
                let expiry = node_cert_not_after(node)
                    .unwrap_or_else(|| now_sys + crate::ca::node_cert_expiry(cluster, None) + BACKDATE_MARGIN);
                next.blacklisted_certificates.retain(|id, _| is_blacklisted(cluster, id, now_sys));
                next.blacklisted_certificates
                    .insert(node.id.clone(), shoal_api::BlacklistedCertificate { expiry: Some(expiry.into()) });
                c.update(next);
            }
            // As SwarmKit's RemoveNode: the node's network attachment tasks (containers of its own engine on
            // attachable networks, at most `MAX_ATTACHMENTS_PER_NODE`) go with it, and the allocator frees
            // their addresses when it sees them removed (the node's own attachments go with the node).
            for task in t.tasks().by_node(&node.id).filter(|t| crate::tasks::is_attachment_task(t)) {
                c.remove(task.clone());
            }
            c.remove(node.clone());
            Ok(())
        })
        .await?;
    Ok(())
}

/// Slack added to a removed node's certificate expiry when its certificate is not in the store.
const BACKDATE_MARGIN: std::time::Duration = std::time::Duration::from_secs(3600);

/// When node `n`'s certificate (as the store holds it) expires.
fn node_cert_not_after(n: &Node) -> Option<std::time::SystemTime> {
    let pem = &n.certificate.as_ref()?.certificate;
    let chain = shoal_ca::parse_cert_pem_chain(pem).ok()?;
    shoal_ca::parse_cert(chain.first()?).ok().map(|i| i.not_after)
}
