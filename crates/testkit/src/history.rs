//! A history of client operations on services and a linearizability checker for it (for the fault tests).
//!
//! Recording: every client operation becomes one `Record`: which client, which key (a service name), what it
//! asked (create with a label value, update the label to a value, delete, read), when it was invoked and when
//! its answer came back (nanoseconds since the history started), and the outcome:
//! - `Outcome::Ok(v)`: the operation took effect (for a read, `v` is what it saw: `None` = no such service);
//! - `Outcome::Fail`: the operation definitely did not take effect (the checker drops it);
//! - `Outcome::Unknown`: no answer or an answer that does not say (timeout, connection lost, 503, 500): it may
//!   have taken effect at any point after its invocation, or never.
//!
//! Model: per key a register holding the service's label value, or nothing (never created, or deleted: the
//! two look the same to every operation). Create is legal only on an absent service, update and delete only on
//! a present one; a read must return the register's value. Keys are independent objects (P-compositionality:
//! a history is linearizable iff each key's sub-history is), so each key is checked on its own.
//!
//! Checking a key is the Wing & Gong search with Lowe's memoization (as in Knossos and Porcupine): build a
//! linearization op by op; an op may come next if it was invoked before every not-yet-linearized `Ok` op
//! completed; memoize (set of linearized ops, register value) pairs already explored. `Ok` ops must all be
//! linearized; `Unknown` ops may be, at any point after their invocation (their completion time is infinite).
//! The search is bounded (`MAX_STATES_PER_KEY`); a history that exceeds the bound is reported as not checked,
//! never as linearizable. Depends on nothing but std.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::Mutex;
use std::time::Instant;

/// Most (linearized set, value) states the search explores for one key before giving up.
pub const MAX_STATES_PER_KEY: usize = 2_000_000;

/// What a client asked for, on one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Create the service with this label value (fails if it exists).
    Create(String),
    /// Set the label of the existing service to this value.
    Update(String),
    /// Remove the existing service.
    Delete,
    /// Read the service's label value.
    Read,
}

/// How an operation ended, as the client saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It took effect; for a read, the value seen (`None`: no such service).
    Ok(Option<String>),
    /// It definitely did not take effect.
    Fail,
    /// It may or may not have taken effect.
    Unknown,
}

/// One client operation.
#[derive(Debug, Clone)]
pub struct Record {
    /// The client (thread) that ran it.
    pub client: usize,
    /// The object it touched (a service name).
    pub key: String,
    /// What it asked.
    pub op: Op,
    /// Nanoseconds since the history started, when the request was sent.
    pub invoke_ns: u64,
    /// Nanoseconds since the history started, when the answer came back (or the client gave up).
    pub complete_ns: u64,
    /// How it ended.
    pub outcome: Outcome,
    /// Free text for failure reports: which manager, the HTTP status or error.
    pub note: String,
}

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{:>9.3} ms .. {:>9.3} ms] client {} {:?} -> {:?} ({})",
            self.invoke_ns as f64 / 1e6,
            self.complete_ns as f64 / 1e6,
            self.client,
            self.op,
            self.outcome,
            self.note
        )
    }
}

/// A history being recorded by several client threads.
#[derive(Debug)]
pub struct History {
    start: Instant,
    records: Mutex<Vec<Record>>,
}

impl Default for History {
    fn default() -> Self {
        History::new()
    }
}

impl History {
    /// An empty history whose clock starts now.
    pub fn new() -> History {
        History { start: Instant::now(), records: Mutex::new(Vec::new()) }
    }

    /// Nanoseconds since the history started.
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Runs `call` as one operation of `client` on `key` and records it with the outcome and note it returns;
    /// the invocation time is taken just before `call`, the completion time just after.
    pub fn run(&self, client: usize, key: &str, op: Op, call: impl FnOnce() -> (Outcome, String)) -> Outcome {
        let invoke_ns = self.now_ns();
        let (outcome, note) = call();
        let complete_ns = self.now_ns();
        self.push(Record { client, key: key.to_string(), op, invoke_ns, complete_ns, outcome: outcome.clone(), note });
        outcome
    }

    /// Adds a finished record.
    pub fn push(&self, r: Record) {
        self.records.lock().expect("history lock").push(r);
    }

    /// Every record so far, in completion order.
    pub fn records(&self) -> Vec<Record> {
        self.records.lock().expect("history lock").clone()
    }
}

