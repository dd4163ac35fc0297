//! The leader-only loop that keeps each manager's `Node.manager_status` (Raft ID, address, leader,
//! reachability) and role in step with the Raft membership, so `docker node ls` shows every manager with
//! its MANAGER STATUS. A member whose Node object does not exist yet (its agent has not connected) gets one;
//! a node whose Raft ID was removed from the cluster loses its manager status and becomes a worker. A manager
//! demoted (`docker node demote`: desired role worker) is removed from Raft, unless that would leave the
//! remaining managers without a reachable quorum; a demoted leader hands its leadership over first.
//!
//! Reads Raft only through `RaftNode`'s members, leadership and reachability; writes through the store.

use std::collections::BTreeMap;
use std::time::Duration;

use shoal_api::{node_spec, raft_member_status::Reachability, ManagerStatus, Meta, Node, NodeRole, NodeSpec};
use shoal_manager::{ClusterState, Subsystem, SubsystemFuture};
use shoal_raft::{Members, RaftNode};
use tokio::sync::watch;

/// How often the manager statuses are compared with Raft (reachability changes without an event), while the
/// cluster has more than one member (or the last pass failed).
pub(crate) const MANAGER_STATUS_PERIOD: Duration = Duration::from_secs(1);

/// The subsystem; see the module doc.
pub(crate) struct ManagerStatusSubsystem {
    raft: RaftNode,
}

impl ManagerStatusSubsystem {
    /// Keeps manager statuses for `raft`'s cluster.
    pub(crate) fn new(raft: RaftNode) -> ManagerStatusSubsystem {
        ManagerStatusSubsystem { raft }
    }
}

impl Subsystem for ManagerStatusSubsystem {
    fn name(&self) -> &'static str {
        "manager-status"
    }

    fn run(&self, state: ClusterState, mut stop: watch::Receiver<bool>) -> SubsystemFuture {
        let raft = self.raft.clone();
        Box::pin(async move {
            let mut tick = tokio::time::interval(MANAGER_STATUS_PERIOD);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut members = raft.members_watch();
            loop {
                let failed = match reconcile(&state, &raft).await {
                    Ok(()) => false,
                    Err(e) => {
                        tracing::debug!(error = %e, "manager status update failed; will retry");
                        true
                    }
                };
                // Only other members' reachability changes without a membership event: a one-member cluster
                // (this leader alone) sets no timer, so an idle single manager does not wake every second.
                let poll = failed || raft.members().members.len() > 1;
                tokio::select! {
                    _ = shoal_manager::stopped(&mut stop) => return,
                    _ = tick.tick(), if poll => {}
                    r = members.changed() => if r.is_err() { return },
                }
            }
        })
    }
}

/// One pass: the desired manager status of every member with a node ID, written where it differs; then
/// members whose node was demoted (desired role worker) leave Raft.
async fn reconcile(state: &ClusterState, raft: &RaftNode) -> Result<(), String> {
    let members = raft.members();
    let leader = raft.status().leader_id;
    let reachable = raft.reachable_members();
    let now = state.now();
    let mut demoted = Vec::new();
    state
        .write(|t, changes| {
            for m in members.members.values().filter(|m| !m.node_id.is_empty()) {
                let desired_worker = t
                    .nodes()
                    .get(&m.node_id)
                    .is_some_and(|n| n.spec.as_ref().is_some_and(|s| s.desired_role() == NodeRole::Worker));
                if desired_worker {
                    demoted.push(m.raft_id);
                    continue;
                }
                let reach = match reachable.get(&m.raft_id) {
                    Some(true) => Reachability::Reachable,
                    Some(false) => Reachability::Unreachable,
                    None => Reachability::Unknown,
                };
                let want = ManagerStatus {
                    raft_id: m.raft_id,
                    addr: m.addr.clone(),
                    leader: m.raft_id == leader,
                    reachability: reach as i32,
                };
                match t.nodes().get(&m.node_id) {
                    Some(node) => {
                        if node.manager_status.as_ref() == Some(&want) && node.role == NodeRole::Manager as i32 {
                            continue;
                        }
                        let mut node = (**node).clone();
                        node.manager_status = Some(want);
                        node.set_role(NodeRole::Manager);
                        if let Some(meta) = node.meta.as_mut() {
                            meta.updated_at = Some(now);
                        }
                        changes.update(node);
                    }
                    None => {
                        let mut spec = NodeSpec::default();
                        spec.set_desired_role(NodeRole::Manager);
                        spec.set_membership(node_spec::Membership::Accepted);
                        spec.set_availability(node_spec::Availability::Active);
                        let mut node = Node {
                            id: m.node_id.clone(),
                            meta: Some(Meta { version: None, created_at: Some(now), updated_at: Some(now) }),
                            spec: Some(spec),
                            manager_status: Some(want),
                            ..Default::default()
                        };
                        node.set_role(NodeRole::Manager);
                        changes.create(node);
                    }
                }
            }
            // Managers removed from Raft (left, or dropped by --force-new-cluster) are no longer managers.
            for node in t.nodes().iter() {
                let Some(ms) = node.manager_status.as_ref() else { continue };
                if !members.removed.contains(&ms.raft_id) {
                    continue;
                }
                let mut node = (**node).clone();
                node.manager_status = None;
                node.set_role(NodeRole::Worker);
                if let Some(spec) = node.spec.as_mut() {
                    spec.set_desired_role(NodeRole::Worker);
                }
                if let Some(meta) = node.meta.as_mut() {
                    meta.updated_at = Some(now);
                }
                changes.update(node);
            }
            Ok::<_, std::convert::Infallible>(())
        })
        .await
        .map_err(|e| e.to_string())?;
    for raft_id in demoted {
        demote(raft, raft_id, &members, &reachable).await;
    }
    Ok(())
}

/// Removes a demoted manager from Raft (SwarmKit's role manager), unless the managers left could not form a
/// reachable quorum (retried on the next pass). A demoted leader first hands its leadership to a reachable
/// member, which removes it on its own next pass. Only once the member is out does the next pass make the
/// node a worker (role and manager status), so the CA issues it a worker certificate only when Raft no
/// longer counts it: the demoted node stops its manager on that certificate (see `raft_member`).
async fn demote(raft: &RaftNode, raft_id: u64, members: &Members, reachable: &BTreeMap<u64, bool>) {
    if !raft.removal_keeps_quorum(raft_id) {
        let remaining = members.members.len().saturating_sub(1);
        tracing::warn!(
            raft_id = format_args!("{raft_id:x}"),
            remaining,
            "demotion postponed: the managers left would not have a reachable quorum"
        );
        return;
    }
    if raft_id == raft.id() {
        let Some(to) =
            members.members.keys().copied().find(|id| *id != raft_id && reachable.get(id).copied().unwrap_or(false))
        else {
            return;
        };
        tracing::info!(to = format_args!("{to:x}"), "this manager (the leader) is demoted: handing leadership over");
        if let Err(e) = raft.transfer_leadership(to).await {
            tracing::warn!(error = %e, "cannot hand leadership over yet; will retry");
        }
        return;
    }
    match raft.remove_member(raft_id).await {
        Ok(_) => tracing::info!(raft_id = format_args!("{raft_id:x}"), "demoted manager left raft"),
        Err(e) => {
            tracing::warn!(raft_id = format_args!("{raft_id:x}"), error = %e, "demoted manager could not leave raft \
                                                                               yet")
        }
    }
}
