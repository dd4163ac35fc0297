//! Cluster volumes in scheduling (SwarmKit's `volumeSet` and `VolumesFilter`): for each `type=cluster`
//! mount of a task, a volume that the node can use, chosen by name, or among a group's volumes
//! (`group:NAME`). A volume is usable on a node when:
//! - its plugin created it (`VolumeInfo.VolumeID`) and it is not pending deletion;
//! - its availability is `active` (`pause` and `drain` keep new tasks off it);
//! - the node runs its plugin (the node reports it in `Description.CSIInfo`: the volume manager needs the
//!   plugin's ID of the node to publish it there), the node is in the volume's accessible topology, and it
//!   holds fewer of the plugin's volumes than the plugin's `max_volumes_per_node` (when set);
//! - it is not being unpublished from that node, and a single-node volume is not published to another;
//! - its sharing allows one more use: `none` no other live task, `one-writer` no other writer, `read-only`
//!   read-only mounts only, `all` anything. Uses are the live tasks (observed state not terminal) whose
//!   `volumes` name it, plus those this pass placed.
//!
//! A placed task carries `volumes` (one `VolumeAttachment` per cluster mount), and each volume it uses is
//! written in the same write, `PENDING_PUBLISH` added for the node if it has no publication there: the
//! intent comes before the volume manager's call, and the write's version check orders it against the
//! volume manager's own writes (a publication released meanwhile makes the write conflict, and the task is
//! placed again from a fresh view).
//!
//! Must not depend on the store beyond a `Tables` view, or on IO.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use shoal_api::volume_spec::VolumeAvailability;
use shoal_api::{
    mount, task_spec, volume_access_mode, volume_publish_status, Mount, Task, Topology, Volume, VolumeAttachment,
    VolumePublishStatus,
};
use shoal_store::Tables;

use crate::tasks::observed_state;

