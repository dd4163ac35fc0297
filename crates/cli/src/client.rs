//! A small blocking HTTP/1.1 client for the Engine API on the control unix socket: one connection per
//! request (`Connection: close`) on a std `UnixStream`, the answer's head parsed by `httparse` and its body
//! read by `Content-Length`, chunked transfer coding, or to the end of the connection. No async runtime: a
//! CLI process does one or two requests, and a runtime and its threads would cost more to start than the
//! request (BENCHMARKS.md, "writes"). Non-2xx answers become `CliError::Api` with the server's `message`.
//! Each request is bounded by `REQUEST_TIMEOUT` (connect to last byte) and responses by
//! `MAX_RESPONSE_BYTES`. Must not depend on cluster logic.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use hyper::body::Bytes;
use hyper::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Longest a request (connect, send, read the whole answer) may take.
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest response body read.
pub(super) const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;
/// Largest response head (status line and headers) read.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most headers in a response.
const MAX_HEADERS: usize = 64;

/// Why a client command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The daemon answered with an error; the message is the API's.
    #[error("{0}")]
    Api(String),
    /// The socket could not be reached.
    #[error(
        "cannot connect to the Shoal daemon at {path}: {reason}; is `shoal daemon` running? (set -H or SHOAL_HOST)"
    )]
    Connect {
        /// The socket path.
        path: String,
        /// The OS error.
        reason: String,
    },
    /// The connection broke or timed out, or the answer was not what the API documents.
    #[error("talking to the Shoal daemon at {path}: {reason}")]
    Transport {
        /// The socket path.
        path: String,
        /// What failed.
        reason: String,
    },
    /// Some items failed and each failure was already printed; exit 1 without another message.
    #[error("some items failed (see above)")]
    AlreadyReported,
    /// A bad value on the command line that clap could not catch.
    #[error("{0}")]
    Usage(String),
}

/// Turns `unix:///path` or a bare path into a socket path.
pub(super) fn socket_path(host: &str) -> Result<PathBuf, CliError> {
    if let Some(p) = host.strip_prefix("unix://") {
        return Ok(PathBuf::from(p));
    }
    if host.contains("://") {
        return Err(CliError::Usage(format!(
            "unsupported host {host:?}: use unix:///path/to/control.sock or a socket path"
        )));
    }
    Ok(PathBuf::from(host))
}

/// A blocking Engine API client.
pub struct Client {
    socket: PathBuf,
    timeout: Duration,
}

impl Client {
    /// A client for `host` (`unix:///path` or a path). Connects lazily, per request.
    pub fn new(host: &str) -> Result<Client, CliError> {
        Ok(Client { socket: socket_path(host)?, timeout: REQUEST_TIMEOUT })
    }

    fn transport(&self, reason: impl ToString) -> CliError {
        CliError::Transport { path: self.socket.display().to_string(), reason: reason.to_string() }
    }

    /// Sends one request; returns the status and body.
    pub fn request(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> Result<(StatusCode, Bytes), CliError> {
        let deadline = Instant::now() + self.timeout;
        let mut stream = UnixStream::connect(&self.socket)
            .map_err(|e| CliError::Connect { path: self.socket.display().to_string(), reason: e.to_string() })?;
        let body = body.unwrap_or_default();
        let content_type =
            if body.is_empty() && method == Method::GET { "" } else { "Content-Type: application/json\r\n" };
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: shoal\r\nConnection: close\r\n{content_type}Content-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(&body);
        let io = |e: std::io::Error| {
            if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) {
                self.transport(format!("no answer within {}s", self.timeout.as_secs()))
            } else {
                self.transport(e)
            }
        };
        let left =
            remaining(deadline).map_err(|_| self.transport(format!("no answer within {}s", self.timeout.as_secs())))?;
        stream.set_write_timeout(Some(left)).map_err(io)?;
        stream.write_all(&req).map_err(io)?;
        let mut reader = Reader { stream, deadline, buf: Vec::with_capacity(8192), pos: 0 };
        let (status, body) = read_response(&mut reader).map_err(|e| match e {
            ReadError::Io(e) => io(e),
            ReadError::Timeout => self.transport(format!("no answer within {}s", self.timeout.as_secs())),
            ReadError::Bad(reason) => self.transport(format!("malformed answer to {path}: {reason}")),
        })?;
        Ok((status, Bytes::from(body)))
    }

