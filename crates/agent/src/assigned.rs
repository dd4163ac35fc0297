//! The tasks assigned to this node as the worker last heard them: what the worker publishes and the data
//! plane, the log listener and the attacher follow.
//!
//! Must not depend on any other module of this crate.

use std::collections::HashMap;
use std::sync::Arc;

use shoal_api::Task;

/// The tasks assigned to this node, by ID, as of the last assignments message.
pub(crate) type AssignedTasks = Arc<HashMap<String, Arc<Task>>>;
