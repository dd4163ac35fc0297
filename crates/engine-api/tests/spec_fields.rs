//! Keeps docs/service-spec-fields.md true: every field of Docker's `ServiceSpec`, as the Engine API document
//! (v1.47, in the shared folder beside the checkout) defines it, has exactly one row there, with one of the
//! four treatments; and the treatments agree with what the API does. For each row a service spec is built
//! with that one field set (to a value of its type), decoded as a request body is, and run through the
//! API's checks (the conversion, `json::unsupported`, the control API's validation): a `refused` field must
//! come back with an error that names it (or the refused object it is in), and no other field may be
//! refused by `json::unsupported`.
//!
//! Reads files only: no daemon, no network.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::{json, Value as Json};
use serde_yaml_ng::Value as Yaml;
use shoal_engine_api::json::{decode, unsupported::refuse_unsupported, ServiceSpecJson};

/// The treatments a row may give, in the table's words.
const TREATMENTS: [&str; 4] = ["honoured", "executor", "stored", "refused"];

/// Docker's Engine API document, vendored in the repository (`crates/engine-api/spec/README.md`).
fn engine_api_spec() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("spec/v1.47.yaml");
    assert!(p.exists(), "Docker's Engine API spec is expected at {} (vendored in the repository)", p.display());
    p
}

fn table_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/service-spec-fields.md")
}

/// One field of the spec: its dotted path (`Mounts[].Target`), a value of its type that is not its zero
/// value, and whether it is an object or list of objects whose members have rows of their own.
#[derive(Debug)]
struct SpecField {
    path: String,
    sample: Json,
    has_members: bool,
}

