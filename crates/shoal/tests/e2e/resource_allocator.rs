//! SwarmKit's ResourceAllocator on the remote port, called over mutual TLS with a node's own certificate as
//! a Docker Engine in the swarm calls it for `docker run --network <attachable overlay>`: a worker attaches a
//! container to an attachable network (a network attachment task on its node, with an address the allocator
//! gave), what it may not do is refused by name, and it detaches again (the task is gone). The manager
//! cannot detach the worker's attachment.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use shoal_api::resource_allocator_client::ResourceAllocatorClient;
use shoal_api::{AttachNetworkRequest, DetachNetworkRequest, NetworkAttachmentConfig};
use tonic::transport::Channel;

fn node_tls(state_dir: &Path) -> shoal_node::NodeTls {
    shoal_node::load_certs(state_dir).unwrap().expect("certificates in the state dir").tls().unwrap()
}

fn create_network(d: &DaemonProcess, body: Value) -> String {
    let r =
        shoal_testkit::http::request(d.socket(), "POST", "/v1.47/networks/create", Some(&body.to_string())).unwrap();
    assert_eq!(r.status, 201, "{}", r.body);
    r.body["Id"].as_str().unwrap().to_string()
}

fn attach(target: &str, container: &str) -> AttachNetworkRequest {
    AttachNetworkRequest {
        config: Some(NetworkAttachmentConfig {
            target: target.into(),
            aliases: vec!["db".into()],
            ..Default::default()
        }),
        container_id: container.into(),
    }
}

async fn client(tls: &shoal_node::NodeTls, addr: &str) -> ResourceAllocatorClient<Channel> {
    ResourceAllocatorClient::new(tls.endpoint(addr).unwrap().connect().await.unwrap())
}

#[test]
fn a_worker_attaches_a_container_to_an_attachable_network_and_detaches_it() {
    let m = node_at(197, "manager-197", None);
    let w = node_at(198, "worker-198", Some((&m, "Worker")));
    let worker_id = wait_until("the worker's node", Duration::from_secs(30), || {
        let nodes = m.get("/v1.47/nodes");
        let nodes = nodes.as_array().cloned().unwrap_or_default();
        nodes
            .iter()
            .find(|n| n["Description"]["Hostname"] == "worker-198")
            .and_then(|n| n["ID"].as_str().map(str::to_string))
            .ok_or_else(|| format!("{nodes:?}"))
    });
    let net = create_network(
        &m,
        json!({"Name": "attach", "Driver": "overlay", "Attachable": true,
            "IPAM": {"Config": [{"Subnet": "10.77.0.0/24"}]}}),
    );
    create_network(&m, json!({"Name": "closed", "Driver": "overlay"}));
    let addr = m.remote_addr();
    let (w_tls, m_tls) = (node_tls(w.state_dir()), node_tls(m.state_dir()));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();

    let id = rt.block_on(async {
        let mut c = client(&w_tls, &addr).await;
        let id = c.attach_network(attach("attach", "c0ffee")).await.expect("attach").into_inner().attachment_id;
        // What cannot be honoured is refused, naming it.
        let refused = |r: Result<tonic::Response<shoal_api::AttachNetworkResponse>, tonic::Status>| r.unwrap_err();
        let e = refused(c.attach_network(attach("closed", "c1")).await);
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        assert!(e.message().contains("not manually attachable"), "{}", e.message());
        let e = refused(c.attach_network(attach("nowhere", "c1")).await);
        assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
        let mut with_ip = attach("attach", "c1");
        with_ip.config.as_mut().unwrap().addresses = vec!["10.77.0.9".into()];
        let e = refused(c.attach_network(with_ip).await);
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains("10.77.0.9"), "{}", e.message());
        let e = refused(c.attach_network(attach("attach", "")).await);
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        id
    });

    // The attachment task: on the worker's node, an address in the network's subnet from the allocator,
    // then waiting for a node with the overlay driver (Shoal's agents report none yet).
    let task = wait_until("the attachment's address", Duration::from_secs(30), || {
        let t = m.get(&format!("/v1.47/tasks/{id}"));
        let addr = t["NetworksAttachments"][0]["Addresses"][0].as_str().unwrap_or_default().to_string();
        if addr.starts_with("10.77.0.") && t["Status"]["State"] == "pending" {
            Ok(t)
        } else {
            Err(t.to_string())
        }
    });
    assert_eq!(task["NodeID"], worker_id.as_str(), "{task}");
    assert_eq!(task["ServiceID"], "", "{task}");
    assert_eq!(task["Spec"]["NetworkAttachmentSpec"]["ContainerID"], "c0ffee", "{task}");
    assert_eq!(task["NetworksAttachments"][0]["Network"]["ID"], net.as_str(), "{task}");
    assert_eq!(task["Spec"]["Networks"], json!([{"Target": net, "Aliases": ["db"]}]), "{task}");

    rt.block_on(async {
        // Another node (the manager) may not detach it; the worker may, once.
        let e = client(&m_tls, &addr)
            .await
            .detach_network(DetachNetworkRequest { attachment_id: id.clone() })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        let mut c = client(&w_tls, &addr).await;
        c.detach_network(DetachNetworkRequest { attachment_id: id.clone() }).await.expect("detach");
        let e = c.detach_network(DetachNetworkRequest { attachment_id: id.clone() }).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    });
    let r = shoal_testkit::http::request(m.socket(), "GET", &format!("/v1.47/tasks/{id}"), None).unwrap();
    assert_eq!(r.status, 404, "the attachment task is gone: {}", r.body);
}
