//! The restart supervisor's decisions: whether a task that stopped (or whose node went down) gets a
//! replacement in its slot, and how long the replacement waits before it may run. Pure functions over a
//! task, its slot's history and its `RestartPolicy`; the replicated reconcile applies them.
//!
//! Design: the decision reads only what the store holds (the task, its slot's history, timestamps), never
//! in-memory history, so a new leader reaches the same decision. The replicated reconcile uses the same
//! function to tell a slot whose last task may not be restarted ("finished": left empty) from a slot that
//! is merely missing. Known limit: the reaper may delete a slot's old tasks, so with `max_attempts` above the
//! history retention limit the attempt count only sees the retained tasks.
//!
//! Must not depend on IO, clocks or the store's mutation API.

use shoal_api::restart_policy::RestartCondition;
use shoal_api::{RestartPolicy, Task, TaskSpec, TaskState};

use super::{created_ms, observed_state, status_ms};

/// The restart delay SwarmKit applies when a task spec sets none: 5 seconds.
pub(crate) const DEFAULT_RESTART_DELAY_MS: u64 = 5_000;

/// A restart policy with its defaults applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EffectivePolicy {
    /// When to restart.
    pub condition: RestartCondition,
    /// How long a replacement waits before it may run.
    pub delay_ms: u64,
    /// Most restarts within `window_ms` (0 = unlimited).
    pub max_attempts: u64,
    /// The window restarts are counted in (0 = since the last spec change).
    pub window_ms: u64,
}

impl EffectivePolicy {
    /// The policy of a task spec: condition ANY and a 5 s delay when the spec has no restart policy; a 5 s
    /// delay when the policy sets no delay.
    pub(crate) fn of(spec: Option<&TaskSpec>) -> EffectivePolicy {
        Self::from_policy(spec.and_then(|s| s.restart.as_ref()))
    }

    /// The policy with defaults applied (see `of`).
    pub(crate) fn from_policy(p: Option<&RestartPolicy>) -> EffectivePolicy {
        let ms = |d: Option<&shoal_api::prost_types::Duration>| {
            d.map(|d| u64::try_from(shoal_api::duration_from_proto(d).as_millis()).unwrap_or(u64::MAX))
        };
        match p {
            None => EffectivePolicy {
                condition: RestartCondition::Any,
                delay_ms: DEFAULT_RESTART_DELAY_MS,
                max_attempts: 0,
                window_ms: 0,
            },
            Some(p) => EffectivePolicy {
                condition: p.condition(),
                delay_ms: ms(p.delay.as_ref()).unwrap_or(DEFAULT_RESTART_DELAY_MS),
                max_attempts: p.max_attempts,
                window_ms: ms(p.window.as_ref()).unwrap_or(0),
            },
        }
    }
}

/// The number of restarts already made in `task`'s slot that count against `max_attempts`: the slot's
/// tasks of the same spec version, except the first one (the original), created within the window that
/// ends at `task`'s last status change.
pub(crate) fn restarts_in_window<'a>(
    task: &Task,
    slot_history: impl IntoIterator<Item = &'a Task>,
    policy: &EffectivePolicy,
) -> u64 {
    let mut created: Vec<u64> =
        slot_history.into_iter().filter(|t| t.spec_version == task.spec_version).map(created_ms).collect();
    created.sort_unstable();
    let end = status_ms(task).max(created_ms(task));
    let start = if policy.window_ms == 0 { 0 } else { end.saturating_sub(policy.window_ms) };
    created.iter().skip(1).filter(|&&c| c >= start && c <= end).count() as u64
}

/// True when `task`, which stopped (or whose node went down), should get a replacement in its slot.
/// `slot_history` is every task of the slot (it may include `task`). A task whose observed state is not
/// terminal (its node went down) counts as failed.
pub(crate) fn should_restart<'a>(task: &Task, slot_history: impl IntoIterator<Item = &'a Task>) -> bool {
    let policy = EffectivePolicy::of(task.spec.as_deref());
    let by_condition = match policy.condition {
        RestartCondition::None => false,
        RestartCondition::OnFailure => observed_state(task) != TaskState::Complete,
        RestartCondition::Any => true,
    };
    by_condition && (policy.max_attempts == 0 || restarts_in_window(task, slot_history, &policy) < policy.max_attempts)
}

