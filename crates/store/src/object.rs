//! The eight object kinds the store holds, behind one trait (`StoreObject`) and one enum (`Object`), and the
//! conversions to and from SwarmKit's `StoreAction` wire form.

use std::sync::Arc;

use shoal_api::{
    store_action, Cluster, Config, Meta, Network, Node, Secret, Service, StoreAction, StoreActionKind, Task, Volume,
};

/// Which table an object lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectKind {
    /// Cluster members (managers and workers).
    Node,
    /// Services: the desired state users write.
    Service,
    /// Tasks: one scheduled instance of a service.
    Task,
    /// The cluster object (one per cluster).
    Cluster,
    /// Secrets: sensitive data that services reference, sent only to nodes whose tasks use them.
    Secret,
    /// Configs: non-sensitive files that services reference.
    Config,
    /// Networks: overlay networks tasks attach to, with their address ranges.
    Network,
    /// Cluster volumes: storage a CSI plugin provides, which services mount with `type=cluster`.
    Volume,
}

impl ObjectKind {
    /// Lower-case name, as used in error messages.
    pub fn name(self) -> &'static str {
        match self {
            ObjectKind::Node => "node",
            ObjectKind::Service => "service",
            ObjectKind::Task => "task",
            ObjectKind::Cluster => "cluster",
            ObjectKind::Secret => "secret",
            ObjectKind::Config => "config",
            ObjectKind::Network => "network",
            ObjectKind::Volume => "volume",
        }
    }
}

/// What every stored object offers the store: an ID, a version in its `Meta`, and an optional unique name.
pub trait StoreObject: Clone + Send + Sync + 'static {
    /// The table this type lives in.
    const KIND: ObjectKind;
    /// The object's ID.
    fn id(&self) -> &str;
    /// The object's metadata, if set.
    fn meta(&self) -> Option<&Meta>;
    /// The object's metadata, created if missing.
    fn meta_mut(&mut self) -> &mut Meta;
    /// The name that must be unique in its table (services, clusters), or `None` where names may repeat.
    fn unique_name(&self) -> Option<&str>;
    /// Wraps a shared reference to this object in the `Object` enum.
    fn wrap(obj: Arc<Self>) -> Object;
    /// The version (Raft index of the object's last write), 0 if never written.
    fn version(&self) -> u64 {
        self.meta().and_then(|m| m.version.as_ref()).map(|v| v.index).unwrap_or(0)
    }
}

/// Implements `StoreObject` for a generated type with `id` and `meta` fields; `$name` extracts the unique name.
macro_rules! store_object {
    ($ty:ident, $kind:ident, $name:expr) => {
        impl StoreObject for $ty {
            const KIND: ObjectKind = ObjectKind::$kind;
            fn id(&self) -> &str {
                &self.id
            }
            fn meta(&self) -> Option<&Meta> {
                self.meta.as_ref()
            }
            fn meta_mut(&mut self) -> &mut Meta {
                self.meta.get_or_insert_with(Meta::default)
            }
            fn unique_name(&self) -> Option<&str> {
                let name: fn(&$ty) -> Option<&str> = $name;
                name(self)
            }
            fn wrap(obj: Arc<Self>) -> Object {
                Object::$kind(obj)
            }
        }
    };
}

store_object!(Node, Node, |_| None);
store_object!(Task, Task, |_| None);
store_object!(Service, Service, |s| s.spec.as_ref().and_then(|s| s.annotations.as_ref()).map(|a| a.name.as_str()));
store_object!(Cluster, Cluster, |c| c.spec.as_ref().and_then(|s| s.annotations.as_ref()).map(|a| a.name.as_str()));
store_object!(Secret, Secret, |c| c.spec.as_ref().and_then(|s| s.annotations.as_ref()).map(|a| a.name.as_str()));
store_object!(Config, Config, |c| c.spec.as_ref().and_then(|s| s.annotations.as_ref()).map(|a| a.name.as_str()));
store_object!(Network, Network, |c| c.spec.as_ref().and_then(|s| s.annotations.as_ref()).map(|a| a.name.as_str()));
store_object!(Volume, Volume, |c| c.spec.as_ref().and_then(|s| s.annotations.as_ref()).map(|a| a.name.as_str()));

/// A stored object of any kind, shared.
#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    /// A node.
    Node(Arc<Node>),
    /// A service.
    Service(Arc<Service>),
    /// A task.
    Task(Arc<Task>),
    /// The cluster object.
    Cluster(Arc<Cluster>),
    /// A secret.
    Secret(Arc<Secret>),
    /// A config.
    Config(Arc<Config>),
    /// A network.
    Network(Arc<Network>),
    /// A cluster volume.
    Volume(Arc<Volume>),
}

impl Object {
    /// The object's kind.
    pub fn kind(&self) -> ObjectKind {
        match self {
            Object::Node(_) => ObjectKind::Node,
            Object::Service(_) => ObjectKind::Service,
            Object::Task(_) => ObjectKind::Task,
            Object::Cluster(_) => ObjectKind::Cluster,
            Object::Secret(_) => ObjectKind::Secret,
            Object::Config(_) => ObjectKind::Config,
            Object::Network(_) => ObjectKind::Network,
            Object::Volume(_) => ObjectKind::Volume,
        }
    }

