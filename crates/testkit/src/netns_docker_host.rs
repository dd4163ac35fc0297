//! Network namespaces prepared like a host running Docker, for the data-plane tests: the filter table's
//! FORWARD policy DROP with Docker 20.10's chains and jumps (`DOCKER-USER`, `DOCKER-ISOLATION-STAGE-1/2`,
//! `DOCKER`, the rules for `docker0`), in one iptables back end (`iptables-nft` or `iptables-legacy`), and
//! `net.bridge.bridge-nf-call-iptables = 1` (per namespace since Linux 5.3, and 1 by default in a new one
//! once `br_netfilter` is loaded: set anyway, and checked), with strict reverse-path filtering (`rp_filter=1`,
//! as several distributions ship). Only std and the iptables tools: the netplane
//! crate's tests include this file by path, without the rest of the testkit.
//!
//! `prepare_nft_only` makes instead a host with an nftables-only firewall, as firewalld's nftables back end
//! makes one: no iptables table at all, an `inet firewalld` table whose forward chain drops what no zone
//! accepts. Not reproduced: the host's INPUT rules (Docker leaves INPUT alone).

use std::process::Command;

/// An iptables back end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Iptables {
    /// `iptables-nft` (the nftables kernel API; Docker's default on current distributions).
    Nft,
    /// `iptables-legacy` (the x_tables kernel API).
    Legacy,
}

impl Iptables {
    /// The back end's command.
    pub fn command(self) -> &'static str {
        match self {
            Iptables::Nft => "iptables-nft",
            Iptables::Legacy => "iptables-legacy",
        }
    }
}

fn run_in(ns: &str, args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("ip netns exec {ns} {args:?}: {e}"));
    assert!(
        out.status.success(),
        "in {ns}: {args:?} failed: {}{} (preparing a Docker-like host needs root, iptables-nft, iptables-legacy \
         and the br_netfilter module: modprobe br_netfilter)",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Makes namespace `ns` (a name under /run/netns) look like a Docker host's firewall, in back end `iptables`.
pub fn prepare(ns: &str, iptables: Iptables) {
    let ipt = iptables.command();
    let rule = |args: &[&str]| {
        let mut a = vec![ipt, "-w"];
        a.extend_from_slice(args);
        run_in(ns, &a);
    };
    for chain in ["DOCKER", "DOCKER-ISOLATION-STAGE-1", "DOCKER-ISOLATION-STAGE-2", "DOCKER-USER"] {
        rule(&["-N", chain]);
    }
    rule(&["-P", "FORWARD", "DROP"]);
    rule(&["-A", "FORWARD", "-j", "DOCKER-USER"]);
    rule(&["-A", "FORWARD", "-j", "DOCKER-ISOLATION-STAGE-1"]);
    rule(&["-A", "FORWARD", "-o", "docker0", "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"]);
    rule(&["-A", "FORWARD", "-o", "docker0", "-j", "DOCKER"]);
    rule(&["-A", "FORWARD", "-i", "docker0", "!", "-o", "docker0", "-j", "ACCEPT"]);
    rule(&["-A", "FORWARD", "-i", "docker0", "-o", "docker0", "-j", "ACCEPT"]);
    rule(&["-A", "DOCKER-ISOLATION-STAGE-1", "-i", "docker0", "!", "-o", "docker0", "-j", "DOCKER-ISOLATION-STAGE-2"]);
    rule(&["-A", "DOCKER-ISOLATION-STAGE-1", "-j", "RETURN"]);
    rule(&["-A", "DOCKER-ISOLATION-STAGE-2", "-o", "docker0", "-j", "DROP"]);
    rule(&["-A", "DOCKER-ISOLATION-STAGE-2", "-j", "RETURN"]);
    rule(&["-A", "DOCKER-USER", "-j", "RETURN"]);
    run_in(ns, &["sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1"]);
    // Strict reverse-path filtering, as several distributions set it (interfaces made later inherit `default`).
    run_in(ns, &["sysctl", "-qw", "net.ipv4.conf.all.rp_filter=1", "net.ipv4.conf.default.rp_filter=1"]);
    let on = run_in(ns, &["sysctl", "-n", "net.bridge.bridge-nf-call-iptables"]);
    assert_eq!(on.trim(), "1", "bridge-nf-call-iptables in {ns}");
}

/// Makes namespace `ns` look like a host whose only firewall is nftables, as firewalld (nftables back end)
/// sets it up with no zone for Shoal's interfaces: an `inet firewalld` table with a forward chain of policy
/// drop at firewalld's priority that accepts replies, DNATed connections and loopback (firewalld's first
/// rules), no iptables table, `bridge-nf-call-iptables=1` and strict reverse-path filtering as `prepare`.
pub fn prepare_nft_only(ns: &str) {
    let table = "table inet firewalld {
  chain filter_FORWARD {
    type filter hook forward priority filter + 10; policy drop;
    ct state established,related accept
    ct status dnat accept
    iifname \"lo\" accept
  }
}
";
    let file = std::env::temp_dir().join(format!("shoal-firewalld-{}-{ns}.nft", std::process::id()));
    std::fs::write(&file, table).expect("write the firewalld-like ruleset");
    let loaded = Command::new("ip").args(["netns", "exec", ns, "nft", "-f"]).arg(&file).output();
    let _ = std::fs::remove_file(&file);
    let out = loaded.expect("nft -f");
    assert!(out.status.success(), "in {ns}: nft -f: {}", String::from_utf8_lossy(&out.stderr));
    run_in(ns, &["sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1"]);
    run_in(ns, &["sysctl", "-qw", "net.ipv4.conf.all.rp_filter=1", "net.ipv4.conf.default.rp_filter=1"]);
}

/// The back end prepared for node `i` of a test: even nodes iptables-nft, odd ones iptables-legacy, so that
/// every test across nodes meets both.
pub fn for_node(i: usize) -> Iptables {
    if i.is_multiple_of(2) {
        Iptables::Nft
    } else {
        Iptables::Legacy
    }
}

/// The FORWARD rules of both back ends in `ns` that carry Shoal's comment (`shoal-netplane`).
pub fn shoal_rules(ns: &str) -> Vec<String> {
    let mut out = Vec::new();
    for ipt in [Iptables::Nft, Iptables::Legacy] {
        let listing = run_in(ns, &[ipt.command(), "-w", "-S", "FORWARD"]);
        out.extend(listing.lines().filter(|l| l.contains("shoal-netplane")).map(|l| format!("{}: {l}", ipt.command())));
    }
    out
}
