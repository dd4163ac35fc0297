//! The managers this agent knows, and which one to try next. Sans IO apart from `load` and `save`: the list
//! starts from what the node gives (the manager it joined through, the list saved by an earlier run), is
//! replaced by the list every session message carries (the dispatcher lists every reachable manager), and
//! moves on to the next manager when a session with the current one fails. A manager that is not the
//! leader names the leader in its refusal; the agent goes there (`redirected`). `failed` says when a whole
//! round has failed (as many failures as known managers since the last session opened): the agent backs
//! off between rounds, and tries the next manager after a short pause within one.
//!
//! Addresses are kept as `host:port` (no scheme); the agent adds its scheme when it connects. The node saves
//! the list in its state dir (`MANAGERS_FILE`) so a restarted worker whose join manager is gone still finds
//! the cluster.
//!
//! Bound: at most `MAX_MANAGERS` addresses (a longer list from a manager is cut, keeping the current one).
//! Must not depend on gRPC transport details or the store.

use std::path::Path;

use shoal_api::WeightedPeer;

/// The file (in the node's state dir) that keeps the last manager list.
pub const MANAGERS_FILE: &str = "managers.json";
/// Most managers remembered.
pub(crate) const MAX_MANAGERS: usize = 64;

/// `addr` without a URI scheme or trailing slash: `https://10.0.0.1:4242/` -> `10.0.0.1:4242`.
pub(crate) fn host_port(addr: &str) -> &str {
    let rest = addr.split_once("://").map_or(addr, |(_, r)| r);
    rest.trim_end_matches('/')
}

/// The known managers and the one in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remotes {
    addrs: Vec<String>,
    current: usize,
    /// Failures since the last session opened (or the last full round).
    failures: usize,
}

impl Remotes {
    /// The managers in `seed` order (duplicates and empty addresses dropped); the first is tried first.
    pub fn new<S: AsRef<str>>(seed: impl IntoIterator<Item = S>) -> Remotes {
        let mut addrs: Vec<String> = Vec::new();
        for a in seed {
            let a = host_port(a.as_ref());
            if !a.is_empty() && !addrs.iter().any(|x| x == a) && addrs.len() < MAX_MANAGERS {
                addrs.push(a.to_string());
            }
        }
        Remotes { addrs, current: 0, failures: 0 }
    }

    /// The manager to talk to next; `None` when none is known.
    pub fn current(&self) -> Option<&str> {
        self.addrs.get(self.current).map(String::as_str)
    }

    /// Every known manager, in the order they are tried.
    pub fn addrs(&self) -> &[String] {
        &self.addrs
    }

    /// Takes the list a manager sent (highest weight first, then as sent). An empty list changes nothing.
    /// The manager in use stays current when it is still listed, else the first listed becomes current.
    /// Returns whether the set of managers changed.
    pub fn observe(&mut self, peers: &[WeightedPeer]) -> bool {
        let mut listed: Vec<(i64, &str)> = peers
            .iter()
            .filter_map(|p| Some((p.weight, host_port(&p.peer.as_ref()?.addr))))
            .filter(|(_, a)| !a.is_empty())
            .collect();
        if listed.is_empty() {
            return false;
        }
        listed.sort_by_key(|(w, _)| std::cmp::Reverse(*w));
        let current = self.current().map(str::to_string);
        let mut next = Remotes::new(listed.iter().map(|(_, a)| *a));
        if let Some(cur) = current.as_deref() {
            if let Some(i) = next.addrs.iter().position(|a| a == cur) {
                next.current = i;
            } else if next.addrs.len() >= MAX_MANAGERS && listed.iter().any(|(_, a)| *a == cur) {
                // Cut by the bound but listed: keep it in place of the last one.
                next.addrs[MAX_MANAGERS - 1] = cur.to_string();
                next.current = MAX_MANAGERS - 1;
            }
        }
        let changed = {
            let mut a = self.addrs.clone();
            let mut b = next.addrs.clone();
            a.sort();
            b.sort();
            a != b
        };
        *self = next;
        changed
    }

    /// A session with `addr` failed (or could not be opened): if it is the current manager, the next one
    /// (in list order, wrapping) becomes current. Returns true when this failure completes a round (as
    /// many failures as known managers since the last `opened`): time to back off.
    pub fn failed(&mut self, addr: &str) -> bool {
        if self.current() == Some(host_port(addr)) && !self.addrs.is_empty() {
            self.current = (self.current + 1) % self.addrs.len();
        }
        self.failures += 1;
        if self.failures >= self.addrs.len().max(1) {
            self.failures = 0;
            return true;
        }
        false
    }

    /// A session opened: the next failure starts a new round.
    pub fn opened(&mut self) {
        self.failures = 0;
    }

    /// A manager named `addr` as the leader: it becomes current (added to the list if unknown).
    pub fn redirected(&mut self, addr: &str) {
        let addr = host_port(addr);
        if addr.is_empty() {
            return;
        }
        match self.addrs.iter().position(|a| a == addr) {
            Some(i) => self.current = i,
            None => {
                if self.addrs.len() >= MAX_MANAGERS {
                    self.addrs.pop();
                }
                self.addrs.push(addr.to_string());
                self.current = self.addrs.len() - 1;
            }
        }
    }
}

