//! A removed node's network attachments are released, as SwarmKit's RemoveNode does: a worker fills most of
//! a small attachable network with attachments (over the ResourceAllocator, with its own certificate, as a
//! Docker Engine in the swarm does for `docker run --network`), is stopped and removed with `docker node rm
//! --force`; its attachment tasks are gone from the store and their addresses go to the next node's
//! attachments.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use shoal_api::resource_allocator_client::ResourceAllocatorClient;
use shoal_api::{AttachNetworkRequest, NetworkAttachmentConfig};
use shoal_testkit::http::request;

fn node_tls(state_dir: &Path) -> shoal_node::NodeTls {
    shoal_node::load_certs(state_dir).unwrap().expect("certificates in the state dir").tls().unwrap()
}

/// Attaches `n` containers of the node holding `tls` to network `target`; returns the attachment IDs.
fn attach_all(tls: &shoal_node::NodeTls, addr: &str, target: &str, prefix: &str, n: usize) -> Vec<String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut c = ResourceAllocatorClient::new(tls.endpoint(addr).unwrap().connect().await.unwrap());
        let mut ids = Vec::new();
        for i in 0..n {
            let req = AttachNetworkRequest {
                config: Some(NetworkAttachmentConfig { target: target.into(), ..Default::default() }),
                container_id: format!("{prefix}{i}"),
            };
            ids.push(c.attach_network(req).await.expect("attach").into_inner().attachment_id);
        }
        ids
    })
}

/// The address of attachment task `id`, once the allocator gave it one.
fn address_of(m: &DaemonProcess, id: &str) -> Result<String, String> {
    let t = m.get(&format!("/v1.47/tasks/{id}"));
    match t["NetworksAttachments"][0]["Addresses"][0].as_str() {
        Some(a) if !a.is_empty() => Ok(a.to_string()),
        _ => Err(t.to_string()),
    }
}

fn attachment_tasks_on(m: &DaemonProcess, node: &str) -> Vec<Value> {
    let tasks = m.get("/v1.47/tasks");
    tasks
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["NodeID"] == node && !t["Spec"]["NetworkAttachmentSpec"].is_null())
        .cloned()
        .collect()
}

#[test]
fn docker_node_rm_releases_the_removed_nodes_attachment_tasks_and_their_addresses() {
    let m = node_at(161, "manager-161", None);
    let mut w = node_at(162, "worker-162", Some((&m, "Worker")));
    let worker_id = w.get("/v1.47/info")["Swarm"]["NodeID"].as_str().unwrap().to_string();
    // A /28: 13 addresses for attachments (network, gateway and broadcast aside).
    let body = json!({"Name": "small", "Driver": "overlay", "Attachable": true,
        "IPAM": {"Config": [{"Subnet": "10.161.0.0/28"}]}});
    let r = request(m.socket(), "POST", "/v1.47/networks/create", Some(&body.to_string())).unwrap();
    assert_eq!(r.status, 201, "{}", r.body);
    let addr = m.remote_addr();

    let w_tls = node_tls(w.state_dir());
    let ids = attach_all(&w_tls, &addr, "small", "worker-c", 10);
    for id in &ids {
        wait_until("the worker's attachment's address", Duration::from_secs(30), || address_of(&m, id));
    }
    assert_eq!(attachment_tasks_on(&m, &worker_id).len(), 10);

    // The worker goes away and is removed.
    assert!(w.stop());
    let r = request(m.socket(), "DELETE", &format!("/v1.47/nodes/{worker_id}?force=true"), None).unwrap();
    assert!((200..300).contains(&r.status), "{} {}", r.status, r.body);
    for id in &ids {
        let r = request(m.socket(), "GET", &format!("/v1.47/tasks/{id}"), None).unwrap();
        assert_eq!(r.status, 404, "attachment task {id} of the removed node: {}", r.body);
    }
    assert!(attachment_tasks_on(&m, &worker_id).is_empty());

    // Their addresses are free again: ten more attachments (the manager's own) all get one, which the 13
    // addresses of the subnet allow only if the worker's ten were released.
    let m_tls = node_tls(m.state_dir());
    let m_id = m.get("/v1.47/info")["Swarm"]["NodeID"].as_str().unwrap().to_string();
    let again = attach_all(&m_tls, &addr, "small", "manager-c", 10);
    let mut addresses: Vec<String> = again
        .iter()
        .map(|id| wait_until("the manager's attachment's address", Duration::from_secs(30), || address_of(&m, id)))
        .collect();
    addresses.sort();
    addresses.dedup();
    assert_eq!(addresses.len(), 10, "{addresses:?}");
    assert_eq!(attachment_tasks_on(&m, &m_id).len(), 10);
}
