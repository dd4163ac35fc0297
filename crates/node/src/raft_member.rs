//! This manager's Raft membership: start Raft as the first manager of a new cluster (bootstrap), as a new
//! manager joining through `--join-addr` (`RaftMembership.Join` on a running manager, which returns the Raft
//! ID to use), as a member restarting on its state, or (`--force-new-cluster`) as the only member of a
//! cluster whose quorum was lost for good; then wait until this member can serve (a leader is
//! known and the cluster object has arrived). Also the address the local agent's dispatcher session should
//! use: the leader's (only the leader's dispatcher accepts sessions); and the end of the membership, a
//! demotion (`wait_demoted`).
//!
//! Knows Raft through `shoal_raft` only; every gRPC client channel comes from the injected
//! `ChannelFactory` (plain HTTP/2 until TLS is configured).

use std::sync::Arc;
use std::time::Duration;

use shoal_api::NodeRole;
use shoal_manager::ClusterState;
use shoal_raft::grpc::{self, ChannelFactory};
use shoal_raft::{Proposer, RaftConfig, RaftNode, StartMode};
use shoal_store::MemoryStore;
use tokio::sync::watch;

use crate::{identity, DaemonConfig, NodeError, NodeIdentity};

/// How this node came to be a Raft member on this start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Membership {
    /// First start of a new cluster, or a restart of a cluster with this manager as its only member.
    Bootstrapped,
    /// First start of a manager that joined a running cluster.
    Joined,
    /// A restart of a member of a multi-manager cluster.
    Restarted,
}

/// Applies the cluster's snapshot settings (`ClusterSpec.raft`: `docker swarm update --snapshot-interval`,
/// `--max-snapshots`, and `LogEntriesForSlowFollowers`) to this member, now and whenever the cluster object
/// changes, until `stop`: every manager applies them to its own log, the leader's as well as the followers'
/// (each reads them from its own store, so a restart applies them as soon as the store is recovered). A
/// `--raft-snapshot-interval-entries` given to this daemon keeps its interval.
pub(crate) async fn follow_snapshot_policy(
    store: Arc<MemoryStore>,
    raft: RaftNode,
    interval_override: Option<u64>,
    mut stop: watch::Receiver<bool>,
) {
    // Subscribed before the first read, so no change of the cluster object is missed.
    let ((), mut events) = store.view_and_watch(|_| ());
    let mut applied = None;
    loop {
        let wanted = store.view(|t| {
            t.clusters().by_name(crate::CLUSTER_NAME).and_then(|c| c.spec.as_ref()?.raft).map(|r| {
                shoal_raft::SnapshotPolicy {
                    interval_entries: interval_override.unwrap_or(r.snapshot_interval),
                    keep_old_snapshots: r.keep_old_snapshots,
                    log_entries_for_slow_followers: r.log_entries_for_slow_followers,
                }
            })
        });
        if let Some(policy) = wanted.filter(|p| applied != Some(*p)) {
            if raft.set_snapshot_policy(policy).await.is_err() {
                return;
            }
            applied = Some(policy);
        }
        loop {
            tokio::select! {
                _ = shoal_manager::stopped(&mut stop) => return,
                r = events.recv() => match r {
                    Ok(commit) if commit.changes.iter().any(|c| matches!(c.object,
                        shoal_store::Object::Cluster(_))) => break,
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                },
            }
        }
    }
}