    /// Sends a request and decodes a 2xx JSON answer (or maps the error body to `CliError::Api`).
    pub fn call<T: DeserializeOwned>(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> Result<T, CliError> {
        let (status, bytes) = self.request(method, path, body)?;
        if !status.is_success() {
            let msg = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_string))
                .unwrap_or_else(|| format!("{status}: {}", String::from_utf8_lossy(&bytes).trim()));
            return Err(CliError::Api(msg));
        }
        decode_answer(&bytes).map_err(|e| self.transport(format!("unexpected answer to {path}: {e}")))
    }

    /// `GET path` as JSON.
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, CliError> {
        self.call(Method::GET, path, None)
    }

    /// `POST path` with a JSON body.
    pub fn post<T: DeserializeOwned>(&self, path: &str, body: &impl Serialize) -> Result<T, CliError> {
        let body = serde_json::to_vec(body).map_err(|e| CliError::Usage(e.to_string()))?;
        self.call(Method::POST, path, Some(body))
    }

    /// `DELETE path`.
    pub fn delete(&self, path: &str) -> Result<(), CliError> {
        self.call::<serde_json::Value>(Method::DELETE, path, None).map(|_| ())
    }
}

/// Why reading an answer failed.
enum ReadError {
    Io(std::io::Error),
    Timeout,
    Bad(String),
}

/// Time left before `deadline`, or a timeout.
fn remaining(deadline: Instant) -> Result<Duration, ReadError> {
    deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()).ok_or(ReadError::Timeout)
}

/// A buffered reader over the connection that honours the request's deadline.
struct Reader<S> {
    stream: S,
    deadline: Instant,
    buf: Vec<u8>,
    /// Bytes of `buf` already consumed.
    pos: usize,
}

/// A stream whose read timeout can be set (a `UnixStream`; a byte slice in tests).
trait TimedRead: Read {
    fn set_timeout(&mut self, d: Duration) -> std::io::Result<()>;
}

impl TimedRead for UnixStream {
    fn set_timeout(&mut self, d: Duration) -> std::io::Result<()> {
        self.set_read_timeout(Some(d))
    }
}

impl<S: TimedRead> Reader<S> {
    /// Reads more bytes into `buf`; false at the end of the connection.
    fn fill(&mut self) -> Result<bool, ReadError> {
        let left = remaining(self.deadline)?;
        self.stream.set_timeout(left).map_err(ReadError::Io)?;
        let mut chunk = [0u8; 16 * 1024];
        let n = loop {
            match self.stream.read(&mut chunk) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    return Err(ReadError::Timeout)
                }
                Err(e) => return Err(ReadError::Io(e)),
            }
        };
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n > 0)
    }

    /// Unconsumed bytes.
    fn pending(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    /// Takes exactly `n` bytes.
    fn take(&mut self, n: usize) -> Result<Vec<u8>, ReadError> {
        while self.pending().len() < n {
            if !self.fill()? {
                return Err(ReadError::Bad("the connection closed inside the body".into()));
            }
        }
        let out = self.pending()[..n].to_vec();
        self.pos += n;
        Ok(out)
    }

    /// Takes one CRLF-terminated line (without the CRLF), at most `max` bytes.
    fn line(&mut self, max: usize) -> Result<Vec<u8>, ReadError> {
        loop {
            if let Some(i) = self.pending().windows(2).position(|w| w == b"\r\n") {
                let out = self.pending()[..i].to_vec();
                self.pos += i + 2;
                return Ok(out);
            }
            // A line of `max` bytes and its CRLF would have been found by now.
            if self.pending().len() >= max + 2 {
                return Err(ReadError::Bad("a chunk line is too long".into()));
            }
            if !self.fill()? {
                return Err(ReadError::Bad("the connection closed inside a chunked body".into()));
            }
        }
    }
}

