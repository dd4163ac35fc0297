//! Cluster volumes on this node (layer 3 of docs/design/cluster-volumes.md, the worker's half). The
//! dispatcher sends a `VolumeAssignment` once the manager has published a volume to this node (UPDATE), and
//! again as a REMOVE once no task here needs it. `Volumes` keeps what each volume should be (published or
//! not) and a loop makes it so through the node's CSI plugins (`NodeVolumes`: `NodeStageVolume` when the
//! plugin stages, then `NodePublishVolume`; the reverse to unpublish), retrying a failed call with a backoff
//! (`RETRY_MIN` doubling to `RETRY_MAX`). Each volume is published at `<root>/<volume ID>/publish` (staged
//! at `.../staging`), a path known before the call, so a task's cluster mount becomes a bind mount of it
//! (`bind_cluster_mounts`) and the task waits, in `prepare`, until the volume is published (`AwaitVolumes`,
//! at most `PUBLISH_WAIT`). A volume unpublished is reported to the manager (`take_unpublished`, sent by
//! the session as `UpdateVolumeStatus`), which then has the plugin's controller unpublish it.
//!
//! A volume is never unpublished under a task of this node that may still be running: from the start of its
//! `prepare` until its process is known to have stopped (its `wait` returned, or its shutdown or terminate
//! succeeded, or it was removed), the task holds its volumes (`hold`), and a REMOVE of a held volume waits
//! until the last hold is let go. The managers already order the REMOVE after the task's end is reported;
//! this is the node's own check, against a view that is behind.
//!
//! What the plugins say of the node (`NodeGetInfo`) goes in its description. A plugin that does not answer
//! when the agent starts (started after the daemon, or restarting) is asked again, with the same backoff, until
//! every plugin has answered (`refresh_node_info`); each new answer changes `node_info_changes`, and the
//! session opens anew to report it, so a task waiting for a node with the plugin is then placed.
//!
//! Bounds: one entry per volume assigned to this node. Must not know gRPC or how a plugin is reached.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use shoal_api::{mount, task_spec, Task, VolumeAssignment};
use tokio::sync::{watch, Notify};

use crate::exec::{BoxFuture, Controller, ExecutorError, ExitStatus, RuntimeReport};

/// The first retry of a failed plugin call comes after this long, each next one after twice as long...
pub(crate) const RETRY_MIN: Duration = Duration::from_millis(500);
/// ...up to this.
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(30);
/// How long a task waits for its volumes to be published here before it is rejected (its orchestrator then
/// replaces it).
pub(crate) const PUBLISH_WAIT: Duration = Duration::from_secs(120);

/// The node side of the CSI plugins this node runs (the node crate's gRPC clients; a fake in tests).
pub trait NodeVolumes: Send + Sync + 'static {
    /// Stages `a` at `staging` (when its plugin stages volumes), then publishes it at `target`, with the
    /// secrets' data by key.
    fn publish(
        &self,
        a: &VolumeAssignment,
        secrets: HashMap<String, String>,
        staging: &Path,
        target: &Path,
    ) -> BoxFuture<'static, Result<(), String>>;
    /// Unpublishes `a` from `target`, then unstages it from `staging` (when its plugin stages volumes).
    fn unpublish(&self, a: &VolumeAssignment, staging: &Path, target: &Path) -> BoxFuture<'static, Result<(), String>>;
    /// What each plugin's `NodeGetInfo` answers, for the node description (a plugin that cannot be reached
    /// is left out, with a warning).
    fn node_info(&self) -> BoxFuture<'static, Vec<shoal_api::NodeCsiInfo>>;
    /// How many plugins the node runs (`node_info` answers for at most this many).
    fn plugin_count(&self) -> usize;
}

/// What a volume should be. No `Debug`: it holds the secrets' data.
#[derive(Clone, PartialEq)]
enum Want {
    Published(VolumeAssignment, HashMap<String, String>),
    Unpublished(VolumeAssignment),
}

