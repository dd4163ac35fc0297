//! The log broker's gRPC faces: `LogBroker` (nodes listen for subscriptions and publish their lines, each
//! node as itself: `ca::node_identity`) over a `logbroker::LogBroker`, and `Logs` (`subscribe`: how a
//! follower manager reads logs from the leader's broker).
//!
//! Must not depend on HTTP or executors; the broker itself knows nothing of gRPC servers or the store.

use shoal_api::log_broker_server::LogBroker as LogBrokerRpc;
use shoal_api::{ListenSubscriptionsRequest, PublishLogsMessage, PublishLogsResponse};
use tonic::{Request, Response, Status, Streaming};

use crate::logbroker::{ListenerStream, LogBroker};

pub(crate) mod subscribe;
pub(crate) use subscribe::{LogsServer, LogsService};

/// The LogBroker gRPC server type.
pub(crate) type LogBrokerServer = shoal_api::log_broker_server::LogBrokerServer<LogBrokerService>;

/// The gRPC face of the broker: nodes listen and publish.
#[derive(Debug, Clone)]
pub struct LogBrokerService(LogBroker);

impl LogBrokerService {
    /// The LogBroker gRPC server over `broker`.
    pub fn server(broker: LogBroker) -> LogBrokerServer {
        LogBrokerServer::new(LogBrokerService(broker))
    }
}

#[tonic::async_trait]
impl LogBrokerRpc for LogBrokerService {
    type ListenSubscriptionsStream = ListenerStream;

    async fn listen_subscriptions(
        &self,
        req: Request<ListenSubscriptionsRequest>,
    ) -> Result<Response<ListenerStream>, Status> {
        let node = crate::ca::node_identity(&req)?;
        Ok(Response::new(self.0.listen(&node)))
    }

    async fn publish_logs(
        &self,
        req: Request<Streaming<PublishLogsMessage>>,
    ) -> Result<Response<PublishLogsResponse>, Status> {
        let node = crate::ca::node_identity(&req)?;
        let mut stream = req.into_inner();
        while let Some(msg) = stream.message().await? {
            let close = msg.close;
            self.0.publish(&node, msg).await?;
            if close {
                break;
            }
        }
        Ok(Response::new(PublishLogsResponse {}))
    }
}
