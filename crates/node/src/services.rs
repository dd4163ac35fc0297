//! The manager's running parts, started the same way by the daemon and by the in-process test harness:
//! the gRPC server (dispatcher, and for a Raft member the Raft services) on a bound listener, and the
//! leader-only subsystems from one declarative list.

use std::sync::Arc;

use shoal_manager::Dispatcher;
use shoal_manager::{ClusterState, LeaderConfig, Subsystem};
use shoal_raft::RaftNode;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::raft_status::ManagerStatusSubsystem;

/// The leader-only subsystems, in start order (`shoal_manager::leader_subsystems`, the one list), with key
/// material from the operating system's RNG.
pub(crate) fn leader_subsystems(dispatcher: &Arc<Dispatcher>, cfg: &LeaderConfig) -> Vec<Box<dyn Subsystem>> {
    use rand::SeedableRng;
    shoal_manager::leader_subsystems(dispatcher, Box::new(rand::rngs::StdRng::from_os_rng()), cfg)
}

/// FOR THE IN-PROCESS TEST HARNESS ONLY (the `test-doors` feature, absent from the shipped daemon): starts the
/// dispatcher's gRPC server on `listener` over plain HTTP/2, believing the node ID a caller claims, and the
/// leader-only subsystems; both stop when `shutdown` turns true. Returns their join handles, named.
#[cfg(any(test, feature = "test-doors"))]
pub fn start_manager_services(
    state: &ClusterState,
    dispatcher_config: shoal_manager::DispatcherConfig,
    listener: tokio::net::TcpListener,
    shutdown: watch::Receiver<bool>,
) -> Vec<(&'static str, JoinHandle<()>)> {
    let dispatcher = Dispatcher::new(state.clone(), dispatcher_config);
    vec![
        ("grpc", serve_grpc(&dispatcher, listener, None, None, shutdown.clone())),
        ("leader-subsystems", run_leader_subsystems(state, &dispatcher, None, &LeaderConfig::default(), shutdown)),
    ]
}

/// Serves the manager's gRPC services on `listener` until `shutdown`: the dispatcher, and when `raft` is
/// given its `Raft`, `RaftMembership` and `RaftProposals` services, behind mutual TLS, the authorization
/// layer in front of every method, with the CA services.
pub(crate) fn serve_manager_grpc(
    dispatcher: &Arc<Dispatcher>,
    listener: tokio::net::TcpListener,
    raft: Option<&RaftNode>,
    security: &crate::security::RemoteSecurity,
    shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    serve_grpc(dispatcher, listener, raft, Some(security), shutdown)
}

/// `serve_manager_grpc`; without `security` (the test doors only): plain HTTP/2 and callers identified by the
/// node ID they claim.
fn serve_grpc(
    dispatcher: &Arc<Dispatcher>,
    listener: tokio::net::TcpListener,
    raft: Option<&RaftNode>,
    security: Option<&crate::security::RemoteSecurity>,
    shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let raft_services = raft.map(shoal_raft::grpc::services);
    let (r, m, p) = match raft_services {
        Some(s) => (Some(s.raft), Some(s.membership), Some(s.proposals)),
        None => (None, None, None),
    };
    let authz = match (security, listener.local_addr()) {
        (Some(s), Ok(addr)) => s.authz.grpc_layer(addr),
        (Some(s), Err(_)) => s.authz.grpc_layer("the remote API port"),
        #[cfg(any(test, feature = "test-doors"))]
        (None, _) => crate::authz::AuthzLayer::trust_metadata_for_tests(),
        #[cfg(not(any(test, feature = "test-doors")))]
        (None, _) => unreachable!("only the test doors serve the manager's gRPC without its security"),
    };
    let (ca, node_ca) = match security {
        Some(s) => (Some(s.ca.ca_server()), Some(s.ca.node_ca_server())),
        None => (None, None),
    };
    let router = tonic::transport::Server::builder()
        .layer(authz)
        .add_service(dispatcher.grpc_service())
        .add_service(dispatcher.log_broker_service())
        .add_service(dispatcher.logs_service())
        .add_service(dispatcher.network_view_service())
        .add_service(shoal_manager::ResourceAllocatorService::new(dispatcher.state().clone()).server())
        .add_optional_service(r)
        .add_optional_service(m)
        .add_optional_service(p)
        .add_optional_service(ca)
        .add_optional_service(node_ca)
        .add_service(shoal_manager::HealthService::remote().server());
    let stop = {
        let mut rx = shutdown;
        async move { shoal_manager::stopped(&mut rx).await }
    };
    fn report(r: Result<(), tonic::transport::Error>) {
        if let Err(e) = r {
            tracing::error!(error = %e, "gRPC server failed");
        }
    }
    match security {
        Some(s) => {
            let serve = router.serve_with_incoming_shutdown(crate::tls::tls_incoming(listener, s.tls.clone()), stop);
            tokio::spawn(async move { report(serve.await) })
        }
        None => {
            let serve =
                router.serve_with_incoming_shutdown(tokio_stream::wrappers::TcpListenerStream::new(listener), stop);
            tokio::spawn(async move { report(serve.await) })
        }
    }
}

/// Runs the leader-only subsystems while this manager leads, until `shutdown`; with `raft`, also the loop
/// that keeps managers' `Node.manager_status` current.
pub(crate) fn run_leader_subsystems(
    state: &ClusterState,
    dispatcher: &Arc<Dispatcher>,
    raft: Option<&RaftNode>,
    cfg: &LeaderConfig,
    shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let mut list = leader_subsystems(dispatcher, cfg);
    if let Some(raft) = raft {
        list.push(Box::new(ManagerStatusSubsystem::new(raft.clone())));
    }
    tokio::spawn(shoal_manager::run_while_leader(state.clone(), list, shutdown))
}
