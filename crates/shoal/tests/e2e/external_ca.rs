//! An external CA, as a Docker user sets one up with the stock docker CLI and Debian's `golang-cfssl`: the
//! cluster rotates to a root the operator made (`docker swarm ca --rotate --ca-cert --ca-key`), `cfssl serve`
//! holds that root's key and serves HTTPS with a certificate from it, and `docker swarm update --external-ca
//! protocol=cfssl,url=https://...` makes the managers send every CSR there: a node that joins gets a
//! certificate CFSSL signed (its profile's lifetime, not Shoal's). With the signer down, a join fails saying
//! so, and the cluster keeps working. `docker swarm init --external-ca ...,cacert=root.crt` starts a swarm at the
//! signer's root: the manager's certificate and those of nodes joining with the printed token come from CFSSL.
//!
//! Skipped when `cfssl` or the docker CLI is not installed (`.ci/run` installs both).

use crate::common;

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime};

use common::*;
use shoal_testkit::DaemonOptions;

/// `cfssl serve`, stopped (and reaped) when dropped.
struct Cfssl(Child);

impl Drop for Cfssl {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_cfssl(dir: &Path, port: u16) -> Cfssl {
    let p = |f: &str| dir.join(f).to_str().unwrap().to_string();
    let log = std::fs::File::create(dir.join("cfssl.log")).unwrap();
    let child = Command::new("cfssl")
        .args(["serve", "-address", "127.0.0.1", "-port", &port.to_string()])
        .args(["-ca", &p("root.crt"), "-ca-key", &p("root.key"), "-config", &p("config.json")])
        .args(["-tls-cert", &p("tls.crt"), "-tls-key", &p("tls.key")])
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start cfssl serve");
    let cfssl = Cfssl(child);
    wait_until("cfssl serve listening", Duration::from_secs(20), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).map(|_| ()).map_err(|e| e.to_string())
    });
    cfssl
}

fn inactive_node(i: u8, host: &str) -> DaemonProcess {
    DaemonProcess::start_with(
        &shoal_bin(),
        DaemonOptions {
            listen_ip: Some(format!("127.0.0.{i}")),
            hostname: Some(host.into()),
            extra_args: vec!["--no-init".into()],
            ..DaemonOptions::default()
        },
    )
}

/// A root and the files `cfssl serve` needs in `dir`: the root and its key, an HTTPS certificate from that root
/// for 127.0.0.1, and a signing profile of 720 hours.
fn signer_files(dir: &Path) -> shoal_ca::RootCa {
    let now = SystemTime::now();
    let mut rng = rand::rng();
    let root = shoal_ca::RootCa::generate(now, &mut rng).unwrap();
    std::fs::write(dir.join("root.crt"), root.cert_pem()).unwrap();
    std::fs::write(dir.join("root.key"), root.key_pem()).unwrap();
    // The signer's HTTPS certificate, from the same root: the managers check it against the cluster's root.
    let tls = shoal_ca::generate_node_key_and_csr().unwrap();
    let subject = shoal_ca::NodeSubject {
        node_id: "cfssl".into(),
        role: shoal_ca::Role::Manager,
        cluster_id: "external-ca".into(),
    };
    let ip: std::net::IpAddr = "127.0.0.1".parse().unwrap();
    let tls_cert =
        root.sign_csr_with_ips(&tls.csr_pem, &subject, Duration::from_secs(86_400), now, &[ip], &mut rng).unwrap();
    std::fs::write(dir.join("tls.crt"), tls_cert).unwrap();
    std::fs::write(dir.join("tls.key"), &tls.key_pem).unwrap();
    std::fs::write(
        dir.join("config.json"),
        r#"{"signing": {"default": {"usages": ["signing", "key encipherment", "server auth", "client auth"], "expiry": "720h"}}}"#,
    )
    .unwrap();
    root
}

/// Whether `pem` (a node's certificate file) was issued by CFSSL from `root`: signed by its key, with the
/// 720-hour profile's lifetime rather than Shoal's 90 days.
fn issued_by_cfssl(pem: &str, root: &shoal_ca::RootCa) -> shoal_ca::CertInfo {
    let chain = shoal_ca::parse_cert_pem_chain(pem.as_bytes()).unwrap();
    let root_der = shoal_ca::parse_cert_pem_chain(root.cert_pem().as_bytes()).unwrap();
    assert!(shoal_ca::signed_by(&chain[0], &root_der[0]).unwrap(), "signed with the root's key");
    let info = shoal_ca::parse_cert(&chain[0]).unwrap();
    let life = info.not_after.duration_since(info.not_before).unwrap();
    assert!(life <= Duration::from_secs(721 * 3600), "CFSSL's 720h profile, not Shoal's 90 days: {life:?}");
    info
}

