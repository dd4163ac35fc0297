//! The Engine API's connections, bounded: how many are open at once, how long a client may take to send a
//! request's head (which, between two requests on a keep-alive connection, is also how long an idle connection
//! is kept: hyper starts that timer as soon as it waits for the next head), and how long a request's body may
//! take (`request::BodyReadTimeout`). At the connection cap, the connection idle the longest is closed to make
//! room for the new one; when none is idle, the new one gets a 503 and is closed. A connection whose request's
//! body has not fully arrived counts as idle (a client that sends half a body holds no slot a new client
//! cannot take). Beyond the cap, `owner_reserve` more connections are kept for the control socket's owner
//! (a peer with the socket file's user ID, `SO_PEERCRED`), so that its owner is answered whatever other users
//! of the socket hold. Log lines about refused or evicted connections are rate-limited.
//!
//! A request head hyper cannot take (a URI over 65,534 bytes: 414; a head over `MAX_HEAD_BYTES` or with more
//! than `MAX_HEADERS` headers: 431; a malformed one: 400) never reaches a handler: hyper answers it itself, with
//! no body, and closes. `JsonParseErrors`, around every connection's IO, turns that answer into the API's JSON
//! error (`{"message": ...}`, `Content-Type: application/json`) on its way out.
//!
//! `serve_unix` runs a whole listener; `serve_connection` serves one already accepted connection (the TCP
//! Engine API, whose TLS and connection cap live in the node, uses it). Must not depend on the store or Raft.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::Router;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::{watch, Notify};
use tower::ServiceExt;

use crate::request::BodyReadTimeout;

/// The largest request head (request line and headers) read: hyper's default read buffer, stated here as a
/// bound (at most this much per connection is buffered for a head). Beyond it: 431.
pub const MAX_HEAD_BYTES: usize = 8192 + 4096 * 100;

/// The most headers a request may carry (hyper's default). Beyond it: 431.
pub const MAX_HEADERS: usize = 100;

/// The longest request URI hyper parses (a constant of hyper's). Beyond it: 414.
pub const MAX_URI_BYTES: usize = u16::MAX as usize - 1;

/// The bounds of a listener's connections.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Connections open at once; at the cap the longest-idle one is closed, or the new one refused with 503.
    pub max_connections: usize,
    /// How long a request's head may take to arrive, counted from the connection's start or the end of the
    /// previous response (so it is the keep-alive idle timeout as well).
    pub header_read_timeout: Duration,
    /// How long a request's body may take to arrive once its head is in (408 beyond it).
    pub body_read_timeout: Duration,
    /// On shutdown, how long requests in flight (log streams included) may go on before they are cut.
    pub shutdown_grace: Duration,
    /// Connections kept beyond `max_connections` for the unix socket's owner (its file's user ID).
    pub owner_reserve: usize,
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            max_connections: 1024,
            header_read_timeout: Duration::from_secs(60),
            body_read_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(10),
            owner_reserve: 64,
        }
    }
}

/// What the listener knows about one open connection.
#[derive(Debug)]
pub struct ConnectionState {
    in_flight: AtomicUsize,
    /// Of the requests in flight, those whose body has not fully arrived.
    awaiting_body: AtomicUsize,
    idle_since: Mutex<Instant>,
    evict: Notify,
    /// Told when the last request in flight ends (a hijacked stream's included).
    idle: Notify,
}

impl ConnectionState {
    fn new() -> ConnectionState {
        ConnectionState {
            in_flight: AtomicUsize::new(0),
            awaiting_body: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            evict: Notify::new(),
            idle: Notify::new(),
        }
    }

    /// Marks a request in flight until the guard (held by its response body, and by a hijacked stream made
    /// of it) is dropped.
    fn begin(self: &Arc<Self>) -> Arc<InFlight> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        Arc::new(InFlight(self.clone()))
    }

    /// Since when it has had no request in flight whose body has arrived (None: it has one now).
    fn idle_since(&self) -> Option<Instant> {
        let since = *self.idle_since.lock().unwrap_or_else(|p| p.into_inner());
        let busy = self.in_flight.load(Ordering::SeqCst) > self.awaiting_body.load(Ordering::SeqCst);
        (!busy).then_some(since)
    }
}