    /// The object's ID.
    pub fn id(&self) -> &str {
        match self {
            Object::Node(o) => &o.id,
            Object::Service(o) => &o.id,
            Object::Task(o) => &o.id,
            Object::Cluster(o) => &o.id,
            Object::Secret(o) => &o.id,
            Object::Config(o) => &o.id,
            Object::Network(o) => &o.id,
            Object::Volume(o) => &o.id,
        }
    }

    /// The object's version.
    pub fn version(&self) -> u64 {
        match self {
            Object::Node(o) => o.version(),
            Object::Service(o) => o.version(),
            Object::Task(o) => o.version(),
            Object::Cluster(o) => o.version(),
            Object::Secret(o) => o.version(),
            Object::Config(o) => o.version(),
            Object::Network(o) => o.version(),
            Object::Volume(o) => o.version(),
        }
    }

    /// Converts a wire action target to an object.
    pub fn from_target(t: store_action::Target) -> Object {
        match t {
            store_action::Target::Node(o) => Object::Node(Arc::new(o)),
            store_action::Target::Service(o) => Object::Service(Arc::new(o)),
            store_action::Target::Task(o) => Object::Task(Arc::new(o)),
            store_action::Target::Cluster(o) => Object::Cluster(Arc::new(o)),
            store_action::Target::Secret(o) => Object::Secret(Arc::new(o)),
            store_action::Target::Config(o) => Object::Config(Arc::new(o)),
            store_action::Target::Network(o) => Object::Network(Arc::new(o)),
            store_action::Target::Volume(o) => Object::Volume(Arc::new(o)),
        }
    }

    /// The object's protobuf encoding size in bytes (without cloning it).
    pub fn encoded_len(&self) -> usize {
        use shoal_api::prost::Message;
        match self {
            Object::Node(o) => o.encoded_len(),
            Object::Service(o) => o.encoded_len(),
            Object::Task(o) => o.encoded_len(),
            Object::Cluster(o) => o.encoded_len(),
            Object::Secret(o) => o.encoded_len(),
            Object::Config(o) => o.encoded_len(),
            Object::Network(o) => o.encoded_len(),
            Object::Volume(o) => o.encoded_len(),
        }
    }

    /// Converts the object to a wire action target (clones the object).
    pub fn to_target(&self) -> store_action::Target {
        match self {
            Object::Node(o) => store_action::Target::Node((**o).clone()),
            Object::Service(o) => store_action::Target::Service((**o).clone()),
            Object::Task(o) => store_action::Target::Task((**o).clone()),
            Object::Cluster(o) => store_action::Target::Cluster((**o).clone()),
            Object::Secret(o) => store_action::Target::Secret((**o).clone()),
            Object::Config(o) => store_action::Target::Config((**o).clone()),
            Object::Network(o) => store_action::Target::Network((**o).clone()),
            Object::Volume(o) => store_action::Target::Volume((**o).clone()),
        }
    }
}

/// What a write does to one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActionKind {
    /// Insert a new object; its ID (and unique name) must be free.
    Create,
    /// Replace an object; the given object's version must equal the stored one (compare-and-swap).
    Update,
    /// Delete an object by ID.
    Remove,
}

/// Upper bound of what an action's wrapping adds to its object's encoding in a write: the action's kind and
/// the tags and length varints of the action and its target.
pub const ACTION_OVERHEAD_BYTES: usize = 32;

/// One change in a write: what to do and the object it applies to.
#[derive(Clone, Debug, PartialEq)]
pub struct Action {
    /// Create, update or remove.
    pub kind: ActionKind,
    /// The object (for a remove, only its kind and ID matter).
    pub object: Object,
}

impl Action {
    /// Bytes this action adds to an encoded write, at most: the object's encoding plus the tags and length
    /// prefixes around it (`ACTION_OVERHEAD_BYTES`). Writers use it to keep a write under the proposal limit.
    pub fn encoded_len(&self) -> usize {
        self.object.encoded_len() + ACTION_OVERHEAD_BYTES
    }

    /// Encodes to SwarmKit's wire form.
    pub fn to_wire(&self) -> StoreAction {
        let kind = match self.kind {
            ActionKind::Create => StoreActionKind::StoreActionCreate,
            ActionKind::Update => StoreActionKind::StoreActionUpdate,
            ActionKind::Remove => StoreActionKind::StoreActionRemove,
        };
        StoreAction { action: kind as i32, target: Some(self.object.to_target()) }
    }

    /// Decodes from SwarmKit's wire form; `None` for an action with no target or an unknown kind.
    pub fn from_wire(a: StoreAction) -> Option<Action> {
        let kind = match StoreActionKind::try_from(a.action).ok()? {
            StoreActionKind::StoreActionCreate => ActionKind::Create,
            StoreActionKind::StoreActionUpdate => ActionKind::Update,
            StoreActionKind::StoreActionRemove => ActionKind::Remove,
            StoreActionKind::Unknown => return None,
        };
        Some(Action { kind, object: Object::from_target(a.target?) })
    }
}
