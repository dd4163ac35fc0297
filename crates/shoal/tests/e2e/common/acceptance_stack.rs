//! Issue 30's acceptance stack, shared by its one-node test in the machine's own namespace
//! (`host_data_plane.rs`) and its three-node test on a veth underlay (`stack_three_nodes.rs`): the compose file
//! (`web`, 2 replicas with a published port, on two overlay networks `front` and `back`; `client` on `front`;
//! `db` on `back`), the client task's script and the reading of what it printed, and the "outside world": a
//! namespace with an HTTP listener the tasks reach through a node's FORWARD chain, masqueraded. Only the
//! testkit, the docker CLI and iproute2; nothing here knows which executor or how many nodes.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use shoal_testkit::netns::Net;

use super::netcluster::SERVER;
use super::wait_until;

const WAIT: Duration = Duration::from_secs(90);

/// The port the outside listener answers on.
pub(crate) const OUTSIDE_PORT: u16 = 8099;

/// `get(host, port)`: one HTTP/1.0 GET of `/` over a fresh connection, the body decoded (Python, for the
/// stack's task scripts; a macro so that scripts can `concat!` it).
macro_rules! py_get {
    () => {
        r#"def get(host, port):
    s = socket.create_connection((host, port), timeout=3)
    s.sendall(b'GET / HTTP/1.0\r\n\r\n')
    data = b''
    while True:
        d = s.recv(4096)
        if not d:
            break
        data += d
    s.close()
    return data.split(b'\r\n\r\n', 1)[1].decode()
"#
    };
}
#[allow(unused_imports)] // used by some test binaries that include this module, not all
pub(crate) use py_get;

/// The client, from inside its task (process executor): what `web`, `tasks.web` and `db` (on a network the
/// client is not on) resolve to, then 40 GETs of each of `http://web/`, the VIP (`VIP`, or what `web` resolves
/// to), and the outside listener (`OUTSIDE`, port 8099), one `RESULT <what> <answer>=<count> ...` line each,
/// then `RESULT DONE`. Each target's first GET is retried for up to 10 s (the VIP's backends are set a moment
/// after RUNNING).
pub(crate) const CLIENT: &str = concat!(
    "\nimport collections, os, socket, time\n",
    py_get!(),
    r#"def names(n):
    try:
        return ','.join(sorted(socket.gethostbyname_ex(n)[2]))
    except OSError as e:
        return 'error:' + type(e).__name__
# In a stack the services start together: wait (60 s at most) until both web tasks have names.
deadline = time.time() + 60
while time.time() < deadline and len(names('tasks.web').split(',')) < 2:
    time.sleep(0.2)
print('RESULT web', names('web'), flush=True)
print('RESULT tasks.web', names('tasks.web'), flush=True)
print('RESULT db', names('db'), flush=True)
vip = os.environ.get('VIP') or socket.gethostbyname('web')
for what, host, port in [('name', 'web', 80), ('vip', vip, 80), ('outside', os.environ['OUTSIDE'], 8099)]:
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            get(host, port)
            break
        except OSError:
            time.sleep(0.1)
    seen = collections.Counter()
    for i in range(40):
        try:
            seen[get(host, port)] += 1
        except OSError as e:
            seen['error:' + type(e).__name__] += 1
    print('RESULT', what, ' '.join('%s=%d' % kv for kv in sorted(seen.items())), flush=True)
print('RESULT DONE', flush=True)
time.sleep(100000)
"#
);

