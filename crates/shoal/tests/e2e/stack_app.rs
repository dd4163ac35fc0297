//! The README's stack walkthrough, run: a three-tier app (`front` proxies to `api`, which counts hits in
//! `store`, which only answers requests carrying the token from a secret) deployed with `docker stack deploy`
//! (the stock docker CLI) on three `shoal daemon`s, each in its own network namespace, process executor. The
//! files are those of the README's walkthrough, `examples/stack-app/`: the programs are Python's standard
//! library, shipped as the stack's configs; every service is on the stack's `default` network and reaches the
//! next tier by name.
//!
//! Checked by behaviour, from a probe task on the stack's network: `http://front/` answers through both tiers
//! with a counter that rises by one per request (one store behind two api tasks); the store refuses a request
//! without the token; `front`'s published port 8080 answers on every node's address through the routing mesh
//! (the node that runs no front task included), from each node. A redeploy that changes only the api's environment
//! replaces only the api's tasks, and the counter goes on (the store kept running); `http://tasks.front/` (the compose
//! file's short name) reaches a front task, as in Docker. `docker stack rm` removes everything the stack made. The
//! nodes' namespaces are prepared like Docker hosts (`common/netcluster.rs`).

use crate::common;

use std::collections::BTreeSet;

use common::netcluster::Cluster;
use common::*;
use serde_json::json;
use shoal_testkit::managers::post_service;

/// A probe: `GET`s `URL` `N` times (the first retried for up to 10 s while the tiers start), one `RESULT`
/// line each (`<status> <body>`, or `error <reason>`), then `RESULT DONE`.
const PROBE: &str = r#"
import os, time, urllib.error, urllib.request
def get(url):
    try:
        return '200 ' + urllib.request.urlopen(url, timeout=5).read().decode()
    except urllib.error.HTTPError as e:
        return '%d' % e.code
url, n = os.environ['URL'], int(os.environ['N'])
for attempt in range(100):
    try:
        urllib.request.urlopen(url, timeout=5).close()
        break
    except urllib.error.HTTPError:
        break
    except Exception:
        time.sleep(0.1)
for i in range(n):
    try:
        out = get(url)
    except Exception as e:
        out = 'error ' + type(e).__name__
    print('RESULT', out, flush=True)
print('RESULT DONE', flush=True)
time.sleep(100000)
"#;

