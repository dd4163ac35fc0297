//! A worker-only node: what a node joined with a worker token runs on every start. No Raft, no store, no
//! manager: the agent (its dispatcher session over mutual TLS), the certificate renewal loop, and a control
//! socket that answers `/_ping`, `/version` and `/info` and refuses cluster commands ("run this command on
//! a manager"). Also the start decision of every node: worker (this file) or manager (`Node::start`).
//!
//! The manager it joined through is remembered in `<state dir>/join.json` so a restart without
//! `--join-addr` resumes; a restart with `--join-addr` uses (and remembers) the new address.

use std::path::{Path, PathBuf};
use std::sync::Arc;
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
pub enum StartAs {
    /// As a manager (`Node::start`): a new cluster, a restart, or a join with a manager token (its
    /// certificate is then in the state dir).
    Manager,
    /// As a worker only.
    Worker(WorkerStart),
}

/// What a worker needs to run.
#[derive(Debug)]
pub struct WorkerStart {
    /// Its node ID (its certificate's CN).
    pub node_id: String,
    /// Its TLS identity.
    pub tls: NodeTls,
    /// The manager to talk to.
    pub manager_addr: String,
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

fn remembered_manager(state_dir: &Path) -> Result<Option<String>, NodeError> {
    let p = join_record_path(state_dir);
    match std::fs::read(&p) {
        Ok(b) => serde_json::from_slice::<JoinRecord>(&b)
            .map(|r| Some(r.manager_addr))
            .map_err(|e| NodeError::State(format!("{} is corrupted ({e}); pass --join-addr", p.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(NodeError::io(&p, e)),
    }
}

fn security(e: impl std::fmt::Display) -> NodeError {
    NodeError::Security(e.to_string())
}

/// Decides how this node starts, joining first when this is the first start with `--join-token`.
pub async fn prepare(cfg: &DaemonConfig) -> Result<StartAs, NodeError> {
    std::fs::create_dir_all(&cfg.state_dir).map_err(|e| NodeError::io(&cfg.state_dir, e))?;
    crate::set_mode(&cfg.state_dir, 0o700)?;
    if let Some(certs) = join::load_certs(&cfg.state_dir).map_err(security)? {
        let tls = certs.tls().map_err(security)?;
        let subject = tls.subject();
        if subject.role != Role::Worker {
            return Ok(StartAs::Manager);
        }
        let manager_addr = match &cfg.join_addr {
            Some(a) => {
                remember_manager(&cfg.state_dir, a)?;
                a.clone()
            }
            None => remembered_manager(&cfg.state_dir)?.ok_or_else(|| {
                NodeError::State("this worker does not know its manager's address: pass --join-addr IP:PORT".into())
            })?,
        };
        return Ok(StartAs::Worker(WorkerStart { node_id: subject.node_id, tls, manager_addr }));
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
    let (node_id, certs) =
        join::join(addr, &token.0, &cfg.state_dir).await.map_err(|e| NodeError::Join(e.to_string()))?;
    let tls = certs.tls().map_err(security)?;
    // The CA chose the node ID; the Raft ID of a joining manager comes from the leader.
    identity::store(&cfg.state_dir, &NodeIdentity { node_id: node_id.clone(), raft_id: crate::random_raft_id() })?;
    remember_manager(&cfg.state_dir, addr)?;
    tracing::info!(node_id = %node_id, role = %tls.subject().role, manager = %addr, "joined the cluster");
    if tls.subject().role == Role::Worker {
        Ok(StartAs::Worker(WorkerStart { node_id, tls, manager_addr: addr.clone() }))
    } else {
        Ok(StartAs::Manager)
    }
}

/// Runs a worker until `stop` resolves; then stops its tasks (bounded by `grace` per part) and returns.
pub async fn run_worker(
    cfg: DaemonConfig,
    w: WorkerStart,
    stop: impl std::future::Future<Output = ()>,
    grace: Duration,
) -> Result<(), NodeError> {
    let hostname = cfg.hostname.clone().unwrap_or_else(crate::machine_hostname);
    let executor = crate::pick_executor(cfg.executor, &cfg, &w.node_id, &hostname).await?;
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let mut tasks = Vec::new();

    let control_socket = cfg.listen_control_api.clone();
    let unix = crate::bind_control_socket(&control_socket)?;
    let ctx = shoal_engine_api::worker::WorkerContext {
        node_id: w.node_id.clone(),
        node_addr: String::new(),
        hostname: hostname.clone(),
        executor: executor.name().to_string(),
        manager_addr: w.manager_addr.clone(),
    };
    tasks.push((
        "control-api",
        tokio::spawn({
            let stop = crate::wait_true(shutdown_rx.clone());
            async move {
                if let Err(e) = shoal_engine_api::worker::serve_worker_unix(unix, ctx, stop).await {
                    tracing::error!(error = %e, "control API server failed");
                }
            }
        }),
    ));

    let agent = Agent::new(
        AgentConfig {
            node_id: w.node_id.clone(),
            manager_addr: crate::tls::https_uri(&w.manager_addr),
            hostname,
            state_dir: cfg.state_dir.clone(),
            engine_labels: Default::default(),
        },
        executor,
    )
    .with_endpoint_factory(crate::tls::agent_endpoints(&w.tls));
    tasks.push(("agent", tokio::spawn(agent.run(shutdown_rx.clone()))));
    let manager_addr = Arc::new(w.manager_addr.clone());
    tasks.push((
        "certificate-renewal",
        tokio::spawn(join::run_renewal(
            cfg.state_dir.clone(),
            w.tls.clone(),
            move || manager_addr.to_string(),
            shutdown_rx.clone(),
        )),
    ));
    tracing::info!(node_id = %w.node_id, manager = %w.manager_addr, control = %control_socket.display(), "worker started");

    stop.await;
    tracing::info!("shutting down");
    let _ = shutdown_tx.send(true);
    for (name, handle) in tasks {
        let abort = handle.abort_handle();
        if tokio::time::timeout(grace, handle).await.is_err() {
            tracing::warn!(part = name, "did not stop in time; aborting");
            abort.abort();
        }
    }
    let _ = std::fs::remove_file(&control_socket);
    Ok(())
}
