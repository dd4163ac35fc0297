//! The volume manager's loop: a queue of volumes to look at, filled from the store's watch, worked one at a
//! time (as SwarmKit's), with the failed ones retried after a backoff on the cluster's timer.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use shoal_api::csi;
use shoal_store::{Object, WatchError};
use tokio::sync::broadcast::error::TryRecvError;
use tokio::sync::watch;

use super::core::{drained, next_work, released, volume_info, Work};
use super::{ControllerPlugins, PluginError, PluginFuture};
use crate::state::ClusterState;
use crate::subsystem::{stopped, Subsystem, SubsystemFuture};

/// The largest `VolumeInfo` (a plugin's answer to `CreateVolume`, encoded) written to the store.
pub(crate) const MAX_VOLUME_INFO_BYTES: usize = 64 * 1024;
/// How long a plugin call may take (SwarmKit's `CSIRPCTimeout`).
pub(crate) const CALL_TIMEOUT_MS: u64 = 15_000;
/// The first retry of a volume whose step failed comes after this long, each next one after twice as long...
pub(crate) const RETRY_MIN_MS: u64 = 500;
/// ...up to this.
pub(crate) const RETRY_MAX_MS: u64 = 60_000;

/// The leader-only volume manager (see the module doc of `volumes`).
#[derive(Debug, Clone)]
pub(crate) struct VolumeManager {
    plugins: Arc<dyn ControllerPlugins>,
}

impl VolumeManager {
    /// A volume manager calling `plugins`.
    pub(crate) fn new(plugins: Arc<dyn ControllerPlugins>) -> VolumeManager {
        VolumeManager { plugins }
    }
}

impl Subsystem for VolumeManager {
    fn name(&self) -> &'static str {
        "volume-manager"
    }

    fn run(&self, state: ClusterState, stop: watch::Receiver<bool>) -> SubsystemFuture {
        Box::pin(run(state, self.plugins.clone(), stop))
    }
}

/// How one volume's step ended.
enum Outcome {
    /// Done, or nothing to do: look again only when it changes.
    Done,
    /// Failed or waiting: look again after the backoff (and when something it may wait for changes).
    Retry,
    /// The loop was told to stop.
    Stopped,
}

pub(super) fn backoff_ms(attempts: u32) -> u64 {
    RETRY_MIN_MS.saturating_mul(1u64 << attempts.saturating_sub(1).min(16)).min(RETRY_MAX_MS)
}

fn all_volumes(t: &shoal_store::Tables) -> BTreeSet<String> {
    t.volumes().iter().map(|v| v.id.clone()).collect()
}

async fn run(state: ClusterState, plugins: Arc<dyn ControllerPlugins>, mut stop: watch::Receiver<bool>) {
    let (mut todo, mut events) = state.store.view_and_watch(all_volumes);
    // Volumes whose last step failed or waits, with how many times in a row.
    let mut retrying: BTreeMap<String, u32> = BTreeMap::new();
    loop {
        while let Some(id) = todo.pop_first() {
            match step(&state, plugins.as_ref(), &id, &mut stop).await {
                Outcome::Done => {
                    retrying.remove(&id);
                }
                Outcome::Retry => *retrying.entry(id).or_insert(0) += 1,
                Outcome::Stopped => return,
            }
            // What changed meanwhile (without waiting).
            loop {
                match events.try_recv() {
                    Ok(commit) => {
                        if queue(&commit, &mut todo, &retrying) {
                            todo.extend(state.store.view(all_volumes));
                        }
                    }
                    Err(TryRecvError::Lagged(_)) => todo = state.store.view(all_volumes),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Closed) => return,
                }
            }
        }
        let wait = retrying.values().min().map(|a| backoff_ms(*a));
        let retry = async {
            match wait {
                Some(ms) => state.sleep_ms(ms).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = stopped(&mut stop) => return,
            r = events.recv() => match r {
                Ok(commit) => {
                    if queue(&commit, &mut todo, &retrying) {
                        todo.extend(state.store.view(all_volumes));
                    }
                }
                Err(WatchError::Lagged(_)) => todo = state.store.view(all_volumes),
                Err(WatchError::Closed) => return,
            },
            _ = retry => todo.extend(retrying.keys().cloned()),
        }
    }
}

