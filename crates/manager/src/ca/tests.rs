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
async fn a_joining_node_is_given_the_clusters_data_path_port() {
    let (state, ca, _) = cluster().await;
    let mut c = (*super::cluster(&state).unwrap()).clone();
    c.vxlan_udp_port = 7789;
    state
        .write(|_, ch| {
            ch.update(c);
            Ok::<(), std::convert::Infallible>(())
        })
        .await
        .unwrap();
    let csr = shoal_ca::generate_node_key_and_csr().unwrap();
    let resp =
        ca.issue_node_certificate(issue_req(&tokens(&state).worker, &csr.csr_pem, None)).await.unwrap().into_inner();
    let node = state.store.view(|t| t.nodes().get(&resp.node_id).cloned()).unwrap();
    assert_eq!(node.vxlan_udp_port, 7789, "as SwarmKit's CA copies it, for engine workers");
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
                ..Default::default()
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

fn node_reporting(id: &str, issuer: Option<&shoal_ca::IssuerInfo>) -> shoal_api::Node {
    shoal_api::Node {
        id: id.into(),
        description: issuer.map(|i| shoal_api::NodeDescription {
            tls_info: Some(shoal_api::NodeTlsInfo {
                trust_root: Vec::new(),
                cert_issuer_subject: i.subject.clone(),
                cert_issuer_public_key: i.public_key.clone(),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_forced_rotation_signs_from_the_new_root_asks_every_node_to_renew_and_finishes_with_new_tokens() {
    let (state, ca, _) = cluster().await;
    let before = super::cluster(&state).unwrap();
    let old_tokens = tokens(&state);
    let old_issuer = shoal_ca::root_issuer_info(&before.root_ca.as_ref().unwrap().ca_cert).unwrap();
    let now = SystemTime::UNIX_EPOCH + Duration::from_millis(T0_MS);
    let mut spec = before.spec.clone().unwrap_or_default();
    spec.ca_config.get_or_insert_with(Default::default).force_rotate = 1;
    let change = rotation::plan_root_change(&before, &spec, now).unwrap();
    let rotation::RootChange::Start(r) = change.clone() else { panic!("{change:?}") };
    let new_issuer = shoal_ca::root_issuer_info(&r.ca_cert).unwrap();
    // The same spec again, with the rotation stored, changes nothing more.
    let mut rc = before.root_ca.clone().unwrap();
    rotation::apply_root_change(&mut rc, change, 1);
    state
        .write(|t, c| {
            let mut cl = (**t.clusters().get("cluster1").unwrap()).clone();
            cl.root_ca = Some(rc.clone());
            c.update(cl);
            c.create(node_reporting("n-old", Some(&old_issuer)));
            c.create(node_reporting("n-silent", None));
            Ok::<(), std::convert::Infallible>(())
        })
        .await
        .unwrap();
    let during = super::cluster(&state).unwrap();
    assert_eq!(rotation::plan_root_change(&during, &spec, now).unwrap(), rotation::RootChange::Keep);
    assert_eq!(rotation::trust_bundle(&during).windows(27).filter(|w| w == b"-----BEGIN CERTIFICATE-----").count(), 2);

    // Joining now gives a certificate from the new root with the cross-signed root after it.
    let csr = shoal_ca::generate_node_key_and_csr().unwrap();
    let resp = ca.issue_node_certificate(issue_req(&old_tokens.worker, &csr.csr_pem, None)).await.unwrap().into_inner();
    let pem = state.store.view(|t| t.nodes().get(&resp.node_id).unwrap().certificate.clone().unwrap().certificate);
    assert_eq!(shoal_ca::parse_cert_pem_chain(&pem).unwrap().len(), 2, "leaf and cross-signed root");
    assert_eq!(shoal_ca::cert_issuer_info(&pem, &rc.ca_cert).unwrap(), new_issuer);

    // The reconciler asks the two nodes without a new certificate to renew (not the one just issued).
    let (changes, progress) = state.store.view(rotation::reconcile);
    assert_eq!(progress, rotation::RotationProgress { nodes: 3, done: 0 });
    assert_eq!(changes.len(), 2, "n-old and n-silent marked ROTATE");
    state.propose(changes).await.unwrap();
    let (changes, _) = state.store.view(rotation::reconcile);
    assert!(changes.is_empty(), "nodes already asked are not asked again");

    // Once every node reports the new issuer, the root is replaced and the tokens change.
    state
        .write(|t, c| {
            for id in ["n-old", "n-silent", resp.node_id.as_str()] {
                let mut n = (**t.nodes().get(id).unwrap()).clone();
                n.description = node_reporting(id, Some(&new_issuer)).description;
                c.update(n);
            }
            Ok::<(), std::convert::Infallible>(())
        })
        .await
        .unwrap();
    let (changes, progress) = state.store.view(rotation::reconcile);
    assert_eq!(progress, rotation::RotationProgress { nodes: 3, done: 3 });
    state.propose(changes).await.unwrap();
    let after = super::cluster(&state).unwrap();
    let rc_after = after.root_ca.clone().unwrap();
    assert!(rc_after.root_rotation.is_none());
    assert_eq!(rc_after.ca_cert, r.ca_cert);
    assert_eq!(rc_after.ca_cert_hash, shoal_ca::ca_cert_hash(&r.ca_cert));
    let new_tokens = rc_after.join_tokens.unwrap();
    assert_eq!(shoal_ca::parse_join_token(&new_tokens.worker).unwrap().ca_digest, shoal_ca::cert_digest(&r.ca_cert));
    let csr = shoal_ca::generate_node_key_and_csr().unwrap();
    let err = ca.issue_node_certificate(issue_req(&old_tokens.worker, &csr.csr_pem, None)).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "the token from before is refused");
}

#[test]
fn a_given_root_needs_its_key_or_an_external_ca_and_going_back_cancels() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_millis(T0_MS);
    let current = Cluster { id: "c".into(), root_ca: Some(new_root_ca(now).unwrap()), ..Default::default() };
    let given = shoal_ca::RootCa::generate(now, &mut rand::rng()).unwrap();
    let with = |cert: &str, key: &str, external: bool| shoal_api::ClusterSpec {
        ca_config: Some(shoal_api::CaConfig {
            signing_ca_cert: cert.as_bytes().to_vec(),
            signing_ca_key: key.as_bytes().to_vec(),
            external_cas: if external {
                vec![shoal_api::ExternalCa {
                    url: "https://ca.example".into(),
                    ca_cert: cert.as_bytes().to_vec(),
                    ..Default::default()
                }]
            } else {
                Vec::new()
            },
            ..Default::default()
        }),
        ..Default::default()
    };
    let e = rotation::plan_root_change(&current, &with(given.cert_pem(), "", false), now).unwrap_err();
    assert!(e.contains("needs an external CA"), "{e}");
    let rotation::RootChange::Start(r) =
        rotation::plan_root_change(&current, &with(given.cert_pem(), "", true), now).unwrap()
    else {
        panic!("a rotation")
    };
    assert!(r.ca_key.is_empty(), "the external CA holds the key");
    let rotation::RootChange::Start(r) =
        rotation::plan_root_change(&current, &with(given.cert_pem(), given.key_pem(), false), now).unwrap()
    else {
        panic!("a rotation")
    };
    assert_eq!(r.ca_key, given.key_pem().as_bytes());
    let mut during = current.clone();
    let old_cert = String::from_utf8(current.root_ca.as_ref().unwrap().ca_cert.clone()).unwrap();
    let old_key = String::from_utf8(current.root_ca.as_ref().unwrap().ca_key.clone()).unwrap();
    during.root_ca.as_mut().unwrap().root_rotation = Some(r);
    assert_eq!(
        rotation::plan_root_change(&during, &with(&old_cert, &old_key, false), now).unwrap(),
        rotation::RootChange::Cancel
    );
    let e = rotation::plan_root_change(&current, &with("", given.key_pem(), false), now).unwrap_err();
    assert!(e.contains("without SigningCACert"), "{e}");
}
