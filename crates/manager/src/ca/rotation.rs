//! Root CA rotation (SwarmKit's `controlapi/ca_rotation.go` and the root CA reconciler), and what signs
//! node certificates at any moment.
//!
//! A rotation starts from a cluster update (`plan_root_change`): `CAConfig.ForceRotate` raised (a new root
//! made here) or `CAConfig.SigningCACert` (+ `SigningCAKey`, or an external CA holding its key) naming
//! another root. `Cluster.root_ca.root_rotation` then holds the new root, its key and the new root
//! cross-signed by the old key. While it is set:
//! - the CA signs with the new root and sends the cross-signed certificate after each one (`Signer`), so
//!   nodes that trust only the old root accept the new certificates;
//! - dispatchers keep sending the cluster's root, the old one, in `SessionMessage.RootCA` (as SwarmKit's
//!   do; `dispatcher::SessionRoot`): nodes trust it until the rotation is over, and the certificates they
//!   are issued meanwhile chain to it through the cross-signed new root;
//! - the reconciler (`RootRotationReconciler`, leader only) asks every node whose reported certificate
//!   (`Node.description.tls_info`) is not from the new root to renew (`Node.certificate.status` ROTATE),
//!   and once every node in the store reports one, finishes: the new root replaces the old one, the join
//!   tokens are made again with the new root's digest (the old ones stop working) and the rotation is
//!   cleared; the session messages then carry the new root. A node that never comes back (Down, or gone
//!   after `docker swarm leave`) blocks completion until it is removed (`docker node rm`), as in SwarmKit,
//!   whose reconciler forgets only deleted nodes.
//!
//! Must not know TLS, HTTP or files.

use std::time::SystemTime;

use shoal_api::{
    issuance_status, Cluster, ClusterSpec, IssuanceStatus, JoinTokens, Node, RootCa as RootCaProto, RootRotation,
};
use shoal_ca::{IssuerInfo, RootCa};
use shoal_store::{Changes, Object, Tables, WatchError};
use tokio::sync::watch;
use tonic::Status;

use crate::state::ClusterState;
use crate::subsystem::{stopped, Subsystem, SubsystemFuture};

/// Most external CAs a cluster may list.
pub(crate) const MAX_EXTERNAL_CAS: usize = 8;
/// Longest external CA URL.
pub(crate) const MAX_EXTERNAL_CA_URL: usize = 2048;
/// Largest root certificate or key given in a spec.
pub(crate) const MAX_ROOT_PEM_BYTES: usize = 64 * 1024;
/// Most nodes asked to renew in one write.
pub(crate) const MAX_MARKS_PER_WRITE: usize = 500;
/// Pause after a failed reconciler write.
const BACKOFF_MS: u64 = 200;

fn text(bytes: &[u8], what: &str) -> Result<String, Status> {
    String::from_utf8(bytes.to_vec()).map_err(|_| Status::internal(format!("stored {what} is not PEM text")))
}

/// What signs node certificates now: the root certificate, its key when the cluster holds it, what is sent
/// after each certificate (the cross-signed new root during a rotation), and the external CAs that hold the
/// key of that root.
#[derive(Clone)]
pub(crate) struct Signer {
    /// The signing root, PEM.
    pub cert_pem: String,
    /// Its key, PEM, when the cluster holds it.
    pub key_pem: Option<String>,
    /// Appended to every issued certificate.
    pub intermediates: String,
    /// URLs of the external CAs for this root, in order.
    pub external_urls: Vec<String>,
    /// The roots the external CA's TLS certificate is checked against (every root of the cluster).
    pub trust_pem: String,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer").field("external_urls", &self.external_urls).finish_non_exhaustive()
    }
}

impl Signer {
    /// The root as a local signer, when the cluster holds its key.
    pub(crate) fn local(&self) -> Option<Result<RootCa, Status>> {
        self.key_pem.as_ref().map(|k| {
            RootCa::from_pem(&self.cert_pem, k)
                .map_err(|e| Status::internal(format!("stored root CA is unusable: {e}")))
        })
    }
}

