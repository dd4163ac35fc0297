//! The control socket's connections under hostile and careless clients, over a real unix socket: idle
//! connections by the thousand, slow heads and bodies, a full house of busy connections, and answers sent only
//! once the request body is read (a 404 or a 413 included). Raw HTTP/1.1 over `std::os::unix::net::UnixStream`,
//! every read with a deadline.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use shoal_engine_api::connections::ConnectionLimits;
use shoal_testkit::api_server::ApiServer;

const DEADLINE: Duration = Duration::from_secs(20);

/// A parsed HTTP answer.
#[derive(Debug)]
struct Answer {
    status: u16,
    head: String,
    body: String,
}

fn connect(socket: &Path) -> UnixStream {
    let s = UnixStream::connect(socket).expect("connect");
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    s.set_write_timeout(Some(DEADLINE)).unwrap();
    s
}

/// Reads one answer (head, then Content-Length bytes) from `s`; None if the connection ended first.
fn read_answer(s: &mut UnixStream) -> Option<Answer> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            let len = head
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string()))
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(0);
            while buf.len() < end + 4 + len {
                match s.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
            let body = String::from_utf8_lossy(&buf[end + 4..]).into_owned();
            return Some(Answer { status, head, body });
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn ping(socket: &Path) -> Answer {
    let mut s = connect(socket);
    s.write_all(b"GET /_ping HTTP/1.1\r\nHost: docker\r\n\r\n").unwrap();
    read_answer(&mut s).expect("an answer to /_ping")
}

/// Whether the server closed `s` (EOF or reset) within the deadline.
fn closed_by_server(s: &mut UnixStream) -> bool {
    let mut b = [0u8; 1024];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {
                return false
            }
            Err(_) => return true,
        }
    }
}

fn limits(max_connections: usize) -> ConnectionLimits {
    ConnectionLimits { max_connections, ..ConnectionLimits::default() }
}

#[test]
fn a_thousand_idle_connections_do_not_stop_a_new_client() {
    // Below the cap (all kept) and far above it (the longest-idle ones make room).
    for (cap, idle) in [(ConnectionLimits::default().max_connections, 1000), (64, 1000)] {
        let api = ApiServer::start_with_limits("node1", "box1", 1, limits(cap));
        let held: Vec<UnixStream> = (0..idle).map(|_| connect(api.socket())).collect();
        let started = Instant::now();
        let a = ping(api.socket());
        assert_eq!(a.status, 200, "cap {cap}: {a:?}");
        assert!(started.elapsed() < Duration::from_secs(5), "cap {cap}: ping took {:?}", started.elapsed());
        if cap < idle {
            // The server closed enough idle connections to stay within its cap.
            let mut still_open = 0;
            for mut s in held {
                s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
                if !closed_by_server(&mut s) {
                    still_open += 1;
                }
            }
            // (The test owns the socket: its connections may also take the owner's reserve.)
            let reserve = ConnectionLimits::default().owner_reserve;
            assert!(still_open <= cap + reserve, "cap {cap}: {still_open} idle connections left open");
        }
    }
}

#[test]
fn slow_heads_and_idle_keep_alive_connections_are_closed() {
    let api = ApiServer::start_with_limits(
        "node1",
        "box1",
        2,
        ConnectionLimits { header_read_timeout: Duration::from_millis(300), ..ConnectionLimits::default() },
    );
    // A head that never ends.
    let mut slow = connect(api.socket());
    slow.write_all(b"GET /_ping HTTP/1.1\r\nHost: dock").unwrap();
    assert!(closed_by_server(&mut slow), "a slow head was not cut");
    // A keep-alive connection, idle after its answer.
    let mut idle = connect(api.socket());
    idle.write_all(b"GET /_ping HTTP/1.1\r\nHost: docker\r\n\r\n").unwrap();
    assert_eq!(read_answer(&mut idle).expect("answer").status, 200);
    assert!(closed_by_server(&mut idle), "an idle keep-alive connection was not closed");
}