#[derive(Default)]
struct State {
    /// What each volume should be, and whether it is so.
    want: BTreeMap<String, (Want, bool)>,
    /// Volumes unpublished and not yet reported.
    unpublished: BTreeSet<String>,
    /// How many tasks of this node hold each volume (may still be running with it).
    holds: BTreeMap<String, usize>,
}

/// This node's cluster volumes (cheap to clone).
#[derive(Clone)]
pub struct Volumes {
    root: PathBuf,
    plugins: Arc<dyn NodeVolumes>,
    state: Arc<Mutex<State>>,
    published: watch::Sender<BTreeSet<String>>,
    info: watch::Sender<Vec<shoal_api::NodeCsiInfo>>,
    wake: Arc<Notify>,
    reports: Arc<Notify>,
}

impl std::fmt::Debug for Volumes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Volumes").field("root", &self.root).field("published", &*self.published.borrow()).finish()
    }
}

impl Volumes {
    /// Volumes published under `root` through `plugins`.
    pub fn new(root: PathBuf, plugins: Arc<dyn NodeVolumes>) -> Volumes {
        Volumes {
            root,
            plugins,
            state: Arc::default(),
            published: watch::channel(BTreeSet::new()).0,
            info: watch::channel(Vec::new()).0,
            wake: Arc::default(),
            reports: Arc::default(),
        }
    }

    /// What the node's plugins say of it (`NodeGetInfo`), for its description; asked anew, and kept for
    /// `node_info_changes`.
    pub async fn node_info(&self) -> Vec<shoal_api::NodeCsiInfo> {
        let info = self.plugins.node_info().await;
        self.info.send_if_modified(|known| {
            let changed = *known != info;
            if changed {
                known.clone_from(&info);
            }
            changed
        });
        info
    }

    /// What the node's plugins said of it last, changed each time a plugin's answer is new.
    pub fn node_info_changes(&self) -> watch::Receiver<Vec<shoal_api::NodeCsiInfo>> {
        self.info.subscribe()
    }