/// The external CAs of `spec` that sign for `root_pem` (an external CA without a certificate signs for the
/// cluster's current root, `current_root`).
fn external_for(spec: Option<&ClusterSpec>, root_pem: &[u8], current_root: &[u8]) -> Vec<String> {
    let cas = spec.and_then(|s| s.ca_config.as_ref()).map(|c| c.external_cas.as_slice()).unwrap_or(&[]);
    cas.iter()
        .filter(|e| {
            let for_root: &[u8] = if e.ca_cert.is_empty() { current_root } else { &e.ca_cert };
            same_cert(for_root, root_pem)
        })
        .map(|e| e.url.clone())
        .collect()
}

/// Whether two PEM texts hold the same first certificate (whitespace and line ends aside).
fn same_cert(a: &[u8], b: &[u8]) -> bool {
    match (shoal_ca::parse_cert_pem_chain(a), shoal_ca::parse_cert_pem_chain(b)) {
        (Ok(a), Ok(b)) => a.first() == b.first(),
        _ => a == b,
    }
}

/// What signs node certificates in `cluster` now (see the module doc).
pub(crate) fn signer_of(cluster: &Cluster) -> Result<Signer, Status> {
    let rc = cluster
        .root_ca
        .as_ref()
        .filter(|r| !r.ca_cert.is_empty())
        .ok_or_else(|| Status::unavailable("the cluster has no root CA yet; retry"))?;
    let trust_pem = text(&trust_bundle(cluster), "root CA certificate")?;
    let (cert, key, intermediates) = match &rc.root_rotation {
        Some(r) => (&r.ca_cert, &r.ca_key, text(&r.cross_signed_ca_cert, "cross-signed root")?),
        None => (&rc.ca_cert, &rc.ca_key, String::new()),
    };
    Ok(Signer {
        cert_pem: text(cert, "root CA certificate")?,
        key_pem: if key.is_empty() { None } else { Some(text(key, "root CA key")?) },
        intermediates,
        external_urls: external_for(cluster.spec.as_ref(), cert, &rc.ca_cert),
        trust_pem,
    })
}

/// The cluster's roots: its root, and during a rotation the new one after it. What an external CA's TLS
/// certificate and the certificates issued during a rotation are checked against (nodes are sent the
/// cluster's root alone: `dispatcher::SessionRoot`).
pub(crate) fn trust_bundle(cluster: &Cluster) -> Vec<u8> {
    let Some(rc) = cluster.root_ca.as_ref() else { return Vec::new() };
    let mut out = rc.ca_cert.clone();
    if let Some(r) = &rc.root_rotation {
        if !out.ends_with(b"\n") {
            out.push(b'\n');
        }
        out.extend_from_slice(&r.ca_cert);
    }
    out
}

/// The issuer every node's certificate must name for the rotation to finish: the new root's.
pub(crate) fn desired_issuer(cluster: &Cluster) -> Option<IssuerInfo> {
    let rc = cluster.root_ca.as_ref()?;
    let cert = rc.root_rotation.as_ref().map(|r| &r.ca_cert).unwrap_or(&rc.ca_cert);
    shoal_ca::root_issuer_info(cert).ok()
}

/// What a cluster update does to the root CA.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RootChange {
    /// Nothing.
    Keep,
    /// Start a rotation (replacing one in progress).
    Start(RootRotation),
    /// Go back to the current root: the rotation in progress is dropped.
    Cancel,
}