/// When a replacement created at `created_ms` with this spec may be told to run, seen at `now_ms`
/// (`tasks::wait_end_ms`: a creation stamp from a clock far ahead does not stretch the delay).
pub(crate) fn ready_at_ms(task: &Task, now_ms: u64) -> u64 {
    crate::tasks::wait_end_ms(created_ms(task), EffectivePolicy::of(task.spec.as_deref()).delay_ms, now_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_api::{Meta, TaskStatus, Version};

    fn task(created: u64, state: TaskState, policy: Option<RestartPolicy>, spec_version: u64) -> Task {
        Task {
            id: format!("t{created}"),
            spec: Some(TaskSpec { restart: policy, ..Default::default() }.into()),
            spec_version: Some(Version { index: spec_version }),
            meta: Some(Meta { created_at: Some(shoal_api::timestamp_from_unix_ms(created)), ..Default::default() }),
            status: Some(TaskStatus {
                state: state as i32,
                timestamp: Some(shoal_api::timestamp_from_unix_ms(created + 100)),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn policy(condition: RestartCondition, max_attempts: u64, window_ms: u64) -> Option<RestartPolicy> {
        Some(RestartPolicy {
            condition: condition as i32,
            delay: None,
            max_attempts,
            window: (window_ms > 0).then(|| shoal_api::duration_to_proto(std::time::Duration::from_millis(window_ms))),
        })
    }

    /// One case: the policy, the observed end state of the last task, the creation times of the slot's
    /// tasks (the last one is the task deciding), and the expected decision.
    fn check(p: Option<RestartPolicy>, end: TaskState, created: &[u64], expected: bool) {
        let tasks: Vec<Task> = created.iter().map(|&c| task(c, TaskState::Failed, p, 1)).collect();
        let mut last = tasks.last().unwrap().clone();
        last.status.as_mut().unwrap().set_state(end);
        assert_eq!(should_restart(&last, &tasks), expected, "{p:?} {end:?} {created:?}");
    }

    #[test]
    fn decisions_follow_the_policy() {
        use RestartCondition::*;
        check(Option::None, TaskState::Complete, &[0], true);
        check(policy(Any, 0, 0), TaskState::Complete, &[0], true);
        check(policy(None, 0, 0), TaskState::Failed, &[0], false);
        check(policy(OnFailure, 0, 0), TaskState::Complete, &[0], false);
        check(policy(OnFailure, 0, 0), TaskState::Failed, &[0], true);
        check(policy(OnFailure, 0, 0), TaskState::Running, &[0], true);
        // Two attempts allowed: the original plus two restarts, then no more.
        check(policy(Any, 2, 0), TaskState::Failed, &[0], true);
        check(policy(Any, 2, 0), TaskState::Failed, &[0, 1000], true);
        check(policy(Any, 2, 0), TaskState::Failed, &[0, 1000, 2000], false);
        // With a 10 s window, restarts older than the window do not count.
        check(policy(Any, 2, 10_000), TaskState::Failed, &[0, 1000, 2000], false);
        // The deciding task counts as a restart when it was one: at 21 s, two restarts fall in the window.
        check(policy(Any, 2, 10_000), TaskState::Failed, &[0, 1000, 20_000], true);
        check(policy(Any, 2, 10_000), TaskState::Failed, &[0, 1000, 20_000, 21_000], false);
    }

    #[test]
    fn attempts_reset_on_a_new_spec_version() {
        let p = policy(RestartCondition::Any, 1, 0);
        let old = [task(0, TaskState::Failed, p, 1), task(10, TaskState::Failed, p, 1)];
        let new = task(20, TaskState::Failed, p, 2);
        let all: Vec<&Task> = old.iter().chain(std::iter::once(&new)).collect();
        assert!(should_restart(&new, all));
    }

    #[test]
    fn delay_defaults_to_five_seconds() {
        let t = task(1000, TaskState::Pending, None, 1);
        assert_eq!(ready_at_ms(&t, 1000), 6000);
        let mut p = policy(RestartCondition::Any, 0, 0).unwrap();
        p.delay = Some(shoal_api::duration_to_proto(std::time::Duration::from_millis(250)));
        let t = task(1000, TaskState::Pending, Some(p), 1);
        assert_eq!(ready_at_ms(&t, 1000), 1250);
        // Seen by a manager whose clock is behind the creator's by up to the tolerance: the delay holds;
        // by more: the stamp tells nothing of the time passed, and the delay is over.
        let ahead = task(5000, TaskState::Pending, Some(p), 1);
        assert_eq!(ready_at_ms(&ahead, 5000 - crate::tasks::FUTURE_STAMP_TOLERANCE_MS), 5250);
        assert_eq!(ready_at_ms(&ahead, 3000), 3000);
    }
}
