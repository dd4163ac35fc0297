//! `docker.swarmkit.v1.Health`: SERVING for the whole server ("") and for the services served beside it,
//! NOT_FOUND for any other name, as SwarmKit's health server answers for unregistered services. A manager
//! that serves is healthy: there is no separate not-serving state to report.
//!
//! Two servers have one: the SwarmKit API socket (`Control`, `Watch`, with or without the package prefix)
//! and a manager's remote port (`Raft`, as SwarmKit's managers report it, and
//! `shoal_api::SHOAL_MANAGER_HEALTH`, a name only Shoal's managers know: a joining manager asks for it to
//! tell a Shoal cluster from a Docker swarm, whose health server answers NOT_FOUND).

use shoal_api::health_check_response::ServingStatus;
use shoal_api::health_server::Health;
use shoal_api::{HealthCheckRequest, HealthCheckResponse};
use tonic::{Request, Response, Status};

/// The services the SwarmKit API socket's `Check` reports on.
const SOCKET_SERVED: &[&str] = &["", "Control", "Watch", "docker.swarmkit.v1.Control", "docker.swarmkit.v1.Watch"];

/// The services a manager's remote port's `Check` reports on.
const REMOTE_SERVED: &[&str] = &["", "Raft", shoal_api::SHOAL_MANAGER_HEALTH];

/// A Health service: of the SwarmKit API socket (`socket`) or of a manager's remote port (`remote`).
#[derive(Clone, Copy, Debug)]
pub struct HealthService {
    served: &'static [&'static str],
}

impl HealthService {
    /// The SwarmKit API socket's.
    pub fn socket() -> HealthService {
        HealthService { served: SOCKET_SERVED }
    }

    /// A manager's remote port's.
    pub fn remote() -> HealthService {
        HealthService { served: REMOTE_SERVED }
    }

    /// As a tonic service.
    pub fn server(self) -> shoal_api::health_server::HealthServer<HealthService> {
        shoal_api::health_server::HealthServer::new(self)
    }
}

#[tonic::async_trait]
impl Health for HealthService {
    async fn check(&self, req: Request<HealthCheckRequest>) -> Result<Response<HealthCheckResponse>, Status> {
        let service = &req.get_ref().service;
        if self.served.contains(&service.as_str()) {
            Ok(Response::new(HealthCheckResponse { status: ServingStatus::Serving as i32 }))
        } else {
            Err(Status::not_found(format!("unknown service {service:?}: this server reports on {:?}", self.served)))
        }
    }
}