/// Checks `spec`'s external CAs (SwarmKit's rules that Shoal honours): CFSSL over HTTPS, no options, a
/// certificate that parses when one is given; at most `MAX_EXTERNAL_CAS`.
pub(crate) fn check_external_cas(spec: &ClusterSpec) -> Result<(), String> {
    let cas = spec.ca_config.as_ref().map(|c| c.external_cas.as_slice()).unwrap_or(&[]);
    if cas.len() > MAX_EXTERNAL_CAS {
        return Err(format!("CAConfig.ExternalCAs lists {} signers: the limit is {MAX_EXTERNAL_CAS}", cas.len()));
    }
    for e in cas {
        if !e.url.starts_with("https://") || e.url.len() > MAX_EXTERNAL_CA_URL || e.url.len() <= "https://".len() {
            return Err(format!(
                "CAConfig.ExternalCAs: URL {:?} must be an https:// URL of at most {MAX_EXTERNAL_CA_URL} bytes (the \
                 CFSSL signer, e.g. https://ca.example:8888)",
                e.url.chars().take(100).collect::<String>()
            ));
        }
        if !e.options.is_empty() {
            let names: Vec<&String> = e.options.keys().take(5).collect();
            return Err(format!(
                "CAConfig.ExternalCAs: options {names:?} are not supported: Shoal sends the CFSSL sign \
                                request without options; leave them out"
            ));
        }
        if !e.ca_cert.is_empty() {
            if e.ca_cert.len() > MAX_ROOT_PEM_BYTES {
                return Err(format!(
                    "CAConfig.ExternalCAs: a CA certificate is larger than {MAX_ROOT_PEM_BYTES} bytes"
                ));
            }
            shoal_ca::parse_cert_pem_chain(&e.ca_cert)
                .map_err(|e| format!("CAConfig.ExternalCAs: CA certificate: {e}"))?;
        }
    }
    Ok(())
}

/// What `spec` asks of the root CA of `current` (see the module doc), with a new root made or checked and
/// cross-signed here. Errors are the operator's to fix and name the field.
pub(crate) fn plan_root_change(current: &Cluster, spec: &ClusterSpec, now: SystemTime) -> Result<RootChange, String> {
    let rc = current.root_ca.clone().unwrap_or_default();
    let ca = spec.ca_config.clone().unwrap_or_default();
    let desired: &[u8] = rc.root_rotation.as_ref().map(|r| r.ca_cert.as_slice()).unwrap_or(&rc.ca_cert);
    let mut rng = rand::rng();
    if ca.signing_ca_cert.is_empty() && !ca.signing_ca_key.is_empty() {
        return Err("CAConfig.SigningCAKey without SigningCACert: give the root's certificate too (--ca-cert)".into());
    }
    let (cert, key) = if !ca.signing_ca_cert.is_empty() {
        if ca.signing_ca_cert.len() > MAX_ROOT_PEM_BYTES || ca.signing_ca_key.len() > MAX_ROOT_PEM_BYTES {
            return Err(format!(
                "CAConfig.SigningCACert and SigningCAKey must each be at most {MAX_ROOT_PEM_BYTES} bytes"
            ));
        }
        let cert = String::from_utf8(ca.signing_ca_cert.clone())
            .map_err(|_| "CAConfig.SigningCACert is not PEM text".to_string())?;
        let key = if ca.signing_ca_key.is_empty() {
            None
        } else {
            Some(
                String::from_utf8(ca.signing_ca_key.clone())
                    .map_err(|_| "CAConfig.SigningCAKey is not PEM text".to_string())?,
            )
        };
        // Kept as PKCS#8, what the CA signs with, whichever form was given (SEC1 `EC PRIVATE KEY` too).
        let key = key
            .map(|k| shoal_ca::key_pem_as_pkcs8(&k))
            .transpose()
            .map_err(|e| format!("CAConfig.SigningCAKey: {e}"))?;
        shoal_ca::check_root(&cert, key.as_deref(), now).map_err(|e| format!("CAConfig.SigningCACert: {e}"))?;
        if key.is_none() && external_for(Some(spec), cert.as_bytes(), &rc.ca_cert).is_empty() {
            return Err("CAConfig.SigningCACert without SigningCAKey needs an external CA that holds its key: give \
                        --ca-key, or --external-ca protocol=cfssl,url=https://... for that root"
                .into());
        }
        if same_cert(cert.as_bytes(), desired) && ca.force_rotate == rc.last_forced_rotation {
            return Ok(RootChange::Keep);
        }
        if same_cert(cert.as_bytes(), &rc.ca_cert) {
            return Ok(if rc.root_rotation.is_some() { RootChange::Cancel } else { RootChange::Keep });
        }
        (cert, key)
    } else if ca.force_rotate != rc.last_forced_rotation {
        let root = RootCa::generate(now, &mut rng).map_err(|e| e.to_string())?;
        (root.cert_pem().to_string(), Some(root.key_pem().to_string()))
    } else {
        return Ok(RootChange::Keep);
    };
    if rc.ca_key.is_empty() {
        return Err(
            "the cluster's current root CA key is held by an external CA, and Shoal cross-signs a new root only \
                    with a key it holds: the root cannot be rotated"
                .into(),
        );
    }
    let old = RootCa::from_pem(
        std::str::from_utf8(&rc.ca_cert).map_err(|_| "the stored root CA is not PEM".to_string())?,
        std::str::from_utf8(&rc.ca_key).map_err(|_| "the stored root CA key is not PEM".to_string())?,
    )
    .map_err(|e| e.to_string())?;
    let cross =
        shoal_ca::cross_sign(&cert, &old, &mut rng).map_err(|e| format!("cannot cross-sign the new root: {e}"))?;
    Ok(RootChange::Start(RootRotation {
        ca_cert: cert.into_bytes(),
        ca_key: key.map(String::into_bytes).unwrap_or_default(),
        cross_signed_ca_cert: cross.into_bytes(),
    }))
}

