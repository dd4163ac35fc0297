//! The volume manager against a real store, a stepped timer and a fake plugin: a new volume is created by its
//! plugin with SwarmKit's request and its answer kept; a failed call is retried after the backoff, not before;
//! a removal waits for the plugin's delete; a forced one and one of a volume no plugin made do not ask it; a
//! volume whose secret is gone waits without a call; one removed during its create is deleted again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shoal_api::csi::volume_capability::access_mode::Mode;
use shoal_api::{
    volume_access_mode, Annotations, CapacityRange, Driver, SecretSpec, Topology, TopologyRequirement, Volume,
    VolumeAccessMode, VolumeSecret, VolumeSpec,
};
use tokio::sync::watch;

use super::*;
use crate::controlapi::{self, ControlError};
use crate::state::ClusterState;
use crate::ManualTimer;

#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Create(String, HashMap<String, String>, HashMap<String, String>, Vec<i32>, i64, usize),
    Delete(String, HashMap<String, String>),
    Publish(String, String, bool, HashMap<String, String>),
    Unpublish(String, String),
}

/// A plugin that records its calls; it fails while `failing`, and holds a create while `hold` is set until
/// the test releases it.
#[derive(Debug, Default)]
struct Fake {
    seen: Mutex<Vec<Seen>>,
    failing: AtomicBool,
    huge: AtomicBool,
    hold: Mutex<Option<tokio::sync::oneshot::Receiver<()>>>,
}

impl ControllerPlugins for Arc<Fake> {
    fn create_volume(
        &self,
        plugin: &str,
        r: shoal_api::csi::CreateVolumeRequest,
    ) -> PluginFuture<shoal_api::csi::Volume> {
        assert_eq!(plugin, "csi.test");
        let modes = r.volume_capabilities.iter().filter_map(|c| c.access_mode.as_ref()).map(|m| m.mode).collect();
        let required = r.capacity_range.as_ref().map(|c| c.required_bytes).unwrap_or(0);
        let requisite = r.accessibility_requirements.as_ref().map(|t| t.requisite.len()).unwrap_or(0);
        self.seen.lock().unwrap().push(Seen::Create(
            r.name.clone(),
            r.parameters,
            r.secrets,
            modes,
            required,
            requisite,
        ));
        let failing = self.failing.load(Ordering::SeqCst);
        let context = if self.huge.load(Ordering::SeqCst) { "x".repeat(MAX_VOLUME_INFO_BYTES) } else { "v".into() };
        let hold = self.hold.lock().unwrap().take();
        let name = r.name;
        Box::pin(async move {
            if let Some(h) = hold {
                let _ = h.await;
            }
            if failing {
                return Err(PluginError::Failed("the fake plugin fails".into()));
            }
            Ok(shoal_api::csi::Volume {
                capacity_bytes: required,
                volume_id: format!("fake-{name}"),
                volume_context: [("k".to_string(), context)].into(),
                accessible_topology: vec![shoal_api::csi::Topology { segments: [("zone".into(), "z1".into())].into() }],
            })
        })
    }

    fn controller_publish(
        &self,
        _: &str,
        r: shoal_api::csi::ControllerPublishVolumeRequest,
    ) -> PluginFuture<HashMap<String, String>> {
        self.seen.lock().unwrap().push(Seen::Publish(r.volume_id, r.node_id.clone(), r.readonly, r.secrets));
        self.answer([("device".to_string(), format!("/dev/for-{}", r.node_id))].into())
    }

    fn controller_unpublish(&self, _: &str, r: shoal_api::csi::ControllerUnpublishVolumeRequest) -> PluginFuture<()> {
        self.seen.lock().unwrap().push(Seen::Unpublish(r.volume_id, r.node_id));
        self.answer(())
    }

    fn delete_volume(&self, _: &str, r: shoal_api::csi::DeleteVolumeRequest) -> PluginFuture<()> {
        self.seen.lock().unwrap().push(Seen::Delete(r.volume_id, r.secrets));
        let failing = self.failing.load(Ordering::SeqCst);
        Box::pin(async move {
            if failing {
                Err(PluginError::Failed("the fake plugin fails".into()))
            } else {
                Ok(())
            }
        })
    }
}

