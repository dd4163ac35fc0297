//! `TestCsiPlugin`: a small CSI plugin for the suite, served on a unix socket from its own thread: the
//! identity service and a controller service that makes each volume a directory under its root (a host-path
//! driver), answering as a real plugin does (idempotent by name, the directory's path in the volume context,
//! the first requisite topology as the volume's; publishing to a node answers a context naming the node), and
//! recording every call with what it was given. Calls can
//! be made to fail, to test retries. Stopped, and its socket and directories removed, on drop.
//!
//! The plugin can play several nodes of a cluster ([`TestCsiPlugin::start_nodes`]): one socket per node, each
//! answering `NodeGetInfo` with its own node ID and topology, all over one root, as network storage would
//! be (a file written through one node's publication is there through another's). The node-side calls are
//! recorded with the ID of the node they reached.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use shoal_api::csi;
use tonic::{Request, Response, Status};

/// One call the plugin answered (or refused, when failing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CsiCall {
    /// `CreateVolume`.
    Create {
        /// The volume's name.
        name: String,
        /// The parameters (the volume's driver options).
        parameters: HashMap<String, String>,
        /// The secrets, by key, with their data.
        secrets: HashMap<String, String>,
        /// The required capacity.
        required_bytes: i64,
        /// The access modes asked for (`csi::volume_capability::access_mode::Mode` numbers).
        modes: Vec<i32>,
    },
    /// `DeleteVolume`.
    Delete {
        /// The plugin's ID of the volume.
        volume_id: String,
        /// The secrets, by key, with their data.
        secrets: HashMap<String, String>,
    },
    /// `ControllerPublishVolume`.
    ControllerPublish {
        /// The plugin's ID of the volume.
        volume_id: String,
        /// The plugin's ID of the node (what its `NodeGetInfo` answered there).
        node_id: String,
        /// Read-only.
        readonly: bool,
        /// The secrets, by key, with their data.
        secrets: HashMap<String, String>,
    },
    /// `ControllerUnpublishVolume`.
    ControllerUnpublish {
        /// The plugin's ID of the volume.
        volume_id: String,
        /// The plugin's ID of the node.
        node_id: String,
    },
    /// `NodeStageVolume`.
    NodeStage {
        /// The plugin's ID of the node whose socket was called.
        node: String,
        /// The plugin's ID of the volume.
        volume_id: String,
        /// What `ControllerPublishVolume` answered.
        publish_context: HashMap<String, String>,
    },
    /// `NodePublishVolume`.
    NodePublish {
        /// The plugin's ID of the node whose socket was called.
        node: String,
        /// The plugin's ID of the volume.
        volume_id: String,
        /// Where (the plugin bind-mounts the volume's directory there).
        target_path: String,
        /// Read-only.
        readonly: bool,
    },
    /// `NodeUnpublishVolume`.
    NodeUnpublish {
        /// The plugin's ID of the node whose socket was called.
        node: String,
        /// The plugin's ID of the volume.
        volume_id: String,
    },
    /// `NodeUnstageVolume`.
    NodeUnstage {
        /// The plugin's ID of the node whose socket was called.
        node: String,
        /// The plugin's ID of the volume.
        volume_id: String,
    },
}

/// The plugin's ID of the node it runs on, as `NodeGetInfo` answers it (for [`TestCsiPlugin::start`]).
pub const TEST_PLUGIN_NODE_ID: &str = "csi-node-1";

/// The topology key of [`PluginNode::zone`].
pub const ZONE_KEY: &str = "zone";

/// One node the plugin plays: what its `NodeGetInfo` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginNode {
    /// The plugin's ID of the node.
    pub node_id: String,
    /// Its topology segment `zone=<this>`, if any (a volume created with a requisite topology is accessible
    /// only there).
    pub zone: Option<String>,
}

#[derive(Debug, Default)]
struct Shared {
    root: PathBuf,
    calls: Mutex<Vec<CsiCall>>,
    failing: AtomicBool,
    /// The targets the node service bind-mounted and has not unmounted (unmounted on drop).
    mounted: Mutex<Vec<PathBuf>>,
    /// How long `ControllerPublishVolume` takes (after it is recorded, before it answers).
    publish_delay: Mutex<std::time::Duration>,
    /// The nodes each volume is published to now (by the controller), and the most it was at once.
    publications: Mutex<HashMap<String, (std::collections::BTreeSet<String>, usize)>>,
}

