//! Fuzz targets for every decoder that reads input from outside a node's trust, and the seeded mutation
//! runner the test suite drives them with.
//!
//! A target is a `fn(&[u8])` that must never panic, hang or allocate without bound, whatever the bytes:
//! the Engine API's request bodies and query strings (`engine`), the protobuf messages an agent or another
//! manager sends and what a handler does with them where no network is needed (`grpc`), Raft proposals and
//! snapshots applied to a store (`store`), raft transport messages, commit records, the DEK file and
//! sealed records (`raft`), join tokens, unlock keys, certificates and CSRs (`ca`), the overlay gossip's
//! packets and streams (`gossip`). [`TARGETS`] lists
//! them by name. Layer 1 is `tests/fuzz.rs`: each target over its checked-in seed corpus
//! (`corpus/<target>/`) and a few thousand inputs mutated from it by a seeded RNG ([`runner`]); a failure
//! prints the seed and the file holding the input, and `SHOAL_FUZZ_REPLAY=<file>` replays it. Layer 2 is
//! coverage-guided fuzzing with cargo-fuzz (libFuzzer) over the same functions, in `fuzz/` (its own
//! workspace, outside this one); see `README.md` for the commands.
//!
//! Depends on the crates it fuzzes and nothing that does network IO; targets that need files write them in
//! a private temporary directory.

pub mod mutate;
pub mod runner;
pub mod targets;

/// One fuzz target: a name (also its corpus folder) and the function.
#[derive(Clone, Copy)]
pub struct Target {
    /// The target's name: `corpus/<name>/` holds its seeds, `fuzz/fuzz_targets/<name>.rs` its libFuzzer entry.
    pub name: &'static str,
    /// The function under test.
    pub run: fn(&[u8]),
    /// Tokens the mutator inserts (field names, keywords) besides the generic ones.
    pub dictionary: &'static [&'static str],
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target {
        name: "engine_service_spec",
        run: targets::engine::service_spec,
        dictionary: targets::engine::SERVICE_DICT,
    },
    Target { name: "engine_secret_spec", run: targets::engine::secret_spec, dictionary: targets::engine::SECRET_DICT },
    Target { name: "engine_volume", run: targets::engine::volume_create, dictionary: targets::engine::VOLUME_DICT },
    Target { name: "engine_node_spec", run: targets::engine::node_spec, dictionary: targets::engine::NODE_DICT },
    Target { name: "engine_swarm_spec", run: targets::engine::swarm_spec, dictionary: targets::engine::SWARM_DICT },
    Target { name: "engine_small_bodies", run: targets::engine::small_bodies, dictionary: targets::engine::SMALL_DICT },
    Target { name: "engine_filters", run: targets::engine::filters, dictionary: targets::engine::FILTER_DICT },
    Target { name: "engine_logs_query", run: targets::engine::logs_query, dictionary: targets::engine::LOGS_DICT },
    Target { name: "store_proposal", run: targets::store::proposal, dictionary: &[] },
    Target { name: "store_snapshot", run: targets::store::snapshot, dictionary: &[] },
    Target { name: "grpc_requests", run: targets::grpc::requests, dictionary: &[] },
    Target { name: "dispatcher_update_task_status", run: targets::grpc::update_task_status, dictionary: &[] },
    Target {
        name: "ca_issue_node_certificate",
        run: targets::grpc::issue_node_certificate,
        dictionary: targets::ca::CSR_DICT,
    },
    Target { name: "raft_message", run: targets::raft::message, dictionary: &[] },
    Target { name: "raft_step", run: targets::raft::step, dictionary: &[] },
    Target { name: "raft_records", run: targets::raft::records, dictionary: &[] },
    Target { name: "ca_join_token", run: targets::ca::join_token, dictionary: targets::ca::TOKEN_DICT },
    Target { name: "ca_unlock_key", run: targets::ca::unlock_key, dictionary: targets::ca::TOKEN_DICT },
    Target { name: "ca_csr", run: targets::ca::csr, dictionary: targets::ca::CSR_DICT },
    Target { name: "ca_certificate", run: targets::ca::certificate, dictionary: targets::ca::CSR_DICT },
    Target { name: "gossip_messages", run: targets::gossip::messages, dictionary: targets::gossip::DICT },
];

/// The target called `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}