#[test]
fn a_slow_body_gets_408_json() {
    let api = ApiServer::start_with_limits(
        "node1",
        "box1",
        3,
        ConnectionLimits { body_read_timeout: Duration::from_millis(300), ..ConnectionLimits::default() },
    );
    let mut s = connect(api.socket());
    s.write_all(
        b"POST /services/create HTTP/1.1\r\nHost: docker\r\nContent-Type: application/json\r\nContent-Length: \
                  100\r\n\r\n{\"Name\"",
    )
    .unwrap();
    let a = read_answer(&mut s).expect("an answer");
    assert_eq!(a.status, 408, "{a:?}");
    assert!(a.head.to_ascii_lowercase().contains("content-type: application/json"), "{a:?}");
    assert!(a.body.contains("did not arrive within"), "{a:?}");
}

/// Opens a connection with a request in flight that stays so: `GET /events`, a stream, whose answer's head
/// has come.
fn busy(socket: &Path) -> UnixStream {
    let mut s = connect(socket);
    s.write_all(b"GET /events HTTP/1.1\r\nHost: docker\r\n\r\n").unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).expect("the events stream's head"), 1, "the events stream ended");
        head.push(b[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
    s
}

#[test]
fn beyond_the_cap_with_every_connection_busy_a_new_one_gets_503() {
    // The test runs as the socket's owner: no reserve here (see the daemon's test of the owner's reserve).
    let api = ApiServer::start_with_limits("node1", "box1", 4, ConnectionLimits { owner_reserve: 0, ..limits(2) });
    let held: Vec<UnixStream> = (0..2).map(|_| busy(api.socket())).collect();
    let refused = ping(api.socket());
    assert_eq!(refused.status, 503, "{refused:?}");
    assert!(refused.head.to_ascii_lowercase().contains("content-type: application/json"), "{refused:?}");
    assert!(refused.body.contains("too many connections"), "{refused:?}");
    drop(held);
    shoal_testkit::wait::wait_until("a connection slot frees", DEADLINE, || {
        let a = ping(api.socket());
        if a.status == 200 {
            Ok(())
        } else {
            Err(format!("{a:?}"))
        }
    });
}

#[test]
fn a_request_whose_body_stopped_halfway_holds_no_slot() {
    let api = ApiServer::start_with_limits("node1", "box1", 8, ConnectionLimits { owner_reserve: 0, ..limits(2) });
    let half = || {
        let mut s = connect(api.socket());
        s.write_all(b"POST /services/create HTTP/1.1\r\nHost: docker\r\nContent-Length: 10\r\n\r\n{").unwrap();
        s
    };
    let mut held: Vec<UnixStream> = (0..2).map(|_| half()).collect();
    for _ in 0..5 {
        let started = Instant::now();
        let a = ping(api.socket());
        assert_eq!(a.status, 200, "{a:?}");
        assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
        held.push(half());
    }
    // A connection with a request in flight whose body is in is not closed for them.
    let mut streaming = busy(api.socket());
    for _ in 0..3 {
        held.push(half());
        assert_eq!(ping(api.socket()).status, 200);
    }
    streaming.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    assert!(!closed_by_server(&mut streaming), "the busy connection was closed");
}

/// With every slot busy, the socket's owner still gets in, up to `owner_reserve` more connections.
#[test]
fn the_socket_owner_has_a_reserve_beyond_the_cap() {
    let api = ApiServer::start_with_limits("node1", "box1", 9, ConnectionLimits { owner_reserve: 2, ..limits(2) });
    let mut held: Vec<UnixStream> = (0..2).map(|_| busy(api.socket())).collect();
    // The test process owns the socket file: two more in flight, then refused.
    held.push(busy(api.socket()));
    assert_eq!(ping(api.socket()).status, 200);
    held.push(busy(api.socket()));
    assert_eq!(ping(api.socket()).status, 503);
}

#[test]
fn answers_come_after_the_request_body_is_read() {
    let api = ApiServer::start_with_limits("node1", "box1", 5, ConnectionLimits::default());
    let check = |path: &str, len: usize, status: u16, fragment: &str| {
        let mut s = connect(api.socket());
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: docker\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
        );
        s.write_all(head.as_bytes()).unwrap();
        // The whole body goes through (no broken pipe: nothing answers before reading it).
        let body = vec![b' '; len];
        s.write_all(&body).unwrap_or_else(|e| panic!("{path}: writing the body: {e}"));
        let a = read_answer(&mut s).unwrap_or_else(|| panic!("{path}: no answer"));
        assert_eq!(a.status, status, "{path}: {a:?}");
        assert!(a.head.to_ascii_lowercase().contains("content-type: application/json"), "{path}: {a:?}");
        let msg: serde_json::Value = serde_json::from_str(&a.body).unwrap_or_else(|e| panic!("{path}: {e}: {a:?}"));
        assert!(msg["message"].as_str().unwrap_or("").contains(fragment), "{path}: {a:?}");
    };
    for _ in 0..10 {
        check("/plugins/create", 270_000, 404, "page not found");
        check("/swarm/unlock", 270_000, 400, "invalid JSON");
    }
    check("/services/create", shoal_engine_api::request::BODY_LIMIT_BYTES, 400, "invalid JSON");
}

