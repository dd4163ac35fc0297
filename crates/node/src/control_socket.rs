//! The control socket, bound once and served by one server for as long as the daemon runs. What answers on
//! it follows the node's state (in no swarm, locked, a worker, a manager): each request goes to the router
//! installed last, as a Docker Engine's one socket does. Nothing is closed or rebound when the state changes,
//! so a pooled client's keep-alive connection and a connection made while a swarm init is answered never land
//! on a listener being closed (they would get a reset), and the socket never goes missing between two states
//! (an unlock, a promotion, a demotion, a leave).
//!
//! Boundary: it knows the socket's path, its file mode and the Engine API's connection server
//! (`shoal_engine_api::connections`); not what any router answers.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use axum::Router;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tower::ServiceExt;

use crate::NodeError;

/// The daemon's control socket: unbound until the first `bind`, then served until `close`.
pub(crate) struct ControlSocket {
    path: PathBuf,
    current: Arc<RwLock<Router>>,
    served: std::sync::Mutex<Option<Served>>,
}

/// The server of a bound socket: its stop signal and its task.
struct Served {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl ControlSocket {
    /// The control socket at `path`, not bound yet.
    pub(crate) fn new(path: &Path) -> ControlSocket {
        ControlSocket {
            path: path.to_path_buf(),
            current: Arc::new(RwLock::new(Router::new().fallback(starting))),
            served: std::sync::Mutex::new(None),
        }
    }

    /// The socket's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Binds the socket (replacing a stale file, mode 0660) and starts its server, unless it is bound already.
    /// Until a router is installed, requests are answered 503 (the node is starting).
    pub(crate) fn bind(&self) -> Result<(), NodeError> {
        let mut served = self.served.lock().unwrap_or_else(|p| p.into_inner());
        if served.is_some() {
            return Ok(());
        }
        let listener = bind_file(&self.path)?;
        let current = self.current.clone();
        let dispatch = Router::new().fallback_service(tower::service_fn(move |req: axum::extract::Request| {
            let router = current.read().unwrap_or_else(|p| p.into_inner()).clone();
            router.oneshot(req)
        }));
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            let limits = shoal_engine_api::connections::ConnectionLimits::default();
            if let Err(e) =
                shoal_engine_api::connections::serve_unix(listener, dispatch, limits, crate::wait_true(stop_rx)).await
            {
                tracing::error!(error = %e, "control API server failed");
            }
        });
        *served = Some(Served { stop, task });
        Ok(())
    }

    /// Binds the socket if it is not yet, and answers every request from now on with `router`. A request
    /// already given to the router installed before runs on with it.
    pub(crate) fn install(&self, router: Router) -> Result<(), NodeError> {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = router;
        self.bind()
    }

    /// Stops the server (requests in flight get the server's grace) and removes the socket file.
    pub(crate) async fn close(&self) {
        let served = self.served.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(Served { stop, task }) = served {
            let _ = stop.send(true);
            let _ = task.await;
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for ControlSocket {
    /// A socket not closed (a start that failed, a daemon that returned early) is not left behind.
    fn drop(&mut self) {
        if let Some(Served { task, .. }) = self.served.get_mut().unwrap_or_else(|p| p.into_inner()).take() {
            task.abort();
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// What the socket answers before any state's router is installed.
async fn starting() -> shoal_engine_api::ApiError {
    shoal_engine_api::ApiError::Unavailable("this node is starting: retry shortly".into())
}

/// Binds the control socket's file (replacing a stale one), mode 0660.
fn bind_file(control_socket: &Path) -> Result<tokio::net::UnixListener, NodeError> {
    if let Some(dir) = control_socket.parent() {
        std::fs::create_dir_all(dir).map_err(|e| NodeError::io(dir, e))?;
    }
    match std::fs::remove_file(control_socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(NodeError::io(control_socket, e)),
    }
    let unix = tokio::net::UnixListener::bind(control_socket)
        .map_err(|e| NodeError::listen("--listen-control-api", control_socket.display(), e))?;
    crate::set_mode(control_socket, 0o660)?;
    Ok(unix)
}
