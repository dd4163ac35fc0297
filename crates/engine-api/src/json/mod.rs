//! The Engine API's JSON documents (Docker's Go field names) and their conversions to and from the
//! `shoal_api` wire types, tested both ways. Public so that clients (the `shoal` CLI) decode the same types.
//! Must not depend on HTTP or the store.

pub mod common;
pub mod go_decode;
pub mod network;
pub mod objects;
pub mod secret;
pub mod spec;
pub mod system;
#[cfg(test)]
mod tests;
pub mod unsupported;
pub mod volume;

pub use common::{ConvertError, VersionJson};
pub use go_decode::{decode, DecodeError};
pub use objects::{
    ClusterInfoJson, ManagerStatusJson, NodeJson, NodeSpecJson, ServiceJson, ServiceStatusJson, SwarmJson, TaskJson,
    TaskStatusJson,
};
pub use secret::{ConfigJson, ConfigSpecJson, SecretJson, SecretSpecJson};
pub use spec::{ServiceSpecJson, TaskSpecJson};
pub use system::{InfoJson, SwarmInfoJson, SystemVersionJson};

/// Response of `POST /services/create`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ServiceCreateResponse {
    /// The new service's ID.
    #[serde(rename = "ID")]
    pub id: String,
    /// Warnings (none).
    pub warnings: Vec<String>,
}

/// Response of `POST /services/{id}/update`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ServiceUpdateResponse {
    /// Warnings (none).
    pub warnings: Vec<String>,
}

/// Response of `POST /secrets/create` and `POST /configs/create` (Docker's `IDResponse`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct IdResponse {
    /// The new object's ID.
    #[serde(rename = "ID")]
    pub id: String,
}

/// An error body: `{"message": "..."}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ErrorResponse {
    /// What went wrong and what to do.
    pub message: String,
}