    /// Until every plugin has answered `NodeGetInfo` (or `shutdown` turns true), asks again, after
    /// `RETRY_MIN` doubling to `RETRY_MAX`.
    pub async fn refresh_node_info(self, mut shutdown: watch::Receiver<bool>) {
        let mut delay = RETRY_MIN;
        while self.info.borrow().len() < self.plugins.plugin_count() {
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.changed() => return,
            }
            delay = (delay * 2).min(RETRY_MAX);
            let before = self.info.borrow().len();
            let now = self.node_info().await.len();
            if now > before {
                tracing::info!(
                    answered = now,
                    of = self.plugins.plugin_count(),
                    "a CSI plugin answered NodeGetInfo: \
                    the node reports it"
                );
            }
        }
    }

    /// Where volume `id` (the swarm's ID) is published on this node.
    pub fn target(&self, id: &str) -> PathBuf {
        self.root.join(id).join("publish")
    }

    fn staging(&self, id: &str) -> PathBuf {
        self.root.join(id).join("staging")
    }

    /// Takes a `VolumeAssignment` change: publish it (UPDATE, with its secrets' data by key), or unpublish it
    /// (REMOVE; a volume this node never had is reported unpublished at once, as it may have had it before a
    /// restart).
    pub fn assign(&self, a: VolumeAssignment, secrets: HashMap<String, String>, remove: bool) {
        let want = if remove { Want::Unpublished(a.clone()) } else { Want::Published(a.clone(), secrets) };
        let mut st = self.state.lock();
        match st.want.get(&a.id) {
            Some((w, _)) if *w == want => return,
            _ => {}
        }
        if !remove {
            st.unpublished.remove(&a.id);
        }
        if remove && st.holds.contains_key(&a.id) {
            tracing::info!(volume = %a.id, "the managers ask to unpublish a cluster volume that a task of this node \
                still uses: it is unpublished once the task stops");
        }
        st.want.insert(a.id.clone(), (want, false));
        drop(st);
        self.wake.notify_one();
    }

    /// A task of this node may run with these volumes from now on: none of them is unpublished until `let_go`.
    pub fn hold(&self, ids: &[String]) {
        let mut st = self.state.lock();
        for id in ids {
            *st.holds.entry(id.clone()).or_default() += 1;
        }
    }

    /// The task that held these volumes has stopped.
    pub fn let_go(&self, ids: &[String]) {
        let mut st = self.state.lock();
        for id in ids {
            if let Some(n) = st.holds.get_mut(id) {
                *n -= 1;
                if *n == 0 {
                    st.holds.remove(id);
                }
            }
        }
        drop(st);
        self.wake.notify_one();
    }

    /// The volumes published here now.
    pub fn published(&self) -> watch::Receiver<BTreeSet<String>> {
        self.published.subscribe()
    }

    /// The volumes unpublished since the last call, to report (put back with `put_back` if the report fails).
    pub fn take_unpublished(&self) -> Vec<String> {
        std::mem::take(&mut self.state.lock().unpublished).into_iter().collect()
    }

    /// Puts back volumes whose report failed.
    pub fn put_back(&self, ids: Vec<String>) {
        let mut st = self.state.lock();
        for id in ids {
            // Assigned again meanwhile: nothing to report any more.
            if !matches!(st.want.get(&id), Some((Want::Published(..), _))) {
                st.unpublished.insert(id);
            }
        }
        drop(st);
        self.reports.notify_one();
    }

    /// Resolves once there may be unpublished volumes to report.
    pub async fn reports_changed(&self) {
        self.reports.notified().await;
    }

    /// The next volume to work on: one whose state is not what it should be (a held volume is not
    /// unpublished).
    fn next(&self) -> Option<(String, Want)> {
        let st = self.state.lock();
        st.want
            .iter()
            .find(|(id, (w, done))| !done && (matches!(w, Want::Published(..)) || !st.holds.contains_key(*id)))
            .map(|(id, (w, _))| (id.clone(), w.clone()))
    }

    /// Makes each volume what it should be, until `shutdown` turns true.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let mut delay = RETRY_MIN;
        loop {
            let wake = self.wake.notified();
            let Some((id, want)) = self.next() else {
                tokio::select! {
                    _ = wake => continue,
                    _ = shutdown.changed() => return,
                }
            };
            let (staging, target) = (self.staging(&id), self.target(&id));
            let result = match &want {
                Want::Published(a, secrets) => self.plugins.publish(a, secrets.clone(), &staging, &target).await,
                Want::Unpublished(a) => self.plugins.unpublish(a, &staging, &target).await,
            };
            match result {
                Ok(()) => {
                    delay = RETRY_MIN;
                    self.done(&id, &want);
                }
                Err(e) => {
                    tracing::warn!(volume = %id, "cluster volume: {e}; retrying in {delay:?}");
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = shutdown.changed() => return,
                    }
                    delay = (delay * 2).min(RETRY_MAX);
                }
            }
        }
    }

    /// Records that `id` is now as `want` said (unless it was assigned otherwise meanwhile).
    fn done(&self, id: &str, want: &Want) {
        let mut st = self.state.lock();
        let Some((w, done)) = st.want.get_mut(id) else { return };
        if w != want {
            return;
        }
        *done = true;
        match want {
            Want::Published(..) => {
                tracing::info!(volume = %id, "cluster volume published on this node");
                self.published.send_modify(|p| {
                    p.insert(id.to_string());
                });
            }
            Want::Unpublished(_) => {
                tracing::info!(volume = %id, "cluster volume unpublished from this node");
                st.want.remove(id);
                st.unpublished.insert(id.to_string());
                self.published.send_modify(|p| {
                    p.remove(id);
                });
                self.reports.notify_one();
            }
        }
    }
}

