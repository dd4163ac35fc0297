//! A manager node's parts: its core (`ManagerCore`: Raft, TLS, the cluster state, started before anything
//! serves), the handles the parts that run once its cluster is ready share (`Wiring`), those that start from
//! the wiring alone as one declarative list (`PARTS_WHEN_READY`), and one starter for each part that needs
//! something more (a listener, the Engine API's context, the agent's sinks). `Node::start_with` reads as the
//! order of these, instead of hand-starting each loop the way SwarmKit's manager.go does.
//!
//! Must not parse arguments (that is the `shoal` binary) nor start anything before Raft is ready.

use std::sync::Arc;

use shoal_agent::{Agent, AgentConfig, Executor};
use shoal_engine_api::ApiContext;
use shoal_manager::Dispatcher;
use shoal_manager::{ClusterState, RandomIds};
use shoal_raft::RaftNode;
use shoal_store::{MemoryStore, SystemClock};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::raft_member::Membership;
use crate::security::{self, LateTls, ManagerTls, RemoteSecurity};
use crate::tls::NodeTls;
use crate::{
    api_tcp, authz, engine_relay, gossip, join, leader_logs, lock, raft_member, services, swarmkit_socket, tls,
    DaemonConfig, NodeError, NodeIdentity, PickedExecutor, Started, CLUSTER_NAME,
};

/// What a manager runs on before it serves anything: Raft (bootstrapped, joined or recovered, the store
/// recovered), its TLS, and the cluster state whose writes go through Raft, timed for the metrics.
pub(crate) struct ManagerCore {
    pub(crate) raft: RaftNode,
    pub(crate) membership: Membership,
    pub(crate) state: ClusterState,
    pub(crate) mtls: ManagerTls,
    /// Client channels to other managers: mutual TLS with this node's certificate (see `security`).
    pub(crate) channels: LateTls,
    pub(crate) recorders: shoal_observe::Recorders,
    pub(crate) remote_security: RemoteSecurity,
}

impl ManagerCore {
    /// Starts Raft (bootstrap, join with `--join-addr`, or recover) and the state over it; `identity` gets the
    /// Raft ID the cluster gave a joining manager.
    pub(crate) async fn start(
        cfg: &DaemonConfig,
        identity: &mut NodeIdentity,
        ids: Arc<RandomIds>,
    ) -> Result<ManagerCore, NodeError> {
        let store = Arc::new(MemoryStore::default());
        let preloaded_tls = security::load_tls(&cfg.state_dir)?;
        let channels = LateTls::new(preloaded_tls.clone());
        let (raft, membership) =
            raft_member::start_raft(cfg, identity, store.clone(), Arc::new(channels.clone())).await?;
        let mtls = match preloaded_tls {
            Some(tls) => ManagerTls { tls, pending: None },
            None => security::manager_tls(&cfg.state_dir, &identity.node_id, &store, cfg.node_cert_expiry_override)?,
        };
        channels.set(mtls.tls.clone());
        let recorders = shoal_observe::Recorders::new();
        let proposer = shoal_observe::TimedProposer::new(Arc::new(raft.clone()), recorders.clone());
        let state = ClusterState::new(store, Arc::new(proposer), Arc::new(SystemClock), ids);
        let remote_security = RemoteSecurity::new(
            mtls.tls.clone(),
            &state,
            &mtls.tls.subject().cluster_id,
            cfg.node_cert_expiry_override,
        );
        Ok(ManagerCore { raft, membership, state, mtls, channels, recorders, remote_security })
    }

    /// The metrics listener's parts (see `metrics_listener`).
    pub(crate) fn serve_metrics(
        &self,
        listener: tokio::net::TcpListener,
        dispatcher: &Arc<Dispatcher>,
        node_id: &str,
        shutdown: &watch::Receiver<bool>,
    ) -> Vec<Started> {
        if let Ok(addr) = listener.local_addr() {
            // Unauthenticated by design: it shows figures, node names, addresses and task errors, never
            // secrets, tokens or keys (docs/security.md).
            self.remote_security.authz.entry_points().register("metrics", addr, authz::Guard::None);
        }
        crate::metrics_listener::start_manager(
            listener,
            &self.state,
            &self.raft,
            dispatcher,
            node_id,
            self.recorders.clone(),
            shutdown.clone(),
        )
    }

    /// Waits until Raft is ready and the cluster exists (written now on a first start, as `manager` with
    /// `description` advertised at `advertised`); returns the cluster's ID.
    pub(crate) async fn wait_cluster(
        &self,
        cfg: &DaemonConfig,
        identity: &NodeIdentity,
        advertised: std::net::SocketAddr,
        description: shoal_api::NodeDescription,
    ) -> Result<String, NodeError> {
        raft_member::wait_ready(&self.state, &self.raft, self.membership).await?;
        if self.membership == Membership::Restarted {
            // Its cluster and node objects were written when it first started.
            return Ok(self
                .state
                .store
                .view(|t| t.clusters().by_name(CLUSTER_NAME).map(|c| c.id.clone()))
                .unwrap_or_default());
        }
        crate::bootstrap::ensure_cluster(
            &self.state,
            crate::bootstrap::LocalManager {
                node_id: &identity.node_id,
                raft_id: identity.raft_id,
                addr: advertised.to_string(),
                description,
                root_ca: self.mtls.pending.as_ref().map(|(root, _)| root.clone()),
                networking: cfg.init_networking.clone(),
            },
        )
        .await
    }
}

