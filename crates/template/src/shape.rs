//! The shape of a Go template, read before the template engine sees it: its bodies (the root and each
//! `{{define}}`/`{{block}}`), how deeply each nests its control structures and parentheses, how often each
//! step may run (`{{range}}` multiplies), and which bodies each calls (`{{template}}`, `{{block}}`). From
//! it, `Shape::check` refuses what would take the renderer's stack or memory without bound: a body that
//! calls itself (directly or through others), a template name that is not a literal (it could name any
//! body), nesting or call chains deeper than the limits, and more steps than the limit.
//!
//! The lexing follows gtmpl's (and Go's): `{{`/`}}` delimiters with `- ` trim markers, `/* */` comments,
//! interpreted, raw and character literals (a `}}` inside one is not a delimiter). Pure and iterative: no
//! recursion, so a hostile text cannot overflow the stack here either. Must not depend on the engine.

use std::collections::{BTreeMap, HashMap};

use crate::{Limits, TemplateError};

/// One `{{template}}` (or `{{block}}`) call in a body.
#[derive(Debug, Clone)]
struct Call {
    callee: String,
    /// `{{range}}`s around the call.
    ranges: u32,
    /// Nesting depth at the call (control structures and parentheses).
    depth: u32,
}

/// One body: the root or a named definition (several with one name are merged: the engine keeps one).
#[derive(Debug, Default, Clone)]
struct Body {
    /// Steps (text runs and actions) by the number of `{{range}}`s around them.
    steps_by_ranges: BTreeMap<u32, u64>,
    calls: Vec<Call>,
    /// The deepest nesting in the body.
    max_depth: u32,
}

/// The bodies of a template, by name (the root is "", as the engine names it).
#[derive(Debug, Default)]
pub(crate) struct Shape {
    bodies: HashMap<String, Body>,
}

enum Frame {
    /// `else_chain`: the `{{else if}}`/`{{else with}}`s seen so far (the engine nests each inside the last).
    Control {
        range: bool,
        else_chain: u32,
    },
    Definition {
        outer: String,
        nesting: u32,
        ranges: u32,
    },
}

/// Reads the string literal at the start of `s` (after spaces): `"..."` or `` `...` ``.
fn literal_name(s: &str) -> Option<String> {
    let s = s.trim_start();
    let mut chars = s.chars();
    match chars.next()? {
        '`' => {
            let rest = &s[1..];
            rest.find('`').map(|end| rest[..end].to_string())
        }
        '"' => {
            let mut out = String::new();
            let mut escaped = false;
            for c in chars {
                match (escaped, c) {
                    (true, c) => {
                        out.push(c);
                        escaped = false;
                    }
                    (false, '\\') => escaped = true,
                    (false, '"') => return Some(out),
                    (false, c) => out.push(c),
                }
            }
            None
        }
        _ => None,
    }
}

/// Where the action starting at `start` (just after `{{` and its trim marker) ends: the index of its `}}`
/// (or of ` -}}`), and its deepest parenthesis nesting.
fn action_end(text: &str, start: usize) -> Result<(usize, usize, u32), TemplateError> {
    let bytes = text.as_bytes();
    let mut i = start;
    let mut parens: u32 = 0;
    let mut max_parens: u32 = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'}' if parens == 0 && text[i..].starts_with("}}") => return Ok((i, i + 2, max_parens)),
            b' ' if parens == 0 && text[i..].starts_with(" -}}") => return Ok((i, i + 4, max_parens)),
            b'"' | b'\'' => {
                let quote = bytes[i];
                i += 1;
                while i < bytes.len() && bytes[i] != quote {
                    if bytes[i] == b'\\' {
                        i += 1;
                    }
                    if i < bytes.len() && bytes[i] == b'\n' {
                        return Err(TemplateError::Syntax("unterminated quoted string in an action".into()));
                    }
                    i += 1;
                }
                if i >= bytes.len() {
                    return Err(TemplateError::Syntax("unterminated quoted string in an action".into()));
                }
            }
            b'`' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'`' {
                    i += 1;
                }
                if i >= bytes.len() {
                    return Err(TemplateError::Syntax("unterminated raw string in an action".into()));
                }
            }
            b'(' => {
                parens += 1;
                max_parens = max_parens.max(parens);
            }
            b')' => parens = parens.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    Err(TemplateError::Syntax("unclosed action: a {{ has no }}".into()))
}