/// Counts of a history's operations, for the test's printout.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Keys checked.
    pub keys: usize,
    /// Operations by (kind, outcome): kind is create/update/delete/read, outcome ok/fail/unknown.
    pub counts: BTreeMap<(String, String), usize>,
    /// Most states explored for one key.
    pub max_states: usize,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} keys;", self.keys)?;
        for ((kind, outcome), n) in &self.counts {
            write!(f, " {kind}/{outcome}={n}")?;
        }
        write!(f, "; at most {} search states for a key", self.max_states)
    }
}

/// Why a history is not (known to be) linearizable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The key whose sub-history has no linearization.
    pub key: String,
    /// What went wrong and the key's operations.
    pub report: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "key {}: {}", self.key, self.report)
    }
}

fn kind(op: &Op) -> &'static str {
    match op {
        Op::Create(_) => "create",
        Op::Update(_) => "update",
        Op::Delete => "delete",
        Op::Read => "read",
    }
}

/// Checks that `records` is linearizable for the register model, key by key.
pub fn check(records: &[Record]) -> Result<Summary, Violation> {
    let mut by_key: BTreeMap<&str, Vec<&Record>> = BTreeMap::new();
    let mut summary = Summary::default();
    for r in records {
        let outcome = match r.outcome {
            Outcome::Ok(_) => "ok",
            Outcome::Fail => "fail",
            Outcome::Unknown => "unknown",
        };
        *summary.counts.entry((kind(&r.op).to_string(), outcome.to_string())).or_default() += 1;
        // A failed op took no effect; an unanswered read observed nothing.
        let useful = !matches!((&r.op, &r.outcome), (_, Outcome::Fail) | (Op::Read, Outcome::Unknown));
        if useful {
            by_key.entry(r.key.as_str()).or_default().push(r);
        }
    }
    summary.keys = by_key.len();
    for (key, ops) in by_key {
        let states = check_key(&ops).map_err(|report| Violation { key: key.to_string(), report })?;
        summary.max_states = summary.max_states.max(states);
    }
    Ok(summary)
}

/// One op as the search sees it.
struct SearchOp<'a> {
    rec: &'a Record,
    invoke: u64,
    /// `u64::MAX` for an unknown outcome.
    complete: u64,
    required: bool,
}

/// The register after `op`, if `op` may take effect on `state` with the outcome it had.
fn step(state: &Option<String>, op: &SearchOp<'_>) -> Option<Option<String>> {
    match (&op.rec.op, &op.rec.outcome) {
        (Op::Create(v), _) => state.is_none().then(|| Some(v.clone())),
        (Op::Update(v), _) => state.is_some().then(|| Some(v.clone())),
        (Op::Delete, _) => state.is_some().then_some(None),
        (Op::Read, Outcome::Ok(seen)) => (seen == state).then(|| state.clone()),
        (Op::Read, _) => None,
    }
}