/// Queues what a commit may have given work to: a volume created or changed; the volumes of a task that
/// changed (it may have ended, so its node may let go of them); and, when a secret, a service or a node
/// changed, the volumes waiting (one may wait for that secret, for a service to let go of it, or for a node
/// to report its plugin). True when a node was removed: every volume is looked at (its publications there).
fn queue(commit: &shoal_store::Commit, todo: &mut BTreeSet<String>, retrying: &BTreeMap<String, u32>) -> bool {
    let mut rescan = false;
    for change in &commit.changes {
        match &change.object {
            Object::Volume(v) if change.kind != shoal_store::ActionKind::Remove => {
                todo.insert(v.id.clone());
            }
            Object::Task(t) => {
                todo.extend(t.volumes.iter().map(|a| a.id.clone()));
                if let Some(Object::Task(old)) = &change.old {
                    todo.extend(old.volumes.iter().map(|a| a.id.clone()));
                }
            }
            Object::Node(_) if change.kind == shoal_store::ActionKind::Remove => rescan = true,
            Object::Secret(_) | Object::Service(_) | Object::Node(_) => todo.extend(retrying.keys().cloned()),
            _ => {}
        }
    }
    rescan
}

/// Runs a plugin call, bounded by `CALL_TIMEOUT_MS`; `None` when the loop is told to stop first.
async fn call<T>(
    state: &ClusterState,
    stop: &mut watch::Receiver<bool>,
    fut: PluginFuture<T>,
) -> Option<Result<T, PluginError>> {
    tokio::select! {
        biased;
        _ = stopped(stop) => None,
        r = fut => Some(r),
        _ = state.sleep_ms(CALL_TIMEOUT_MS) => Some(Err(PluginError::Failed(format!(
            "the plugin did not answer within {} s", CALL_TIMEOUT_MS / 1000
        )))),
    }
}

async fn step(
    state: &ClusterState,
    plugins: &dyn ControllerPlugins,
    id: &str,
    stop: &mut watch::Receiver<bool>,
) -> Outcome {
    let Some((volume, work)) = state.store.view(|t| t.volumes().get(id).map(|v| (v.clone(), next_work(t, v)))) else {
        return Outcome::Done;
    };
    let name = volume.spec.as_ref().and_then(|s| s.annotations.as_ref()).map(|a| a.name.clone()).unwrap_or_default();
    match work {
        Work::Nothing => Outcome::Done,
        Work::Wait(why) => {
            tracing::info!(volume = %name, "cluster volume waits: {why}");
            Outcome::Retry
        }
        Work::Remove => finish(state, id, |t, c| {
            if let Some(v) = t.volumes().get(id).filter(|v| v.pending_delete && !v.created_by_plugin()) {
                c.remove(v.clone());
            }
        })
        .await
        .map_or(Outcome::Retry, |()| Outcome::Done),
        Work::Drain => {
            let now = state.clock.now_unix_ms();
            finish(state, id, |t, c| {
                let Some(v) = t.volumes().get(id) else { return };
                for task in drained(t, v, now) {
                    tracing::info!(volume = %name, task = %task.id, "task rejected: its cluster volume is drained");
                    c.update(task);
                }
            })
            .await
            .map_or(Outcome::Retry, |()| Outcome::Done)
        }
        Work::Release => finish(state, id, |t, c| {
            if let Some(v) = t.volumes().get(id).and_then(|v| released(t, v)) {
                c.update(v);
            }
        })
        .await
        .map_or(Outcome::Retry, |()| Outcome::Done),
        Work::Publish { plugin, node, request } => {
            publish(state, plugins, stop, id, &name, plugin, node, request).await
        }
        Work::Unpublish { plugin, node, request } => {
            unpublish(state, plugins, stop, id, &name, plugin, node, request).await
        }
        Work::Create { plugin, request } => create(state, plugins, stop, id, &name, plugin, request).await,
        Work::Delete { plugin, request } => {
            let Some(answer) = call(state, stop, plugins.delete_volume(&plugin, request)).await else {
                return Outcome::Stopped;
            };
            if let Err(e) = answer {
                tracing::warn!(volume = %name, %plugin, "cannot delete the cluster volume: {e}");
                return Outcome::Retry;
            }
            let removed = finish(state, id, |t, c| {
                if let Some(v) = t.volumes().get(id) {
                    c.remove(v.clone());
                }
            })
            .await;
            match removed {
                Ok(()) => {
                    tracing::info!(volume = %name, %plugin, "cluster volume deleted");
                    Outcome::Done
                }
                Err(()) => Outcome::Retry,
            }
        }
    }
}