/// Follows `$ref` and merges `allOf` until `schema` is a plain schema.
fn resolve(definitions: &Yaml, schema: &Yaml) -> Yaml {
    if let Some(r) = schema.get("$ref").and_then(Yaml::as_str) {
        let name = r.strip_prefix("#/definitions/").unwrap_or_else(|| panic!("unexpected $ref {r}"));
        let target = definitions.get(name).unwrap_or_else(|| panic!("$ref to a missing definition {name}"));
        return resolve(definitions, target);
    }
    if let Some(parts) = schema.get("allOf").and_then(Yaml::as_sequence) {
        let mut properties = serde_yaml_ng::Mapping::new();
        for part in parts {
            if let Some(props) = resolve(definitions, part).get("properties").and_then(Yaml::as_mapping) {
                properties.extend(props.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
        }
        let mut merged = serde_yaml_ng::Mapping::new();
        merged.insert("type".into(), "object".into());
        merged.insert("properties".into(), Yaml::Mapping(properties));
        return Yaml::Mapping(merged);
    }
    schema.clone()
}

/// The properties of an object schema, in the document's order (empty for maps and scalars).
fn properties(schema: &Yaml) -> Vec<(String, Yaml)> {
    schema
        .get("properties")
        .and_then(Yaml::as_mapping)
        .map(|m| {
            m.iter().map(|(k, v)| (k.as_str().expect("property names are strings").to_string(), v.clone())).collect()
        })
        .unwrap_or_default()
}

/// A value of `schema`'s type that is set (not the zero value, and not "default" for enums that have it).
fn sample(definitions: &Yaml, schema: &Yaml) -> Json {
    let schema = resolve(definitions, schema);
    if let Some(values) = schema.get("enum").and_then(Yaml::as_sequence) {
        let chosen = values.iter().filter_map(Yaml::as_str).find(|v| *v != "default");
        return json!(chosen.expect("an enum with a value other than default"));
    }
    let props = properties(&schema);
    match schema.get("type").and_then(Yaml::as_str) {
        Some("string") => json!("x"),
        Some("integer") => json!(1),
        Some("number") => json!(0.5),
        Some("boolean") => json!(true),
        Some("array") => {
            let items = schema.get("items").expect("an array schema has items");
            json!([sample(definitions, items)])
        }
        _ if !props.is_empty() => {
            let (name, first) = &props[0];
            json!({ name.as_str(): sample(definitions, first) })
        }
        _ if schema.get("additionalProperties").is_some() => json!({"k": "v"}),
        _ => json!({}),
    }
}

/// Every field under `schema`, depth first, with `prefix` before its name.
fn walk(definitions: &Yaml, schema: &Yaml, prefix: &str, out: &mut Vec<SpecField>) {
    for (name, field) in properties(&resolve(definitions, schema)) {
        let field = resolve(definitions, &field);
        let is_array = field.get("type").and_then(Yaml::as_str) == Some("array");
        let (path, members) = if is_array {
            let items = resolve(definitions, field.get("items").expect("an array schema has items"));
            (format!("{prefix}{name}[]"), items)
        } else {
            (format!("{prefix}{name}"), field.clone())
        };
        let has_members = !properties(&members).is_empty();
        out.push(SpecField { path: path.clone(), sample: sample(definitions, &field), has_members });
        if has_members {
            walk(definitions, &members, &format!("{path}."), out);
        }
    }
}

fn spec_fields() -> Vec<SpecField> {
    let text = std::fs::read_to_string(engine_api_spec()).expect("read the Engine API spec");
    let doc: Yaml = serde_yaml_ng::from_str(&text).expect("the Engine API spec is YAML");
    let definitions = doc.get("definitions").expect("the spec has definitions");
    let service_spec = definitions.get("ServiceSpec").expect("the spec defines ServiceSpec");
    let mut out = Vec::new();
    walk(definitions, service_spec, "", &mut out);
    out
}

/// One row of the table: the field's path, its treatment word and the rest of the treatment column.
#[derive(Debug)]
struct Row {
    line: usize,
    path: String,
    treatment: String,
    detail: String,
}

/// The table's rows (lines `| \`path\` | \`word\`: detail | where |`).
fn table_rows(text: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let Some(rest) = line.strip_prefix("| `") else { continue };
        let cells: Vec<&str> = rest.split(" | ").collect();
        assert!(cells.len() >= 3, "docs/service-spec-fields.md line {}: a row needs field | treatment | where", i + 1);
        let path = cells[0].trim_end_matches('`').to_string();
        let treatment_cell = cells[1].trim();
        let (treatment, detail) =
            treatment_cell.strip_prefix('`').and_then(|t| t.split_once('`')).unwrap_or_else(|| {
                panic!("docs/service-spec-fields.md line {}: the treatment must start with a `word`", i + 1)
            });
        rows.push(Row {
            line: i + 1,
            path,
            treatment: treatment.to_string(),
            detail: detail.trim_start_matches(':').trim().to_string(),
        });
    }
    rows
}

fn rows() -> Vec<Row> {
    let text = std::fs::read_to_string(table_file()).expect("read docs/service-spec-fields.md");
    table_rows(&text)
}

#[test]
fn every_spec_field_has_one_row_with_a_known_treatment() {
    let fields = spec_fields();
    assert!(
        fields.len() > 150,
        "the walk of ServiceSpec found only {} fields: is the spec file complete?",
        fields.len()
    );
    let rows = rows();
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for r in &rows {
        if !seen.insert(r.path.as_str()) {
            problems.push(format!("line {}: `{}` has more than one row", r.line, r.path));
        }
        if !TREATMENTS.contains(&r.treatment.as_str()) {
            problems.push(format!(
                "line {}: `{}` has treatment `{}`; use one of {TREATMENTS:?}",
                r.line, r.path, r.treatment
            ));
        }
        if r.detail.is_empty() {
            problems.push(format!("line {}: `{}` says `{}` without saying how or why", r.line, r.path, r.treatment));
        }
    }
    let in_spec: BTreeSet<&str> = fields.iter().map(|f| f.path.as_str()).collect();
    for f in &fields {
        if !seen.contains(f.path.as_str()) {
            problems.push(format!("the spec's field `{}` has no row: add one saying what Shoal does with it", f.path));
        }
    }
    for r in &rows {
        if !in_spec.contains(r.path.as_str()) {
            problems.push(format!("line {}: `{}` is not a field of the spec's ServiceSpec", r.line, r.path));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/service-spec-fields.md is out of step with the Engine API spec:\n{}",
        problems.join("\n")
    );
}

/// The minimal spec the API accepts, with `value` set at `path` (lists get one member).
fn spec_with(path: &str, value: Json) -> Json {
    let mut doc = json!({"Name": "web", "TaskTemplate": {"ContainerSpec": {"Image": "busybox"}}});
    let segments: Vec<&str> = path.split('.').collect();
    let mut at = &mut doc;
    for (i, seg) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        let (name, is_list) = match seg.strip_suffix("[]") {
            Some(n) => (n, true),
            None => (*seg, false),
        };
        let obj = at.as_object_mut().expect("the path goes through objects");
        if last {
            obj.insert(name.to_string(), value);
            break;
        }
        let next = obj.entry(name.to_string()).or_insert_with(|| if is_list { json!([{}]) } else { json!({}) });
        at = if is_list { &mut next.as_array_mut().expect("a list")[0] } else { next };
    }
    doc
}

/// What the API answers a spec with `field` set: the first error of the conversion, the refusals of
/// `json::unsupported` and the control API's validation (as `POST /services/create` runs them), and
/// separately whether `json::unsupported` alone refuses it.
fn api_answer(field: &SpecField) -> (Result<(), String>, Result<(), String>) {
    let body = spec_with(&field.path, field.sample.clone());
    let spec: ServiceSpecJson = decode(body.to_string().as_bytes())
        .unwrap_or_else(|e| panic!("the spec's field `{}` does not decode ({e}) from {body}", field.path));
    let unsupported = refuse_unsupported(&spec).map_err(|e| e.to_string());
    let whole = spec
        .to_api()
        .map_err(|e| e.to_string())
        .and_then(|api| {
            refuse_unsupported(&spec).map_err(|e| e.to_string())?;
            Ok(api)
        })
        .and_then(|api| shoal_manager::controlapi::validate_service_spec(&api).map_err(|e| e.to_string()));
    (whole, unsupported)
}

#[test]
fn refused_fields_are_refused_by_name_and_no_other_field_is() {
    let fields = spec_fields();
    let rows = rows();
    let treatment: BTreeMap<&str, &str> = rows.iter().map(|r| (r.path.as_str(), r.treatment.as_str())).collect();
    let mut problems = Vec::new();
    for f in &fields {
        let Some(&t) = treatment.get(f.path.as_str()) else { continue };
        let (whole, unsupported) = api_answer(f);
        if t == "refused" {
            // The field, or a refused object it is in, must be named by the error.
            let mut names = vec![last_segment(&f.path)];
            let mut p = f.path.as_str();
            while let Some((parent, _)) = p.rsplit_once('.') {
                if treatment.get(parent) == Some(&"refused") {
                    names.push(last_segment(parent));
                }
                p = parent;
            }
            match whole {
                Ok(()) => problems
                    .push(format!("`{}` is marked refused, but a spec setting it to {} is accepted", f.path, f.sample)),
                Err(e) if !names.iter().any(|n| names_word(&e, n)) => problems.push(format!(
                    "`{}` is marked refused, but the error does not name it (nor {:?}): {e}",
                    f.path, names
                )),
                Err(_) => {}
            }
        } else if !f.has_members {
            // Objects with members are covered by their members' rows.
            if let Err(e) = unsupported {
                problems.push(format!("`{}` is marked {t}, but json/unsupported.rs refuses it: {e}", f.path));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "docs/service-spec-fields.md disagrees with the API's refusals:\n{}",
        problems.join("\n")
    );
}

/// `Mounts[]` -> `Mounts`.
fn last_segment(path: &str) -> &str {
    path.rsplit('.').next().unwrap_or(path).trim_end_matches("[]")
}

/// Whether `message` has `word` not inside a longer name.
fn names_word(message: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    message.match_indices(word).any(|(i, _)| {
        let before = message[..i].chars().next_back();
        let after = message[i + word.len()..].chars().next();
        !before.is_some_and(ident) && !after.is_some_and(ident)
    })
}

#[test]
fn the_table_parser_reads_rows_and_the_walk_follows_refs_and_arrays() {
    let rows = table_rows("| field | treatment | where |\n|---|---|---|\n| `A.B[]` | `stored`: why | `x.rs` |\n");
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].path.as_str(), rows[0].treatment.as_str(), rows[0].detail.as_str()),
        ("A.B[]", "stored", "why")
    );
    let definitions: Yaml = serde_yaml_ng::from_str(
        "Top:\n  properties:\n    L:\n      type: array\n      items:\n        $ref: \
         '#/definitions/Item'\n    M:\n      type: object\n      additionalProperties:\n        type: \
         string\nItem:\n  allOf:\n    - properties:\n        N:\n          type: integer\n",
    )
    .unwrap();
    let mut out = Vec::new();
    walk(&definitions, definitions.get("Top").unwrap(), "", &mut out);
    let paths: Vec<(&str, &Json)> = out.iter().map(|f| (f.path.as_str(), &f.sample)).collect();
    assert_eq!(paths, [("L[]", &json!([{"N": 1}])), ("L[].N", &json!(1)), ("M", &json!({"k": "v"}))]);
    assert_eq!(spec_with("L[].N", json!(1))["L"], json!([{"N": 1}]));
    assert!(names_word("TaskTemplate.ContainerSpec.Mounts[0].BindOptions is not supported yet", "BindOptions"));
    assert!(!names_word("TaskTemplate.PluginSpec", "Plugin"));
}
