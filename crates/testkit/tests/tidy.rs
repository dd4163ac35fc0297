//! The tree's own rules, checked by machine so that they stay true: every Rust file opens with a `//!`
//! paragraph saying what it does, and each crate's direct dependencies and source respect the "what it must not
//! know" column of docs/ARCHITECTURE.md (the table below is that column, in checkable form: a dependency or a
//! source pattern added against it fails here, naming the crate and the rule), and no shipped function is over
//! 120 lines (measured from the source text: comments, literals and `#[cfg(test)]` modules and files left out),
//! and the crates with a facade (issue 34) declare no `pub mod` at their root but the few listed here.
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
    "shoal-engine-json",
    "shoal-node",
    "shoal-observe",
    "shoal-testkit",
    "shoal-cli",
    "shoal",
];

/// The daemon's crates: what the client must not depend on, directly or through another crate.
const DAEMON_CRATES: &[&str] = &[
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
        source: &[("Instant::now", &["shell.rs"]), ("SystemTime::now", &["shell.rs"]), ("tokio::", &["shell.rs"])],
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
        dir: "engine-json",
        why: "HTTP, the store, any daemon crate",
        deps: &[
            "axum",
            "hyper",
            "shoal-store",
            "shoal-raft",
            "shoal-ca",
            "shoal-manager",
            "shoal-agent",
            "shoal-netplane",
            "shoal-engine-api",
            "shoal-node",
        ],
        source: &[],
    },
    Boundary { dir: "cli", why: "cluster logic; any daemon crate", deps: DAEMON_CRATES, source: &[] },
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

/// The lines of `section` (e.g. `[dependencies]`) in `manifest`.
fn section_lines<'a>(manifest: &'a str, section: &str) -> Vec<&'a str> {
    let mut inside = false;
    let mut out = Vec::new();
    for line in manifest.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            inside = trimmed == section;
        } else if inside && !trimmed.starts_with('#') {
            out.push(trimmed);
        }
    }
    out
}

/// The test doors (`test-doors`: a manager gRPC server without TLS that believes the node ID a caller claims,
/// the fake executor) are in no build of the shipped binaries: `cargo build` builds only the `shoal` crate, and no
/// crate it links turns the feature on or has it by default (the test crates turn it on, and a build of the whole
/// workspace unifies features, so they must not be in that default build).
#[test]
fn the_shipped_daemon_is_built_without_the_test_doors() {
    let root = root();
    let workspace = std::fs::read_to_string(root.join("Cargo.toml")).expect("workspace manifest");
    assert!(
        workspace.lines().any(|l| l.trim() == r#"default-members = ["crates/shoal"]"#),
        "the workspace's default-members must be only crates/shoal, so that `cargo build` leaves the test crates out"
    );
    let mut seen = std::collections::BTreeSet::new();
    let mut todo = vec!["shoal".to_string()];
    let mut broken = Vec::new();
    while let Some(dir) = todo.pop() {
        if !seen.insert(dir.clone()) {
            continue;
        }
        let manifest = std::fs::read_to_string(root.join("crates").join(&dir).join("Cargo.toml")).expect("manifest");
        for line in section_lines(&manifest, "[dependencies]") {
            if line.contains("test-doors") {
                broken.push(format!("crates/{dir} turns on the test doors for the shipped daemon: {line}"));
            }
        }
        for line in section_lines(&manifest, "[features]") {
            if line.starts_with("default") && line.contains("test-doors") {
                broken.push(format!("crates/{dir} has the test doors by default: {line}"));
            }
        }
        let deps = normal_dependencies(&manifest);
        todo.extend(deps.iter().filter_map(|d| d.strip_prefix("shoal-")).map(str::to_string));
    }
    for test_crate in ["testkit", "sim", "bench", "fuzz"] {
        if seen.contains(test_crate) {
            broken.push(format!("the shoal crate links crates/{test_crate}, which opens the test doors"));
        }
    }
    assert!(seen.contains("manager") && seen.contains("node") && seen.contains("agent"), "{seen:?}");
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// The client (`shoal_cli`) reaches no daemon crate through any path: its workspace dependencies, followed
/// transitively, are the Engine API's documents and the wire types they convert to, nothing else.
#[test]
fn the_client_depends_on_no_daemon_crate_through_any_path() {
    let root = root();
    let mut seen = std::collections::BTreeSet::new();
    let mut todo = vec!["cli".to_string()];
    while let Some(dir) = todo.pop() {
        if !seen.insert(dir.clone()) {
            continue;
        }
        let manifest = std::fs::read_to_string(root.join("crates").join(&dir).join("Cargo.toml")).expect("manifest");
        let deps = normal_dependencies(&manifest);
        todo.extend(deps.iter().filter(|d| d.starts_with("shoal-")).map(|d| d["shoal-".len()..].to_string()));
    }
    let daemon: Vec<_> = seen.iter().filter(|d| DAEMON_CRATES.contains(&format!("shoal-{d}").as_str())).collect();
    assert!(daemon.is_empty(), "the client (crates/cli) reaches daemon crates: {daemon:?}");
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), ["api", "cli", "engine-json"]);
}

