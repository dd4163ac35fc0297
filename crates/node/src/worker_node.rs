//! A worker-only node: what a node joined with a worker token runs on every start. No Raft, no store, no
//! manager: the agent (its dispatcher session over mutual TLS), the certificate renewal loop, and a control
//! socket that answers `/_ping`, `/version` and `/info` and refuses cluster commands ("run this command on
//! a manager"). Also the start decision of every node: worker (this file) or manager (`Node::start`).
//!
//! A promoted worker (`docker node promote`: its Node's desired role becomes manager, which it sees in the
//! dispatcher's session messages) renews its certificate at once, gets a manager certificate, and stops its
//! worker parts so the daemon restarts in-process as a manager (`run_daemon`), joining Raft through the
//! manager it knows. Its tasks are stopped and started again by the manager node's agent. A demoted manager
//! comes back here the same way (`raft_member::wait_demoted`, `run_daemon`): its state dir then holds a worker
//! certificate and no Raft data (`forget_raft_state`), so every later start is a worker's.
//!
//! The manager it joined through is remembered in `<state dir>/join.json` so a restart without
//! `--join-addr` resumes; a restart with `--join-addr` uses (and remembers) the new address. Every manager
//! of the cluster (the list the dispatcher sends in each session message) is kept in
//! `<state dir>/managers.json` by the agent: a worker whose session ends tries the other managers, and a
//! restarted worker tries them too (after `--join-addr` when given, before the join manager otherwise), so
//! it finds the cluster when the manager it joined through is gone. Certificate renewal and the promotion
//! go to the manager of the current session.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shoal_agent::{Agent, AgentConfig};
use shoal_ca::Role;
use shoal_raft::RaftNode;
use tokio::sync::watch;

use crate::join;
use crate::tls::NodeTls;
use crate::{identity, DaemonConfig, NodeError, NodeIdentity};

/// How a node starts.
#[derive(Debug)]
pub(crate) enum StartAs {
    /// As a manager (`Node::start`): a new cluster, a restart, or a join with a manager token (its
    /// certificate is then in the state dir).
    Manager,
    /// As a worker only.
    Worker(WorkerStart),
}

/// What a worker needs to run.
#[derive(Debug)]
pub(crate) struct WorkerStart {
    /// Its node ID (its certificate's CN).
    pub node_id: String,
    /// Its TLS identity.
    pub tls: NodeTls,
    /// The manager to talk to first.
    pub manager_addr: String,
    /// The other managers to try, in order (from `managers.json` and `join.json`).
    pub more_managers: Vec<String>,
}

#[derive(Serialize, Deserialize)]
struct JoinRecord {
    manager_addr: String,
}

fn join_record_path(state_dir: &Path) -> PathBuf {
    state_dir.join("join.json")
}

fn remember_manager(state_dir: &Path, addr: &str) -> Result<(), NodeError> {
    let p = join_record_path(state_dir);
    let bytes = serde_json::to_vec(&JoinRecord { manager_addr: addr.to_string() }).expect("serializes");
    std::fs::write(&p, bytes).map_err(|e| NodeError::io(&p, e))
}

