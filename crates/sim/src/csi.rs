//! A simulated CSI plugin: the storage behind the workload's cluster volumes, shared by every manager (one
//! storage system, whichever manager leads). Its controller answers at once; it keeps which nodes each
//! volume is published to, as the storage itself would, so that the checks can hold the safety property of
//! publishing: a single-node volume is never published to two nodes at once, whatever leader changes,
//! crashes and partitions happen between the manager's intent and its calls.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use shoal_api::csi;
use shoal_manager::{ControllerPlugins, PluginError, PluginFuture};

/// The plugin's name (a volume's driver).
pub const PLUGIN: &str = "sim.csi";

#[derive(Debug, Default)]
struct Storage {
    /// Volume ID -> the nodes (the plugin's IDs) it is published to.
    published: BTreeMap<String, BTreeSet<String>>,
    /// The first time a single-node volume was published to a second node.
    violation: Option<String>,
    /// `ControllerPublishVolume` and `ControllerUnpublishVolume` calls answered.
    publishes: u64,
    unpublishes: u64,
}

/// The plugin (cheap to clone: one storage).
#[derive(Debug, Clone, Default)]
pub struct SimCsi(Arc<Mutex<Storage>>);

impl SimCsi {
    /// The first violation of the publishing property, if any.
    pub fn violation(&self) -> Option<String> {
        self.0.lock().violation.clone()
    }

    /// Publish and unpublish calls answered so far.
    pub fn publications(&self) -> (u64, u64) {
        let s = self.0.lock();
        (s.publishes, s.unpublishes)
    }

    /// The plugin's ID of a swarm node.
    pub fn node_id(swarm_node: &str) -> String {
        format!("csi-{swarm_node}")
    }
}

fn ready<T: Send + 'static>(value: Result<T, PluginError>) -> PluginFuture<T> {
    Box::pin(std::future::ready(value))
}

fn single_node(c: Option<&csi::VolumeCapability>) -> bool {
    use csi::volume_capability::access_mode::Mode;
    let mode = c.and_then(|c| c.access_mode.as_ref()).map_or(0, |m| m.mode);
    mode == Mode::SingleNodeWriter as i32 || mode == Mode::SingleNodeReaderOnly as i32
}

impl ControllerPlugins for SimCsi {
    fn create_volume(&self, plugin: &str, r: csi::CreateVolumeRequest) -> PluginFuture<csi::Volume> {
        if plugin != PLUGIN {
            return ready(Err(PluginError::NotConfigured(plugin.to_string())));
        }
        ready(Ok(csi::Volume { volume_id: format!("sim-{}", r.name), ..Default::default() }))
    }

    fn delete_volume(&self, _: &str, r: csi::DeleteVolumeRequest) -> PluginFuture<()> {
        self.0.lock().published.remove(&r.volume_id);
        ready(Ok(()))
    }

    fn controller_publish(
        &self,
        _: &str,
        r: csi::ControllerPublishVolumeRequest,
    ) -> PluginFuture<HashMap<String, String>> {
        let mut s = self.0.lock();
        s.publishes += 1;
        let nodes = s.published.entry(r.volume_id.clone()).or_default();
        nodes.insert(r.node_id.clone());
        if single_node(r.volume_capability.as_ref()) && nodes.len() > 1 && s.violation.is_none() {
            let nodes = s.published[&r.volume_id].clone();
            s.violation = Some(format!("the single-node volume {} is published to {nodes:?} at once", r.volume_id));
        }
        ready(Ok([("node".to_string(), r.node_id)].into()))
    }

    fn controller_unpublish(&self, _: &str, r: csi::ControllerUnpublishVolumeRequest) -> PluginFuture<()> {
        let mut s = self.0.lock();
        s.unpublishes += 1;
        if let Some(nodes) = s.published.get_mut(&r.volume_id) {
            nodes.remove(&r.node_id);
        }
        ready(Ok(()))
    }
}