impl Fake {
    fn answer<T: Send + 'static>(&self, value: T) -> PluginFuture<T> {
        let failing = self.failing.load(Ordering::SeqCst);
        Box::pin(async move {
            if failing {
                Err(PluginError::Failed("the fake plugin fails".into()))
            } else {
                Ok(value)
            }
        })
    }
}

struct Fx {
    state: ClusterState,
    timer: Arc<ManualTimer>,
    fake: Arc<Fake>,
    _stop: watch::Sender<bool>,
}

impl Fx {
    fn seen(&self) -> Vec<Seen> {
        self.fake.seen.lock().unwrap().clone()
    }
    fn volume(&self, name: &str) -> Option<Arc<Volume>> {
        self.state.store.view(|t| t.volumes().by_name(name).cloned())
    }
    async fn until(&self, what: &str, f: impl Fn(&Fx) -> bool) {
        crate::wait::wait_until_async(what, Duration::from_secs(10), Duration::from_millis(2), || {
            if f(self) {
                Ok(())
            } else {
                Err(format!("calls {:?}", self.seen()))
            }
        })
        .await
    }
    /// Waits until the loop sleeps on the timer (its retry), so that a step of time is seen by it.
    async fn asleep(&self) {
        let sleeping = crate::wait::holds(|| self.timer.pending_sleeps() > 0);
        crate::wait::wait_until_async(
            "the volume manager to wait",
            Duration::from_secs(10),
            Duration::from_millis(1),
            sleeping,
        )
        .await
    }
}

