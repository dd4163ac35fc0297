//! `Changes`: the list of actions a writer builds from a read view and proposes as one atomic write.

use std::sync::Arc;

use crate::object::{Action, ActionKind, StoreObject};

/// An ordered list of actions to propose as one write. Updates carry the version the writer read; the write
/// fails at apply time if any object changed since (compare-and-swap).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Changes {
    actions: Vec<Action>,
}

impl Changes {
    /// An empty list.
    pub fn new() -> Changes {
        Changes::default()
    }

    /// Adds the creation of `obj` (its version is ignored and set at apply time).
    pub fn create<T: StoreObject>(&mut self, obj: T) -> &mut Self {
        self.actions.push(Action { kind: ActionKind::Create, object: T::wrap(Arc::new(obj)) });
        self
    }

    /// Adds an update of `obj`; `obj`'s version must be the one read (it is what the swap compares).
    pub fn update<T: StoreObject>(&mut self, obj: T) -> &mut Self {
        self.actions.push(Action { kind: ActionKind::Update, object: T::wrap(Arc::new(obj)) });
        self
    }

    /// Adds the removal of `obj`.
    pub fn remove<T: StoreObject>(&mut self, obj: Arc<T>) -> &mut Self {
        self.actions.push(Action { kind: ActionKind::Remove, object: T::wrap(obj) });
        self
    }

    /// Number of actions.
    pub fn len(&self) -> usize {
        self.actions.len()
    }

    /// True when there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.actions.is_empty()
    }

    /// The actions, in order.
    pub fn actions(&self) -> &[Action] {
        &self.actions
    }

    /// Takes the actions out.
    pub fn into_actions(self) -> Vec<Action> {
        self.actions
    }
}

impl From<Vec<Action>> for Changes {
    fn from(actions: Vec<Action>) -> Changes {
        Changes { actions }
    }
}