/// `Work::Publish`: the plugin's `ControllerPublishVolume`, then `PUBLISHED` with its context (if the
/// publication is still pending; one released meanwhile is undone by the unpublish that follows).
#[expect(clippy::too_many_arguments, reason = "the step's context, passed through")]
async fn publish(
    state: &ClusterState,
    plugins: &dyn ControllerPlugins,
    stop: &mut watch::Receiver<bool>,
    id: &str,
    name: &str,
    plugin: String,
    node: String,
    request: csi::ControllerPublishVolumeRequest,
) -> Outcome {
    let Some(answer) = call(state, stop, plugins.controller_publish(&plugin, request)).await else {
        return Outcome::Stopped;
    };
    let context = match answer {
        Ok(context) => context,
        Err(e) => {
            tracing::warn!(volume = %name, %plugin, %node, "cannot publish the cluster volume: {e}");
            return Outcome::Retry;
        }
    };
    if context.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>() > MAX_VOLUME_INFO_BYTES {
        tracing::warn!(volume = %name, %plugin, %node, "the plugin's publish context is over \
                {MAX_VOLUME_INFO_BYTES} bytes: not kept; fix the plugin");
        return Outcome::Retry;
    }
    let written = finish(state, id, |t, c| {
        use shoal_api::volume_publish_status::State;
        let Some(v) = t.volumes().get(id) else { return };
        let Some(i) =
            v.publish_status.iter().position(|s| s.node_id == node && s.state == State::PendingPublish as i32)
        else {
            // Released meanwhile: the unpublish that follows undoes this publish.
            return;
        };
        let mut v = (**v).clone();
        v.publish_status[i].state = State::Published as i32;
        v.publish_status[i].publish_context = context.clone().into_iter().collect();
        v.publish_status[i].message = String::new();
        c.update(v);
    })
    .await;
    match written {
        Ok(()) => {
            tracing::info!(volume = %name, %plugin, %node, "cluster volume published");
            Outcome::Done
        }
        Err(()) => Outcome::Retry,
    }
}

/// `Work::Unpublish`: the plugin's `ControllerUnpublishVolume`, then the publication dropped.
#[expect(clippy::too_many_arguments, reason = "the step's context, passed through")]
async fn unpublish(
    state: &ClusterState,
    plugins: &dyn ControllerPlugins,
    stop: &mut watch::Receiver<bool>,
    id: &str,
    name: &str,
    plugin: String,
    node: String,
    request: csi::ControllerUnpublishVolumeRequest,
) -> Outcome {
    let Some(answer) = call(state, stop, plugins.controller_unpublish(&plugin, request)).await else {
        return Outcome::Stopped;
    };
    if let Err(e) = answer {
        tracing::warn!(volume = %name, %plugin, %node, "cannot unpublish the cluster volume: {e}");
        return Outcome::Retry;
    }
    let written = finish(state, id, |t, c| {
        use shoal_api::volume_publish_status::State;
        let Some(v) = t.volumes().get(id) else { return };
        if !v.publish_status.iter().any(|s| s.node_id == node && s.state == State::PendingUnpublish as i32) {
            return;
        }
        let mut v = (**v).clone();
        v.publish_status.retain(|s| !(s.node_id == node && s.state == State::PendingUnpublish as i32));
        c.update(v);
    })
    .await;
    match written {
        Ok(()) => {
            tracing::info!(volume = %name, %plugin, %node, "cluster volume unpublished");
            Outcome::Done
        }
        Err(()) => Outcome::Retry,
    }
}