/// Reads a manager list saved by `save`; `Ok(empty)` when the file does not exist. A corrupted file is an
/// error naming the file.
pub fn load(path: &Path) -> Result<Vec<String>, String> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let corrupted =
        |why: String| format!("{} is corrupted ({why}); delete it to start from the join address", path.display());
    let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| corrupted(e.to_string()))?;
    let list = v.get("managers").and_then(|m| m.as_array()).ok_or_else(|| corrupted("no \"managers\" array".into()))?;
    list.iter()
        .take(MAX_MANAGERS)
        .map(|a| a.as_str().map(str::to_string).ok_or_else(|| corrupted("a manager address is not a string".into())))
        .collect()
}

/// Saves `addrs` to `path` atomically (a temporary file, fsync'd, renamed over the old one).
pub fn save(path: &Path, addrs: &[String]) -> std::io::Result<()> {
    use std::io::Write;
    let body = serde_json::json!({ "managers": addrs });
    let tmp = path.with_extension("json.tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(body.to_string().as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        // The rename itself is durable once the directory is synced.
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_api::Peer;

    fn peers(list: &[(&str, i64)]) -> Vec<WeightedPeer> {
        list.iter()
            .map(|(a, w)| WeightedPeer { peer: Some(Peer { node_id: String::new(), addr: a.to_string() }), weight: *w })
            .collect()
    }

    #[test]
    fn starts_from_the_seed_without_schemes_or_duplicates() {
        let r = Remotes::new(["https://10.0.0.1:4242/", "10.0.0.2:4242", "http://10.0.0.1:4242", ""]);
        assert_eq!(r.addrs(), ["10.0.0.1:4242", "10.0.0.2:4242"]);
        assert_eq!(r.current(), Some("10.0.0.1:4242"));
        assert_eq!(Remotes::new(Vec::<String>::new()).current(), None);
    }

    #[test]
    fn a_failed_manager_passes_the_turn_to_the_next_wrapping_around() {
        let mut r = Remotes::new(["a:1", "b:1", "c:1"]);
        assert!(!r.failed("https://a:1"));
        assert_eq!(r.current(), Some("b:1"));
        // A failure of a manager that is not current (a stale redirect) moves nothing, but counts.
        assert!(!r.failed("c:1"));
        assert_eq!(r.current(), Some("b:1"));
        assert!(r.failed("b:1"), "three failures with three managers: a round");
        assert_eq!(r.current(), Some("c:1"));
        assert!(!r.failed("c:1"));
        assert_eq!(r.current(), Some("a:1"));
        // A session opened: a new round starts.
        r.opened();
        assert!(!r.failed("a:1"));
        assert!(!r.failed("b:1"));
        assert!(r.failed("c:1"));
        // One manager: every failure is a round.
        let mut one = Remotes::new(["a:1"]);
        assert!(one.failed("a:1"));
        assert_eq!(one.current(), Some("a:1"));
    }

    #[test]
    fn a_session_message_replaces_the_list_and_keeps_the_current_manager() {
        let mut r = Remotes::new(["b:1"]);
        assert!(r.observe(&peers(&[("a:1", 10), ("b:1", 10), ("c:1", 10)])));
        assert_eq!(r.addrs(), ["a:1", "b:1", "c:1"]);
        assert_eq!(r.current(), Some("b:1"), "the manager in use stays current");
        // Same set: no change to report; an empty list (an old manager) changes nothing.
        assert!(!r.observe(&peers(&[("c:1", 10), ("a:1", 10), ("b:1", 10)])));
        assert!(!r.observe(&[]));
        assert_eq!(r.addrs().len(), 3);
        // The current manager left the list: the first listed, highest weight first, is next.
        assert!(r.observe(&peers(&[("c:1", 1), ("d:1", 10)])));
        assert_eq!(r.addrs(), ["d:1", "c:1"]);
        assert_eq!(r.current(), Some("d:1"));
    }

    #[test]
    fn a_redirect_makes_the_leader_current() {
        let mut r = Remotes::new(["a:1", "b:1"]);
        r.redirected("b:1");
        assert_eq!(r.current(), Some("b:1"));
        r.redirected("http://z:1");
        assert_eq!(r.addrs(), ["a:1", "b:1", "z:1"]);
        assert_eq!(r.current(), Some("z:1"));
    }

    #[test]
    fn the_list_is_bounded() {
        let many: Vec<String> = (0..200).map(|i| format!("m{i}:1")).collect();
        let mut r = Remotes::new(&many);
        assert_eq!(r.addrs().len(), MAX_MANAGERS);
        r.redirected("m150:1");
        assert_eq!(r.addrs().len(), MAX_MANAGERS);
        assert_eq!(r.current(), Some("m150:1"));
        let listed: Vec<(&str, i64)> = many.iter().map(|a| (a.as_str(), 10)).collect();
        r.observe(&peers(&listed));
        assert_eq!(r.addrs().len(), MAX_MANAGERS);
        assert_eq!(r.current(), Some("m150:1"), "the manager in use is kept even past the bound");
    }

    #[test]
    fn the_saved_list_reads_back_and_bad_files_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(MANAGERS_FILE);
        assert_eq!(load(&p).unwrap(), Vec::<String>::new());
        save(&p, &["a:1".to_string(), "b:1".to_string()]).unwrap();
        assert_eq!(load(&p).unwrap(), ["a:1", "b:1"]);
        std::fs::write(&p, "{not json").unwrap();
        let e = load(&p).unwrap_err();
        assert!(e.contains("managers.json is corrupted"), "{e}");
        std::fs::write(&p, r#"{"managers":[1]}"#).unwrap();
        assert!(load(&p).unwrap_err().contains("not a string"));
    }
}