impl Shape {
    /// Reads the shape of `text`, refusing nesting deeper than `limits.max_depth` as it goes.
    pub(crate) fn of(text: &str, limits: &Limits) -> Result<Shape, TemplateError> {
        let mut reader = Reader {
            shape: Shape::default(),
            current: String::new(),
            nesting: 0,
            ranges: 0,
            stack: Vec::new(),
            max_depth: limits.max_depth,
        };
        reader.shape.bodies.entry(String::new()).or_default();
        let mut pos = 0;
        loop {
            let Some(open) = text[pos..].find("{{").map(|i| pos + i) else {
                if pos < text.len() {
                    reader.step(reader.nesting);
                }
                break;
            };
            if open > pos {
                reader.step(reader.nesting);
            }
            let mut start = open + 2;
            if text[start..].starts_with("- ") {
                start += 2;
            }
            if text[start..].starts_with("/*") {
                pos = comment_end(text, start)?;
                continue;
            }
            let (end, after, parens) = action_end(text, start)?;
            pos = after;
            let action = text[start..end].trim();
            let word_end = action.find(|c: char| c.is_whitespace() || c == '(').unwrap_or(action.len());
            let (word, rest) = action.split_at(word_end);
            let depth = reader.nesting + parens;
            reader.too_deep(depth)?;
            reader.action(word, rest, depth)?;
        }
        reader.finish()
    }
}

/// Where the end of the comment that opens at `start` (`/*`) leaves the text: after its closing delimiter.
fn comment_end(text: &str, start: usize) -> Result<usize, TemplateError> {
    let Some(close) = text[start + 2..].find("*/").map(|i| start + 2 + i + 2) else {
        return Err(TemplateError::Syntax("unclosed comment".into()));
    };
    if text[close..].starts_with("}}") {
        Ok(close + 2)
    } else if text[close..].starts_with(" -}}") {
        Ok(close + 4)
    } else {
        Err(TemplateError::Syntax("comment ends before the closing delimiter".into()))
    }
}

/// `Shape::of` under way: the shape so far, the body being read, and where in it the reader is.
struct Reader {
    shape: Shape,
    /// The name of the body being read.
    current: String,
    /// Control structures open around the reader in the current body.
    nesting: u32,
    /// `{{range}}`s among them.
    ranges: u32,
    stack: Vec<Frame>,
    /// The deepest nesting allowed (`Limits::max_depth`).
    max_depth: u32,
}

impl Reader {
    /// Counts a step (a text run or an action) of the current body at `depth`.
    fn step(&mut self, depth: u32) {
        let body = self.shape.bodies.entry(self.current.clone()).or_default();
        *body.steps_by_ranges.entry(self.ranges).or_default() += 1;
        body.max_depth = body.max_depth.max(depth);
    }

    fn too_deep(&self, depth: u32) -> Result<(), TemplateError> {
        if depth > self.max_depth {
            return Err(TemplateError::Limit(format!(
                "the template nests its actions (if, range, with, parentheses) more than {} deep",
                self.max_depth
            )));
        }
        Ok(())
    }

    /// Reads the action whose first word is `word` (then `rest`), at `depth`.
    fn action(&mut self, word: &str, rest: &str, depth: u32) -> Result<(), TemplateError> {
        match word {
            "if" | "with" | "range" => {
                self.step(depth);
                let range = word == "range";
                self.stack.push(Frame::Control { range, else_chain: 0 });
                self.nesting += 1;
                self.ranges += u32::from(range);
                self.too_deep(self.nesting)?;
            }
            "end" => match self.stack.pop() {
                None => return Err(TemplateError::Syntax("unexpected {{end}}".into())),
                Some(Frame::Control { range, else_chain }) => {
                    self.nesting -= 1 + else_chain;
                    self.ranges -= u32::from(range);
                }
                Some(Frame::Definition { outer, nesting, ranges }) => {
                    self.current = outer;
                    self.nesting = nesting;
                    self.ranges = ranges;
                }
            },
            "else" if matches!(rest.split_whitespace().next(), Some("if" | "with")) => {
                // `{{else if}}` is an `{{if}}` inside the `{{else}}`: one level deeper, closed by the same end.
                self.step(depth);
                if let Some(Frame::Control { else_chain, .. }) = self.stack.last_mut() {
                    *else_chain += 1;
                    self.nesting += 1;
                    self.too_deep(self.nesting)?;
                }
            }
            "define" | "block" | "template" => self.named(word, rest, depth)?,
            _ => self.step(depth),
        }
        Ok(())
    }

