//! The daemon's control socket under many idle connections (issue 13): 1,000 connections that never send a
//! byte do not stop the docker CLI or a new Engine API client, and the daemon keeps its file descriptors
//! within its connection cap. Nor do 1,100 requests whose bodies stop halfway (issue 31): they hold no slot a
//! new client needs. And when other users of the socket hold every slot with requests in flight, its owner
//! is still answered from its reserve.

use crate::common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::*;

#[test]
fn a_thousand_idle_connections_do_not_stop_a_new_client() {
    let d = daemon();
    let held: Vec<UnixStream> =
        (0..1000).map(|i| UnixStream::connect(d.socket()).unwrap_or_else(|e| panic!("connection {i}: {e}"))).collect();
    let started = Instant::now();
    let r = shoal_testkit::http::request_within(d.socket(), "GET", "/v1.47/info", None, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("a new client got no answer: {e:?}\n{}", d.log()));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["Swarm"]["LocalNodeState"], "active");
    docker(&d, &["service", "create", "--detach", "--name", "web", "busybox", "sleep", "3141"]);
    let ls = docker(&d, &["service", "ls"]);
    assert!(ls.contains("web"), "{ls}");
    assert!(started.elapsed() < Duration::from_secs(30), "took {:?}", started.elapsed());
    // One more thousand: beyond the cap (1,024) the longest-idle ones are closed, and clients still get in.
    let more: Vec<UnixStream> = (0..1000).filter_map(|_| UnixStream::connect(d.socket()).ok()).collect();
    let r = shoal_testkit::http::request_within(d.socket(), "GET", "/v1.47/_ping", None, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("a new client got no answer past the cap: {e:?}\n{}", d.log()));
    assert_eq!(r.status, 200);
    let fds = std::fs::read_dir(format!("/proc/{}/fd", d.pid())).map(|e| e.count()).unwrap_or(0);
    assert!(fds < 1024 + 200, "the daemon holds {fds} file descriptors");
    drop((held, more));
}

/// The answer to `docker info`, which must come within `limit`.
fn docker_info_within(d: &DaemonProcess, limit: Duration) -> String {
    let started = Instant::now();
    let out = docker_cli::run(d.socket(), &["info", "--format", "{{.Swarm.LocalNodeState}}"]);
    let took = started.elapsed();
    assert!(out.status.success(), "docker info failed: {}\n{}", String::from_utf8_lossy(&out.stderr), d.log());
    assert!(took < limit, "docker info took {took:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn half_sent_bodies_do_not_stop_docker_info() {
    let d = daemon();
    let head = b"POST /v1.47/services/create HTTP/1.1\r\nHost: docker\r\nContent-Type: \
                 application/json\r\nContent-Length: 1000\r\n\r\n{\"Name\": \"half";
    let held: Vec<UnixStream> = (0..1100)
        .filter_map(|_| {
            let mut s = UnixStream::connect(d.socket()).ok()?;
            s.write_all(head).ok()?;
            Some(s)
        })
        .collect();
    assert!(held.len() > 1024, "only {} connections were opened", held.len());
    // Well within the 30 s body timeout: the half-sent ones are still waiting for their bodies.
    assert_eq!(docker_info_within(&d, Duration::from_secs(5)), "active");
    let r = shoal_testkit::http::request_within(d.socket(), "GET", "/v1.47/_ping", None, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("a new client got no answer: {e:?}"));
    assert_eq!(r.status, 200);
    drop(held);
}

/// Opens `n` connections to `socket` as user 65534 (group 0, so the socket's mode lets it in), each with a
/// `GET /events` in flight (a stream that stays open), waits until each has its answer's head, and prints how
/// many are in flight then. The connections live as long as the returned child (its stdin closed: it exits).
fn busy_connections_of_another_user(socket: &std::path::Path, n: usize) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let script = r#"
import socket, sys, resource, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
path, n = sys.argv[1], int(sys.argv[2])
held, busy_ones, busy = [], [], 0
for i in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    s.sendall(b"GET /v1.47/events HTTP/1.1\r\nHost: docker\r\n\r\n")
    held.append(s)
for s in held:
    buf = b""
    try:
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(4096)
            if not chunk:
                break
            buf += chunk
    except OSError:
        pass
    if buf.startswith(b"HTTP/1.1 200"):
        busy_ones.append(s)
# A connection closed to make room just as its answer started is not in flight: count those still open.
time.sleep(0.5)
for s in busy_ones:
    s.setblocking(False)
    try:
        if s.recv(1) != b"":
            busy += 1
    except BlockingIOError:
        busy += 1
    except OSError:
        pass
print(busy, flush=True)
sys.stdin.read()
"#;
    std::process::Command::new("/usr/bin/python3")
        .args(["-c", script])
        .arg(socket)
        .arg(n.to_string())
        .uid(65534)
        .gid(0)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the other user's client")
}

#[test]
fn the_socket_owner_is_answered_when_other_users_hold_every_connection() {
    let d = daemon();
    // Let another user reach the socket: its directory is the test's own.
    use std::os::unix::fs::PermissionsExt;
    let dir = d.socket().parent().expect("the socket's directory");
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut other = busy_connections_of_another_user(d.socket(), 1100);
    let mut busy = String::new();
    let mut out = other.stdout.take().expect("stdout");
    let mut byte = [0u8; 1];
    while out.read(&mut byte).unwrap_or(0) == 1 && byte[0] != b'\n' {
        busy.push(byte[0] as char);
    }
    let busy: usize = busy.trim().parse().unwrap_or_else(|_| panic!("the other user's client said {busy:?}"));
    // The cap (1,024) holds for them: the rest were refused with 503.
    assert!((1000..=1024).contains(&busy), "{busy} of the other user's requests are in flight");
    // The owner (root, who runs the daemon and owns the socket) still gets in.
    assert_eq!(docker_info_within(&d, Duration::from_secs(5)), "active");
    let r = shoal_testkit::http::request_within(d.socket(), "GET", "/v1.47/_ping", None, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("the owner got no answer: {e:?}"));
    assert_eq!(r.status, 200);
    drop(other.stdin.take());
    let _ = other.kill();
    let _ = other.wait();
}
