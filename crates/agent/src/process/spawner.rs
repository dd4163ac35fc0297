//! The spawner thread: every task process is forked from this one long-lived thread, with
//! PR_SET_PDEATHSIG(SIGKILL) set in the child and its own process group. The thread lives while its
//! `Spawner` handle (shared by the executor and every controller) lives.
//!
//! Bound: at most `SPAWN_QUEUE` spawn requests wait for the thread; a spawn is a fork+exec, so a full queue
//! clears in milliseconds (senders block meanwhile).

use std::os::unix::process::CommandExt;
use std::sync::mpsc;

use tokio::sync::oneshot;

/// Spawn requests that may wait for the spawner thread.
pub(super) const SPAWN_QUEUE: usize = 64;

struct SpawnRequest {
    cmd: std::process::Command,
    runtime: tokio::runtime::Handle,
    reply: oneshot::Sender<std::io::Result<tokio::process::Child>>,
}

/// Handle to the spawner thread.
pub(super) struct Spawner {
    tx: mpsc::SyncSender<SpawnRequest>,
}

impl Spawner {
    /// Starts the thread.
    pub(super) fn start() -> Spawner {
        let (tx, rx) = mpsc::sync_channel::<SpawnRequest>(SPAWN_QUEUE);
        std::thread::Builder::new()
            .name("shoal-spawner".into())
            .spawn(move || {
                for req in rx {
                    // tokio's child handling (reaping, async wait) registers with the caller's runtime.
                    let _guard = req.runtime.enter();
                    let result = tokio::process::Command::from(req.cmd).spawn();
                    let _ = req.reply.send(result);
                }
            })
            .expect("cannot start the process spawner thread");
        Spawner { tx }
    }

    /// Spawns `cmd` from the spawner thread, in its own process group, dying with the daemon.
    pub(super) async fn spawn(&self, mut cmd: std::process::Command) -> std::io::Result<tokio::process::Child> {
        cmd.process_group(0);
        die_with_parent(&mut cmd);
        let (reply, rx) = oneshot::channel();
        let req = SpawnRequest { cmd, runtime: tokio::runtime::Handle::current(), reply };
        self.tx.send(req).map_err(|_| std::io::Error::other("the process spawner thread has stopped"))?;
        rx.await.map_err(|_| std::io::Error::other("the process spawner thread has stopped"))?
    }
}

/// Makes the child get SIGKILL when the thread that forked it (the spawner thread) ends, which happens at
/// the latest when the daemon process dies, however it dies.
#[allow(unsafe_code)]
fn die_with_parent(cmd: &mut std::process::Command) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec. It only calls prctl and getppid, which are
    // async-signal-safe, and builds its error without allocating.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl: then the signal was never armed.
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}
