//! Containers of the engine's own on attachable swarm networks, as the relay (`relay`) serves them: the seam
//! to the node (`SwarmAttach`, implemented by the node crate over the agent's attacher) and the pure rewrite
//! of a container create that names a swarm network.
//!
//! A create on swarm network `net` (`docker run --network net`): the relay asks the node for a
//! network-namespace holder (`SwarmAttach::prepare`), creates the container on the engine with network mode
//! `container:<holder>` (`rewrite_create`: the hostname, DNS settings and extra hosts go to the holder, which
//! Docker lets only a namespace's first container set; the labels the node gives are added), then has the
//! node attach it (`SwarmAttach::attach`: an address from the swarm's allocator, refused by the manager when
//! the network is not attachable). A start of such a container waits for its namespace to be plumbed
//! (`SwarmAttach::before_start`). What the node does and why is in docs/design/attachable-networks.md.
//!
//! Must not depend on the executors or the agent (the seam is the trait), nor on the store or Raft.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use serde_json::Value;

/// A refusal from the node: the HTTP status to answer and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachRefusal {
    /// The HTTP status (4xx for what the user can change, 5xx otherwise).
    pub status: u16,
    /// What was wrong and what to do.
    pub message: String,
}

/// A future of the seam.
pub type AttachFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, AttachRefusal>> + Send + 'a>>;

/// What the holder of a container carries for it (from the create body).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HolderFacts {
    /// `Hostname`.
    pub hostname: Option<String>,
    /// `HostConfig.DnsSearch`.
    pub dns_search: Vec<String>,
    /// `HostConfig.DnsOptions`.
    pub dns_options: Vec<String>,
    /// `HostConfig.ExtraHosts` (`host:ip`).
    pub extra_hosts: Vec<String>,
}

/// A holder made for a container about to be created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// The holder's container ID (the container's network mode is `container:<holder>`).
    pub holder: String,
    /// Labels the container must carry (how the node finds its holder, network and aliases again).
    pub labels: BTreeMap<String, String>,
}

/// The node's side of containers on attachable swarm networks.
pub trait SwarmAttach: Send + Sync + 'static {
    /// Makes the holder of a container to be created on swarm network `network` with `aliases`.
    fn prepare<'a>(&'a self, network: &'a str, aliases: &'a [String], facts: HolderFacts)
        -> AttachFuture<'a, Prepared>;
    /// Attaches `container`, just created with a `Prepared`'s network mode and labels, to its network.
    fn attach<'a>(&'a self, container: &'a str) -> AttachFuture<'a, ()>;
    /// Removes `holder`, whose container was not created or not attached.
    fn abandon<'a>(&'a self, holder: &'a str) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>>;
    /// Before `container` starts: attached and plumbed when it is on a swarm network; nothing otherwise.
    fn before_start<'a>(&'a self, container: &'a str) -> AttachFuture<'a, ()>;
    /// Before `container` is restarted (`docker restart`): a running one on a swarm network keeps its
    /// attachment through the restart's stop (`Some(id)`: call `restart_ended` with it once the engine
    /// answered); a stopped one is attached and plumbed as for a start.
    fn restart_begins<'a>(&'a self, container: &'a str) -> AttachFuture<'a, Option<String>>;
    /// The restart that `restart_begins` marked with `id` is answered.
    fn restart_ended(&self, id: &str);
    /// Connects running `container` to swarm network `network` with `aliases` (`docker network connect`);
    /// returns once its namespace is plumbed.
    fn connect<'a>(&'a self, container: &'a str, network: &'a str, aliases: &'a [String]) -> AttachFuture<'a, ()>;
    /// Disconnects `container` from swarm network `network` (`docker network disconnect`; `force`: a container
    /// that is gone or not connected is no error).
    fn disconnect<'a>(&'a self, container: &'a str, network: &'a str, force: bool) -> AttachFuture<'a, ()>;
}

/// The value of key `k` of object `v`, matched as Go's JSON decoding does (case-insensitively).
pub(crate) fn field<'a>(v: &'a Value, k: &str) -> Option<&'a Value> {
    v.as_object()?.iter().find(|(name, _)| name.eq_ignore_ascii_case(k)).map(|(_, v)| v)
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

fn remove_field(v: &mut Value, k: &str) -> Option<Value> {
    let o = v.as_object_mut()?;
    let key = o.keys().find(|name| name.eq_ignore_ascii_case(k))?.clone();
    o.remove(&key)
}