    /// Reads `{{define}}`, `{{block}}` (a call and a definition) or `{{template}}` (a call).
    fn named(&mut self, word: &str, rest: &str, depth: u32) -> Result<(), TemplateError> {
        let callee = literal_name(rest).ok_or_else(|| {
            TemplateError::Limit(format!(
                "{{{{{word}}}}} needs the template's name as a quoted string: a computed name is not \
                 supported (it could name any template)"
            ))
        })?;
        if word != "define" {
            self.step(depth);
            let body = self.shape.bodies.entry(self.current.clone()).or_default();
            body.calls.push(Call { callee: callee.clone(), ranges: self.ranges, depth });
        }
        if word != "template" {
            // The parser nests a definition inside what encloses it.
            self.too_deep(u32::try_from(self.stack.len() + 1).unwrap_or(u32::MAX))?;
            self.stack.push(Frame::Definition {
                outer: std::mem::replace(&mut self.current, callee),
                nesting: self.nesting,
                ranges: self.ranges,
            });
            self.shape.bodies.entry(self.current.clone()).or_default();
            self.nesting = 0;
            self.ranges = 0;
        }
        Ok(())
    }

    /// The shape read, once the text is over: refused when a structure is still open.
    fn finish(self) -> Result<Shape, TemplateError> {
        if let Some(open) = self.stack.last() {
            let what = match open {
                Frame::Control { range: true, .. } => "{{range}}",
                Frame::Control { range: false, .. } => "{{if}} or {{with}}",
                Frame::Definition { .. } => "{{define}} or {{block}}",
            };
            return Err(TemplateError::Syntax(format!("unexpected end of the template: a {what} has no {{{{end}}}}")));
        }
        Ok(self.shape)
    }
}

