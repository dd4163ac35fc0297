//! The external CA client (SwarmKit's `ca/external.go`): node certificates signed by a CFSSL-compatible
//! signer over HTTPS. The CA (`shoal_manager::CaService`) calls it when the cluster lists external CAs for the root
//! it signs with (`docker swarm update --external-ca protocol=cfssl,url=https://...`).
//!
//! One request per signer, in the listed order, until one answers: `POST` of CFSSL's sign request
//! (`certificate_request`: the node's CSR; `subject`: CN node ID, OU role, O cluster ID; `hosts`: the role and
//! the node ID, as the DNS names Shoal's own CA writes) to the URL, or to `/api/v1/cfssl/sign` under it when
//! the URL has no path. The answer's `result.certificate` is the certificate. The signer's TLS certificate
//! must chain to one of the cluster's roots (the signer holds the root key, so the operator can issue it one).
//! Bounds: `CONNECT_TIMEOUT` to connect and handshake, `REQUEST_TIMEOUT` for the answer, `MAX_ANSWER_BYTES`.
//!
//! Must not log the CSR's key material (there is none in a CSR) or tokens; logs name the URL only.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use shoal_ca::NodeSubject;

/// Longest wait to connect to a signer and finish the TLS handshake.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for a signer's answer once connected.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// Largest answer read from a signer.
pub(crate) const MAX_ANSWER_BYTES: usize = 1 << 20;
/// CFSSL's sign endpoint, used when an external CA's URL has no path.
pub(crate) const CFSSL_SIGN_PATH: &str = "/api/v1/cfssl/sign";

/// The CFSSL client (see the module doc).
#[derive(Debug, Default, Clone)]
pub(crate) struct CfsslSigner;

/// `https://host[:port][/path]` split into host, port (443 by default) and path (CFSSL's sign path when empty).
fn split_url(url: &str) -> Result<(String, u16, String), String> {
    let rest = url.strip_prefix("https://").ok_or("the URL must start with https://")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let path = if path.is_empty() || path == "/" { CFSSL_SIGN_PATH.to_string() } else { path.to_string() };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6.split_once(']').ok_or("unclosed [ in the URL's host")?;
        (h.to_string(), after.strip_prefix(':').unwrap_or(""))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p),
            None => (authority.to_string(), ""),
        }
    };
    let port = if port.is_empty() { 443 } else { port.parse().map_err(|_| format!("invalid port {port:?}"))? };
    if host.is_empty() {
        return Err("the URL has no host".into());
    }
    Ok((host, port, path))
}