/// Why a create on swarm network `network` cannot be honoured as given (`None`: it can), naming the field.
pub fn refusal(body: &Value, network: &str, others: &[String]) -> Option<String> {
    if !others.is_empty() {
        return Some(format!(
            "NetworkingConfig.EndpointsConfig: a container on swarm network {network} joins no other network on this \
             node ({} named too); create it on {network} alone",
            others.join(", ")
        ));
    }
    let host = field(body, "HostConfig").cloned().unwrap_or_default();
    let bindings = field(&host, "PortBindings").and_then(Value::as_object).is_some_and(|b| !b.is_empty());
    if bindings || field(&host, "PublishAllPorts").and_then(Value::as_bool).unwrap_or(false) {
        return Some(format!(
            "HostConfig.PortBindings: a container on swarm network {network} publishes no port on this node; leave \
             out -p/-P (reach it on the network by its address, or run it as a service with --publish)"
        ));
    }
    let ep = field(body, "NetworkingConfig").and_then(|n| field(n, "EndpointsConfig")).and_then(|e| field(e, network));
    ep.and_then(|ep| endpoint_refusal(ep, network, &format!("NetworkingConfig.EndpointsConfig.{network}")))
}

/// Why an endpoint config on swarm network `network` (`at` names where it is in the request) cannot be
/// honoured (`None`: it can). Only aliases are: an address is the swarm allocator's, links are the default
/// bridge's, and the swarm's attachments take no driver options or MAC address.
pub fn endpoint_refusal(ep: &Value, network: &str, at: &str) -> Option<String> {
    let set = |v: Option<&Value>| match v {
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        _ => false,
    };
    let ipam = field(ep, "IPAMConfig");
    if ["IPv4Address", "IPv6Address", "LinkLocalIPs"].iter().any(|k| set(ipam.and_then(|i| field(i, k)))) {
        return Some(format!(
            "{at}.IPAMConfig: an address on swarm network {network} is given by the swarm's allocator; leave out \
             --ip/--ip6/--link-local-ip"
        ));
    }
    let refused = [
        (
            "Links",
            "--link: links are for the engine's default bridge; on swarm network {network} containers reach each \
                   other by name",
        ),
        ("DriverOpts", "--driver-opt: an attachment to swarm network {network} takes no driver options; leave it out"),
        (
            "MacAddress",
            "--mac-address: the MAC address of an attachment to swarm network {network} is chosen by the \
                        node; leave it out",
        ),
    ];
    refused
        .iter()
        .find(|(k, _)| set(field(ep, k)))
        .map(|(k, why)| format!("{at}.{k}: {}", why.replace("{network}", network)))
}

/// The aliases a create asks for on `network` (`--network-alias`).
pub fn aliases(body: &Value, network: &str) -> Vec<String> {
    let ep = field(body, "NetworkingConfig").and_then(|n| field(n, "EndpointsConfig")).and_then(|e| field(e, network));
    strings(ep.and_then(|e| field(e, "Aliases")))
}

/// What of a create body goes to the holder.
pub fn holder_facts(body: &Value) -> HolderFacts {
    let host = field(body, "HostConfig");
    HolderFacts {
        hostname: field(body, "Hostname").and_then(Value::as_str).filter(|h| !h.is_empty()).map(str::to_string),
        dns_search: strings(host.and_then(|h| field(h, "DnsSearch"))),
        dns_options: strings(host.and_then(|h| field(h, "DnsOptions"))),
        extra_hosts: strings(host.and_then(|h| field(h, "ExtraHosts"))),
    }
}

