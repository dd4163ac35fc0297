//! The tree's own rules, checked by machine so that they stay true: every Rust file opens with a `//!`
//! paragraph saying what it does, and each crate's direct dependencies and source respect the "what it must not
//! know" column of docs/ARCHITECTURE.md (the table below is that column, in checkable form: a dependency or a
//! source pattern added against it fails here, naming the crate and the rule).
//!
//! Reads files only; must not depend on any workspace crate.

use std::path::{Path, PathBuf};

/// The workspace root (this crate is `crates/testkit`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("workspace root")
}

/// Every `.rs` file under `dir`, sorted, skipping build output.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("read {}: {e}", d.display())) {
            let p = e.expect("dir entry").path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if p.is_dir() {
                if name != "target" && !name.starts_with('.') {
                    stack.push(p);
                }
            } else if name.ends_with(".rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// A test file: its code is not shipped, so the source rules do not apply to it.
fn is_test_file(p: &Path) -> bool {
    let s = p.to_string_lossy();
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
    s.contains("/tests/") || s.contains("/benches/") || name == "tests.rs" || name.ends_with("_tests.rs")
}

#[test]
fn every_rust_file_opens_with_a_module_doc() {
    let root = root();
    let missing: Vec<String> = rust_files(&root.join("crates"))
        .into_iter()
        .filter(|p| !std::fs::read_to_string(p).unwrap_or_default().starts_with("//!"))
        .map(|p| p.strip_prefix(&root).unwrap_or(&p).display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "these files do not open with a `//!` paragraph (what the file does, what it must not depend on): {missing:#?}"
    );
}

/// One crate's "must not know", in checkable form.
struct Boundary {
    /// The crate's folder under `crates/`.
    dir: &'static str,
    /// What docs/ARCHITECTURE.md says it must not know, in its words (shown when a rule breaks).
    why: &'static str,
    /// Direct dependencies (normal, not dev) it must not have.
    deps: &'static [&'static str],
    /// Text its shipped (non-test) source must not contain, except in the files listed with it.
    source: &'static [(&'static str, &'static [&'static str])],
}

/// Every workspace crate beside the binaries, the harness and the benchmarks.
const WORKSPACE_CRATES: &[&str] = &[
    "shoal-api",
    "shoal-store",
    "shoal-raft",
    "shoal-ca",
    "shoal-manager",
    "shoal-template",
    "shoal-agent",
    "shoal-netplane",
    "shoal-gossip",
    "shoal-engine-api",
    "shoal-node",
    "shoal-observe",
    "shoal-testkit",
    "shoal",
];

const BOUNDARIES: &[Boundary] = &[
    Boundary { dir: "api", why: "anything else in the workspace", deps: WORKSPACE_CRATES, source: &[] },
    Boundary {
        dir: "template",
        why: "anything else in the workspace (a pure renderer)",
        deps: WORKSPACE_CRATES,
        source: &[],
    },
    Boundary {
        dir: "gossip",
        why: "anything else in the workspace; outside `shell.rs`, IO and clocks",
        deps: WORKSPACE_CRATES,
        source: &[("Instant::now", &["shell.rs"]), ("SystemTime::now", &[]), ("tokio::", &["shell.rs"])],
    },
    Boundary {
        dir: "store",
        why: "IO, async runtimes, clocks, Raft",
        deps: &["shoal-raft", "raft", "raft-engine", "tonic", "hyper", "axum", "bollard", "shoal-manager"],
        source: &[
            ("Instant::now", &[]),
            ("SystemTime::now", &["clock.rs"]),
            ("tokio::spawn", &[]),
            ("tokio::time", &[]),
            ("tokio::net", &[]),
            ("tokio::fs", &[]),
            ("std::fs", &[]),
            ("TcpStream", &[]),
        ],
    },
    Boundary {
        dir: "ca",
        why: "IO, clocks (`now` is a parameter), gRPC, the store",
        deps: &["tokio", "tonic", "hyper", "shoal-store", "shoal-raft", "shoal-manager"],
        source: &[("Instant::now", &[]), ("SystemTime::now", &[]), ("std::fs", &[]), ("TcpStream", &[])],
    },
    Boundary {
        dir: "raft",
        why: "services, tasks, subsystems",
        deps: &["shoal-manager", "shoal-agent", "shoal-engine-api", "shoal-node", "shoal-netplane", "shoal-observe"],
        source: &[],
    },
    Boundary {
        dir: "manager",
        why: "HTTP/JSON, processes, Docker",
        deps: &[
            "axum",
            "hyper",
            "serde_json",
            "bollard",
            "shoal-engine-api",
            "shoal-agent",
            "shoal-node",
            "shoal-netplane",
        ],
        source: &[("std::process::Command", &[]), ("tokio::process", &[])],
    },
    Boundary {
        dir: "agent",
        why: "the store, Raft, the manager (talks to managers only over gRPC)",
        deps: &["shoal-store", "shoal-raft", "raft", "shoal-manager", "shoal-engine-api", "shoal-node"],
        source: &[],
    },
    Boundary {
        dir: "netplane",
        why: "the store, the agent, the API types",
        deps: &["shoal-store", "shoal-agent", "shoal-api", "shoal-manager", "tonic", "prost"],
        source: &[],
    },
    Boundary {
        dir: "observe",
        why: "writes, subsystems, Raft beyond the `Proposer` seam, executors, the Engine API",
        deps: &["shoal-manager", "shoal-agent", "shoal-engine-api", "shoal-node", "bollard"],
        source: &[],
    },
    Boundary {
        dir: "engine-api",
        why: "Raft, the executors, the agent",
        deps: &["shoal-raft", "raft", "shoal-agent", "shoal-node", "bollard"],
        source: &[],
    },
    Boundary {
        dir: "sim",
        why: "wall clocks, threads, sockets, the node crate",
        deps: &["shoal-node", "shoal-agent", "shoal-engine-api", "tonic", "hyper"],
        source: &[
            ("Instant::now", &[]),
            ("SystemTime::now", &[]),
            ("thread::spawn", &[]),
            ("TcpStream", &[]),
            ("TcpListener", &[]),
            ("UdpSocket", &[]),
            ("tokio::spawn", &[]),
            ("tokio::time", &[]),
        ],
    },
];