/// Longest wait for this manager to be ready (leader known, cluster object present) after bootstrap or join.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Starts Raft for this node (see the module doc). A join replaces `identity.raft_id` with the ID the
/// leader assigned and stores the identity before returning.
pub(crate) async fn start_raft(
    cfg: &DaemonConfig,
    identity: &mut NodeIdentity,
    store: Arc<MemoryStore>,
    factory: Arc<dyn ChannelFactory>,
) -> Result<(RaftNode, Membership), NodeError> {
    let mut raft_cfg = RaftConfig::new(cfg.state_dir.clone(), identity.raft_id);
    raft_cfg.tick_interval_ms = cfg.raft_tick_interval_ms;
    raft_cfg.election_tick = cfg.raft_election_tick;
    raft_cfg.heartbeat_tick = cfg.raft_heartbeat_tick;
    raft_cfg.addr = cfg.advertised().to_string();
    raft_cfg.node_id = identity.node_id.clone();
    raft_cfg.data_keys = crate::lock::data_keys(&cfg.state_dir)?;
    if let Some(n) = cfg.raft_snapshot_interval_entries {
        raft_cfg.snapshot_interval_entries = n;
    }

    if RaftNode::has_existing_state(&cfg.state_dir) {
        let mode = if cfg.force_new_cluster { StartMode::ForceNewCluster } else { StartMode::Restart };
        let raft = grpc::start_member(raft_cfg.clone(), store, factory.clone(), mode).await?;
        let members = raft.members();
        let alone = members.members.len() <= 1;
        if !alone && members.addr(raft.id()).is_some_and(|a| a != raft_cfg.addr) && !cfg.force_new_cluster {
            // Restarted with a new advertised address: have the leader record it (the others follow it).
            tracing::info!(
                from = ?members.addr(raft.id()),
                to = %raft_cfg.addr,
                "this manager's advertised address changed: updating its raft membership"
            );
            let (cfg_for_update, members_now) = (raft_cfg.clone(), members.clone());
            tokio::spawn(async move {
                if let Err(e) = grpc::update_own_address(&cfg_for_update, &members_now, factory).await {
                    tracing::error!(error = %e, "cannot record this manager's new address in the raft membership; the \
                                                 other managers cannot reach it until it is");
                }
            });
        }
        if cfg.join_addr.is_some() {
            tracing::info!("this manager is already a member of a cluster; --join-addr is ignored");
        }
        return Ok((raft, if alone { Membership::Bootstrapped } else { Membership::Restarted }));
    }
    if cfg.force_new_cluster {
        return Err(NodeError::Config(format!(
            "--force-new-cluster recovers an existing manager, but {} holds no raft state; start without it to create \
             a new cluster",
            cfg.state_dir.display()
        )));
    }
    // A node holding a certificate (a promoted worker, or a manager whose Raft data is gone) belongs to an
    // existing cluster: it must join it, never bootstrap a new one with the same identity.
    let join_addr = match &cfg.join_addr {
        Some(a) => Some(a.clone()),
        None if has_certificate(cfg)? => match crate::worker_node::remembered_manager(&cfg.state_dir)? {
            Some(a) => Some(a),
            None => {
                return Err(NodeError::State(format!(
                    "{} holds this node's certificate but no raft state, so it belongs to an existing cluster and \
                     must not create a new one: pass --join-addr IP:PORT (a manager of its cluster) to join it \
                     again, or start with an empty state dir to create a new cluster",
                    cfg.state_dir.display()
                )))
            }
        },
        None => None,
    };
    match &join_addr {
        None => {
            let raft = grpc::start_member(raft_cfg, store, factory, StartMode::BootstrapIfEmpty).await?;
            Ok((raft, Membership::Bootstrapped))
        }
        Some(join) => {
            let raft =
                grpc::join_cluster(raft_cfg, store, factory, join).await.map_err(|e| NodeError::Join(e.to_string()))?;
            identity.raft_id = raft.id();
            identity::store(&cfg.state_dir, identity)?;
            Ok((raft, Membership::Joined))
        }
    }
}

fn has_certificate(cfg: &DaemonConfig) -> Result<bool, NodeError> {
    crate::join::load_certs(&cfg.state_dir).map(|c| c.is_some()).map_err(|e| NodeError::Security(e.to_string()))
}