fn start() -> Fx {
    let (state, _) = controlapi::tests::cluster();
    let timer = Arc::new(ManualTimer::default());
    let state = state.with_timer(timer.clone());
    let fake = Arc::new(Fake::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let vm = VolumeManager::new(Arc::new(fake.clone()));
    tokio::spawn(crate::Subsystem::run(&vm, state.clone(), stop_rx));
    Fx { state, timer, fake, _stop: stop_tx }
}

fn spec(name: &str) -> VolumeSpec {
    VolumeSpec {
        annotations: Some(Annotations { name: name.into(), ..Default::default() }),
        driver: Some(Driver { name: "csi.test".into(), options: [("size".into(), "1G".into())].into() }),
        access_mode: Some(VolumeAccessMode {
            scope: volume_access_mode::Scope::MultiNode as i32,
            sharing: volume_access_mode::Sharing::OneWriter as i32,
            access_type: Some(volume_access_mode::AccessType::Mount(Default::default())),
        }),
        secrets: vec![VolumeSecret { key: "password".into(), secret: "db-pass".into() }],
        accessibility_requirements: Some(TopologyRequirement {
            requisite: vec![Topology { segments: [("zone".into(), "z1".into())].into() }],
            preferred: vec![],
        }),
        capacity_range: Some(CapacityRange { required_bytes: 1 << 30, limit_bytes: 0 }),
        ..Default::default()
    }
}

async fn secret(state: &ClusterState) {
    let s = SecretSpec {
        annotations: Some(Annotations { name: "db-pass".into(), ..Default::default() }),
        data: b"s3cret".to_vec(),
        ..Default::default()
    };
    controlapi::create_secret(state, s).await.unwrap();
}

fn created_with(name: &str) -> Seen {
    Seen::Create(
        name.into(),
        [("size".into(), "1G".into())].into(),
        [("password".into(), "s3cret".into())].into(),
        vec![Mode::MultiNodeSingleWriter as i32],
        1 << 30,
        1,
    )
}

#[tokio::test]
async fn a_new_volume_is_created_by_its_plugin_and_its_answer_kept() {
    let fx = start();
    secret(&fx.state).await;
    controlapi::create_volume(&fx.state, spec("data")).await.unwrap();
    fx.until("the volume's info", |fx| fx.volume("data").is_some_and(|v| v.created_by_plugin())).await;
    assert_eq!(fx.seen(), vec![created_with("data")], "one CreateVolume with SwarmKit's request");
    let info = fx.volume("data").unwrap().volume_info.clone().unwrap();
    assert_eq!(info.volume_id, "fake-data");
    assert_eq!(info.capacity_bytes, 1 << 30);
    assert_eq!(info.volume_context.get("k").map(String::as_str), Some("v"));
    assert_eq!(info.accessible_topology.len(), 1);
    // Nothing more is asked of the plugin for a created volume, even when it changes (its labels).
    let v = fx.volume("data").unwrap();
    let mut s = v.spec.clone().unwrap();
    s.annotations.as_mut().unwrap().labels.insert("a".into(), "b".into());
    let version = v.meta.as_ref().and_then(|m| m.version.as_ref()).map(|x| x.index).unwrap();
    controlapi::update_volume(&fx.state, &v.id, version, s).await.unwrap();
    fx.asleep_or_idle().await;
    assert_eq!(fx.seen().len(), 1);
}

impl Fx {
    /// Gives the loop time to react to the last write (it has no timer to sleep on when nothing fails).
    async fn asleep_or_idle(&self) {
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
    }
}

#[tokio::test]
async fn a_failed_create_is_retried_after_the_backoff_and_not_before() {
    let fx = start();
    secret(&fx.state).await;
    fx.fake.failing.store(true, Ordering::SeqCst);
    controlapi::create_volume(&fx.state, spec("data")).await.unwrap();
    fx.until("a first create", |fx| fx.seen().len() == 1).await;
    fx.asleep().await;
    fx.timer.advance_ms(RETRY_MIN_MS - 1);
    fx.asleep_or_idle().await;
    assert_eq!(fx.seen().len(), 1, "no retry before {RETRY_MIN_MS} ms");
    fx.timer.advance_ms(1);
    fx.until("a second create", |fx| fx.seen().len() == 2).await;
    // The next wait doubles.
    fx.asleep().await;
    fx.fake.failing.store(false, Ordering::SeqCst);
    fx.timer.advance_ms(2 * RETRY_MIN_MS - 1);
    fx.asleep_or_idle().await;
    assert_eq!(fx.seen().len(), 2, "the second retry waits twice as long");
    fx.timer.advance_ms(1);
    fx.until("the volume's info", |fx| fx.volume("data").is_some_and(|v| v.created_by_plugin())).await;
    assert_eq!(fx.seen(), vec![created_with("data"); 3]);
}

#[tokio::test]
async fn a_removed_volume_is_deleted_by_its_plugin_before_it_goes() {
    let fx = start();
    secret(&fx.state).await;
    controlapi::create_volume(&fx.state, spec("data")).await.unwrap();
    fx.until("the volume's info", |fx| fx.volume("data").is_some_and(|v| v.created_by_plugin())).await;
    fx.fake.failing.store(true, Ordering::SeqCst);
    controlapi::remove_volume(&fx.state, "data", false).await.unwrap();
    fx.until("a delete", |fx| fx.seen().len() == 2).await;
    assert!(fx.volume("data").is_some_and(|v| v.pending_delete), "kept, pending deletion, while the plugin fails");
    // A second removal is accepted and changes nothing.
    controlapi::remove_volume(&fx.state, "data", false).await.unwrap();
    fx.asleep().await;
    fx.fake.failing.store(false, Ordering::SeqCst);
    fx.timer.advance_ms(RETRY_MIN_MS);
    fx.until("the volume gone", |fx| fx.volume("data").is_none()).await;
    let delete = Seen::Delete("fake-data".into(), [("password".into(), "s3cret".into())].into());
    assert_eq!(fx.seen()[1..], [delete.clone(), delete]);
}

#[tokio::test]
async fn forced_removals_and_volumes_no_plugin_made_go_at_once_without_a_call() {
    let fx = start();
    // Its secret must exist when it is created.
    let made = controlapi::create_volume(&fx.state, spec("never")).await;
    assert!(matches!(made, Err(ControlError::InvalidArgument(_))), "its secret must exist: {made:?}");
    secret(&fx.state).await;
    fx.fake.failing.store(true, Ordering::SeqCst);
    controlapi::create_volume(&fx.state, spec("never")).await.unwrap();
    fx.until("a create", |fx| fx.seen().len() == 1).await;
    controlapi::remove_volume(&fx.state, "never", false).await.unwrap();
    assert!(fx.volume("never").is_none(), "no plugin made it: removed at once");

    fx.fake.failing.store(false, Ordering::SeqCst);
    controlapi::create_volume(&fx.state, spec("forced")).await.unwrap();
    fx.until("the volume's info", |fx| fx.volume("forced").is_some_and(|v| v.created_by_plugin())).await;
    let calls = fx.seen().len();
    controlapi::remove_volume(&fx.state, "forced", true).await.unwrap();
    assert!(fx.volume("forced").is_none());
    fx.asleep_or_idle().await;
    assert_eq!(fx.seen().len(), calls, "a forced removal asks nothing of the plugin");
}

#[tokio::test]
async fn a_volume_whose_secret_is_gone_waits_without_a_call_until_it_is_back() {
    let fx = start();
    secret(&fx.state).await;
    fx.fake.failing.store(true, Ordering::SeqCst);
    controlapi::create_volume(&fx.state, spec("data")).await.unwrap();
    fx.until("a create", |fx| fx.seen().len() == 1).await;
    controlapi::remove_secret(&fx.state, "db-pass").await.unwrap();
    fx.fake.failing.store(false, Ordering::SeqCst);
    fx.asleep().await;
    fx.timer.advance_ms(RETRY_MAX_MS);
    fx.asleep().await;
    assert_eq!(fx.seen().len(), 1, "no call without the secret");
    let waits = fx.state.store.view(|t| next_work(t, t.volumes().by_name("data").unwrap()));
    assert!(matches!(&waits, Work::Wait(m) if m.contains("\"db-pass\"")), "{waits:?}");
    secret(&fx.state).await;
    fx.until("the volume's info", |fx| fx.volume("data").is_some_and(|v| v.created_by_plugin())).await;
    assert_eq!(fx.seen().len(), 2);
}

#[tokio::test]
async fn a_volume_removed_while_its_plugin_creates_it_is_deleted_again() {
    let fx = start();
    secret(&fx.state).await;
    let (release, held) = tokio::sync::oneshot::channel();
    *fx.fake.hold.lock().unwrap() = Some(held);
    controlapi::create_volume(&fx.state, spec("data")).await.unwrap();
    fx.until("a create", |fx| fx.seen().len() == 1).await;
    controlapi::remove_volume(&fx.state, "data", false).await.unwrap();
    assert!(fx.volume("data").is_none(), "not created yet: removed at once");
    release.send(()).unwrap();
    let delete = Seen::Delete("fake-data".into(), [("password".into(), "s3cret".into())].into());
    fx.until("the late volume deleted", |fx| fx.seen().get(1) == Some(&delete)).await;
}

#[test]
fn access_modes_become_swarmkits_csi_modes() {
    use volume_access_mode::{Scope, Sharing};
    let mode = |scope: Scope, sharing: Sharing| {
        let m = VolumeAccessMode { scope: scope as i32, sharing: sharing as i32, access_type: None };
        capability(&m).access_mode.unwrap().mode
    };
    assert_eq!(mode(Scope::SingleNode, Sharing::None), Mode::SingleNodeWriter as i32);
    assert_eq!(mode(Scope::SingleNode, Sharing::OneWriter), Mode::SingleNodeWriter as i32);
    assert_eq!(mode(Scope::SingleNode, Sharing::All), Mode::SingleNodeWriter as i32);
    assert_eq!(mode(Scope::SingleNode, Sharing::ReadOnly), Mode::SingleNodeReaderOnly as i32);
    assert_eq!(mode(Scope::MultiNode, Sharing::ReadOnly), Mode::MultiNodeReaderOnly as i32);
    assert_eq!(mode(Scope::MultiNode, Sharing::OneWriter), Mode::MultiNodeSingleWriter as i32);
    assert_eq!(mode(Scope::MultiNode, Sharing::All), Mode::MultiNodeMultiWriter as i32);
    assert_eq!(mode(Scope::MultiNode, Sharing::None), Mode::Unknown as i32);
}

#[test]
fn backoff_doubles_up_to_its_bound() {
    assert_eq!(runner::backoff_ms(1), RETRY_MIN_MS);
    assert_eq!(runner::backoff_ms(2), 2 * RETRY_MIN_MS);
    assert_eq!(runner::backoff_ms(40), RETRY_MAX_MS);
}

#[tokio::test]
async fn a_plugin_answer_over_the_bound_is_not_kept_and_the_create_is_retried() {
    let fx = start();
    secret(&fx.state).await;
    fx.fake.huge.store(true, Ordering::SeqCst);
    controlapi::create_volume(&fx.state, spec("data")).await.unwrap();
    fx.until("a first create", |fx| fx.seen().len() == 1).await;
    fx.asleep().await;
    assert!(fx.volume("data").is_some_and(|v| v.volume_info.is_none()), "an answer over the bound is not written");
    fx.fake.huge.store(false, Ordering::SeqCst);
    fx.timer.advance_ms(RETRY_MIN_MS);
    fx.until("the volume's info", |fx| fx.volume("data").is_some_and(|v| v.created_by_plugin())).await;
}

/// A running volume manager with the volume "data" created by its plugin, and the volume's ID.
async fn created() -> (Fx, String) {
    let fx = start();
    secret(&fx.state).await;
    controlapi::create_volume(&fx.state, spec("data")).await.unwrap();
    fx.until("the volume's info", |fx| fx.volume("data").is_some_and(|v| v.created_by_plugin())).await;
    let vid = fx.volume("data").unwrap().id.clone();
    (fx, vid)
}

/// A node reporting the test plugin (`csi_node`: the plugin's ID of it; `None`: it does not report it).
async fn node(state: &ClusterState, id: &str, csi_node: Option<&str>) {
    let node = shoal_api::Node {
        id: id.into(),
        description: Some(shoal_api::NodeDescription {
            hostname: id.into(),
            csi_info: csi_node
                .map(|n| shoal_api::NodeCsiInfo {
                    plugin_name: "csi.test".into(),
                    node_id: n.into(),
                    ..Default::default()
                })
                .into_iter()
                .collect(),
            ..Default::default()
        }),
        ..Default::default()
    };
    state.propose(shoal_store::Changes::new().create(node).clone()).await.unwrap();
}

/// A task on `node` using volume `volume_id`, in `state`.
fn task_on(id: &str, node: &str, volume_id: &str, state: shoal_api::TaskState) -> shoal_api::Task {
    shoal_api::Task {
        id: id.into(),
        node_id: node.into(),
        desired_state: shoal_api::TaskState::Running as i32,
        status: Some(shoal_api::TaskStatus { state: state as i32, ..Default::default() }),
        volumes: vec![shoal_api::VolumeAttachment {
            id: volume_id.into(),
            source: "data".into(),
            target: "/data".into(),
        }]
        .into(),
        ..Default::default()
    }
}

impl Fx {
    fn states(&self, name: &str) -> Vec<(String, i32)> {
        self.volume(name)
            .map(|v| v.publish_status.iter().map(|s| (s.node_id.clone(), s.state)).collect())
            .unwrap_or_default()
    }

    /// What the scheduler writes: the task placed, and the volume marked PENDING_PUBLISH for its node.
    async fn place(&self, task: shoal_api::Task, name: &str) {
        self.state
            .write(|t, c| {
                let mut v = (**t.volumes().by_name(name).unwrap()).clone();
                v.publish_status.push(shoal_api::VolumePublishStatus {
                    node_id: task.node_id.clone(),
                    state: volume_publish_status::State::PendingPublish as i32,
                    ..Default::default()
                });
                c.update(v);
                c.create(task.clone());
                Ok::<(), std::convert::Infallible>(())
            })
            .await
            .unwrap();
    }
}

use shoal_api::volume_publish_status;

/// The whole chain of one publication: PENDING_PUBLISH -> ControllerPublishVolume with the plugin's ID of
/// the node -> PUBLISHED with the context; the task ends -> PENDING_NODE_UNPUBLISH; the node says it
/// unpublished (the dispatcher's write) -> PENDING_UNPUBLISH -> ControllerUnpublishVolume -> no publication.
#[tokio::test]
async fn a_volume_is_published_to_the_node_of_its_task_and_unpublished_after_the_task_ends() {
    use volume_publish_status::State;
    let (fx, vid) = created().await;
    node(&fx.state, "n1", Some("csi-n1")).await;
    fx.place(task_on("t1", "n1", &vid, shoal_api::TaskState::Assigned), "data").await;
    fx.until("published", |fx| fx.states("data") == vec![("n1".into(), State::Published as i32)]).await;
    let secrets: HashMap<String, String> = [("password".into(), "s3cret".into())].into();
    assert_eq!(fx.seen()[1..], [Seen::Publish("fake-data".into(), "csi-n1".into(), false, secrets.clone())]);
    let context = fx.volume("data").unwrap().publish_status[0].publish_context.clone();
    assert_eq!(context.get("device").map(String::as_str), Some("/dev/for-csi-n1"));

    // Removal is refused while it is published.
    let refused = controlapi::remove_volume(&fx.state, "data", false).await;
    assert!(matches!(&refused, Err(ControlError::FailedPrecondition(m)) if m.contains("n1")), "{refused:?}");

    // The task ends: the node is asked to unpublish it; nothing is asked of the plugin yet.
    let ended = task_on("t1", "n1", &vid, shoal_api::TaskState::Complete);
    fx.state
        .write(|t, c| {
            let mut done = ended.clone();
            done.meta = t.tasks().get("t1").unwrap().meta;
            c.update(done);
            Ok::<(), std::convert::Infallible>(())
        })
        .await
        .unwrap();
    fx.until("asked of the node", |fx| fx.states("data") == vec![("n1".into(), State::PendingNodeUnpublish as i32)])
        .await;
    assert_eq!(fx.seen().len(), 2);

    // A node cannot end another node's publication; its own goes on to the plugin.
    let ids = std::collections::BTreeSet::from([vid.clone()]);
    mark(&fx, "n2", &ids).await;
    assert_eq!(fx.states("data"), vec![("n1".into(), State::PendingNodeUnpublish as i32)]);
    mark(&fx, "n1", &ids).await;
    fx.until("unpublished", |fx| fx.states("data").is_empty()).await;
    assert_eq!(fx.seen()[2..], [Seen::Unpublish("fake-data".into(), "csi-n1".into())]);
    controlapi::remove_volume(&fx.state, "data", false).await.unwrap();
}

/// A publication whose node does not report the plugin waits, saying which flag its daemon needs; one whose
/// task ended before it was published is unpublished through the plugin all the same (the old leader may
/// have made the call); a failed publish is retried after the backoff.
#[tokio::test]
async fn publications_wait_for_the_nodes_plugin_and_a_task_ended_early_is_unpublished_anyway() {
    use volume_publish_status::State;
    let (fx, vid) = created().await;
    node(&fx.state, "bare", None).await;
    fx.place(task_on("t1", "bare", &vid, shoal_api::TaskState::Assigned), "data").await;
    fx.asleep().await;
    let waits = fx.state.store.view(|t| next_work(t, t.volumes().by_name("data").unwrap()));
    assert!(matches!(&waits, Work::Wait(m) if m.contains("--csi-plugin csi.test=")), "{waits:?}");
    assert_eq!(fx.seen().len(), 1, "no publish without the plugin's ID of the node");

    node(&fx.state, "n2", Some("csi-n2")).await;
    fx.fake.failing.store(true, Ordering::SeqCst);
    fx.place(task_on("t2", "n2", &vid, shoal_api::TaskState::Assigned), "data").await;
    fx.until("a failed publish", |fx| fx.seen().iter().any(|s| matches!(s, Seen::Publish(..)))).await;
    // t2 ends before the plugin answers: the publication goes to PENDING_UNPUBLISH, and the plugin is asked
    // to unpublish once it answers again.
    fx.state
        .write(|t, c| {
            let mut done = task_on("t2", "n2", &vid, shoal_api::TaskState::Failed);
            done.meta = t.tasks().get("t2").unwrap().meta;
            c.update(done);
            Ok::<(), std::convert::Infallible>(())
        })
        .await
        .unwrap();
    fx.until("released", |fx| fx.states("data").contains(&("n2".into(), State::PendingUnpublish as i32))).await;
    fx.fake.failing.store(false, Ordering::SeqCst);
    fx.asleep().await;
    fx.timer.advance_ms(RETRY_MAX_MS);
    fx.until("unpublished from n2", |fx| !fx.states("data").iter().any(|(n, _)| n == "n2")).await;
    assert!(fx.seen().contains(&Seen::Unpublish("fake-data".into(), "csi-n2".into())), "{:?}", fx.seen());
    assert_eq!(fx.states("data"), vec![("bare".into(), State::PendingPublish as i32)]);
}

/// What the dispatcher writes when `node` says it unpublished `ids`.
async fn mark(fx: &Fx, node: &str, ids: &std::collections::BTreeSet<String>) {
    fx.state
        .write(|t, c| {
            crate::dispatcher::volumes::mark_unpublished(t, c, node, ids, 1);
            Ok::<(), std::convert::Infallible>(())
        })
        .await
        .unwrap();
}

/// `docker volume update --availability drain`: the live tasks using the volume are rejected (SwarmKit's
/// volume enforcer), so their orchestrators replace them, and the volume is then released from their node;
/// a task already ended is left alone.
#[tokio::test]
async fn draining_a_volume_rejects_the_tasks_using_it_and_releases_it() {
    use volume_publish_status::State;
    let (fx, vid) = created().await;
    node(&fx.state, "n1", Some("csi-n1")).await;
    fx.place(task_on("t1", "n1", &vid, shoal_api::TaskState::Running), "data").await;
    fx.state
        .propose(shoal_store::Changes::new().create(task_on("old", "n1", &vid, shoal_api::TaskState::Failed)).clone())
        .await
        .unwrap();
    fx.until("published", |fx| fx.states("data") == vec![("n1".into(), State::Published as i32)]).await;

    let v = fx.volume("data").unwrap();
    let mut s = v.spec.clone().unwrap();
    s.availability = shoal_api::volume_spec::VolumeAvailability::Drain as i32;
    let version = v.meta.as_ref().and_then(|m| m.version.as_ref()).map(|x| x.index).unwrap();
    controlapi::update_volume(&fx.state, &v.id, version, s).await.unwrap();
    let task = |id: &str| fx.state.store.view(|t| t.tasks().get(id).cloned()).unwrap();
    fx.until("the task rejected", |_| {
        task("t1").status.as_ref().is_some_and(|s| s.state == shoal_api::TaskState::Rejected as i32)
    })
    .await;
    let st = task("t1").status.clone().unwrap();
    assert_eq!((st.message.as_str(), st.err.as_str()), (DRAINED_MESSAGE, DRAINED_ERR));
    assert_eq!(
        task("old").status.as_ref().unwrap().state,
        shoal_api::TaskState::Failed as i32,
        "an ended task is left alone"
    );
    fx.until("released from the node", |fx| {
        fx.states("data") == vec![("n1".into(), State::PendingNodeUnpublish as i32)]
    })
    .await;
}
