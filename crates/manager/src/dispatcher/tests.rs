//! Dispatcher tests over real gRPC on 127.0.0.1:0, with a `LocalProposer` store and a `ManualClock`.
//! Waits are on conditions with a deadline; heartbeat expiry is driven by advancing the clock.

use std::sync::Arc;
use std::time::Duration;

use shoal_api::dispatcher_client::DispatcherClient;
use shoal_api::update_task_status_request::TaskStatusUpdate;
use shoal_api::{
    assignment, assignment_change::AssignmentAction, assignments_message, node_status, AssignmentsRequest,
    HeartbeatRequest, NodeDescription, SessionRequest, Task, TaskState, TaskStatus, UpdateTaskStatusRequest,
};
use shoal_raft::LocalProposer;
use shoal_store::{Changes, ManualClock, MemoryStore};
use tokio::sync::watch;
use tonic::transport::Channel;
use tonic::Request;

use super::*;
use crate::state::RandomIds;
use shoal_store::StoreObject;

const START_MS: u64 = 1_700_000_000_000;

struct Harness {
    state: ClusterState,
    proposer: Arc<LocalProposer>,
    clock: Arc<ManualClock>,
    /// The loops' monotonic time (heartbeat deadlines); `advance_ms` moves it with the clock.
    timer: Arc<SteppedTimer>,
    dispatcher: Arc<Dispatcher>,
    addr: SocketAddr,
    _stop: watch::Sender<bool>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Tokio's time plus what the test stepped forward (`advance_ms`): the status flusher's short waits pass
/// by themselves, heartbeat deadlines move when the test says.
#[derive(Debug, Default)]
struct SteppedTimer {
    real: crate::TokioTimer,
    stepped: crate::ManualTimer,
}

impl SteppedTimer {
    fn advance_ms(&self, ms: u64) {
        self.stepped.advance_ms(ms);
    }
}

impl crate::Timer for SteppedTimer {
    fn now_ms(&self) -> u64 {
        self.real.now_ms() + self.stepped.now_ms()
    }

