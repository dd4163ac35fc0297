//! Cluster bootstrap: on a new cluster's first leadership, write the cluster object (defaults below), the
//! `ingress` network and this manager's own node object. Idempotent: a start that finds them already there writes
//! nothing, so a crash between Raft initialisation and this write is repaired on the next start.

use std::time::Duration;

use shoal_api::{
    duration_to_proto, node_spec, Annotations, CaConfig, Cluster, ClusterSpec, DispatcherConfig, ManagerStatus, Node,
    NodeDescription, NodeRole, NodeSpec, NodeStatus, OrchestrationConfig, RaftConfig,
};
use shoal_manager::ClusterState;

/// The name of the one cluster object.
pub(crate) const CLUSTER_NAME: &str = "default";
/// Default number of tasks kept per slot.
pub(crate) const DEFAULT_TASK_HISTORY: i64 = 5;
/// Default heartbeat period.
pub(crate) const DEFAULT_HEARTBEAT_PERIOD: Duration = Duration::from_secs(5);
/// Default node certificate validity.
pub(crate) const DEFAULT_NODE_CERT_EXPIRY: Duration = Duration::from_secs(90 * 24 * 3600);

/// The cluster spec a new cluster starts with.
pub(crate) fn default_cluster_spec() -> ClusterSpec {
    ClusterSpec {
        annotations: Some(Annotations { name: CLUSTER_NAME.into(), ..Default::default() }),
        orchestration: Some(OrchestrationConfig {
            task_history_retention_limit: DEFAULT_TASK_HISTORY,
            ..Default::default()
        }),
        raft: Some(RaftConfig {
            snapshot_interval: 10_000,
            keep_old_snapshots: 0,
            log_entries_for_slow_followers: 500,
            heartbeat_tick: 1,
            election_tick: 10,
        }),
        dispatcher: Some(DispatcherConfig { heartbeat_period: Some(duration_to_proto(DEFAULT_HEARTBEAT_PERIOD)) }),
        ca_config: Some(CaConfig {
            node_cert_expiry: Some(duration_to_proto(DEFAULT_NODE_CERT_EXPIRY)),
            ..Default::default()
        }),
        task_defaults: None,
        encryption_config: None,
    }
}

/// What the local manager says about itself.
pub(crate) struct LocalManager<'a> {
    /// The node ID.
    pub node_id: &'a str,
    /// The Raft ID.
    pub raft_id: u64,
    /// The advertised remote address.
    pub addr: String,
    /// The node's description (hostname, platform, resources, engine).
    pub description: NodeDescription,
    /// A root CA (and the cluster ID it was made for) to store when the cluster has none yet. Without it
    /// a missing root CA is generated here.
    pub root_ca: Option<crate::security::PendingRoot>,
    /// The address pools and data path port a new cluster is made with (`docker swarm init`'s network flags;
    /// the defaults otherwise). Unused when the cluster exists.
    pub networking: shoal_manager::controlapi::network::SwarmNetworking,
}

/// Writes the cluster object (with its root CA and join tokens) and the local manager's node object if
/// missing, and adds a root CA to a cluster that has none. Returns the cluster ID.
pub(crate) async fn ensure_cluster(state: &ClusterState, me: LocalManager<'_>) -> Result<String, crate::NodeError> {
    let now = state.now();
    let (new_cluster_id, root_ca) = match me.root_ca.clone() {
        Some(p) => (p.cluster_id, p.root_ca),
        None => (
            state.ids.new_id(),
            shoal_manager::new_root_ca(std::time::SystemTime::now())
                .map_err(|e| crate::NodeError::Bootstrap(format!("cannot create the root CA: {e}")))?,
        ),
    };
    let (cluster_id, _) = state
        .write(|t, changes| {
            let cluster_id = match t.clusters().by_name(CLUSTER_NAME) {
                Some(c) if c.root_ca.as_ref().is_some_and(|r| !r.ca_cert.is_empty()) => c.id.clone(),
                Some(c) => {
                    let mut c = (**c).clone();
                    c.root_ca = Some(root_ca.clone());
                    c.meta.get_or_insert_with(Default::default).updated_at = Some(now);
                    let id = c.id.clone();
                    changes.update(c);
                    id
                }
                None => {
                    use shoal_manager::controlapi::network as net;
                    let mut c = Cluster {
                        id: new_cluster_id.clone(),
                        spec: Some(default_cluster_spec()),
                        root_ca: Some(root_ca.clone()),
                        ..Default::default()
                    };
                    c.meta = Some(shoal_api::Meta { version: None, created_at: Some(now), updated_at: Some(now) });
                    me.networking.apply_to(&mut c);
                    changes.create(c);
                    // As Docker: a new swarm has the routing mesh's network, on the first block of the address
                    // pools (10.0.0.0/24 by default) that does not hold this manager's address.
                    if t.networks().by_name(net::INGRESS_NAME).is_none() {
                        let avoid: Vec<std::net::IpAddr> =
                            me.addr.parse::<std::net::SocketAddr>().map(|a| a.ip()).into_iter().collect();
                        let ingress = net::ingress_network_from(state.ids.new_id(), now, &me.networking.pools, &avoid)
                            .ok_or_else(|| {
                                format!(
                                    "the address pools ({}) have no /{} block for the ingress network outside this \
                                     node's address {}; give other --default-addr-pool values",
                                    me.networking
                                        .pools
                                        .pools
                                        .iter()
                                        .map(|p| p.to_string())
                                        .collect::<Vec<_>>()
                                        .join(", "),
                                    me.networking.pools.subnet_size,
                                    me.addr
                                )
                            })?;
                        changes.create(ingress);
                    }
                    new_cluster_id.clone()
                }
            };
            // The cluster's data path port as SwarmKit copies it to each node (the cluster object, which this
            // write may be creating: then the init's).
            let new_cluster_port =
                t.clusters().by_name(CLUSTER_NAME).map_or(me.networking.vxlan_udp_port(), |c| c.vxlan_udp_port);
            if t.nodes().get(me.node_id).is_none() {
                let mut spec = NodeSpec { annotations: Some(Annotations::default()), ..Default::default() };
                spec.set_desired_role(NodeRole::Manager);
                spec.set_membership(node_spec::Membership::Accepted);
                spec.set_availability(node_spec::Availability::Active);
                let mut node = Node {
                    attachments: Vec::new(),
                    id: me.node_id.to_string(),
                    meta: Some(shoal_api::Meta { version: None, created_at: Some(now), updated_at: Some(now) }),
                    spec: Some(spec),
                    description: Some(me.description.clone()),
                    status: Some(NodeStatus {
                        state: shoal_api::node_status::State::Ready as i32,
                        message: String::new(),
                        addr: me.addr.clone(),
                    }),
                    manager_status: Some(ManagerStatus {
                        raft_id: me.raft_id,
                        addr: me.addr.clone(),
                        leader: true,
                        reachability: shoal_api::raft_member_status::Reachability::Reachable as i32,
                    }),
                    certificate: None,
                    role: 0,
                    vxlan_udp_port: new_cluster_port,
                };
                node.set_role(NodeRole::Manager);
                changes.create(node);
            }
            Ok::<_, String>(cluster_id)
        })
        .await
        .map_err(|e| crate::NodeError::Bootstrap(e.to_string()))?;
    Ok(cluster_id)
}
