//! `Task`, written by hand rather than generated, so that the tasks of one service version can share one
//! copy of their spec: its `spec` field is a `SharedTaskSpec` (an `Arc<TaskSpec>`, copy-on-write) where
//! prost would hold the `TaskSpec` inline (880 bytes, plus its strings, in every task).
//!
//! The wire form is SwarmKit's `docker.swarmkit.v1.Task`, field for field (the proto file still declares
//! it; `build.rs` maps the type here with `extern_path`), so encodings, snapshots and descriptors are those
//! of the generated type. Reading works as before through `Deref` (`task.spec.as_ref().and_then(|s|
//! s.runtime.as_ref())`); a write through `DerefMut` copies the spec first if another task shares it.
//! The store interns the specs of the tasks it applies (`shoal_store`), so leader and followers share alike.

use std::sync::Arc;

use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType};
use prost::{DecodeError, Message};

use crate::{
    Annotations, Driver, Endpoint, GenericResource, Meta, NetworkAttachment, TaskSpec, TaskState, TaskStatus, Version,
    VolumeAttachment,
};

/// A message shared among the tasks that hold an equal one (`Arc`, copy-on-write): a task's spec, its
/// service's annotations, its service's endpoint. Encodes exactly as the `T` it holds.
#[derive(Default)]
pub struct Shared<T>(Arc<T>);

/// A task's spec, shared among the tasks of one service version.
pub type SharedTaskSpec = Shared<TaskSpec>;

impl<T> Shared<T> {
    /// Wraps a value (not yet shared with anything).
    pub fn new(value: T) -> Shared<T> {
        Shared(Arc::new(value))
    }

    /// Wraps an already shared value.
    pub fn from_arc(value: Arc<T>) -> Shared<T> {
        Shared(value)
    }

    /// The shared value.
    pub fn arc(&self) -> &Arc<T> {
        &self.0
    }

    /// True when both hold the same allocation (not only equal values).
    pub fn ptr_eq(&self, other: &Shared<T>) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl<T: Clone> Shared<T> {
    /// The value itself (a copy when shared).
    pub fn into_inner(self) -> T {
        Arc::try_unwrap(self.0).unwrap_or_else(|a| (*a).clone())
    }
}

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Shared<T> {
        Shared(self.0.clone())
    }
}

impl<T> std::ops::Deref for Shared<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Copy-on-write: a write to a shared value first copies it, so other tasks never see it.
impl<T: Clone> std::ops::DerefMut for Shared<T> {
    fn deref_mut(&mut self) -> &mut T {
        Arc::make_mut(&mut self.0)
    }
}

impl<T> AsRef<T> for Shared<T> {
    fn as_ref(&self) -> &T {
        &self.0
    }
}

impl<T> From<T> for Shared<T> {
    fn from(value: T) -> Shared<T> {
        Shared::new(value)
    }
}

impl<T> From<Arc<T>> for Shared<T> {
    fn from(value: Arc<T>) -> Shared<T> {
        Shared(value)
    }
}

macro_rules! from_shared {
    ($($t:ty),*) => {$(
        impl From<Shared<$t>> for $t {
            fn from(value: Shared<$t>) -> $t {
                value.into_inner()
            }
        }
    )*};
}
from_shared!(TaskSpec, Annotations, Endpoint);

impl<T: PartialEq> PartialEq for Shared<T> {
    fn eq(&self, other: &Shared<T>) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || *self.0 == *other.0
    }
}