/// The names of the normal dependencies in a Cargo.toml (its `[dependencies]` table only).
fn normal_dependencies(manifest: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_deps = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
            continue;
        }
        if !in_deps || line.is_empty() || line.starts_with('#') {
            continue;
        }
        let key = line.split(['=', '.']).next().unwrap_or("").trim().trim_matches('"');
        if !key.is_empty() {
            out.push(key.to_string());
        }
    }
    out
}

#[test]
fn the_dependency_reader_sees_only_normal_dependencies() {
    let toml =
        "[package]\nname = \"x\"\n[dependencies]\na.workspace = true\nb = { version = \"1\" }\n# c\n\"d\" = \"2\"\n\
                [dev-dependencies]\ne = \"1\"\n[target.'cfg(unix)'.dependencies]\nf = \"1\"\n";
    assert_eq!(normal_dependencies(toml), ["a", "b", "d"]);
}

#[test]
fn each_crate_knows_only_what_the_architecture_lets_it() {
    let root = root();
    let mut broken = Vec::new();
    for b in BOUNDARIES {
        let dir = root.join("crates").join(b.dir);
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).expect("crate manifest");
        let own = format!("shoal-{}", b.dir);
        for d in normal_dependencies(&manifest) {
            if d != own && b.deps.contains(&d.as_str()) {
                broken.push(format!("crates/{} depends on {d}; it must not know {}", b.dir, b.why));
            }
        }
        for file in rust_files(&dir.join("src")).into_iter().filter(|p| !is_test_file(p)) {
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
            // Code under `#[cfg(test)]` at the end of a file is a test module: only what comes before is shipped.
            let shipped = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
            for (pattern, allowed_in) in b.source {
                if shipped.contains(pattern) && !allowed_in.contains(&name) {
                    let rel = file.strip_prefix(&root).unwrap_or(&file).display().to_string();
                    broken.push(format!("{rel} uses `{pattern}`; crates/{} must not know {}", b.dir, b.why));
                }
            }
        }
    }
    assert!(broken.is_empty(), "docs/ARCHITECTURE.md's boundaries are broken:\n{}", broken.join("\n"));
}

/// The cells of docs/ARCHITECTURE.md's crate map: (crate directory, "must not know" cell).
fn architecture_map(doc: &str) -> Vec<(String, String)> {
    doc.lines()
        .filter(|l| l.starts_with("| `"))
        .filter_map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split(" | ").map(str::trim).collect();
            (cells.len() == 4).then(|| (cells[0].trim_matches('`').to_string(), cells[2].to_string()))
        })
        .collect()
}

#[test]
fn the_architecture_map_names_every_crate_and_the_boundaries_checked_here() {
    let root = root();
    let doc = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md")).expect("docs/ARCHITECTURE.md");
    let map = architecture_map(&doc);
    let mut broken = Vec::new();
    for entry in std::fs::read_dir(root.join("crates")).expect("crates/").flatten() {
        let dir = entry.file_name().to_string_lossy().to_string();
        if entry.path().join("Cargo.toml").exists() && !map.iter().any(|(d, _)| *d == dir) {
            broken.push(format!("crates/{dir} has no row in the crate map"));
        }
    }
    for b in BOUNDARIES {
        match map.iter().find(|(d, _)| d == b.dir) {
            None => broken.push(format!("crates/{} is checked here but has no row", b.dir)),
            Some((_, cell)) if !cell.starts_with(b.why) => broken.push(format!(
                "crates/{}: the map says it must not know {cell:?}; this test checks {:?}",
                b.dir, b.why
            )),
            Some(_) => {}
        }
    }
    assert!(broken.is_empty(), "docs/ARCHITECTURE.md's crate map and this test disagree:\n{}", broken.join("\n"));
}
