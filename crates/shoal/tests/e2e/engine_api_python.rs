//! Real clients of the Engine API besides the docker CLI, against a `shoal daemon`: the Python Docker SDK
//! driving swarm, nodes, services, secrets and configs (`engine_api_python/sdk.py`), setting every field of
//! issue 32 with the running container checked (`engine_api_python/sdk_fields.py`), and a schemathesis run over the
//! operations Shoal routes, checked against Docker's v1.47 spec (`crates/engine-api/spec/v1.47.yaml`, vendored,
//! with the status codes the engine answers but the spec leaves out added by `schemathesis_run.py`) with
//! not_a_server_error, status_code_conformance, content_type_conformance and
//! response_schema_conformance, bounded in examples and time. Both run in the test venv
//! (`shoal_testkit::python`, made on first use).

use crate::common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use shoal_testkit::python;

fn output_text(out: &std::process::Output) -> String {
    format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn the_python_docker_sdk_drives_swarm_nodes_and_services() {
    let d = daemon();
    let socket = d.socket().to_string_lossy().into_owned();
    let out = python::run_script(
        &[include_str!("engine_api_python/wait.py"), include_str!("engine_api_python/sdk.py")].concat(),
        &[("SHOAL_SOCKET", &socket)],
        Duration::from_secs(150),
    );
    let text = output_text(&out);
    assert!(out.status.success() && text.contains("OK"), "the SDK script failed:\n{text}\ndaemon log:\n{}", d.log());
}

/// The SDK setting every service, network and swarm field of issue 32 (`engine_api_python/sdk_fields.py`):
/// a docker-executor daemon runs the service, and the script checks each field on the running container
/// through the engine's own API; a second daemon in no swarm takes the SDK's `swarm.init` with the address
/// pool, subnet size, data path port and data path address.
#[test]
fn the_python_docker_sdk_sets_every_field_and_the_containers_show_them() {
    let Some(image) = shoal_testkit::docker_engine::test_image_or_skip() else { return };
    let d = shoal_testkit::docker_engine::EngineDaemon::start(&shoal_bin());
    let fresh = shoal_testkit::DaemonProcess::start_with(
        &shoal_bin(),
        shoal_testkit::DaemonOptions { extra_args: vec!["--no-init".into()], ..Default::default() },
    );
    let (socket, init_socket) =
        (d.socket().to_string_lossy().into_owned(), fresh.socket().to_string_lossy().into_owned());
    let out = python::run_script(
        &[include_str!("engine_api_python/wait.py"), include_str!("engine_api_python/sdk_fields.py")].concat(),
        &[
            ("SHOAL_SOCKET", &socket),
            ("ENGINE_SOCKET", "/var/run/docker.sock"),
            ("TEST_IMAGE", image),
            ("INIT_SOCKET", &init_socket),
            ("INIT_LISTEN", &fresh.remote_addr()),
        ],
        Duration::from_secs(150),
    );
    let text = output_text(&out);
    assert!(
        out.status.success() && text.contains("OK"),
        "the SDK script failed:\n{text}\ndaemon log:\n{}\nfresh daemon log:\n{}",
        d.log(),
        fresh.log()
    );
}

/// Forwards TCP connections on a loopback port to the control socket (schemathesis speaks HTTP over TCP
/// only). The listener's thread ends with the test process.
fn tcp_to_unix(socket: &Path) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let port = listener.local_addr().unwrap().port();
    let socket = socket.to_path_buf();
    std::thread::spawn(move || {
        for tcp in listener.incoming().flatten() {
            let Ok(unix) = UnixStream::connect(&socket) else { continue };
            pipe(tcp, unix);
        }
    });
    port
}

fn pipe(tcp: TcpStream, unix: UnixStream) {
    let (mut tcp_r, mut unix_w) = (tcp.try_clone().unwrap(), unix.try_clone().unwrap());
    let (mut unix_r, mut tcp_w) = (unix, tcp);
    std::thread::spawn(move || {
        copy(&mut tcp_r, &mut unix_w);
        let _ = unix_w.shutdown(Shutdown::Write);
    });
    std::thread::spawn(move || {
        copy(&mut unix_r, &mut tcp_w);
        let _ = tcp_w.shutdown(Shutdown::Write);
    });
}

fn copy(from: &mut impl Read, to: &mut impl Write) {
    let mut buf = [0u8; 16 << 10];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
}

/// Docker's Engine API document, vendored in the repository (`crates/engine-api/spec/README.md`).
fn engine_api_spec() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine-api/spec/v1.47.yaml");
    assert!(p.exists(), "Docker's Engine API spec is expected at {} (vendored in the repository)", p.display());
    p
}

/// The operations Shoal routes, as schemathesis path patterns (log streams are left out: a `follow=true` one
/// never ends; tests/logs.rs covers them).
const SHOAL_PATHS: &str = r"^/(_ping|version|info|swarm|swarm/update|swarm/unlockkey|swarm/unlock|services|services/create|services/\{id\}|services/\{id\}/update|tasks|tasks/\{id\}|nodes|nodes/\{id\}|nodes/\{id\}/update|secrets|secrets/create|secrets/\{id\}|secrets/\{id\}/update|configs|configs/create|configs/\{id\}|configs/\{id\}/update|networks|networks/create|networks/\{id\})$";

#[test]
fn schemathesis_finds_no_violation_of_the_engine_api_spec() {
    let d = daemon();
    // Something to list and inspect besides the node: a service with a running task.
    docker(&d, &["service", "create", "--detach", "--name", "web", "busybox", "sleep", "3141"]);
    let port = tcp_to_unix(d.socket());
    let spec = engine_api_spec();
    let report = tempfile::tempdir().unwrap();
    let url = format!("http://127.0.0.1:{port}/v1.47");
    let runner = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/engine_api_python/schemathesis_run.py");
    let out = python::run_in_venv(
        "python",
        &[
            runner.to_str().unwrap(),
            spec.to_str().unwrap(),
            "--url",
            &url,
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
            "--include-path-regex",
            SHOAL_PATHS,
            "--max-examples",
            "15",
            "--max-time",
            "60",
            "--workers",
            "1",
            "--seed",
            "1",
            "--request-timeout",
            "20",
            "--suppress-health-check",
            "all",
            "--no-color",
            "--report-dir",
            report.path().to_str().unwrap(),
        ],
        &[("SCHEMATHESIS_HOOKS", "")],
        Duration::from_secs(150),
    );
    let text = output_text(&out);
    assert!(out.status.success(), "schemathesis found violations:\n{text}\ndaemon log:\n{}", d.log());
    assert!(d.is_running(), "the daemon died under schemathesis:\n{}", d.log());
}