impl<T: PartialEq> PartialEq<T> for Shared<T> {
    fn eq(&self, other: &T) -> bool {
        *self.0 == *other
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl<T: Message + Default + Clone> Message for Shared<T> {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        self.0.encode_raw(buf)
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        Arc::make_mut(&mut self.0).merge_field(tag, wire_type, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.0.encoded_len()
    }

    fn clear(&mut self) {
        *self = Shared::default();
    }
}

/// SwarmKit's `Task` (objects.proto), with its spec shared (`SharedTaskSpec`).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Task {
    /// The task's ID.
    #[prost(string, tag = "1")]
    pub id: ::prost::alloc::string::String,
    /// Its version and times in the store.
    #[prost(message, optional, tag = "2")]
    pub meta: ::core::option::Option<Meta>,
    /// What to run: the service's task spec when the task was made (shared with its siblings).
    #[prost(message, optional, tag = "3")]
    pub spec: ::core::option::Option<SharedTaskSpec>,
    /// The service it belongs to (empty for a network attachment task).
    #[prost(string, tag = "4")]
    pub service_id: ::prost::alloc::string::String,
    /// Its slot in a replicated service or job (0 for a global one, whose tasks are per node).
    #[prost(uint64, tag = "5")]
    pub slot: u64,
    /// The node it is assigned to (empty until the scheduler places it).
    #[prost(string, tag = "6")]
    pub node_id: ::prost::alloc::string::String,
    /// Nearly always empty: boxed, so that an absent one costs a pointer.
    #[prost(message, optional, boxed, tag = "7")]
    pub annotations: ::core::option::Option<Box<Annotations>>,
    /// The service's annotations, shared by its tasks (the store interns them as it does the spec).
    #[prost(message, optional, tag = "8")]
    pub service_annotations: ::core::option::Option<Shared<Annotations>>,
    /// What its node last reported (or the manager decided): state, message, times, container.
    #[prost(message, optional, tag = "9")]
    pub status: ::core::option::Option<TaskStatus>,
    /// The state the orchestrators want it in (`TaskState`).
    #[prost(enumeration = "TaskState", tag = "10")]
    pub desired_state: i32,
    /// Its networks, each with the addresses the allocator gave it there.
    #[prost(message, repeated, tag = "11")]
    pub networks: ::prost::alloc::vec::Vec<NetworkAttachment>,
    /// The service's endpoint, shared by its tasks (interned by the store).
    #[prost(message, optional, tag = "12")]
    pub endpoint: ::core::option::Option<Shared<Endpoint>>,
    /// Nearly always empty (set only when the task's driver differs from the cluster's default): boxed.
    #[prost(message, optional, boxed, tag = "13")]
    pub log_driver: ::core::option::Option<Box<Driver>>,
    /// The service spec's version the task was made from.
    #[prost(message, optional, tag = "14")]
    pub spec_version: ::core::option::Option<Version>,
    /// The generic resources the scheduler gave it from its node's.
    #[prost(message, repeated, tag = "15")]
    pub assigned_generic_resources: ::prost::alloc::vec::Vec<GenericResource>,
    /// For a job, the iteration the task runs for.
    #[prost(message, optional, tag = "16")]
    pub job_iteration: ::core::option::Option<Version>,
    /// The cluster volumes the scheduler chose for its `type=cluster` mounts (nearly always none: see
    /// `VolumeAttachments`).
    #[prost(message, repeated, tag = "17")]
    pub volumes: VolumeAttachments,
}

/// A task's volume attachments: a `Vec` that costs one pointer inline while it is empty (nearly every task),
/// so that `Task` keeps its size class. It reads as a `Vec` through `Deref`; a write through `DerefMut`
/// allocates it. prost's generated code for a repeated field takes it through those same derefs, so it
/// encodes exactly as `repeated VolumeAttachment volumes = 17`.
#[derive(Clone, Default)]
#[expect(clippy::box_collection, reason = "the point: one pointer inline instead of a Vec's three words")]
pub struct VolumeAttachments(Option<Box<Vec<VolumeAttachment>>>);

impl PartialEq for VolumeAttachments {
    /// Equal when they hold the same attachments (an empty one allocated or not).
    fn eq(&self, other: &VolumeAttachments) -> bool {
        **self == **other
    }
}

/// What an empty `VolumeAttachments` reads as.
static NO_VOLUME_ATTACHMENTS: Vec<VolumeAttachment> = Vec::new();

impl VolumeAttachments {
    /// Empties it, freeing what it held.
    pub fn clear(&mut self) {
        self.0 = None;
    }
}

impl std::ops::Deref for VolumeAttachments {
    type Target = Vec<VolumeAttachment>;

    fn deref(&self) -> &Vec<VolumeAttachment> {
        self.0.as_deref().unwrap_or(&NO_VOLUME_ATTACHMENTS)
    }
}

impl std::ops::DerefMut for VolumeAttachments {
    fn deref_mut(&mut self) -> &mut Vec<VolumeAttachment> {
        self.0.get_or_insert_with(Default::default)
    }
}

impl std::fmt::Debug for VolumeAttachments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self, f)
    }
}

impl From<Vec<VolumeAttachment>> for VolumeAttachments {
    fn from(v: Vec<VolumeAttachment>) -> VolumeAttachments {
        VolumeAttachments((!v.is_empty()).then(|| Box::new(v)))
    }
}

