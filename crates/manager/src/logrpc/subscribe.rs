//! The `Logs` gRPC service (SwarmKit's `Logs.SubscribeLogs`): how a follower manager reads logs. Agents
//! publish their lines to the leader's broker only, so a follower asked for logs subscribes here, on the
//! leader, and relays the batches. Served by the leader only: any other manager answers `Unavailable`, and
//! a stream ends when its manager stops leading (the caller then asks the new leader). Must not depend on
//! HTTP or executors.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use shoal_api::logs_server::Logs as LogsRpc;
use shoal_api::{SubscribeLogsMessage, SubscribeLogsRequest};
use tonic::{Request, Response, Status};

use crate::state::ClusterState;

/// The Logs gRPC server type.
pub(crate) type LogsServer = shoal_api::logs_server::LogsServer<LogsService>;

/// `Logs.SubscribeLogs` over this manager's broker; clones share it.
#[derive(Clone, Debug)]
pub struct LogsService {
    state: ClusterState,
}

impl LogsService {
    /// The service over `state`'s broker and leadership.
    pub fn new(state: ClusterState) -> LogsService {
        LogsService { state }
    }

    /// The tonic server for this service.
    pub fn server(self) -> LogsServer {
        shoal_api::logs_server::LogsServer::new(self)
    }
}

type MessageStream = Pin<Box<dyn Stream<Item = Result<SubscribeLogsMessage, Status>> + Send>>;

#[tonic::async_trait]
impl LogsRpc for LogsService {
    type SubscribeLogsStream = MessageStream;

    async fn subscribe_logs(
        &self,
        request: Request<SubscribeLogsRequest>,
    ) -> Result<Response<Self::SubscribeLogsStream>, Status> {
        let leadership = self.state.proposer.leadership();
        if !leadership.borrow().is_leader {
            return Err(Status::unavailable(
                "this manager is not the leader: agents publish their logs to the leader; ask the leader",
            ));
        }
        let req = request.into_inner();
        let selector = req.selector.unwrap_or_default();
        if selector.service_ids.is_empty() && selector.task_ids.is_empty() && selector.node_ids.is_empty() {
            return Err(Status::invalid_argument("the log selector is empty: name at least one service, task or node"));
        }
        let sub = self.state.logs.subscribe(selector, req.options.unwrap_or_default());
        // The subscription is dropped (and so closed on every node) as soon as the stream ends: when it is
        // complete, or when this manager stops leading (or its Raft node goes away).
        let stream = futures::stream::unfold(Some((sub, leadership)), |st| async move {
            let (mut sub, mut leadership) = st?;
            let lost = async {
                let _ = leadership.wait_for(|l| !l.is_leader).await;
            };
            tokio::select! {
                batch = sub.next() => batch.map(|messages| (Ok(SubscribeLogsMessage { messages }), Some((sub,
                    leadership)))),
                _ = lost => None,
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use shoal_api::{LogMessage, LogSelector, LogSubscriptionOptions, PublishLogsMessage};
    use shoal_raft::LocalProposer;
    use shoal_store::{ManualClock, MemoryStore};

    use super::*;
    use crate::state::RandomIds;

    fn state() -> (ClusterState, Arc<LocalProposer>) {
        let store = Arc::new(MemoryStore::default());
        let proposer = Arc::new(LocalProposer::new(store.clone()));
        let state =
            ClusterState::new(store, proposer.clone(), Arc::new(ManualClock::new(0)), Arc::new(RandomIds::seeded(3)));
        (state, proposer)
    }

    fn request(follow: bool) -> Request<SubscribeLogsRequest> {
        Request::new(SubscribeLogsRequest {
            selector: Some(LogSelector { service_ids: vec!["svc".into()], ..Default::default() }),
            options: Some(LogSubscriptionOptions { follow, ..Default::default() }),
        })
    }

    #[tokio::test]
    async fn the_leader_relays_its_brokers_lines_until_it_stops_leading() {
        let (state, proposer) = state();
        let svc = LogsService::new(state.clone());
        let mut node = state.logs.listen("n1");
        let mut stream = svc.subscribe_logs(request(true)).await.expect("the leader serves logs").into_inner();
        let sub = node.next().await.unwrap().unwrap();
        let line = LogMessage { data: b"hello".to_vec(), ..Default::default() };
        state
            .logs
            .publish("n1", PublishLogsMessage { subscription_id: sub.id.clone(), messages: vec![line], close: false })
            .await
            .unwrap();
        let got = stream.next().await.unwrap().unwrap();
        assert_eq!(got.messages[0].data, b"hello");
        proposer.set_leader(false);
        assert!(stream.next().await.is_none(), "the stream ends when this manager stops leading");
        let close = node.next().await.unwrap().unwrap();
        assert!(close.close && close.id == sub.id, "the subscription is closed on the node");
    }

    #[tokio::test]
    async fn a_follower_and_an_empty_selector_are_refused() {
        let (state, proposer) = state();
        let svc = LogsService::new(state);
        let empty = Request::new(SubscribeLogsRequest::default());
        assert_eq!(svc.subscribe_logs(empty).await.err().unwrap().code(), tonic::Code::InvalidArgument);
        proposer.set_leader(false);
        assert_eq!(svc.subscribe_logs(request(false)).await.err().unwrap().code(), tonic::Code::Unavailable);
    }
}
