//! Unit tests of cluster volumes (layer 1: stored objects, no plugin), over the same harness as `tests.rs`.

use shoal_api::{
    mount, task_spec, volume_access_mode, volume_spec, Annotations, CapacityRange, Driver, Mount, SecretSpec, Topology,
    TopologyRequirement, VolumeAccessMode, VolumeSecret, VolumeSpec,
};
use shoal_store::StoreObject;

use super::tests::{cluster, spec};
use super::*;
use crate::limits::{MAX_VOLUME_DRIVER_BYTES, MAX_VOLUME_SECRETS, MAX_VOLUME_SPEC_BYTES, MAX_VOLUME_TOPOLOGIES};
use crate::state::ClusterState;

fn volume_spec(name: &str) -> VolumeSpec {
    VolumeSpec {
        annotations: Some(Annotations { name: name.into(), ..Default::default() }),
        driver: Some(Driver { name: "csi.example".into(), options: [("size".into(), "1G".into())].into() }),
        access_mode: Some(VolumeAccessMode {
            scope: volume_access_mode::Scope::SingleNode as i32,
            sharing: volume_access_mode::Sharing::OneWriter as i32,
            access_type: Some(volume_access_mode::AccessType::Mount(Default::default())),
        }),
        capacity_range: Some(CapacityRange { required_bytes: 1 << 30, limit_bytes: 0 }),
        ..Default::default()
    }
}

