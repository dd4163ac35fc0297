//! Writes the binary seed corpus (`corpus/<target>/*.bin`) from real messages made with the project's own
//! types and encoders, so the seeds are what a peer really sends. Run it again after a wire change:
//! `cargo nextest run -p shoal-fuzz --run-ignored only write_seed_corpus`. The JSON and query seeds are
//! written by hand (taken from what the docker CLI sends) and are not touched.
#![expect(clippy::cast_possible_truncation, reason = "test data is small: seed messages of a few hundred bytes")]

use std::path::{Path, PathBuf};

use protobuf::Message as _;
use sha2::{Digest, Sha256};
use shoal_api::prost::Message;
use shoal_api::*;
use shoal_ca::{generate_join_token, SecretKey, UnlockKey};
use shoal_engine_api::json::{decode, ServiceSpecJson};
use shoal_raft::eraftpb;
use shoal_raft::{Member, Members};
use shoal_store::{encode_request, encode_snapshot, Changes};

fn dir(target: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(target);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write(target: &str, name: &str, bytes: &[u8]) {
    std::fs::write(dir(target).join(name), bytes).unwrap();
}

fn with_selector(sel: u8, bytes: &[u8]) -> Vec<u8> {
    let mut v = vec![sel];
    v.extend_from_slice(bytes);
    v
}

fn ts(seconds: i64) -> Option<prost_types::Timestamp> {
    Some(prost_types::Timestamp { seconds, nanos: 5 })
}

fn service() -> Service {
    let body =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/engine_service_spec/full.json")).unwrap();
    let spec = decode::<ServiceSpecJson>(&body).unwrap().to_api().unwrap();
    Service {
        id: "svc1".into(),
        meta: Some(Meta {
            version: Some(Version { index: 3 }),
            created_at: ts(1_800_000_000),
            updated_at: ts(1_800_000_001),
        }),
        spec: Some(spec),
        ..Default::default()
    }
}

fn task(slot: u64) -> Task {
    let s = service();
    Task {
        id: format!("task{slot}"),
        meta: Some(Meta { version: Some(Version { index: 4 }), ..Default::default() }),
        spec: s.spec.as_ref().and_then(|sp| sp.task.clone()).map(Into::into),
        service_id: s.id.clone(),
        slot,
        node_id: "node1".into(),
        status: Some(TaskStatus {
            timestamp: ts(1_800_000_002),
            state: TaskState::Running as i32,
            message: "started".into(),
            ..Default::default()
        }),
        desired_state: TaskState::Running as i32,
        ..Default::default()
    }
}

fn node() -> Node {
    Node {
        id: "node1".into(),
        meta: Some(Meta { version: Some(Version { index: 2 }), ..Default::default() }),
        spec: Some(NodeSpec {
            desired_role: NodeRole::Worker as i32,
            availability: node_spec::Availability::Active as i32,
            ..Default::default()
        }),
        description: Some(NodeDescription { hostname: "host1".into(), ..Default::default() }),
        ..Default::default()
    }
}

fn cluster() -> Cluster {
    Cluster { id: "cluster1".into(), spec: Some(ClusterSpec::default()), ..Default::default() }
}

fn secret() -> Secret {
    Secret {
        id: "sec1".into(),
        meta: Some(Meta {
            version: Some(Version { index: 4 }),
            created_at: ts(1_700_000_000),
            updated_at: ts(1_700_000_000),
        }),
        spec: Some(SecretSpec {
            annotations: Some(Annotations { name: "db_pw".into(), ..Default::default() }),
            data: b"pw".to_vec(),
            templating: Some(Driver { name: "golang".into(), ..Default::default() }),
            ..Default::default()
        }),
        internal: false,
    }
}

fn config() -> Config {
    Config {
        id: "cfg1".into(),
        meta: Some(Meta {
            version: Some(Version { index: 5 }),
            created_at: ts(1_700_000_000),
            updated_at: ts(1_700_000_000),
        }),
        spec: Some(ConfigSpec {
            annotations: Some(Annotations { name: "app.conf".into(), ..Default::default() }),
            data: b"{{.Service.Name}}-{{.Task.Slot}}".to_vec(),
            templating: Some(Driver { name: "golang".into(), ..Default::default() }),
        }),
    }
}

fn volume() -> Volume {
    Volume {
        id: "vol1".into(),
        meta: Some(Meta { version: Some(Version { index: 10 }), created_at: ts(100), updated_at: ts(100) }),
        spec: Some(VolumeSpec {
            annotations: Some(Annotations { name: "data".into(), ..Default::default() }),
            group: "db".into(),
            driver: Some(Driver { name: "csi.example.com".into(), options: [("size".into(), "1G".into())].into() }),
            access_mode: Some(VolumeAccessMode {
                access_type: Some(volume_access_mode::AccessType::Mount(Default::default())),
                ..Default::default()
            }),
            accessibility_requirements: Some(TopologyRequirement {
                requisite: vec![Topology { segments: [("zone".into(), "z1".into())].into() }],
                ..Default::default()
            }),
            capacity_range: Some(CapacityRange { required_bytes: 1 << 30, limit_bytes: 0 }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
#[ignore = "rewrites the checked-in binary corpus"]
fn write_seed_corpus() {
    // Store proposals and snapshots.
    let mut c = Changes::new();
    c.create(service()).create(task(1)).create(task(2)).create(node()).create(cluster());
    write("store_proposal", "create-all.bin", &encode_request(7, c.actions()));
    let mut c = Changes::new();
    c.create(secret()).create(config());
    write("store_proposal", "secret-config.bin", &encode_request(9, c.actions()));
    let mut c = Changes::new();
    c.create(volume());
    write("store_proposal", "volume.bin", &encode_request(10, c.actions()));
    let mut c = Changes::new();
    c.update(task(1)).remove(std::sync::Arc::new(task(2)));
    write("store_proposal", "update-remove.bin", &encode_request(8, c.actions()));
    let snap = StoreSnapshot {
        nodes: vec![node()],
        services: vec![service()],
        tasks: vec![task(1), task(2)],
        clusters: vec![cluster()],
        secrets: vec![secret()],
        configs: vec![config()],
        networks: vec![],
        volumes: vec![volume()],
    };
    write("store_snapshot", "small.bin", &encode_snapshot(snap));
    write("store_snapshot", "empty.bin", &encode_snapshot(StoreSnapshot::default()));

    // raft-rs messages.
    let mut append = eraftpb::Message::default();
    append.set_msg_type(eraftpb::MessageType::MsgAppend);
    append.set_to(2);
    append.set_from(1);
    append.set_term(3);
    append.set_log_term(3);
    append.set_index(10);
    append.set_commit(10);
    let mut e = eraftpb::Entry::default();
    e.set_term(3);
    e.set_index(11);
    e.set_data(encode_request(9, &[]).into());
    append.set_entries(vec![e].into());
    write("raft_message", "append.bin", &append.write_to_bytes().unwrap());
    let mut hb = eraftpb::Message::default();
    hb.set_msg_type(eraftpb::MessageType::MsgHeartbeat);
    hb.set_to(2);
    hb.set_from(1);
    hb.set_term(3);
    hb.set_commit(11);
    write("raft_message", "heartbeat.bin", &hb.write_to_bytes().unwrap());
    let mut snapmsg = eraftpb::Message::default();
    snapmsg.set_msg_type(eraftpb::MessageType::MsgSnapshot);
    snapmsg.set_to(2);
    snapmsg.set_from(1);
    snapmsg.set_term(3);
    let mut s = eraftpb::Snapshot::default();
    s.set_data(encode_snapshot(StoreSnapshot::default()).into());
    s.mut_metadata().set_index(5);
    s.mut_metadata().set_term(2);
    s.mut_metadata().mut_conf_state().set_voters(vec![1, 2, 3]);
    snapmsg.set_snapshot(s);
    write("raft_message", "snapshot.bin", &snapmsg.write_to_bytes().unwrap());

    // Sequences stepped into a follower (each message u16 length-prefixed).
    let seq = |msgs: &[&eraftpb::Message]| {
        let mut v = Vec::new();
        for m in msgs {
            let b = m.write_to_bytes().unwrap();
            v.extend_from_slice(&(b.len() as u16).to_be_bytes());
            v.extend_from_slice(&b);
        }
        v
    };
    let mut append6 = append.clone();
    append6.set_term(1);
    append6.set_log_term(1);
    append6.set_index(5);
    append6.set_commit(5);
    let mut e6 = eraftpb::Entry::default();
    e6.set_term(1);
    e6.set_index(6);
    append6.set_entries(vec![e6].into());
    let mut hb1 = hb.clone();
    hb1.set_term(1);
    hb1.set_commit(6);
    write("raft_step", "append-heartbeat.bin", &seq(&[&append6, &hb1]));
    let mut vote = eraftpb::Message::default();
    vote.set_msg_type(eraftpb::MessageType::MsgRequestVote);
    vote.set_from(3);
    vote.set_term(2);
    vote.set_log_term(1);
    vote.set_index(5);
    write("raft_step", "vote-snapshot.bin", &seq(&[&vote, &snapmsg]));

    // gRPC requests (first byte: the message type, as `targets::grpc::requests` numbers them).
    let csr = shoal_ca::generate_node_key_and_csr().unwrap();
    let reqs: Vec<(u8, &str, Vec<u8>)> = vec![
        (
            0,
            "session",
            SessionRequest {
                description: Some(NodeDescription { hostname: "w1".into(), ..Default::default() }),
                session_id: String::new(),
            }
            .encode_to_vec(),
        ),
        (1, "heartbeat", HeartbeatRequest { session_id: "s1".into() }.encode_to_vec()),
        (
            2,
            "update-task-status",
            UpdateTaskStatusRequest {
                session_id: "s1".into(),
                updates: vec![update_task_status_request::TaskStatusUpdate {
                    task_id: "task1".into(),
                    status: task(1).status,
                }],
            }
            .encode_to_vec(),
        ),
        (3, "assignments", AssignmentsRequest { session_id: "s1".into() }.encode_to_vec()),
        (
            4,
            "issue-cert",
            IssueNodeCertificateRequest {
                csr: csr.csr_pem.clone().into_bytes(),
                token: "SWMTKN-1-x-y".into(),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (5, "cert-status", NodeCertificateStatusRequest { node_id: "node1".into() }.encode_to_vec()),
        (6, "process-raft", ProcessRaftMessageRequest { message: append.write_to_bytes().unwrap() }.encode_to_vec()),
        (7, "stream-raft", StreamRaftMessageRequest { message: snapmsg.write_to_bytes().unwrap() }.encode_to_vec()),
        (8, "resolve", ResolveAddressRequest { raft_id: 2 }.encode_to_vec()),
        (9, "join", JoinRequest { addr: "10.0.0.2:4242".into() }.encode_to_vec()),
        (
            10,
            "leave",
            LeaveRequest {
                node: Some(RaftMember {
                    raft_id: 2,
                    node_id: "node2".into(),
                    addr: "10.0.0.2:4242".into(),
                    ..Default::default()
                }),
            }
            .encode_to_vec(),
        ),
        (
            11,
            "forward",
            ForwardProposalRequest { request: encode_request(3, Changes::new().create(task(3)).actions()) }
                .encode_to_vec(),
        ),
        (12, "listen", ListenSubscriptionsRequest {}.encode_to_vec()),
        (
            13,
            "publish-logs",
            PublishLogsMessage {
                subscription_id: "sub1".into(),
                messages: vec![LogMessage {
                    context: Some(LogContext {
                        service_id: "svc1".into(),
                        node_id: "node1".into(),
                        task_id: "task1".into(),
                    }),
                    timestamp: ts(1_800_000_003),
                    stream: LogStream::Stdout as i32,
                    data: b"hello\n".to_vec(),
                    attrs: vec![],
                }],
                close: false,
            }
            .encode_to_vec(),
        ),
        (
            14,
            "subscribe-logs",
            SubscribeLogsRequest {
                selector: Some(LogSelector { service_ids: vec!["svc1".into()], ..Default::default() }),
                options: Some(LogSubscriptionOptions { streams: vec![1], follow: true, tail: -11, since: None }),
            }
            .encode_to_vec(),
        ),
        (
            15,
            "join-response",
            JoinResponse {
                raft_id: 2,
                members: vec![Member { raft_id: 1, node_id: "node1".into(), addr: "10.0.0.1:4242".into() }.to_wire()],
                removed_members: vec![5],
            }
            .encode_to_vec(),
        ),
        (
            16,
            "session-message",
            SessionMessage { session_id: "s1".into(), node: Some(node()), ..Default::default() }.encode_to_vec(),
        ),
        (
            17,
            "assignments-message",
            AssignmentsMessage {
                changes: vec![AssignmentChange {
                    assignment: Some(Assignment { item: Some(assignment::Item::Task(task(1))) }),
                    action: 0,
                }],
                ..Default::default()
            }
            .encode_to_vec(),
        ),
    ];
    for (sel, name, bytes) in reqs {
        write("grpc_requests", &format!("{sel:02}-{name}.bin"), &with_selector(sel, &bytes));
    }
    let issue =
        IssueNodeCertificateRequest { csr: csr.csr_pem.clone().into_bytes(), ..Default::default() }.encode_to_vec();
    let statuses = UpdateTaskStatusRequest {
        session_id: "s1".into(),
        updates: [(1, TaskState::Running), (2, TaskState::Complete), (3, TaskState::Running), (9, TaskState::Running)]
            .into_iter()
            .map(|(i, state)| update_task_status_request::TaskStatusUpdate {
                task_id: if i == 9 { "other".into() } else { format!("task{i}") },
                status: Some(TaskStatus { state: state as i32, message: "started".into(), ..Default::default() }),
            })
            .collect(),
    };
    write("dispatcher_update_task_status", "mixed.bin", &statuses.encode_to_vec());
    for (sel, name) in [(0u8, "no-token"), (1, "worker-token"), (2, "manager-token"), (3, "renewal")] {
        write("ca_issue_node_certificate", &format!("{name}.bin"), &with_selector(sel, &issue));
    }

    // State-dir records (first byte: which, as `targets::raft::records` numbers them).
    let mut slot = [0u8; 64];
    slot[..8].copy_from_slice(b"SHOALCR1");
    slot[8..16].copy_from_slice(&3u64.to_be_bytes());
    slot[16..24].copy_from_slice(&120u64.to_be_bytes());
    slot[24..32].copy_from_slice(&4u64.to_be_bytes());
    let digest = Sha256::digest(&slot[..32]);
    slot[32..48].copy_from_slice(&digest[..16]);
    let mut record = slot.to_vec();
    record.extend_from_slice(&slot);
    write("raft_records", "0-commit-record.bin", &with_selector(0, &record));
    let keys = shoal_raft::encryption::DataKeys::generate();
    let kek = shoal_fuzz::targets::raft::fixed_key();
    write("raft_records", "1-dek-plain.bin", &with_selector(1, &shoal_raft::encryption::dek_file_bytes(&keys, None)));
    write(
        "raft_records",
        "1-dek-sealed.bin",
        &with_selector(1, &shoal_raft::encryption::dek_file_bytes(&keys, Some(&kek))),
    );
    let dek = shoal_raft::encryption::dek_file_bytes(&keys, None);
    let mut sealed_entry = (dek.len() as u16).to_be_bytes().to_vec();
    sealed_entry.extend_from_slice(&dek);
    sealed_entry.extend_from_slice(&keys.encrypt(b"entry", &encode_request(1, &[])));
    write("raft_records", "2-sealed-entry.bin", &with_selector(2, &sealed_entry));
    let envelope = shoal_ca::encryption::seal(&kek, 1, b"aad", b"a sealed TLS key", &mut rand::rng());
    write("raft_records", "3-envelope.bin", &with_selector(3, &envelope));
    let members = Members::from_wire(&ClusterSnapshot {
        members: vec![Member { raft_id: 1, node_id: "node1".into(), addr: "10.0.0.1:4242".into() }.to_wire()],
        removed: vec![4],
    });
    write("raft_records", "4-members.bin", &with_selector(4, &members.to_wire().encode_to_vec()));

    // CA inputs.
    let root = shoal_ca::RootCa::generate(std::time::SystemTime::now(), &mut rand::rng()).unwrap();
    write("ca_join_token", "token.txt", generate_join_token(&root.digest(), &mut rand::rng()).as_bytes());
    write("ca_unlock_key", "key.txt", UnlockKey::generate(&mut rand::rng()).to_human().as_bytes());
    write("ca_unlock_key", "raw.bin", SecretKey::generate(&mut rand::rng()).as_bytes());
    write("ca_csr", "node-csr.pem", &with_selector(1, csr.csr_pem.as_bytes()));
    {
        use base64::Engine as _;
        let body: String = csr.csr_pem.lines().filter(|l| !l.starts_with("-----")).collect();
        let der = base64::engine::general_purpose::STANDARD.decode(body).unwrap();
        write("ca_csr", "node-csr.der", &with_selector(0, &der));
    }
    write("ca_certificate", "root.pem", root.cert_pem().as_bytes());
    let der = shoal_ca::parse_cert_pem_chain(root.cert_pem().as_bytes()).unwrap().remove(0);
    write("ca_certificate", "root.der", &der);
}

/// The gossip member's seeds: what a Docker Engine sends a manager's member, in plaintext (the target seals
/// it). Run: `cargo nextest run -p shoal-fuzz --run-ignored only write_gossip_seed_corpus`.
#[test]
#[ignore = "rewrites the checked-in gossip corpus"]
fn write_gossip_seed_corpus() {
    use shoal_gossip::wire::{kind, Writer};
    let alive = |name: &str, ip: [u8; 4]| {
        let mut w = Writer::with_type(kind::ALIVE);
        w.map(6).key("Incarnation").uint(3).key("Node").raw(name.as_bytes()).key("Addr").raw(&ip);
        w.key("Port").uint(7946).key("Meta").raw(&[]).key("Vsn").raw(&[1, 5, 2, 0, 0, 0]);
        w.out
    };
    let mut ping = Writer::with_type(kind::PING);
    ping.map(5).key("SeqNo").uint(9).key("Node").raw(b"fuzz").key("SourceAddr").raw(&[10, 0, 0, 3]);
    ping.key("SourcePort").uint(7946).key("SourceNode").raw(b"engine-b");
    write("gossip_messages", "ping.bin", &with_selector(0, &ping.out));
    let mut suspect = Writer::with_type(kind::SUSPECT);
    suspect.map(3).key("Incarnation").uint(1).key("Node").raw(b"fuzz").key("From").raw(b"engine-a");
    let parts = [suspect.out.clone(), alive("engine-a", [10, 0, 0, 2])];
    let mut compound = vec![kind::COMPOUND, parts.len() as u8];
    for p in &parts {
        compound.extend_from_slice(&(p.len() as u16).to_be_bytes());
    }
    for p in &parts {
        compound.extend_from_slice(p);
    }
    write("gossip_messages", "compound.bin", &with_selector(0, &compound));
    let mut push = Writer::with_type(kind::PUSH_PULL);
    push.map(3).key("Nodes").uint(2).key("UserStateLen").uint(4).key("Join").bool(true);
    for (name, ip, state) in [("engine-a", [10, 0, 0, 2], 0), ("engine-c", [10, 0, 0, 4], 2)] {
        push.map(7).key("Name").raw(name.as_bytes()).key("Addr").raw(&ip).key("Port").uint(7946);
        push.key("Meta")
            .raw(&[])
            .key("Incarnation")
            .uint(1)
            .key("State")
            .uint(state)
            .key("Vsn")
            .raw(&[1, 5, 2, 0, 0, 0]);
    }
    push.out.extend_from_slice(&[0x08, 0x03, 0x12, 0x00]);
    write("gossip_messages", "push-pull.bin", &with_selector(1, &push.out));
    let mut compressed = Writer::with_type(kind::COMPRESS);
    let packed = weezl::encode::Encoder::new(weezl::BitOrder::Lsb, 8).encode(&push.out).unwrap();
    compressed.map(2).key("Algo").uint(0).key("Buf").raw(&packed);
    write("gossip_messages", "push-pull-lzw.bin", &with_selector(1, &compressed.out));
    write("gossip_messages", "raw-alive.bin", &with_selector(2, &alive("engine-d", [10, 0, 0, 5])));
}