/// Counts a request among those awaiting their body until the body ends or is dropped.
struct AwaitingBody(Arc<ConnectionState>);

impl AwaitingBody {
    fn new(state: &Arc<ConnectionState>) -> AwaitingBody {
        state.awaiting_body.fetch_add(1, Ordering::SeqCst);
        AwaitingBody(state.clone())
    }
}

impl Drop for AwaitingBody {
    fn drop(&mut self) {
        self.0.awaiting_body.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A request body that keeps its connection evictable (`AwaitingBody`) until its last byte arrived.
struct WatchedBody {
    inner: hyper::body::Incoming,
    awaiting: Option<AwaitingBody>,
}

impl hyper::body::Body for WatchedBody {
    type Data = hyper::body::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        if frame.is_none() || hyper::body::Body::is_end_stream(&self.inner) {
            self.awaiting = None;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// One request in flight on a connection.
#[derive(Debug)]
pub struct InFlight(Arc<ConnectionState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        *self.0.idle_since.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_one();
        }
    }
}

/// A request extension every request served by `serve_connection` carries: what a handler that takes the
/// connection over (an upgraded or hijacked stream: `relay`) holds while it uses it, so that the connection
/// stays counted, busy (never evicted as idle) and within the listener's shutdown until the stream ends.
#[derive(Debug, Clone)]
pub struct HeldConnection {
    /// Keeps the request in flight.
    pub in_flight: Arc<InFlight>,
    /// Becomes true (or closed) when the connection must end: the listener shuts down (after its grace) or
    /// the connection's server is gone.
    pub closing: watch::Receiver<bool>,
}

impl HeldConnection {
    /// Resolves when the stream must end.
    pub async fn closed(mut self) {
        let _ = self.closing.wait_for(|v| *v).await;
    }
}

/// At most one warning per `EVERY`, with the count of those left out.
struct RateLimitedWarn {
    last: Mutex<Option<Instant>>,
    suppressed: AtomicU64,
}

impl RateLimitedWarn {
    const EVERY: Duration = Duration::from_secs(10);

    fn new() -> RateLimitedWarn {
        RateLimitedWarn { last: Mutex::new(None), suppressed: AtomicU64::new(0) }
    }

    /// Whether to log now, with how many were left out since the last line.
    fn allow(&self) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| t.elapsed() < Self::EVERY) {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *last = Some(Instant::now());
        Some(self.suppressed.swap(0, Ordering::Relaxed))
    }

    fn warn(&self, what: &str, max_connections: usize) {
        if let Some(suppressed) = self.allow() {
            tracing::warn!(max_connections, suppressed, "Engine API connection cap reached: {what}");
        }
    }
}

/// The open connections of one listener.
struct Registry {
    max: usize,
    reserve: usize,
    next_id: AtomicU64,
    open: Mutex<HashMap<u64, Arc<ConnectionState>>>,
    warn: RateLimitedWarn,
}

impl Registry {
    /// A slot for a new connection, closing the longest-idle one at the cap; None when all are busy. The
    /// socket's owner may go `reserve` connections beyond the cap before anything is closed for it.
    fn admit(&self, owner: bool) -> Option<(u64, Arc<ConnectionState>)> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let within_reserve = owner && open.len() < self.max + self.reserve;
        if open.len() >= self.max && !within_reserve {
            let oldest = open.iter().filter_map(|(id, c)| c.idle_since().map(|t| (t, *id))).min().map(|(_, id)| id);
            let Some(victim) = oldest.and_then(|id| open.remove(&id)) else {
                drop(open);
                self.warn
                    .warn("refused a new connection with 503 (every connection has a request in flight)", self.max);
                return None;
            };
            victim.evict.notify_one();
            self.warn.warn("closed the longest-idle connection to admit a new one", self.max);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(ConnectionState::new());
        open.insert(id, state.clone());
        Some((id, state))
    }

