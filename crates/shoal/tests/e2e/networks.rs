//! Networks as users drive them, against `shoal daemon`s: the stock docker CLI (`docker network
//! create/ls/inspect/rm`, services with `--network` and `--publish`, `service update --network-add/-rm`), the
//! Python Docker SDK, and three managers whose leader is killed while services are created on one network,
//! after which every address read from every manager is held once.
//!
//! Shoal agents do not report the overlay plugin (the data plane is not built yet), so tasks attached to a
//! network stay pending with the scheduler's "missing plugin" explanation, after the allocator gave them their
//! addresses; a service without networks still runs.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use shoal_testkit::managers::{leader_seen_by, post_service, try_get};
use shoal_testkit::python;

const WAIT: Duration = Duration::from_secs(30);

fn text(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn fails_with(d: &DaemonProcess, args: &[&str], fragment: &str) -> String {
    let out = docker_cli::run(d.socket(), args);
    let t = text(&out);
    assert!(!out.status.success(), "expected `docker {}` to fail with {fragment:?}, got: {t}", args.join(" "));
    assert!(t.contains(fragment), "expected {fragment:?} in: {t}");
    t
}

fn inspect(d: &DaemonProcess, kind: &str, name: &str) -> Value {
    let out = docker(d, &[kind, "inspect", name]);
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{kind} inspect {name}: {e}: {out}"));
    v[0].clone()
}

/// True when `addr` (`10.0.1.3/24`) lies in `subnet` (`10.0.1.0/24`), for the /24s and /29s used here.
fn in_subnet(addr: &str, subnet: &str) -> bool {
    let ip: std::net::Ipv4Addr = addr.split('/').next().unwrap().parse().unwrap();
    let (net, len) = subnet.split_once('/').unwrap();
    let net: std::net::Ipv4Addr = net.parse().unwrap();
    let len: u32 = len.parse().unwrap();
    let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
    u32::from(ip) & mask == u32::from(net) & mask
}

/// The service's tasks once each meant to run has left NEW or says why it has not.
fn settled_tasks(d: &DaemonProcess, service: &str, n: usize) -> Vec<Value> {
    wait_until(&format!("{n} allocated or explained tasks of {service}"), WAIT, || {
        let tasks: Vec<Value> = tasks_of(d, service).into_iter().filter(|t| desired(t) == "running").collect();
        let settled =
            tasks.iter().filter(|t| state(t) != "new" || !t["Status"]["Err"].as_str().unwrap_or("").is_empty());
        if tasks.len() == n && settled.count() == n {
            Ok(tasks)
        } else {
            Err(format!(
                "{} tasks: {:?}",
                tasks.len(),
                tasks.iter().map(|t| (state(t).to_string(), t["Status"]["Err"].clone())).collect::<Vec<_>>()
            ))
        }
    })
}

#[test]
fn overlay_networks_services_and_published_ports_through_the_docker_cli() {
    if no_docker_cli() {
        return;
    }
    let d = daemon();
    let names = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["network", "ls", "--format", "{{.Name}} {{.Driver}} {{.Scope}}"];
        all.extend_from_slice(args);
        docker(&d, &all).lines().map(str::to_string).collect()
    };
    // The cluster starts with ingress (10.0.0.0/24, as Docker).
    assert_eq!(names(&[]), ["ingress overlay swarm"]);
    let ingress = inspect(&d, "network", "ingress");
    assert_eq!(ingress["Ingress"], true);
    assert_eq!(ingress["IPAM"]["Config"][0]["Subnet"], "10.0.0.0/24");

    let id = docker(&d, &["network", "create", "-d", "overlay", "--label", "team=a", "appnet"]).trim().to_string();
    assert_eq!(id.len(), 25, "{id}");
    let n = inspect(&d, "network", "appnet");
    assert_eq!(
        (n["Id"].as_str(), n["Scope"].as_str(), n["Driver"].as_str()),
        (Some(id.as_str()), Some("swarm"), Some("overlay"))
    );
    // The first free /24 of the default pool 10.0.0.0/8, its first address the gateway.
    let subnet = n["IPAM"]["Config"][0]["Subnet"].as_str().unwrap().to_string();
    assert_eq!((subnet.as_str(), n["IPAM"]["Config"][0]["Gateway"].as_str()), ("10.0.1.0/24", Some("10.0.1.1")));
    assert_eq!(inspect(&d, "network", &id[..6])["Name"], "appnet", "by ID prefix");
    let attach = docker(
        &d,
        &[
            "network",
            "create",
            "-d",
            "overlay",
            "--attachable",
            "--internal",
            "--subnet",
            "10.20.0.0/16",
            "--gateway",
            "10.20.0.254",
            "--ip-range",
            "10.20.5.0/24",
            "other",
        ],
    );
    assert!(!attach.trim().is_empty());
    let o = inspect(&d, "network", "other");
    assert_eq!((o["Attachable"].as_bool(), o["Internal"].as_bool()), (Some(true), Some(true)));
    assert_eq!(
        o["IPAM"]["Config"][0],
        json!({"Subnet": "10.20.0.0/16", "IPRange": "10.20.5.0/24", "Gateway": "10.20.0.254"})
    );
    assert_eq!(names(&["--filter", "label=team=a"]), ["appnet overlay swarm"]);
    assert_eq!(names(&["--filter", "name=oth"]), ["other overlay swarm"]);
    assert_eq!(names(&["--filter", "driver=bridge"]), Vec::<String>::new());

    // What Shoal cannot make, and overlaps, are refused by name; nothing is created.
    fails_with(&d, &["network", "create", "local"], "Driver \"bridge\" is not supported");
    fails_with(&d, &["network", "create", "-d", "macvlan", "mv"], "Driver \"macvlan\" is not supported");
    fails_with(
        &d,
        &["network", "create", "-d", "overlay", "--subnet", "10.0.0.0/16", "wide"],
        "overlaps subnet 10.0.0.0/24 of network ingress",
    );
    fails_with(&d, &["network", "create", "-d", "overlay", "--ipv6", "v6"], "IPv6");
    fails_with(&d, &["network", "create", "-d", "overlay", "-o", "mtu=1400", "mtu"], "\"mtu\" is not supported yet");
    // An encrypted network is kept with its option (every node refuses its tasks with the data plane's
    // reason: `the_agent_refuses_tasks_on_encrypted_networks_with_the_data_planes_reason`).
    docker(&d, &["network", "create", "-d", "overlay", "--opt", "encrypted", "enc"]);
    let enc = inspect(&d, "network", "enc");
    assert_eq!(enc["Options"]["encrypted"], "", "{enc}");
    docker(&d, &["network", "rm", "enc"]);
    fails_with(&d, &["network", "create", "-d", "overlay", "appnet"], "already exists");
    assert_eq!(names(&[]).len(), 3);

    // Two services on it: ingress-published 8080 and a host-mode 9000.
    docker(
        &d,
        &[
            "service",
            "create",
            "-d",
            "--name",
            "web",
            "--network",
            "name=appnet,alias=www",
            "--publish",
            "8080:80",
            "busybox",
            "sleep",
            "3600",
        ],
    );
    docker(
        &d,
        &[
            "service",
            "create",
            "-d",
            "--name",
            "hostp",
            "--network",
            "appnet",
            "--publish",
            "mode=host,target=9000,published=9000",
            "busybox",
            "sleep",
            "3600",
        ],
    );
    let web_tasks = settled_tasks(&d, "web", 1);
    let web = inspect(&d, "service", "web");
    let ep = &web["Endpoint"];
    assert_eq!(
        ep["Ports"],
        json!([{"Protocol": "tcp", "TargetPort": 80, "PublishedPort": 8080, "PublishMode": "ingress"}]),
        "{ep}"
    );
    let vips: Vec<(String, String)> = ep["VirtualIPs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["NetworkID"].as_str().unwrap().to_string(), v["Addr"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(vips.len(), 2, "a VIP on ingress and on appnet: {ep}");
    let ingress_id = ingress["Id"].as_str().unwrap();
    for (net, addr) in &vips {
        let sub = if net == &id {
            subnet.as_str()
        } else {
            assert_eq!(net, ingress_id);
            "10.0.0.0/24"
        };
        assert!(in_subnet(addr, sub), "{addr} not in {sub}");
    }
    assert_eq!(web["Spec"]["TaskTemplate"]["Networks"], json!([{"Target": id, "Aliases": ["www"]}]));
    // The task has an address on both networks, and waits for a node with the overlay driver.
    let t = &web_tasks[0];
    let atts = t["NetworksAttachments"].as_array().unwrap();
    let mut on: Vec<&str> = atts.iter().map(|a| a["Network"]["Spec"]["Name"].as_str().unwrap()).collect();
    on.sort();
    assert_eq!(on, ["appnet", "ingress"], "{t}");
    for a in atts {
        let sub = a["Network"]["IPAMOptions"]["Configs"][0]["Subnet"].as_str().unwrap();
        assert!(in_subnet(a["Addresses"][0].as_str().unwrap(), sub), "{a}");
    }
    wait_until("the web task pending for the overlay plugin", WAIT, || {
        let t = tasks_of(&d, "web").pop().unwrap_or_default();
        let err = t["Status"]["Err"].as_str().unwrap_or("").to_string();
        if state(&t) == "pending" && err.contains("missing plugin on 1 node") {
            Ok(())
        } else {
            Err(format!("{} {err}", state(&t)))
        }
    });
    let hostp = settled_tasks(&d, "hostp", 1);
    let hep = &inspect(&d, "service", "hostp")["Endpoint"];
    assert_eq!(
        hep["Ports"],
        json!([{"Protocol": "tcp", "TargetPort": 9000, "PublishedPort": 9000, "PublishMode": "host"}]),
        "{hep}"
    );
    assert_eq!(hep["VirtualIPs"].as_array().map(Vec::len), Some(1), "only appnet: host ports need no ingress");
    assert_eq!(hostp[0]["NetworksAttachments"].as_array().map(Vec::len), Some(1));
    // Every address held once.
    let mut all: Vec<String> = vips.iter().map(|(_, a)| a.clone()).collect();
    all.extend(hep["VirtualIPs"].as_array().unwrap().iter().map(|v| v["Addr"].as_str().unwrap().to_string()));
    for t in web_tasks.iter().chain(&hostp) {
        for a in t["NetworksAttachments"].as_array().unwrap() {
            all.push(a["Addresses"][0].as_str().unwrap().to_string());
        }
    }
    assert_eq!(all.iter().collect::<BTreeSet<_>>().len(), all.len(), "{all:?}");

    // A second service asking for 8080: refused, naming the holder.
    fails_with(
        &d,
        &["service", "create", "-d", "--name", "web2", "--publish", "8080:80", "busybox", "sleep", "1"],
        "port '8080' is already in use by service 'web'",
    );
    // A network in use, and ingress while a service publishes through it, stay.
    fails_with(&d, &["network", "rm", "appnet"], "network appnet is in use by service hostp, web");
    // (The CLI asks before removing the routing mesh's network.)
    let out = docker_cli::run_with_stdin(d.socket(), &["network", "rm", "ingress"], "y\n");
    assert!(!out.status.success() && text(&out).contains("network ingress is in use by service web"), "{}", text(&out));
    fails_with(
        &d,
        &["service", "create", "-d", "--name", "x", "--network", "ingress", "busybox"],
        "cannot be explicitly attached to the ingress network",
    );
    fails_with(&d, &["service", "create", "-d", "--name", "x", "--network", "nope", "busybox"], "nope");
    // Driver options of an attachment: only the interface name an overlay endpoint reads, and a valid one.
    for (opt, fragment) in [
        ("foo=bar", r#""foo" is not an option an overlay endpoint reads"#),
        ("com.docker.network.endpoint.ifname=muchtoolongname0", "must be 1 to 15 letters"),
    ] {
        let net = format!("name=appnet,driver-opt={opt}");
        fails_with(&d, &["service", "create", "-d", "--name", "x", "--network", &net, "busybox"], fragment);
    }

    // A /29 has 5 host addresses beside the gateway: one VIP and four tasks; the others say why they wait.
    docker(&d, &["network", "create", "-d", "overlay", "--subnet", "10.9.9.0/29", "small"]);
    docker(
        &d,
        &[
            "service",
            "create",
            "-d",
            "--name",
            "crowd",
            "--network",
            "small",
            "--replicas",
            "7",
            "busybox",
            "sleep",
            "3600",
        ],
    );
    let crowd = settled_tasks(&d, "crowd", 7);
    let waiting: Vec<&Value> = crowd.iter().filter(|t| state(t) == "new").collect();
    assert_eq!(waiting.len(), 3, "{crowd:?}");
    for t in &waiting {
        assert_eq!(t["Status"]["Err"], "no IP address left in network small");
    }
    let ps = docker(&d, &["service", "ps", "--no-trunc", "--format", "{{.CurrentState}} {{.Error}}", "crowd"]);
    assert_eq!(ps.matches("no IP address left in network small").count(), 3, "{ps}");

    // A service without networks runs; --network-add rolls it onto appnet, --network-rm back.
    docker(&d, &["service", "create", "-d", "--name", "roll", "busybox", "sleep", "3273"]);
    wait_running(&d, "roll", 1, &["sleep", "3273"], WAIT);
    docker(&d, &["service", "update", "-d", "--network-add", "appnet", "roll"]);
    wait_until("roll's new task attached to appnet", WAIT, || {
        let ts = tasks_of(&d, "roll");
        let new: Vec<&Value> = ts.iter().filter(|t| desired(t) == "running").collect();
        match new.as_slice() {
            [t] if t["NetworksAttachments"][0]["Network"]["ID"] == json!(id) && state(t) == "pending" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    docker(&d, &["service", "update", "-d", "--network-rm", "appnet", "roll"]);
    wait_running(&d, "roll", 1, &["sleep", "3273"], WAIT);

    // Host-mode ports without networks: the process executor runs a task publishing its own port, and
    // rejects a mapping it cannot make, naming the ports.
    docker(
        &d,
        &[
            "service",
            "create",
            "-d",
            "--name",
            "hp",
            "--publish",
            "mode=host,target=9100,published=9100",
            "busybox",
            "sleep",
            "3274",
        ],
    );
    wait_running(&d, "hp", 1, &["sleep", "3274"], WAIT);
    docker(
        &d,
        &[
            "service",
            "create",
            "-d",
            "--name",
            "hmap",
            "--publish",
            "mode=host,target=9200,published=9201",
            "busybox",
            "sleep",
            "3275",
        ],
    );
    wait_until("hmap's task rejected, naming the ports", WAIT, || {
        let ts = tasks_of(&d, "hmap");
        ts.iter()
            .find(|t| {
                state(t) == "rejected"
                    && t["Status"]["Err"].as_str().unwrap_or("").contains("cannot map host port 9201 to port 9200")
            })
            .map(|_| ())
            .ok_or_else(|| format!("{ts:?}"))
    });

    // Once the services are gone (and their tasks), the networks go.
    for s in ["web", "hostp", "crowd", "roll", "hp", "hmap"] {
        docker(&d, &["service", "rm", s]);
    }
    for n in ["appnet", "small", "other"] {
        wait_until(&format!("{n} removable once its tasks are gone"), WAIT, || {
            let out = docker_cli::run(d.socket(), &["network", "rm", n]);
            if out.status.success() {
                Ok(())
            } else {
                Err(text(&out))
            }
        });
    }
    assert_eq!(names(&[]), ["ingress overlay swarm"]);
}

#[test]
fn auxiliary_addresses_and_ipam_options_are_shown_and_the_addresses_never_given_to_a_task() {
    if no_docker_cli() {
        return;
    }
    let d = daemon();
    // Bad ones change nothing: outside the subnet, the gateway, not an address.
    let create = |aux: &str| {
        ["network", "create", "-d", "overlay", "--subnet", "10.55.0.0/29", "--aux-address", aux, "aux"]
            .map(String::from)
    };
    let refusals = [
        ("r=10.56.0.2", "no matching subnet for aux-address"),
        ("r=10.55.0.7", "not a host address of subnet 10.55.0.0/29"),
        ("r=10.55.0.1", "is the network's gateway"),
    ];
    for (aux, why) in refusals {
        let args = create(aux);
        fails_with(&d, &args.iter().map(String::as_str).collect::<Vec<_>>(), why);
    }
    // What the CLI checks before sending, the API checks too.
    for (aux, why) in [("router", "is not an IP address"), ("10.56.0.2", "not a host address of subnet")] {
        let body = json!({"Name": "aux", "Driver": "overlay",
            "IPAM": {"Config": [{"Subnet": "10.55.0.0/29", "AuxiliaryAddresses": {"r": aux}}]}});
        let r = shoal_testkit::http::request(d.socket(), "POST", "/v1.47/networks/create", Some(&body.to_string()))
            .unwrap();
        assert_eq!(r.status, 400, "{:?}", r.body);
        assert!(r.body["message"].as_str().unwrap_or_default().contains(why), "{:?}", r.body);
    }
    // IPAM options past their bound change nothing either.
    let big = json!({"Name": "aux", "Driver": "overlay", "IPAM": {"Options": {"k": "v".repeat(70_000)}}});
    let r = shoal_testkit::http::request(d.socket(), "POST", "/v1.47/networks/create", Some(&big.to_string())).unwrap();
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert!(r.body["message"].as_str().unwrap_or_default().contains("IPAM options are 70001 bytes"), "{:?}", r.body);
    assert!(!docker(&d, &["network", "ls", "--format", "{{.Name}}"]).lines().any(|l| l == "aux"));

    // A /29: .1 the gateway, .2 and .4 reserved; three tasks (no VIP in dnsrr mode) get .3, .5 and .6.
    docker(
        &d,
        &[
            "network",
            "create",
            "-d",
            "overlay",
            "--subnet",
            "10.55.0.0/29",
            "--aux-address",
            "router=10.55.0.2",
            "--aux-address",
            "printer=10.55.0.4",
            "--ipam-opt",
            "com.docker.network.ipam.serial=true",
            "--ipam-opt",
            "site=lab",
            "aux",
        ],
    );
    let n = inspect(&d, "network", "aux");
    // IPAM options are kept and shown back, as Docker keeps them.
    assert_eq!(n["IPAM"]["Options"], json!({"com.docker.network.ipam.serial": "true", "site": "lab"}), "{n}");
    assert_eq!(
        n["IPAM"]["Config"][0]["AuxiliaryAddresses"],
        json!({"printer": "10.55.0.4", "router": "10.55.0.2"}),
        "{n}"
    );
    docker(
        &d,
        &[
            "service",
            "create",
            "-d",
            "--name",
            "auxsvc",
            "--replicas",
            "3",
            "--endpoint-mode",
            "dnsrr",
            "--network",
            "aux",
            "busybox",
            "sleep",
            "1000",
        ],
    );
    let tasks = settled_tasks(&d, "auxsvc", 3);
    let mut got: Vec<String> = tasks
        .iter()
        .flat_map(|t| t["NetworksAttachments"].as_array().cloned().unwrap_or_default())
        .map(|a| a["Addresses"][0].as_str().unwrap_or_default().to_string())
        .collect();
    got.sort();
    assert_eq!(got, ["10.55.0.3/29", "10.55.0.5/29", "10.55.0.6/29"], "{tasks:?}");
    let ipam = &tasks[0]["NetworksAttachments"][0]["Network"]["IPAMOptions"]["Driver"];
    assert_eq!(ipam["Options"]["site"], "lab", "{ipam}");
}

#[test]
fn the_python_docker_sdk_creates_lists_and_removes_networks() {
    let d = daemon();
    let socket = d.socket().to_string_lossy().into_owned();
    let script = r#"
import os, docker
c = docker.DockerClient(base_url="unix://" + os.environ["SHOAL_SOCKET"])
ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet="10.33.0.0/24")],
                               options={"site": "lab"})
n = c.networks.create("pynet", driver="overlay", attachable=True, ipam=ipam, labels={"k": "v"})
got = c.networks.get(n.id)
assert got.name == "pynet", got.attrs
assert got.attrs["IPAM"]["Config"][0]["Subnet"] == "10.33.0.0/24", got.attrs
assert got.attrs["IPAM"]["Options"] == {"site": "lab"}, got.attrs
assert got.attrs["Attachable"] is True
names = sorted(x.name for x in c.networks.list())
assert names == ["ingress", "pynet"], names
assert [x.name for x in c.networks.list(filters={"label": "k=v"})] == ["pynet"]
try:
    c.networks.create("br", driver="bridge")
    raise SystemExit("a bridge network was created")
except docker.errors.APIError as e:
    assert e.status_code == 400 and "bridge" in str(e), e
got.remove()
assert sorted(x.name for x in c.networks.list()) == ["ingress"]
print("OK")
"#;
    let out = python::run_script(script, &[("SHOAL_SOCKET", &socket)], Duration::from_secs(150));
    let t = text(&out);
    assert!(out.status.success() && t.contains("OK"), "the SDK script failed:\n{t}\ndaemon log:\n{}", d.log());
}

/// Every address the manager `d` holds: service VIPs and the addresses of tasks that have not stopped.
fn allocations(d: &DaemonProcess) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for s in try_get(d, "/v1.47/services")?.as_array().cloned().unwrap_or_default() {
        for v in s["Endpoint"]["VirtualIPs"].as_array().cloned().unwrap_or_default() {
            out.push(format!("{} {}", v["NetworkID"].as_str().unwrap_or(""), v["Addr"].as_str().unwrap_or("")));
        }
    }
    for t in try_get(d, "/v1.47/tasks")?.as_array().cloned().unwrap_or_default() {
        if matches!(state(&t), "complete" | "failed" | "shutdown" | "rejected" | "orphaned" | "remove") {
            continue;
        }
        for a in t["NetworksAttachments"].as_array().cloned().unwrap_or_default() {
            for addr in a["Addresses"].as_array().cloned().unwrap_or_default() {
                out.push(format!("{} {}", a["Network"]["ID"].as_str().unwrap_or(""), addr.as_str().unwrap_or("")));
            }
        }
    }
    out.sort();
    Ok(out)
}

#[test]
fn after_the_leader_dies_mid_creation_no_address_is_held_twice_on_any_manager() {
    let a = manager_at(21, None);
    let b = manager_at(22, Some(&a));
    let c = manager_at(23, Some(&a));
    let mut ds = [a, b, c];
    for d in &ds {
        wait_until("three managers, one leader", WAIT, || {
            let seen = shoal_testkit::managers::managers_seen_by(d)?;
            if seen.len() == 3 && seen.iter().filter(|(_, s)| s == "Leader").count() == 1 {
                Ok(())
            } else {
                Err(format!("{seen:?}"))
            }
        });
    }
    let r = shoal_testkit::http::request(
        ds[0].socket(),
        "POST",
        "/v1.47/networks/create",
        Some(&json!({"Name": "appnet", "Driver": "overlay"}).to_string()),
    )
    .unwrap();
    assert_eq!(r.status, 201, "{}", r.body);
    const SERVICES: usize = 50;
    let spec = |i: usize| {
        json!({
            "Name": format!("s{i}"),
            "TaskTemplate": {"ContainerSpec": {"Image": "busybox", "Args": ["sleep", "3600"]},
                "Networks": [{"Target": "appnet"}]},
            "Mode": {"Replicated": {"Replicas": 2}},
        })
    };
    // Create through a follower (its writes go to the leader), kill -9 the leader a third of the way in,
    // and go on through a survivor: each create is retried until it succeeds or the name is taken (an
    // earlier attempt whose answer was lost did create it).
    let leader = wait_until("the leader's host", WAIT, || leader_seen_by(&ds[1]));
    let li: usize = leader.trim_start_matches("manager-").parse::<usize>().expect("manager-N") - 21;
    let writer = (li + 1) % 3;
    for i in 0..SERVICES {
        if i == SERVICES / 3 {
            ds[li].kill9();
        }
        wait_until(&format!("service s{i} created"), WAIT, || match post_service(&ds[writer], &spec(i)) {
            Ok(_) => Ok(()),
            Err(e) if e.starts_with("409") => Ok(()),
            Err(e) => Err(e),
        });
    }
    ds[li].restart(&[]);
    // Every task allocated (or explained), on every manager, and every allocation unique.
    for d in &ds {
        let held =
            wait_until("every task of every service allocated, on every manager", Duration::from_secs(60), || {
                let held = allocations(d)?;
                // A VIP per service and an address per task on appnet.
                if held.len() == SERVICES * 3 {
                    Ok(held)
                } else {
                    Err(format!("{} allocations", held.len()))
                }
            });
        let unique: BTreeSet<&String> = held.iter().collect();
        assert_eq!(unique.len(), held.len(), "an address is held twice: {held:?}");
    }
    let first = allocations(&ds[0]).unwrap();
    for d in &ds[1..] {
        assert_eq!(allocations(d).unwrap(), first, "the managers agree");
    }
}

#[test]
fn the_shoal_cli_creates_lists_inspects_and_removes_networks() {
    let d = daemon();
    let run = |args: &[&str]| {
        let out = shoal_cli(d.socket(), args);
        (out.status.success(), text(&out))
    };
    let (ok, id) = run(&["network", "create", "--subnet", "10.44.0.0/24", "--label", "a=b", "cli-net"]);
    assert!(ok, "{id}");
    let (ok, ls) = run(&["network", "ls"]);
    assert!(ok && ls.contains("cli-net") && ls.contains("10.44.0.0/24") && ls.contains("ingress"), "{ls}");
    let (ok, js) = run(&["network", "inspect", "cli-net"]);
    let v: Value = serde_json::from_str(&js).unwrap_or_else(|e| panic!("{e}: {js}"));
    assert!(ok && v[0]["Id"] == json!(id.trim()) && v[0]["Labels"] == json!({"a": "b"}), "{js}");
    let (ok, e) = run(&["network", "create", "-d", "bridge", "b"]);
    assert!(!ok && e.contains("Driver \"bridge\" is not supported"), "{e}");
    let (ok, e) = run(&["network", "rm", "cli-net"]);
    assert!(ok, "{e}");
    let (ok, ls) = run(&["network", "ls"]);
    assert!(ok && !ls.contains("cli-net"), "{ls}");
}
