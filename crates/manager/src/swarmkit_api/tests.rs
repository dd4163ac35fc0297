//! Unit tests of the SwarmKit API services over a `LocalProposer` store: error codes, filters, and the
//! Watch stream's entries, selectors and versions. The end-to-end tests over the socket are in
//! `crates/shoal/tests/e2e/swarmkit_api.rs`.

use shoal_api::control_server::Control;
use shoal_api::watch_server::Watch;
use shoal_api::*;
use tokio_stream::StreamExt;
use tonic::{Code, Request};

use super::*;
use crate::controlapi::tests::{cluster, spec};

fn entry(kind: &str, action: i32, filters: Vec<select_by::By>) -> watch_request::WatchEntry {
    watch_request::WatchEntry {
        kind: kind.into(),
        action,
        filters: filters.into_iter().map(|b| SelectBy { by: Some(b) }).collect(),
    }
}

const ALL: i32 = 7;

#[tokio::test]
async fn control_errors_carry_swarmkits_codes() {
    let (state, _) = cluster();
    let c = ControlService::new(state);
    let created = c
        .create_service(Request::new(CreateServiceRequest { spec: Some(spec("web", 1)) }))
        .await
        .unwrap()
        .into_inner()
        .service
        .unwrap();
    let code = |r: Result<tonic::Response<CreateServiceResponse>, tonic::Status>| r.unwrap_err().code();
    assert_eq!(
        code(c.create_service(Request::new(CreateServiceRequest { spec: Some(spec("web", 1)) })).await),
        Code::AlreadyExists
    );
    assert_eq!(
        code(c.create_service(Request::new(CreateServiceRequest { spec: Some(spec("-bad", 1)) })).await),
        Code::InvalidArgument
    );
    let missing =
        c.get_service(Request::new(GetServiceRequest { service_id: "nope".into(), insert_defaults: false })).await;
    assert_eq!(missing.unwrap_err().code(), Code::NotFound);
    let stale = c
        .update_service(Request::new(UpdateServiceRequest {
            service_id: created.id.clone(),
            service_version: Some(Version { index: 0 }),
            spec: Some(spec("web", 2)),
            rollback: 0,
        }))
        .await;
    assert_eq!(stale.unwrap_err().code(), Code::FailedPrecondition);
    let listed = c
        .list_services(Request::new(ListServicesRequest {
            filters: Some(list_services_request::Filters { names: vec!["we".into()], ..Default::default() }),
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(listed.services.is_empty(), "names are exact in SwarmKit");
    let statuses = c
        .list_service_statuses(Request::new(ListServiceStatusesRequest { services: vec![created.id.clone()] }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(statuses.statuses[0].desired_tasks, 1);
}

#[tokio::test]
async fn watch_sends_matching_events_per_commit_with_their_version() {
    let (state, _) = cluster();
    let c = ControlService::new(state.clone());
    let w = WatchService::new(state.clone(), None, None);
    let req = WatchRequest {
        entries: vec![entry("service", ALL, vec![select_by::By::NamePrefix("we".into())])],
        resume_from: None,
        include_old_object: true,
    };
    let mut stream = w.watch(Request::new(req)).await.unwrap().into_inner();
    assert_eq!(
        stream.next().await.unwrap().unwrap(),
        WatchMessage::default(),
        "the first message says the watch is set up"
    );
    c.create_service(Request::new(CreateServiceRequest { spec: Some(spec("other", 1)) })).await.unwrap();
    let web = c.create_service(Request::new(CreateServiceRequest { spec: Some(spec("web", 1)) })).await.unwrap();
    let web = web.into_inner().service.unwrap();
    let msg = stream.next().await.unwrap().unwrap();
    assert_eq!(msg.version.unwrap().index, web.meta.as_ref().unwrap().version.unwrap().index);
    assert_eq!(msg.events.len(), 1);
    assert_eq!(msg.events[0].action, WatchActionKind::WatchActionCreate as i32);
    let updated = c
        .update_service(Request::new(UpdateServiceRequest {
            service_id: web.id.clone(),
            service_version: web.meta.as_ref().unwrap().version,
            spec: Some(spec("web", 3)),
            rollback: 0,
        }))
        .await
        .unwrap();
    assert!(updated.into_inner().service.is_some());
    let msg = stream.next().await.unwrap().unwrap();
    assert_eq!(msg.events[0].action, WatchActionKind::WatchActionUpdate as i32);
    match msg.events[0].old_object.as_ref().and_then(|o| o.object.as_ref()) {
        Some(object::Object::Service(old)) => assert_eq!(old.meta, web.meta),
        other => panic!("old object: {other:?}"),
    }
    c.remove_service(Request::new(RemoveServiceRequest { service_id: web.id.clone() })).await.unwrap();
    let msg = stream.next().await.unwrap().unwrap();
    assert_eq!(msg.events[0].action, WatchActionKind::WatchActionRemove as i32);
}

#[tokio::test]
async fn watch_requests_are_checked_before_anything_is_sent() {
    let (state, _) = cluster();
    let w = WatchService::new(state, None, None);
    let check = |entries: Vec<watch_request::WatchEntry>, fragment: &'static str| {
        let w = w.clone();
        let entries_len = entries.len();
        async move {
            let r = w.watch(Request::new(WatchRequest { entries, resume_from: None, include_old_object: false })).await;
            let Err(e) = r else { panic!("{entries_len} entries were accepted") };
            assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
            assert!(e.message().contains(fragment), "{}", e.message());
        }
    };
    check(vec![], "at least one entry").await;
    check(vec![entry("resource", ALL, vec![])], "cannot be watched").await;
    check(vec![entry("service", 0, vec![])], "not a mask").await;
    check(vec![entry("service", 8, vec![])], "not a mask").await;
    check(vec![entry("service", ALL, vec![select_by::By::NodeId("n".into())])], "does not apply").await;
    check(
        vec![entry("task", ALL, vec![select_by::By::Id("a".into()), select_by::By::IdPrefix("b".into())])],
        "conflicting filters",
    )
    .await;
    check((0..=MAX_WATCH_ENTRIES).map(|_| entry("task", ALL, vec![])).collect(), "at most").await;
}

#[tokio::test]
async fn a_secret_in_a_watch_event_has_no_data() {
    let (state, _) = cluster();
    let c = ControlService::new(state.clone());
    let w = WatchService::new(state, None, None);
    let req = WatchRequest { entries: vec![entry("secret", ALL, vec![])], resume_from: None, include_old_object: true };
    let mut stream = w.watch(Request::new(req)).await.unwrap().into_inner();
    stream.next().await.unwrap().unwrap();
    let spec = SecretSpec {
        annotations: Some(Annotations { name: "pw".into(), ..Default::default() }),
        data: b"s3cr3t".to_vec(),
        ..Default::default()
    };
    let created = c.create_secret(Request::new(CreateSecretRequest { spec: Some(spec) })).await.unwrap().into_inner();
    assert!(created.secret.unwrap().spec.unwrap().data.is_empty());
    let msg = stream.next().await.unwrap().unwrap();
    match msg.events[0].object.as_ref().and_then(|o| o.object.as_ref()) {
        Some(object::Object::Secret(s)) => assert!(s.spec.as_ref().unwrap().data.is_empty()),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_subscriber_that_falls_behind_is_told_where_to_resume() {
    use std::sync::Arc;
    let store = Arc::new(shoal_store::MemoryStore::new(8));
    let proposer = Arc::new(shoal_raft::LocalProposer::new(store.clone()));
    let state = crate::ClusterState::new(
        store,
        proposer,
        Arc::new(shoal_store::ManualClock::new(1_700_000_000_000)),
        Arc::new(crate::RandomIds::seeded(3)),
    );
    let c = ControlService::new(state.clone());
    let w = WatchService::new(state, None, None);
    let req =
        WatchRequest { entries: vec![entry("config", ALL, vec![])], resume_from: None, include_old_object: false };
    let mut stream = w.watch(Request::new(req)).await.unwrap().into_inner();
    let writes = SUBSCRIBER_QUEUE_MESSAGES + 8 + 50;
    for i in 0..writes {
        let spec = ConfigSpec {
            annotations: Some(Annotations { name: format!("c{i}"), ..Default::default() }),
            data: b"x".to_vec(),
            ..Default::default()
        };
        c.create_config(Request::new(CreateConfigRequest { spec: Some(spec) })).await.unwrap();
    }
    let mut last = 0;
    let mut received = 0;
    let status = loop {
        match stream.next().await.expect("the stream ends with a status") {
            Ok(m) => {
                received += m.events.len();
                last = m.version.map_or(last, |v| v.index);
            }
            Err(s) => break s,
        }
    };
    assert!(received < writes, "the queue is bounded: {received} of {writes} events were held");
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert!(status.message().contains(&format!("resume_from = {last}")), "{}", status.message());
}

#[tokio::test]
async fn volumes_are_served_with_swarmkits_codes_and_watched_by_kind_and_name() {
    let (state, _) = cluster();
    let c = ControlService::new(state.clone());
    let w = WatchService::new(state, None, None);
    let req = WatchRequest {
        entries: vec![entry("volume", ALL, vec![select_by::By::Name("data".into())])],
        resume_from: None,
        include_old_object: false,
    };
    let mut stream = w.watch(Request::new(req)).await.unwrap().into_inner();
    assert!(stream.next().await.unwrap().unwrap().events.is_empty(), "the first message says the watch is set up");
    let spec = |name: &str| VolumeSpec {
        annotations: Some(Annotations { name: name.into(), ..Default::default() }),
        driver: Some(Driver { name: "csi.example.com".into(), ..Default::default() }),
        access_mode: Some(VolumeAccessMode {
            access_type: Some(volume_access_mode::AccessType::Mount(Default::default())),
            ..Default::default()
        }),
        ..Default::default()
    };
    let create = |s: VolumeSpec| c.create_volume(Request::new(CreateVolumeRequest { spec: Some(s) }));
    create(spec("other")).await.unwrap();
    let data = create(spec("data")).await.unwrap().into_inner().volume.unwrap();
    assert_eq!(create(spec("data")).await.unwrap_err().code(), Code::AlreadyExists);
    assert_eq!(create(VolumeSpec { driver: None, ..spec("x") }).await.unwrap_err().code(), Code::InvalidArgument);
    let missing = c.get_volume(Request::new(GetVolumeRequest { volume_id: "nope".into() })).await;
    assert_eq!(missing.unwrap_err().code(), Code::NotFound);
    let stale = c
        .update_volume(Request::new(UpdateVolumeRequest {
            volume_id: data.id.clone(),
            volume_version: Some(Version { index: 0 }),
            spec: data.spec.clone(),
        }))
        .await;
    assert_eq!(stale.unwrap_err().code(), Code::FailedPrecondition);
    let listed = c
        .list_volumes(Request::new(ListVolumesRequest {
            filters: Some(list_volumes_request::Filters { name_prefixes: vec!["da".into()], ..Default::default() }),
        }))
        .await
        .unwrap()
        .into_inner()
        .volumes;
    assert_eq!(listed.iter().map(|v| v.id.as_str()).collect::<Vec<_>>(), [data.id.as_str()]);
    c.remove_volume(Request::new(RemoveVolumeRequest { volume_id: data.id.clone(), force: false })).await.unwrap();

    // Only the volume named `data` is seen: its create, then its removal.
    let mut seen = Vec::new();
    while seen.len() < 2 {
        for e in stream.next().await.unwrap().unwrap().events {
            let Some(object::Object::Volume(v)) = e.object.and_then(|o| o.object) else { panic!("not a volume") };
            seen.push((e.action, v.id));
        }
    }
    let (create, remove) = (WatchActionKind::WatchActionCreate as i32, WatchActionKind::WatchActionRemove as i32);
    assert_eq!(seen, [(create, data.id.clone()), (remove, data.id)]);
}
