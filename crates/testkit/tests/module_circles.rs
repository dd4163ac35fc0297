//! No import circle between the top-level modules of any crate (`cargo nextest run -p shoal-testkit --test
//! module_circles`): module `a` uses module `b` when its non-test code names `crate::b` (a path or a
//! `use crate::{..}` group). Test code (files of `#[cfg(test)]` modules and the `#[cfg(test)] mod tests { .. }`
//! block that ends a file) may reach anywhere: a fixture of one subsystem used by another's tests is no
//! dependency of the shipped code. A circle found is printed with its edges; break it by moving what both
//! sides share into a module of its own (docs/design/code-tour.md).
//!
//! The check reads the sources as text (no compiler): a `crate::` path spelled in a string or a macro is
//! counted too, and everything after `//` on a line is taken for a comment.
//!
//! Reads files only; must not depend on any workspace crate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The modules declared `#[cfg(test)]` in a file: their names.
fn test_modules(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut cfg_test = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with("#[cfg(test)]") {
            cfg_test = true;
            continue;
        }
        if cfg_test {
            let decl = line.trim_start_matches("pub(crate) ").trim_start_matches("pub ");
            if let Some(name) = decl.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
                out.insert(name.trim().to_string());
            }
        }
        if !line.starts_with("#[") {
            cfg_test = false;
        }
    }
    out
}

/// A file's text without comments and without a trailing `#[cfg(test)] mod .. { .. }` block.
fn shipped_code(text: &str) -> String {
    let mut keep = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim();
        if t.starts_with("#[cfg(test)]")
            && lines.peek().is_some_and(|n| n.trim_start().starts_with("mod ") && n.trim_end().ends_with('{'))
        {
            break;
        }
        let code = match t.find("//") {
            Some(i) => &t[..i],
            None => t,
        };
        keep.push_str(code);
        keep.push('\n');
    }
    keep
}

/// The top-level modules `code` names through `crate::`.
fn crate_refs(code: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let ident = |s: &str| -> String { s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect() };
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            // The first path segment of each item of the group, at depth 1.
            let (mut depth, mut item_start) = (1, true);
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => item_start = true,
                    c if c.is_whitespace() => {}
                    _ if item_start && depth == 1 => {
                        out.insert(ident(&group[j..]));
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(ident(after));
        }
        rest = after;
    }
    out.retain(|m| modules.contains(m));
    out
}

/// Module -> the modules its shipped code uses, for the crate whose sources are in `src`.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let root = ["lib.rs", "main.rs"].iter().map(|f| src.join(f)).find(|p| p.exists()).unwrap();
    let root_text = std::fs::read_to_string(&root).unwrap();
    let root_tests = test_modules(&root_text);
    let mut files: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for entry in std::fs::read_dir(src).unwrap() {
        let p = entry.unwrap().path();
        let stem = p.file_stem().unwrap().to_string_lossy().to_string();
        if p == root || stem == "bin" || root_tests.contains(&stem) {
            continue;
        }
        let list = files.entry(stem).or_default();
        if p.is_dir() {
            rust_files(&p, list);
        } else if p.extension().is_some_and(|e| e == "rs") {
            list.push(p);
        }
    }
    let modules: BTreeSet<String> = files.keys().cloned().collect();
    let mut graph = BTreeMap::new();
    for (module, paths) in &files {
        // Files of `#[cfg(test)]` submodules, declared in their parent's file.
        let mut skip = BTreeSet::new();
        for p in paths {
            let text = std::fs::read_to_string(p).unwrap();
            let dir = if p.file_name().is_some_and(|n| n == "mod.rs") {
                p.parent().unwrap().to_path_buf()
            } else {
                p.with_extension("")
            };
            for t in test_modules(&text) {
                skip.insert(dir.join(format!("{t}.rs")));
                skip.insert(dir.join(&t).join("mod.rs"));
            }
        }
        let mut uses = BTreeSet::new();
        for p in paths.iter().filter(|p| !skip.contains(*p)) {
            uses.extend(crate_refs(&shipped_code(&std::fs::read_to_string(p).unwrap()), &modules));
        }
        uses.remove(module);
        graph.insert(module.clone(), uses);
    }
    graph
}

/// The circles of a graph: its strongly connected components of more than one module (Tarjan).
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(w: &mut Walk<'a>, v: &'a str) {
        let n = w.index.len();
        w.index.insert(v, n);
        w.low.insert(v, n);
        w.stack.push(v);
        for u in &w.graph[v] {
            if !w.index.contains_key(u.as_str()) {
                visit(w, u);
                let l = w.low[u.as_str()].min(w.low[v]);
                w.low.insert(v, l);
            } else if w.stack.contains(&u.as_str()) {
                let l = w.index[u.as_str()].min(w.low[v]);
                w.low.insert(v, l);
            }
        }
        if w.low[v] == w.index[v] {
            let mut comp = Vec::new();
            while let Some(u) = w.stack.pop() {
                comp.push(u.to_string());
                if u == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                w.out.push(comp);
            }
        }
    }
    let mut w = Walk { graph, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), out: Vec::new() };
    for v in graph.keys() {
        if !w.index.contains_key(v.as_str()) {
            visit(&mut w, v);
        }
    }
    w.out
}

fn crate_sources() -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(crates_dir()).unwrap() {
        let dir = entry.unwrap().path();
        if dir.join("src").is_dir() {
            out.push((dir.file_name().unwrap().to_string_lossy().to_string(), dir.join("src")));
        }
    }
    out.sort();
    out
}

#[test]
fn no_crate_has_an_import_circle_between_its_modules() {
    let mut found = Vec::new();
    for (name, src) in crate_sources() {
        let graph = module_graph(&src);
        for circle in circles(&graph) {
            let edges: Vec<String> = circle
                .iter()
                .map(|m| {
                    let to: Vec<&str> = graph[m].iter().filter(|t| circle.contains(t)).map(String::as_str).collect();
                    format!("{m} -> {}", to.join(", "))
                })
                .collect();
            found.push(format!("{name}: {}", edges.join("; ")));
        }
    }
    assert!(
        found.is_empty(),
        "import circles between modules (move what both sides share into a module of its own):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_circle_check_sees_paths_groups_and_skips_test_code() {
    let modules: BTreeSet<String> = ["a", "b", "c", "d"].iter().map(|s| s.to_string()).collect();
    let code = "use crate::a::X;\nuse crate::{b::{Y, Z}, c};\nfn f() { crate::d::g() }\n";
    assert_eq!(crate_refs(&shipped_code(code), &modules), modules);
    let with_tests = "use crate::a::X; // crate::b\n#[cfg(test)]\nmod tests {\n    use crate::c::Y;\n}\n";
    let refs = crate_refs(&shipped_code(with_tests), &modules);
    assert_eq!(refs, ["a".to_string()].into());
    assert_eq!(
        test_modules("#[cfg(test)]\nmod fixture;\nmod real;\n#[cfg(test)]\n#[allow(x)]\npub(crate) mod t2;\n"),
        ["fixture".to_string(), "t2".to_string()].into()
    );
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_string(), ["b".to_string()].into()),
        ("b".to_string(), ["a".to_string()].into()),
        ("c".to_string(), ["a".to_string()].into()),
    ]
    .into();
    assert_eq!(circles(&graph), vec![vec!["a".to_string(), "b".to_string()]]);
}
