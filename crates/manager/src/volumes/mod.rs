//! The volume manager (layer 2 of cluster volumes, docs/design/cluster-volumes.md): a leader-only loop that
//! has each volume's CSI plugin create it and, once it is removed, delete it. A new volume (no `VolumeInfo`)
//! is created through its plugin's controller (`CreateVolume` with the spec's name, parameters, secrets,
//! capability, capacity and topology, as SwarmKit's `manager/csi` builds it) and the answer is written to
//! `VolumeInfo`; a volume marked `pending_delete` is deleted through the plugin (`DeleteVolume` with the ID
//! the plugin gave) and then removed from the store. A call that fails is retried with a backoff
//! (`RETRY_MIN_MS` doubling to `RETRY_MAX_MS`), each call bounded by `CALL_TIMEOUT_MS`.
//!
//! The plugins are behind `ControllerPlugins`, the one seam: the daemon passes its gRPC clients of the
//! plugins its `--csi-plugin` flags name (`shoal-node`), the tests a fake. Publishing to nodes comes with the
//! scheduler's volume filter (layer 3).
//!
//! Must not know how a plugin is reached (sockets, gRPC channels).

pub(crate) mod core;
mod runner;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::pin::Pin;

use shoal_api::csi;

#[cfg(test)]
pub(crate) use self::core::{capability, next_work, Work, DRAINED_ERR, DRAINED_MESSAGE};
pub(crate) use self::runner::VolumeManager;
#[cfg(test)]
pub(crate) use self::runner::{MAX_VOLUME_INFO_BYTES, RETRY_MAX_MS, RETRY_MIN_MS};

/// A plugin call in flight.
pub type PluginFuture<T> = Pin<Box<dyn Future<Output = Result<T, PluginError>> + Send + 'static>>;

/// Why a plugin call did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginError {
    /// This manager has no plugin of that name (no `--csi-plugin` names it).
    NotConfigured(String),
    /// The plugin could not be reached or answered with an error (its message).
    Failed(String),
}

impl std::fmt::Display for PluginError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PluginError::NotConfigured(name) => write!(
                f,
                "no CSI plugin named {name:?} is configured on this manager: start the managers with \
                 --csi-plugin {name}=unix:///path/to/its.sock"
            ),
            PluginError::Failed(why) => f.write_str(why),
        }
    }
}

/// The controller services of the CSI plugins this manager can reach, by plugin name (a volume's
/// `Spec.Driver.Name`).
pub trait ControllerPlugins: Send + Sync + std::fmt::Debug + 'static {
    /// The plugin's `CreateVolume`; a plugin without a controller service answers with the request's name as
    /// the volume's ID (as SwarmKit does for such plugins).
    fn create_volume(&self, plugin: &str, request: csi::CreateVolumeRequest) -> PluginFuture<csi::Volume>;
    /// The plugin's `DeleteVolume`; nothing for a plugin without a controller service.
    fn delete_volume(&self, plugin: &str, request: csi::DeleteVolumeRequest) -> PluginFuture<()>;
    /// The plugin's `ControllerPublishVolume`, answering its publish context; an empty context, without a
    /// call, for a plugin whose controller cannot publish (no `PUBLISH_UNPUBLISH_VOLUME`), as in SwarmKit.
    fn controller_publish(
        &self,
        plugin: &str,
        request: csi::ControllerPublishVolumeRequest,
    ) -> PluginFuture<std::collections::HashMap<String, String>>;
    /// The plugin's `ControllerUnpublishVolume`; nothing for a plugin whose controller cannot publish.
    fn controller_unpublish(&self, plugin: &str, request: csi::ControllerUnpublishVolumeRequest) -> PluginFuture<()>;
}

/// No plugin at all: every call is `NotConfigured` (a manager started without `--csi-plugin`, the
/// simulation).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct NoPlugins;

impl ControllerPlugins for NoPlugins {
    fn create_volume(&self, plugin: &str, _: csi::CreateVolumeRequest) -> PluginFuture<csi::Volume> {
        let e = PluginError::NotConfigured(plugin.to_string());
        Box::pin(async move { Err(e) })
    }
    fn delete_volume(&self, plugin: &str, _: csi::DeleteVolumeRequest) -> PluginFuture<()> {
        let e = PluginError::NotConfigured(plugin.to_string());
        Box::pin(async move { Err(e) })
    }
    fn controller_publish(
        &self,
        plugin: &str,
        _: csi::ControllerPublishVolumeRequest,
    ) -> PluginFuture<std::collections::HashMap<String, String>> {
        let e = PluginError::NotConfigured(plugin.to_string());
        Box::pin(async move { Err(e) })
    }
    fn controller_unpublish(&self, plugin: &str, _: csi::ControllerUnpublishVolumeRequest) -> PluginFuture<()> {
        let e = PluginError::NotConfigured(plugin.to_string());
        Box::pin(async move { Err(e) })
    }
}