    fn sleep_ms(&self, ms: u64) -> crate::SleepFuture {
        // Whichever comes first: the real time, or a step past the stepped part of the deadline.
        let (real, stepped) = (self.real.sleep_ms(ms), self.stepped.sleep_ms(ms));
        Box::pin(async move {
            tokio::select! {
                _ = real => {}
                _ = stepped => {}
            }
        })
    }
}

async fn harness() -> Harness {
    let store = Arc::new(MemoryStore::default());
    let proposer = Arc::new(LocalProposer::new(store.clone()));
    let clock = Arc::new(ManualClock::new(START_MS));
    let timer = Arc::new(SteppedTimer::default());
    let state = ClusterState::new(store, proposer.clone(), clock.clone(), Arc::new(RandomIds::seeded(7)))
        .with_timer(timer.clone());
    let config = DispatcherConfig { status_flush_ms: 5, manager_addr: "127.0.0.1:4242".into(), ..Default::default() };
    let dispatcher = Dispatcher::new(state.clone(), config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = dispatcher.serve_trusting_metadata_for_tests(listener);
    let (stop_tx, stop_rx) = watch::channel(false);
    let fut = dispatcher.subsystem().run(state.clone(), stop_rx);
    tokio::spawn(fut);
    Harness { state, proposer, clock, timer, dispatcher, addr, _stop: stop_tx, server }
}

impl Harness {
    /// Moves the wall clock and the loops' timer forward together.
    fn advance_ms(&self, ms: u64) {
        self.clock.advance_ms(ms);
        self.timer.advance_ms(ms);
    }

    async fn client(&self) -> DispatcherClient<Channel> {
        DispatcherClient::connect(format!("http://{}", self.addr)).await.unwrap()
    }

    fn node_state(&self, id: &str) -> Option<i32> {
        self.state.store.view(|t| t.nodes().get(id).and_then(|n| n.status.as_ref()).map(|s| s.state))
    }

    fn task(&self, id: &str) -> Task {
        self.state.store.view(|t| (**t.tasks().get(id).unwrap()).clone())
    }

    async fn put_task(&self, task: Task) {
        let mut c = Changes::new();
        if self.state.store.view(|t| t.tasks().get(&task.id).is_some()) {
            c.update(task);
        } else {
            c.create(task);
        }
        self.state.propose(c).await.unwrap();
    }
}

fn req<T>(node: &str, msg: T) -> Request<T> {
    let mut r = Request::new(msg);
    r.metadata_mut().insert(NODE_ID_METADATA_KEY, node.parse().unwrap());
    r
}

/// `node`'s report, in session `sid`, that task `task` is now in `state`.
fn status_report(node: &str, sid: &str, task: &str, state: TaskState) -> Request<UpdateTaskStatusRequest> {
    req(
        node,
        UpdateTaskStatusRequest {
            session_id: sid.into(),
            updates: vec![TaskStatusUpdate {
                task_id: task.into(),
                status: Some(TaskStatus { state: state as i32, ..Default::default() }),
            }],
        },
    )
}

fn task(id: &str, node: &str, state: TaskState, desired: TaskState) -> Task {
    Task {
        id: id.into(),
        node_id: node.into(),
        service_id: "svc".into(),
        desired_state: desired as i32,
        status: Some(TaskStatus { state: state as i32, ..Default::default() }),
        ..Default::default()
    }
}

/// Waits (10 s, every 5 ms) through the one wait helper (`crate::wait`, testkit's).
async fn wait_for(what: &str, cond: impl FnMut() -> bool) {
    crate::wait::wait_until_async(what, Duration::from_secs(10), Duration::from_millis(5), crate::wait::holds(cond))
        .await
}

async fn open_session(
    h: &Harness,
    client: &mut DispatcherClient<Channel>,
    node: &str,
) -> (String, tonic::Streaming<SessionMessage>) {
    let desc = NodeDescription { hostname: format!("host-{node}"), ..Default::default() };
    let mut stream = client
        .session(req(node, SessionRequest { description: Some(desc), session_id: String::new() }))
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert!(!first.session_id.is_empty());
    assert_eq!(first.node.as_ref().unwrap().id, node);
    assert_eq!(first.managers[0].peer.as_ref().unwrap().addr, "127.0.0.1:4242");
    let _ = h;
    (first.session_id, stream)
}

/// `node`'s assignments stream in session `sid`.
async fn open_assignments(
    client: &mut DispatcherClient<Channel>,
    node: &str,
    sid: &str,
) -> tonic::Streaming<AssignmentsMessage> {
    client.assignments(req(node, AssignmentsRequest { session_id: sid.into() })).await.unwrap().into_inner()
}

fn task_ids(msg: &AssignmentsMessage) -> Vec<(String, i32)> {
    let mut v: Vec<_> = msg
        .changes
        .iter()
        .map(|c| {
            let Some(assignment::Item::Task(t)) = c.assignment.as_ref().and_then(|a| a.item.clone()) else {
                panic!("assignment without a task")
            };
            (t.id, c.action)
        })
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn session_creates_the_node_ready_and_heartbeat_expiry_marks_it_down() {
    let h = harness().await;
    let mut client = h.client().await;
    let (session_id, _stream) = open_session(&h, &mut client, "node-1").await;
    assert_eq!(h.node_state("node-1"), Some(node_status::State::Ready as i32));
    let node = h.state.store.view(|t| t.nodes().get("node-1").cloned()).unwrap();
    assert_eq!(node.description.as_ref().unwrap().hostname, "host-node-1");
    assert_eq!(node.status.as_ref().unwrap().addr, "127.0.0.1");
    assert_eq!(node.spec.as_ref().unwrap().membership, shoal_api::node_spec::Membership::Accepted as i32);

    let resp = client.heartbeat(req("node-1", HeartbeatRequest { session_id: session_id.clone() })).await.unwrap();
    assert_eq!(resp.into_inner().period.unwrap().seconds, 5);

    // 3 periods of 5 s minus a little (the timer includes the real time the test takes): still up.
    h.advance_ms(14_000);
    assert!(h.dispatcher.expire_heartbeats(crate::Timer::now_ms(&*h.timer)).await.is_empty());
    assert_eq!(h.node_state("node-1"), Some(node_status::State::Ready as i32));
    h.advance_ms(1_000);
    wait_for("node down", || h.node_state("node-1") == Some(node_status::State::Down as i32)).await;
    let msg = h.state.store.view(|t| t.nodes().get("node-1").unwrap().status.clone().unwrap().message);
    assert_eq!(msg, "heartbeat failure");

    // The expired session is gone: the agent is told to open a new one.
    let err = client.heartbeat(req("node-1", HeartbeatRequest { session_id })).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    // A new session brings the node back.
    let (_sid, _s) = open_session(&h, &mut client, "node-1").await;
    assert_eq!(h.node_state("node-1"), Some(node_status::State::Ready as i32));
}

#[tokio::test]
async fn a_new_session_replaces_the_old_one() {
    let h = harness().await;
    let mut client = h.client().await;
    let (old, mut old_stream) = open_session(&h, &mut client, "node-1").await;
    let (new, _s) = open_session(&h, &mut client, "node-1").await;
    assert_ne!(old, new);
    // The old stream ends (after, possibly, the node update the new session wrote).
    let ended =
        tokio::time::timeout(Duration::from_secs(10), async { while let Ok(Some(_)) = old_stream.message().await {} })
            .await;
    assert!(ended.is_ok(), "the replaced session's stream did not end");
    let err = client.heartbeat(req("node-1", HeartbeatRequest { session_id: old })).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    client.heartbeat(req("node-1", HeartbeatRequest { session_id: new })).await.unwrap();
}

#[tokio::test]
async fn assignments_send_a_complete_set_then_increments() {
    let h = harness().await;
    h.put_task(task("t1", "node-1", TaskState::Assigned, TaskState::Running)).await;
    h.put_task(task("t-pending", "node-1", TaskState::Pending, TaskState::Running)).await;
    h.put_task(task("t-other", "node-2", TaskState::Assigned, TaskState::Running)).await;
    let mut client = h.client().await;
    let (sid, _s) = open_session(&h, &mut client, "node-1").await;
    let mut stream = open_assignments(&mut client, "node-1", &sid).await;
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.r#type, assignments_message::Type::Complete as i32);
    assert_eq!(task_ids(&first), vec![("t1".into(), AssignmentAction::Update as i32)]);

    // A new task for the node.
    h.put_task(task("t2", "node-1", TaskState::Assigned, TaskState::Running)).await;
    let msg = stream.message().await.unwrap().unwrap();
    assert_eq!(msg.r#type, assignments_message::Type::Incremental as i32);
    assert_eq!(msg.applies_to, first.results_in);
    assert_eq!(task_ids(&msg), vec![("t2".into(), AssignmentAction::Update as i32)]);

    // The agent's own status report is not echoed; the desired-state change after it is.
    client.update_task_status(status_report("node-1", &sid, "t1", TaskState::Running)).await.unwrap();
    assert_eq!(h.task("t1").status.unwrap().state, TaskState::Running as i32);
    let mut t1 = h.task("t1");
    t1.desired_state = TaskState::Shutdown as i32;
    h.put_task(t1).await;
    let msg = stream.message().await.unwrap().unwrap();
    assert_eq!(task_ids(&msg), vec![("t1".into(), AssignmentAction::Update as i32)]);
    let Some(assignment::Item::Task(sent)) = msg.changes[0].assignment.clone().unwrap().item else { panic!() };
    assert_eq!(sent.desired_state, TaskState::Shutdown as i32);

    // Deleting a task sends REMOVE.
    let t2 = h.state.store.view(|t| t.tasks().get("t2").cloned()).unwrap();
    let mut c = Changes::new();
    c.remove(t2);
    h.state.propose(c).await.unwrap();
    let msg = stream.message().await.unwrap().unwrap();
    assert_eq!(task_ids(&msg), vec![("t2".into(), AssignmentAction::Remove as i32)]);
}

#[tokio::test]
async fn status_updates_move_forward_and_ignore_stale_or_foreign_reports() {
    let h = harness().await;
    h.put_task(task("t1", "node-1", TaskState::Assigned, TaskState::Running)).await;
    h.put_task(task("t9", "node-2", TaskState::Assigned, TaskState::Running)).await;
    let mut client = h.client().await;
    let (sid, _s) = open_session(&h, &mut client, "node-1").await;
    let send = |updates: Vec<(&str, TaskState)>| {
        let updates = updates
            .into_iter()
            .map(|(id, st)| TaskStatusUpdate {
                task_id: id.into(),
                status: Some(TaskStatus { state: st as i32, message: st.docker_name().into(), ..Default::default() }),
            })
            .collect();
        req("node-1", UpdateTaskStatusRequest { session_id: sid.clone(), updates })
    };
    client.update_task_status(send(vec![("t1", TaskState::Running)])).await.unwrap();
    assert_eq!(h.task("t1").status.unwrap().state, TaskState::Running as i32);
    // Backwards: ignored, still OK for the agent.
    client.update_task_status(send(vec![("t1", TaskState::Preparing)])).await.unwrap();
    assert_eq!(h.task("t1").status.unwrap().state, TaskState::Running as i32);
    // Another node's task and a missing task: ignored; a valid one in the same request applies.
    client
        .update_task_status(send(vec![
            ("t9", TaskState::Failed),
            ("nope", TaskState::Failed),
            ("t1", TaskState::Complete),
        ]))
        .await
        .unwrap();
    assert_eq!(h.task("t9").status.unwrap().state, TaskState::Assigned as i32);
    assert_eq!(h.task("t1").status.unwrap().state, TaskState::Complete as i32);
    // A bad session id is refused.
    let mut bad = send(vec![("t1", TaskState::Complete)]);
    bad.get_mut().session_id = "nope".into();
    assert_eq!(client.update_task_status(bad).await.unwrap_err().code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn rpcs_need_identity_and_leadership() {
    let h = harness().await;
    let mut client = h.client().await;
    let err = client.heartbeat(Request::new(HeartbeatRequest { session_id: "x".into() })).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    let (sid, mut stream) = open_session(&h, &mut client, "node-1").await;
    h.proposer.set_leader(false);
    // The open session stream ends with "unavailable".
    let end = tokio::time::timeout(Duration::from_secs(10), stream.message()).await.unwrap();
    assert_eq!(end.unwrap_err().code(), tonic::Code::Unavailable);
    let err = client.heartbeat(req("node-1", HeartbeatRequest { session_id: sid })).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    let err = client
        .session(req("node-1", SessionRequest { description: None, session_id: String::new() }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
}

#[tokio::test]
async fn becoming_leader_gives_ready_nodes_a_grace_period() {
    let h = harness().await;
    let mut client = h.client().await;
    let (_sid, _s) = open_session(&h, &mut client, "node-1").await;
    h.dispatcher.registry.lock().heartbeats.forget("node-1");
    h.advance_ms(60_000);
    let now = crate::Timer::now_ms(&*h.timer);
    h.dispatcher.grant_grace_period(now);
    // Twice the 15 s time to live (5 s period x 3 missed heartbeats).
    assert!(h.dispatcher.expire_heartbeats(now + 29_999).await.is_empty());
    assert_eq!(h.dispatcher.expire_heartbeats(now + 30_000).await, vec!["node-1".to_string()]);
    assert_eq!(h.node_state("node-1"), Some(node_status::State::Down as i32));
}

#[tokio::test]
async fn a_follower_names_the_leader_when_it_refuses_a_session() {
    let h = harness().await;
    // The leader (Raft ID 1 for the LocalProposer) is a manager node with a known address.
    let mut c = Changes::new();
    c.create(Node {
        id: "manager-1".into(),
        manager_status: Some(shoal_api::ManagerStatus {
            raft_id: 1,
            addr: "10.0.0.1:4242".into(),
            leader: true,
            reachability: 2,
        }),
        ..Default::default()
    });
    h.state.propose(c).await.unwrap();
    h.proposer.set_leader(false);
    let mut client = h.client().await;
    let err = client
        .session(req("node-1", SessionRequest { description: None, session_id: String::new() }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    let hint = err.metadata().get(shoal_raft::grpc::LEADER_ADDR_METADATA).map(|v| v.to_str().unwrap().to_string());
    assert_eq!(hint.as_deref(), Some("10.0.0.1:4242"));
}

fn manager_node(id: &str, addr: &str) -> Node {
    Node {
        id: id.into(),
        manager_status: Some(shoal_api::ManagerStatus {
            raft_id: 2,
            addr: addr.into(),
            leader: false,
            reachability: shoal_api::raft_member_status::Reachability::Reachable as i32,
        }),
        ..Default::default()
    }
}

fn listed(msg: &SessionMessage) -> Vec<String> {
    msg.managers.iter().map(|p| p.peer.as_ref().unwrap().addr.clone()).collect()
}

#[tokio::test]
async fn session_messages_list_every_reachable_manager_and_follow_changes() {
    let h = harness().await;
    let mut c = Changes::new();
    c.create(manager_node("manager-2", "127.0.0.2:4242"));
    h.state.propose(c).await.unwrap();
    let mut client = h.client().await;
    let mut stream = client.session(req("node-1", SessionRequest::default())).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().unwrap();
    // This manager (its configured address) and the other manager the store knows.
    assert_eq!(listed(&first), vec!["127.0.0.1:4242", "127.0.0.2:4242"]);
    assert_eq!(first.managers[1].peer.as_ref().unwrap().node_id, "manager-2");
    assert!(first.managers.iter().all(|p| p.weight == MANAGER_WEIGHT));

    // A third manager joins: every open session is told, with its node.
    let mut c = Changes::new();
    c.create(manager_node("manager-3", "127.0.0.3:4242"));
    h.state.propose(c).await.unwrap();
    let msg = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let m = stream.message().await.unwrap().unwrap();
            if m.managers.len() == 3 {
                return m;
            }
        }
    })
    .await
    .expect("a session message with the new manager");
    assert_eq!(listed(&msg), vec!["127.0.0.1:4242", "127.0.0.2:4242", "127.0.0.3:4242"]);
    assert_eq!(msg.node.as_ref().unwrap().id, "node-1", "the node rides along");

    // manager-2 becomes unreachable: it leaves the list.
    let mut m2 = h.state.store.view(|t| (**t.nodes().get("manager-2").unwrap()).clone());
    m2.manager_status.as_mut().unwrap().reachability = shoal_api::raft_member_status::Reachability::Unreachable as i32;
    let mut c = Changes::new();
    c.update(m2);
    h.state.propose(c).await.unwrap();
    let msg = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let m = stream.message().await.unwrap().unwrap();
            if m.managers.len() == 2 {
                return m;
            }
        }
    })
    .await
    .expect("a session message without the unreachable manager");
    assert_eq!(listed(&msg), vec!["127.0.0.1:4242", "127.0.0.3:4242"]);
}

/// A worker cut off (no heartbeats) goes DOWN; the orchestrator (played here) tells its task to shut down
/// and places a replacement elsewhere. When the worker opens a new session, its node is READY again and its
/// complete assignment set holds the stale task with desired SHUTDOWN, so its agent stops it; the stop it
/// reports is accepted.
#[tokio::test]
async fn a_returning_node_is_ready_again_and_is_told_to_stop_its_replaced_tasks() {
    let h = harness().await;
    h.put_task(task("t1", "node-1", TaskState::Running, TaskState::Running)).await;
    let mut client = h.client().await;
    let (_old, _s) = open_session(&h, &mut client, "node-1").await;
    h.advance_ms(15_000);
    wait_for("node down", || h.node_state("node-1") == Some(node_status::State::Down as i32)).await;
    let mut stale = h.task("t1");
    stale.desired_state = TaskState::Shutdown as i32;
    h.put_task(stale).await;
    h.put_task(task("t2", "node-2", TaskState::Assigned, TaskState::Running)).await;

    let (sid, _s) = open_session(&h, &mut client, "node-1").await;
    assert_eq!(h.node_state("node-1"), Some(node_status::State::Ready as i32));
    let mut assignments = open_assignments(&mut client, "node-1", &sid).await;
    let first = assignments.message().await.unwrap().unwrap();
    assert_eq!(first.r#type, assignments_message::Type::Complete as i32);
    let tasks: Vec<Task> = first
        .changes
        .iter()
        .filter_map(|c| match c.assignment.as_ref()?.item.as_ref()? {
            assignment::Item::Task(t) => Some(t.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(tasks.len(), 1, "only its own task: {tasks:?}");
    assert_eq!(tasks[0].id, "t1");
    assert_eq!(tasks[0].desired_state, TaskState::Shutdown as i32);

    client.update_task_status(status_report("node-1", &sid, "t1", TaskState::Shutdown)).await.unwrap();
    assert_eq!(h.task("t1").status.unwrap().state, TaskState::Shutdown as i32);
}

#[tokio::test]
async fn incremental_assignments_of_big_tasks_are_bounded_in_bytes() {
    use shoal_api::prost::Message;
    let h = harness().await;
    let mut client = h.client().await.max_decoding_message_size(64 << 20);
    let (sid, _s) = open_session(&h, &mut client, "node-1").await;
    let mut stream = open_assignments(&mut client, "node-1", &sid).await;
    let first = stream.message().await.unwrap().unwrap();
    assert!(first.changes.is_empty());
    // Ten tasks of 3 MB each, one commit each, queued faster than the stream sends them: 30 MB in all.
    for i in 0..10 {
        let mut t = task(&format!("big-{i}"), "node-1", TaskState::Assigned, TaskState::Running);
        t.service_annotations = Some(shoal_api::Shared::new(shoal_api::Annotations {
            name: "big".into(),
            labels: [("big".to_string(), "x".repeat(3_000_000))].into(),
            ..Default::default()
        }));
        h.put_task(t).await;
    }
    let mut seen = 0;
    let mut messages = 0;
    while seen < 10 {
        let msg = stream.message().await.unwrap().unwrap();
        let len = msg.encoded_len();
        assert!(len <= ASSIGNMENT_BATCH_MAX_BYTES + (4 << 20), "a message of {len} bytes");
        seen += msg.changes.len();
        messages += 1;
    }
    assert_eq!(seen, 10);
    assert!(messages >= 2, "30 MB of tasks cannot go in one message under the bound");
}

/// Found by the simulation (`shoal-sim`, seeds 4, 7, 17, 21, 23, 25 of 30): heartbeat deadlines were read
/// on the wall clock, so a step of the leader's clock (NTP, a VM resumed) past the 15 s time to live marked
/// every node down at once and had their tasks replaced while they still ran. Deadlines follow the
/// monotonic timer, as SwarmKit's timers do: a wall-clock step expires nothing; the timer still does.
#[tokio::test]
async fn a_wall_clock_step_marks_no_node_down() {
    let h = harness().await;
    let mut client = h.client().await;
    let (_sid, _s) = open_session(&h, &mut client, "node-1").await;
    h.clock.advance_ms(3_600_000);
    let now = crate::Timer::now_ms(&*h.timer);
    assert!(h.dispatcher.expire_heartbeats(now).await.is_empty(), "a clock step expired a heartbeat");
    assert_eq!(h.node_state("node-1"), Some(node_status::State::Ready as i32));
    assert_eq!(h.dispatcher.expire_heartbeats(now + 15_000).await, vec!["node-1".to_string()]);
}

/// A COMPLETE set stays within `COMPLETE_MAX_BYTES` (48 MiB, under the 64 MiB an agent decodes): past it the
/// node's finished tasks are left out; a set whose live tasks alone exceed it ends the stream with
/// RESOURCE_EXHAUSTED naming the sizes, instead of a message the agent cannot decode.
#[tokio::test]
async fn a_complete_set_is_bounded_in_bytes() {
    use shoal_api::prost::Message;
    let h = harness().await;
    let mut client = h.client().await.max_decoding_message_size(64 << 20);
    let (sid, _s) = open_session(&h, &mut client, "node-1").await;
    let big = |id: String, state: TaskState, desired: TaskState| {
        let mut t = task(&id, "node-1", state, desired);
        t.service_annotations = Some(shoal_api::Shared::new(shoal_api::Annotations {
            name: "big".into(),
            labels: [("big".to_string(), "x".repeat(3_000_000))].into(),
            ..Default::default()
        }));
        t
    };
    // 9 running and 9 finished tasks of 3 MB: 54 MB in all, over the bound; 27 MB without the finished.
    for i in 0..9 {
        h.put_task(big(format!("live-{i}"), TaskState::Running, TaskState::Running)).await;
        h.put_task(big(format!("done-{i}"), TaskState::Failed, TaskState::Shutdown)).await;
    }
    let mut stream = open_assignments(&mut client, "node-1", &sid).await;
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.r#type, assignments_message::Type::Complete as i32);
    assert!(first.encoded_len() <= COMPLETE_MAX_BYTES + 1024, "{} bytes", first.encoded_len());
    let ids: Vec<String> = first
        .changes
        .iter()
        .filter_map(|c| match c.assignment.as_ref()?.item.as_ref()? {
            assignment::Item::Task(t) => Some(t.id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(ids.len(), 9, "{ids:?}");
    assert!(ids.iter().all(|id| id.starts_with("live-")), "{ids:?}");
    drop(stream);
    // 17 running tasks: 51 MB the agent must have; refused.
    for i in 9..17 {
        h.put_task(big(format!("live-{i}"), TaskState::Running, TaskState::Running)).await;
    }
    let mut stream = open_assignments(&mut client, "node-1", &sid).await;
    let err = stream.message().await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains(&format!("{COMPLETE_MAX_BYTES} bytes")), "{}", err.message());
}

/// The cluster's network keys (the key manager's) ride in every session message, and a rotation written to
/// the cluster object reaches every open session as a new message.
#[tokio::test]
async fn session_messages_carry_the_network_keys_and_follow_their_rotation() {
    use crate::keymanager::Keyring;
    use rand::SeedableRng;
    let h = harness().await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let ring = Keyring::default().completed(&mut rng).unwrap();
    let mut cluster = shoal_api::Cluster { id: "c1".into(), ..Default::default() };
    ring.store_in(&mut cluster);
    let mut c = Changes::new();
    c.create(cluster);
    h.state.propose(c).await.unwrap();
    let mut client = h.client().await;
    let mut stream = client.session(req("node-1", SessionRequest::default())).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.network_bootstrap_keys, ring.keys);

    // A rotation (what the key manager writes every 12 hours).
    let rotated = ring.rotated(&mut rng);
    let mut cluster = h.state.store.view(|t| (**t.clusters().get("c1").unwrap()).clone());
    rotated.store_in(&mut cluster);
    let mut c = Changes::new();
    c.update(cluster);
    h.state.propose(c).await.unwrap();
    let msg = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let m = stream.message().await.unwrap().unwrap();
            if m.network_bootstrap_keys != ring.keys {
                return m;
            }
        }
    })
    .await
    .expect("a session message with the rotated keys");
    assert_eq!(msg.network_bootstrap_keys, rotated.keys);
    assert_eq!(msg.node.as_ref().unwrap().id, "node-1", "the node rides along");
    assert_eq!(listed(&msg), vec!["127.0.0.1:4242"], "and the managers");
}

/// A session request of `node` reporting `desc`.
fn session_req(node: &str, desc: NodeDescription) -> Request<SessionRequest> {
    req(node, SessionRequest { description: Some(desc), session_id: String::new() })
}

fn node_version(h: &Harness, id: &str) -> Option<u64> {
    h.state.store.view(|t| t.nodes().get(id).map(|n| n.version()))
}

#[tokio::test]
async fn descriptions_are_bounded_written_only_when_changed_and_rate_limited() {
    use crate::limits::{MAX_ENGINE_LABEL_BYTES, MAX_NODE_DESCRIPTION_BYTES};
    use registrations::{REGISTRATION_BURST, REGISTRATION_REFILL_MS};
    let h = harness().await;
    let mut client = h.client().await;
    let engine = |labels: &[(&str, usize)]| shoal_api::EngineDescription {
        labels: labels.iter().map(|(k, n)| (k.to_string(), "v".repeat(*n))).collect(),
        ..Default::default()
    };
    let desc = |hostname: &str, labels: &[(&str, usize)]| NodeDescription {
        hostname: hostname.into(),
        engine: Some(engine(labels)),
        ..Default::default()
    };

    // Oversized parts are refused before anything is written.
    let cases = [
        (desc(&"h".repeat(300), &[]), "Description.Hostname is 300 bytes"),
        (desc("h", &[("big", MAX_ENGINE_LABEL_BYTES)]), "Description.Engine.Labels"),
        (
            NodeDescription {
                hostname: "h".into(),
                resources: Some(shoal_api::Resources { generic: vec![Default::default(); 2000], ..Default::default() }),
                ..Default::default()
            },
            "Description.Resources.Generic: the count 2000 is too large",
        ),
        (
            NodeDescription {
                hostname: "h".into(),
                tls_info: Some(shoal_api::NodeTlsInfo {
                    trust_root: vec![7; MAX_NODE_DESCRIPTION_BYTES],
                    ..Default::default()
                }),
                ..Default::default()
            },
            "over the limit of 65536 bytes",
        ),
    ];
    for (d, want) in cases {
        let err = client.session(session_req("node-1", d)).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains(want), "{:?} should contain {want:?}", err.message());
    }
    assert_eq!(node_version(&h, "node-1"), None, "a refused session created no node");

    // The first session writes; the same description again writes nothing, as often as it comes.
    let same = desc("host-1", &[("a", 1000)]);
    let _s = client.session(session_req("node-1", same.clone())).await.unwrap().into_inner();
    let v1 = node_version(&h, "node-1").unwrap();
    for _ in 0..3 * REGISTRATION_BURST {
        let _s = client.session(session_req("node-1", same.clone())).await.unwrap().into_inner();
    }
    assert_eq!(node_version(&h, "node-1"), Some(v1), "an unchanged description is not written again");

    // Changed descriptions: the burst (one was taken by the creation), then a refusal naming the wait.
    for i in 1..REGISTRATION_BURST {
        let _s = client.session(session_req("node-1", desc("host-1", &[("a", 1000 + i as usize)]))).await.unwrap();
    }
    let before = node_version(&h, "node-1");
    let err = client.session(session_req("node-1", desc("host-1", &[("a", 5000)]))).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    let retry = format!("retry in {} s", REGISTRATION_REFILL_MS.div_ceil(1000));
    assert!(err.message().contains("too often") && err.message().contains(&retry), "{}", err.message());
    assert_eq!(node_version(&h, "node-1"), before, "a refused session wrote nothing");
    // Another node is not affected; after a refill period the node may write once more.
    let _o = client.session(session_req("node-2", desc("host-2", &[]))).await.unwrap();
    h.advance_ms(REGISTRATION_REFILL_MS);
    let _s = client.session(session_req("node-1", desc("host-1", &[("a", 5000)]))).await.unwrap();
    assert_ne!(node_version(&h, "node-1"), before);
    assert!(client.session(session_req("node-1", desc("host-1", &[("a", 6000)]))).await.is_err());
}

#[tokio::test]
async fn oversized_task_statuses_are_refused_and_nothing_is_written() {
    let h = harness().await;
    let mut client = h.client().await;
    let (sid, _stream) = open_session(&h, &mut client, "node-1").await;
    h.put_task(task("t1", "node-1", TaskState::Assigned, TaskState::Running)).await;
    let mut r = status_report("node-1", &sid, "t1", TaskState::Running);
    r.get_mut().updates[0].status.as_mut().unwrap().err = "e".repeat(9000);
    let err = client.update_task_status(r).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("the status of task t1: Err is 9000 bytes"), "{}", err.message());
    assert_eq!(h.task("t1").status.unwrap().state, TaskState::Assigned as i32);
    client.update_task_status(status_report("node-1", &sid, "t1", TaskState::Running)).await.unwrap();
    assert_eq!(h.task("t1").status.unwrap().state, TaskState::Running as i32);
}

/// `SessionMessage.RootCA` is the cluster's root certificate, as SwarmKit's dispatcher sends it: the old root
/// while a rotation lasts, the new one once it is over; the start and the end of a rotation each reach every
/// open session as a new message.
#[tokio::test]
async fn session_messages_carry_the_cluster_root_and_follow_a_rotation() {
    async fn next(s: &mut tonic::Streaming<SessionMessage>) -> SessionMessage {
        tokio::time::timeout(Duration::from_secs(10), s.message())
            .await
            .expect("a session message within 10 s")
            .unwrap()
            .expect("an open session")
    }
    let h = harness().await;
    let now = std::time::SystemTime::UNIX_EPOCH + Duration::from_millis(START_MS);
    let old = crate::ca::new_root_ca(now).unwrap();
    let mut c = Changes::new();
    c.create(shoal_api::Cluster { id: "c1".into(), root_ca: Some(old.clone()), ..Default::default() });
    h.state.propose(c).await.unwrap();
    let write_root = |rc: shoal_api::RootCa| {
        let mut cluster = h.state.store.view(|t| (**t.clusters().get("c1").unwrap()).clone());
        cluster.root_ca = Some(rc);
        let mut c = Changes::new();
        c.update(cluster);
        h.state.propose(c)
    };
    let mut client = h.client().await;
    let mut sessions = Vec::new();
    for node in ["node-1", "node-2"] {
        let mut s = client.session(req(node, SessionRequest::default())).await.unwrap().into_inner();
        assert_eq!(next(&mut s).await.root_ca, old.ca_cert, "the first message carries the cluster's root");
        sessions.push(s);
    }

    // A rotation starts: every session gets a message, still with the old root (the nodes trust it until the
    // rotation is over; the certificates they are issued meanwhile chain to it through the cross-signed root).
    let new = crate::ca::new_root_ca(now).unwrap();
    let mut rotating = old.clone();
    rotating.root_rotation = Some(shoal_api::RootRotation {
        ca_cert: new.ca_cert.clone(),
        ca_key: new.ca_key.clone(),
        cross_signed_ca_cert: Vec::new(),
    });
    write_root(rotating.clone()).await.unwrap();
    for s in &mut sessions {
        let m = next(s).await;
        assert_eq!(m.root_ca, old.ca_cert, "during the rotation: the cluster's root, the old one");
        assert!(m.node.is_some() && !m.managers.is_empty(), "the node and the managers ride along");
    }

    // It ends: every session gets the new root alone, and a new session starts with it.
    write_root(crate::ca::rotation::finished(&rotating).unwrap()).await.unwrap();
    for s in &mut sessions {
        let m = loop {
            let m = next(s).await;
            if m.root_ca != old.ca_cert {
                break m;
            }
        };
        assert_eq!(m.root_ca, new.ca_cert, "after the rotation: the new root");
    }
    let mut late = client.session(req("node-3", SessionRequest::default())).await.unwrap().into_inner();
    assert_eq!(next(&mut late).await.root_ca, new.ca_cert);
}
