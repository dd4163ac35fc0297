//! When a task is "up to date": its spec is what the service's current spec gives it (SwarmKit's
//! `orchestrator.IsTaskDirty`). Only the task spec and the endpoint spec count: a change of the service's
//! name, labels, replica count or update config leaves every task as it is. A task whose spec differs from
//! the service's in its placement constraints alone stays up to date while its node still satisfies the
//! new constraints. The rolling updater replaces dirty tasks; the control API's `_up-to-date` task filter
//! (what the docker CLI follows to draw an update's progress) lists the others.
//!
//! `spec_version` is only a shortcut: a task that carries its service's current `spec_version` was made
//! from the current spec and is up to date; one that carries another may still be (the spec changed in a
//! way that does not reach tasks).
//!
//! Pure functions; must not depend on IO, the store's writes or other subsystems.

use shoal_api::{Node, Service, Task, TaskSpec};

use super::replicated::service_spec_version;
use crate::scheduler::constraint;

/// True when `task` must be replaced to match `service`'s current spec. `node` is the task's node (absent
/// when it has none or it is gone).
pub fn is_task_dirty(service: &Service, task: &Task, node: Option<&Node>) -> bool {
    if task.spec_version.is_some() && task.spec_version == Some(service_spec_version(service)) {
        return false;
    }
    let spec = service.spec.as_ref();
    let wanted = spec.and_then(|s| s.task.as_ref());
    let endpoint_changed =
        task.endpoint.as_ref().is_some_and(|e| e.spec.as_ref() != spec.and_then(|s| s.endpoint.as_ref()));
    if endpoint_changed {
        return true;
    }
    if task.spec.as_deref() == wanted {
        return false;
    }
    placement_only_change_fits(wanted, task, node) != Some(true)
}

/// `None` when the task's spec differs from `wanted` in more than the placement; otherwise whether the
/// task's node satisfies `wanted`'s placement constraints.
fn placement_only_change_fits(wanted: Option<&TaskSpec>, task: &Task, node: Option<&Node>) -> Option<bool> {
    let (wanted, have) = (wanted?, task.spec.as_ref()?);
    if wanted.placement == have.placement {
        return None;
    }
    let mut same_but_placement = have.clone();
    same_but_placement.placement = wanted.placement.clone();
    if &same_but_placement != wanted {
        return None;
    }
    let node = node?;
    let exprs = wanted.placement.as_ref().map(|p| p.constraints.as_slice()).unwrap_or(&[]);
    Some(constraint::parse(exprs).is_ok_and(|cs| cs.iter().all(|c| c.matches(node))))
}

#[cfg(test)]
mod tests {
    use shoal_api::{Placement, Version};

    use super::super::fixture::{node, service, set_image};
    use super::*;

    fn task_of(s: &Service, node_id: &str) -> Task {
        Task {
            id: "t1".into(),
            service_id: s.id.clone(),
            node_id: node_id.into(),
            spec: s.spec.as_ref().and_then(|s| s.task.clone()).map(Into::into),
            spec_version: s.spec_version,
            ..Default::default()
        }
    }

    fn bump(s: &mut Service) {
        s.spec_version = Some(Version { index: s.spec_version.map_or(0, |v| v.index) + 10 });
    }

    fn constrain(s: &mut Service, c: &str) {
        s.spec.as_mut().unwrap().task.as_mut().unwrap().placement =
            Some(Placement { constraints: vec![c.into()], ..Default::default() });
    }

    #[test]
    fn only_task_facing_changes_make_a_task_dirty() {
        let mut n1 = node("n1");
        n1.spec.as_mut().unwrap().annotations.get_or_insert_with(Default::default).labels =
            [("zone".to_string(), "a".to_string())].into();
        let mut s = service("s1", 2);
        let t = task_of(&s, "n1");
        assert!(!is_task_dirty(&s, &t, Some(&n1)), "same spec version");

        // Labels and replicas: a new spec version, the same task spec.
        bump(&mut s);
        s.spec.as_mut().unwrap().annotations.as_mut().unwrap().labels = [("x".to_string(), "y".to_string())].into();
        assert!(!is_task_dirty(&s, &t, Some(&n1)));

        // A constraint the node satisfies: not dirty; one it does not (or no node): dirty.
        let mut fits = s.clone();
        constrain(&mut fits, "node.labels.zone==a");
        assert!(!is_task_dirty(&fits, &t, Some(&n1)));
        assert!(is_task_dirty(&fits, &t, None));
        let mut misses = s.clone();
        constrain(&mut misses, "node.labels.zone==b");
        assert!(is_task_dirty(&misses, &t, Some(&n1)));

        // A constraint together with another change: dirty.
        set_image(fits.spec.as_mut().unwrap(), "busybox:2");
        assert!(is_task_dirty(&fits, &t, Some(&n1)));

        // --force bumps ForceUpdate: dirty.
        let mut forced = s.clone();
        forced.spec.as_mut().unwrap().task.as_mut().unwrap().force_update += 1;
        assert!(is_task_dirty(&forced, &t, Some(&n1)));
    }
}
