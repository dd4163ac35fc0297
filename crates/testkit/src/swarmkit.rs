//! A gRPC client of SwarmKit's API on a node's `--listen-swarmkit-api` socket, connected as `swarmctl`
//! connects: TLS over the unix socket, the server's certificate not verified.

use std::path::Path;
use std::sync::Arc;

use tonic::transport::{Channel, Endpoint};

/// A channel to the socket at `path` (each connection a new TLS session over a new unix connection).
pub async fn channel(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    let config = Arc::new(shoal_node::tls::local_socket_client_config());
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
