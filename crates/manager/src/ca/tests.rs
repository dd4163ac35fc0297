//! CA service tests over an in-memory store: joining with each token, refusals that change nothing
//! (wrong, rotated-away, missing token), renewal with a certificate, and a removed node's renewal.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use shoal_api::node_ca_server::NodeCa as _;
use shoal_api::{Cluster, IssueNodeCertificateRequest, NodeCertificateStatusRequest, NodeRole};
use shoal_ca::{NodeSubject, Role};
use shoal_raft::LocalProposer;
use shoal_store::{ManualClock, MemoryStore};
use tonic::{Code, Request};

use super::*;
use crate::state::{ClusterState, RandomIds};

const T0_MS: u64 = 1_800_000_000_000;

async fn cluster() -> (ClusterState, CaService, String) {
    let store = Arc::new(MemoryStore::default());
    let proposer = Arc::new(LocalProposer::new(store.clone()));
    let state = ClusterState::new(store, proposer, Arc::new(ManualClock::new(T0_MS)), Arc::new(RandomIds::seeded(9)));
    let root_ca = new_root_ca(SystemTime::UNIX_EPOCH + Duration::from_millis(T0_MS)).unwrap();
    let cluster = Cluster { id: "cluster1".into(), root_ca: Some(root_ca), ..Default::default() };
    state
        .write(|_, c| {
            c.create(cluster);
            Ok::<(), std::convert::Infallible>(())
        })
        .await
        .unwrap();
    (state.clone(), CaService::new(state, None), "cluster1".into())
}

fn tokens(state: &ClusterState) -> shoal_api::JoinTokens {
    super::cluster(state).unwrap().root_ca.clone().unwrap().join_tokens.unwrap()
}

fn issue_req(token: &str, csr: &str, caller: Option<NodeSubject>) -> Request<IssueNodeCertificateRequest> {
    let mut r = Request::new(IssueNodeCertificateRequest {
        csr: csr.as_bytes().to_vec(),
        token: token.into(),
        ..Default::default()
    });
    if let Some(c) = caller {
        r.extensions_mut().insert(PeerIdentity(c));
    }
    r
}

