//! The node's file-descriptor budget and the caps on the remote gRPC port's connections drawn from it: the
//! soft `RLIMIT_NOFILE` raised to the hard limit at daemon start (`raise_nofile_limit`, logged once); of
//! what that allows, `FD_RESERVE` descriptors are kept for everything but the remote port (the control
//! socket, which always answers its owner, the state files, Raft, the agent's processes, the other
//! listeners), and the remote port may hold at most half of the rest (`RemoteCaps::for_nofile`). Of those,
//! only a small share may be connections without a client certificate (nodes joining, asking for the root
//! CA): such a connection is closed once it has sent nothing for `UNAUTHENTICATED_IDLE` (a client that
//! finished the handshake and went silent) and in any case after `UNAUTHENTICATED_LIFETIME` (a join needs a
//! few calls; a joining node's client reconnects by itself); at their cap, a new one closes the oldest, so
//! connections held open without a certificate never keep a joining node out.
//!
//! `Capped` is the connection wrapper that holds a connection's places and enforces the two timeouts. No
//! TLS and no store here; the accept loop (`tls::tls_incoming`) decides who is authenticated.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use nix::sys::resource::{getrlimit, setrlimit, Resource};
use parking_lot::Mutex;
use std::collections::VecDeque;
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

/// Descriptors kept for everything but the remote port's connections.
pub const FD_RESERVE: u64 = 512;
/// The remote port holds at most this many connections however high the descriptor limit.
pub(crate) const MAX_REMOTE_CONNECTIONS: usize = 16_384;
/// ... and at least this many, however low (a limit below `FD_RESERVE` + 128 leaves the reserve smaller).
pub(crate) const MIN_REMOTE_CONNECTIONS: usize = 64;
/// At most this many of them are without a client certificate, however high the limit.
pub(crate) const MAX_UNAUTHENTICATED_CONNECTIONS: usize = 1024;
/// A connection without a client certificate that sends nothing for this long is closed.
pub const UNAUTHENTICATED_IDLE: Duration = Duration::from_secs(10);
/// A connection without a client certificate is closed this long after its handshake in any case.
pub(crate) const UNAUTHENTICATED_LIFETIME: Duration = Duration::from_secs(120);

/// The soft limit on open files now (`RLIMIT_NOFILE`), or `None` if it cannot be read.
pub(crate) fn nofile_limit() -> Option<u64> {
    getrlimit(Resource::RLIMIT_NOFILE).ok().map(|(soft, _)| soft)
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (a daemon holding many connections needs more than
/// the 1,024 many hosts give by default). Returns the soft limit before and after; logs the change once.
pub(crate) fn raise_nofile_limit() -> Result<(u64, u64), nix::Error> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft >= hard {
        tracing::info!(limit = soft, "open-file limit (RLIMIT_NOFILE) already at its hard limit");
        return Ok((soft, soft));
    }
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    tracing::info!(from = soft, to = hard, "raised the open-file limit (RLIMIT_NOFILE) to its hard limit");
    Ok((soft, hard))
}

/// The remote port's connection caps for a descriptor limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteCaps {
    /// Connections at once, handshaking or established.
    pub total: usize,
    /// Established connections without a client certificate at once.
    pub unauthenticated: usize,
}

impl RemoteCaps {
    /// Half of what `FD_RESERVE` leaves of `nofile`, within [`MIN_REMOTE_CONNECTIONS`,
    /// `MAX_REMOTE_CONNECTIONS`]; an eighth of that (at least 16) without a certificate.
    pub fn for_nofile(nofile: u64) -> RemoteCaps {
        let total = usize::try_from(nofile.saturating_sub(FD_RESERVE) / 2)
            .unwrap_or(usize::MAX)
            .clamp(MIN_REMOTE_CONNECTIONS, MAX_REMOTE_CONNECTIONS);
        let unauthenticated = (total / 8).clamp(16, MAX_UNAUTHENTICATED_CONNECTIONS);
        RemoteCaps { total, unauthenticated }
    }
}

