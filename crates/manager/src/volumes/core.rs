//! What the volume manager does next for a volume, and the CSI requests it sends, from the store alone
//! (no IO): SwarmKit's conversions (`manager/csi/plugin.go`, `internal/csi/capability`).

use std::collections::HashMap;

use shoal_api::{csi, volume_access_mode, volume_publish_status, Volume, VolumeAccessMode, VolumeInfo};
use shoal_store::Tables;

use crate::controlapi::references::services_using;
use crate::tasks::observed_state;

/// The next step for one volume.
#[derive(Debug, PartialEq)]
pub(crate) enum Work {
    /// Have `plugin` create the volume, then write its answer to `VolumeInfo`.
    Create {
        /// The volume's driver.
        plugin: String,
        /// The request.
        request: csi::CreateVolumeRequest,
    },
    /// Have `plugin` delete the volume (pending deletion), then remove it from the store.
    Delete {
        /// The volume's driver.
        plugin: String,
        /// The request.
        request: csi::DeleteVolumeRequest,
    },
    /// Remove it from the store at once: pending deletion of a volume no plugin created.
    Remove,
    /// Reject the live tasks that use the volume (`drained`): its availability is `drain`.
    Drain,
    /// Publications to move without a call (`released`): no live task on the node uses the volume any more,
    /// or the node is gone.
    Release,
    /// Have `plugin` publish the volume to the swarm node `node` (`PENDING_PUBLISH`), then mark it
    /// `PUBLISHED` with the plugin's publish context.
    Publish {
        /// The volume's driver.
        plugin: String,
        /// The swarm's node ID.
        node: String,
        /// The request, with the plugin's ID of the node.
        request: csi::ControllerPublishVolumeRequest,
    },
    /// Have `plugin` unpublish the volume from the swarm node `node` (`PENDING_UNPUBLISH`), then drop that
    /// publication.
    Unpublish {
        /// The volume's driver.
        plugin: String,
        /// The swarm's node ID.
        node: String,
        /// The request, with the plugin's ID of the node.
        request: csi::ControllerUnpublishVolumeRequest,
    },
    /// Nothing can be asked yet; why (a secret it names is gone, a service mounts a volume pending
    /// deletion). The volume is looked at again when it, a secret or a service changes, and on the retries.
    Wait(String),
    /// Nothing to do.
    Nothing,
}

/// The next step for `v` in the view `t`.
pub(crate) fn next_work(t: &Tables, v: &Volume) -> Work {
    let Some(spec) = v.spec.as_ref() else { return Work::Nothing };
    let plugin = spec.driver.as_ref().map(|d| d.name.clone()).unwrap_or_default();
    if v.pending_delete {
        if !v.created_by_plugin() {
            return Work::Remove;
        }
        let users = services_using(t, |c| shoal_store::mounts_volume(c, v));
        if !users.is_empty() {
            return Work::Wait(format!(
                "the volume is pending deletion but {} mount{} it again; it is deleted once none does",
                users.join(", "),
                if users.len() == 1 { "s" } else { "" }
            ));
        }
        return match secrets(t, v) {
            Ok(secrets) => Work::Delete {
                plugin,
                request: csi::DeleteVolumeRequest {
                    volume_id: v.volume_info.as_ref().map(|i| i.volume_id.clone()).unwrap_or_default(),
                    secrets,
                },
            },
            Err(why) => Work::Wait(why),
        };
    }
    if is_drained(v) && t.tasks().iter().any(|task| drains(task, &v.id)) {
        return Work::Drain;
    }
    if released(t, v).is_some() {
        return Work::Release;
    }
    if let Some(work) = publication_work(t, v, &plugin) {
        return work;
    }
    if v.created_by_plugin() {
        return Work::Nothing;
    }
    match create_request(t, v) {
        Ok(request) => Work::Create { plugin, request },
        Err(why) => Work::Wait(why),
    }
}