/// A running test plugin.
#[derive(Debug)]
pub struct TestCsiPlugin {
    sockets: Vec<PathBuf>,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::watch::Sender<bool>>,
    thread: Option<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl TestCsiPlugin {
    /// Serves the plugin on a new socket (with its volumes' directories beside it), as the one node
    /// [`TEST_PLUGIN_NODE_ID`] with no topology; returns once it listens.
    pub fn start() -> TestCsiPlugin {
        TestCsiPlugin::start_nodes(&[PluginNode { node_id: TEST_PLUGIN_NODE_ID.into(), zone: None }])
    }

    /// Serves the plugin as these nodes, one socket each ([`TestCsiPlugin::node_socket`]), over one root;
    /// returns once they listen.
    pub fn start_nodes(nodes: &[PluginNode]) -> TestCsiPlugin {
        assert!(!nodes.is_empty(), "the plugin plays at least one node");
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("volumes");
        std::fs::create_dir(&root).expect("the plugin's root");
        let shared = Arc::new(Shared { root, ..Default::default() });
        let sockets: Vec<PathBuf> = (0..nodes.len()).map(|i| dir.path().join(format!("csi-{i}.sock"))).collect();
        let listeners: Vec<_> = sockets
            .iter()
            .map(|socket| {
                let listener = std::os::unix::net::UnixListener::bind(socket).expect("bind the plugin's socket");
                listener.set_nonblocking(true).expect("non-blocking");
                listener
            })
            .collect();
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let served = shared.clone();
        let nodes = nodes.to_vec();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async move {
                let mut servers = tokio::task::JoinSet::new();
                for (listener, node) in listeners.into_iter().zip(nodes) {
                    let listener = tokio::net::UnixListener::from_std(listener).expect("tokio listener");
                    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
                    let mut stop = stop_rx.clone();
                    let server = tonic::transport::Server::builder()
                        .add_service(csi::identity_server::IdentityServer::new(Identity))
                        .add_service(csi::controller_server::ControllerServer::new(Controller(served.clone())))
                        .add_service(csi::node_server::NodeServer::new(Node(served.clone(), node)))
                        .serve_with_incoming_shutdown(incoming, async move {
                            let _ = stop.wait_for(|stopped| *stopped).await;
                        });
                    servers.spawn(server);
                }
                while let Some(served) = servers.join_next().await {
                    if let Ok(Err(e)) = served {
                        eprintln!("the test CSI plugin stopped: {e}");
                    }
                }
            });
        });
        TestCsiPlugin { sockets, shared, stop: Some(stop_tx), thread: Some(thread), _dir: dir }
    }

    /// The (first node's) socket, as `--csi-plugin NAME=unix://<this>` names it.
    pub fn socket(&self) -> &Path {
        &self.sockets[0]
    }

    /// The socket of the `i`th node given to [`TestCsiPlugin::start_nodes`].
    pub fn node_socket(&self, i: usize) -> &Path {
        &self.sockets[i]
    }

    /// Every call answered so far, in order.
    pub fn calls(&self) -> Vec<CsiCall> {
        self.shared.calls.lock().expect("calls").clone()
    }

    /// From now on, `ControllerPublishVolume` answers this long after it is called (a call in flight when
    /// the manager that made it dies completes all the same, as a real plugin's would).
    pub fn set_publish_delay(&self, delay: std::time::Duration) {
        *self.shared.publish_delay.lock().expect("delay") = delay;
    }

    /// The most nodes the controller had the volume with this plugin ID published to at once.
    pub fn most_nodes_published_at_once(&self, volume_id: &str) -> usize {
        self.shared.publications.lock().expect("publications").get(volume_id).map_or(0, |(_, most)| *most)
    }

    /// From now on, refuse (`true`) or answer (`false`) every controller call (a refused call is still
    /// recorded).
    pub fn set_failing(&self, failing: bool) {
        self.shared.failing.store(failing, Ordering::SeqCst);
    }

    /// The directory that holds the volume with this plugin ID.
    pub fn volume_dir(&self, volume_id: &str) -> PathBuf {
        self.shared.root.join(volume_id)
    }
}

impl Drop for TestCsiPlugin {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // A test that failed half-way leaves no mount behind.
        for target in std::mem::take(&mut *self.shared.mounted.lock().expect("mounts")) {
            let _ = std::process::Command::new("umount").arg(&target).output();
        }
    }
}