/// The handles a running manager's parts share.
pub(crate) struct Wiring<'a> {
    pub(crate) cfg: &'a DaemonConfig,
    pub(crate) node_id: &'a str,
    /// This manager's advertised remote API address.
    pub(crate) advertised: std::net::SocketAddr,
    pub(crate) state: &'a ClusterState,
    pub(crate) raft: &'a RaftNode,
    pub(crate) dispatcher: &'a Arc<Dispatcher>,
    /// This manager's certificate material.
    pub(crate) tls: &'a NodeTls,
    pub(crate) remote_security: &'a RemoteSecurity,
    /// The dispatcher address the local agent should use (`raft_member::dispatcher_addr_watch`).
    pub(crate) dispatcher_addr: &'a watch::Receiver<String>,
    pub(crate) shutdown: &'a watch::Receiver<bool>,
}

/// A part of a running manager: its name (in logs and at shutdown) and how it starts from the wiring.
pub(crate) type Part = (&'static str, fn(&Wiring<'_>) -> JoinHandle<()>);

/// The parts a manager starts from its wiring once its cluster is ready, in order (after the dispatcher
/// address watch, whose address the renewal follows).
pub(crate) const PARTS_WHEN_READY: &[Part] = &[
    ("leader-subsystems", |w| {
        let cfg = shoal_manager::LeaderConfig {
            key_rotation_ms: w.cfg.network_key_rotation_ms,
            volume_plugins: std::sync::Arc::new(crate::csi_plugins::CsiPlugins::new(&w.cfg.csi_plugins)),
        };
        services::run_leader_subsystems(w.state, w.dispatcher, Some(w.raft), &cfg, w.shutdown.clone())
    }),
    // Autolock: follow the cluster's unlock key (the certificate files exist by now).
    ("autolock", |w| {
        tokio::spawn(lock::watch_cluster_unlock_key(
            w.cfg.state_dir.clone(),
            w.state.store.clone(),
            w.raft.clone(),
            w.shutdown.clone(),
        ))
    }),
    // Docker's overlay gossip, for Docker Engine workers to find each other through this manager.
    ("overlay-gossip", |w| {
        tokio::spawn(gossip::run(
            w.node_id.to_string(),
            std::net::SocketAddr::new(w.advertised.ip(), shoal_gossip::GOSSIP_PORT),
            w.state.store.clone(),
            w.remote_security.authz.entry_points().clone(),
            w.shutdown.clone(),
        ))
    }),
    // The cluster's Raft snapshot settings, on this member's own log.
    ("raft-snapshot-policy", |w| {
        tokio::spawn(raft_member::follow_snapshot_policy(
            w.state.store.clone(),
            w.raft.clone(),
            w.cfg.raft_snapshot_interval_entries,
            w.shutdown.clone(),
        ))
    }),
    ("certificate-renewal", |w| {
        let leader = w.dispatcher_addr.clone();
        tokio::spawn(join::run_renewal(
            w.cfg.state_dir.clone(),
            w.tls.clone(),
            move || leader.borrow().clone(),
            w.shutdown.clone(),
        ))
    }),
];

