//! The protobuf messages of the remote gRPC port: every request an agent or another manager can send
//! (Dispatcher, CA, NodeCA, Raft, RaftMembership, RaftProposals, LogBroker, ResourceAllocator) and the
//! messages an agent receives from a manager, decoded with prost; the parts a handler reaches without a network are run
//! too: a forwarded proposal's request is decoded as the leader does, a membership list as a joining
//! manager does, `NodeCA.IssueNodeCertificate` runs in full against an in-memory cluster, and
//! `Dispatcher.UpdateTaskStatus`'s updates are checked and applied as the dispatcher's flusher does.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use shoal_api::node_ca_server::NodeCa as _;
use shoal_api::prost::Message;
use shoal_api::{
    AssignmentsMessage, AssignmentsRequest, AttachNetworkRequest, Cluster, ClusterSnapshot, DetachNetworkRequest,
    ForwardProposalRequest, HeartbeatRequest, IssueNodeCertificateRequest, JoinRequest, JoinResponse, LeaveRequest,
    ListenSubscriptionsRequest, NodeCertificateStatusRequest, ProcessRaftMessageRequest, PublishLogsMessage,
    ResolveAddressRequest, RootCa as RootCaProto, SessionMessage, SessionRequest, StreamRaftMessageRequest,
    SubscribeLogsRequest, SubscriptionMessage, Task, TaskState, TaskStatus, UpdateTaskStatusRequest,
};
use shoal_ca::{NodeSubject, Role};
use shoal_manager::{apply_updates, check_update, StatusUpdate};
use shoal_manager::{new_root_ca, CaService, PeerIdentity};
use shoal_manager::{ClusterState, RandomIds};
use shoal_raft::{LocalProposer, Members};
use shoal_store::{Changes, ManualClock, MemoryStore};

use super::split_selector;

/// The clock of the in-memory cluster (2027-01-15).
const NOW_MS: u64 = 1_800_000_000_000;

/// One message decoded as type `M`; its re-encoding must decode to the same message.
fn round_trip<M: Message + Default + PartialEq + std::fmt::Debug>(bytes: &[u8]) -> Option<M> {
    let m = M::decode(bytes).ok()?;
    let again = M::decode(m.encode_to_vec().as_slice()).expect("a message prost encoded decodes");
    assert_eq!(again, m, "prost round trip changed the message");
    Some(m)
}

/// Every request message of the remote port, chosen by the first byte, plus what the server does with
/// it before any network or Raft step.
pub fn requests(data: &[u8]) {
    let (sel, bytes) = split_selector(data);
    match sel % 20 {
        0 => drop(round_trip::<SessionRequest>(bytes)),
        1 => drop(round_trip::<HeartbeatRequest>(bytes)),
        2 => drop(round_trip::<UpdateTaskStatusRequest>(bytes)),
        3 => drop(round_trip::<AssignmentsRequest>(bytes)),
        4 => drop(round_trip::<IssueNodeCertificateRequest>(bytes)),
        5 => drop(round_trip::<NodeCertificateStatusRequest>(bytes)),
        6 => {
            if let Some(m) = round_trip::<ProcessRaftMessageRequest>(bytes) {
                super::raft::message(&m.message);
            }
        }
        7 => {
            if let Some(m) = round_trip::<StreamRaftMessageRequest>(bytes) {
                super::raft::message(&m.message);
            }
        }
        8 => drop(round_trip::<ResolveAddressRequest>(bytes)),
        9 => drop(round_trip::<JoinRequest>(bytes)),
        10 => drop(round_trip::<LeaveRequest>(bytes)),
        11 => {
            if let Some(m) = round_trip::<ForwardProposalRequest>(bytes) {
                super::store::proposal(&m.request);
            }
        }
        12 => drop(round_trip::<ListenSubscriptionsRequest>(bytes)),
        13 => drop(round_trip::<PublishLogsMessage>(bytes)),
        14 => drop(round_trip::<SubscribeLogsRequest>(bytes)),
        // What a joining manager and an agent receive from a manager.
        15 => {
            if let Some(r) = round_trip::<JoinResponse>(bytes) {
                let m = Members::from_wire(&ClusterSnapshot { members: r.members, removed: r.removed_members });
                let _ = Members::from_wire(&m.to_wire());
            }
        }
        16 => drop(round_trip::<SessionMessage>(bytes)),
        17 => drop(round_trip::<AttachNetworkRequest>(bytes)),
        18 => drop(round_trip::<DetachNetworkRequest>(bytes)),
        _ => {
            drop(round_trip::<AssignmentsMessage>(bytes));
            drop(round_trip::<SubscriptionMessage>(bytes));
        }
    }
}

/// The root CA of the in-memory cluster, made once (key generation is the slow part).
fn root_ca() -> &'static RootCaProto {
    static ROOT: OnceLock<RootCaProto> = OnceLock::new();
    ROOT.get_or_init(|| {
        new_root_ca(SystemTime::UNIX_EPOCH + Duration::from_millis(NOW_MS)).expect("a root CA is generated")
    })
}