/// The cluster mounts of `task`'s container.
pub(crate) fn cluster_mounts(task: &Task) -> impl Iterator<Item = &Mount> {
    let mounts = match task.spec.as_ref().and_then(|s| s.runtime.as_ref()) {
        Some(task_spec::Runtime::Container(c)) => c.mounts.as_slice(),
        _ => &[],
    };
    mounts.iter().filter(|m| m.r#type == mount::Type::Cluster as i32)
}

/// True when `task` mounts a cluster volume.
pub(crate) fn uses_cluster_volumes(task: &Task) -> bool {
    cluster_mounts(task).next().is_some()
}

#[derive(Debug, Clone)]
struct Use {
    node_id: String,
    read_only: bool,
}

/// The cluster volumes of one view, with their uses, and the volume writes a pass builds.
#[derive(Debug, Default)]
pub(crate) struct VolumeSet {
    volumes: BTreeMap<String, Arc<Volume>>,
    by_name: HashMap<String, String>,
    by_group: BTreeMap<String, Vec<String>>,
    uses: HashMap<String, Vec<Use>>,
    /// The volumes this pass changed (publications added), to be written with the tasks.
    written: BTreeMap<String, Volume>,
}

impl VolumeSet {
    /// The created volumes of `t` and their uses by live tasks.
    pub(crate) fn build(t: &Tables) -> VolumeSet {
        let mut set = VolumeSet::default();
        for v in t.volumes().iter() {
            if !v.created_by_plugin() || v.pending_delete {
                continue;
            }
            let Some(spec) = v.spec.as_ref() else { continue };
            let name = spec.annotations.as_ref().map(|a| a.name.clone()).unwrap_or_default();
            set.by_name.insert(name, v.id.clone());
            if !spec.group.is_empty() {
                set.by_group.entry(spec.group.clone()).or_default().push(v.id.clone());
            }
            set.volumes.insert(v.id.clone(), v.clone());
        }
        if set.volumes.is_empty() {
            return set;
        }
        for task in t.tasks().iter() {
            if task.volumes.is_empty() || task.node_id.is_empty() || observed_state(task).is_terminal() {
                continue;
            }
            for a in task.volumes.iter() {
                let read_only =
                    cluster_mounts(task).any(|m| m.source == a.source && m.target == a.target && m.readonly);
                set.uses.entry(a.id.clone()).or_default().push(Use { node_id: task.node_id.clone(), read_only });
            }
        }
        set
    }

    /// The volume of each of `task`'s cluster mounts usable on `node`, or why the node cannot take it (the
    /// first mount that found none). Nothing is reserved.
    pub(crate) fn choose(&self, task: &Task, node: &shoal_api::Node) -> Result<Vec<VolumeAttachment>, String> {
        let mut chosen: Vec<(String, bool)> = Vec::new();
        let mut out = Vec::new();
        for m in cluster_mounts(task) {
            let candidates: Vec<&String> = match m.source.strip_prefix("group:") {
                Some(group) => self.by_group.get(group).map(|ids| ids.iter().collect()).unwrap_or_default(),
                None => self.by_name.get(&m.source).into_iter().collect(),
            };
            if candidates.is_empty() {
                return Err(match m.source.strip_prefix("group:") {
                    Some(group) => format!("no created cluster volume in group {group:?}"),
                    None => format!("no created cluster volume named {:?}", m.source),
                });
            }
            let mut why = String::new();
            let found = candidates.into_iter().find(|id| {
                // A volume already chosen for another mount of this task counts as a use.
                match self.usable(id, node, m.readonly, &chosen) {
                    Ok(()) => true,
                    Err(e) => {
                        if why.is_empty() {
                            why = e;
                        }
                        false
                    }
                }
            });
            let Some(id) = found else { return Err(why) };
            chosen.push((id.clone(), m.readonly));
            out.push(VolumeAttachment { id: id.clone(), source: m.source.clone(), target: m.target.clone() });
        }
        Ok(out)
    }

    fn usable(
        &self,
        id: &str,
        node: &shoal_api::Node,
        read_only: bool,
        chosen: &[(String, bool)],
    ) -> Result<(), String> {
        use volume_access_mode::{Scope, Sharing};
        use volume_publish_status::State;
        let v = self.current(id).ok_or_else(|| format!("the cluster volume {id} is gone"))?;
        let spec = v.spec.clone().unwrap_or_default();
        let name = spec.annotations.as_ref().map(|a| a.name.as_str()).unwrap_or(id);
        if spec.availability != VolumeAvailability::Active as i32 {
            return Err(format!(
                "the cluster volume {name:?} is not active (docker volume update --availability active)"
            ));
        }
        let plugin = spec.driver.as_ref().map(|d| d.name.as_str()).unwrap_or_default();
        let info = node.description.as_ref().and_then(|d| d.csi_info.iter().find(|i| i.plugin_name == plugin));
        let Some(info) = info else {
            return Err(format!("the node does not run the CSI plugin {plugin:?} of the cluster volume {name:?}"));
        };
        if info.max_volumes_per_node > 0 && !v.publish_status.iter().any(|p| p.node_id == node.id) {
            let held = self.published_on(&node.id, plugin);
            if u64::try_from(info.max_volumes_per_node).is_ok_and(|max| held >= max) {
                return Err(format!(
                    "the node holds {held} volumes of the CSI plugin {plugin:?}, its limit (NodeGetInfo's \
                     max_volumes_per_node)"
                ));
            }
        }
        let accessible = v.volume_info.as_ref().map(|i| i.accessible_topology.as_slice()).unwrap_or_default();
        if !in_topology(info.accessible_topology.as_ref(), accessible) {
            return Err(format!("the node is outside the accessible topology of the cluster volume {name:?}"));
        }
        let mode = spec.access_mode.clone().unwrap_or_default();
        for p in &v.publish_status {
            let unpublishing =
                p.state == State::PendingNodeUnpublish as i32 || p.state == State::PendingUnpublish as i32;
            if p.node_id == node.id && unpublishing {
                return Err(format!("the cluster volume {name:?} is being unpublished from the node"));
            }
            if p.node_id != node.id && mode.scope == Scope::SingleNode as i32 {
                return Err(format!("the single-node cluster volume {name:?} is published to node {}", p.node_id));
            }
        }
        let uses: Vec<(&str, bool)> = self
            .uses
            .get(id)
            .map(|u| u.iter().map(|u| (u.node_id.as_str(), u.read_only)).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .chain(chosen.iter().filter(|(c, _)| c == id).map(|(_, ro)| (node.id.as_str(), *ro)))
            .collect();
        if mode.scope == Scope::SingleNode as i32 && uses.iter().any(|(n, _)| *n != node.id) {
            return Err(format!("the single-node cluster volume {name:?} is in use on another node"));
        }
        let sharing = Sharing::try_from(mode.sharing).unwrap_or(Sharing::None);
        match sharing {
            Sharing::None if !uses.is_empty() => Err(format!("the cluster volume {name:?} is in use (sharing: none)")),
            Sharing::OneWriter if !read_only && uses.iter().any(|(_, ro)| !ro) => {
                Err(format!("the cluster volume {name:?} already has its one writer"))
            }
            Sharing::ReadOnly if !read_only => {
                Err(format!("the cluster volume {name:?} is read-only: mount it with readonly"))
            }
            _ => Ok(()),
        }
    }

    /// How many volumes of `plugin` are published (or on their way) to `node_id`, this pass's included.
    fn published_on(&self, node_id: &str, plugin: &str) -> u64 {
        let count = self
            .volumes
            .keys()
            .filter_map(|id| self.current(id))
            .filter(|v| v.spec.as_ref().and_then(|s| s.driver.as_ref()).is_some_and(|d| d.name == plugin))
            .filter(|v| v.publish_status.iter().any(|p| p.node_id == node_id))
            .count();
        u64::try_from(count).unwrap_or(u64::MAX)
    }

    /// The volume as this pass last changed it, else as in the view.
    fn current(&self, id: &str) -> Option<Volume> {
        self.written.get(id).cloned().or_else(|| self.volumes.get(id).map(|v| (**v).clone()))
    }

    /// Records `task` placed on `node_id` with `attachments`: the uses, and each volume's publication on the
    /// node (`PENDING_PUBLISH` when it has none there). Every volume it uses is written with it.
    pub(crate) fn reserve(&mut self, task: &Task, node_id: &str, attachments: &[VolumeAttachment]) {
        for a in attachments {
            let read_only = cluster_mounts(task).any(|m| m.source == a.source && m.target == a.target && m.readonly);
            self.uses.entry(a.id.clone()).or_default().push(Use { node_id: node_id.to_string(), read_only });
            let Some(mut v) = self.current(&a.id) else { continue };
            if !v.publish_status.iter().any(|p| p.node_id == node_id) {
                v.publish_status.push(VolumePublishStatus {
                    node_id: node_id.to_string(),
                    state: volume_publish_status::State::PendingPublish as i32,
                    ..Default::default()
                });
            }
            self.written.insert(a.id.clone(), v);
        }
    }

    /// The volumes to write with the pass's tasks.
    pub(crate) fn take_written(&mut self) -> Vec<Volume> {
        std::mem::take(&mut self.written).into_values().collect()
    }
}

/// True when a node at `node` (its place in the plugin's topology; `None`: it says nothing) can reach a
/// volume accessible from `accessible` (empty: from anywhere): every segment of one of them is the node's.
pub(crate) fn in_topology(node: Option<&Topology>, accessible: &[Topology]) -> bool {
    let Some(node) = node else { return true };
    accessible.is_empty() || accessible.iter().any(|t| t.segments.iter().all(|(k, v)| node.segments.get(k) == Some(v)))
}