/// The `shoal` binary (crates/shoal/src/main.rs) is the client crate and nothing else of its package: the only
/// workspace crate it names is `shoal_cli`, so it cannot reach the daemon's library beside it.
#[test]
fn the_client_binary_uses_only_the_client_crate() {
    let main = std::fs::read_to_string(root().join("crates/shoal/src/main.rs")).expect("main.rs");
    let named: std::collections::BTreeSet<&str> = main
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.starts_with("shoal") && w.contains("::"))
        .map(|w| w.split("::").next().unwrap_or(""))
        .collect();
    assert_eq!(named.into_iter().collect::<Vec<_>>(), ["shoal_cli"], "crates/shoal/src/main.rs");
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

/// The longest a shipped function may be, in lines from its `fn` to its closing brace (issue 34: past this, a
/// function hides its steps; split it into named parts).
const MAX_FN_LINES: usize = 120;

/// `text` with comments, string literals and char literals blanked to spaces (newlines kept, so line numbers
/// and braces outside literals stay where they were). Lifetimes (`'a`) are kept.
fn code_only(text: &str) -> String {
    blank_literals(text, ' ')
}

/// As `code_only`, with the characters inside raw string literals blanked to `raw_fill` instead.
fn blank_literals(text: &str, raw_fill: char) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    let mut i = 0;
    while i < c.len() {
        let at = |j: usize| c.get(j).copied().unwrap_or('\0');
        let ident_before = i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_');
        if at(i) == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if at(i) == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            loop {
                if at(i) == '/' && at(i + 1) == '*' {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if at(i) == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else if i >= c.len() {
                    break;
                } else {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
        } else if !ident_before && (at(i) == 'r' || (at(i) == 'b' && at(i + 1) == 'r')) && {
            let s = if at(i) == 'b' { i + 2 } else { i + 1 };
            let mut h = s;
            while at(h) == '#' {
                h += 1;
            }
            at(h) == '"'
        } {
            // A raw string: r"..", r#".."#, br"..".
            let s = if at(i) == 'b' { i + 2 } else { i + 1 };
            let mut h = s;
            while at(h) == '#' {
                h += 1;
            }
            let hashes = h - s;
            for _ in i..=h {
                out.push(' ');
            }
            i = h + 1;
            while i < c.len() && !(c[i] == '"' && (1..=hashes).all(|k| at(i + k) == '#')) {
                out.push(if c[i] == '\n' { '\n' } else { raw_fill });
                i += 1;
            }
            for _ in 0..=hashes {
                out.push(' ');
            }
            i += hashes + 1;
        } else if at(i) == '"' {
            out.push(' ');
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < c.len() {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if at(i) == '\'' && (at(i + 1) == '\\' || (at(i + 2) == '\'' && at(i + 1) != '\'')) {
            // A char literal ('x', '\n', '\u{..}'); a lifetime ('a) has no closing quote after one char.
            out.push(' ');
            i += 1;
            if at(i) == '\\' {
                out.push(' ');
                i += 1;
            }
            while i < c.len() && c[i] != '\'' {
                blank(&mut out, c[i]);
                i += 1;
            }
            out.push(' ');
            i += 1;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// The index of the brace that closes the one at `open` in `code` (a `code_only` text).
fn closing_brace(code: &[u8], open: usize) -> usize {
    let mut depth = 0usize;
    for (i, &b) in code.iter().enumerate().skip(open) {
        match b {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    code.len()
}

/// `code` with each `#[cfg(test)] mod name { .. }` block blanked: test code, not shipped.
fn without_test_modules(code: &str) -> String {
    let mut bytes = code.as_bytes().to_vec();
    let mut from = 0;
    while let Some(at) = code[from..].find("#[cfg(test)]").map(|i| i + from) {
        from = at + 1;
        // Past further attributes and a visibility, a `mod name {` opens the test module.
        let rest = &code[at + "#[cfg(test)]".len()..];
        let mut words = rest.split_whitespace().skip_while(|w| w.starts_with("#[") || w.starts_with("pub"));
        let (Some("mod"), Some(name)) = (words.next(), words.next()) else { continue };
        let Some(open) = rest.find('{').map(|i| i + at + "#[cfg(test)]".len()) else { continue };
        if name.ends_with(';') || code[at..open].contains(';') {
            continue;
        }
        let close = closing_brace(code.as_bytes(), open);
        for b in &mut bytes[at..close.min(code.len() - 1) + 1] {
            if *b != b'\n' {
                *b = b' ';
            }
        }
    }
    String::from_utf8(bytes).expect("blanking keeps the text UTF-8")
}

/// The functions with a body in `text` (a Rust file): (name, line of its `fn`, lines from `fn` to its closing
/// brace), nested ones included; code in `#[cfg(test)] mod .. { .. }` blocks is left out.
fn function_lengths(text: &str) -> Vec<(String, usize, usize)> {
    let code = without_test_modules(&code_only(text));
    let b = code.as_bytes();
    let line_of = |i: usize| code[..i].matches('\n').count() + 1;
    let is_ident = |x: u8| x.is_ascii_alphanumeric() || x == b'_';
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("fn ").map(|i| i + from) {
        from = at + 3;
        if at > 0 && is_ident(b[at - 1]) {
            continue;
        }
        let name: String =
            code[at + 3..].trim_start().chars().take_while(|&c| c.is_alphanumeric() || c == '_').collect();
        if name.is_empty() {
            continue;
        }
        // The body opens at the first `{` outside parentheses; a `;` first means a declaration without one.
        let mut parens = 0i32;
        let mut open = None;
        for (i, &x) in b.iter().enumerate().skip(at) {
            match x {
                b'(' | b'[' => parens += 1,
                b')' | b']' => parens -= 1,
                b';' if parens == 0 => break,
                b'{' if parens == 0 => {
                    open = Some(i);
                    break;
                }
                _ => {}
            }
        }
        if let Some(open) = open {
            let (first, last) = (line_of(at), line_of(closing_brace(b, open)));
            out.push((name, first, last - first + 1));
        }
    }
    out
}

#[test]
fn the_function_measure_skips_literals_comments_and_test_modules() {
    let src = "//! doc\nfn a() {\n    let s = \"}\";\n    let c = '{';\n    // }\n    let r = r#\"{\"#;\n}\n\
               fn b<'x>(v: &'x str) -> impl Fn() + 'x { move || { let _ = v; } }\n\
               trait T { fn c(&self); }\n\
               #[cfg(test)]\nmod tests {\n    fn d() {\n    }\n}\n";
    assert_eq!(function_lengths(src), [("a".to_string(), 2, 6), ("b".to_string(), 8, 1)]);
}

/// The files of the modules that `file` declares `#[cfg(test)] mod name;`: test code wherever it is named.
fn test_module_files(file: &Path, text: &str) -> Vec<PathBuf> {
    let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let parent = file.parent().unwrap_or(Path::new("."));
    let children = if ["mod", "lib", "main"].contains(&stem) { parent.to_path_buf() } else { parent.join(stem) };
    let mut out = Vec::new();
    let mut cfg_test = false;
    for line in text.lines().map(str::trim) {
        if line == "#[cfg(test)]" {
            cfg_test = true;
            continue;
        }
        if cfg_test {
            let decl = line.trim_start_matches("pub(crate) ").trim_start_matches("pub ");
            if let Some(name) = decl.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
                out.push(children.join(format!("{name}.rs")));
                out.push(children.join(name).join("mod.rs"));
            }
        }
        cfg_test = cfg_test && line.starts_with("#[");
    }
    out
}

/// Longest line of a Rust file, in characters (the repo's rustfmt `max_width`, which rustfmt cannot keep inside
/// string literals, comments and macro bodies). A line holding a raw string literal may cross it: JSON bodies and
/// shell scripts in tests read better whole; a normal string is split with a `\` continuation.
const MAX_LINE_CHARS: usize = 120;

#[test]
fn no_line_is_longer_than_the_limit_but_in_a_raw_string() {
    const RAW: char = '\u{1}';
    let root = root();
    let mut long = Vec::new();
    for file in rust_files(&root.join("crates")) {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let marked = blank_literals(&text, RAW);
        let rel = file.strip_prefix(&root).unwrap_or(&file).display().to_string();
        for (n, (line, m)) in text.lines().zip(marked.lines()).enumerate() {
            if line.chars().count() > MAX_LINE_CHARS && !m.contains(RAW) {
                long.push(format!("{rel}:{}: {} characters", n + 1, line.chars().count()));
            }
        }
    }
    assert!(
        long.is_empty(),
        "{} lines are over {MAX_LINE_CHARS} characters; wrap the comment, split the string with a `\\` \
         continuation, or break the macro's arguments:\n{}",
        long.len(),
        long.join("\n")
    );
}

#[test]
fn the_line_measure_lets_only_raw_strings_cross_the_limit() {
    let long = "x".repeat(130);
    let cases = [(format!("let a = r#\"{long}\"#;"), true), (format!("let a = \"{long}\";"), false)];
    for (line, allowed) in cases {
        assert_eq!(blank_literals(&line, '\u{1}').contains('\u{1}'), allowed, "{line}");
    }
}

#[test]
fn no_shipped_function_is_longer_than_the_limit() {
    let root = root();
    let files = rust_files(&root.join("crates"));
    let test_modules: Vec<PathBuf> =
        files.iter().flat_map(|f| test_module_files(f, &std::fs::read_to_string(f).unwrap_or_default())).collect();
    let mut long = Vec::new();
    for file in files.into_iter().filter(|p| !is_test_file(p) && !test_modules.contains(p)) {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let rel = file.strip_prefix(&root).unwrap_or(&file).display().to_string();
        for (name, line, lines) in function_lengths(&text) {
            if lines > MAX_FN_LINES {
                long.push(format!("{rel}:{line}: fn {name} is {lines} lines"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "{} shipped functions are over {MAX_FN_LINES} lines; split each into named parts:\n{}",
        long.len(),
        long.join("\n")
    );
}

/// The crates whose root is a facade: their modules are internal and the crate root re-exports what other
/// crates use. Each `pub mod` a facade crate's lib.rs may still declare, with the reason it stays public.
const FACADES: &[(&str, &[(&str, &str)])] = &[
    ("manager", &[("controlapi", "the control API, itself a facade: every write of the Engine API goes through it")]),
    ("agent", &[("testing", "the test doors' fake executor, only with the test-doors feature, used by name in tests")]),
    ("node", &[]),
    ("netplane", &[]),
    (
        "raft",
        &[
            ("encryption", "the at-rest key files (DEK) the node reads, writes and rotates with its KEK"),
            ("grpc", "the Raft transport's services and channel factory, which the node wires into its one server"),
            ("fuzz_hooks", "the private decoders the fuzz targets drive (hidden from the docs; not an API)"),
        ],
    ),
];

/// The modules `lib` declares `pub mod` (at any indentation, whatever attributes precede them).
fn public_modules(lib: &str) -> Vec<String> {
    lib.lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|rest| rest.trim_end_matches(|c: char| c == ';' || c == '{' || c.is_whitespace()).to_string())
        .collect()
}

#[test]
fn the_module_reader_sees_only_pub_mod() {
    let lib = "pub mod a;\nmod b;\npub(crate) mod c;\n#[cfg(test)]\n    pub mod d {\n";
    assert_eq!(public_modules(lib), ["a", "d"]);
}

#[test]
fn facade_crates_keep_their_modules_internal() {
    let root = root();
    let mut broken = Vec::new();
    for (krate, allowed) in FACADES {
        let path = root.join("crates").join(krate).join("src/lib.rs");
        let lib = std::fs::read_to_string(&path).expect("lib.rs");
        let public = public_modules(&lib);
        for m in &public {
            if !allowed.iter().any(|(name, _)| name == m) {
                broken.push(format!(
                    "crates/{krate}/src/lib.rs: `pub mod {m}`: make it `mod {m};` and re-export from the crate root \
                     what other crates use (or list it in FACADES with the reason it is public)"
                ));
            }
        }
        for (name, _) in *allowed {
            if !public.iter().any(|m| m == name) {
                broken.push(format!("FACADES lists crates/{krate}'s `pub mod {name}`, which it no longer declares"));
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}
