//! A gRPC client of SwarmKit's API on a node's `--listen-swarmkit-api` socket, connected as `swarmctl`
//! connects: TLS over the unix socket, the server's certificate not verified. `channel` names the server as
//! a DNS name (what a relative path gives grpc-go); `channel_as_grpc_go_with_a_path` sends the socket's path
//! as the TLS server name and as every request's `:authority`, as the stock `swarmctl -s /abs/path` does.

use std::path::Path;
use std::sync::Arc;

use tonic::transport::{Channel, Endpoint};

/// A channel to the socket at `path` (each connection a new TLS session over a new unix connection).
pub async fn channel(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    let config = Arc::new(shoal_node::local_socket_client_config());
    // The URI only names the authority the requests carry; the connector below ignores it.
    Endpoint::from_static("http://swarmkit.sock")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            let config = config.clone();
            async move {
                let unix = tokio::net::UnixStream::connect(&path).await?;
                let name = rustls::pki_types::ServerName::try_from("swarmkit.sock").expect("a DNS name");
                let tls = tokio_rustls::TlsConnector::from(config).connect(name, unix).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
            }
        }))
        .await
}

/// A channel to the socket at `path` that names the server as grpc-go 1.53 does when dialed with that path:
/// the path is the TLS server name (OpenSSL sends it as given, as Go does) and, rewritten into each
/// request's headers, the HTTP/2 `:authority` (tonic itself only sends authorities that parse).
pub async fn channel_as_grpc_go_with_a_path(path: &Path) -> Result<Channel, tonic::transport::Error> {
    use shoal_node::{AuthorityFix, FixedAuthority};
    let path = path.to_path_buf();
    Endpoint::from_static("http://swarmkit.sock")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let unix = tokio::net::UnixStream::connect(&path).await?;
                let mut b = openssl::ssl::SslConnector::builder(openssl::ssl::SslMethod::tls_client())
                    .map_err(std::io::Error::other)?;
                b.set_verify(openssl::ssl::SslVerifyMode::NONE);
                b.set_alpn_protos(b"\x02h2").map_err(std::io::Error::other)?;
                let mut conf = b.build().configure().map_err(std::io::Error::other)?;
                conf.set_verify_hostname(false);
                let name = path.to_string_lossy().into_owned();
                let ssl = conf.into_ssl(&name).map_err(std::io::Error::other)?;
                let mut tls = tokio_openssl::SslStream::new(ssl, unix).map_err(std::io::Error::other)?;
                std::pin::Pin::new(&mut tls).connect().await.map_err(std::io::Error::other)?;
                let authority = name.into_bytes();
                let fix = AuthorityFix::with_rule(move |_| Some(authority.clone()));
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(FixedAuthority::on_writes(tls, fix)))
            }
        }))
        .await
}
