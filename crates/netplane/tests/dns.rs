//! The resolver driven the way a task uses it: DNS queries over UDP and TCP to 127.0.0.11:53 from inside task
//! network namespaces (needs root), with a fake upstream resolver in the test's own namespace for the names
//! Shoal does not own. Namespaces are drop guards named `shl-t<pid>-dns-...`.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{RData, Record, RecordType};
use shoal_netplane::{parse_response, query_bytes, RESOLVER_ADDR};
use shoal_netplane::{Attachment, NetworkState, NodeNetState, Resolver, ServiceVip, TaskState};

const UPSTREAM_ANSWER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 99);

struct Netns {
    name: String,
}

impl Netns {
    fn new(what: &str) -> Netns {
        let ns = Netns { name: format!("shl-t{}-dns-{what}", std::process::id()) };
        let _ = Command::new("ip").args(["netns", "del", &ns.name]).output();
        assert!(Command::new("ip").args(["netns", "add", &ns.name]).status().unwrap().success());
        assert!(Command::new("ip").args(["-n", &ns.name, "link", "set", "lo", "up"]).status().unwrap().success());
        ns
    }

    fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.name))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

/// Asks the resolver from inside `netns`, over UDP or TCP: (code, truncated, addresses), or the socket error.
fn ask(
    netns: PathBuf,
    name: &str,
    rtype: RecordType,
    tcp: bool,
) -> Result<(ResponseCode, bool, Vec<Ipv4Addr>), String> {
    let q = query_bytes(0x5151, name, rtype);
    std::thread::spawn(move || {
        let file = std::fs::File::open(&netns).unwrap();
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let timeout = Some(Duration::from_secs(3));
        let bytes = if tcp {
            let mut c = TcpStream::connect_timeout(&SocketAddr::V4(RESOLVER_ADDR), Duration::from_secs(3))
                .map_err(|e| e.to_string())?;
            c.set_read_timeout(timeout).unwrap();
            c.write_all(&u16::try_from(q.len()).unwrap().to_be_bytes()).unwrap();
            c.write_all(&q).unwrap();
            let mut len = [0u8; 2];
            c.read_exact(&mut len).map_err(|e| e.to_string())?;
            let mut b = vec![0u8; usize::from(u16::from_be_bytes(len))];
            c.read_exact(&mut b).map_err(|e| e.to_string())?;
            b
        } else {
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            s.set_read_timeout(timeout).unwrap();
            s.send_to(&q, RESOLVER_ADDR).map_err(|e| e.to_string())?;
            let mut b = vec![0u8; 4096];
            let n = s.recv(&mut b).map_err(|e| e.to_string())?;
            b.truncate(n);
            b
        };
        parse_response(&bytes).ok_or_else(|| "not a DNS response".to_string())
    })
    .join()
    .unwrap()
}

/// A fake upstream on 127.0.0.1 answering every A query with `UPSTREAM_ANSWER`.
fn upstream() -> SocketAddr {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = s.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut b = vec![0u8; 4096];
        while let Ok((n, from)) = s.recv_from(&mut b) {
            let Ok(q) = Message::from_vec(&b[..n]) else {
                continue;
            };
            let mut m = Message::response(q.metadata.id, q.metadata.op_code);
            m.add_queries(q.queries.iter().cloned());
            if let Some(query) = q.queries.first() {
                m.add_answer(Record::from_rdata(query.name().clone(), 60, RData::A(A(UPSTREAM_ANSWER))));
            }
            let _ = s.send_to(&m.to_vec().unwrap(), from);
        }
    });
    addr
}