impl Shape {
    /// Refuses recursion, call chains deeper than the limit, and more steps than the limit when each
    /// `{{range}}` runs `range_len` times. Iterative (an explicit stack), in the bodies' call order.
    pub(crate) fn check(&self, limits: &Limits, range_len: u64) -> Result<(), TemplateError> {
        // Post-order over the call graph from every body; grey = on the current path (a call to a grey
        // body is recursion).
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            Grey,
            Done { steps: u64, depth: u32 },
        }
        let mut marks: HashMap<&str, Mark> = HashMap::new();
        let mut names: Vec<&str> = self.bodies.keys().map(String::as_str).collect();
        names.sort_unstable();
        for root in names {
            if marks.contains_key(root) {
                continue;
            }
            // (body, index of the next call to look at)
            let mut path: Vec<(&str, usize)> = vec![(root, 0)];
            marks.insert(root, Mark::Grey);
            while let Some((name, next)) = path.last_mut() {
                let body = &self.bodies[*name];
                if let Some(call) = body.calls.get(*next) {
                    *next += 1;
                    match marks.get(call.callee.as_str()) {
                        Some(Mark::Grey) => {
                            return Err(TemplateError::Recursion(format!(
                                "template {:?} calls {:?}, which is still being rendered: recursive templates \
                                 are not supported",
                                name, call.callee
                            )))
                        }
                        Some(Mark::Done { .. }) => {}
                        None if self.bodies.contains_key(&call.callee) => {
                            marks.insert(call.callee.as_str(), Mark::Grey);
                            path.push((call.callee.as_str(), 0));
                        }
                        // An undefined template: the engine reports it when rendering.
                        None => {}
                    }
                    continue;
                }
                // Every callee is done: this body's totals.
                let pow = |n: u32| range_len.max(1).saturating_pow(n);
                let mut steps: u64 = body
                    .steps_by_ranges
                    .iter()
                    .fold(0u64, |acc, (r, n)| acc.saturating_add(pow(*r).saturating_mul(*n)));
                let mut depth = body.max_depth;
                for call in &body.calls {
                    if let Some(Mark::Done { steps: s, depth: d }) = marks.get(call.callee.as_str()) {
                        steps = steps.saturating_add(pow(call.ranges).saturating_mul(*s));
                        depth = depth.max(call.depth.saturating_add(1).saturating_add(*d));
                    }
                }
                if depth > limits.max_depth {
                    return Err(TemplateError::Limit(format!(
                        "the template's calls ({{{{template}}}}) and nested actions reach more than {} deep",
                        limits.max_depth
                    )));
                }
                if steps > limits.max_steps {
                    return Err(TemplateError::Limit(format!(
                        "the template would take more than {} steps to render ({{{{template}}}} calls and \
                         {{{{range}}}} loops multiply)",
                        limits.max_steps
                    )));
                }
                let name: &str = name;
                marks.insert(name, Mark::Done { steps, depth });
                path.pop();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str) -> Result<(), TemplateError> {
        let limits = Limits::default();
        Shape::of(text, &limits)?.check(&limits, 3)
    }

    #[test]
    fn refuses_recursion_computed_names_depth_and_exponential_work() {
        for (text, want) in [
            (r#"{{define "a"}}{{template "a"}}{{end}}{{template "a"}}"#, "recursive"),
            (
                r#"{{define "a"}}{{template "b"}}{{end}}{{define "b"}}x{{template "a" .}}{{end}}{{template "a"}}"#,
                "recursive",
            ),
            (r#"{{block "a" .}}{{template "a"}}{{end}}"#, "recursive"),
            (r#"x{{template ""}}"#, "recursive"),
            (r#"{{template (printf "a")}}"#, "computed name"),
            (&"{{if 1}}".repeat(100), "nests"),
            (&format!("{{{{{}1{}}}}}", "(".repeat(100), ")".repeat(100)), "nests"),
        ] {
            let e = check(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
        // Each body calls the previous twice: 2^40 steps.
        let mut exp = String::from(r#"{{define "t0"}}xxxxxxxxxx{{end}}"#);
        for i in 1..40 {
            exp.push_str(&format!(
                r#"{{{{define "t{i}"}}}}{{{{template "t{0}"}}}}{{{{template "t{0}"}}}}{{{{end}}}}"#,
                i - 1
            ));
        }
        exp.push_str(r#"{{template "t39"}}"#);
        assert!(check(&exp).unwrap_err().to_string().contains("steps"), "exponential accepted");
        // Nested ranges multiply by the collections' size.
        let limits = Limits::default();
        let ranges = format!("{}x{}", "{{range .Service.Labels}}".repeat(4), "{{end}}".repeat(4));
        assert!(Shape::of(&ranges, &limits).unwrap().check(&limits, 10).is_ok());
        assert!(Shape::of(&ranges, &limits).unwrap().check(&limits, 100).is_err());
        // A long chain of calls.
        let mut chain = String::from(r#"{{define "c0"}}x{{end}}"#);
        for i in 1..100 {
            chain.push_str(&format!(r#"{{{{define "c{i}"}}}}{{{{template "c{0}"}}}}{{{{end}}}}"#, i - 1));
        }
        chain.push_str(r#"{{template "c99"}}"#);
        assert!(check(&chain).unwrap_err().to_string().contains("deep"));
    }

    #[test]
    fn reads_what_the_engine_reads() {
        for text in [
            "plain",
            r#"{{- /* a comment with }} */ -}} {{ "a }} b" }} {{ `raw }}` }} {{ '}' }}"#,
            r#"{{define "a"}}A{{end}}{{template "a" .}}{{template "a"}}"#,
            r#"{{range $k, $v := .Service.Labels}}{{$k}}={{$v}}{{else}}none{{end}}"#,
            r#"{{if eq .Task.Slot "1"}}one{{else if eq .Task.Slot "2"}}two{{else}}many{{end}}"#,
            r#"{{with .Node}}{{.Hostname}}{{end}}{{block "b" .}}default{{end}}"#,
        ] {
            assert!(check(text).is_ok(), "{text}: {:?}", check(text));
        }
        for (text, want) in [
            ("{{end}}", "unexpected {{end}}"),
            ("{{if 1}}", "has no {{end}}"),
            ("{{ x", "unclosed action"),
            ("{{/* x", "unclosed comment"),
        ] {
            let e = check(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}
