//! The CSI plugins a manager's volume manager calls (`shoal daemon --csi-plugin NAME=unix:///path`): plain
//! gRPC over each plugin's unix socket (as the CSI specification and SwarmKit have it), connected on first use
//! and again after a call fails. On connecting, the plugin is probed (`Probe`; one that says it is not ready
//! is not used) and asked whether it has a controller service (`GetPluginCapabilities`); for one without,
//! creating a volume answers the volume's name as its ID and deleting does nothing, as SwarmKit does.
//!
//! The same clients serve a worker's side (`NodeVolumes`, for the agent's `volumes`): `NodeGetInfo` for the
//! node's description, and `NodeStageVolume` (when the plugin's node service has `STAGE_UNSTAGE_VOLUME`)
//! then `NodePublishVolume` for a volume published to the node, the reverse to unpublish it.
//!
//! Must not know the cluster's state: it carries the requests the manager's `volumes` module and the
//! agent's build.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use shoal_api::csi;
use shoal_manager::{ControllerPlugins, PluginError, PluginFuture};
use tonic::transport::{Channel, Endpoint};

/// The plugins, by name.
#[derive(Debug)]
pub(crate) struct CsiPlugins {
    plugins: HashMap<String, Arc<Plugin>>,
}

#[derive(Debug)]
struct Plugin {
    name: String,
    socket: PathBuf,
    connected: tokio::sync::Mutex<Option<Connected>>,
}

#[derive(Debug, Clone)]
struct Connected {
    channel: Channel,
    controller: bool,
    /// The controller publishes volumes to nodes (`PUBLISH_UNPUBLISH_VOLUME`).
    publishes: bool,
}

/// The node's cluster volumes, published under `<state dir>/csi` through the plugins the daemon's
/// `--csi-plugin` flags name; `None` without such flags.
pub(crate) fn node_volumes(cfg: &crate::DaemonConfig) -> Option<shoal_agent::Volumes> {
    if cfg.csi_plugins.is_empty() {
        return None;
    }
    let plugins = Arc::new(CsiPlugins::new(&cfg.csi_plugins));
    Some(shoal_agent::Volumes::new(cfg.state_dir.join("csi"), plugins))
}

impl CsiPlugins {
    /// The plugins named by the daemon's flags.
    pub(crate) fn new(plugins: &[(String, PathBuf)]) -> CsiPlugins {
        let plugins = plugins
            .iter()
            .map(|(name, socket)| {
                let plugin =
                    Plugin { name: name.clone(), socket: socket.clone(), connected: tokio::sync::Mutex::new(None) };
                (name.clone(), Arc::new(plugin))
            })
            .collect();
        CsiPlugins { plugins }
    }

    fn plugin(&self, name: &str) -> Result<Arc<Plugin>, PluginError> {
        self.plugins.get(name).cloned().ok_or_else(|| PluginError::NotConfigured(name.to_string()))
    }
}

impl Plugin {
    fn failed(&self, what: &str, status: &tonic::Status) -> PluginError {
        PluginError::Failed(format!(
            "the CSI plugin {:?} ({}) answered {what} with {:?}: {}",
            self.name,
            self.socket.display(),
            status.code(),
            status.message()
        ))
    }