/// How many tasks on `node_id` use volume `volume_id` and may still run (observed state not terminal).
pub(crate) fn live_users(t: &Tables, volume_id: &str, node_id: &str) -> usize {
    t.tasks()
        .by_node(node_id)
        .filter(|task| task.volumes.iter().any(|a| a.id == volume_id) && !observed_state(task).is_terminal())
        .count()
}

/// The status message of a task rejected because its volume is drained.
pub(crate) const DRAINED_MESSAGE: &str = "task rejected: its cluster volume is drained";
/// The status error of such a task (SwarmKit's).
pub(crate) const DRAINED_ERR: &str = "attached to volume which is being drained";

fn is_drained(v: &Volume) -> bool {
    v.spec.as_ref().is_some_and(|s| s.availability == shoal_api::volume_spec::VolumeAvailability::Drain as i32)
}

/// True when `task` uses volume `volume_id` and is meant to run and has not ended (SwarmKit's volume
/// enforcer: desired at most COMPLETE, observed before COMPLETE).
fn drains(task: &shoal_api::Task, volume_id: &str) -> bool {
    use shoal_api::TaskState;
    task.volumes.iter().any(|a| a.id == volume_id)
        && task.desired_state() <= TaskState::Complete
        && observed_state(task) < TaskState::Complete
}

/// The tasks to reject because `v` is drained, each REJECTED at `now_ms` (SwarmKit's volume enforcer): their
/// orchestrators replace them, and the scheduler keeps the replacements off the volume while it is drained.
/// The observed state is the agent's, but a rejection only moves it forward, as the constraint enforcer's.
pub(crate) fn drained(t: &Tables, v: &Volume, now_ms: u64) -> Vec<shoal_api::Task> {
    if !is_drained(v) {
        return Vec::new();
    }
    let now = shoal_api::timestamp_from_unix_ms(now_ms);
    t.tasks()
        .iter()
        .filter(|task| drains(task, &v.id))
        .map(|task| {
            let mut task = (**task).clone();
            task.status = Some(shoal_api::TaskStatus {
                timestamp: Some(now),
                state: shoal_api::TaskState::Rejected as i32,
                message: DRAINED_MESSAGE.to_string(),
                err: DRAINED_ERR.to_string(),
                ..task.status.clone().unwrap_or_default()
            });
            task
        })
        .collect()
}

/// The plugin's ID of swarm node `node_id`: what its `NodeGetInfo` answered there, as the node reports it.
fn csi_node_id(t: &Tables, node_id: &str, plugin: &str) -> Option<String> {
    let node = t.nodes().get(node_id)?;
    let info = node.description.as_ref()?.csi_info.iter().find(|i| i.plugin_name == plugin)?;
    (!info.node_id.is_empty()).then(|| info.node_id.clone())
}

/// `v` with the publications that must move without a plugin call moved, or `None` when none must:
/// - `PUBLISHED` on a node where no live task uses it: `PENDING_NODE_UNPUBLISH` (the node unpublishes it,
///   then says so through `UpdateVolumeStatus`);
/// - `PENDING_PUBLISH` that no live task needs any more: `PENDING_UNPUBLISH` (the intent was written before
///   the call, so the plugin may have published it);
/// - `PUBLISHED` or `PENDING_NODE_UNPUBLISH` on a node that is gone: `PENDING_UNPUBLISH` (no node is left to
///   unpublish it).
pub(crate) fn released(t: &Tables, v: &Volume) -> Option<Volume> {
    use volume_publish_status::State;
    let mut out: Option<Volume> = None;
    for (i, st) in v.publish_status.iter().enumerate() {
        let gone = t.nodes().get(&st.node_id).is_none();
        let users = || live_users(t, &v.id, &st.node_id);
        let next = match State::try_from(st.state) {
            Ok(State::Published | State::PendingNodeUnpublish) if gone => {
                Some((State::PendingUnpublish, "the node was removed"))
            }
            Ok(State::Published) if users() == 0 => {
                Some((State::PendingNodeUnpublish, "no task on the node uses the volume: the node unpublishes it"))
            }
            Ok(State::PendingPublish) if gone || users() == 0 => {
                Some((State::PendingUnpublish, "no task on the node needs the volume any more"))
            }
            _ => None,
        };
        if let Some((state, message)) = next {
            let o = out.get_or_insert_with(|| v.clone());
            o.publish_status[i].state = state as i32;
            o.publish_status[i].message = message.to_string();
        }
    }
    out
}

