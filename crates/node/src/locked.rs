//! A locked manager (autolock) serving only the locked control socket until `POST /swarm/unlock` brings
//! the right key, the daemon is stopped, or `docker swarm leave --force` asks it to leave. The keys and the
//! unlocking are `lock`'s; this is the daemon's wait around them.

use std::path::PathBuf;
use std::sync::Arc;

use shoal_engine_api::locked::{UnlockError, Unlocker};
use tokio::sync::watch;

use crate::lock::unlock;
use crate::NodeError;

/// The node side of `POST /swarm/unlock` on the locked socket.
struct StateDirUnlocker {
    state_dir: PathBuf,
    unlocked: watch::Sender<bool>,
}

impl Unlocker for StateDirUnlocker {
    fn unlock(&self, key: &str) -> Result<(), UnlockError> {
        unlock(&self.state_dir, key)?;
        tracing::info!("unlocked");
        self.unlocked.send_replace(true);
        Ok(())
    }
}

/// How waiting in the locked state ended.
pub(crate) enum LockedExit {
    /// The right key was given: start normally.
    Unlocked,
    /// The daemon was asked to stop first.
    Stopped,
    /// `docker swarm leave --force`: answer it once inactive.
    Left(Box<crate::lifecycle::Pending>),
}

/// Serves the locked control socket until the node is unlocked or `stop` resolves.
pub(crate) async fn serve_until_unlocked(
    cfg: &crate::DaemonConfig,
    stop: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    session: &mut crate::lifecycle::Session<'_>,
) -> Result<LockedExit, NodeError> {
    let node_id = crate::identity::load(&cfg.state_dir)?.map(|i| i.node_id).unwrap_or_default();
    let (unlocked_tx, mut unlocked_rx) = watch::channel(false);
    let ctx = shoal_engine_api::locked::LockedContext {
        node_id,
        hostname: cfg.hostname.clone().unwrap_or_else(crate::machine_hostname),
        unlocker: Arc::new(StateDirUnlocker { state_dir: cfg.state_dir.clone(), unlocked: unlocked_tx }),
        lifecycle: session.handle.as_ref(),
    };
    let router = crate::engine_relay(cfg, None).wrap(shoal_engine_api::locked::locked_router(ctx));
    session.control.install(router)?;
    tracing::warn!(
        control = %cfg.listen_control_api.display(),
        "this manager is locked (autolock): unlock it with `docker swarm unlock` or `shoal swarm unlock`"
    );
    // The unlock answer, in flight, is sent by the locked router while the manager starts.
    let exit = tokio::select! {
        _ = stop => LockedExit::Stopped,
        _ = unlocked_rx.wait_for(|u| *u) => LockedExit::Unlocked,
        reply = session.next_leave() => LockedExit::Left(Box::new(crate::lifecycle::Pending::leave(reply))),
    };
    Ok(exit)
}