/// `task` with each cluster mount turned into a bind mount of its volume's publish path (the volume the
/// scheduler chose, `task.volumes`), and the IDs of those volumes; an error names a cluster mount no volume
/// was chosen for. `None` when the task mounts no cluster volume.
pub(crate) fn bind_cluster_mounts(
    task: &Task,
    volumes: Option<&Volumes>,
) -> Option<Result<(Task, Vec<String>), String>> {
    let cluster = |m: &shoal_api::Mount| m.r#type == mount::Type::Cluster as i32;
    let container = match task.spec.as_ref().and_then(|s| s.runtime.as_ref()) {
        Some(task_spec::Runtime::Container(c)) if c.mounts.iter().any(cluster) => c,
        _ => return None,
    };
    let Some(volumes) = volumes else {
        return Some(Err("the task mounts a cluster volume (type=cluster) but this node runs no CSI plugin: start \
                         its daemon with --csi-plugin NAME=unix:///path/to/the/plugin.sock"
            .to_string()));
    };
    let mut c = container.clone();
    let mut ids = Vec::new();
    for m in c.mounts.iter_mut().filter(|m| cluster(m)) {
        let Some(a) = task.volumes.iter().find(|a| a.source == m.source && a.target == m.target) else {
            return Some(Err(format!(
                "no cluster volume was chosen for the mount of {:?} at {}: the task must be scheduled again",
                m.source, m.target
            )));
        };
        m.r#type = mount::Type::Bind as i32;
        m.source = volumes.target(&a.id).display().to_string();
        ids.push(a.id.clone());
    }
    let mut out = task.clone();
    if let Some(spec) = out.spec.as_mut() {
        spec.runtime = Some(task_spec::Runtime::Container(c));
    }
    Some(Ok((out, ids)))
}

/// A task's controller that, in `prepare`, first waits until its cluster volumes are published on this
/// node (at most `PUBLISH_WAIT`), and holds them (`Volumes::hold`) until its process has stopped.
pub(crate) struct AwaitVolumes {
    inner: Box<dyn Controller>,
    ids: Vec<String>,
    volumes: Volumes,
    published: watch::Receiver<BTreeSet<String>>,
    wait: Duration,
    holding: bool,
}

impl AwaitVolumes {
    /// Wraps `inner`, waiting for `ids` to be published by `volumes`.
    pub(crate) fn new(inner: Box<dyn Controller>, ids: Vec<String>, volumes: Volumes) -> Self {
        let published = volumes.published();
        AwaitVolumes { inner, ids, volumes, published, wait: PUBLISH_WAIT, holding: false }
    }

    fn let_go(&mut self) {
        if std::mem::take(&mut self.holding) {
            self.volumes.let_go(&self.ids);
        }
    }

    /// Lets go of the volumes when `r` says the process has stopped.
    fn stopped_if_ok<T>(&mut self, r: Result<T, ExecutorError>) -> Result<T, ExecutorError> {
        if r.is_ok() {
            self.let_go();
        }
        r
    }
}

impl Drop for AwaitVolumes {
    fn drop(&mut self) {
        self.let_go();
    }
}

impl Controller for AwaitVolumes {
    fn prepare(&mut self) -> BoxFuture<'_, Result<(), ExecutorError>> {
        Box::pin(async move {
            if !self.holding {
                self.volumes.hold(&self.ids);
                self.holding = true;
            }
            let r = self.await_published().await;
            if r.is_err() {
                self.let_go();
            }
            r
        })
    }
    fn start(&mut self) -> BoxFuture<'_, Result<i32, ExecutorError>> {
        self.inner.start()
    }
    fn wait(&mut self) -> BoxFuture<'_, Result<ExitStatus, ExecutorError>> {
        Box::pin(async move {
            let r = self.inner.wait().await;
            self.stopped_if_ok(r)
        })
    }
    fn shutdown(&mut self) -> BoxFuture<'_, Result<(), ExecutorError>> {
        Box::pin(async move {
            let r = self.inner.shutdown().await;
            self.stopped_if_ok(r)
        })
    }
    fn terminate(&mut self) -> BoxFuture<'_, Result<(), ExecutorError>> {
        Box::pin(async move {
            let r = self.inner.terminate().await;
            self.stopped_if_ok(r)
        })
    }
    fn remove(&mut self) -> BoxFuture<'_, Result<(), ExecutorError>> {
        Box::pin(async move {
            let r = self.inner.remove().await;
            self.let_go();
            r
        })
    }
    fn report(&self) -> RuntimeReport {
        self.inner.report()
    }
}