fn invalid_message<T: std::fmt::Debug>(r: Result<T, ControlError>) -> String {
    match r {
        Err(ControlError::InvalidArgument(m)) => m,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

/// One bad spec, refused naming `fragment`, and nothing written.
async fn refused(state: &ClusterState, mutate: impl FnOnce(&mut VolumeSpec), fragment: &str) {
    let mut s = volume_spec("bad");
    mutate(&mut s);
    let before = state.store.last_index();
    let m = invalid_message(create_volume(state, s).await);
    assert!(m.contains(fragment), "{m:?} should contain {fragment:?}");
    assert_eq!(state.store.last_index(), before, "nothing is written for {fragment}");
    assert!(state.store.view(|t| t.volumes().by_name("bad").is_none()));
}

#[tokio::test]
async fn specs_are_checked_and_bounded_before_anything_is_written() {
    let (state, _) = cluster();
    refused(&state, |s| s.driver = None, "Driver: a cluster volume needs the name of the CSI plugin").await;
    refused(&state, |s| s.access_mode = None, "AccessMode: a cluster volume needs an access mode").await;
    refused(&state, |s| s.access_mode.as_mut().unwrap().access_type = None, "either MountVolume or BlockVolume").await;
    refused(&state, |s| s.annotations.as_mut().unwrap().name = "no/slash".into(), "invalid volume name").await;
    refused(&state, |s| s.annotations.as_mut().unwrap().name = "x".repeat(65), "invalid volume name").await;
    refused(&state, |s| s.group = "g".repeat(65), "Group: invalid volume group").await;
    refused(
        &state,
        |s| s.driver.as_mut().unwrap().options = [("o".into(), "x".repeat(MAX_VOLUME_DRIVER_BYTES))].into(),
        "DriverOpts: the driver options are",
    )
    .await;
    refused(
        &state,
        |s| {
            s.annotations.as_mut().unwrap().labels = [("l".into(), "x".repeat(64 * 1024))].into();
        },
        "Labels: the volume's labels are",
    )
    .await;
    refused(
        &state,
        |s| {
            s.secrets =
                (0..=MAX_VOLUME_SECRETS).map(|i| VolumeSecret { key: format!("k{i}"), secret: "s".into() }).collect()
        },
        "over the limit of 64 per volume",
    )
    .await;
    refused(
        &state,
        |s| s.secrets = vec![VolumeSecret { key: "k".into(), secret: "s".into() }; 2],
        "key \"k\" is given twice",
    )
    .await;
    let zone = |z: usize| Topology { segments: [("zone".into(), format!("z{z}"))].into() };
    refused(
        &state,
        |s| {
            s.accessibility_requirements = Some(TopologyRequirement {
                requisite: (0..=MAX_VOLUME_TOPOLOGIES).map(zone).collect(),
                ..Default::default()
            })
        },
        "AccessibilityRequirements.Requisite: 65 topologies",
    )
    .await;
    refused(
        &state,
        |s| s.capacity_range = Some(CapacityRange { required_bytes: 10, limit_bytes: 5 }),
        "LimitBytes (5) is less than RequiredBytes (10)",
    )
    .await;
    refused(
        &state,
        |s| s.capacity_range = Some(CapacityRange { required_bytes: -1, limit_bytes: 0 }),
        "must not be negative",
    )
    .await;
    refused(&state, |s| s.availability = 7, "Availability: unknown availability 7").await;
    refused(
        &state,
        |s| {
            s.access_mode = Some(VolumeAccessMode {
                access_type: Some(volume_access_mode::AccessType::Mount(volume_access_mode::MountVolume {
                    fs_type: String::new(),
                    mount_flags: vec!["x".repeat(5000)],
                })),
                ..Default::default()
            })
        },
        "AccessMode.MountVolume: the file system type and mount flags are 5000 bytes",
    )
    .await;
    // A shape no single bound names (many topologies of many segments) still meets the whole spec's bound.
    refused(
        &state,
        |s| {
            let big = |n: usize| Topology {
                segments: (0..60).map(|k| (format!("k{k:02}"), format!("{n}-{}", "v".repeat(60)))).collect(),
            };
            s.accessibility_requirements = Some(TopologyRequirement {
                requisite: (0..MAX_VOLUME_TOPOLOGIES).map(big).collect(),
                preferred: (0..MAX_VOLUME_TOPOLOGIES).map(big).collect(),
            })
        },
        &format!("over the limit of {MAX_VOLUME_SPEC_BYTES} bytes"),
    )
    .await;
    // Secrets must exist, checked in the write.
    refused(
        &state,
        |s| s.secrets = vec![VolumeSecret { key: "password".into(), secret: "nope".into() }],
        "Secrets: secret not found: nope",
    )
    .await;
}

#[tokio::test]
async fn a_volume_is_created_found_listed_updated_and_removed() {
    let (state, _) = cluster();
    create_secret(
        &state,
        SecretSpec {
            annotations: Some(Annotations { name: "pw".into(), ..Default::default() }),
            data: b"x".to_vec(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let mut s = volume_spec("data");
    s.group = "db".into();
    s.secrets = vec![VolumeSecret { key: "password".into(), secret: "pw".into() }];
    let v = create_volume(&state, s.clone()).await.unwrap();
    assert_eq!(v.id.len(), 25);
    assert_eq!(v.version(), 2);
    assert!(v.volume_info.is_none() && v.publish_status.is_empty() && !v.pending_delete, "layer 1 calls no plugin");
    match create_volume(&state, volume_spec("DATA")).await {
        Err(ControlError::AlreadyExists(m)) => assert!(m.contains("volume DATA already exists"), "{m}"),
        other => panic!("{other:?}"),
    }
    let other = create_volume(&state, volume_spec("logs")).await.unwrap();

    assert_eq!(get_volume(&state, "data").unwrap().id, v.id);
    assert_eq!(get_volume(&state, &v.id[..6]).unwrap().id, v.id);
    assert_eq!(find_volume_exact(&state, &v.id).unwrap().id, v.id);
    assert!(find_volume_exact(&state, &v.id[..6]).is_none(), "no prefix match for the relay's question");
    let names = |f: &VolumeFilters| -> Vec<String> {
        list_volumes(&state, f).iter().map(|v| v.unique_name().unwrap().to_string()).collect()
    };
    assert_eq!(names(&VolumeFilters::default()), ["data", "logs"]);
    assert_eq!(names(&VolumeFilters { groups: vec!["db".into()], ..Default::default() }), ["data"]);
    assert_eq!(names(&VolumeFilters { drivers: vec!["other".into()], ..Default::default() }), Vec::<String>::new());
    assert_eq!(names(&VolumeFilters { id_prefixes: vec![other.id.clone()], ..Default::default() }), ["logs"]);

    // Availability and labels change; nothing else does, and the field is named.
    let mut next = s.clone();
    next.availability = volume_spec::VolumeAvailability::Drain as i32;
    next.annotations.as_mut().unwrap().labels = [("tier".into(), "gold".into())].into();
    let updated = update_volume(&state, "data", v.version(), next.clone()).await.unwrap();
    assert_eq!(updated.spec.as_ref().unwrap().availability, volume_spec::VolumeAvailability::Drain as i32);
    assert_eq!(updated.spec.as_ref().unwrap().annotations.as_ref().unwrap().labels["tier"], "gold");
    let stale = update_volume(&state, "data", v.version(), next.clone()).await.unwrap_err();
    assert!(stale.to_string().contains("update out of sequence"), "{stale}");
    let mut bigger = next.clone();
    bigger.capacity_range = Some(CapacityRange { required_bytes: 2 << 30, limit_bytes: 0 });
    let m = invalid_message(update_volume(&state, "data", updated.version(), bigger).await);
    assert!(m.starts_with("CapacityRange: a cluster volume's CapacityRange cannot be updated"), "{m}");
    let mut moved = next.clone();
    moved.group = "other".into();
    assert!(invalid_message(update_volume(&state, "data", updated.version(), moved).await).starts_with("Group:"));

    // A service mounting it (by name, any case, or by ID) holds it; force does not override that.
    let mut svc = spec("db", 1);
    let Some(task_spec::Runtime::Container(c)) = svc.task.as_mut().unwrap().runtime.as_mut() else { unreachable!() };
    c.mounts = vec![Mount {
        r#type: mount::Type::Cluster as i32,
        source: "Data".into(),
        target: "/data".into(),
        ..Default::default()
    }];
    let service = create_service(&state, svc).await.unwrap();
    let m = invalid_message(remove_volume(&state, "data", true).await);
    assert_eq!(m, "volume 'data' is in use by the following service: db");
    assert!(get_volume(&state, "data").is_ok());
    // The secret it names is not held by the volume in layer 1 (the plugin is not called yet), but the other
    // volume goes at once.
    remove_volume(&state, &other.id, false).await.unwrap();
    remove_service(&state, &service.id).await.unwrap();
    remove_volume(&state, "data", false).await.unwrap();
    assert!(matches!(get_volume(&state, "data"), Err(ControlError::NotFound { kind: "volume", .. })));
}

#[tokio::test]
async fn volumes_survive_a_snapshot_and_the_store_refuses_removing_a_mounted_one() {
    let (state, _) = cluster();
    let v = create_volume(&state, volume_spec("data")).await.unwrap();
    let (index, snap) = state.store.snapshot();
    let bytes = shoal_store::encode_snapshot(snap);
    let other = shoal_store::MemoryStore::default();
    other.restore(index, shoal_store::decode_snapshot(&bytes).unwrap());
    assert_eq!(other.view(|t| t.volumes().by_name("data").map(|v| (**v).clone())), Some(v.clone()));

    // The cross-table rule holds in the store too: a removal proposed from a view taken before a service
    // started mounting the volume fails when applied.
    let mut svc = spec("db", 1);
    let Some(task_spec::Runtime::Container(c)) = svc.task.as_mut().unwrap().runtime.as_mut() else { unreachable!() };
    c.mounts = vec![Mount {
        r#type: mount::Type::Cluster as i32,
        source: v.id.clone(),
        target: "/d".into(),
        ..Default::default()
    }];
    create_service(&state, svc).await.unwrap();
    let stored = state.store.view(|t| t.volumes().get(&v.id).cloned()).unwrap();
    let action =
        shoal_store::Action { kind: shoal_store::ActionKind::Remove, object: shoal_store::Object::Volume(stored) };
    let err = state.store.apply(state.store.last_index() + 1, &[action]).unwrap_err();
    assert!(err.to_string().contains("is in use by service db"), "{err}");
}