pub(crate) fn remembered_manager(state_dir: &Path) -> Result<Option<String>, NodeError> {
    let p = join_record_path(state_dir);
    match std::fs::read(&p) {
        Ok(b) => serde_json::from_slice::<JoinRecord>(&b)
            .map(|r| Some(r.manager_addr))
            .map_err(|e| NodeError::State(format!("{} is corrupted ({e}); pass --join-addr", p.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(NodeError::io(&p, e)),
    }
}

fn managers_file(state_dir: &Path) -> PathBuf {
    state_dir.join(shoal_agent::MANAGERS_FILE)
}

/// The managers a worker tries, in order: `first` (an explicit `--join-addr`), then the list saved by the
/// agent, then `last` (the remembered join manager); without duplicates.
fn managers_in_order(state_dir: &Path, first: Option<&str>, last: Option<&str>) -> Result<Vec<String>, NodeError> {
    let saved = shoal_agent::load_managers(&managers_file(state_dir)).map_err(NodeError::State)?;
    let all = first.into_iter().map(str::to_string).chain(saved).chain(last.map(str::to_string));
    Ok(shoal_agent::Remotes::new(all).addrs().to_vec())
}

fn security(e: impl std::fmt::Display) -> NodeError {
    NodeError::Security(e.to_string())
}

/// Decides how this node starts, joining first when this is the first start with `--join-token` (the node
/// object then gets `availability`). A manager that cannot be reached yet is retried for
/// `cfg.join_retry_for` (see `join::join_retrying`).
pub(crate) async fn prepare(
    cfg: &DaemonConfig,
    availability: shoal_api::node_spec::Availability,
) -> Result<StartAs, NodeError> {
    std::fs::create_dir_all(&cfg.state_dir).map_err(|e| NodeError::io(&cfg.state_dir, e))?;
    crate::set_mode(&cfg.state_dir, 0o700)?;
    if let Some(certs) = join::load_certs(&cfg.state_dir).map_err(security)? {
        let tls = certs.tls().map_err(security)?;
        let subject = tls.subject();
        if subject.role != Role::Worker {
            return Ok(StartAs::Manager);
        }
        // A worker certificate: Raft data left from when it was a manager (a stop between its demotion's
        // renewal and the removal of that data) belongs to a member that no longer exists.
        forget_raft_state(&cfg.state_dir)?;
        let managers = match &cfg.join_addr {
            Some(a) => {
                remember_manager(&cfg.state_dir, a)?;
                managers_in_order(&cfg.state_dir, Some(a), None)?
            }
            None => managers_in_order(&cfg.state_dir, None, remembered_manager(&cfg.state_dir)?.as_deref())?,
        };
        let Some((manager_addr, more)) = managers.split_first() else {
            return Err(NodeError::State(
                "this worker does not know any manager's address: pass --join-addr IP:PORT".into(),
            ));
        };
        return Ok(StartAs::Worker(WorkerStart {
            node_id: subject.node_id,
            tls,
            manager_addr: manager_addr.clone(),
            more_managers: more.to_vec(),
        }));
    }
    let (addr, token) = match (&cfg.join_addr, &cfg.join_token) {
        (None, None) => return Ok(StartAs::Manager),
        (Some(addr), Some(token)) => (addr, token),
        (None, Some(_)) => {
            return Err(NodeError::Config("--join-token needs --join-addr (the address of a manager)".into()))
        }
        (Some(_), None) => {
            return Err(NodeError::Config(
                "--join-addr needs --join-token: get one with `docker swarm join-token worker` (or `manager`) \
                 on a manager"
                    .into(),
            ))
        }
    };
    if RaftNode::has_existing_state(&cfg.state_dir) {
        return Err(NodeError::State(format!(
            "{} already belongs to a cluster (it has Raft data): start without --join-token, or use an empty \
             state dir to join another cluster",
            cfg.state_dir.display()
        )));
    }
    let (node_id, certs) = join::join_retrying(addr, &token.0, &cfg.state_dir, availability, cfg.join_retry_for)
        .await
        .map_err(NodeError::Join)?;
    let tls = certs.tls().map_err(security)?;
    // The CA chose the node ID; the Raft ID of a joining manager comes from the leader.
    identity::store(&cfg.state_dir, &NodeIdentity { node_id: node_id.clone(), raft_id: crate::random_raft_id() })?;
    remember_manager(&cfg.state_dir, addr)?;
    tracing::info!(node_id = %node_id, role = %tls.subject().role, manager = %addr, "joined the cluster");
    if tls.subject().role == Role::Worker {
        Ok(StartAs::Worker(WorkerStart { node_id, tls, manager_addr: addr.clone(), more_managers: Vec::new() }))
    } else {
        Ok(StartAs::Manager)
    }
}

/// Removes the Raft data of a manager that is a worker now (demoted: the leader took it out of Raft), so
/// that its next start is a worker's and a later promotion joins Raft again under a new Raft ID.
pub(crate) fn forget_raft_state(state_dir: &Path) -> Result<(), NodeError> {
    if !RaftNode::has_existing_state(state_dir) && !state_dir.join("raft").exists() {
        return Ok(());
    }
    tracing::info!("this node is a worker now: removing the raft data it kept as a manager");
    RaftNode::remove_state(state_dir).map_err(|e| NodeError::io(&state_dir.join("raft"), e))
}

/// Why `run_worker` returned.
pub(crate) enum WorkerExit {
    /// `stop` resolved.
    Stopped,
    /// The node was promoted and now holds a manager certificate: start it as a manager (`Node::start`,
    /// which joins Raft through `via`).
    Promoted {
        /// The manager (`host:port`) the worker's session was open with: the one to join Raft through.
        via: String,
    },
    /// `docker swarm leave`: every part but the control socket's server stopped; answer the leave through it
    /// once the node is inactive.
    Left(Box<crate::lifecycle::Pending>),
}

/// How long the promotion watch waits between failed renewals (doubling from `RENEW_RETRY_MIN`).
const PROMOTION_RETRY_MAX: Duration = Duration::from_secs(10);

/// Watches this node's Node object (from the dispatcher's session messages): once its desired role is
/// manager while its certificate says worker, renews the certificate at once (the CA then issues a
/// manager certificate) and returns when the certificate is a manager's. Retries failed renewals with a
/// doubling delay up to `PROMOTION_RETRY_MAX`; never returns if the node is not promoted.
async fn wait_promoted(
    state_dir: PathBuf,
    tls: NodeTls,
    manager_addr: watch::Receiver<String>,
    mut node: watch::Receiver<Option<shoal_api::Node>>,
) {
    let mut retry = join::RENEW_RETRY_MIN;
    loop {
        if tls.subject().role == Role::Manager {
            return;
        }
        let promoted = node
            .borrow_and_update()
            .as_ref()
            .is_some_and(|n| n.spec.as_ref().is_some_and(|s| s.desired_role() == shoal_api::NodeRole::Manager));
        if promoted {
            tracing::info!("this node was promoted; renewing its certificate for the manager role");
            let addr = manager_addr.borrow().clone();
            match join::renew_once(&addr, &tls, &state_dir).await {
                Ok(()) if tls.subject().role == Role::Manager => return,
                Ok(()) => tracing::warn!("the CA still issued a worker certificate; retrying in {retry:?}"),
                Err(e) => {
                    tracing::warn!(error = %e, "renewal for the manager role failed; retrying in {retry:?}")
                }
            }
            tokio::time::sleep(retry).await;
            retry = (retry * 2).min(PROMOTION_RETRY_MAX);
            continue;
        }
        if node.changed().await.is_err() {
            // The agent is gone (shutting down): nothing more will come.
            std::future::pending::<()>().await;
        }
    }
}

/// Runs a worker until `stop` resolves, or until it is promoted (see `WorkerExit`); then stops its tasks
/// (bounded by `grace` per part) and returns why.
pub(crate) async fn run_worker(
    cfg: DaemonConfig,
    w: WorkerStart,
    stop: impl std::future::Future<Output = ()>,
    grace: Duration,
    session: &mut crate::lifecycle::Session<'_>,
) -> Result<WorkerExit, NodeError> {
    let hostname = cfg.hostname.clone().unwrap_or_else(crate::machine_hostname);
    let picked =
        crate::pick_executor(cfg.executor, &cfg, &w.node_id, &hostname, crate::PlaneProbe::spawn(&cfg)).await?;
    let executor = picked.executor.clone();
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let mut tasks = Vec::new();

    let control_socket = cfg.listen_control_api.clone();
    // The metrics listener first: a taken address stops the start before the control socket answers as a worker.
    if let Some(addr) = cfg.listen_metrics {
        let listener = crate::metrics_listener::bind(addr).await?;
        tasks.push(crate::metrics_listener::start_worker(listener, &w.node_id, shutdown_rx.clone()));
    }
    // The managers this worker knows, by address only until a session message names them.
    let known = std::iter::once(&w.manager_addr).chain(&w.more_managers);
    let (managers_tx, managers_rx) = watch::channel(known.map(|a| (String::new(), a.clone())).collect());
    let (held_tx, held_rx) = watch::channel(shoal_engine_api::worker::HeldDependencies::default());
    let ctx = shoal_engine_api::worker::WorkerContext {
        node_id: w.node_id.clone(),
        node_addr: String::new(),
        hostname: hostname.clone(),
        executor: executor.name().to_string(),
        managers: managers_rx,
        held: held_rx,
        lifecycle: session.handle.as_ref(),
        no_data_plane: executor.data_plane_off(),
    };
    let router = crate::engine_relay(&cfg, Some(&picked)).wrap(shoal_engine_api::worker::worker_router(ctx));
    session.control.install(router)?;

    let sinks = AgentSinks { managers: managers_tx, held: held_tx };
    let (parts, promoted, session_manager) = start_agent(&cfg, &w, executor, hostname, sinks, &shutdown_rx);
    tasks.extend(parts);
    tracing::info!(node_id = %w.node_id, manager = %w.manager_addr, more = ?w.more_managers,
        control = %control_socket.display(), "worker started");
    session.started(&w.node_id).await;

    enum Why {
        Stopped,
        Promoted(String),
        Leave(tokio::sync::oneshot::Sender<Result<(), shoal_engine_api::ApiError>>),
    }
    let why = tokio::select! {
        _ = stop => Why::Stopped,
        _ = promoted => Why::Promoted(session_manager.borrow().clone()),
        reply = session.next_leave() => Why::Leave(reply),
    };
    match &why {
        Why::Stopped => tracing::info!("shutting down"),
        Why::Promoted(via) => {
            tracing::info!(%via, "promoted to manager: stopping the worker parts to restart this node as a manager")
        }
        Why::Leave(_) => tracing::info!("docker swarm leave: stopping this worker's tasks and leaving the swarm"),
    }
    let _ = shutdown_tx.send(true);
    crate::stop_parts(tasks, grace).await;
    Ok(match why {
        Why::Stopped => WorkerExit::Stopped,
        Why::Promoted(via) => WorkerExit::Promoted { via },
        Why::Leave(reply) => WorkerExit::Left(Box::new(crate::lifecycle::Pending::leave(reply))),
    })
}

/// Where the worker's agent tells what its sessions learn, for the control socket's answers.
struct AgentSinks {
    /// The managers it knows, as (node ID, address).
    managers: watch::Sender<Vec<(String, String)>>,
    /// The secrets and configs it holds.
    held: watch::Sender<shoal_engine_api::worker::HeldDependencies>,
}

/// Starts the worker's agent and the parts that follow its session (root rotation, certificate renewal).
/// Returns them in start order, the promotion's future (resolves once this node holds a manager
/// certificate) and the manager of the agent's current session (renewal and promotion go there).
fn start_agent(
    cfg: &DaemonConfig,
    w: &WorkerStart,
    executor: std::sync::Arc<dyn shoal_agent::Executor>,
    hostname: String,
    sinks: AgentSinks,
    shutdown: &watch::Receiver<bool>,
) -> (Vec<crate::Started>, impl std::future::Future<Output = ()>, watch::Receiver<String>) {
    let (node_tx, node_rx) = watch::channel(None);
    let rotation_node = node_tx.subscribe();
    let (roots_tx, roots_rx) = watch::channel(Vec::new());
    let (session_manager_tx, session_manager) = watch::channel(w.manager_addr.clone());
    let promoted = wait_promoted(cfg.state_dir.clone(), w.tls.clone(), session_manager.clone(), node_rx);
    let held = sinks.held;
    let agent = Agent::new(
        AgentConfig {
            node_id: w.node_id.clone(),
            manager_addr: crate::tls::https_uri(&w.manager_addr),
            hostname,
            state_dir: cfg.state_dir.clone(),
            engine_labels: crate::data_path_label(cfg),
            generic_resources: cfg.generic_node_resources.clone(),
        },
        executor,
    )
    .with_endpoint_factory(crate::tls::agent_endpoints(&w.tls))
    .with_node_sink(node_tx)
    .with_roots_sink(roots_tx)
    .with_tls_info(w.tls.tls_info())
    .with_managers(w.more_managers.clone(), Some(managers_file(&cfg.state_dir)))
    .with_managers_sink(sinks.managers)
    .with_session_manager_sink(session_manager_tx)
    .with_held_sink(std::sync::Arc::new(move |h: &shoal_agent::Held| {
        held.send_replace(shoal_engine_api::worker::HeldDependencies {
            secrets: h.secrets.clone(),
            configs: h.configs.clone(),
        });
    }));
    let agent = match crate::csi_plugins::node_volumes(cfg) {
        Some(v) => agent.with_volumes(v),
        None => agent,
    };
    let mut parts = vec![("agent", tokio::spawn(agent.run(shutdown.clone())))];
    let rotation_manager = session_manager.clone();
    parts.push((
        "root-rotation",
        tokio::spawn(join::follow_root_rotation(
            cfg.state_dir.clone(),
            w.tls.clone(),
            roots_rx,
            rotation_node,
            move || rotation_manager.borrow().clone(),
            shutdown.clone(),
        )),
    ));
    let renewal_manager = session_manager.clone();
    parts.push((
        "certificate-renewal",
        tokio::spawn(join::run_renewal(
            cfg.state_dir.clone(),
            w.tls.clone(),
            move || renewal_manager.borrow().clone(),
            shutdown.clone(),
        )),
    ));
    (parts, promoted, session_manager)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_tries_its_join_address_then_the_saved_managers_then_join_json() {
        let dir = tempfile::tempdir().unwrap();
        let none = managers_in_order(dir.path(), None, None).unwrap();
        assert!(none.is_empty());
        assert_eq!(managers_in_order(dir.path(), None, Some("m1:1")).unwrap(), ["m1:1"]);
        shoal_agent::save_managers(&managers_file(dir.path()), &["m2:1".into(), "m3:1".into()]).unwrap();
        // Without --join-addr: the saved list first (the join manager may be gone), then join.json.
        assert_eq!(managers_in_order(dir.path(), None, Some("m1:1")).unwrap(), ["m2:1", "m3:1", "m1:1"]);
        // An explicit --join-addr goes first; no address twice.
        assert_eq!(managers_in_order(dir.path(), Some("m3:1"), None).unwrap(), ["m3:1", "m2:1"]);
        std::fs::write(managers_file(dir.path()), "garbage").unwrap();
        let e = managers_in_order(dir.path(), None, Some("m1:1")).unwrap_err();
        assert!(e.to_string().contains("managers.json is corrupted"), "{e}");
    }
}