/// The stack's compose file (as JSON, which is YAML): `web` runs `web` (its last element the command, the
/// rest the entrypoint) with 2 replicas publishing `published` (ingress) on `front` and `back`, `db` runs the
/// same on `back`, `client` runs `client` on `front` with `OUTSIDE=<outside>` and no restart. `$` in the
/// scripts is escaped from compose's interpolation. A test adds placement or environment to it.
pub(crate) fn compose(image: &str, web: &[String], client: &[String], outside: &str, published: u16) -> Value {
    let escaped = |v: &[String]| -> Vec<String> { v.iter().map(|a| a.replace('$', "$$")).collect() };
    let (web, client) = (escaped(web), escaped(client));
    let (entry, web_cmd) = web.split_at(web.len() - 1);
    let (client_entry, client_cmd) = client.split_at(client.len() - 1);
    json!({
        "version": "3.8",
        "services": {
            "web": {"image": image, "entrypoint": entry, "command": web_cmd, "networks": ["front", "back"],
                    "ports": [format!("{published}:80")], "deploy": {"replicas": 2}},
            "client": {"image": image, "entrypoint": client_entry, "command": client_cmd, "networks": ["front"],
                       "environment": {"OUTSIDE": outside},
                       "deploy": {"restart_policy": {"condition": "none"}}},
            "db": {"image": image, "entrypoint": entry, "command": web_cmd, "networks": ["back"]},
        },
        "networks": {"front": {"driver": "overlay"}, "back": {"driver": "overlay"}},
    })
}

/// The counts of a `RESULT <what> answer=n ...` line.
pub(crate) fn counts(line: &str) -> BTreeMap<String, u32> {
    line.split_whitespace()
        .skip(1)
        .filter_map(|kv| kv.rsplit_once('='))
        .map(|(k, v)| (k.into(), v.parse().unwrap()))
        .collect()
}

/// The checks of the client's `RESULT` lines `r`: `web` resolves to `vip` (its VIP on front), `tasks.web` to
/// the two tasks' addresses `web_addrs` (sorted), `db` (on no network of the client's) to nothing; both tasks
/// answer through the name and the VIP (at least 5 of 40 each: an even spread misses that with probability
/// below 1e-6) with nothing failing, and the outside listener answers all 40.
pub(crate) fn check_client(r: &[String], vip: &str, web_addrs: &[String]) {
    assert!(r.contains(&format!("web {vip}")), "web resolves to its VIP on front {vip}: {r:?}");
    assert!(r.contains(&format!("tasks.web {}", web_addrs.join(","))), "tasks.web is {web_addrs:?}: {r:?}");
    let db = r.iter().find(|l| l.starts_with("db")).unwrap_or_else(|| panic!("no db line: {r:?}"));
    assert!(db == "db" || db.starts_with("db error:"), "db resolves from a network it is not on: {db}");
    for what in ["name", "vip"] {
        let line = r.iter().find(|l| l.starts_with(&format!("{what} "))).unwrap_or_else(|| panic!("{r:?}"));
        let c = counts(line);
        assert!(
            c.len() == 2 && c.iter().all(|(a, n)| !a.starts_with("error") && *n >= 5),
            "{what}: both tasks answer, nothing fails: {line}"
        );
    }
    assert!(r.contains(&"outside outside=40".to_string()), "the outside world answers all 40: {r:?}");
}

/// The VIP (without its prefix length) of service `service` on network `network`, with `docker` (the CLI
/// against a manager).
pub(crate) fn vip_on(docker: impl Fn(&[&str]) -> String, service: &str, network: &str) -> String {
    let id = docker(&["network", "inspect", network, "--format", "{{.Id}}"]);
    let format = "{{range .Endpoint.VirtualIPs}}{{.NetworkID}} {{.Addr}}\n{{end}}";
    let vips = docker(&["service", "inspect", service, "--format", format]);
    vips.lines()
        .find_map(|l| l.strip_prefix(&format!("{} ", id.trim())))
        .unwrap_or_else(|| panic!("no VIP of {service} on {network} {id}: {vips}"))
        .split('/')
        .next()
        .unwrap()
        .to_string()
}

