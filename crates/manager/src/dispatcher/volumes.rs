//! `UpdateVolumeStatus`: a node says it has unpublished (and unstaged) cluster volumes. A volume whose
//! publication on that node is `PENDING_NODE_UNPUBLISH` goes to `PENDING_UNPUBLISH`, where the volume
//! manager calls the plugin's `ControllerUnpublishVolume`. Any other state is left alone: a node cannot
//! unpublish what the manager has not asked it to (nor end a publication of another node).

use std::collections::BTreeSet;

use shoal_api::{volume_publish_status, UpdateVolumeStatusRequest};
use shoal_store::{Changes, Tables};
use tonic::Status;

/// Most volume updates in one `UpdateVolumeStatus` request.
pub(crate) const MAX_VOLUME_UPDATES_PER_REQUEST: usize = 1_000;
/// Longest volume ID a node may name (Shoal's and SwarmKit's IDs are 25 characters).
pub(crate) const MAX_VOLUME_ID_BYTES: usize = 64;

/// The volume IDs a request reports unpublished, bounded and without repeats; INVALID_ARGUMENT naming the
/// bound otherwise (and nothing is written).
pub(crate) fn unpublished_ids(req: &UpdateVolumeStatusRequest) -> Result<BTreeSet<String>, Status> {
    if req.updates.len() > MAX_VOLUME_UPDATES_PER_REQUEST {
        return Err(Status::invalid_argument(format!(
            "{} volume updates in one request; send at most {MAX_VOLUME_UPDATES_PER_REQUEST} per request",
            req.updates.len()
        )));
    }
    let mut ids = BTreeSet::new();
    for u in &req.updates {
        if u.id.len() > MAX_VOLUME_ID_BYTES {
            return Err(Status::invalid_argument(format!(
                "a volume ID of {} bytes; volume IDs are at most {MAX_VOLUME_ID_BYTES} bytes",
                u.id.len()
            )));
        }
        if u.unpublished {
            ids.insert(u.id.clone());
        }
    }
    Ok(ids)
}

/// Moves each of `ids` that `node_id` was asked to unpublish to `PENDING_UNPUBLISH`.
pub(crate) fn mark_unpublished(t: &Tables, c: &mut Changes, node_id: &str, ids: &BTreeSet<String>, now_ms: u64) {
    use volume_publish_status::State;
    for id in ids {
        let Some(v) = t.volumes().get(id) else { continue };
        let Some(i) =
            v.publish_status.iter().position(|s| s.node_id == node_id && s.state == State::PendingNodeUnpublish as i32)
        else {
            continue;
        };
        let mut v = (**v).clone();
        v.publish_status[i].state = State::PendingUnpublish as i32;
        v.publish_status[i].message = "the node unpublished the volume".to_string();
        v.meta.get_or_insert_with(Default::default).updated_at = Some(shoal_api::timestamp_from_unix_ms(now_ms));
        c.update(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_api::update_volume_status_request::VolumeStatusUpdate;

    fn request(updates: Vec<(&str, bool)>) -> UpdateVolumeStatusRequest {
        UpdateVolumeStatusRequest {
            session_id: "s".into(),
            updates: updates
                .into_iter()
                .map(|(id, unpublished)| VolumeStatusUpdate { id: id.into(), unpublished })
                .collect(),
        }
    }

    /// What a node reports is bounded before anything is read or written: the count and each ID's length
    /// (INVALID_ARGUMENT naming the bound); repeats count once, and updates that are not unpublications ask
    /// nothing.
    #[test]
    fn a_volume_status_report_is_bounded_and_only_unpublications_count() {
        let ids = unpublished_ids(&request(vec![("v1", true), ("v1", true), ("v2", false)])).unwrap();
        assert_eq!(ids.into_iter().collect::<Vec<_>>(), vec!["v1".to_string()]);
        let many: Vec<(&str, bool)> = vec![("v", true); MAX_VOLUME_UPDATES_PER_REQUEST + 1];
        let e = unpublished_ids(&request(many)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains(&format!("at most {MAX_VOLUME_UPDATES_PER_REQUEST}")), "{}", e.message());
        let long = "x".repeat(MAX_VOLUME_ID_BYTES + 1);
        let e = unpublished_ids(&request(vec![(&long, true)])).unwrap_err();
        assert!(e.message().contains("volume IDs are at most"), "{}", e.message());
    }
}