struct Identity;

#[tonic::async_trait]
impl csi::identity_server::Identity for Identity {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: "csi.shoal.test".into(),
            vendor_version: "1".into(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        use csi::plugin_capability::{service, Service, Type};
        let capability =
            |t: service::Type| csi::PluginCapability { r#type: Some(Type::Service(Service { r#type: t as i32 })) };
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities: vec![
                capability(service::Type::ControllerService),
                capability(service::Type::VolumeAccessibilityConstraints),
            ],
        }))
    }

    async fn probe(&self, _: Request<csi::ProbeRequest>) -> Result<Response<csi::ProbeResponse>, Status> {
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}

struct Controller(Arc<Shared>);

impl Controller {
    fn record(&self, call: CsiCall) -> Result<(), Status> {
        self.0.calls.lock().expect("calls").push(call);
        if self.0.failing.load(Ordering::SeqCst) {
            return Err(Status::unavailable("the test plugin was told to fail"));
        }
        Ok(())
    }
}

/// A volume's ID: its name, prefixed (so that a test tells the plugin's ID from the swarm's).
fn volume_id(name: &str) -> String {
    format!("csi-{name}")
}

#[tonic::async_trait]
impl csi::controller_server::Controller for Controller {
    async fn create_volume(
        &self,
        request: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        let r = request.into_inner();
        self.record(CsiCall::Create {
            name: r.name.clone(),
            parameters: r.parameters.clone(),
            secrets: r.secrets.clone(),
            required_bytes: r.capacity_range.as_ref().map(|c| c.required_bytes).unwrap_or(0),
            modes: r.volume_capabilities.iter().filter_map(|c| c.access_mode.as_ref()).map(|m| m.mode).collect(),
        })?;
        if r.name.is_empty() || r.name.contains('/') || r.name.starts_with('.') {
            return Err(Status::invalid_argument(format!("bad volume name {:?}", r.name)));
        }
        let id = volume_id(&r.name);
        let dir = self.0.root.join(&id);
        std::fs::create_dir_all(&dir).map_err(|e| Status::internal(format!("{}: {e}", dir.display())))?;
        Ok(Response::new(csi::CreateVolumeResponse {
            volume: Some(csi::Volume {
                capacity_bytes: r.capacity_range.map(|c| c.required_bytes).unwrap_or(0),
                volume_id: id,
                volume_context: [("path".to_string(), dir.display().to_string())].into(),
                accessible_topology: r
                    .accessibility_requirements
                    .and_then(|t| t.requisite.into_iter().next())
                    .into_iter()
                    .collect(),
            }),
        }))
    }

    async fn delete_volume(
        &self,
        request: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        let r = request.into_inner();
        self.record(CsiCall::Delete { volume_id: r.volume_id.clone(), secrets: r.secrets.clone() })?;
        if r.volume_id.is_empty() || r.volume_id.contains('/') || r.volume_id.starts_with('.') {
            return Err(Status::invalid_argument(format!("bad volume ID {:?}", r.volume_id)));
        }
        let dir = self.0.root.join(&r.volume_id);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            // Deleting a volume that is gone succeeds (the CSI spec: idempotent).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Status::internal(format!("{}: {e}", dir.display()))),
        }
        Ok(Response::new(csi::DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(
        &self,
        request: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        let r = request.into_inner();
        self.record(CsiCall::ControllerPublish {
            volume_id: r.volume_id.clone(),
            node_id: r.node_id.clone(),
            readonly: r.readonly,
            secrets: r.secrets.clone(),
        })?;
        if r.node_id.is_empty() {
            return Err(Status::invalid_argument("ControllerPublishVolume without a node ID"));
        }
        if !self.0.root.join(&r.volume_id).is_dir() {
            return Err(Status::not_found(format!("no volume {:?}", r.volume_id)));
        }
        let delay = *self.0.publish_delay.lock().expect("delay");
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let mut publications = self.0.publications.lock().expect("publications");
        let (nodes, most) = publications.entry(r.volume_id.clone()).or_default();
        nodes.insert(r.node_id.clone());
        *most = (*most).max(nodes.len());
        drop(publications);
        // What the node needs to find it: its node-side calls get this back.
        Ok(Response::new(csi::ControllerPublishVolumeResponse {
            publish_context: [("published-to".to_string(), r.node_id)].into(),
        }))
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        let r = request.into_inner();
        self.record(CsiCall::ControllerUnpublish { volume_id: r.volume_id.clone(), node_id: r.node_id.clone() })?;
        if let Some((nodes, _)) = self.0.publications.lock().expect("publications").get_mut(&r.volume_id) {
            nodes.remove(&r.node_id);
        }
        Ok(Response::new(csi::ControllerUnpublishVolumeResponse {}))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        use csi::controller_service_capability::{rpc, Rpc, Type};
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse {
            capabilities: [rpc::Type::CreateDeleteVolume, rpc::Type::PublishUnpublishVolume]
                .into_iter()
                .map(|t| csi::ControllerServiceCapability { r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })) })
                .collect(),
        }))
    }
}