/// Reads one HTTP/1.1 answer: status, then the body by Content-Length, chunks, or to the end.
fn read_response<S: TimedRead>(r: &mut Reader<S>) -> Result<(StatusCode, Vec<u8>), ReadError> {
    let (status, head_len, length, chunked) = loop {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut headers);
        match resp.parse(r.pending()).map_err(|e| ReadError::Bad(e.to_string()))? {
            httparse::Status::Complete(n) => {
                let code = resp.code.ok_or_else(|| ReadError::Bad("no status code".into()))?;
                let status = StatusCode::from_u16(code).map_err(|e| ReadError::Bad(e.to_string()))?;
                let mut length = None;
                let mut chunked = false;
                for h in resp.headers.iter() {
                    if h.name.eq_ignore_ascii_case("content-length") {
                        let v = std::str::from_utf8(h.value).ok().and_then(|v| v.trim().parse::<usize>().ok());
                        length = Some(v.ok_or_else(|| ReadError::Bad("a bad Content-Length".into()))?);
                    } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                        chunked = String::from_utf8_lossy(h.value).to_ascii_lowercase().contains("chunked");
                    }
                }
                break (status, n, length, chunked);
            }
            httparse::Status::Partial => {
                if r.pending().len() > MAX_HEAD_BYTES {
                    return Err(ReadError::Bad(format!("a response head over {MAX_HEAD_BYTES} bytes")));
                }
                if !r.fill()? {
                    return Err(ReadError::Bad("the connection closed before a full answer".into()));
                }
            }
        }
    };
    r.pos += head_len;
    let too_big = || ReadError::Bad(format!("a response over {MAX_RESPONSE_BYTES} bytes"));
    let body = if chunked {
        let mut body = Vec::new();
        loop {
            let line = r.line(1024)?;
            let size = std::str::from_utf8(&line)
                .ok()
                .and_then(|l| usize::from_str_radix(l.split(';').next().unwrap_or("").trim(), 16).ok())
                .ok_or_else(|| ReadError::Bad("a bad chunk size".into()))?;
            if size == 0 {
                break;
            }
            if body.len() + size > MAX_RESPONSE_BYTES {
                return Err(too_big());
            }
            body.extend(r.take(size)?);
            if !r.line(0)?.is_empty() {
                return Err(ReadError::Bad("a chunk without its CRLF".into()));
            }
        }
        body
    } else if let Some(n) = length {
        if n > MAX_RESPONSE_BYTES {
            return Err(too_big());
        }
        r.take(n)?
    } else {
        while r.fill()? {
            if r.pending().len() > MAX_RESPONSE_BYTES {
                return Err(too_big());
            }
        }
        r.pending().to_vec()
    };
    Ok((status, body))
}

/// Percent-encodes one path segment or query value.
pub(super) fn enc(s: &str) -> String {
    urlencoding::encode(s).into_owned()
}

/// A `filters=` query value for Docker's filter syntax: `{"name": {"value": true}, ...}`.
pub(super) fn filters_query(pairs: &[(&str, &str)]) -> String {
    let mut map = serde_json::Map::new();
    for (k, v) in pairs {
        let entry = map.entry(k.to_string()).or_insert_with(|| serde_json::Value::Object(Default::default()));
        if let serde_json::Value::Object(m) = entry {
            m.insert(v.to_string(), serde_json::Value::Bool(true));
        }
    }
    enc(&serde_json::Value::Object(map).to_string())
}