impl AwaitVolumes {
    /// Waits until the volumes are published here (at most `wait`), then prepares the inner controller.
    async fn await_published(&mut self) -> Result<(), ExecutorError> {
        {
            let ids = self.ids.clone();
            let ready = self.published.wait_for(|p| ids.iter().all(|id| p.contains(id)));
            match tokio::time::timeout(self.wait, ready).await {
                Ok(Ok(_)) => {}
                Ok(Err(_)) => {
                    return Err(ExecutorError::InvalidSpec("the node's cluster volumes stopped".to_string()));
                }
                Err(_) => {
                    return Err(ExecutorError::InvalidSpec(format!(
                        "the cluster volumes {:?} were not published to this node within {:?}",
                        self.ids, self.wait
                    )));
                }
            }
        }
        self.inner.prepare().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_api::{ContainerSpec, Mount, TaskSpec, VolumeAttachment};

    /// A plugin that records its calls and fails the first `fail` of them.
    #[derive(Default)]
    struct Fake {
        calls: Mutex<Vec<String>>,
        fail: Mutex<u32>,
    }

    impl Fake {
        fn answer(&self, call: String) -> BoxFuture<'static, Result<(), String>> {
            self.calls.lock().push(call);
            let mut fail = self.fail.lock();
            let r = if *fail > 0 {
                *fail -= 1;
                Err("the fake plugin fails".to_string())
            } else {
                Ok(())
            };
            Box::pin(std::future::ready(r))
        }
    }