fn no_tools() -> bool {
    if no_docker_cli() {
        return true;
    }
    shoal_testkit::prerequisites::skip_unless(shoal_testkit::prerequisites::Prerequisite::Cfssl)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn a_cfssl_signer_issues_the_certificates_of_joining_nodes() {
    if no_tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = signer_files(dir.path());
    let m = node_at(71, "ext-manager", None);
    let (c, k) = (dir.path().join("root.crt"), dir.path().join("root.key"));
    docker(&m, &["swarm", "ca", "--rotate", "--ca-cert", c.to_str().unwrap(), "--ca-key", k.to_str().unwrap()]);
    assert_eq!(docker(&m, &["swarm", "ca"]).trim(), root.cert_pem().trim(), "the cluster uses the operator's root");

    let port = free_port();
    let cfssl = start_cfssl(dir.path(), port);
    let url = format!("https://127.0.0.1:{port}");
    docker(&m, &["swarm", "update", "--external-ca", &format!("protocol=cfssl,url={url}")]);
    let shown = docker(
        &m,
        &["info", "--format", "{{range .Swarm.Cluster.Spec.CAConfig.ExternalCAs}}{{.Protocol}} {{.URL}}{{end}}"],
    );
    assert_eq!(shown.trim(), format!("cfssl {url}"));

    let token = docker(&m, &["swarm", "join-token", "-q", "worker"]).trim().to_string();
    let w = inactive_node(72, "ext-worker");
    let out = docker(&w, &["swarm", "join", "--token", &token, &m.remote_addr()]);
    assert!(out.contains("This node joined a swarm as a worker."), "{out}");
    let pem = std::fs::read_to_string(w.state_dir().join("certificates/swarm-node.crt")).unwrap();
    let info = issued_by_cfssl(&pem, &root);
    assert_eq!(info.subject.role, shoal_ca::Role::Worker, "the CA chose the subject");
    let cfssl_log = std::fs::read_to_string(dir.path().join("cfssl.log")).unwrap();
    assert!(cfssl_log.contains("signature request received") || cfssl_log.contains("sign"), "{cfssl_log}");
    wait_until("the worker Ready", Duration::from_secs(30), || {
        let out = docker(&m, &["node", "ls", "--filter", "name=ext-worker", "--format", "{{.Status}}"]);
        if out.trim() == "Ready" {
            Ok(())
        } else {
            Err(out)
        }
    });

    // The signer goes away: a join fails, saying why; the cluster keeps working.
    drop(cfssl);
    let late = inactive_node(73, "ext-late");
    let out = docker_cli::run(late.socket(), &["swarm", "join", "--token", &token, &m.remote_addr()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("external CA could not sign"), "{err}");
    assert_eq!(docker(&late, &["info", "--format", "{{.Swarm.LocalNodeState}}"]).trim(), "inactive");
    shoal_testkit::managers::create_service(&m, "still", 1, &["sleep", "3643"]).unwrap();
    wait_running(&m, "still", 1, &["sleep", "3643"], Duration::from_secs(30));
    let out = docker(&m, &["node", "ls", "--filter", "name=ext-worker", "--format", "{{.Status}}"]);
    assert_eq!(out.trim(), "Ready", "the worker is untouched");
}

#[test]
fn docker_swarm_init_with_an_external_ca_roots_the_swarm_at_the_signers_root() {
    if no_tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = signer_files(dir.path());
    let port = free_port();
    let _cfssl = start_cfssl(dir.path(), port);
    let m = inactive_node(74, "ext-init");
    let addr = m.remote_addr();
    let ca = format!("protocol=cfssl,url=https://127.0.0.1:{port},cacert={}", dir.path().join("root.crt").display());
    // Without the signer's root the init is refused, saying what to add.
    let out = docker_cli::run(
        m.socket(),
        &[
            "swarm",
            "init",
            "--listen-addr",
            &addr,
            "--external-ca",
            &format!("protocol=cfssl,url=https://127.0.0.1:{port}"),
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("cacert=FILE"), "{err}");
    let out = docker(&m, &["swarm", "init", "--listen-addr", &addr, "--advertise-addr", &addr, "--external-ca", &ca]);
    assert!(out.contains("Swarm initialized"), "{out}");
    assert_eq!(docker(&m, &["swarm", "ca"]).trim(), root.cert_pem().trim(), "the swarm's root is the signer's");
    let pem = std::fs::read_to_string(m.state_dir().join("certificates/swarm-node.crt")).unwrap();
    issued_by_cfssl(&pem, &root);
    // The token the init printed is the final one: a worker joins with it and gets a certificate from CFSSL.
    let token = out.split_whitespace().skip_while(|w| *w != "--token").nth(1).unwrap().to_string();
    let w = inactive_node(75, "ext-init-worker");
    let joined = docker(&w, &["swarm", "join", "--token", &token, &addr]);
    assert!(joined.contains("This node joined a swarm as a worker."), "{joined}");
    let pem = std::fs::read_to_string(w.state_dir().join("certificates/swarm-node.crt")).unwrap();
    issued_by_cfssl(&pem, &root);
}