fn run(args: &[&str]) -> String {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The outside world: a namespace with an HTTP listener on port 8099 answering `outside`, at `ip`, that the
/// nodes reach through a router (their FORWARD chain on the way out, masqueraded). Deleted on drop.
pub(crate) struct Outside {
    ns: String,
    /// The address the outside reaches a node at (the host's end of the veth; a node's own address on the
    /// underlay).
    pub host_ip: String,
    /// The listener's address.
    pub ip: String,
    server: Option<Child>,
}

impl Outside {
    /// Beside the machine's own namespace, linked by a veth (`dpo<pid>` on the host, 10.251.<n>.1/30;
    /// 10.251.<n>.2 inside, its default route via the host): what the host forwards to it meets the host's
    /// FORWARD chain.
    pub(crate) fn beside_host() -> Outside {
        let pid = std::process::id();
        let n = pid % 250 + 1;
        let (ns, link) = (format!("shoal-t-{pid}-outside"), format!("dpo{pid}"));
        let (host_ip, ip) = (format!("10.251.{n}.1"), format!("10.251.{n}.2"));
        let mut o = Outside { ns: ns.clone(), host_ip: host_ip.clone(), ip: ip.clone(), server: None };
        run(&["ip", "netns", "add", &ns]);
        run(&["ip", "link", "add", &link, "type", "veth", "peer", "name", "eth0", "netns", &ns]);
        run(&["ip", "addr", "add", &format!("{host_ip}/30"), "dev", &link]);
        run(&["ip", "link", "set", &link, "up"]);
        run(&["ip", "-n", &ns, "addr", "add", &format!("{ip}/30"), "dev", "eth0"]);
        run(&["ip", "-n", &ns, "link", "set", "eth0", "up"]);
        run(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
        run(&["ip", "-n", &ns, "route", "add", "default", "via", &host_ip]);
        o.serve();
        o
    }

    /// On the underlay of `net` (a veth into its hub's bridge, 10.77.0.254/24), which becomes every node's
    /// default router; the listener is at 10.250.0.1, beyond it (not on the nodes' subnet, so a task's
    /// connection leaves its node by its default route, as to the internet). `host_ip` is node 0's address.
    pub(crate) fn router_of(net: &Net, nodes: usize) -> Outside {
        let ns = format!("{}-out", net.hub());
        let (router, ip) = ("10.77.0.254", "10.250.0.1");
        let mut o = Outside { ns: ns.clone(), host_ip: net.ip(0), ip: ip.into(), server: None };
        run(&["ip", "netns", "add", &ns]);
        run(&["ip", "-n", net.hub(), "link", "add", "vout", "type", "veth", "peer", "name", "eth0", "netns", &ns]);
        run(&["ip", "-n", net.hub(), "link", "set", "vout", "master", "br0"]);
        run(&["ip", "-n", net.hub(), "link", "set", "vout", "up"]);
        run(&["ip", "-n", &ns, "addr", "add", &format!("{router}/24"), "dev", "eth0"]);
        run(&["ip", "-n", &ns, "addr", "add", &format!("{ip}/32"), "dev", "lo"]);
        run(&["ip", "-n", &ns, "link", "set", "eth0", "up"]);
        run(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
        for i in 0..nodes {
            run(&["ip", "-n", net.ns(i), "route", "add", "default", "via", router]);
        }
        o.serve();
        o
    }

    fn serve(&mut self) {
        let server =
            SERVER.replace("c.getsockname()[0].encode()", "b'outside'").replace("80))", &format!("{OUTSIDE_PORT}))"));
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns, "/usr/bin/python3", "-S", "-c", &server])
            .stdin(Stdio::null())
            .spawn()
            .expect("the outside listener");
        self.server = Some(child);
        let ip = self.ip.clone();
        wait_until("the outside listener", WAIT, || match self.get(&ip, OUTSIDE_PORT) {
            Ok(b) if b == "outside" => Ok(()),
            other => Err(format!("{other:?}")),
        });
    }

    /// A GET from inside the outside namespace: the body, or the error.
    pub(crate) fn get(&self, host: &str, port: u16) -> Result<String, String> {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns, "/usr/bin/python3", "-S", "-c"])
            .arg(format!(
                "import socket\ns = socket.create_connection(('{host}', {port}), timeout=3)\ns.sendall(b'GET / \
                 HTTP/1.0\\r\\n\\r\\n')\nd = b''\nwhile True:\n    b = s.recv(4096)\n    if not b: break\n    d += \
                 b\nprint(d.split(b'\\r\\n\\r\\n', 1)[1].decode())"
            ))
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("").to_string())
        }
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}