/// The places of one listener: a connection takes one of `total` when accepted; one established without a
/// client certificate also takes a place among the `unauthenticated`, closing the oldest such connection
/// when they are all taken.
#[derive(Debug, Clone)]
pub(crate) struct ListenerCaps {
    /// The caps in force.
    pub caps: RemoteCaps,
    total: Arc<Semaphore>,
    unauthenticated: Arc<Mutex<Unauthenticated>>,
}

/// The connections without a certificate, oldest first, each with the sender that closes it.
#[derive(Debug, Default)]
struct Unauthenticated {
    next_id: u64,
    live: VecDeque<(u64, oneshot::Sender<()>)>,
}

impl ListenerCaps {
    /// Places for `caps`.
    pub(crate) fn new(caps: RemoteCaps) -> ListenerCaps {
        ListenerCaps { caps, total: Arc::new(Semaphore::new(caps.total)), unauthenticated: Arc::default() }
    }

    /// A connection's place, or `None` at the cap (the caller closes the connection at once).
    pub(crate) fn admit(&self) -> Option<OwnedSemaphorePermit> {
        self.total.clone().try_acquire_owned().ok()
    }

    /// Wraps an established connection. `authenticated`: it presented a client certificate. Returns the
    /// connection and whether an older connection without a certificate was closed to make room for it.
    pub(crate) fn establish<S>(&self, inner: S, place: OwnedSemaphorePermit, authenticated: bool) -> (Capped<S>, bool) {
        if authenticated {
            return (Capped { inner, _place: place, unauthenticated: None }, false);
        }
        let (tx, closed) = oneshot::channel();
        let mut u = self.unauthenticated.lock();
        let mut evicted = false;
        while u.live.len() >= self.caps.unauthenticated {
            if let Some((_, oldest)) = u.live.pop_front() {
                let _ = oldest.send(());
                evicted = true;
            }
        }
        let id = u.next_id;
        u.next_id += 1;
        u.live.push_back((id, tx));
        let limits = Limits {
            id,
            registry: self.unauthenticated.clone(),
            closed,
            idle: Box::pin(tokio::time::sleep(UNAUTHENTICATED_IDLE)),
            lifetime: Box::pin(tokio::time::sleep(UNAUTHENTICATED_LIFETIME)),
        };
        (Capped { inner, _place: place, unauthenticated: Some(limits) }, evicted)
    }

    /// Connections held now.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.caps.total - self.total.available_permits()
    }

    /// Connections without a certificate held now (not yet closed, nor told to close).
    #[cfg(test)]
    pub(crate) fn held_unauthenticated(&self) -> usize {
        self.unauthenticated.lock().live.len()
    }
}

/// What a connection without a certificate is closed by: its turn as the oldest at the cap, silence, age.
struct Limits {
    id: u64,
    registry: Arc<Mutex<Unauthenticated>>,
    closed: oneshot::Receiver<()>,
    idle: Pin<Box<tokio::time::Sleep>>,
    lifetime: Pin<Box<tokio::time::Sleep>>,
}

impl Drop for Limits {
    fn drop(&mut self) {
        let mut u = self.registry.lock();
        if let Some(at) = u.live.iter().position(|(id, _)| *id == self.id) {
            u.live.remove(at);
        }
    }
}

/// A connection holding its places; without a certificate, it ends (reads fail with `TimedOut`) after
/// `UNAUTHENTICATED_IDLE` without a byte read, `UNAUTHENTICATED_LIFETIME` after it was established, or when
/// a newer one takes its place at the cap.
pub(crate) struct Capped<S> {
    inner: S,
    _place: OwnedSemaphorePermit,
    unauthenticated: Option<Limits>,
}