async fn issued_cert(ca: &CaService, node_id: &str) -> shoal_ca::CertInfo {
    let status = ca
        .node_certificate_status(Request::new(NodeCertificateStatusRequest { node_id: node_id.into() }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.status.unwrap().state, issuance_status::State::Issued as i32);
    let pem = status.certificate.unwrap().certificate;
    shoal_ca::parse_cert(&shoal_ca::parse_cert_pem_chain(&pem).unwrap()[0]).unwrap()
}

fn node_count(state: &ClusterState) -> usize {
    state.store.view(|t| t.nodes().len())
}

#[tokio::test]
async fn each_token_gives_its_role_and_the_ca_picks_the_subject() {
    let (state, ca, cluster_id) = cluster().await;
    let t = tokens(&state);
    for (token, role) in [(&t.worker, Role::Worker), (&t.manager, Role::Manager)] {
        let csr = shoal_ca::generate_node_key_and_csr().unwrap();
        let resp = ca.issue_node_certificate(issue_req(token, &csr.csr_pem, None)).await.unwrap().into_inner();
        let info = issued_cert(&ca, &resp.node_id).await;
        assert_eq!(info.subject, NodeSubject { node_id: resp.node_id.clone(), role, cluster_id: cluster_id.clone() });
        assert_eq!(
            info.not_after,
            SystemTime::UNIX_EPOCH + Duration::from_millis(T0_MS) + shoal_ca::DEFAULT_NODE_CERT_EXPIRY
        );
        let node = state.store.view(|t| t.nodes().get(&resp.node_id).cloned()).unwrap();
        let want = if role == Role::Manager { NodeRole::Manager } else { NodeRole::Worker };
        assert_eq!(node.role, want as i32);
        assert_eq!(node.spec.as_ref().unwrap().membership, shoal_api::node_spec::Membership::Accepted as i32);
    }
    assert_eq!(node_count(&state), 2);
}

#[tokio::test]
async fn refused_tokens_change_nothing() {
    let (state, ca, _) = cluster().await;
    let old = tokens(&state);
    rotate_join_tokens(&state, RotateTokens { worker: true, manager: false }).await.unwrap();
    let new = tokens(&state);
    assert_ne!(old.worker, new.worker, "rotated");
    assert_eq!(old.manager, new.manager, "the other token is kept");
    assert_eq!(
        shoal_ca::parse_join_token(&new.worker).unwrap().ca_digest,
        shoal_ca::parse_join_token(&old.worker).unwrap().ca_digest
    );
    let csr = shoal_ca::generate_node_key_and_csr().unwrap();
    // The valid token with its last character changed (to one it is not: the secret is random).
    let last = if new.worker.ends_with('x') { 'y' } else { 'x' };
    let wrong = format!("{}{last}", &new.worker[..new.worker.len() - 1]);
    let cases = [
        (old.worker.as_str(), Code::PermissionDenied, "invalid join token"),
        (wrong.as_str(), Code::PermissionDenied, "invalid join token"),
        ("", Code::Unauthenticated, "join token is required"),
    ];
    for (token, code, msg) in cases {
        let err = ca.issue_node_certificate(issue_req(token, &csr.csr_pem, None)).await.unwrap_err();
        assert_eq!(err.code(), code, "{token}: {err:?}");
        assert!(err.message().contains(msg), "{token}: {}", err.message());
    }
    assert_eq!(node_count(&state), 0, "no node object was created");
    ca.issue_node_certificate(issue_req(&new.worker, &csr.csr_pem, None)).await.unwrap();
    assert_eq!(node_count(&state), 1);
}

#[tokio::test]
async fn a_garbage_csr_is_refused() {
    let (state, ca, _) = cluster().await;
    let err = ca.issue_node_certificate(issue_req(&tokens(&state).worker, "garbage", None)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert_eq!(node_count(&state), 0);
}

#[tokio::test]
async fn renewal_keeps_the_node_and_follows_its_current_role() {
    let (state, ca, cluster_id) = cluster().await;
    let csr = shoal_ca::generate_node_key_and_csr().unwrap();
    let id = ca
        .issue_node_certificate(issue_req(&tokens(&state).worker, &csr.csr_pem, None))
        .await
        .unwrap()
        .into_inner()
        .node_id;
    let me = NodeSubject { node_id: id.clone(), role: Role::Worker, cluster_id: cluster_id.clone() };
    let csr2 = shoal_ca::generate_node_key_and_csr().unwrap();
    let resp = ca.issue_node_certificate(issue_req("", &csr2.csr_pem, Some(me.clone()))).await.unwrap().into_inner();
    assert_eq!(resp.node_id, id);
    assert_eq!(issued_cert(&ca, &id).await.subject, me);
    assert_eq!(node_count(&state), 1);

    // `docker node promote` (desired role manager, role still worker): the next renewal is a manager
    // certificate, which the node needs to join Raft.
    let mut node = (*state.store.view(|t| t.nodes().get(&id).cloned()).unwrap()).clone();
    assert_eq!(node.role, NodeRole::Worker as i32);
    node.spec.get_or_insert_with(Default::default).set_desired_role(NodeRole::Manager);
    state
        .write(|_, c| {
            c.update(node);
            Ok::<(), std::convert::Infallible>(())
        })
        .await
        .unwrap();
    ca.issue_node_certificate(issue_req("", &csr2.csr_pem, Some(me.clone()))).await.unwrap();
    assert_eq!(issued_cert(&ca, &id).await.subject.role, Role::Manager);

    // A manager in the store: the next renewal is a manager certificate too.
    let mut node = (*state.store.view(|t| t.nodes().get(&id).cloned()).unwrap()).clone();
    node.role = NodeRole::Manager as i32;
    state
        .write(|_, c| {
            c.update(node);
            Ok::<(), std::convert::Infallible>(())
        })
        .await
        .unwrap();
    ca.issue_node_certificate(issue_req("", &csr2.csr_pem, Some(me.clone()))).await.unwrap();
    assert_eq!(issued_cert(&ca, &id).await.subject.role, Role::Manager);

    // Removed: renewal refused.
    let node = state.store.view(|t| t.nodes().get(&id).cloned()).unwrap();
    state
        .write(|_, c| {
            c.remove(node);
            Ok::<(), std::convert::Infallible>(())
        })
        .await
        .unwrap();
    let err = ca.issue_node_certificate(issue_req("", &csr2.csr_pem, Some(me))).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("removed"), "{}", err.message());
}

#[test]
fn cert_expiry_has_a_one_hour_minimum_unless_overridden() {
    let with = |secs: u64| Cluster {
        spec: Some(shoal_api::ClusterSpec {
            ca_config: Some(shoal_api::CaConfig {
                node_cert_expiry: Some(shoal_api::duration_to_proto(Duration::from_secs(secs))),
                force_rotate: 0,
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(node_cert_expiry(&with(60), None), shoal_ca::MIN_NODE_CERT_EXPIRY);
    assert_eq!(node_cert_expiry(&with(7200), None), Duration::from_secs(7200));
    assert_eq!(node_cert_expiry(&Cluster::default(), None), shoal_ca::DEFAULT_NODE_CERT_EXPIRY);
    assert_eq!(node_cert_expiry(&with(7200), Some(Duration::from_secs(5))), Duration::from_secs(5));
}
