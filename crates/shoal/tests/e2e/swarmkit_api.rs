//! SwarmKit's own API on `--listen-swarmkit-api`, driven by a tonic client of the same protos connected as
//! `swarmctl` connects (TLS over the unix socket, certificate unverified): every Control call with its
//! answers and SwarmKit's error codes, agreement with the Engine API, refusal of fields Shoal does not
//! know, Health, Logs, and Watch: a service's create, update and remove seen live, then the same events again
//! after a restart of the manager, resumed from a version through the Raft log.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use shoal_api::control_client::ControlClient;
use shoal_api::health_client::HealthClient;
use shoal_api::watch_client::WatchClient;
use shoal_api::*;
use shoal_testkit::DaemonOptions;
use tokio_stream::StreamExt;
use tonic::Code;

struct Node {
    d: DaemonProcess,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

fn start() -> Node {
    let dir = tempfile::Builder::new().prefix("swk-").tempdir_in(shoal_testkit::scratch_dir()).expect("tempdir");
    let socket = dir.path().join("swarmd.sock");
    let d = DaemonProcess::start_with(
        &shoal_bin(),
        DaemonOptions {
            extra_args: vec!["--listen-swarmkit-api".into(), socket.display().to_string()],
            ..Default::default()
        },
    );
    Node { d, socket, _dir: dir }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

async fn control(socket: &Path) -> ControlClient<tonic::transport::Channel> {
    ControlClient::new(shoal_testkit::swarmkit::channel(socket).await.expect("connect to the SwarmKit API socket"))
}

fn service_spec(name: &str, replicas: u64) -> ServiceSpec {
    ServiceSpec {
        annotations: Some(Annotations { name: name.into(), ..Default::default() }),
        task: Some(TaskSpec {
            runtime: Some(task_spec::Runtime::Container(ContainerSpec {
                image: "busybox".into(),
                command: vec!["sleep".into()],
                args: vec!["3600".into()],
                ..Default::default()
            })),
            ..Default::default()
        }),
        mode: Some(service_spec::Mode::Replicated(ReplicatedService { replicas })),
        ..Default::default()
    }
}

fn version(meta: &Option<Meta>) -> Option<Version> {
    meta.as_ref().and_then(|m| m.version)
}

/// Calls `path` with `body` as its raw request message: what a client with newer protos would send.
async fn raw_call(socket: &Path, path: &'static str, body: Vec<u8>) -> tonic::Status {
    let channel = shoal_testkit::swarmkit::channel(socket).await.unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let r: Result<tonic::Response<Vec<u8>>, tonic::Status> = grpc
        .unary(tonic::Request::new(body), tonic::codegen::http::uri::PathAndQuery::from_static(path), RawCodec)
        .await;
    r.expect_err("refused")
}

/// Bytes in, bytes out.
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }
    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        let mut v = vec![0; bytes::Buf::remaining(src)];
        bytes::Buf::copy_to_slice(src, &mut v);
        Ok(Some(v))
    }
}

