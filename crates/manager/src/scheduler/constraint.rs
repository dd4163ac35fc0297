//! Placement constraints (`node.labels.zone==east`, `node.role!=manager`, ...): parsing, and matching
//! against a node. The control API validates with `parse`; the scheduler's constraint filter matches.

use shoal_api::{Node, NodeRole};

/// How a constraint compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Operator {
    /// `==`
    Eq,
    /// `!=`
    NotEq,
}

/// One parsed constraint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Constraint {
    /// The key, as written (e.g. `node.labels.zone`); matching is case-insensitive on the fixed keys.
    pub key: String,
    /// The comparison.
    pub op: Operator,
    /// The expected value.
    pub value: String,
}

/// Why a constraint string is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ConstraintError {
    /// No `==` or `!=` in the expression.
    #[error("invalid constraint {0:?}: expected KEY==VALUE or KEY!=VALUE")]
    NoOperator(String),
    /// The key is not one Shoal knows.
    #[error(
        "invalid constraint {0:?}: unknown key {1:?} (use node.id, node.hostname, node.role, node.platform.os, \
             node.platform.arch, node.labels.<name> or engine.labels.<name>)"
    )]
    UnknownKey(String, String),
    /// The key or value is empty.
    #[error("invalid constraint {0:?}: key and value must not be empty")]
    Empty(String),
    /// `node.role` compared with something else than a role.
    #[error("invalid constraint {0:?}: node.role is manager or worker, not {1:?}")]
    BadRole(String, String),
}

/// Parses every constraint, failing on the first bad one.
pub(crate) fn parse(exprs: &[String]) -> Result<Vec<Constraint>, ConstraintError> {
    exprs.iter().map(|e| parse_one(e)).collect()
}

fn parse_one(expr: &str) -> Result<Constraint, ConstraintError> {
    let (key, op, value) = if let Some((k, v)) = expr.split_once("==") {
        (k, Operator::Eq, v)
    } else if let Some((k, v)) = expr.split_once("!=") {
        (k, Operator::NotEq, v)
    } else {
        return Err(ConstraintError::NoOperator(expr.to_string()));
    };
    let (key, value) = (key.trim(), value.trim());
    if key.is_empty() || value.is_empty() {
        return Err(ConstraintError::Empty(expr.to_string()));
    }
    let lower = key.to_ascii_lowercase();
    let known =
        matches!(lower.as_str(), "node.id" | "node.hostname" | "node.role" | "node.platform.os" | "node.platform.arch")
            || (lower.starts_with("node.labels.") && lower.len() > "node.labels.".len())
            || (lower.starts_with("engine.labels.") && lower.len() > "engine.labels.".len());
    if !known {
        return Err(ConstraintError::UnknownKey(expr.to_string(), key.to_string()));
    }
    if lower == "node.role" && !value.eq_ignore_ascii_case("manager") && !value.eq_ignore_ascii_case("worker") {
        return Err(ConstraintError::BadRole(expr.to_string(), value.to_string()));
    }
    Ok(Constraint { key: key.to_string(), op, value: value.to_string() })
}

impl Constraint {
    /// The node's value for this constraint's key, if it has one.
    fn node_value<'a>(&self, node: &'a Node) -> Option<std::borrow::Cow<'a, str>> {
        let lower = self.key.to_ascii_lowercase();
        let desc = node.description.as_ref();
        match lower.as_str() {
            "node.id" => Some(node.id.as_str().into()),
            "node.hostname" => desc.map(|d| d.hostname.as_str().into()),
            "node.role" => Some(match node.role() {
                NodeRole::Manager => "manager".into(),
                NodeRole::Worker => "worker".into(),
            }),
            "node.platform.os" => desc.and_then(|d| d.platform.as_ref()).map(|p| p.os.as_str().into()),
            "node.platform.arch" => desc.and_then(|d| d.platform.as_ref()).map(|p| p.architecture.as_str().into()),
            _ => {
                if let Some(label) = self.key.get("node.labels.".len()..).filter(|_| lower.starts_with("node.labels."))
                {
                    node.spec
                        .as_ref()
                        .and_then(|s| s.annotations.as_ref())
                        .and_then(|a| a.labels.get(label))
                        .map(|v| v.as_str().into())
                } else {
                    let label = &self.key["engine.labels.".len()..];
                    desc.and_then(|d| d.engine.as_ref()).and_then(|e| e.labels.get(label)).map(|v| v.as_str().into())
                }
            }
        }
    }

    /// True when `node` satisfies the constraint. Values compare case-insensitively, except labels'
    /// values which compare exactly. A missing value never equals, and always differs.
    pub(crate) fn matches(&self, node: &Node) -> bool {
        let is_label = self.key.to_ascii_lowercase().contains(".labels.");
        let equal = match self.node_value(node) {
            None => false,
            Some(v) if is_label => v == self.value,
            Some(v) => v.eq_ignore_ascii_case(&self.value),
        };
        match self.op {
            Operator::Eq => equal,
            Operator::NotEq => !equal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_api::{Annotations, NodeDescription, NodeSpec, Platform};

    fn node() -> Node {
        let mut n = Node {
            id: "n1".into(),
            spec: Some(NodeSpec {
                annotations: Some(Annotations {
                    labels: [("zone".to_string(), "east".to_string())].into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            description: Some(NodeDescription {
                hostname: "box1".into(),
                platform: Some(Platform { architecture: "x86_64".into(), os: "linux".into() }),
                ..Default::default()
            }),
            ..Default::default()
        };
        n.set_role(NodeRole::Manager);
        n
    }

    fn check(expr: &str, expected: bool) {
        let c = parse(&[expr.to_string()]).unwrap();
        assert_eq!(c[0].matches(&node()), expected, "{expr}");
    }

    #[test]
    fn matches_each_key() {
        check("node.id==n1", true);
        check("node.hostname==box1", true);
        check("node.hostname!=box1", false);
        check("node.role==manager", true);
        check("node.role==worker", false);
        check("node.platform.os==linux", true);
        check("node.platform.arch!=aarch64", true);
        check("node.labels.zone==east", true);
        check("node.labels.zone==East", false);
        check("node.labels.rack==1", false);
        check("node.labels.rack!=1", true);
        check("engine.labels.x==y", false);
    }

    #[test]
    fn rejects_bad_expressions() {
        assert!(matches!(parse(&["node.role=manager".into()]), Err(ConstraintError::NoOperator(_))));
        assert!(matches!(parse(&["node.color==red".into()]), Err(ConstraintError::UnknownKey(..))));
        assert!(matches!(parse(&["node.labels.==x".into()]), Err(ConstraintError::UnknownKey(..))));
        assert!(matches!(parse(&["node.role==".into()]), Err(ConstraintError::Empty(_))));
        assert!(matches!(parse(&["node.role==boss".into()]), Err(ConstraintError::BadRole(..))));
        assert!(parse(&["node.role!=Worker".into(), "node.platform.os==linux".into()]).is_ok());
    }
}