/// Searches for a linearization of one key's ops; returns the number of states explored, or a report.
fn check_key(records: &[&Record]) -> Result<usize, String> {
    let mut ops: Vec<SearchOp<'_>> = records
        .iter()
        .map(|r| {
            let required = matches!(r.outcome, Outcome::Ok(_));
            SearchOp {
                rec: r,
                invoke: r.invoke_ns,
                complete: if required { r.complete_ns } else { u64::MAX },
                required,
            }
        })
        .collect();
    ops.sort_by_key(|o| (o.invoke, o.complete));
    let n = ops.len();
    let words = n.div_ceil(64);
    let required_total = ops.iter().filter(|o| o.required).count();

    let mut seen: HashSet<(Vec<u64>, Option<String>)> = HashSet::new();
    // Depth-first: (linearized set, register value, number of required ops linearized).
    let mut stack: Vec<(Vec<u64>, Option<String>, usize)> = vec![(vec![0; words], None, 0)];
    let mut best: (usize, Vec<u64>) = (0, vec![0; words]);
    while let Some((done, state, required_done)) = stack.pop() {
        if required_done == required_total {
            return Ok(seen.len());
        }
        if !seen.insert((done.clone(), state.clone())) {
            continue;
        }
        if seen.len() > MAX_STATES_PER_KEY {
            return Err(format!(
                "not checked: more than {MAX_STATES_PER_KEY} search states ({n} ops); make the workload less concurrent"
            ));
        }
        if required_done > best.0 {
            best = (required_done, done.clone());
        }
        let is_done = |i: usize| done[i / 64] & (1 << (i % 64)) != 0;
        // Every op not yet linearized must come after the earliest completion among the required ones left.
        let limit =
            (0..n).filter(|&i| !is_done(i) && ops[i].required).map(|i| ops[i].complete).min().unwrap_or(u64::MAX);
        for i in 0..n {
            if is_done(i) {
                continue;
            }
            if ops[i].invoke > limit {
                break; // sorted by invocation: no later op can come next either
            }
            if let Some(next) = step(&state, &ops[i]) {
                let mut d = done.clone();
                d[i / 64] |= 1 << (i % 64);
                stack.push((d, next, required_done + usize::from(ops[i].required)));
            }
        }
    }
    let is_best = |i: usize| best.1[i / 64] & (1 << (i % 64)) != 0;
    let mut report = format!(
        "not linearizable: at most {} of its {} acknowledged ops can be ordered consistently with real time and the \
         register model ({} states explored). Its ops (* = in the longest consistent order found):\n",
        best.0,
        required_total,
        seen.len()
    );
    const SHOWN: usize = 120;
    for (i, o) in ops.iter().enumerate().take(SHOWN) {
        report.push_str(&format!("  {} {}\n", if is_best(i) { "*" } else { " " }, o.rec));
    }
    if n > SHOWN {
        report.push_str(&format!("  ... and {} more\n", n - SHOWN));
    }
    Err(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record of `client` on key "k" over [invoke, complete] milliseconds.
    fn rec(client: usize, op: Op, invoke_ms: u64, complete_ms: u64, outcome: Outcome) -> Record {
        Record {
            client,
            key: "k".into(),
            op,
            invoke_ns: invoke_ms * 1_000_000,
            complete_ns: complete_ms * 1_000_000,
            outcome,
            note: String::new(),
        }
    }

    fn ok() -> Outcome {
        Outcome::Ok(None)
    }

    fn saw(v: Option<&str>) -> Outcome {
        Outcome::Ok(v.map(str::to_string))
    }

    fn create(v: &str) -> Op {
        Op::Create(v.into())
    }

    fn update(v: &str) -> Op {
        Op::Update(v.into())
    }

    /// Checks `history` and expects it to be linearizable (`true`) or not.
    fn check_expect(what: &str, history: Vec<Record>, linearizable: bool) {
        let result = check(&history);
        assert_eq!(result.is_ok(), linearizable, "{what}: {result:?}");
    }

    #[test]
    fn sequential_and_concurrent_histories_that_are_linearizable() {
        check_expect(
            "sequential",
            vec![
                rec(0, Op::Read, 0, 1, saw(None)),
                rec(0, create("a"), 2, 3, ok()),
                rec(1, Op::Read, 4, 5, saw(Some("a"))),
                rec(1, update("b"), 6, 7, ok()),
                rec(0, Op::Read, 8, 9, saw(Some("b"))),
                rec(0, Op::Delete, 10, 11, ok()),
                rec(1, Op::Read, 12, 13, saw(None)),
                rec(1, create("c"), 14, 15, ok()),
            ],
            true,
        );
        // Reads concurrent with an update may see the old value, then the new one.
        check_expect(
            "concurrent",
            vec![
                rec(0, create("a"), 0, 1, ok()),
                rec(1, update("b"), 2, 10, ok()),
                rec(2, Op::Read, 3, 4, saw(Some("a"))),
                rec(0, Op::Read, 5, 6, saw(Some("b"))),
                rec(2, Op::Read, 7, 8, saw(Some("b"))),
            ],
            true,
        );
        // The linearization order is not the invocation order: the update invoked first took effect last.
        check_expect(
            "reordered writes",
            vec![
                rec(0, create("a"), 0, 1, ok()),
                rec(1, update("b"), 2, 20, ok()),
                rec(2, update("c"), 3, 5, ok()),
                rec(0, Op::Read, 6, 7, saw(Some("c"))),
                rec(0, Op::Read, 21, 22, saw(Some("b"))),
            ],
            true,
        );
    }

    #[test]
    fn unknown_ops_may_take_effect_late_or_never_and_failed_ops_never() {
        check_expect(
            "an unknown update seen long after it was given up on",
            vec![
                rec(0, create("a"), 0, 1, ok()),
                rec(1, update("b"), 2, 3, Outcome::Unknown),
                rec(0, Op::Read, 4, 5, saw(Some("a"))),
                rec(0, Op::Read, 50, 51, saw(Some("b"))),
            ],
            true,
        );
        check_expect(
            "an unknown create that never happened",
            vec![rec(1, create("a"), 0, 3, Outcome::Unknown), rec(0, Op::Read, 10, 11, saw(None))],
            true,
        );
        check_expect(
            "an unknown update seen before it was invoked",
            vec![
                rec(0, create("a"), 0, 1, ok()),
                rec(0, Op::Read, 2, 3, saw(Some("b"))),
                rec(1, update("b"), 4, 5, Outcome::Unknown),
            ],
            false,
        );
        check_expect(
            "a failed update that is visible",
            vec![
                rec(0, create("a"), 0, 1, ok()),
                rec(1, update("b"), 2, 3, Outcome::Fail),
                rec(0, Op::Read, 4, 5, saw(Some("b"))),
            ],
            false,
        );
        check_expect(
            "an unknown read observes nothing",
            vec![rec(0, create("a"), 0, 1, ok()), rec(1, Op::Read, 2, 3, Outcome::Unknown)],
            true,
        );
    }

    #[test]
    fn a_stale_read_is_rejected() {
        check_expect(
            "a read after an acknowledged update returns the old value",
            vec![
                rec(0, create("a"), 0, 1, ok()),
                rec(0, update("b"), 2, 3, ok()),
                rec(1, Op::Read, 4, 5, saw(Some("a"))),
            ],
            false,
        );
        check_expect(
            "a read after an acknowledged create says there is no such service",
            vec![rec(0, create("a"), 0, 1, ok()), rec(1, Op::Read, 2, 3, saw(None))],
            false,
        );
    }

    #[test]
    fn a_lost_write_is_rejected() {
        // The final reads (on every manager after the fault healed) show the value from before an
        // acknowledged update.
        check_expect(
            "an acknowledged update missing from the final reads",
            vec![
                rec(0, create("a"), 0, 1, ok()),
                rec(1, update("b"), 2, 3, ok()),
                rec(1, update("c"), 4, 6, Outcome::Unknown),
                rec(100, Op::Read, 10, 11, saw(Some("a"))),
            ],
            false,
        );
        check_expect(
            "an acknowledged create missing",
            vec![rec(0, create("a"), 0, 1, ok()), rec(100, Op::Read, 10, 11, saw(None))],
            false,
        );
        check_expect(
            "two acknowledged creates of the same name without a delete between them",
            vec![rec(0, create("a"), 0, 1, ok()), rec(1, create("b"), 2, 3, ok())],
            false,
        );
    }

    #[test]
    fn a_write_visible_then_gone_is_rejected() {
        check_expect(
            "an update seen by one read, then not by a later one",
            vec![
                rec(0, create("a"), 0, 1, ok()),
                rec(1, update("b"), 2, 30, Outcome::Unknown),
                rec(2, Op::Read, 5, 6, saw(Some("b"))),
                rec(0, Op::Read, 7, 8, saw(Some("a"))),
            ],
            false,
        );
        check_expect(
            "a created service seen, then absent with no delete",
            vec![
                rec(0, create("a"), 0, 10, Outcome::Unknown),
                rec(1, Op::Read, 2, 3, saw(Some("a"))),
                rec(2, Op::Read, 4, 5, saw(None)),
            ],
            false,
        );
    }

    #[test]
    fn keys_are_checked_independently_and_counted() {
        let mut h = vec![rec(0, create("a"), 0, 1, ok()), rec(1, Op::Read, 2, 3, saw(Some("a")))];
        let mut other = rec(2, create("x"), 0, 1, ok());
        other.key = "other".into();
        h.push(other.clone());
        let summary = check(&h).expect("linearizable");
        assert_eq!(summary.keys, 2);
        assert_eq!(summary.counts[&("create".to_string(), "ok".to_string())], 2);
        let mut stale = rec(3, Op::Read, 5, 6, saw(None));
        stale.key = "other".into();
        h.push(stale);
        let v = check(&h).expect_err("the stale read on `other`");
        assert_eq!(v.key, "other");
        assert!(v.report.contains("not linearizable"), "{}", v.report);
    }

    #[test]
    fn a_long_history_with_concurrency_is_checked_quickly() {
        // Three clients, 300 ops each, overlapping in pairs: the memoized search stays small.
        let mut h = vec![rec(0, create("v0"), 0, 1, ok())];
        let mut value = "v0".to_string();
        for i in 1..300u64 {
            let t = i * 10;
            let v = format!("v{i}");
            h.push(rec(0, Op::Update(v.clone()), t, t + 6, ok()));
            h.push(rec(1, Op::Read, t + 1, t + 7, saw(Some(&value))));
            h.push(rec(2, Op::Read, t + 2, t + 8, Outcome::Ok(Some(v.clone()))));
            value = v;
        }
        let summary = check(&h).expect("linearizable");
        assert!(summary.max_states < 100_000, "{summary}");
    }
}
