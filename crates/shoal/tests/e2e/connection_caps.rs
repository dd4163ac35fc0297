//! Connections without credentials cannot exhaust a manager's file descriptors: a daemon started with a
//! soft open-file limit of 1,024 under a hard one of 4,096 (as many hosts give) raises it to 4,096 and says
//! so; then eight 127.0.0.x addresses open as many TLS connections to its remote port as it lets them,
//! finish the handshake without a certificate and go silent. The daemon keeps its descriptors within the
//! limit less its reserve, its control socket answers at once meanwhile, a real worker joins while they
//! are held, and the daemon closes the silent connections.

use crate::common;

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use shoal_node::{RemoteCaps, FD_RESERVE, UNAUTHENTICATED_IDLE};
use shoal_testkit::http::request;
use shoal_testkit::DaemonOptions;

const SOFT: u64 = 1024;
const HARD: u64 = 4096;
const SOURCES: u8 = 8;
/// Connections each source tries (the daemon's per-source cap is 512).
const PER_SOURCE: usize = 512;

/// A script that starts `shoal` with the soft and hard open-file limits above.
fn limited_shoal(dir: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("shoal-with-limits");
    let script = format!("#!/bin/bash\nulimit -S -n {SOFT} && ulimit -H -n {HARD} && exec {:?} \"$@\"\n", shoal_bin());
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn open_fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// This test process needs a descriptor per connection it holds.
#[allow(unsafe_code)]
fn raise_own_limit(to: u64) {
    let lim = libc::rlimit { rlim_cur: to, rlim_max: to };
    // SAFETY: setrlimit reads the struct passed.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0, "{}", std::io::Error::last_os_error());
}

/// Connects from `source`, finishes a TLS handshake without a client certificate and keeps the stream
/// without sending anything. `None` when the daemon refused or closed it.
async fn silent_connection(
    source: IpAddr,
    target: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> Option<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let socket = tokio::net::TcpSocket::new_v4().ok()?;
    socket.bind(SocketAddr::new(source, 0)).ok()?;
    let tcp = tokio::time::timeout(Duration::from_secs(5), socket.connect(target)).await.ok()?.ok()?;
    let name = rustls::pki_types::ServerName::try_from("swarm-manager").unwrap();
    let tls = tokio::time::timeout(Duration::from_secs(5), tokio_rustls::TlsConnector::from(config).connect(name, tcp));
    tls.await.ok()?.ok()
}

#[test]
fn silent_connections_from_many_addresses_leave_the_control_socket_answering_and_a_join_working() {
    let dir = tempfile::tempdir().unwrap();
    let m = DaemonProcess::start_with(
        &limited_shoal(dir.path()),
        DaemonOptions {
            listen_ip: Some("127.0.0.181".into()),
            hostname: Some("caps-manager".into()),
            ..DaemonOptions::default()
        },
    );
    let pid = m.pid();
    // The soft limit was raised to the hard one, and the daemon said so.
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap().to_string();
    assert_eq!(line.split_whitespace().collect::<Vec<_>>()[3..5], ["4096", "4096"], "{line}");
    assert!(m.log().contains("raised the open-file limit (RLIMIT_NOFILE) to its hard limit"), "{}", m.log());
    let caps = RemoteCaps::for_nofile(HARD);
    let baseline = open_fds(pid);

    raise_own_limit(HARD * 3);
    let target: SocketAddr = m.remote_addr().parse().unwrap();
    let config = Arc::new(shoal_node::local_socket_client_config());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let started = Instant::now();
    let held = rt.block_on(async {
        let mut tasks = Vec::new();
        for s in 0..SOURCES {
            let source = IpAddr::from([127, 0, 0, 190 + s]);
            let config = config.clone();
            tasks.push(tokio::spawn(async move {
                let mut held = Vec::new();
                // A few handshakes at a time per source (the daemon allows 32 at once per address).
                for _ in 0..PER_SOURCE / 8 {
                    let mut batch = tokio::task::JoinSet::new();
                    for _ in 0..8 {
                        batch.spawn(silent_connection(source, target, config.clone()));
                    }
                    held.extend(batch.join_all().await.into_iter().flatten());
                }
                held
            }));
        }
        let mut held = Vec::new();
        for t in tasks {
            held.extend(t.await.unwrap());
        }
        held
    });
    let attack_took = started.elapsed();
    let fds = open_fds(pid);
    eprintln!(
        "{} of {} silent connections finished the client side of a handshake in {attack_took:?}; daemon fds \
         {baseline} -> {fds}",
        held.len(),
        usize::from(SOURCES) * PER_SOURCE
    );
    // Within the caps: the descriptors stay under the limit less the reserve.
    assert!(fds <= baseline + caps.total, "{fds} fds with a cap of {} connections", caps.total);
    assert!((fds as u64) < HARD - FD_RESERVE, "{fds} fds: the reserve is gone");

    // The control socket answers its owner at once, connections held or not.
    for path in ["/_ping", "/v1.47/info", "/v1.47/nodes"] {
        let t = Instant::now();
        let r = request(m.socket(), "GET", path, None).unwrap();
        assert_eq!(r.status, 200, "GET {path}: {}", r.body);
        assert!(t.elapsed() < Duration::from_secs(2), "GET {path} took {:?}", t.elapsed());
    }

    // A real worker joins while those connections are still held: its connections without a certificate
    // (the root CA, its first certificate) close the oldest silent ones.
    let w = node_at(182, "caps-worker", Some((&m, "Worker")));
    let worker_id = w.get("/v1.47/info")["Swarm"]["NodeID"].as_str().unwrap().to_string();
    wait_until("the worker ready on the manager", Duration::from_secs(60), || {
        let n = m.get(&format!("/v1.47/nodes/{worker_id}"));
        if n["Status"]["State"] == "ready" {
            Ok(())
        } else {
            Err(n.to_string())
        }
    });

    // The silent connections were closed by the daemon: its descriptors are back near where they started
    // while this process still holds its ends.
    wait_until("the silent connections closed", UNAUTHENTICATED_IDLE * 4, || {
        let fds = open_fds(pid);
        if fds < baseline + 64 {
            Ok(())
        } else {
            Err(format!("{fds} fds (baseline {baseline})"))
        }
    });
    drop(held);
}
