//! A member of Docker's overlay gossip, so Docker Engine workers find each other through Shoal's managers.
//!
//! A Docker Engine in swarm mode runs libnetwork's network database over HashiCorp's memberlist (port 7946,
//! TCP and UDP, encrypted with the cluster's `networking:gossip` keys from the session messages), and joins
//! it through the managers' addresses. A Docker manager is a member; a Shoal manager runs this one, so
//! engines can join and learn of each other, then exchange their overlay peers and service records among
//! themselves. It passes on the news it hears (new members, network joins and leaves), as every member
//! must: an engine sends each broadcast to a few random members only. And it publishes the peer records of
//! tasks on Shoal's own agents, so engines reach them on an overlay, and their endpoint records, so the
//! engines' DNS answers their names. No Rust crate speaks memberlist's own wire format
//! (the `memberlist` crate on crates.io is a port with a wire format of its own), so `wire` writes it: MessagePack as
//! Go's codec reads it (`rmpv` reads), AES-GCM (`ring`), LZW (`weezl`).
//!
//! `wire`: the formats; `member`: the sans-IO member (its table, its answers); `shell`: its UDP socket and TCP
//! listener. Must not depend on the cluster's state or on other Shoal crates: the keys come in through a
//! watch channel.

pub mod member;
pub mod shell;
pub mod wire;

pub use member::{
    endpoint_record, peer_record, Endpoint, Entries, Event, IngressPort, Member, Peer, State, ENDPOINT_TABLE,
    PEER_TABLE,
};
pub use shell::{serve, GossipHandle, GOSSIP_PORT};

/// What went wrong with a message.
#[derive(Debug, thiserror::Error)]
pub enum GossipError {
    /// The message is not in memberlist's format.
    #[error("malformed gossip message: {0}")]
    Malformed(String),
    /// No key of the ring opens it (or the member has no key yet).
    #[error("no gossip key opens the message (a member with other keys, or not yet given the cluster's)")]
    NoKey,
    /// A key is unusable.
    #[error("gossip key: {0}")]
    Key(String),
}