/// `rc` with `change` applied; `force_rotate` is remembered as handled.
pub(crate) fn apply_root_change(rc: &mut RootCaProto, change: RootChange, force_rotate: u64) {
    match change {
        RootChange::Keep => {}
        RootChange::Start(r) => rc.root_rotation = Some(r),
        RootChange::Cancel => rc.root_rotation = None,
    }
    rc.last_forced_rotation = force_rotate;
}

/// The root CA once its rotation is over: the new root, its key, its hash, new join tokens for it.
pub(crate) fn finished(rc: &RootCaProto) -> Option<RootCaProto> {
    let r = rc.root_rotation.as_ref()?;
    let digest = shoal_ca::cert_digest(&r.ca_cert);
    let mut rng = rand::rng();
    Some(RootCaProto {
        ca_key: r.ca_key.clone(),
        ca_cert: r.ca_cert.clone(),
        ca_cert_hash: shoal_ca::ca_cert_hash(&r.ca_cert),
        join_tokens: Some(JoinTokens {
            worker: shoal_ca::generate_join_token(&digest, &mut rng),
            manager: shoal_ca::generate_join_token(&digest, &mut rng),
        }),
        root_rotation: None,
        last_forced_rotation: rc.last_forced_rotation,
    })
}

/// The issuer a node reports for its certificate.
fn reported_issuer(n: &Node) -> Option<IssuerInfo> {
    let t = n.description.as_ref()?.tls_info.as_ref()?;
    Some(IssuerInfo { subject: t.cert_issuer_subject.clone(), public_key: t.cert_issuer_public_key.clone() })
}

/// Whether the CA already issued `n` a certificate from `desired` (the node has yet to report it).
fn issued_from(n: &Node, desired: &IssuerInfo, trust: &[u8]) -> bool {
    n.certificate
        .as_ref()
        .filter(|c| !c.certificate.is_empty())
        .and_then(|c| shoal_ca::cert_issuer_info(&c.certificate, trust).ok())
        .is_some_and(|i| i == *desired)
}

fn rotate_state(n: &Node) -> bool {
    n.certificate
        .as_ref()
        .and_then(|c| c.status.as_ref())
        .is_some_and(|s| s.state == issuance_status::State::Rotate as i32)
}