    /// The connection, made (and the plugin probed) if there is none.
    async fn connection(&self) -> Result<Connected, PluginError> {
        let mut held = self.connected.lock().await;
        if let Some(c) = held.as_ref() {
            return Ok(c.clone());
        }
        let channel = connect(&self.socket).await.map_err(|e| {
            PluginError::Failed(format!(
                "cannot reach the CSI plugin {:?} at {}: {e}; check that it runs and listens there",
                self.name,
                self.socket.display()
            ))
        })?;
        let mut identity = csi::identity_client::IdentityClient::new(channel.clone());
        let probe = identity.probe(csi::ProbeRequest {}).await.map_err(|s| self.failed("Probe", &s))?;
        if probe.into_inner().ready == Some(false) {
            return Err(PluginError::Failed(format!("the CSI plugin {:?} says it is not ready yet", self.name)));
        }
        let caps = identity
            .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
            .await
            .map_err(|s| self.failed("GetPluginCapabilities", &s))?
            .into_inner();
        let controller = caps.capabilities.iter().any(|c| {
            matches!(&c.r#type, Some(csi::plugin_capability::Type::Service(s))
                if s.r#type == csi::plugin_capability::service::Type::ControllerService as i32)
        });
        let publishes = if controller {
            let caps = csi::controller_client::ControllerClient::new(channel.clone())
                .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
                .await
                .map_err(|s| self.failed("ControllerGetCapabilities", &s))?
                .into_inner();
            caps.capabilities.iter().any(|c| {
                matches!(&c.r#type, Some(csi::controller_service_capability::Type::Rpc(r))
                    if r.r#type == csi::controller_service_capability::rpc::Type::PublishUnpublishVolume as i32)
            })
        } else {
            false
        };
        tracing::info!(plugin = %self.name, socket = %self.socket.display(), controller, publishes,
            "connected to a CSI plugin");
        let c = Connected { channel, controller, publishes };
        *held = Some(c.clone());
        Ok(c)
    }

    /// Forgets the connection after a call failed on it, so that the next call connects (and probes) again.
    async fn forget(&self) {
        *self.connected.lock().await = None;
    }
}

/// A plain HTTP/2 channel over the unix socket at `path`.
async fn connect(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    // The URI only names the authority the requests carry; the connector ignores it.
    Endpoint::from_static("http://csi-plugin")
        .connect_timeout(std::time::Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let unix = tokio::net::UnixStream::connect(&path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(unix))
            }
        }))
        .await
}

impl ControllerPlugins for CsiPlugins {
    fn create_volume(&self, plugin: &str, request: csi::CreateVolumeRequest) -> PluginFuture<csi::Volume> {
        let plugin = self.plugin(plugin);
        Box::pin(async move {
            let plugin = plugin?;
            let c = plugin.connection().await?;
            if !c.controller {
                return Ok(csi::Volume { volume_id: request.name, ..Default::default() });
            }
            let answer = csi::controller_client::ControllerClient::new(c.channel).create_volume(request).await;
            match answer {
                Ok(r) => r.into_inner().volume.ok_or_else(|| {
                    PluginError::Failed(format!("the CSI plugin {:?} created a volume but described none", plugin.name))
                }),
                Err(s) => Err(plugin.call_failed("CreateVolume", &s).await),
            }
        })
    }

    fn delete_volume(&self, plugin: &str, request: csi::DeleteVolumeRequest) -> PluginFuture<()> {
        let plugin = self.plugin(plugin);
        Box::pin(async move {
            let plugin = plugin?;
            let c = plugin.connection().await?;
            if !c.controller {
                return Ok(());
            }
            match csi::controller_client::ControllerClient::new(c.channel).delete_volume(request).await {
                Ok(_) => Ok(()),
                Err(s) => Err(plugin.call_failed("DeleteVolume", &s).await),
            }
        })
    }

    fn controller_publish(
        &self,
        plugin: &str,
        request: csi::ControllerPublishVolumeRequest,
    ) -> PluginFuture<HashMap<String, String>> {
        let plugin = self.plugin(plugin);
        Box::pin(async move {
            let plugin = plugin?;
            let c = plugin.connection().await?;
            if !c.publishes {
                return Ok(HashMap::new());
            }
            match csi::controller_client::ControllerClient::new(c.channel).controller_publish_volume(request).await {
                Ok(r) => Ok(r.into_inner().publish_context),
                Err(s) => Err(plugin.call_failed("ControllerPublishVolume", &s).await),
            }
        })
    }

