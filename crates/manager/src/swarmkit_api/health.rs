//! `docker.swarmkit.v1.Health`: SERVING for the whole server ("") and for the services served beside it
//! (`Control`, `Watch`, with or without the package prefix), NOT_FOUND for any other name, as SwarmKit's
//! health server answers for unregistered services. A manager that serves is healthy: there is no
//! separate not-serving state to report.

use shoal_api::health_check_response::ServingStatus;
use shoal_api::health_server::Health;
use shoal_api::{HealthCheckRequest, HealthCheckResponse};
use tonic::{Request, Response, Status};

/// The services `Check` reports on.
const SERVED: &[&str] = &["", "Control", "Watch", "docker.swarmkit.v1.Control", "docker.swarmkit.v1.Watch"];

/// The Health service of the SwarmKit API socket.
#[derive(Clone, Copy, Debug, Default)]
pub struct HealthService;

impl HealthService {
    /// As a tonic service.
    pub fn server(self) -> shoal_api::health_server::HealthServer<HealthService> {
        shoal_api::health_server::HealthServer::new(self)
    }
}

#[tonic::async_trait]
impl Health for HealthService {
    async fn check(&self, req: Request<HealthCheckRequest>) -> Result<Response<HealthCheckResponse>, Status> {
        let service = &req.get_ref().service;
        if SERVED.contains(&service.as_str()) {
            Ok(Response::new(HealthCheckResponse { status: ServingStatus::Serving as i32 }))
        } else {
            Err(Status::not_found(format!("unknown service {service:?}: this socket serves Control and Watch")))
        }
    }
}