    impl NodeVolumes for Arc<Fake> {
        fn publish(
            &self,
            a: &VolumeAssignment,
            secrets: HashMap<String, String>,
            _: &Path,
            target: &Path,
        ) -> BoxFuture<'static, Result<(), String>> {
            let mut keys: Vec<&String> = secrets.keys().collect();
            keys.sort();
            self.answer(format!("publish {} at {} with {keys:?}", a.volume_id, target.display()))
        }
        fn unpublish(&self, a: &VolumeAssignment, _: &Path, _: &Path) -> BoxFuture<'static, Result<(), String>> {
            self.answer(format!("unpublish {}", a.volume_id))
        }
        fn node_info(&self) -> BoxFuture<'static, Vec<shoal_api::NodeCsiInfo>> {
            Box::pin(std::future::ready(Vec::new()))
        }
        fn plugin_count(&self) -> usize {
            0
        }
    }

    /// A node with one plugin whose `NodeGetInfo` gives these answers in turn (then the last one again).
    struct Answers(Mutex<Vec<Vec<shoal_api::NodeCsiInfo>>>);

    impl NodeVolumes for Answers {
        fn publish(
            &self,
            _: &VolumeAssignment,
            _: HashMap<String, String>,
            _: &Path,
            _: &Path,
        ) -> BoxFuture<'static, Result<(), String>> {
            Box::pin(std::future::ready(Ok(())))
        }
        fn unpublish(&self, _: &VolumeAssignment, _: &Path, _: &Path) -> BoxFuture<'static, Result<(), String>> {
            Box::pin(std::future::ready(Ok(())))
        }
        fn node_info(&self) -> BoxFuture<'static, Vec<shoal_api::NodeCsiInfo>> {
            let mut answers = self.0.lock();
            let next = if answers.len() > 1 { answers.remove(0) } else { answers[0].clone() };
            Box::pin(std::future::ready(next))
        }
        fn plugin_count(&self) -> usize {
            1
        }
    }

    /// A plugin that did not answer `NodeGetInfo` when the agent started is asked again, with the backoff,
    /// until it answers; its answer changes what the session reports, and then the asking stops.
    #[tokio::test(start_paused = true)]
    async fn a_plugin_that_answers_late_is_asked_again_and_then_reported() {
        let info = shoal_api::NodeCsiInfo { plugin_name: "p".into(), node_id: "n1".into(), ..Default::default() };
        let answers = Arc::new(Answers(Mutex::new(vec![vec![], vec![], vec![], vec![info.clone()]])));
        let dir = tempfile::tempdir().unwrap();
        let v = Volumes::new(dir.path().to_path_buf(), answers.clone());
        assert!(v.node_info().await.is_empty(), "not up when the agent starts");
        let mut changes = v.node_info_changes();
        let (_stop, shutdown) = watch::channel(false);
        let started = tokio::time::Instant::now();
        let refresh = tokio::spawn(v.clone().refresh_node_info(shutdown));
        changes.changed().await.unwrap();
        assert_eq!(*changes.borrow_and_update(), vec![info]);
        // Asked after 0.5 s, 1 s and 2 s: the third answer was the first one.
        assert_eq!(started.elapsed(), RETRY_MIN * 7);
        refresh.await.unwrap();
        let left = answers.as_ref().0.lock().len();
        assert_eq!(left, 1, "not asked again once it answered");
    }

    /// Waits for volumes to report, and takes them.
    async fn reported(v: &Volumes) -> Vec<String> {
        loop {
            let ids = v.take_unpublished();
            if !ids.is_empty() {
                return ids;
            }
            v.reports_changed().await;
        }
    }

    fn assignment(id: &str) -> VolumeAssignment {
        VolumeAssignment { id: id.into(), volume_id: format!("plugin-{id}"), ..Default::default() }
    }

    /// A volume is published (retried after a failure, with its secrets), reported published, then on a
    /// REMOVE unpublished and reported for `UpdateVolumeStatus`; a failed report is put back; a REMOVE of a
    /// volume the node does not have is unpublished and reported all the same.
    #[tokio::test]
    async fn volumes_are_published_retried_unpublished_and_reported() {
        let fake = Arc::new(Fake::default());
        *fake.fail.lock() = 1;
        let v = Volumes::new(PathBuf::from("/state/csi"), Arc::new(fake.clone()));
        let (stop, stopped) = watch::channel(false);
        let running = tokio::spawn(v.clone().run(stopped));
        let mut published = v.published();
        v.assign(assignment("v1"), [("password".to_string(), "s3cret".to_string())].into(), false);
        published.wait_for(|p| p.contains("v1")).await.unwrap();
        let publish = "publish plugin-v1 at /state/csi/v1/publish with [\"password\"]".to_string();
        assert_eq!(*fake.calls.lock(), vec![publish.clone(), publish], "retried after the failure");
        assert!(v.take_unpublished().is_empty());

        v.assign(assignment("v1"), HashMap::new(), true);
        published.wait_for(|p| p.is_empty()).await.unwrap();
        let ids = reported(&v).await;
        assert_eq!(ids, vec!["v1".to_string()]);
        v.put_back(ids);
        assert_eq!(v.take_unpublished(), vec!["v1".to_string()], "a failed report is put back");

        v.assign(assignment("v9"), HashMap::new(), true);
        assert_eq!(reported(&v).await, vec!["v9".to_string()]);
        assert_eq!(fake.calls.lock().last().map(String::as_str), Some("unpublish plugin-v9"));
        stop.send(true).unwrap();
        running.await.unwrap();
    }

    /// A REMOVE of a volume that a task of this node holds waits until the task's process has stopped (the
    /// node's own check, whatever the managers' view); a task that never started lets go when dropped.
    #[tokio::test(start_paused = true)]
    async fn a_volume_is_not_unpublished_under_a_task_that_may_still_run() {
        use crate::exec::Executor;
        let fake = Arc::new(Fake::default());
        let v = Volumes::new(PathBuf::from("/state/csi"), Arc::new(fake.clone()));
        let (stop, stopped) = watch::channel(false);
        let running = tokio::spawn(v.clone().run(stopped));
        v.assign(assignment("v1"), HashMap::new(), false);
        let exec = crate::testing::FakeExecutor::new();
        let controller = |id: &str| {
            let inner = exec.controller(&Task { id: id.into(), ..Default::default() }, Vec::new()).unwrap();
            AwaitVolumes::new(inner, vec!["v1".into()], v.clone())
        };
        let (mut c, mut idle) = (controller("t1"), controller("t2"));
        c.prepare().await.unwrap();
        idle.prepare().await.unwrap();
        c.start().await.unwrap();
        v.assign(assignment("v1"), HashMap::new(), true);
        // Paused time: a minute passes at once, and the loop has had every chance to unpublish.
        tokio::time::sleep(Duration::from_secs(60)).await;
        let unpublished = || fake.calls.lock().iter().any(|c| c.starts_with("unpublish"));
        assert!(!unpublished(), "held: {:?}", fake.calls.lock());
        drop(idle);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!unpublished(), "still held by the running task");
        assert!(exec.exit("t1", 0));
        c.wait().await.unwrap();
        assert_eq!(reported(&v).await, vec!["v1".to_string()]);
        assert_eq!(fake.calls.lock().last().map(String::as_str), Some("unpublish plugin-v1"));
        stop.send(true).unwrap();
        running.await.unwrap();
    }

    fn task_mounting(source: &str, attached: Option<&str>) -> Task {
        let mount = Mount {
            r#type: mount::Type::Cluster as i32,
            source: source.into(),
            target: "/data".into(),
            readonly: true,
            ..Default::default()
        };
        Task {
            id: "t1".into(),
            spec: Some(
                TaskSpec {
                    runtime: Some(task_spec::Runtime::Container(ContainerSpec {
                        mounts: vec![mount],
                        ..Default::default()
                    })),
                    ..Default::default()
                }
                .into(),
            ),
            volumes: attached
                .map(|id| VolumeAttachment { id: id.into(), source: source.into(), target: "/data".into() })
                .into_iter()
                .collect(),
            ..Default::default()
        }
    }

    /// A cluster mount becomes a read-only-as-asked bind mount of its volume's publish path; a mount the
    /// scheduler chose no volume for, or a node without plugins, is an error saying what to do; a task
    /// without cluster mounts is left alone.
    #[test]
    fn cluster_mounts_become_bind_mounts_of_the_publish_path() {
        let v = Volumes::new(PathBuf::from("/state/csi"), Arc::new(Arc::new(Fake::default())));
        let (bound, ids) = bind_cluster_mounts(&task_mounting("data", Some("v1")), Some(&v)).unwrap().unwrap();
        assert_eq!(ids, vec!["v1".to_string()]);
        let Some(task_spec::Runtime::Container(c)) = bound.spec.as_ref().and_then(|s| s.runtime.as_ref()) else {
            panic!("a container")
        };
        assert_eq!(c.mounts[0].r#type, mount::Type::Bind as i32);
        assert_eq!(c.mounts[0].source, "/state/csi/v1/publish");
        assert!(c.mounts[0].readonly);
        let e = bind_cluster_mounts(&task_mounting("data", None), Some(&v)).unwrap().unwrap_err();
        assert!(e.contains("no cluster volume was chosen"), "{e}");
        let e = bind_cluster_mounts(&task_mounting("data", Some("v1")), None).unwrap().unwrap_err();
        assert!(e.contains("--csi-plugin NAME=unix://"), "{e}");
        assert!(bind_cluster_mounts(&Task::default(), Some(&v)).is_none());
    }
}
