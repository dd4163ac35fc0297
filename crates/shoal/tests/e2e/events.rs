//! `docker events` end to end with the stock docker CLI: a service created, scaled and removed while
//! `docker events --filter type=service` runs shows create, update (with `replicas.old`/`replicas.new`) and
//! remove, in Docker's JSON shape; `--since 5m --until 0s` replays them from the kept window and exits;
//! secrets' events come with their names; a bad `since` is a 400 naming it.

use crate::common;

use std::process::Child;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// A running `docker events` printing one JSON object per line.
struct Events {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Events {
    fn start(d: &DaemonProcess, args: &[&str]) -> Events {
        let mut all = vec!["events", "--format", "{{json .}}"];
        all.extend_from_slice(args);
        let (child, lines) = docker_lines(d.socket(), &all);
        Events { child, lines }
    }

    /// The next event for which `want` holds (earlier ones are returned too, in order), within `deadline`.
    fn until(&self, deadline: Duration, want: impl Fn(&Value) -> bool) -> Vec<Value> {
        let end = Instant::now() + deadline;
        let mut seen = Vec::new();
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let v: Value = serde_json::from_str(&l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
                    let done = want(&v);
                    seen.push(v);
                    if done {
                        return seen;
                    }
                }
                Err(_) => panic!("no matching event within {deadline:?}; saw {seen:#?}"),
            }
        }
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn is(v: &Value, kind: &str, action: &str) -> bool {
    v["Type"] == kind && v["Action"] == action
}

#[test]
fn docker_events_shows_service_create_scale_and_remove_and_replays_them() {
    if no_docker_cli() {
        return;
    }
    let d = daemon();
    // `--since` replays what happened before the stream was taken: no race with the writes below.
    let watcher = Events::start(&d, &["--since", "10m", "--filter", "type=service"]);

    let id = docker(&d, &["service", "create", "--detach", "--quiet", "--name", "web", "busybox", "sleep", "3600"]);
    let id = id.trim().to_string();
    let created = watcher.until(Duration::from_secs(30), |v| is(v, "service", "create"));
    let c = created.last().unwrap();
    assert_eq!(c["Actor"]["ID"], id.as_str());
    assert_eq!(c["Actor"]["Attributes"]["name"], "web");
    assert_eq!(c["scope"], "swarm");
    assert!(c["time"].as_i64().unwrap() > 1_600_000_000, "{c}");
    assert_eq!(c["timeNano"].as_i64().unwrap() / 1_000_000_000, c["time"].as_i64().unwrap());

    docker(&d, &["service", "scale", "--detach", "web=3"]);
    let scaled = watcher.until(Duration::from_secs(30), |v| {
        is(v, "service", "update") && v["Actor"]["Attributes"]["replicas.new"] == "3"
    });
    let s = scaled.last().unwrap();
    assert_eq!(s["Actor"]["Attributes"]["replicas.old"], "1", "{s}");
    assert!(scaled.iter().all(|v| v["Type"] == "service"), "only service events pass the filter: {scaled:#?}");

    docker(&d, &["service", "rm", "web"]);
    watcher.until(Duration::from_secs(30), |v| is(v, "service", "remove") && v["Actor"]["ID"] == id.as_str());

    // A secret: its event has its name (and nothing of its data).
    let out = docker_cli::run_with_stdin(d.socket(), &["secret", "create", "pw", "-"], "s3cr3t");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // Replay: the kept events in the window, then the command exits by itself. The CLI sends `--until 0s` in
    // whole seconds (as Docker's own events, those of the current second come with the next one).
    let (replay, lines) = wait_until("the replay to hold the secret's event", Duration::from_secs(30), || {
        let replay =
            docker_cli::run(d.socket(), &["events", "--since", "5m", "--until", "0s", "--format", "{{json .}}"]);
        if !replay.status.success() {
            return Err(String::from_utf8_lossy(&replay.stderr).into_owned());
        }
        let lines: Vec<Value> = String::from_utf8_lossy(&replay.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        if lines.iter().any(|v| is(v, "secret", "create")) {
            Ok((replay, lines))
        } else {
            Err(format!("{} events so far", lines.len()))
        }
    });
    let actions: Vec<String> =
        lines.iter().filter(|v| v["Type"] == "service").map(|v| v["Action"].as_str().unwrap().to_string()).collect();
    assert_eq!(actions.first().map(String::as_str), Some("create"), "{lines:#?}");
    assert_eq!(actions.last().map(String::as_str), Some("remove"), "{lines:#?}");
    assert!(
        lines.iter().any(|v| is(v, "service", "update") && v["Actor"]["Attributes"]["replicas.new"] == "3"),
        "{lines:#?}"
    );
    let secret = lines.iter().find(|v| is(v, "secret", "create")).expect("the secret's create event");
    assert_eq!(secret["Actor"]["Attributes"]["name"], "pw");
    assert!(!String::from_utf8_lossy(&replay.stdout).contains("s3cr3t"));
    // Times are in order and inside the window.
    let times: Vec<i64> = lines.iter().map(|v| v["timeNano"].as_i64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");

    // The same window with a filter on the service's name.
    let named =
        docker(&d, &["events", "--since", "5m", "--until", "0s", "--filter", "service=web", "--format", "{{.Action}}"]);
    assert_eq!(named.split_whitespace().next(), Some("create"), "{named}");
    assert!(named.split_whitespace().all(|a| ["create", "update", "remove"].contains(&a)), "{named}");

    // A `since` the engine cannot read is refused, naming it.
    let bad = shoal_testkit::http::request(d.socket(), "GET", "/v1.47/events?since=yesterday", None).expect("request");
    assert_eq!(bad.status, 400);
    assert!(bad.body["message"].as_str().unwrap_or_default().contains("invalid since"), "{}", bad.body);
}