impl Wiring<'_> {
    /// Starts every part of `PARTS_WHEN_READY`, in order.
    pub(crate) fn start_parts(&self) -> Vec<Started> {
        PARTS_WHEN_READY.iter().map(|(name, start)| (*name, start(self))).collect()
    }

    /// The Engine API's view of this node; starts recording swarm events for `GET /events` from now on
    /// (resumable through the Raft log). `channels` reach the other managers (for the leader's logs).
    pub(crate) fn api_context(
        &self,
        executor: &str,
        hostname: &str,
        channels: &LateTls,
        lifecycle: shoal_engine_api::lifecycle::LifecycleRef,
    ) -> ApiContext {
        let events = shoal_engine_api::events::EventLog::new(shoal_manager::WatchService::new(
            self.state.clone(),
            Some(Arc::new(self.raft.clone())),
            Some(self.shutdown.clone()),
        ));
        events.start();
        let advertised = self.advertised.to_string();
        ApiContext {
            events,
            state: self.state.clone(),
            node_id: self.node_id.to_string(),
            node_addr: advertised.clone(),
            executor: executor.to_string(),
            hostname: hostname.to_string(),
            leader_logs: Some(Arc::new(leader_logs::RemoteLeaderLogs::new(
                Arc::new(channels.clone()),
                self.dispatcher_addr.clone(),
                &advertised,
            ))),
            lifecycle,
        }
    }

    /// The Engine API over TCP on `addr`, mutual TLS only (see `api_tcp`), with a server certificate from the
    /// cluster's root.
    pub(crate) async fn serve_api_tcp(
        &self,
        addr: std::net::SocketAddr,
        ctx: ApiContext,
    ) -> Result<JoinHandle<()>, NodeError> {
        let cluster = shoal_manager::current_cluster(self.state)
            .ok_or_else(|| NodeError::Security("no cluster object to take the root CA from".into()))?;
        let root = shoal_manager::root_ca_of(&cluster).map_err(|e| NodeError::Security(e.message().to_string()))?;
        let validity = shoal_manager::node_cert_expiry(&cluster, self.cfg.node_cert_expiry_override);
        let (cert, key) = api_tcp::issue_server_cert(&root, self.node_id, &cluster.id, addr, validity)?;
        let config =
            api_tcp::server_config(root.cert_pem(), &cert, &key).map_err(|e| NodeError::Security(e.to_string()))?;
        let listener =
            tokio::net::TcpListener::bind(addr).await.map_err(|e| NodeError::listen("--listen-api", addr, e))?;
        let router = shoal_engine_api::router(ctx);
        Ok(tokio::spawn(api_tcp::serve(
            listener,
            config,
            self.remote_security.authz.clone(),
            router,
            self.shutdown.clone(),
        )))
    }

    /// What answers on the control socket: the Engine API, with the relay to the node's engine.
    pub(crate) fn control_router(&self, ctx: ApiContext, picked: &PickedExecutor) -> axum::Router {
        let entry_points = self.remote_security.authz.entry_points().clone();
        entry_points.register("control-socket", self.cfg.listen_control_api.display(), authz::Guard::SocketFileMode);
        engine_relay(self.cfg, Some(picked)).wrap(shoal_engine_api::router(ctx).merge(entry_points.router()))
    }

    /// SwarmKit's own API for swarmctl on `listener` (see `swarmkit_socket`).
    pub(crate) fn serve_swarmkit(&self, listener: tokio::net::UnixListener) -> JoinHandle<()> {
        swarmkit_socket::serve(
            listener,
            self.tls.clone(),
            self.state,
            self.raft,
            self.remote_security.authz.entry_points(),
            self.shutdown.clone(),
        )
    }

    /// The agent (this node is a worker too, its manager at `remote_addr` until the dispatcher address says
    /// otherwise), with the two parts that follow what its session hears: the demotion (once this manager
    /// holds a worker certificate, `run_member` stops it and runs the node as a worker; see
    /// `raft_member::wait_demoted`) and the root CA rotation (this manager follows it as any node does).
    /// Returns the parts in start order and the demotion's watch (the manager that issued the worker
    /// certificate).
    pub(crate) fn start_agent(
        &self,
        executor: Arc<dyn Executor>,
        hostname: String,
        remote_addr: std::net::SocketAddr,
    ) -> (Vec<Started>, watch::Receiver<Option<String>>) {
        let agent = Agent::new(
            AgentConfig {
                node_id: self.node_id.to_string(),
                manager_addr: format!("http://{remote_addr}"),
                hostname,
                state_dir: self.cfg.state_dir.clone(),
                engine_labels: crate::data_path_label(self.cfg),
                generic_resources: self.cfg.generic_node_resources.clone(),
            },
            executor,
        )
        .with_manager_source(self.dispatcher_addr.clone())
        .with_endpoint_factory(tls::agent_endpoints(self.tls))
        .with_tls_info(self.tls.tls_info());
        let agent = match crate::csi_plugins::node_volumes(self.cfg) {
            Some(v) => agent.with_volumes(v),
            None => agent,
        };
        let (node_tx, node_rx) = watch::channel(None);
        let (roots_tx, roots_rx) = watch::channel(Vec::new());
        let (demoted_tx, demoted) = watch::channel(None);
        let demotion = raft_member::wait_demoted(
            self.cfg.state_dir.clone(),
            self.tls.clone(),
            self.state.store.clone(),
            self.node_id.to_string(),
            self.raft.clone(),
            node_tx.subscribe(),
            self.shutdown.clone(),
        );
        let mut parts = vec![(
            "demotion",
            tokio::spawn(async move {
                if let Some(via) = demotion.await {
                    demoted_tx.send_replace(Some(via));
                }
            }),
        )];
        let agent = agent.with_node_sink(node_tx).with_roots_sink(roots_tx);
        parts.push(("agent", tokio::spawn(agent.run(self.shutdown.clone()))));
        let dispatcher_addr = self.dispatcher_addr.clone();
        parts.push((
            "root-rotation",
            tokio::spawn(join::follow_root_rotation(
                self.cfg.state_dir.clone(),
                self.tls.clone(),
                roots_rx,
                node_rx,
                move || dispatcher_addr.borrow().clone(),
                self.shutdown.clone(),
            )),
        ));
        (parts, demoted)
    }
}
