//! The daemon's control socket under many idle connections (issue 13): 1,000 connections that never send a
//! byte do not stop the docker CLI or a new Engine API client, and the daemon keeps its file descriptors
//! within its connection cap.

mod common;

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