    fn remove(&self, id: u64) {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
    }
}

/// Serves `router` on `listener` within `limits` until `shutdown` resolves; requests in flight then get
/// `limits.shutdown_grace` to finish.
pub async fn serve_unix(
    listener: tokio::net::UnixListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // The owner of the socket file (the daemon's user, who created it).
    let owner_uid = listener.local_addr().ok().and_then(|a| {
        use std::os::unix::fs::MetadataExt;
        a.as_pathname().and_then(|p| std::fs::metadata(p).ok()).map(|m| m.uid())
    });
    let registry = Arc::new(Registry {
        max: limits.max_connections.max(1),
        reserve: limits.owner_reserve,
        next_id: AtomicU64::new(0),
        open: Mutex::new(HashMap::new()),
        warn: RateLimitedWarn::new(),
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    let accept_errors = RateLimitedWarn::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => match registry.admit(
                    owner_uid.is_some_and(|uid| stream.peer_cred().is_ok_and(|c| c.uid() == uid)),
                ) {
                    Some((id, state)) => {
                        let (router, registry, stop) = (router.clone(), registry.clone(), stop_rx.clone());
                        tasks.spawn(async move {
                            serve_connection(stream, router, limits, state, wait_true(stop)).await;
                            registry.remove(id);
                        });
                    }
                    None => {
                        tasks.spawn(refuse(stream));
                    }
                },
                Err(e) => {
                    // Out of file descriptors or memory: wait a little rather than spin on the error.
                    if let Some(suppressed) = accept_errors.allow() {
                        tracing::warn!(error = %e, suppressed, "Engine API accept failed");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let drained = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(limits.shutdown_grace, drained).await.is_err() {
        tracing::warn!(grace = ?limits.shutdown_grace, "Engine API requests still in flight at shutdown were cut");
        tasks.shutdown().await;
    }
    Ok(())
}

async fn wait_true(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

/// Answers 503 on a connection beyond the cap, and closes it: after reading the request's head and draining
/// its body (at most 64 KiB and 1 s in all), so that the client reads the answer instead of a broken pipe.
async fn refuse(mut stream: tokio::net::UnixStream) {
    let _ = tokio::time::timeout(Duration::from_secs(1), drain_one_request(&mut stream, 64 << 10)).await;
    let body = r#"{"message":"too many connections to the Engine API: retry shortly"}"#;
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: \
         close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(answer.as_bytes())).await;
    let _ = stream.shutdown().await;
}

async fn drain_one_request(stream: &mut tokio::net::UnixStream, limit: usize) {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let mut wanted = None;
    while buf.len() < limit {
        if wanted.is_none() {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let len = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:").and_then(|v| v.trim().parse::<usize>().ok()))
                    .unwrap_or(0);
                wanted = Some(end + 4 + len);
            }
        }
        if wanted.is_some_and(|w| buf.len() >= w) {
            return;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Serves HTTP/1.1 (and HTTP/2 with prior knowledge or ALPN) on one connection within `limits` until the
/// client closes it, a timeout closes it, `state` is evicted, or `stop` resolves (then the request in
/// flight gets `limits.shutdown_grace` to finish).
pub async fn serve_connection<I>(
    io: I,
    router: Router,
    limits: ConnectionLimits,
    state: Arc<ConnectionState>,
    stop: impl Future<Output = ()>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let tracked = state.clone();
    // Dropped (or set) when this function returns: hijacked streams end with the connection.
    let (closing_tx, closing_rx) = watch::channel(false);
    let svc = tower::service_fn(move |mut req: Request<hyper::body::Incoming>| {
        let guard = tracked.begin();
        req.extensions_mut().insert(BodyReadTimeout(limits.body_read_timeout));
        req.extensions_mut().insert(HeldConnection { in_flight: guard.clone(), closing: closing_rx.clone() });
        let router = router.clone();
        let tracked = tracked.clone();
        async move {
            let req = req.map(|inner| {
                let awaiting = (!hyper::body::Body::is_end_stream(&inner)).then(|| AwaitingBody::new(&tracked));
                Body::new(WatchedBody { inner, awaiting })
            });
            let resp = router.oneshot(req).await?;
            // The request stays in flight until its answer is sent (a log stream included).
            Ok::<_, std::convert::Infallible>(resp.map(|b| {
                Body::new(b.map_err(move |e| {
                    let _held = &guard;
                    e
                }))
            }))
        }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(MAX_HEAD_BYTES)
        .max_headers(MAX_HEADERS);
    builder.http2().timer(TokioTimer::new());
    let io = TokioIo::new(JsonParseErrors::new(io));
    // With upgrades: a relayed `attach` or `exec` start answers 101 and the connection becomes a raw stream.
    let mut conn =
        Box::pin(builder.serve_connection_with_upgrades(io, hyper_util::service::TowerToHyperService::new(svc)));
    tokio::pin!(stop);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(error = %e, "Engine API connection ended");
            }
        }
        _ = state.evict.notified() => return,
        _ = &mut stop => {
            conn.as_mut().graceful_shutdown();
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = state.evict.notified() => {}
                _ = tokio::time::sleep(limits.shutdown_grace) => {}
            }
            return;
        }
    }
    // The ended connection holds the response it was sending (an events stream's body, with its request in
    // flight): dropped here, so only a stream it was upgraded to keeps the connection counted.
    drop(conn);
    // The HTTP connection is done; a stream it was upgraded to may still run (it holds a request in flight):
    // the connection stays open and counted until it ends, or the listener stops (then within the grace).
    let mut deadline: Option<Pin<Box<tokio::time::Sleep>>> = None;
    while state.in_flight.load(Ordering::SeqCst) > 0 {
        let stopped = deadline.is_some();
        let grace = async {
            match deadline.as_mut() {
                Some(d) => d.as_mut().await,
                None => std::future::pending().await,
            }
        };
        let stop_now = tokio::select! {
            _ = state.idle.notified() => false,
            _ = &mut stop, if !stopped => true,
            _ = grace => break,
        };
        if stop_now {
            deadline = Some(Box::pin(tokio::time::sleep(limits.shutdown_grace)));
        }
    }
    let _ = closing_tx.send(true);
}

/// The API's JSON answer in place of the bare one hyper writes for a request head it could not parse: `out`
/// is exactly such an answer (an HTTP/1.x status line of 400, 414 or 431, headers with `content-length: 0`,
/// nothing after them). Anything else (every answer of a handler, which always has a body or a type, and
/// every body write, which never starts with a status line) is None.
fn json_answer_for_parse_error(out: &[u8]) -> Option<Vec<u8>> {
    let head = std::str::from_utf8(out).ok()?;
    let head = head.strip_suffix("\r\n\r\n")?;
    if head.contains("\r\n\r\n") {
        return None;
    }
    let mut lines = head.split("\r\n");
    let status_line = lines.next()?;
    let rest = status_line.strip_prefix("HTTP/1.1 ").or_else(|| status_line.strip_prefix("HTTP/1.0 "))?;
    let code = rest.get(..3)?;
    let headers: Vec<(String, &str)> =
        lines.filter_map(|l| l.split_once(':').map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim()))).collect();
    let empty = headers.iter().any(|(n, v)| n == "content-length" && *v == "0");
    let typed = headers.iter().any(|(n, _)| n == "content-type");
    if !empty || typed {
        return None;
    }
    let (reason, message) = match code {
        "414" => ("URI Too Long", format!("request URI too long: the limit is {MAX_URI_BYTES} bytes")),
        "431" => (
            "Request Header Fields Too Large",
            format!(
                "request header fields too large: the limit is {MAX_HEAD_BYTES} bytes for the request line and \
                 headers, and {MAX_HEADERS} headers"
            ),
        ),
        "400" => (
            "Bad Request",
            "malformed HTTP request: the request line or a header could not be \
                                  parsed"
                .to_string(),
        ),
        _ => return None,
    };
    let body = serde_json::to_string(&crate::json::ErrorResponse { message }).ok()?;
    let mut answer =
        format!("HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n", body.len());
    for (name, value) in &headers {
        if name == "date" {
            answer.push_str(&format!("Date: {value}\r\n"));
        }
    }
    answer.push_str("Connection: close\r\n\r\n");
    answer.push_str(&body);
    Some(answer.into_bytes())
}

/// A connection's IO with hyper's own answers to unparsable heads rewritten as JSON errors (see
/// `json_answer_for_parse_error`). Writes are not vectored, so that hyper hands over each answer's head in
/// one buffer; the rewritten answer is written in full before the write it replaces is reported done.
struct JsonParseErrors<I> {
    inner: I,
    /// A rewritten answer being written, and how much of it is out.
    rewriting: Option<(Vec<u8>, usize)>,
    /// A `101` went out: the connection is a raw stream now (a relayed `attach` or `exec`), never rewritten.
    upgraded: bool,
}

impl<I> JsonParseErrors<I> {
    fn new(inner: I) -> JsonParseErrors<I> {
        JsonParseErrors { inner, rewriting: None, upgraded: false }
    }
}

/// Most bytes handed to hyper per read. Hyper checks its head limit (`max_buf_size`) only before it reads again,
/// and its buffer's capacity may exceed the limit (allocation rounding): a head well over the limit that arrived in
/// one large read could be parsed whole. In reads of at most this, a head is refused once it passes
/// `MAX_HEAD_BYTES` by less than one read.
pub const MAX_READ_BYTES: usize = 64 << 10;

impl<I: AsyncRead + Unpin> AsyncRead for JsonParseErrors<I> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        if buf.remaining() <= MAX_READ_BYTES {
            return Pin::new(&mut self.inner).poll_read(cx, buf);
        }
        // Safe code only: the window is zeroed (initialized) first, read into, then marked filled.
        let window = buf.initialize_unfilled_to(MAX_READ_BYTES);
        let mut limited = ReadBuf::new(window);
        ready!(Pin::new(&mut self.inner).poll_read(cx, &mut limited))?;
        let n = limited.filled().len();
        buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for JsonParseErrors<I> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        if this.upgraded {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        }
        if buf.starts_with(b"HTTP/1.1 101 ") {
            this.upgraded = true;
        }
        if this.rewriting.is_none() && !this.upgraded {
            this.rewriting = json_answer_for_parse_error(buf).map(|a| (a, 0));
        }
        let Some((answer, written)) = this.rewriting.as_mut() else {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        };
        while *written < answer.len() {
            let n = ready!(Pin::new(&mut this.inner).poll_write(cx, &answer[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        this.rewriting = None;
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A connection state for a connection served outside `serve_unix` (no eviction).
pub fn untracked() -> Arc<ConnectionState> {
    Arc::new(ConnectionState::new())
}

#[cfg(test)]
mod tests {
    use super::json_answer_for_parse_error;

    #[test]
    fn only_hypers_bare_answers_to_unparsable_heads_are_rewritten() {
        let check = |out: &str, code: Option<&str>| {
            let got = json_answer_for_parse_error(out.as_bytes()).map(|a| String::from_utf8(a).unwrap());
            match (code, got) {
                (None, None) => {}
                (Some(code), Some(a)) => {
                    assert!(a.starts_with(&format!("HTTP/1.1 {code} ")), "{out:?} -> {a}");
                    assert!(a.contains("Content-Type: application/json\r\n"), "{a}");
                    let body = a.split("\r\n\r\n").nth(1).unwrap();
                    assert!(a.contains(&format!("Content-Length: {}\r\n", body.len())), "{a}");
                    let v: serde_json::Value = serde_json::from_str(body).unwrap();
                    assert!(v["message"].as_str().unwrap().contains("limit") || code == "400", "{a}");
                }
                (want, got) => panic!("{out:?}: wanted {want:?}, got {got:?}"),
            }
        };
        let date = "date: Tue, 01 Dec 2026 01:00:00 GMT";
        check(
            &format!("HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n{date}\r\n\r\n"),
            Some("431"),
        );
        check(&format!("HTTP/1.1 414 URI Too Long\r\ncontent-length: 0\r\n{date}\r\n\r\n"), Some("414"));
        check(&format!("HTTP/1.0 400 Bad Request\r\ncontent-length: 0\r\n{date}\r\n\r\n"), Some("400"));
        // Our own answers (typed, with a body), other codes, and body bytes pass through.
        check(
            "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 13\r\n\r\n{\"message\":1}",
            None,
        );
        check("HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n", None);
        check("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", None);
        check("HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 5\r\n\r\n", None);
        check("HTTP/1.1 414 URI Too Long\r\ncontent-length: 0\r\n\r\nHTTP/1.1 414 URI Too Long\r\n\r\n", None);
        check("{\"message\": \"HTTP/1.1 431 \"}", None);
        check("1a\r\nHTTP/1.1 431 x\r\ncontent-length: 0\r\n\r\n", None);
    }
}