impl<S> std::fmt::Debug for Capped<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capped").field("authenticated", &self.unauthenticated.is_none()).finish()
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Capped<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if let Some(u) = &mut this.unauthenticated {
            let why = if Pin::new(&mut u.closed).poll(cx).is_ready() {
                Some("no client certificate: the oldest such connection, closed for a new one".to_string())
            } else if u.lifetime.as_mut().poll(cx).is_ready() {
                Some(format!("no client certificate, open for {UNAUTHENTICATED_LIFETIME:?}"))
            } else if u.idle.as_mut().poll(cx).is_ready() {
                Some(format!("no client certificate and nothing sent for {UNAUTHENTICATED_IDLE:?}"))
            } else {
                None
            };
            if let Some(why) = why {
                return Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::TimedOut, why)));
            }
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let (Poll::Ready(Ok(())), Some(u)) = (&r, &mut this.unauthenticated) {
            if buf.filled().len() > before {
                u.idle.as_mut().reset(tokio::time::Instant::now() + UNAUTHENTICATED_IDLE);
            }
        }
        r
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Capped<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for Capped<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[test]
    fn caps_follow_the_descriptor_limit_within_their_bounds() {
        let check = |nofile, total, unauthenticated| {
            assert_eq!(RemoteCaps::for_nofile(nofile), RemoteCaps { total, unauthenticated }, "nofile {nofile}");
        };
        check(256, MIN_REMOTE_CONNECTIONS, 16);
        check(1024, 256, 32);
        check(4096, 1792, 224);
        check(1 << 20, MAX_REMOTE_CONNECTIONS, MAX_UNAUTHENTICATED_CONNECTIONS);
    }

    #[tokio::test]
    async fn places_are_taken_and_given_back_and_the_oldest_without_a_certificate_makes_room() {
        let caps = ListenerCaps::new(RemoteCaps { total: 3, unauthenticated: 2 });
        let places: Vec<_> = (0..3).map(|_| caps.admit().unwrap()).collect();
        assert!(caps.admit().is_none(), "the total cap");
        let mut places = places.into_iter();
        let (a_client, a_server) = tokio::io::duplex(64);
        let (mut a, evicted) = caps.establish(a_server, places.next().unwrap(), false);
        assert!(!evicted);
        let (_b, evicted) = caps.establish(tokio::io::empty(), places.next().unwrap(), false);
        assert!(!evicted);
        assert_eq!(caps.held_unauthenticated(), 2);
        let (c, evicted) = caps.establish(tokio::io::empty(), places.next().unwrap(), false);
        assert!(evicted, "the third without a certificate closes the oldest");
        let mut buf = [0u8; 4];
        let e = a.read(&mut buf).await.unwrap_err();
        assert!(e.to_string().contains("the oldest such connection"), "{e}");
        assert_eq!(caps.held_unauthenticated(), 2);
        drop((a, a_client, c));
        assert_eq!((caps.held(), caps.held_unauthenticated()), (1, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_without_a_certificate_is_closed_and_a_talking_one_lives_out_its_lifetime() {
        let caps = ListenerCaps::new(RemoteCaps::for_nofile(1024));
        let (client, server) = tokio::io::duplex(64);
        let (mut silent, _) = caps.establish(server, caps.admit().unwrap(), false);
        let mut buf = [0u8; 8];
        let start = tokio::time::Instant::now();
        let e = silent.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert!(e.to_string().contains("nothing sent"), "{e}");
        assert_eq!(start.elapsed(), UNAUTHENTICATED_IDLE);
        drop((silent, client));

        // One that sends a byte every 5 s keeps going until its lifetime ends.
        let (mut client, server) = tokio::io::duplex(64);
        let (mut talking, _) = caps.establish(server, caps.admit().unwrap(), false);
        let start = tokio::time::Instant::now();
        let err = loop {
            tokio::select! {
                r = talking.read(&mut buf) => match r {
                    Ok(_) => continue,
                    Err(e) => break e,
                },
                _ = tokio::time::sleep(Duration::from_secs(5)) => client.write_all(b"p").await.unwrap(),
            }
        };
        assert!(err.to_string().contains("open for"), "{err}");
        assert_eq!(start.elapsed(), UNAUTHENTICATED_LIFETIME);

        // With a certificate: no timeouts.
        let (mut client, server) = tokio::io::duplex(64);
        let (mut node, _) = caps.establish(server, caps.admit().unwrap(), true);
        tokio::time::sleep(UNAUTHENTICATED_LIFETIME * 2).await;
        client.write_all(b"late").await.unwrap();
        assert_eq!(node.read(&mut buf).await.unwrap(), 4);
    }
}