#[test]
fn a_body_over_the_limit_gets_413_json() {
    let api = ApiServer::start_with_limits("node1", "box1", 6, ConnectionLimits::default());
    let mut s = connect(api.socket());
    let len = shoal_engine_api::request::BODY_LIMIT_BYTES + 1;
    let head = format!("POST /services/create HTTP/1.1\r\nHost: docker\r\nContent-Length: {len}\r\n\r\n");
    s.write_all(head.as_bytes()).unwrap();
    // The server reads up to its limit, then answers; the rest may not be taken.
    let _ = s.write_all(&vec![b' '; len]);
    let a = read_answer(&mut s).expect("an answer");
    assert_eq!(a.status, 413, "{a:?}");
    assert!(a.body.contains("the limit is"), "{a:?}");
}

#[test]
fn oversized_uris_and_heads_get_json_414_and_431() {
    use shoal_engine_api::connections::{MAX_HEADERS, MAX_HEAD_BYTES, MAX_URI_BYTES};
    let api = ApiServer::start_with_limits("node1", "box1", 7, ConnectionLimits::default());
    let check = |what: &str, head: String, status: u16, fragment: &str| {
        let mut s = connect(api.socket());
        // The server may answer and close before the whole head is in: the answer is read either way.
        let _ = s.write_all(head.as_bytes());
        let a = read_answer(&mut s).unwrap_or_else(|| panic!("{what}: no answer"));
        assert_eq!(a.status, status, "{what}: {a:?}");
        assert!(a.head.to_ascii_lowercase().contains("content-type: application/json"), "{what}: {a:?}");
        let msg: serde_json::Value = serde_json::from_str(&a.body).unwrap_or_else(|e| panic!("{what}: {e}: {a:?}"));
        assert!(msg["message"].as_str().unwrap_or("").contains(fragment), "{what}: {a:?}");
    };
    let uri = |len: usize| format!("/v1.47/services/{}", "a".repeat(len - "/v1.47/services/".len()));
    // At the limits: routed (a 404 from the handler, which is JSON already).
    check(
        "a URI at the limit",
        format!("GET {} HTTP/1.1\r\nHost: docker\r\n\r\n", uri(MAX_URI_BYTES)),
        404,
        "not found",
    );
    let headers = |n: usize, each: usize| -> String {
        (0..n).map(|i| format!("X-Filler-{i}: {}\r\n", "b".repeat(each))).collect()
    };
    check(
        "as many headers as allowed",
        format!("GET /_pong HTTP/1.1\r\nHost: docker\r\n{}\r\n", headers(MAX_HEADERS - 1, 10)),
        404,
        "not found",
    );
    // Beyond them.
    check(
        "a URI over the limit",
        format!("GET {} HTTP/1.1\r\nHost: docker\r\n\r\n", uri(MAX_URI_BYTES + 1)),
        414,
        &format!("the limit is {MAX_URI_BYTES} bytes"),
    );
    check(
        "a head over the limit",
        format!("GET /_ping HTTP/1.1\r\nHost: docker\r\n{}\r\n", headers(50, MAX_HEAD_BYTES / 40)),
        431,
        &format!("the limit is {MAX_HEAD_BYTES} bytes"),
    );
    check(
        "too many headers",
        format!("GET /_ping HTTP/1.1\r\nHost: docker\r\n{}\r\n", headers(MAX_HEADERS + 1, 4)),
        431,
        &format!("{MAX_HEADERS} headers"),
    );
    check("a malformed request line", "GET /_ping HTTP/1.1 extra\r\nHost: docker\r\n\r\n".into(), 400, "malformed");
    // The server is still well.
    assert_eq!(ping(api.socket()).status, 200);
}
