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
};

/// A task's spec, shared among the tasks that have the same one (`Arc`, copy-on-write). Encodes exactly as
/// the `TaskSpec` it holds.
#[derive(Clone, Default)]
pub struct SharedTaskSpec(Arc<TaskSpec>);

impl SharedTaskSpec {
    /// Wraps a spec (not yet shared with anything).
    pub fn new(spec: TaskSpec) -> SharedTaskSpec {
        SharedTaskSpec(Arc::new(spec))
    }

    /// Wraps an already shared spec.
    pub fn from_arc(spec: Arc<TaskSpec>) -> SharedTaskSpec {
        SharedTaskSpec(spec)
    }

    /// The shared spec.
    pub fn arc(&self) -> &Arc<TaskSpec> {
        &self.0
    }

    /// True when both hold the same allocation (not only equal specs).
    pub fn ptr_eq(&self, other: &SharedTaskSpec) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// The spec by value (a copy when shared).
    pub fn into_inner(self) -> TaskSpec {
        Arc::try_unwrap(self.0).unwrap_or_else(|a| (*a).clone())
    }
}

impl std::ops::Deref for SharedTaskSpec {
    type Target = TaskSpec;
    fn deref(&self) -> &TaskSpec {
        &self.0
    }
}

/// Copy-on-write: a write to a shared spec first copies it, so other tasks never see it.
impl std::ops::DerefMut for SharedTaskSpec {
    fn deref_mut(&mut self) -> &mut TaskSpec {
        Arc::make_mut(&mut self.0)
    }
}

impl AsRef<TaskSpec> for SharedTaskSpec {
    fn as_ref(&self) -> &TaskSpec {
        &self.0
    }
}

impl From<TaskSpec> for SharedTaskSpec {
    fn from(spec: TaskSpec) -> SharedTaskSpec {
        SharedTaskSpec::new(spec)
    }
}

impl From<Arc<TaskSpec>> for SharedTaskSpec {
    fn from(spec: Arc<TaskSpec>) -> SharedTaskSpec {
        SharedTaskSpec(spec)
    }
}

impl From<SharedTaskSpec> for TaskSpec {
    fn from(spec: SharedTaskSpec) -> TaskSpec {
        spec.into_inner()
    }
}

impl PartialEq for SharedTaskSpec {
    fn eq(&self, other: &SharedTaskSpec) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || *self.0 == *other.0
    }
}

impl PartialEq<TaskSpec> for SharedTaskSpec {
    fn eq(&self, other: &TaskSpec) -> bool {
        *self.0 == *other
    }
}

impl std::fmt::Debug for SharedTaskSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl Message for SharedTaskSpec {
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
        *self = SharedTaskSpec::default();
    }
}

/// SwarmKit's `Task` (objects.proto), with its spec shared (`SharedTaskSpec`).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Task {
    #[prost(string, tag = "1")]
    pub id: ::prost::alloc::string::String,
    #[prost(message, optional, tag = "2")]
    pub meta: ::core::option::Option<Meta>,
    #[prost(message, optional, tag = "3")]
    pub spec: ::core::option::Option<SharedTaskSpec>,
    #[prost(string, tag = "4")]
    pub service_id: ::prost::alloc::string::String,
    #[prost(uint64, tag = "5")]
    pub slot: u64,
    #[prost(string, tag = "6")]
    pub node_id: ::prost::alloc::string::String,
    #[prost(message, optional, tag = "7")]
    pub annotations: ::core::option::Option<Annotations>,
    #[prost(message, optional, tag = "8")]
    pub service_annotations: ::core::option::Option<Annotations>,
    #[prost(message, optional, tag = "9")]
    pub status: ::core::option::Option<TaskStatus>,
    #[prost(enumeration = "TaskState", tag = "10")]
    pub desired_state: i32,
    #[prost(message, repeated, tag = "11")]
    pub networks: ::prost::alloc::vec::Vec<NetworkAttachment>,
    #[prost(message, optional, tag = "12")]
    pub endpoint: ::core::option::Option<Endpoint>,
    #[prost(message, optional, tag = "13")]
    pub log_driver: ::core::option::Option<Driver>,
    #[prost(message, optional, tag = "14")]
    pub spec_version: ::core::option::Option<Version>,
    #[prost(message, repeated, tag = "15")]
    pub assigned_generic_resources: ::prost::alloc::vec::Vec<GenericResource>,
    #[prost(message, optional, tag = "16")]
    pub job_iteration: ::core::option::Option<Version>,
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
}
