//! The control socket's seam to containers on attachable swarm networks (`shoal_engine_api::attach::SwarmAttach`)
//! over the agent's `Attacher`: the one place that knows both, so that the Engine API knows no executor and the
//! agent no HTTP. Maps the attacher's errors to the statuses dockerd answers with (a network that is not
//! attachable: 403; one the swarm does not have: 404; what the request cannot have: 400; a container not
//! running for a connect: 409; no manager or no
//! plumbing in time: 503; the engine's failure: 500).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use shoal_agent::{container_labels, AttachError, Attacher, HolderFacts};
use shoal_engine_api::attach::{AttachFuture, AttachRefusal, Prepared, SwarmAttach};

/// `SwarmAttach` over the node's attacher.
pub(crate) struct NodeAttach(pub Arc<Attacher>);

fn refusal(e: AttachError) -> AttachRefusal {
    let status = match &e {
        AttachError::NotFound(_) => 404,
        AttachError::Refused(_) => 403,
        AttachError::Invalid(_) => 400,
        AttachError::Conflict(_) => 409,
        AttachError::Unavailable(_) => 503,
        AttachError::Engine(_) => 500,
    };
    AttachRefusal { status, message: e.to_string() }
}

impl SwarmAttach for NodeAttach {
    fn prepare<'a>(
        &'a self,
        network: &'a str,
        aliases: &'a [String],
        facts: shoal_engine_api::attach::HolderFacts,
    ) -> AttachFuture<'a, Prepared> {
        Box::pin(async move {
            let facts = HolderFacts {
                hostname: facts.hostname,
                dns_search: facts.dns_search,
                dns_options: facts.dns_options,
                extra_hosts: facts.extra_hosts,
            };
            let holder = self.0.prepare_holder(&facts).await.map_err(refusal)?;
            let labels = container_labels(&holder, network, aliases).into_iter().collect();
            Ok(Prepared { holder, labels })
        })
    }

    fn attach<'a>(&'a self, container: &'a str) -> AttachFuture<'a, ()> {
        Box::pin(async move { self.0.attach(container).await.map(|_| ()).map_err(refusal) })
    }

    fn abandon<'a>(&'a self, holder: &'a str) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
        Box::pin(self.0.abandon(holder))
    }

    fn before_start<'a>(&'a self, container: &'a str) -> AttachFuture<'a, ()> {
        Box::pin(async move { self.0.before_start(container).await.map_err(refusal) })
    }

    fn restart_begins<'a>(&'a self, container: &'a str) -> AttachFuture<'a, Option<String>> {
        Box::pin(async move { self.0.restart_begins(container).await.map_err(refusal) })
    }

    fn restart_ended(&self, id: &str) {
        self.0.restart_ended(id)
    }

    fn connect<'a>(&'a self, container: &'a str, network: &'a str, aliases: &'a [String]) -> AttachFuture<'a, ()> {
        Box::pin(async move { self.0.connect(container, network, aliases).await.map(|_| ()).map_err(refusal) })
    }

    fn disconnect<'a>(&'a self, container: &'a str, network: &'a str, force: bool) -> AttachFuture<'a, ()> {
        Box::pin(async move { self.0.disconnect(container, network, force).await.map_err(refusal) })
    }
}
