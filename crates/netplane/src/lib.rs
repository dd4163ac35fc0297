//! The node's data plane: what makes packets flow between the tasks of an overlay network. For each network a
//! node carries, a namespace of its own holding a bridge and a VXLAN device (static forwarding and neighbour
//! entries from the manager's view of which task address lives on which node: no multicast, no flooding, no
//! learning), linked to the node by a gateway veth unless the network is internal; for each task, a veth
//! from the bridge into the task's network namespace with its allocated address and default route; on hosts
//! whose iptables FORWARD chain would drop (Docker's), accept rules for what the node forwards for its
//! networks, owned and removed by Shoal; for each
//! service, its VIP DNATed to the backends in an nftables table of Shoal's own in every task namespace; and a
//! DNS resolver (`dns`) answering each task's service names inside its namespace.
//!
//! A network of several IPv4 subnets has a bridge, VXLAN device (with that subnet's VNI) and gateway end per
//! subnet in its one namespace; the node routes between them and each task has a route to the others through
//! its own subnet's gateway (docs/design/overlay-subnets.md).
//!
//! One seam: the agent describes the node's wanted state as a `NodeNetState`, `plan` (sans-IO) compares it with
//! an `Observed` and returns `Op`s, and the `Executor` observes and applies them (`Executor::reconcile` does
//! all three). This crate knows nothing of the store, the agent or the API types: the agent maps those to a
//! `NodeNetState`. See docs/design/netplane.md.
//!
//! The facade: every module is internal; other crates use what this root declares and re-exports (the seam
//! above, the resolver, `check_encryption` and `Error`) and, with the `test-doors` feature only, the helpers
//! this crate's integration tests use (grouped below).

// The modules marked below hold items only the test doors re-export: without the feature those are `pub` but
// unreached (with it, as in any build of the whole workspace, `unreachable_pub` checks them).
#[cfg_attr(not(any(test, feature = "test-doors")), allow(unreachable_pub, reason = "test doors' items"))]
mod dns;
mod exec;
#[cfg_attr(not(any(test, feature = "test-doors")), allow(unreachable_pub, reason = "test doors' items"))]
mod names;
mod nft;
mod plan;
mod state;

use std::path::PathBuf;

// The seam the agent drives: the node's wanted state, and the executor that observes, plans and applies it.
pub use exec::{probe, Capabilities, Executor};
pub use plan::{Observed, Op};
pub use state::{
    check_ifnames, mac_for, Attachment, Ipv4Cidr, Ipv6Cidr, Mac, NetworkState, NodeIngress, NodeNetState, Peer,
    Protocol, PublishedPort, ServiceVip, Subnet, Subnet6, TaskState,
};

// The DNS resolver in each task namespace, and the resolv.conf a task is given.
pub use dns::{resolv_conf, upstreams_from_resolv_conf, Resolver};

// The test doors (the `test-doors` feature): this crate's integration tests query the resolver, probe for
// encryption and find a network's namespace by name.
#[cfg(any(test, feature = "test-doors"))]
pub use dns::{parse_response, query_bytes, RESOLVER_ADDR};
#[cfg(any(test, feature = "test-doors"))]
pub use exec::{probe_encryption, EncryptionCapabilities};
#[cfg(any(test, feature = "test-doors"))]
pub use names::{network_netns, network_netns_vni};

/// Whether this data plane can carry `network` (`encrypted`: created with `--opt encrypted`). The one place
/// that decides it: `NetworkState::validate` asks it, and so does the agent for every task it is given
/// (`shoal-agent`'s `worker.rs`), so a task on an encrypted network is rejected with this reason on every
/// node, before any executor sees it. The data plane encrypts nothing yet (this kernel has neither IPsec
/// ESP nor WireGuard, `exec::probe`), so every encrypted network is refused.
pub fn check_encryption(network: &str, encrypted: bool) -> Result<(), Error> {
    if encrypted {
        return Err(Error::EncryptionUnsupported { network: network.to_string() });
    }
    Ok(())
}

/// What can go wrong in the data plane.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The desired state breaks a bound or refers to something unknown; nothing was changed.
    #[error("invalid network state: {0}")]
    Invalid(String),
    /// An encrypted overlay was asked for on a kernel without IPsec ESP or WireGuard.
    #[error(
        "network {network} is encrypted, but this node's kernel has neither IPsec ESP (AES-GCM) nor WireGuard; \
         create the network without --opt encrypted or run the task on a node whose kernel has them"
    )]
    EncryptionUnsupported {
        /// The network's ID.
        network: String,
    },
    /// A task's network namespace does not exist (the task is gone or its executor has not made it yet).
    #[error("task {task}: network namespace {path:?} does not exist")]
    NamespaceMissing {
        /// The task's ID.
        task: String,
        /// The path.
        path: PathBuf,
    },
    /// A command could not be started (iproute2, nftables, util-linux and root are needed).
    #[error("cannot run `{command}`: {source} (the data plane needs root, iproute2, nftables and nsenter)")]
    Spawn {
        /// The command line.
        command: String,
        /// Why.
        source: std::io::Error,
    },
    /// A command failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// What it said.
        stderr: String,
    },
    /// A command ran longer than its bound and was killed.
    #[error("`{command}` took longer than {secs} s and was killed")]
    Timeout {
        /// The command line.
        command: String,
        /// The bound.
        secs: u64,
    },
    /// The resolver could not serve a task (its namespace is gone, or 127.0.0.11:53 is taken in it).
    #[error("DNS for task {task}: {detail}")]
    Dns {
        /// The task's ID.
        task: String,
        /// What failed.
        detail: String,
    },
    /// A command's JSON output could not be read.
    #[error("cannot read the output of `{command}`: {detail}")]
    Parse {
        /// The command line.
        command: String,
        /// The parser's message.
        detail: String,
    },
}