/// The create body the engine gets: network mode `container:<holder>`, no endpoint, the holder's settings
/// left out (the engine refuses them with that network mode), the node's labels added.
pub fn rewrite_create(mut body: Value, prepared: &Prepared) -> Value {
    if !body.is_object() {
        body = Value::Object(Default::default());
    }
    remove_field(&mut body, "Hostname");
    remove_field(&mut body, "NetworkingConfig");
    let mut labels =
        remove_field(&mut body, "Labels").filter(Value::is_object).unwrap_or_else(|| Value::Object(Default::default()));
    if let Some(l) = labels.as_object_mut() {
        for (k, v) in &prepared.labels {
            l.insert(k.clone(), Value::String(v.clone()));
        }
    }
    let obj = body.as_object_mut().expect("an object");
    obj.insert("Labels".into(), labels);
    let mut host = remove_field(&mut body, "HostConfig")
        .filter(Value::is_object)
        .unwrap_or_else(|| Value::Object(Default::default()));
    for k in ["NetworkMode", "Dns", "DnsSearch", "DnsOptions", "ExtraHosts", "PortBindings", "PublishAllPorts"] {
        remove_field(&mut host, k);
    }
    if let Some(h) = host.as_object_mut() {
        h.insert("NetworkMode".into(), Value::String(format!("container:{}", prepared.holder)));
    }
    body.as_object_mut().expect("an object").insert("HostConfig".into(), host);
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn prepared() -> Prepared {
        Prepared { holder: "h1".into(), labels: BTreeMap::from([("com.shoal.attach.holder".into(), "h1".into())]) }
    }

    #[test]
    fn the_create_joins_the_holder_which_takes_the_hostname_dns_and_hosts() {
        let body = json!({
            "Hostname": "box", "Image": "busybox", "Labels": {"a": "b"},
            "HostConfig": {"NetworkMode": "net", "Dns": [], "DnsSearch": ["x.test"], "DnsOptions": ["ndots:2"],
                "ExtraHosts": ["db:10.1.1.1"], "Binds": ["/a:/b"]},
            "NetworkingConfig": {"EndpointsConfig": {"net": {"Aliases": ["one"]}}}
        });
        let facts = holder_facts(&body);
        assert_eq!(facts.hostname.as_deref(), Some("box"));
        assert_eq!(facts.dns_search, ["x.test"]);
        assert_eq!(facts.dns_options, ["ndots:2"]);
        assert_eq!(facts.extra_hosts, ["db:10.1.1.1"]);
        assert_eq!(aliases(&body, "net"), ["one"]);
        assert_eq!(refusal(&body, "net", &[]), None);
        let out = rewrite_create(body, &prepared());
        assert_eq!(
            out,
            json!({"Image": "busybox", "Labels": {"a": "b", "com.shoal.attach.holder": "h1"},
                "HostConfig": {"NetworkMode": "container:h1", "Binds": ["/a:/b"]}})
        );
        // Go's decoding is case-insensitive: so is the rewrite.
        let out = rewrite_create(json!({"hostconfig": {"networkmode": "net"}}), &prepared());
        assert_eq!(out["HostConfig"], json!({"NetworkMode": "container:h1"}));
    }

    #[test]
    fn what_a_swarm_network_cannot_give_is_refused_by_field() {
        let check = |body: Value, others: &[String], want: Option<&str>| {
            let got = refusal(&body, "net", others);
            match want {
                None => assert_eq!(got, None),
                Some(w) => assert!(got.as_deref().is_some_and(|g| g.starts_with(w)), "{got:?}"),
            }
        };
        check(
            json!({"HostConfig": {"PortBindings": {"80/tcp": [{"HostPort": "8080"}]}}}),
            &[],
            Some("HostConfig.PortBindings"),
        );
        check(json!({"HostConfig": {"PublishAllPorts": true}}), &[], Some("HostConfig.PortBindings"));
        check(json!({"HostConfig": {"PortBindings": {}}}), &[], None);
        check(
            json!({"NetworkingConfig": {"EndpointsConfig": {"net": {"IPAMConfig": {"IPv4Address": "10.0.0.9"}}}}}),
            &[],
            Some("NetworkingConfig.EndpointsConfig.net.IPAMConfig"),
        );
        check(json!({}), &["back".to_string()], Some("NetworkingConfig.EndpointsConfig"));
        // What an endpoint may not carry on a swarm network, on a create and on a connect alike.
        let ep = |e: Value| json!({"NetworkingConfig": {"EndpointsConfig": {"net": e}}});
        let at = "NetworkingConfig.EndpointsConfig.net";
        check(ep(json!({"IPAMConfig": {"LinkLocalIPs": ["169.254.0.9"]}})), &[], Some(&format!("{at}.IPAMConfig")));
        check(ep(json!({"Links": ["db:db"]})), &[], Some(&format!("{at}.Links: --link")));
        check(ep(json!({"DriverOpts": {"k": "v"}})), &[], Some(&format!("{at}.DriverOpts: --driver-opt")));
        check(ep(json!({"MacAddress": "02:42:ac:11:00:09"})), &[], Some(&format!("{at}.MacAddress")));
        // What the docker CLI sends empty is no request.
        let empty = json!({"IPAMConfig": {"IPv4Address": "", "LinkLocalIPs": []}, "Links": null, "DriverOpts": {},
            "MacAddress": "", "Aliases": ["a"]});
        check(ep(empty.clone()), &[], None);
        assert_eq!(endpoint_refusal(&empty, "net", "EndpointConfig"), None);
        let links = endpoint_refusal(&json!({"Links": ["db"]}), "net", "EndpointConfig");
        assert!(links.is_some_and(|l| l.starts_with("EndpointConfig.Links: --link")));
    }
}
