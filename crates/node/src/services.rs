//! The manager's running parts, started the same way by the daemon and by the in-process test harness:
//! the gRPC server (dispatcher) on a bound listener, and the leader-only subsystems from one declarative list.

use std::sync::Arc;

use shoal_manager::dispatcher::{Dispatcher, DispatcherConfig};
use shoal_manager::{ClusterState, Subsystem};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The leader-only subsystems, in start order. Each is a loop over the store's watch queue.
pub fn leader_subsystems(dispatcher: &Arc<Dispatcher>) -> Vec<Box<dyn Subsystem>> {
    let mut list = shoal_manager::orchestrator::subsystems();
    list.push(shoal_manager::scheduler::subsystem());
    list.push(dispatcher.subsystem());
    list
}

/// Starts the dispatcher's gRPC server on `listener` and the leader-only subsystems; both stop when
/// `shutdown` turns true. Returns their join handles, named.
pub fn start_manager_services(
    state: &ClusterState,
    dispatcher_config: DispatcherConfig,
    listener: tokio::net::TcpListener,
    shutdown: watch::Receiver<bool>,
) -> Vec<(&'static str, JoinHandle<()>)> {
    let dispatcher = Dispatcher::new(state.clone(), dispatcher_config);
    let grpc = tonic::transport::Server::builder()
        .add_service(dispatcher.grpc_service())
        .serve_with_incoming_shutdown(tokio_stream::wrappers::TcpListenerStream::new(listener), {
            let mut rx = shutdown.clone();
            async move { shoal_manager::stopped(&mut rx).await }
        });
    let grpc = tokio::spawn(async move {
        if let Err(e) = grpc.await {
            tracing::error!(error = %e, "gRPC server failed");
        }
    });
    let subsystems =
        tokio::spawn(shoal_manager::run_while_leader(state.clone(), leader_subsystems(&dispatcher), shutdown));
    vec![("grpc", grpc), ("leader-subsystems", subsystems)]
}
