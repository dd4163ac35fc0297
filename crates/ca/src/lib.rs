//! Shoal's certificate authority, as pure functions: the cluster's root CA (ECDSA P-256, CN `swarm-ca`,
//! 20 years), node certificates signed from a CSR with the subject the CA chooses (CN = node ID, OU = role,
//! O = cluster ID), join tokens in SwarmKit's `SWMTKN-1-...` format, and the renewal schedule.
//!
//! No IO, no clock reads, no global randomness for anything that must be repeatable: every function takes
//! `now` and, where it draws, an injected RNG (`rand::CryptoRng` where the draw is a secret or a serial,
//! any seeded `Rng` for the renewal jitter). Private keys come from the OS CSPRNG through `ring` (rcgen):
//! key material is never derived from a seeded generator. Must not depend on gRPC, the store or tokio.

mod cert;
pub mod encryption;
mod renewal;
mod rotation;
mod token;

pub use cert::{
    ca_cert_hash, cert_digest, cert_serial_hex, generate_node_key_and_csr, normalize_serial_hex, parse_cert,
    parse_cert_pem_chain, CertInfo, NodeCsr, NodeSubject, RootCa, BACKDATE, DEFAULT_NODE_CERT_EXPIRY,
    MIN_NODE_CERT_EXPIRY, ROOT_CA_VALIDITY, ROOT_CN,
};
pub use encryption::{EncryptionError, SecretKey, UnlockKey};
pub use renewal::{renewal_delay, RENEW_AT_MAX_FRACTION, RENEW_AT_MIN_FRACTION};
pub use rotation::{
    cert_issuer_info, check_csr, check_root, cross_sign, key_pem_as_pkcs8, root_issuer_info, signed_by, IssuerInfo,
};
pub use token::{generate_join_token, parse_join_token, token_matches, ParsedToken, TOKEN_PREFIX};

/// A node's role, as written in its certificate's OU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// A manager: Raft member, serves the control API and the CA.
    Manager,
    /// A worker: runs tasks, talks to the dispatcher and the CA only.
    Worker,
    /// An operator's client certificate (`shoal ca issue-client-cert`): may use the Engine API over TCP.
    Admin,
}

impl Role {
    /// The OU string of this role.
    pub fn ou(self) -> &'static str {
        match self {
            Role::Manager => "swarm-manager",
            Role::Worker => "swarm-worker",
            Role::Admin => "shoal-admin",
        }
    }

    /// The role named by an OU string.
    pub fn from_ou(ou: &str) -> Option<Role> {
        [Role::Manager, Role::Worker, Role::Admin].into_iter().find(|r| r.ou() == ou)
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.ou())
    }
}

/// What went wrong in a CA operation.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// Generating or signing with rcgen failed.
    #[error("certificate operation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
    /// A certificate could not be parsed.
    #[error("invalid certificate: {0}")]
    BadCertificate(String),
    /// A certificate signing request could not be parsed or its signature is wrong.
    #[error("invalid certificate signing request ({0}); generate a new key and CSR")]
    BadCsr(String),
    /// A join token is malformed.
    #[error("invalid join token: {0}; get a valid one with `docker swarm join-token worker|manager` on a manager")]
    BadToken(String),
    /// A requested certificate lifetime is too short.
    #[error("node certificate expiry {requested:?} is shorter than the minimum {minimum:?}")]
    ExpiryTooShort {
        /// What was asked.
        requested: std::time::Duration,
        /// The minimum.
        minimum: std::time::Duration,
    },
}

#[cfg(test)]
mod tests;