/// `Work::Create`: the plugin's `CreateVolume`, then its answer as the volume's `VolumeInfo` (bounded); a
/// volume removed meanwhile is deleted again.
async fn create(
    state: &ClusterState,
    plugins: &dyn ControllerPlugins,
    stop: &mut watch::Receiver<bool>,
    id: &str,
    name: &str,
    plugin: String,
    request: csi::CreateVolumeRequest,
) -> Outcome {
    let secrets = request.secrets.clone();
    let Some(answer) = call(state, stop, plugins.create_volume(&plugin, request)).await else {
        return Outcome::Stopped;
    };
    let made = match answer {
        Ok(made) if !made.volume_id.is_empty() => made,
        Ok(_) => {
            tracing::warn!(volume = %name, %plugin, "the plugin created the volume but gave no volume ID");
            return Outcome::Retry;
        }
        Err(e) => {
            tracing::warn!(volume = %name, %plugin, "cannot create the cluster volume: {e}");
            return Outcome::Retry;
        }
    };
    let plugin_id = made.volume_id.clone();
    let info = volume_info(made);
    let size = shoal_api::prost::Message::encoded_len(&info);
    if size > MAX_VOLUME_INFO_BYTES {
        // Bounded before it is written: what a plugin answers lands in every manager's store.
        tracing::warn!(volume = %name, %plugin, size, "the plugin's answer to CreateVolume is over \
                {MAX_VOLUME_INFO_BYTES} bytes (volume context and topologies): not kept; fix the plugin");
        return Outcome::Retry;
    }
    let mut gone = false;
    let written = finish(state, id, |t, c| match t.volumes().get(id) {
        None => gone = true,
        Some(v) if v.created_by_plugin() => {}
        Some(v) => {
            let mut v = (**v).clone();
            v.volume_info = Some(info.clone());
            c.update(v);
        }
    })
    .await;
    if gone {
        // Removed while the plugin was creating it: nothing will delete it later, so do it now.
        tracing::info!(volume = %name, %plugin, "the volume was removed while it was created: deleting it");
        let request = csi::DeleteVolumeRequest { volume_id: plugin_id, secrets };
        match call(state, stop, plugins.delete_volume(&plugin, request)).await {
            None => return Outcome::Stopped,
            Some(Err(e)) => tracing::warn!(volume = %name, %plugin, "cannot delete the volume: {e}"),
            Some(Ok(())) => {}
        }
        return Outcome::Done;
    }
    match written {
        Ok(()) => {
            tracing::info!(volume = %name, %plugin, "cluster volume created");
            Outcome::Done
        }
        Err(()) => Outcome::Retry,
    }
}

/// Writes what `f` builds from a fresh view, trying again (a few times) when another write came first.
async fn finish(
    state: &ClusterState,
    id: &str,
    mut f: impl FnMut(&shoal_store::Tables, &mut shoal_store::Changes),
) -> Result<(), ()> {
    for _ in 0..3 {
        match state
            .write(|t, c| {
                f(t, c);
                Ok::<(), std::convert::Infallible>(())
            })
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) => tracing::debug!(volume = %id, error = %e, "volume write failed; reading again"),
        }
    }
    Err(())
}