/// `NodeCA.IssueNodeCertificate` against a fresh in-memory cluster. The first byte chooses the caller: as
/// decoded (a token that matches nothing), with the cluster's worker or manager join token put in, or an
/// authenticated node renewing without a token. The CSR and everything else are the fuzzer's.
pub fn issue_node_certificate(data: &[u8]) {
    let (sel, bytes) = split_selector(data);
    let Ok(mut req) = IssueNodeCertificateRequest::decode(bytes) else { return };
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a current-thread runtime");
    runtime.block_on(async move {
        let store = Arc::new(MemoryStore::default());
        let proposer = Arc::new(LocalProposer::new(store.clone()));
        let state =
            ClusterState::new(store, proposer, Arc::new(ManualClock::new(NOW_MS)), Arc::new(RandomIds::seeded(1)));
        let root = root_ca().clone();
        let tokens = root.join_tokens.clone().unwrap_or_default();
        let cluster = Cluster { id: "cluster1".into(), root_ca: Some(root), ..Default::default() };
        state
            .write(|_, c| {
                c.create(cluster);
                Ok::<(), std::convert::Infallible>(())
            })
            .await
            .expect("the cluster object is written");
        let mut caller = None;
        match sel % 4 {
            0 => {}
            1 => req.token = tokens.worker,
            2 => req.token = tokens.manager,
            _ => {
                req.token.clear();
                caller =
                    Some(NodeSubject { node_id: "node1".into(), role: Role::Worker, cluster_id: "cluster1".into() });
            }
        }
        let mut request = tonic::Request::new(req);
        if let Some(c) = caller {
            request.extensions_mut().insert(PeerIdentity(c));
        }
        let ca = CaService::new(state.clone(), None);
        if let Ok(resp) = ca.issue_node_certificate(request).await {
            let node_id = resp.into_inner().node_id;
            let status = ca
                .node_certificate_status(tonic::Request::new(NodeCertificateStatusRequest { node_id }))
                .await
                .expect("an issued node has a certificate status");
            let pem = status.into_inner().certificate.unwrap_or_default().certificate;
            let ders = shoal_ca::parse_cert_pem_chain(&pem).expect("an issued certificate is PEM");
            shoal_ca::parse_cert(&ders[0]).expect("an issued certificate parses");
        }
    });
}

/// A store holding node1's tasks in each state an agent reports on, as the dispatcher sees them.
fn store_with_tasks() -> MemoryStore {
    let store = MemoryStore::new(4);
    let mut changes = Changes::new();
    for (i, state) in [TaskState::Assigned, TaskState::Running, TaskState::Failed].into_iter().enumerate() {
        changes.create(Task {
            id: format!("task{}", i + 1),
            service_id: "svc1".into(),
            slot: i as u64 + 1,
            node_id: "node1".into(),
            desired_state: TaskState::Running as i32,
            status: Some(TaskStatus { state: state as i32, ..Default::default() }),
            ..Default::default()
        });
    }
    changes.create(Task { id: "other".into(), node_id: "node2".into(), ..Default::default() });
    store.apply(1, changes.actions()).expect("the seed tasks are written");
    store
}

/// `Dispatcher.UpdateTaskStatus` from node1: the request decoded, its updates checked and turned into
/// store changes as the dispatcher's flusher does (`dispatcher::status`), and those applied. A task's
/// observed state must never move backwards, and node1 must not change another node's task.
pub fn update_task_status(data: &[u8]) {
    let Ok(req) = UpdateTaskStatusRequest::decode(data) else { return };
    let store = store_with_tasks();
    let updates: Vec<StatusUpdate> = req
        .updates
        .into_iter()
        .filter_map(|u| Some(StatusUpdate { node_id: "node1".into(), task_id: u.task_id, status: u.status? }))
        .collect();
    for u in &updates {
        let _ = store.view(|t| check_update(t.tasks().get(&u.task_id).map(|t| &**t), u));
    }
    let before = store.view(|t| t.tasks().iter().map(|t| (t.id.clone(), (**t).clone())).collect::<Vec<_>>());
    let now = shoal_api::prost_types::Timestamp { seconds: 1_800_000_000, nanos: 0 };
    let (changes, _skipped) = store.view(|t| apply_updates(t, &updates, &now));
    let _ = store.apply(2, changes.actions());
    for (id, old) in before {
        let new = store.view(|t| t.tasks().get(&id).cloned()).expect("no task is removed by a status update");
        let state = |t: &Task| TaskState::from_wire(t.status.as_ref().map_or(0, |s| s.state)) as i32;
        assert!(state(&new) >= state(&old), "task {id} moved backwards");
        if old.node_id != "node1" {
            assert_eq!(*new, old, "node1 changed another node's task");
        }
    }
}