/// The node service: stage records; publish bind-mounts the volume's directory on the target (made here, as
/// the CSI specification has the plugin do); unpublish unmounts it and removes the target.
struct Node(Arc<Shared>, PluginNode);

impl Node {
    fn record(&self, call: CsiCall) -> Result<(), Status> {
        Controller(self.0.clone()).record(call)
    }

    fn id(&self) -> String {
        self.1.node_id.clone()
    }
}

fn run(cmd: &mut std::process::Command) -> Result<(), Status> {
    let out = cmd.output().map_err(|e| Status::internal(format!("{cmd:?}: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Status::internal(format!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr).trim())))
    }
}

#[tonic::async_trait]
impl csi::node_server::Node for Node {
    async fn node_stage_volume(
        &self,
        request: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        let r = request.into_inner();
        self.record(CsiCall::NodeStage {
            node: self.id(),
            volume_id: r.volume_id.clone(),
            publish_context: r.publish_context,
        })?;
        if r.staging_target_path.is_empty() {
            return Err(Status::invalid_argument("NodeStageVolume without a staging path"));
        }
        Ok(Response::new(csi::NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        self.record(CsiCall::NodeUnstage { node: self.id(), volume_id: request.into_inner().volume_id })?;
        Ok(Response::new(csi::NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let r = request.into_inner();
        self.record(CsiCall::NodePublish {
            node: self.id(),
            volume_id: r.volume_id.clone(),
            target_path: r.target_path.clone(),
            readonly: r.readonly,
        })?;
        if r.volume_id.is_empty() || r.volume_id.contains('/') || r.volume_id.starts_with('.') {
            return Err(Status::invalid_argument(format!("bad volume ID {:?}", r.volume_id)));
        }
        let source = self.0.root.join(&r.volume_id);
        let target = PathBuf::from(&r.target_path);
        if self.0.mounted.lock().expect("mounts").contains(&target) {
            return Ok(Response::new(csi::NodePublishVolumeResponse {}));
        }
        std::fs::create_dir_all(&target).map_err(|e| Status::internal(format!("{}: {e}", target.display())))?;
        run(std::process::Command::new("mount").arg("--bind").arg(&source).arg(&target))?;
        self.0.mounted.lock().expect("mounts").push(target);
        Ok(Response::new(csi::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let r = request.into_inner();
        self.record(CsiCall::NodeUnpublish { node: self.id(), volume_id: r.volume_id.clone() })?;
        let target = PathBuf::from(&r.target_path);
        let was_mounted = {
            let mut mounted = self.0.mounted.lock().expect("mounts");
            let before = mounted.len();
            mounted.retain(|t| *t != target);
            mounted.len() != before
        };
        if was_mounted {
            run(std::process::Command::new("umount").arg(&target))?;
        }
        // Unpublishing what is not published succeeds (idempotent).
        match std::fs::remove_dir(&target) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Status::internal(format!("{}: {e}", target.display()))),
        }
        Ok(Response::new(csi::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        use csi::node_service_capability::{rpc, Rpc, Type};
        Ok(Response::new(csi::NodeGetCapabilitiesResponse {
            capabilities: vec![csi::NodeServiceCapability {
                r#type: Some(Type::Rpc(Rpc { r#type: rpc::Type::StageUnstageVolume as i32 })),
            }],
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: self.id(),
            max_volumes_per_node: 0,
            accessible_topology: self
                .1
                .zone
                .as_ref()
                .map(|zone| csi::Topology { segments: [(ZONE_KEY.to_string(), zone.clone())].into() }),
        }))
    }
}