    fn controller_unpublish(&self, plugin: &str, request: csi::ControllerUnpublishVolumeRequest) -> PluginFuture<()> {
        let plugin = self.plugin(plugin);
        Box::pin(async move {
            let plugin = plugin?;
            let c = plugin.connection().await?;
            if !c.publishes {
                return Ok(());
            }
            match csi::controller_client::ControllerClient::new(c.channel).controller_unpublish_volume(request).await {
                Ok(_) => Ok(()),
                Err(s) => Err(plugin.call_failed("ControllerUnpublishVolume", &s).await),
            }
        })
    }
}

/// The most bytes a plugin's `NodeGetInfo` answer may take in the node description (its node ID and
/// topology, encoded); a larger one is left out, with a warning.
pub(crate) const MAX_NODE_INFO_BYTES: usize = 4096;

impl Plugin {
    /// Whether the plugin's node service stages volumes (`STAGE_UNSTAGE_VOLUME`).
    async fn stages(&self, channel: Channel) -> Result<bool, PluginError> {
        use csi::node_service_capability::{rpc, Type};
        let caps = csi::node_client::NodeClient::new(channel)
            .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
            .await
            .map_err(|s| self.failed("NodeGetCapabilities", &s))?
            .into_inner();
        Ok(caps
            .capabilities
            .iter()
            .any(|c| matches!(&c.r#type, Some(Type::Rpc(r)) if r.r#type == rpc::Type::StageUnstageVolume as i32)))
    }

    /// The connection for a node call, and whether the plugin's node service stages volumes.
    async fn node_connection(&self) -> Result<(Connected, bool), String> {
        let c = self.connection().await.map_err(|e| e.to_string())?;
        let stages = self.stages(c.channel.clone()).await.map_err(|e| e.to_string())?;
        Ok((c, stages))
    }

    /// A failed call: the connection is made again next time.
    async fn call_failed(&self, what: &str, status: &tonic::Status) -> PluginError {
        self.forget().await;
        self.failed(what, status)
    }
}

fn create_dir(path: &Path) -> Result<(), String> {
    std::fs::create_dir_all(path).map_err(|e| format!("cannot create {}: {e}", path.display()))
}

impl shoal_agent::NodeVolumes for CsiPlugins {
    fn publish(
        &self,
        a: &shoal_api::VolumeAssignment,
        secrets: HashMap<String, String>,
        staging: &Path,
        target: &Path,
    ) -> shoal_agent::BoxFuture<'static, Result<(), String>> {
        let plugin = self.plugin(a.driver.as_ref().map(|d| d.name.as_str()).unwrap_or_default());
        let (a, staging, target) = (a.clone(), staging.to_path_buf(), target.to_path_buf());
        Box::pin(async move {
            let plugin = plugin.map_err(|e| e.to_string())?;
            let (c, stages) = plugin.node_connection().await?;
            let capability = a.access_mode.as_ref().map(shoal_manager::volume_capability);
            let readonly = a
                .access_mode
                .as_ref()
                .is_some_and(|m| m.sharing == shoal_api::volume_access_mode::Sharing::ReadOnly as i32);
            let mut node = csi::node_client::NodeClient::new(c.channel);
            let staging_path = if stages {
                create_dir(&staging)?;
                let request = csi::NodeStageVolumeRequest {
                    volume_id: a.volume_id.clone(),
                    publish_context: a.publish_context.clone().into_iter().collect(),
                    staging_target_path: staging.display().to_string(),
                    volume_capability: capability.clone(),
                    secrets: secrets.clone(),
                    volume_context: a.volume_context.clone().into_iter().collect(),
                };
                if let Err(s) = node.node_stage_volume(request).await {
                    return Err(plugin.call_failed("NodeStageVolume", &s).await.to_string());
                }
                staging.display().to_string()
            } else {
                String::new()
            };
            // The CO makes the target's parent; the plugin makes the target (the CSI specification).
            create_dir(target.parent().unwrap_or(Path::new("/")))?;
            let request = csi::NodePublishVolumeRequest {
                volume_id: a.volume_id.clone(),
                publish_context: a.publish_context.clone().into_iter().collect(),
                staging_target_path: staging_path,
                target_path: target.display().to_string(),
                volume_capability: capability,
                readonly,
                secrets,
                volume_context: a.volume_context.clone().into_iter().collect(),
            };
            match node.node_publish_volume(request).await {
                Ok(_) => Ok(()),
                Err(s) => Err(plugin.call_failed("NodePublishVolume", &s).await.to_string()),
            }
        })
    }

    fn unpublish(
        &self,
        a: &shoal_api::VolumeAssignment,
        staging: &Path,
        target: &Path,
    ) -> shoal_agent::BoxFuture<'static, Result<(), String>> {
        let plugin = self.plugin(a.driver.as_ref().map(|d| d.name.as_str()).unwrap_or_default());
        let (a, staging, target) = (a.clone(), staging.to_path_buf(), target.to_path_buf());
        Box::pin(async move {
            let plugin = plugin.map_err(|e| e.to_string())?;
            let (c, stages) = plugin.node_connection().await?;
            let mut node = csi::node_client::NodeClient::new(c.channel);
            let request = csi::NodeUnpublishVolumeRequest {
                volume_id: a.volume_id.clone(),
                target_path: target.display().to_string(),
            };
            if let Err(s) = node.node_unpublish_volume(request).await {
                return Err(plugin.call_failed("NodeUnpublishVolume", &s).await.to_string());
            }
            if stages {
                let request = csi::NodeUnstageVolumeRequest {
                    volume_id: a.volume_id.clone(),
                    staging_target_path: staging.display().to_string(),
                };
                if let Err(s) = node.node_unstage_volume(request).await {
                    return Err(plugin.call_failed("NodeUnstageVolume", &s).await.to_string());
                }
            }
            // What Shoal made for it: the staging directory and the target's parent (both empty now).
            if let Some(dir) = target.parent() {
                let _ = std::fs::remove_dir(&staging);
                let _ = std::fs::remove_dir(dir);
            }
            Ok(())
        })
    }

    fn plugin_count(&self) -> usize {
        self.plugins.len()
    }

    fn node_info(&self) -> shoal_agent::BoxFuture<'static, Vec<shoal_api::NodeCsiInfo>> {
        let plugins: Vec<Arc<Plugin>> = self.plugins.values().cloned().collect();
        Box::pin(async move {
            let mut out = Vec::new();
            for plugin in plugins {
                let answer = match plugin.connection().await {
                    Ok(c) => csi::node_client::NodeClient::new(c.channel)
                        .node_get_info(csi::NodeGetInfoRequest {})
                        .await
                        .map_err(|s| plugin.failed("NodeGetInfo", &s).to_string()),
                    Err(e) => Err(e.to_string()),
                };
                let info = match answer {
                    Ok(r) => r.into_inner(),
                    Err(e) => {
                        tracing::warn!(plugin = %plugin.name, "the node cannot report this CSI plugin: {e}");
                        continue;
                    }
                };
                let info = shoal_api::NodeCsiInfo {
                    plugin_name: plugin.name.clone(),
                    node_id: info.node_id,
                    max_volumes_per_node: info.max_volumes_per_node,
                    accessible_topology: info
                        .accessible_topology
                        .map(|t| shoal_api::Topology { segments: t.segments.into_iter().collect() }),
                };
                let size = shoal_api::prost::Message::encoded_len(&info);
                if size > MAX_NODE_INFO_BYTES || info.node_id.is_empty() {
                    tracing::warn!(plugin = %plugin.name, size, "the CSI plugin's NodeGetInfo answer is empty or over \
                        {MAX_NODE_INFO_BYTES} bytes: the node does not report it");
                    continue;
                }
                out.push(info);
            }
            out.sort_by(|a, b| a.plugin_name.cmp(&b.plugin_name));
            out
        })
    }
}