/// Decodes an answer's body as the docker CLI (Go's `encoding/json`) does: a `null` member is the zero value,
/// keys match case-insensitively. The daemon merges the node's Docker Engine's answers into some of its own
/// (`/info`), and the engine sends `null` for empty lists. An empty body is JSON `null`.
fn decode_answer<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    if bytes.is_empty() {
        return serde_json::from_slice(b"null").map_err(|e| e.to_string());
    }
    shoal_engine_json::decode(bytes).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_parse() {
        assert_eq!(
            socket_path("unix:///var/run/shoal/control.sock").unwrap(),
            PathBuf::from("/var/run/shoal/control.sock")
        );
        assert_eq!(socket_path("/tmp/x.sock").unwrap(), PathBuf::from("/tmp/x.sock"));
        assert!(socket_path("tcp://1.2.3.4:2375").is_err());
    }

    impl TimedRead for &[u8] {
        fn set_timeout(&mut self, _: Duration) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A connection that delivers one byte per read: every boundary inside an answer is met.
    struct ByteByByte<'a>(&'a [u8]);

    impl Read for ByteByByte<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.0.len().min(buf.len()).min(1);
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    impl TimedRead for ByteByByte<'_> {
        fn set_timeout(&mut self, _: Duration) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn parse_from<S: TimedRead>(stream: S) -> Result<(StatusCode, Vec<u8>), String> {
        let mut r = Reader { stream, deadline: Instant::now() + Duration::from_secs(5), buf: Vec::new(), pos: 0 };
        read_response(&mut r).map_err(|e| match e {
            ReadError::Bad(s) => s,
            ReadError::Io(e) => e.to_string(),
            ReadError::Timeout => "timeout".into(),
        })
    }

    /// Parses `raw` read whole and read byte by byte; both must agree.
    fn parse(raw: &[u8]) -> Result<(StatusCode, Vec<u8>), String> {
        let whole = parse_from(raw);
        assert_eq!(parse_from(ByteByByte(raw)), whole, "byte by byte");
        whole
    }

    #[test]
    fn answers_are_read_by_length_chunks_or_to_the_end() {
        let (st, b) = parse(b"HTTP/1.1 201 Created\r\ncontent-length: 7\r\n\r\n{\"a\":1}").unwrap();
        assert_eq!((st, b.as_slice()), (StatusCode::CREATED, &b"{\"a\":1}"[..]));
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\n[1,\r\n2\r\n2]\r\n0\r\n\r\n";
        let (st, b) = parse(raw).unwrap();
        assert_eq!((st, b.as_slice()), (StatusCode::OK, &b"[1,2]"[..]));
        let (st, b) = parse(b"HTTP/1.1 404 Not Found\r\n\r\n{\"message\":\"x\"}").unwrap();
        assert_eq!((st, b.as_slice()), (StatusCode::NOT_FOUND, &b"{\"message\":\"x\"}"[..]));
    }

    #[test]
    fn truncated_or_malformed_answers_are_errors() {
        assert!(parse(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort").unwrap_err().contains("inside the body"));
        assert!(parse(b"HTTP/1.1 200 OK\r\ncontent-le").unwrap_err().contains("before a full answer"));
        assert!(parse(b"garbage\r\n\r\n").is_err());
        assert!(parse(b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n").unwrap_err().contains("Content-Length"));
        let raw = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n";
        assert!(parse(raw).unwrap_err().contains("chunk size"));
        let raw = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nab";
        assert!(parse(raw).unwrap_err().contains("inside the body"));
    }

    /// The `/info` of a daemon beside a Docker Engine carries the engine's `"Authorization": null`: the client
    /// reads it as docker's does, an empty list (it failed on every such host before).
    #[test]
    fn answers_decode_as_go_does_with_null_members() {
        let info = br#"{"Name":"n","Plugins":{"Authorization":null,"Log":["json-file"]},"Swarm":{"NodeID":"x"}}"#;
        assert!(serde_json::from_slice::<shoal_engine_json::InfoJson>(info).is_err(), "the strict decoder fails");
        let i: shoal_engine_json::InfoJson = decode_answer(info).unwrap();
        assert_eq!((i.name.as_str(), i.swarm.node_id.as_str()), ("n", "x"));
        let v: serde_json::Value = decode_answer(br#"{"a":[1,null]}"#).unwrap();
        assert_eq!(v, serde_json::json!({"a": [1, null]}));
        decode_answer::<()>(b"").unwrap();
    }

    #[test]
    fn a_daemon_that_does_not_answer_times_out_with_one_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("s.sock");
        let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        // Accepts and reads, never answers; ends when the client gives up and closes.
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut sink = Vec::new();
            let _ = conn.read_to_end(&mut sink);
        });
        let mut c = Client::new(sock.to_str().unwrap()).unwrap();
        c.timeout = Duration::from_millis(200);
        let err = c.request(Method::GET, "/_ping", None).unwrap_err();
        assert!(err.to_string().contains("no answer within"), "{err}");
        drop(c);
        server.join().unwrap();
    }
}