/// Waits until this manager can serve: for a bootstrapped member, until it leads; for a joined one, until a
/// leader is known and the leader's snapshot (with the cluster object) has been applied. A restarted member
/// of a multi-manager cluster does not wait (a quorum may come up later; writes fail clearly meanwhile).
pub(crate) async fn wait_ready(state: &ClusterState, raft: &RaftNode, how: Membership) -> Result<(), NodeError> {
    let mut leadership = state.proposer.leadership();
    let wait = async {
        loop {
            let s = *leadership.borrow_and_update();
            let ready = match how {
                Membership::Bootstrapped => s.is_leader,
                Membership::Joined => {
                    s.leader_id != 0 && state.store.view(|t| t.clusters().by_name(crate::CLUSTER_NAME).is_some())
                }
                Membership::Restarted => true,
            };
            if ready {
                return Ok(());
            }
            // The store fills from the snapshot without a leadership change: look again at least every tick.
            tokio::select! {
                r = leadership.changed() => if r.is_err() {
                    return Err(NodeError::Bootstrap("raft stopped before this manager was ready".into()));
                },
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
    };
    tokio::time::timeout(READY_TIMEOUT, wait).await.map_err(|_| {
        NodeError::Bootstrap(format!(
            "this manager was not ready within {READY_TIMEOUT:?} (raft status: {:?}); check that a majority of the \
             managers are running and reachable",
            raft.status()
        ))
    })?
}

/// The dispatcher address the local agent should use, kept current: the leader's address (`http://...`)
/// when a leader with a known address exists, else this manager's own. Updated until `shutdown`.
pub(crate) fn dispatcher_addr_watch(
    raft: &RaftNode,
    own_addr: String,
    mut shutdown: watch::Receiver<bool>,
) -> (watch::Receiver<String>, tokio::task::JoinHandle<()>) {
    let pick = move |raft: &RaftNode| format!("http://{}", raft.leader_addr().unwrap_or_else(|| own_addr.clone()));
    let (tx, rx) = watch::channel(pick(raft));
    let raft = raft.clone();
    let task = tokio::spawn(async move {
        let mut leadership = raft.leadership();
        let mut members = raft.members_watch();
        loop {
            tx.send_if_modified(|cur| {
                let next = pick(&raft);
                let changed = *cur != next;
                *cur = next;
                changed
            });
            tokio::select! {
                r = leadership.changed() => if r.is_err() { return },
                r = members.changed() => if r.is_err() { return },
                _ = shoal_manager::stopped(&mut shutdown) => return,
            }
        }
    });
    (rx, task)
}

/// The longest wait between two certificate renewals a demoted manager asks for while the leader has not yet
/// taken it out of Raft (doubling from `join::RENEW_RETRY_MIN`).
const DEMOTION_RETRY_MAX: Duration = Duration::from_secs(8);

/// How often the demotion watch looks again without an event (a leader change, say, moves no watch it has).
const DEMOTION_POLL: Duration = Duration::from_secs(1);

/// Whether this manager has been told it is demoted: its own Node object (in its store, or from its agent's
/// session with the leader) wants the worker role, or Raft applied its removal.
fn demotion_seen(
    store: &MemoryStore,
    node_id: &str,
    raft: &RaftNode,
    session_node: &watch::Receiver<Option<shoal_api::Node>>,
) -> bool {
    let wants_worker = |n: &shoal_api::Node| n.spec.as_ref().is_some_and(|s| s.desired_role() == NodeRole::Worker);
    let in_store = store.view(|t| t.nodes().get(node_id).is_some_and(|n| wants_worker(n)));
    let from_session = session_node
        .borrow()
        .as_ref()
        .is_some_and(|n| n.id == node_id && wants_worker(n) && n.role() == NodeRole::Worker);
    let members = raft.members();
    let removed = members.removed.contains(&raft.id())
        || (!members.members.is_empty() && !members.members.contains_key(&raft.id()));
    in_store || from_session || removed
}

/// The other managers this one can renew its certificate through, the leader first.
fn other_managers(raft: &RaftNode) -> Vec<String> {
    let members = raft.members();
    let leader = raft.status().leader_id;
    let mut out: Vec<String> = Vec::new();
    if leader != raft.id() {
        out.extend(members.addr(leader).map(str::to_string));
    }
    for (id, _) in members.members.iter().filter(|(id, _)| **id != raft.id() && **id != leader) {
        out.extend(members.addr(*id).map(str::to_string));
    }
    out
}

/// Watches for this manager's demotion (SwarmKit's node: the role in its certificate decides): once it is
/// told it is demoted (`demotion_seen`), renews its certificate through another manager, with a doubling
/// delay up to `DEMOTION_RETRY_MAX`, until the CA issues a worker certificate, which it does only once the
/// leader has taken this member out of Raft (`raft_status`). Returns the address of the manager that issued
/// it (the one to run as a worker with), or `None` on `shutdown`. A node promoted again before the leader
/// removed it stops asking and stays a manager.
pub(crate) async fn wait_demoted(
    state_dir: std::path::PathBuf,
    tls: crate::tls::NodeTls,
    store: Arc<MemoryStore>,
    node_id: String,
    raft: RaftNode,
    mut session_node: watch::Receiver<Option<shoal_api::Node>>,
    mut shutdown: watch::Receiver<bool>,
) -> Option<String> {
    use shoal_ca::Role;
    let mut retry = crate::join::RENEW_RETRY_MIN;
    let mut members = raft.members_watch();
    let mut next_try = tokio::time::Instant::now();
    let mut turn = 0usize;
    let mut session_open = true;
    loop {
        // Watch before looking, so that no change between the two is missed.
        let (_, mut changes) = store.view_and_watch(|_| ());
        if demotion_seen(&store, &node_id, &raft, &session_node) && tokio::time::Instant::now() >= next_try {
            let candidates = other_managers(&raft);
            if let Some(addr) = candidates.get(turn % candidates.len().max(1)).cloned() {
                turn += 1;
                match crate::join::renew_once(&addr, &tls, &state_dir).await {
                    Ok(()) if tls.subject().role == Role::Worker => {
                        tracing::info!(manager = %addr, "this manager was demoted and left raft: it holds a worker \
                                                         certificate now");
                        return Some(addr);
                    }
                    Ok(()) => {
                        tracing::info!(manager = %addr, "demoted, but raft still counts this manager; asking again in \
                                                         {retry:?}")
                    }
                    Err(e) => {
                        tracing::info!(manager = %addr, error = %e, "demoted: renewal for the worker role failed; \
                                                                     retrying in {retry:?}")
                    }
                }
            }
            next_try = tokio::time::Instant::now() + retry;
            retry = (retry * 2).min(DEMOTION_RETRY_MAX);
        }
        tokio::select! {
            _ = shoal_manager::stopped(&mut shutdown) => return None,
            _ = changes.recv() => {}
            r = session_node.changed(), if session_open => session_open = r.is_ok(),
            r = members.changed() => if r.is_err() { return None },
            _ = tokio::time::sleep(DEMOTION_POLL) => {}
        }
    }
}
