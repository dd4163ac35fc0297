//! The Engine API's JSON documents (Docker's Go field names) and their conversions to and from the
//! `shoal_api` wire types, tested both ways. A crate of its own so that the `shoal` client decodes the same
//! types as the daemon serves while depending on no daemon crate; `shoal_engine_api` re-exports it as `json`.
//! Must not depend on HTTP, the store or any daemon crate.

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

use std::net::IpAddr;

pub use common::{ConvertError, VersionJson};
pub use go_decode::{decode, DecodeError};
pub use objects::{
    ClusterDerived, ClusterInfoJson, ManagerStatusJson, NodeJson, NodeSpecJson, ServiceJson, ServiceStatusJson,
    SwarmJson, TaskJson, TaskStatusJson,
};
pub use secret::{ConfigJson, ConfigSpecJson, SecretJson, SecretSpecJson};
pub use spec::{ServiceSpecJson, TaskSpecJson};
pub use system::{InfoJson, SwarmInfoJson, SystemVersionJson};

/// Reads `DataPathAddr` (and `shoal daemon --data-path-addr`): the address of this node its overlay (VXLAN)
/// traffic leaves from and arrives at, when not the advertised one (empty: none). An IPv4 address of this
/// machine that is not loopback, unspecified, multicast or broadcast; Shoal's data plane carries IPv4 (no IPv6
/// address) and reads no interface names.
pub fn data_path_addr(addr: &str) -> Result<Option<IpAddr>, String> {
    if addr.is_empty() {
        return Ok(None);
    }
    let bad = |why: &str| format!("invalid DataPathAddr {addr:?}: {why}");
    let ip: IpAddr = addr.parse().map_err(|_| {
        bad("not an IP address (Shoal does not read interface names here): give the IPv4 address of this node the \
             overlay traffic should use")
    })?;
    let IpAddr::V4(v4) = ip else {
        return Err(bad("Shoal's overlay data plane carries IPv4 only: give an IPv4 address of this node"));
    };
    if v4.is_unspecified() || v4.is_loopback() || v4.is_multicast() || v4.is_broadcast() {
        return Err(bad(
            "data path address must be a non-zero unicast IP address of this node, reachable from the others",
        ));
    }
    Ok(Some(ip))
}

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