/// The next plugin call for `v`'s publications: an unpublish first (it frees the volume for other nodes),
/// then a publish; `Wait` when the call cannot be made yet (the node has not reported the plugin, a secret
/// is gone); `None` when there is none to make.
fn publication_work(t: &Tables, v: &Volume, plugin: &str) -> Option<Work> {
    use volume_publish_status::State;
    let info = v.volume_info.as_ref();
    let volume_id = info.map(|i| i.volume_id.clone()).unwrap_or_default();
    if let Some(st) = v.publish_status.iter().find(|s| s.state == State::PendingUnpublish as i32) {
        let Some(csi_node) = csi_node_id(t, &st.node_id, plugin) else {
            return Some(Work::Wait(format!(
                "the volume must be unpublished from node {}, which is gone (or no longer reports the plugin \
                 {plugin:?}), so the plugin's ID of that node is unknown: unpublish it with the storage's own \
                 tools, then remove the volume with --force",
                st.node_id
            )));
        };
        return Some(match secrets(t, v) {
            Ok(secrets) => Work::Unpublish {
                plugin: plugin.to_string(),
                node: st.node_id.clone(),
                request: csi::ControllerUnpublishVolumeRequest { volume_id, node_id: csi_node, secrets },
            },
            Err(why) => Work::Wait(why),
        });
    }
    // The first publication whose node reports the plugin; one that does not waits without holding the others.
    let pending = || v.publish_status.iter().filter(|s| s.state == State::PendingPublish as i32);
    let Some((st, csi_node)) = pending().find_map(|st| csi_node_id(t, &st.node_id, plugin).map(|n| (st, n))) else {
        let st = pending().next()?;
        return Some(Work::Wait(format!(
            "node {} reports no CSI plugin {plugin:?}: start its daemon with --csi-plugin \
             {plugin}=unix:///path/to/the/plugin.sock",
            st.node_id
        )));
    };
    let spec = v.spec.as_ref()?;
    let read_only =
        spec.access_mode.as_ref().is_some_and(|m| m.sharing == volume_access_mode::Sharing::ReadOnly as i32);
    Some(match secrets(t, v) {
        Ok(secrets) => Work::Publish {
            plugin: plugin.to_string(),
            node: st.node_id.clone(),
            request: csi::ControllerPublishVolumeRequest {
                volume_id,
                node_id: csi_node,
                volume_capability: spec.access_mode.as_ref().map(capability),
                readonly: read_only,
                secrets,
                volume_context: info.map(|i| i.volume_context.clone().into_iter().collect()).unwrap_or_default(),
            },
        },
        Err(why) => Work::Wait(why),
    })
}

/// The secrets a volume passes to its plugin, by key, read from the store (by name or ID); a secret that is
/// gone is an error naming it (a plugin must never be called with credentials left out).
fn secrets(t: &Tables, v: &Volume) -> Result<HashMap<String, String>, String> {
    let mut out = HashMap::new();
    for s in v.spec.as_ref().map(|s| s.secrets.as_slice()).unwrap_or_default() {
        let found = t.secrets().get(&s.secret).or_else(|| t.secrets().by_name(&s.secret));
        let Some(secret) = found else {
            return Err(format!(
                "the secret {:?} the volume gives its plugin as {:?} does not exist: create it again (docker secret \
                 create), or remove the volume with --force",
                s.secret, s.key
            ));
        };
        let data = secret.spec.as_ref().map(|s| s.data.as_slice()).unwrap_or_default();
        out.insert(s.key.clone(), String::from_utf8_lossy(data).into_owned());
    }
    Ok(out)
}