#[test]
fn every_control_call_answers_as_swarmkit_does() {
    let n = start();
    let mode = std::fs::metadata(&n.socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the socket's mode is its access control");
    runtime().block_on(async {
        let mut c = control(&n.socket).await;
        let mut health = HealthClient::new(shoal_testkit::swarmkit::channel(&n.socket).await.unwrap());
        let h = health.check(HealthCheckRequest { service: String::new() }).await.unwrap().into_inner();
        assert_eq!(h.status, health_check_response::ServingStatus::Serving as i32);

        // Nodes.
        let nodes = c.list_nodes(ListNodesRequest::default()).await.unwrap().into_inner().nodes;
        assert_eq!(nodes.len(), 1);
        let me = &nodes[0];
        let managers = c
            .list_nodes(ListNodesRequest {
                filters: Some(list_nodes_request::Filters {
                    roles: vec![NodeRole::Manager as i32],
                    ..Default::default()
                }),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(managers.nodes.len(), 1);
        let workers = c
            .list_nodes(ListNodesRequest {
                filters: Some(list_nodes_request::Filters {
                    roles: vec![NodeRole::Worker as i32],
                    ..Default::default()
                }),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(workers.nodes.is_empty());
        let got = c.get_node(GetNodeRequest { node_id: me.id.clone() }).await.unwrap().into_inner().node.unwrap();
        assert_eq!(got.id, me.id);
        assert!(version(&got.meta).unwrap().index > 0, "versions are Raft indexes");
        let mut spec = got.spec.clone().unwrap();
        spec.annotations.get_or_insert_with(Default::default).labels.insert("zone".into(), "a".into());
        let updated = c
            .update_node(UpdateNodeRequest {
                node_id: me.id.clone(),
                node_version: version(&got.meta),
                spec: Some(spec.clone()),
            })
            .await
            .unwrap()
            .into_inner()
            .node
            .unwrap();
        assert!(version(&updated.meta).unwrap().index > version(&got.meta).unwrap().index);
        let stale = c
            .update_node(UpdateNodeRequest {
                node_id: me.id.clone(),
                node_version: version(&got.meta),
                spec: Some(spec),
            })
            .await;
        assert_eq!(stale.unwrap_err().code(), Code::FailedPrecondition, "out of sequence");
        let labelled = c
            .list_nodes(ListNodesRequest {
                filters: Some(list_nodes_request::Filters {
                    node_labels: [("zone".to_string(), "a".to_string())].into(),
                    ..Default::default()
                }),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(labelled.nodes.len(), 1);
        let refused = c.remove_node(RemoveNodeRequest { node_id: me.id.clone(), force: true }).await.unwrap_err();
        assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
        assert_eq!(c.get_node(GetNodeRequest { node_id: "nope".into() }).await.unwrap_err().code(), Code::NotFound);

        // Services and tasks.
        let svc = c
            .create_service(CreateServiceRequest { spec: Some(service_spec("web", 3)) })
            .await
            .unwrap()
            .into_inner()
            .service
            .unwrap();
        let dup = c.create_service(CreateServiceRequest { spec: Some(service_spec("web", 1)) }).await.unwrap_err();
        assert_eq!(dup.code(), Code::AlreadyExists);
        let bad = c.create_service(CreateServiceRequest { spec: Some(service_spec("web_", 0)) }).await;
        assert!(bad.is_ok(), "web_ is a valid name");
        let invalid = c.create_service(CreateServiceRequest { spec: Some(service_spec("-x", 1)) }).await.unwrap_err();
        assert_eq!(invalid.code(), Code::InvalidArgument);
        let listed = c
            .list_services(ListServicesRequest {
                filters: Some(list_services_request::Filters { names: vec!["web".into()], ..Default::default() }),
            })
            .await
            .unwrap()
            .into_inner()
            .services;
        assert_eq!(listed.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), vec![svc.id.as_str()]);
        let got = c
            .get_service(GetServiceRequest { service_id: svc.id.clone(), insert_defaults: false })
            .await
            .unwrap()
            .into_inner()
            .service
            .unwrap();
        let scaled = c
            .update_service(UpdateServiceRequest {
                service_id: svc.id.clone(),
                service_version: version(&got.meta),
                spec: Some(service_spec("web", 5)),
                rollback: 0,
            })
            .await
            .unwrap()
            .into_inner()
            .service
            .unwrap();
        let running = wait_for_running(&mut c, &svc.id, 5).await;
        let task = c.get_task(GetTaskRequest { task_id: running[0].clone() }).await.unwrap().into_inner().task.unwrap();
        assert_eq!(task.service_id, svc.id);
        let st = c
            .list_service_statuses(ListServiceStatusesRequest { services: vec![svc.id.clone()] })
            .await
            .unwrap()
            .into_inner();
        assert_eq!((st.statuses[0].desired_tasks, st.statuses[0].running_tasks), (5, 5));
        // The Engine API shows the same.
        let ls = docker_cli::ok(n.d.socket(), &["service", "ls", "--format", "{{.Name}} {{.Replicas}}"]);
        assert!(ls.lines().any(|l| l.trim() == "web 5/5"), "{ls}");
        let rolled = c
            .update_service(UpdateServiceRequest {
                service_id: svc.id.clone(),
                service_version: version(&scaled.meta),
                spec: None,
                rollback: update_service_request::Rollback::Previous as i32,
            })
            .await
            .unwrap()
            .into_inner()
            .service
            .unwrap();
        match rolled.spec.as_ref().and_then(|s| s.mode.as_ref()) {
            Some(service_spec::Mode::Replicated(r)) => assert_eq!(r.replicas, 3),
            other => panic!("{other:?}"),
        }
        c.remove_service(RemoveServiceRequest { service_id: svc.id.clone() }).await.unwrap();
        let gone = c.get_service(GetServiceRequest { service_id: svc.id.clone(), insert_defaults: false }).await;
        assert_eq!(gone.unwrap_err().code(), Code::NotFound);

        // The cluster.
        let clusters = c
            .list_clusters(ListClustersRequest {
                filters: Some(list_clusters_request::Filters { names: vec!["default".into()], ..Default::default() }),
            })
            .await
            .unwrap()
            .into_inner()
            .clusters;
        assert_eq!(clusters.len(), 1);
        let cluster = c
            .get_cluster(GetClusterRequest { cluster_id: clusters[0].id.clone() })
            .await
            .unwrap()
            .into_inner()
            .cluster
            .unwrap();
        let root = cluster.root_ca.clone().unwrap();
        assert!(root.ca_key.is_empty(), "the CA key is never shown");
        assert!(!root.ca_cert.is_empty());
        // The key manager made the network keys when the node became leader; they are never shown either.
        wait_until("the network keys", Duration::from_secs(20), || {
            n.d.log().contains("network encryption keys written").then_some(()).ok_or_else(|| "not yet".to_string())
        });
        let cluster = c
            .get_cluster(GetClusterRequest { cluster_id: cluster.id.clone() })
            .await
            .unwrap()
            .into_inner()
            .cluster
            .unwrap();
        assert!(cluster.network_bootstrap_keys.is_empty() && cluster.encryption_key_lamport_clock == 0, "{cluster:?}");
        let worker_token = root.join_tokens.clone().unwrap().worker;
        let mut spec = cluster.spec.clone().unwrap();
        spec.orchestration.get_or_insert_with(Default::default).task_history_retention_limit = 3;
        let updated = c
            .update_cluster(UpdateClusterRequest {
                cluster_id: cluster.id.clone(),
                cluster_version: version(&cluster.meta),
                spec: Some(spec),
                rotation: Some(KeyRotation { worker_join_token: true, ..Default::default() }),
            })
            .await
            .unwrap()
            .into_inner()
            .cluster
            .unwrap();
        assert_eq!(updated.spec.unwrap().orchestration.unwrap().task_history_retention_limit, 3);
        assert_ne!(updated.root_ca.unwrap().join_tokens.unwrap().worker, worker_token, "the worker token was rotated");

        // Secrets: their data never comes back.
        let secret_spec = SecretSpec {
            annotations: Some(Annotations { name: "pw".into(), ..Default::default() }),
            data: b"s3cr3t".to_vec(),
            ..Default::default()
        };
        let secret = c
            .create_secret(CreateSecretRequest { spec: Some(secret_spec.clone()) })
            .await
            .unwrap()
            .into_inner()
            .secret
            .unwrap();
        assert!(secret.spec.as_ref().unwrap().data.is_empty());
        let dup = c.create_secret(CreateSecretRequest { spec: Some(secret_spec) }).await.unwrap_err();
        assert_eq!(dup.code(), Code::AlreadyExists);
        assert!(!dup.message().contains("s3cr3t"));
        let got =
            c.get_secret(GetSecretRequest { secret_id: secret.id.clone() }).await.unwrap().into_inner().secret.unwrap();
        assert!(got.spec.as_ref().unwrap().data.is_empty());
        let mut labelled = got.spec.clone().unwrap();
        labelled.annotations.as_mut().unwrap().labels.insert("team".into(), "db".into());
        labelled.data = b"s3cr3t".to_vec();
        c.update_secret(UpdateSecretRequest {
            secret_id: secret.id.clone(),
            secret_version: version(&got.meta),
            spec: Some(labelled),
        })
        .await
        .unwrap();
        let listed = c
            .list_secrets(ListSecretsRequest {
                filters: Some(list_secrets_request::Filters {
                    labels: [("team".to_string(), String::new())].into(),
                    ..Default::default()
                }),
            })
            .await
            .unwrap()
            .into_inner()
            .secrets;
        assert_eq!(listed.len(), 1);
        assert!(listed[0].spec.as_ref().unwrap().data.is_empty());
        let ls = docker_cli::ok(n.d.socket(), &["secret", "ls", "--format", "{{.Name}}"]);
        assert_eq!(ls.trim(), "pw");
        c.remove_secret(RemoveSecretRequest { secret_id: secret.id.clone() }).await.unwrap();
        assert_eq!(
            c.remove_secret(RemoveSecretRequest { secret_id: secret.id }).await.unwrap_err().code(),
            Code::NotFound
        );

        // Configs.
        let config_spec = ConfigSpec {
            annotations: Some(Annotations { name: "conf".into(), ..Default::default() }),
            data: b"key=value".to_vec(),
            ..Default::default()
        };
        let config = c
            .create_config(CreateConfigRequest { spec: Some(config_spec) })
            .await
            .unwrap()
            .into_inner()
            .config
            .unwrap();
        let got =
            c.get_config(GetConfigRequest { config_id: config.id.clone() }).await.unwrap().into_inner().config.unwrap();
        assert_eq!(got.spec.as_ref().unwrap().data, b"key=value");
        let mut labelled = got.spec.clone().unwrap();
        labelled.annotations.as_mut().unwrap().labels.insert("team".into(), "web".into());
        c.update_config(UpdateConfigRequest {
            config_id: config.id.clone(),
            config_version: version(&got.meta),
            spec: Some(labelled),
        })
        .await
        .unwrap();
        let listed = c.list_configs(ListConfigsRequest::default()).await.unwrap().into_inner().configs;
        assert_eq!(listed.len(), 1);
        c.remove_config(RemoveConfigRequest { config_id: config.id }).await.unwrap();

        // Cluster volumes (layer 1: stored, no plugin called), seen by the Engine API too.
        let vspec = VolumeSpec {
            annotations: Some(Annotations { name: "vol".into(), ..Default::default() }),
            driver: Some(Driver { name: "csi.example.com".into(), ..Default::default() }),
            access_mode: Some(VolumeAccessMode {
                access_type: Some(volume_access_mode::AccessType::Block(Default::default())),
                ..Default::default()
            }),
            ..Default::default()
        };
        let volume = c
            .create_volume(CreateVolumeRequest { spec: Some(vspec.clone()) })
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        assert_eq!(
            c.create_volume(CreateVolumeRequest { spec: Some(vspec) }).await.unwrap_err().code(),
            Code::AlreadyExists
        );
        let no_mode = VolumeSpec {
            annotations: Some(Annotations { name: "vol2".into(), ..Default::default() }),
            driver: Some(Driver { name: "csi.example.com".into(), ..Default::default() }),
            ..Default::default()
        };
        let refused = c.create_volume(CreateVolumeRequest { spec: Some(no_mode) }).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument);
        assert!(refused.message().starts_with("AccessMode:"), "{}", refused.message());
        let got =
            c.get_volume(GetVolumeRequest { volume_id: volume.id.clone() }).await.unwrap().into_inner().volume.unwrap();
        let mut drained = got.spec.clone().unwrap();
        drained.availability = volume_spec::VolumeAvailability::Drain as i32;
        let updated = c
            .update_volume(UpdateVolumeRequest {
                volume_id: volume.id.clone(),
                volume_version: version(&got.meta),
                spec: Some(drained),
            })
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        assert_eq!(updated.spec.as_ref().unwrap().availability, volume_spec::VolumeAvailability::Drain as i32);
        let listed = c
            .list_volumes(ListVolumesRequest {
                filters: Some(list_volumes_request::Filters {
                    drivers: vec!["csi.example.com".into()],
                    ..Default::default()
                }),
            })
            .await
            .unwrap()
            .into_inner()
            .volumes;
        assert_eq!(listed.iter().map(|v| v.id.as_str()).collect::<Vec<_>>(), [volume.id.as_str()]);
        let ls = docker_cli::ok(n.d.socket(), &["volume", "ls", "--format", "{{.Name}} {{.Driver}} {{.Scope}}"]);
        assert_eq!(ls.trim(), "vol csi.example.com global");
        c.remove_volume(RemoveVolumeRequest { volume_id: volume.id.clone(), force: false }).await.unwrap();
        let gone = c.get_volume(GetVolumeRequest { volume_id: volume.id }).await.unwrap_err();
        assert_eq!(gone.code(), Code::NotFound);

        // A field Shoal's protos do not define is refused, not dropped: SwarmKit's TaskSpec.resource_references
        // (11) here.
        use shoal_api::prost::encoding::{encode_key, encode_varint, WireType};
        use shoal_api::prost::Message;
        let mut full = service_spec("netted", 1);
        let mut task = full.task.take().unwrap().encode_to_vec();
        task.extend_from_slice(&[11 << 3 | 2, 2, 1 << 3 | 2, 0]);
        let mut spec = full.encode_to_vec();
        encode_key(2, WireType::LengthDelimited, &mut spec);
        encode_varint(task.len() as u64, &mut spec);
        spec.extend_from_slice(&task);
        let mut body = Vec::new();
        encode_key(1, WireType::LengthDelimited, &mut body);
        encode_varint(spec.len() as u64, &mut body);
        body.extend_from_slice(&spec);
        let refused = raw_call(&n.socket, "/docker.swarmkit.v1.Control/CreateService", body).await;
        assert_eq!(refused.code(), Code::InvalidArgument);
        assert!(refused.message().contains("spec.task: field 11"), "{}", refused.message());
        let names = c.list_services(ListServicesRequest::default()).await.unwrap().into_inner().services;
        assert!(names.iter().all(|s| s.spec.as_ref().unwrap().annotations.as_ref().unwrap().name != "netted"));
        // A method Shoal does not serve says so.
        let none = raw_call(&n.socket, "/docker.swarmkit.v1.Control/RemoveTask", Vec::new()).await;
        assert_eq!(none.code(), Code::Unimplemented);
        assert!(none.message().contains("RemoveTask"), "{}", none.message());

        // Networks.
        let net_spec = NetworkSpec {
            annotations: Some(Annotations { name: "backend".into(), ..Default::default() }),
            driver_config: Some(Driver { name: "overlay".into(), ..Default::default() }),
            ..Default::default()
        };
        let net = c
            .create_network(CreateNetworkRequest { spec: Some(net_spec.clone()) })
            .await
            .unwrap()
            .into_inner()
            .network
            .unwrap();
        assert_eq!(
            c.create_network(CreateNetworkRequest { spec: Some(net_spec) }).await.unwrap_err().code(),
            Code::AlreadyExists
        );
        let by_name =
            c.get_network(GetNetworkRequest { name: "backend".into(), network_id: String::new() }).await.unwrap();
        assert_eq!(by_name.into_inner().network.unwrap().id, net.id);
        let listed = c
            .list_networks(ListNetworksRequest {
                filters: Some(list_networks_request::Filters { names: vec!["backend".into()], ..Default::default() }),
            })
            .await
            .unwrap()
            .into_inner()
            .networks;
        assert_eq!(listed.iter().map(|n| n.id.as_str()).collect::<Vec<_>>(), vec![net.id.as_str()]);
        let ls = docker_cli::ok(n.d.socket(), &["network", "ls", "--format", "{{.Name}}"]);
        assert!(ls.lines().any(|l| l.trim() == "backend"), "{ls}");
        c.remove_network(RemoveNetworkRequest { name: String::new(), network_id: net.id.clone() }).await.unwrap();
        let gone = c.get_network(GetNetworkRequest { name: String::new(), network_id: net.id }).await.unwrap_err();
        assert_eq!(gone.code(), Code::NotFound);
    });
}

/// The IDs of `service`'s running tasks once there are `n` (polled every 100 ms, for 60 s at most).
async fn wait_for_running(c: &mut ControlClient<tonic::transport::Channel>, service: &str, n: usize) -> Vec<String> {
    let what = format!("{n} running tasks of {service}");
    shoal_testkit::wait::await_until(&what, Duration::from_secs(60), Duration::from_millis(100), || {
        let mut c = c.clone();
        async move {
            let tasks = c
                .list_tasks(ListTasksRequest {
                    filters: Some(list_tasks_request::Filters {
                        service_ids: vec![service.into()],
                        desired_states: vec![TaskState::Running as i32],
                        ..Default::default()
                    }),
                })
                .await
                .unwrap()
                .into_inner()
                .tasks;
            let running: Vec<String> = tasks
                .iter()
                .filter(|t| t.status.as_ref().is_some_and(|s| s.state == TaskState::Running as i32))
                .map(|t| t.id.clone())
                .collect();
            if running.len() == n {
                Ok(running)
            } else {
                Err(format!("{} running", running.len()))
            }
        }
    })
    .await
}

fn service_entry() -> watch_request::WatchEntry {
    watch_request::WatchEntry { kind: "service".into(), action: 7, filters: Vec::new() }
}

/// (action, version, service name) of each event, in order, until one has version `last` or later.
async fn read_until(stream: &mut tonic::Streaming<WatchMessage>, last: u64) -> Vec<(i32, u64, String)> {
    let mut out = Vec::new();
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .unwrap_or_else(|_| panic!("no watch message within 30 s; so far {out:?}"))
            .expect("the stream goes on")
            .expect("a message");
        let v = msg.version.map(|v| v.index).unwrap_or(0);
        for e in &msg.events {
            let name = match e.object.as_ref().and_then(|o| o.object.as_ref()) {
                Some(object::Object::Service(s)) => s.spec.as_ref().unwrap().annotations.as_ref().unwrap().name.clone(),
                other => panic!("a service entry matched {other:?}"),
            };
            out.push((e.action, v, name));
        }
        if v >= last {
            return out;
        }
    }
}

#[test]
fn a_watch_sees_a_service_come_and_go_and_resumes_after_a_restart() {
    let mut n = start();
    let rt = runtime();
    let (seen, created_at, removed_at) = rt.block_on(async {
        let mut w = WatchClient::new(shoal_testkit::swarmkit::channel(&n.socket).await.unwrap());
        let req = WatchRequest { entries: vec![service_entry()], resume_from: None, include_old_object: true };
        let mut stream = w.watch(req).await.unwrap().into_inner();
        assert_eq!(stream.next().await.unwrap().unwrap(), WatchMessage::default(), "the watch is set up");
        let mut c = control(&n.socket).await;
        let svc = c
            .create_service(CreateServiceRequest { spec: Some(service_spec("web", 1)) })
            .await
            .unwrap()
            .into_inner()
            .service
            .unwrap();
        let scaled = c
            .update_service(UpdateServiceRequest {
                service_id: svc.id.clone(),
                service_version: version(&svc.meta),
                spec: Some(service_spec("web", 2)),
                rollback: 0,
            })
            .await
            .unwrap()
            .into_inner()
            .service
            .unwrap();
        c.remove_service(RemoveServiceRequest { service_id: svc.id.clone() }).await.unwrap();
        // The removal's version: the last one the stream reports for this service.
        let mut seen = Vec::new();
        loop {
            let msg = tokio::time::timeout(Duration::from_secs(30), stream.next())
                .await
                .expect("a message")
                .unwrap()
                .unwrap();
            let v = msg.version.unwrap().index;
            for e in &msg.events {
                if e.action == WatchActionKind::WatchActionUpdate as i32 && v == version(&scaled.meta).unwrap().index {
                    match e.old_object.as_ref().and_then(|o| o.object.as_ref()) {
                        Some(object::Object::Service(old)) => assert_eq!(version(&old.meta), version(&svc.meta)),
                        other => panic!("the old object comes with an update: {other:?}"),
                    }
                }
                seen.push((e.action, v, "web".to_string()));
            }
            if msg.events.iter().any(|e| e.action == WatchActionKind::WatchActionRemove as i32) {
                break;
            }
        }
        let actions: Vec<i32> = seen.iter().map(|s| s.0).collect();
        assert_eq!(actions.first(), Some(&(WatchActionKind::WatchActionCreate as i32)), "{seen:?}");
        assert!(actions.contains(&(WatchActionKind::WatchActionUpdate as i32)), "{seen:?}");
        let created_at = version(&svc.meta).unwrap().index;
        let removed_at = seen.last().unwrap().1;
        (seen, created_at, removed_at)
    });

    // Restart the manager: its store is rebuilt from disk; the watch queue of before is gone.
    assert!(n.d.stop(), "a clean stop");
    n.d.restart(&["--listen-swarmkit-api".to_string(), n.socket.display().to_string()]);

    rt.block_on(async {
        let mut w = WatchClient::new(shoal_testkit::swarmkit::channel(&n.socket).await.unwrap());
        let req = WatchRequest {
            entries: vec![service_entry()],
            resume_from: Some(Version { index: created_at }),
            include_old_object: true,
        };
        let mut stream = w.watch(req).await.unwrap().into_inner();
        assert_eq!(stream.next().await.unwrap().unwrap(), WatchMessage::default());
        let resumed = read_until(&mut stream, removed_at).await;
        let expected: Vec<(i32, u64, String)> = seen.iter().filter(|s| s.1 > created_at).cloned().collect();
        assert_eq!(resumed, expected, "every event after version {created_at}, in order, with its version");

        // And the stream goes on live after the replay.
        let mut c = control(&n.socket).await;
        let next = c
            .create_service(CreateServiceRequest { spec: Some(service_spec("after", 1)) })
            .await
            .unwrap()
            .into_inner()
            .service
            .unwrap();
        let live = read_until(&mut stream, version(&next.meta).unwrap().index).await;
        assert!(
            live.contains(&(
                WatchActionKind::WatchActionCreate as i32,
                version(&next.meta).unwrap().index,
                "after".into()
            )),
            "{live:?}"
        );

        // A version older than anything kept is refused, saying what to do.
        let mut w = WatchClient::new(shoal_testkit::swarmkit::channel(&n.socket).await.unwrap());
        let bad = WatchRequest {
            entries: vec![service_entry()],
            resume_from: Some(Version { index: 0 }),
            include_old_object: false,
        };
        match w.watch(bad).await {
            Err(s) => assert_eq!(s.code(), Code::OutOfRange, "{s:?}"),
            Ok(r) => {
                // Resuming from 0 replays the whole log when the log still starts at 1.
                let mut s = r.into_inner();
                assert_eq!(s.next().await.unwrap().unwrap(), WatchMessage::default());
                let all = read_until(&mut s, removed_at).await;
                assert!(all.iter().any(|e| e.1 == created_at), "{all:?}");
            }
        }
    });
}

/// Manager `i` on 127.0.0.`i` serving the SwarmKit API too; with `join`, it joins that manager's cluster.
fn manager_with_socket(i: u8, join: Option<&DaemonProcess>) -> Node {
    let dir = tempfile::Builder::new().prefix("swk-").tempdir_in(shoal_testkit::scratch_dir()).expect("tempdir");
    let socket = dir.path().join("swarmd.sock");
    let mut extra_args = vec!["--listen-swarmkit-api".to_string(), socket.display().to_string()];
    if let Some(j) = join {
        extra_args.extend([
            "--join-addr".into(),
            j.remote_addr(),
            "--join-token".into(),
            shoal_testkit::managers::join_token(j, "Manager"),
        ]);
    }
    let d = DaemonProcess::start_with(
        &shoal_bin(),
        DaemonOptions {
            listen_ip: Some(format!("127.0.0.{i}")),
            hostname: Some(format!("manager-{i}")),
            extra_args,
            ..Default::default()
        },
    );
    Node { d, socket, _dir: dir }
}

#[test]
fn a_follower_serves_reads_after_the_barrier_forwards_writes_and_fails_them_without_quorum() {
    let mut leader = manager_with_socket(61, None);
    let follower = manager_with_socket(62, Some(&leader.d));
    let rt = runtime();
    rt.block_on(async {
        // The follower's own store feeds its watch.
        let mut w = WatchClient::new(shoal_testkit::swarmkit::channel(&follower.socket).await.unwrap());
        let req = WatchRequest { entries: vec![service_entry()], resume_from: None, include_old_object: false };
        let mut stream = w.watch(req).await.unwrap().into_inner();
        stream.next().await.unwrap().unwrap();

        let mut c = control(&follower.socket).await;
        let svc = c
            .create_service(CreateServiceRequest { spec: Some(service_spec("fwd", 1)) })
            .await
            .unwrap()
            .into_inner()
            .service
            .unwrap();
        // Read your writes on the follower.
        let got =
            c.get_service(GetServiceRequest { service_id: svc.id.clone(), insert_defaults: false }).await.unwrap();
        assert_eq!(got.into_inner().service.unwrap().meta, svc.meta);
        let seen = read_until(&mut stream, version(&svc.meta).unwrap().index).await;
        assert!(
            seen.contains(&(
                WatchActionKind::WatchActionCreate as i32,
                version(&svc.meta).unwrap().index,
                "fwd".into()
            )),
            "{seen:?}"
        );
        // The leader has it too.
        let mut lc = control(&leader.socket).await;
        let listed = lc.list_services(ListServicesRequest::default()).await.unwrap().into_inner().services;
        assert!(listed.iter().any(|s| s.id == svc.id));
    });
    // Without the other manager there is no quorum: reads and writes fail within a bounded time, UNAVAILABLE.
    assert!(leader.d.stop());
    rt.block_on(async {
        let mut c = control(&follower.socket).await;
        let started = std::time::Instant::now();
        let read = c.list_services(ListServicesRequest::default()).await.unwrap_err();
        assert_eq!(read.code(), Code::Unavailable, "{read:?}");
        let write = c.create_service(CreateServiceRequest { spec: Some(service_spec("lost", 1)) }).await.unwrap_err();
        assert_eq!(write.code(), Code::Unavailable, "{write:?}");
        assert!(started.elapsed() < Duration::from_secs(30), "failed in {:?}", started.elapsed());
    });
}

#[test]
fn service_logs_come_through_the_socket_as_swarmctl_reads_them() {
    let n = start();
    runtime().block_on(async {
        let mut c = control(&n.socket).await;
        let mut spec = service_spec("talker", 1);
        if let Some(task_spec::Runtime::Container(ct)) = spec.task.as_mut().and_then(|t| t.runtime.as_mut()) {
            ct.command = vec!["sh".into()];
            ct.args = vec!["-c".into(), "echo hello from talker; sleep 3600".into()];
        }
        let svc =
            c.create_service(CreateServiceRequest { spec: Some(spec) }).await.unwrap().into_inner().service.unwrap();
        wait_for_running(&mut c, &svc.id, 1).await;
        let mut logs =
            shoal_api::logs_client::LogsClient::new(shoal_testkit::swarmkit::channel(&n.socket).await.unwrap());
        let req = SubscribeLogsRequest {
            selector: Some(LogSelector { service_ids: vec![svc.id.clone()], ..Default::default() }),
            options: Some(LogSubscriptionOptions { follow: true, ..Default::default() }),
        };
        let mut stream = logs.subscribe_logs(req).await.unwrap().into_inner();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let msg = tokio::time::timeout_at(deadline, stream.next())
                .await
                .expect("a log line within 30 s")
                .unwrap()
                .unwrap();
            if msg.messages.iter().any(|m| String::from_utf8_lossy(&m.data).contains("hello from talker")) {
                break;
            }
        }
    });
}

/// The stock `swarmctl -s /abs/path/swarmd.sock` (grpc-go 1.53) sends the path as the TLS server name and as
/// every request's `:authority`; neither is a DNS name or an authority. Such a client is served (OpenSSL
/// takes the name, the authority is replaced; `socket_path_names`): list, create, update, remove and a
/// Watch stream through it, while a client that names the server by a DNS name still gets rustls.
#[test]
fn a_client_naming_the_socket_by_its_absolute_path_as_grpc_go_does_is_served() {
    let n = start();
    assert!(n.socket.is_absolute() && n.socket.to_string_lossy().contains('/'));
    runtime().block_on(async {
        let channel =
            shoal_testkit::swarmkit::channel_as_grpc_go_with_a_path(&n.socket).await.expect("connect by path");
        let mut c = ControlClient::new(channel.clone());
        let nodes = c.list_nodes(ListNodesRequest::default()).await.expect("ListNodes by path").into_inner().nodes;
        assert_eq!(nodes.len(), 1);
        let mut watch = WatchClient::new(channel)
            .watch(WatchRequest { entries: vec![service_entry()], ..Default::default() })
            .await
            .expect("Watch by path")
            .into_inner();
        assert!(watch.next().await.unwrap().unwrap().events.is_empty(), "the first message says the watch is set up");
        let created = c
            .create_service(CreateServiceRequest { spec: Some(service_spec("bypath", 1)) })
            .await
            .expect("CreateService by path")
            .into_inner()
            .service
            .unwrap();
        let mut spec = created.spec.clone().unwrap();
        spec.mode = Some(service_spec::Mode::Replicated(ReplicatedService { replicas: 2 }));
        let updated = c
            .update_service(UpdateServiceRequest {
                service_id: created.id.clone(),
                service_version: version(&created.meta),
                spec: Some(spec),
                rollback: 0,
            })
            .await
            .expect("UpdateService by path")
            .into_inner()
            .service
            .unwrap();
        c.remove_service(RemoveServiceRequest { service_id: created.id.clone() }).await.expect("RemoveService by path");
        let mut seen = read_until(&mut watch, version(&updated.meta).unwrap().index).await;
        while !seen.iter().any(|(a, _, _)| *a == 4) {
            let last = seen.last().map_or(0, |(_, v, _)| *v);
            seen.extend(read_until(&mut watch, last + 1).await);
        }
        let mut actions: Vec<i32> = seen.iter().filter(|(_, _, name)| name == "bypath").map(|(a, _, _)| *a).collect();
        actions.dedup();
        assert_eq!(actions, vec![1, 2, 4], "create, update, remove through the path-named connection: {seen:?}");
        // The usual client (a DNS name) on the same socket, at the same time.
        let mut plain = control(&n.socket).await;
        assert_eq!(plain.list_nodes(ListNodesRequest::default()).await.unwrap().into_inner().nodes.len(), 1);
    });
}