/// The example's files (examples/stack-app, the README's walkthrough), copied to `dir` with `GREETING` set to
/// `greeting`; returns the compose file's path.
fn write_stack(dir: &std::path::Path, greeting: &str) -> std::path::PathBuf {
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/stack-app");
    for f in ["front.py", "api.py", "store.py", "store_token.txt"] {
        std::fs::copy(example.join(f), dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
    }
    let text = std::fs::read_to_string(example.join("compose.yml")).unwrap();
    assert!(text.contains("GREETING: hello"), "the example sets GREETING: {text}");
    let compose = dir.join("compose.yml");
    std::fs::write(&compose, text.replace("GREETING: hello", &format!("GREETING: {greeting}"))).unwrap();
    compose
}

/// Runs a probe service (`name`) on the stack's network and returns its `RESULT` lines (without `DONE`).
fn probe(c: &mut Cluster, name: &str, url: &str, n: u32) -> Vec<String> {
    let spec = json!({
        "Name": name,
        "TaskTemplate": {
            "ContainerSpec": {
                "Image": "python:latest",
                "Command": ["/usr/bin/python3", "-S", "-c", PROBE],
                "Env": [format!("URL={url}"), format!("N={n}")],
            },
            "Networks": [{"Target": "app_default"}],
            "RestartPolicy": {"Condition": "none"},
        },
        "Mode": {"Replicated": {"Replicas": 1}},
    });
    post_service(c.manager(), &spec).unwrap();
    let t = c.running(name, 1);
    let mut r = c.results(&t[0]);
    r.retain(|l| l != "DONE");
    c.docker(&["service", "rm", name]);
    r
}

/// The hit counts in `front: <greeting> #<n>` answers, checking every one is that.
fn counts(answers: &[String], greeting: &str) -> Vec<u32> {
    answers
        .iter()
        .map(|a| {
            let n = a
                .strip_prefix(&format!("200 front: {greeting} #"))
                .unwrap_or_else(|| panic!("not an answer of the three tiers with {greeting}: {a:?} in {answers:?}"));
            n.parse().unwrap()
        })
        .collect()
}

fn task_ids(c: &Cluster, service: &str) -> BTreeSet<String> {
    tasks_of(c.manager(), service)
        .iter()
        .filter(|t| desired(t) == "running")
        .map(|t| t["ID"].as_str().unwrap().to_string())
        .collect()
}

fn stack_services(c: &Cluster) -> Vec<String> {
    let mut v: Vec<String> = c
        .docker(&["stack", "services", "app", "--format", "{{.Name}} {{.Replicas}}"])
        .lines()
        .map(str::to_string)
        .collect();
    v.sort();
    v
}

#[test]
fn a_three_tier_stack_answers_by_name_keeps_its_secret_and_redeploys_one_tier() {
    if no_docker_cli() {
        return;
    }
    let mut c = Cluster::start("stk");
    let dir = tempfile::Builder::new().prefix("stack-app-").tempdir_in(shoal_testkit::scratch_dir()).unwrap();
    let compose = write_stack(dir.path(), "hello");
    let file = compose.to_str().unwrap();
    c.docker(&["stack", "deploy", "-c", file, "app"]);
    for (service, n) in [("app_front", 2), ("app_api", 2), ("app_store", 1)] {
        c.running(service, n);
    }
    wait_until("the stack's services converged", std::time::Duration::from_secs(30), || {
        let s = stack_services(&c);
        if s == ["app_api 2/2", "app_front 2/2", "app_store 1/1"] {
            Ok(())
        } else {
            Err(format!("{s:?}"))
        }
    });

    // Through the three tiers, by name: one counter behind both api tasks, one more per request.
    let answers = probe(&mut c, "probe1", "http://front/", 20);
    let n = counts(&answers, "hello");
    assert_eq!(n, (n[0]..n[0] + 20).collect::<Vec<u32>>(), "{answers:?}");
    // Through the routing mesh: port 8080 of every node's address, asked from every node.
    let fronts: BTreeSet<usize> =
        tasks_of(c.manager(), "app_front").iter().filter(|t| desired(t) == "running").map(|t| c.node_of(t)).collect();
    println!("front runs on nodes {fronts:?}");
    let mut last = n[19];
    for from in 0..3 {
        for to in 0..3 {
            let url = format!("http://{}:8080/", c.net.ip(to));
            let script = format!(
                "import time, urllib.request\nfor i in \
                 range(50):\n    try:\n        print(urllib.request.urlopen('{url}', timeout=5).read().decode()); \
                 break\n    except Exception as e:\n        err = e; time.sleep(0.1)\nelse:\n    print('error', err)\n"
            );
            let out = c.in_node(from, &["python3", "-S", "-c", &script]);
            let m = counts(&[format!("200 {}", out.trim())], "hello");
            assert!(m[0] > last, "node-{from} -> node-{to}:8080 answered {out:?} after #{last}");
            last = m[0];
        }
    }
    // The store answers only with the secret's token.
    assert_eq!(probe(&mut c, "probe2", "http://store:7000/hits", 1), ["403"]);

    // A changed environment variable of one service: only its tasks are replaced, the store keeps counting.
    let before: Vec<BTreeSet<String>> = ["app_front", "app_store"].iter().map(|s| task_ids(&c, s)).collect();
    let api_before = task_ids(&c, "app_api");
    write_stack(dir.path(), "bonjour");
    let out = c.docker(&["stack", "deploy", "-c", file, "app"]);
    assert!(out.contains("Updating service app_api"), "{out}");
    wait_until("the api's tasks replaced", std::time::Duration::from_secs(60), || {
        let now = task_ids(&c, "app_api");
        let running = tasks_of(c.manager(), "app_api")
            .iter()
            .filter(|t| desired(t) == "running" && state(t) == "running")
            .count();
        if now.is_disjoint(&api_before) && running == 2 {
            Ok(())
        } else {
            Err(format!("{now:?} ({running} running)"))
        }
    });
    let after: Vec<BTreeSet<String>> = ["app_front", "app_store"].iter().map(|s| task_ids(&c, s)).collect();
    assert_eq!(before, after, "front and store kept their tasks");
    let answers = probe(&mut c, "probe3", "http://front/", 5);
    let m = counts(&answers, "bonjour");
    assert!(m[0] > last, "the store kept its count across the api's update: {answers:?} after #{last}");
    // `tasks.<the compose file's short name>` gives the service's tasks, as in Docker (issue 30).
    let answers = probe(&mut c, "probe4", "http://tasks.front/", 1);
    let t = counts(&answers, "bonjour");
    assert!(t[0] > m[4], "tasks.front answered: {answers:?}");

    // `stack rm` removes every service, network, secret and config of the stack.
    c.docker(&["stack", "rm", "app"]);
    wait_until("the stack gone", std::time::Duration::from_secs(30), || {
        let left: Vec<String> = ["service", "network", "secret", "config"]
            .iter()
            .flat_map(|kind| {
                c.docker(&[kind, "ls", "--filter", "label=com.docker.stack.namespace=app", "--format", "{{.Name}}"])
                    .lines()
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    });
}