/// Progress of a rotation, as of `tables`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RotationProgress {
    /// Nodes in the store.
    pub nodes: usize,
    /// Nodes that report a certificate from the new root.
    pub done: usize,
}

/// The reconciler's pass over `tables`: marks (at most `MAX_MARKS_PER_WRITE`) nodes to renew, or finishes the
/// rotation once every node reports a certificate from the new root. Empty when no rotation is on.
pub(crate) fn reconcile(tables: &Tables) -> (Changes, RotationProgress) {
    let mut changes = Changes::new();
    let Some(cluster) = tables.clusters().iter().next().cloned() else { return (changes, Default::default()) };
    let Some(rc) = cluster.root_ca.as_ref().filter(|r| r.root_rotation.is_some()) else {
        return (changes, Default::default());
    };
    let Some(desired) = desired_issuer(&cluster) else { return (changes, Default::default()) };
    let trust = trust_bundle(&cluster);
    let mut progress = RotationProgress::default();
    let mut marks = 0;
    for n in tables.nodes().iter() {
        progress.nodes += 1;
        if reported_issuer(n).as_ref() == Some(&desired) {
            progress.done += 1;
            continue;
        }
        if rotate_state(n) || issued_from(n, &desired, &trust) || marks >= MAX_MARKS_PER_WRITE {
            continue;
        }
        let mut m = (**n).clone();
        let cert = m.certificate.get_or_insert_with(Default::default);
        cert.status = Some(IssuanceStatus { state: issuance_status::State::Rotate as i32, err: String::new() });
        changes.update(m);
        marks += 1;
    }
    if progress.done == progress.nodes && marks == 0 {
        if let Some(next) = finished(rc) {
            let mut c = (*cluster).clone();
            c.root_ca = Some(next);
            changes.update(c);
        }
    }
    (changes, progress)
}

/// Whether a commit may change what `reconcile` does.
fn matters(commit: &shoal_store::Commit) -> bool {
    commit.changes.iter().any(|c| matches!(c.object, Object::Node(_) | Object::Cluster(_)))
}

/// The root rotation reconciler (leader only; see the module doc).
#[derive(Debug, Default)]
pub(crate) struct RootRotationReconciler;

impl Subsystem for RootRotationReconciler {
    fn name(&self) -> &'static str {
        "root-rotation"
    }

    fn run(&self, state: ClusterState, stop: watch::Receiver<bool>) -> SubsystemFuture {
        Box::pin(run(state, stop))
    }
}

async fn run(state: ClusterState, mut stop: watch::Receiver<bool>) {
    let ((), mut events) = state.store.view_and_watch(|_| ());
    let mut dirty = true;
    let mut last = RotationProgress::default();
    loop {
        if dirty {
            dirty = false;
            let (changes, progress) = state.store.view(reconcile);
            if progress != last && progress.nodes > 0 {
                tracing::info!(nodes = progress.nodes, renewed = progress.done, "root CA rotation in progress");
            }
            last = progress;
            if !changes.is_empty() {
                let finishing = changes.actions().iter().any(|a| matches!(a.object, Object::Cluster(_)));
                match state.propose(changes).await {
                    Ok(_) if finishing => tracing::info!(
                        "root CA rotation finished: every node holds a certificate \
                                                          from the new root; join tokens replaced"
                    ),
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "root rotation write failed; retrying");
                        dirty = true;
                        tokio::select! {
                            biased;
                            _ = stopped(&mut stop) => return,
                            _ = state.sleep_ms(BACKOFF_MS) => {}
                        }
                        continue;
                    }
                }
            }
        }
        tokio::select! {
            biased;
            _ = stopped(&mut stop) => return,
            r = events.recv() => match r {
                Ok(commit) => dirty |= matters(&commit),
                Err(WatchError::Lagged(_)) => dirty = true,
                Err(WatchError::Closed) => return,
            },
        }
    }
}
