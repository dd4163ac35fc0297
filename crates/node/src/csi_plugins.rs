//! The CSI plugins a manager's volume manager calls (`shoal daemon --csi-plugin NAME=unix:///path`): plain
//! gRPC over each plugin's unix socket (as the CSI specification and SwarmKit have it), connected on first use
//! and again after a call fails. On connecting, the plugin is probed (`Probe`; one that says it is not ready
//! is not used) and asked whether it has a controller service (`GetPluginCapabilities`); for one without,
//! creating a volume answers the volume's name as its ID and deleting does nothing, as SwarmKit does.
//!
//! Must not know the cluster's state: it carries the requests the manager's `volumes` module builds.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use shoal_api::csi;
use shoal_manager::volumes::{ControllerPlugins, PluginError, PluginFuture};
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
                Err(s) => {
                    plugin.forget().await;
                    Err(plugin.failed("CreateVolume", &s))
                }
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
                Err(s) => {
                    plugin.forget().await;
                    Err(plugin.failed("DeleteVolume", &s))
                }
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
                Err(s) => {
                    plugin.forget().await;
                    Err(plugin.failed("ControllerPublishVolume", &s))
                }
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
                Err(s) => {
                    plugin.forget().await;
                    Err(plugin.failed("ControllerUnpublishVolume", &s))
                }
            }
        })
    }
}