fn client_config(trust_pem: &str) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(trust_pem.as_bytes()) {
        roots.add(c.map_err(|e| format!("the cluster's root is not PEM: {e}"))?).map_err(|e| e.to_string())?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// CFSSL's sign request for `csr_pem` and `subject` (SwarmKit's `PrepareCSR`).
pub(crate) fn sign_request(csr_pem: &str, subject: &NodeSubject) -> serde_json::Value {
    serde_json::json!({
        "certificate_request": csr_pem,
        "hosts": [subject.role.ou(), subject.node_id],
        "subject": {"CN": subject.node_id, "names": [{"OU": subject.role.ou(), "O": subject.cluster_id}]},
    })
}

/// The certificate in a CFSSL answer, or the signer's own error messages.
pub(crate) fn certificate_of(status: u16, body: &[u8]) -> Result<String, String> {
    let v: serde_json::Value = serde_json::from_slice(body)
        .map_err(|_| format!("the signer answered {status} with something that is not CFSSL's JSON"))?;
    if v["success"].as_bool() == Some(true) {
        if let Some(cert) = v["result"]["certificate"].as_str().filter(|c| c.contains("BEGIN CERTIFICATE")) {
            return Ok(cert.to_string());
        }
        return Err("the signer's answer has no result.certificate".into());
    }
    let errors: Vec<String> = v["errors"]
        .as_array()
        .map(|a| {
            a.iter().take(5).filter_map(|e| e["message"].as_str().map(|m| m.chars().take(300).collect())).collect()
        })
        .unwrap_or_default();
    Err(format!(
        "the signer refused ({status}): {}",
        if errors.is_empty() { "no reason given".into() } else { errors.join("; ") }
    ))
}

async fn post(url: &str, trust_pem: &str, body: Vec<u8>) -> Result<String, String> {
    let (host, port, path) = split_url(url)?;
    let config = client_config(trust_pem)?;
    let name = ServerName::try_from(host.clone()).map_err(|e| format!("invalid host {host:?}: {e}"))?;
    let connect = async {
        let tcp =
            tokio::net::TcpStream::connect((host.as_str(), port)).await.map_err(|e| format!("cannot connect: {e}"))?;
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS with the signer failed (its certificate must chain to the cluster's root): {e}"))
    };
    let tls = tokio::time::timeout(CONNECT_TIMEOUT, connect)
        .await
        .map_err(|_| format!("no connection within {CONNECT_TIMEOUT:?}"))??;
    let exchange = async {
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.map_err(|e| e.to_string())?;
        let driver = tokio::spawn(conn);
        let req = hyper::Request::post(path)
            .header(hyper::header::HOST, format!("{host}:{port}"))
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(hyper::body::Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let resp = sender.send_request(req).await.map_err(|e| format!("the request failed: {e}"))?;
        let status = resp.status().as_u16();
        let bytes = Limited::new(resp.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| format!("reading the answer failed (at most {MAX_ANSWER_BYTES} bytes): {e}"))?
            .to_bytes();
        driver.abort();
        certificate_of(status, &bytes)
    };
    tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .map_err(|_| format!("no answer within {REQUEST_TIMEOUT:?}"))?
}

#[tonic::async_trait]
impl shoal_manager::ExternalSigner for CfsslSigner {
    async fn sign(
        &self,
        urls: &[String],
        trust_pem: &str,
        csr_pem: &str,
        subject: &NodeSubject,
    ) -> Result<String, String> {
        let body = serde_json::to_vec(&sign_request(csr_pem, subject)).map_err(|e| e.to_string())?;
        let mut why = Vec::new();
        for url in urls {
            match post(url, trust_pem, body.clone()).await {
                Ok(cert) => {
                    // What the signer issued must be for this key and be a certificate Shoal can read.
                    shoal_ca::parse_cert_pem_chain(cert.as_bytes()).map_err(|e| format!("{url}: {e}"))?;
                    tracing::debug!(%url, node = %subject.node_id, "external CA signed a node certificate");
                    return Ok(cert);
                }
                Err(e) => {
                    tracing::warn!(%url, error = %e, "external CA could not sign");
                    why.push(format!("{url}: {e}"));
                }
            }
        }
        Err(why.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_default_to_cfssl_sign_path_and_port_443() {
        assert_eq!(split_url("https://ca.example").unwrap(), ("ca.example".into(), 443, CFSSL_SIGN_PATH.into()));
        assert_eq!(split_url("https://127.0.0.1:8888/").unwrap(), ("127.0.0.1".into(), 8888, CFSSL_SIGN_PATH.into()));
        assert_eq!(split_url("https://[::1]:9/sign").unwrap(), ("::1".into(), 9, "/sign".into()));
        assert!(split_url("http://ca").is_err());
        assert!(split_url("https://ca:x").is_err());
    }

    #[test]
    fn cfssl_answers_give_the_certificate_or_the_signers_reasons() {
        let ok = br#"{"success":true,"result":{"certificate":"-----BEGIN CERTIFICATE-----\nx\n"},"errors":[]}"#;
        assert!(certificate_of(200, ok).unwrap().starts_with("-----BEGIN CERTIFICATE-----"));
        let refused = br#"{"success":false,"result":null,"errors":[{"code":1000,"message":"bad csr"}]}"#;
        let e = certificate_of(400, refused).unwrap_err();
        assert!(e.contains("400") && e.contains("bad csr"), "{e}");
        assert!(certificate_of(502, b"<html>").unwrap_err().contains("not CFSSL's JSON"));
    }
}