impl<'a> IntoIterator for &'a VolumeAttachments {
    type Item = &'a VolumeAttachment;
    type IntoIter = std::slice::Iter<'a, VolumeAttachment>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl FromIterator<VolumeAttachment> for VolumeAttachments {
    fn from_iter<I: IntoIterator<Item = VolumeAttachment>>(iter: I) -> VolumeAttachments {
        iter.into_iter().collect::<Vec<_>>().into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hand-written `Task` encodes and decodes as the generated one would: the same bytes for a task with
    /// every field set, a spec shared by two tasks stays shared until one writes to it.
    #[test]
    fn task_round_trips_and_spec_is_copy_on_write() {
        let spec = TaskSpec {
            runtime: Some(crate::task_spec::Runtime::Container(crate::ContainerSpec {
                image: "busybox".into(),
                args: vec!["sleep".into(), "1".into()],
                ..Default::default()
            })),
            ..Default::default()
        };
        let shared = SharedTaskSpec::new(spec.clone());
        let a = Task {
            id: "t1".into(),
            spec: Some(shared.clone()),
            service_id: "s1".into(),
            slot: 3,
            desired_state: crate::TaskState::Running as i32,
            spec_version: Some(Version { index: 7 }),
            ..Default::default()
        };
        let bytes = a.encode_to_vec();
        let b = Task::decode(bytes.as_slice()).expect("decode");
        assert_eq!(a, b);
        assert_eq!(b.desired_state(), crate::TaskState::Running);
        // The spec encodes as the plain `TaskSpec` does (field 3, length-delimited).
        let mut expect = Vec::new();
        prost::encoding::message::encode(3, &spec, &mut expect);
        assert!(bytes.windows(expect.len()).any(|w| w == expect.as_slice()));

        let mut c = a.clone();
        assert!(c.spec.as_ref().expect("spec").ptr_eq(&shared));
        if let Some(crate::task_spec::Runtime::Container(ct)) = &mut c.spec.as_mut().expect("spec").runtime {
            ct.image = "alpine".into();
        }
        assert!(!c.spec.as_ref().expect("spec").ptr_eq(&shared));
        assert_eq!(a.spec.as_deref(), Some(&spec), "the other task's spec is unchanged");
    }

    /// What every task costs inline, whatever it holds: the nearly always empty annotations and log driver
    /// are a pointer each when absent, and the service's annotations and endpoint a pointer to a shared copy.
    #[test]
    fn a_task_is_small_inline() {
        use std::mem::size_of;
        assert_eq!(size_of::<Option<Box<Annotations>>>(), 8);
        assert_eq!(size_of::<Option<Shared<Endpoint>>>(), 8);
        // 432 + the `Arc`'s two counts = 448: mimalloc's 448-byte size class, full (456 took a 512 one). The
        // volume attachments (field 17) cost a pointer: `VolumeAttachments`.
        assert!(size_of::<Task>() <= 432, "Task is {} bytes inline", size_of::<Task>());
    }

    /// The boxed and shared fields encode as the plain messages would (fields 7, 8, 12, 13), and decode back.
    #[test]
    fn boxed_and_shared_fields_keep_the_wire_form() {
        let ann = Annotations {
            name: "web".into(),
            labels: [("k".to_string(), "v".to_string())].into(),
            ..Default::default()
        };
        let ep =
            Endpoint { ports: vec![crate::PortConfig { target_port: 80, ..Default::default() }], ..Default::default() };
        let driver = Driver { name: "json-file".into(), ..Default::default() };
        let t = Task {
            id: "t1".into(),
            annotations: Some(Box::new(ann.clone())),
            service_annotations: Some(ann.clone().into()),
            endpoint: Some(ep.clone().into()),
            log_driver: Some(Box::new(driver.clone())),
            ..Default::default()
        };
        let bytes = t.encode_to_vec();
        let mut expect = Vec::new();
        prost::encoding::string::encode(1, &t.id, &mut expect);
        prost::encoding::message::encode(7, &ann, &mut expect);
        prost::encoding::message::encode(8, &ann, &mut expect);
        prost::encoding::message::encode(12, &ep, &mut expect);
        prost::encoding::message::encode(13, &driver, &mut expect);
        assert_eq!(bytes, expect);
        let back = Task::decode(bytes.as_slice()).expect("decode");
        assert_eq!(back, t);
        assert_eq!(back.service_annotations.as_deref(), Some(&ann));
    }

    /// The volume attachments encode as `repeated VolumeAttachment volumes = 17` would, decode back, and an
    /// empty list allocated by a write compares equal to one never written.
    #[test]
    fn volume_attachments_keep_the_wire_form_and_cost_nothing_when_empty() {
        let a = VolumeAttachment { id: "v1".into(), source: "data".into(), target: "/data".into() };
        let b = VolumeAttachment { id: "v2".into(), source: "group:g".into(), target: "/more".into() };
        let t = Task { id: "t1".into(), volumes: vec![a.clone(), b.clone()].into(), ..Default::default() };
        let bytes = t.encode_to_vec();
        let mut expect = Vec::new();
        prost::encoding::string::encode(1, &t.id, &mut expect);
        prost::encoding::message::encode(17, &a, &mut expect);
        prost::encoding::message::encode(17, &b, &mut expect);
        assert_eq!(bytes, expect);
        let back = Task::decode(bytes.as_slice()).expect("decode");
        assert_eq!(back.volumes.as_slice(), &[a.clone(), b]);
        assert_eq!(back, t);

        let mut empty = Task { id: "t1".into(), ..Default::default() };
        assert!(empty.volumes.is_empty());
        assert!(empty.volumes.iter_mut().next().is_none());
        assert_eq!(empty, Task { id: "t1".into(), ..Default::default() }, "an allocated empty list is still empty");
        empty.volumes.push(a);
        empty.volumes.clear();
        assert_eq!(empty.encode_to_vec(), Task { id: "t1".into(), ..Default::default() }.encode_to_vec());
        assert_eq!(std::mem::size_of::<VolumeAttachments>(), 8);
    }
}
