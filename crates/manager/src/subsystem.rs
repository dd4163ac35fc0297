//! Leader-only subsystems: a declarative list of services that start when this manager becomes leader and
//! stop when it loses leadership. Each is a loop over the store's watch queue; none calls another.

use std::future::Future;
use std::pin::Pin;

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::state::ClusterState;

/// A future that runs until the subsystem is told to stop.
pub type SubsystemFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A leader-only loop. `run` is called each time this manager becomes leader, and must return soon after
/// `stop` turns true (or its sender is dropped).
pub trait Subsystem: Send + Sync + 'static {
    /// Short name, for logs.
    fn name(&self) -> &'static str;
    /// Runs the loop until `stop` says so.
    fn run(&self, state: ClusterState, stop: watch::Receiver<bool>) -> SubsystemFuture;
}

/// Resolves when `stop` turns true or its sender goes away. Subsystems `select!` on it.
pub async fn stopped(stop: &mut watch::Receiver<bool>) {
    while !*stop.borrow_and_update() {
        if stop.changed().await.is_err() {
            return;
        }
    }
}

/// Runs a list of subsystems while this node leads: starts them all on gaining leadership and stops
/// (and awaits) them all on losing it. Returns when `shutdown` turns true.
pub async fn run_while_leader(
    state: ClusterState,
    subsystems: Vec<Box<dyn Subsystem>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut leadership = state.proposer.leadership();
    loop {
        // Wait to become leader (or to be shut down).
        loop {
            if *shutdown.borrow() {
                return;
            }
            if leadership.borrow_and_update().is_leader {
                break;
            }
            tokio::select! {
                r = leadership.changed() => if r.is_err() { return },
                _ = stopped(&mut shutdown) => return,
            }
        }
        let term = leadership.borrow().term;
        tracing::info!(term, "became leader: starting leader-only subsystems");
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut running = JoinSet::new();
        for s in &subsystems {
            let name = s.name();
            let fut = s.run(state.clone(), stop_rx.clone());
            running.spawn(async move {
                fut.await;
                tracing::debug!(subsystem = name, "stopped");
            });
        }
        // Run until leadership is lost or we are shut down.
        let mut shutting_down = false;
        loop {
            tokio::select! {
                r = leadership.changed() => {
                    let s = *leadership.borrow_and_update();
                    if r.is_err() || !s.is_leader || s.term != term { break; }
                }
                _ = stopped(&mut shutdown) => { shutting_down = true; break; }
                Some(res) = running.join_next() => {
                    if let Err(e) = res {
                        tracing::error!(error = %e, "a leader-only subsystem panicked");
                    }
                }
            }
        }
        tracing::info!(term, "stopping leader-only subsystems");
        let _ = stop_tx.send(true);
        while running.join_next().await.is_some() {}
        if shutting_down {
            return;
        }
    }
}