/// `CreateVolume` for `v`: its name, the driver's options as parameters, its secrets, its access mode as the
/// one capability, its capacity range and topology requirement.
pub(crate) fn create_request(t: &Tables, v: &Volume) -> Result<csi::CreateVolumeRequest, String> {
    let spec = v.spec.as_ref().ok_or("the volume has no spec")?;
    Ok(csi::CreateVolumeRequest {
        name: spec.annotations.as_ref().map(|a| a.name.clone()).unwrap_or_default(),
        capacity_range: spec
            .capacity_range
            .as_ref()
            .map(|c| csi::CapacityRange { required_bytes: c.required_bytes, limit_bytes: c.limit_bytes }),
        volume_capabilities: spec.access_mode.as_ref().map(capability).into_iter().collect(),
        parameters: spec.driver.as_ref().map(|d| d.options.clone().into_iter().collect()).unwrap_or_default(),
        secrets: secrets(t, v)?,
        accessibility_requirements: spec.accessibility_requirements.as_ref().map(|r| csi::TopologyRequirement {
            requisite: r.requisite.iter().map(topology).collect(),
            preferred: r.preferred.iter().map(topology).collect(),
        }),
    })
}

fn topology(t: &shoal_api::Topology) -> csi::Topology {
    csi::Topology { segments: t.segments.clone().into_iter().collect() }
}

/// A volume's access mode as a CSI capability (SwarmKit's `capability.MakeCapability`): one node with any
/// writer sharing is single-node-writer, read-only sharing the reader-only modes, several nodes with one or
/// all writers the multi-node writer modes; a multi-node volume with no sharing has no CSI mode (`UNKNOWN`),
/// as in SwarmKit.
pub fn capability(mode: &VolumeAccessMode) -> csi::VolumeCapability {
    use csi::volume_capability::access_mode::Mode;
    use volume_access_mode::{Scope, Sharing};
    let scope = Scope::try_from(mode.scope).unwrap_or(Scope::SingleNode);
    let sharing = Sharing::try_from(mode.sharing).unwrap_or(Sharing::None);
    let csi_mode = match (scope, sharing) {
        (Scope::SingleNode, Sharing::ReadOnly) => Mode::SingleNodeReaderOnly,
        (Scope::SingleNode, _) => Mode::SingleNodeWriter,
        (Scope::MultiNode, Sharing::ReadOnly) => Mode::MultiNodeReaderOnly,
        (Scope::MultiNode, Sharing::OneWriter) => Mode::MultiNodeSingleWriter,
        (Scope::MultiNode, Sharing::All) => Mode::MultiNodeMultiWriter,
        (Scope::MultiNode, Sharing::None) => Mode::Unknown,
    };
    let access_type = match &mode.access_type {
        Some(volume_access_mode::AccessType::Block(_)) => {
            Some(csi::volume_capability::AccessType::Block(csi::volume_capability::BlockVolume {}))
        }
        Some(volume_access_mode::AccessType::Mount(m)) => {
            Some(csi::volume_capability::AccessType::Mount(csi::volume_capability::MountVolume {
                fs_type: m.fs_type.clone(),
                mount_flags: m.mount_flags.clone(),
            }))
        }
        None => None,
    };
    csi::VolumeCapability {
        access_type,
        access_mode: Some(csi::volume_capability::AccessMode { mode: csi_mode as i32 }),
    }
}

/// What a plugin's `CreateVolume` answered, as the volume's `VolumeInfo`.
pub(crate) fn volume_info(v: csi::Volume) -> VolumeInfo {
    VolumeInfo {
        capacity_bytes: v.capacity_bytes,
        volume_context: v.volume_context.into_iter().collect(),
        volume_id: v.volume_id,
        accessible_topology: v
            .accessible_topology
            .into_iter()
            .map(|t| shoal_api::Topology { segments: t.segments.into_iter().collect() })
            .collect(),
    }
}