fn net(id: &str, third: u8, internal: bool, services: Vec<ServiceVip>) -> NetworkState {
    NetworkState {
        id: id.into(),
        name: id.into(),
        vni: 7000 + u32::from(third),
        subnet: format!("10.{third}.0.0/24").parse().unwrap(),
        gateway: Ipv4Addr::new(10, third, 0, 1),
        more_subnets: Vec::new(),
        internal,
        encrypted: false,
        peers: Vec::new(),
        services,
        ipv6: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_resolve_their_services_by_name_and_the_rest_upstream() {
    let (client, lonely) = (Netns::new("client"), Netns::new("lonely"));
    let a = |i: u8| Ipv4Addr::new(10, 50, 0, i);
    let web = |backends: Vec<Ipv4Addr>| ServiceVip {
        service_id: "web-id".into(),
        name: "web".into(),
        aliases: vec!["www".into()],
        vip: Some(a(200)),
        backends,
        backends6: Vec::new(),
    };
    let db = ServiceVip {
        service_id: "db-id".into(),
        name: "db".into(),
        aliases: vec![],
        vip: None,
        backends: vec![a(5)],
        backends6: Vec::new(),
    };
    let secret = ServiceVip {
        service_id: "s-id".into(),
        name: "secret".into(),
        aliases: vec![],
        vip: Some(Ipv4Addr::new(10, 51, 0, 200)),
        backends: vec![],
        backends6: Vec::new(),
    };
    let mut s = NodeNetState::new(Ipv4Addr::new(192, 0, 2, 1));
    s.networks =
        vec![net("appnet", 50, false, vec![web(vec![a(3), a(4)]), db]), net("private", 51, true, vec![secret])];
    s.tasks = vec![
        TaskState {
            task_id: "client".into(),
            netns: client.path(),
            attachments: vec![Attachment { network_id: "appnet".into(), address: a(2), ifname: None, address6: None }],
            joined: false,
        },
        TaskState {
            task_id: "lonely".into(),
            netns: lonely.path(),
            attachments: vec![Attachment {
                network_id: "private".into(),
                address: Ipv4Addr::new(10, 51, 0, 2),
                ifname: None,
                address6: None,
            }],
            joined: false,
        },
    ];
    let resolver = Resolver::new(vec![upstream()]);
    resolver.update(&s).await.expect("resolver serves the tasks");

    let ask_async = |ns: &Netns, name: &'static str, rtype: RecordType, tcp: bool| {
        let p = ns.path();
        tokio::task::spawn_blocking(move || ask(p, name, rtype, tcp))
    };
    let ok = |addrs: Vec<Ipv4Addr>| Ok((ResponseCode::NoError, false, addrs));
    for (name, want) in [
        ("web", vec![a(200)]),
        ("web.appnet", vec![a(200)]),
        ("www", vec![a(200)]),
        ("tasks.web", vec![a(3), a(4)]),
        ("tasks.web.appnet", vec![a(3), a(4)]),
        ("db", vec![a(5)]),
        // Not on the client's networks, and not Shoal's: the upstream answers.
        ("secret", vec![UPSTREAM_ANSWER]),
        ("example.org", vec![UPSTREAM_ANSWER]),
    ] {
        assert_eq!(ask_async(&client, name, RecordType::A, false).await.unwrap(), ok(want), "{name}");
    }
    assert_eq!(ask_async(&client, "tasks.web", RecordType::A, true).await.unwrap(), ok(vec![a(3), a(4)]), "TCP");
    assert_eq!(ask_async(&client, "web", RecordType::AAAA, false).await.unwrap(), ok(vec![]));

    // A task only on an internal network: its own services answer, nothing is forwarded.
    assert_eq!(
        ask_async(&lonely, "secret", RecordType::A, false).await.unwrap(),
        ok(vec![Ipv4Addr::new(10, 51, 0, 200)])
    );
    let refused = ask_async(&lonely, "example.org", RecordType::A, false).await.unwrap();
    assert_eq!(refused.map(|r| r.0), Ok(ResponseCode::Refused));

    // Backends change: the answers follow at once.
    s.networks[0].services[0] = web(vec![a(4)]);
    resolver.update(&s).await.expect("update");
    assert_eq!(ask_async(&client, "tasks.web", RecordType::A, false).await.unwrap(), ok(vec![a(4)]));

    // A task that leaves the state is no longer served.
    s.tasks.retain(|t| t.task_id != "client");
    resolver.update(&s).await.expect("client removed");
    assert!(ask_async(&client, "web", RecordType::A, true).await.unwrap().is_err(), "a removed task still has DNS");
    drop(resolver);
}
