//! One agent's oversized verdict (#48): node-0's agent reports `Invalid` with a 400 KB reason and a
//! 400 KB message, as an older CRD without bounds stores them. The revision fails as on any other
//! verdict, and what the configurator copies of it (the revision's `failedNodes`, its message, Events
//! and their log lines) is bounded: the revision status stays small enough to write.
//!
//! (Under this release's CRD the API server refuses such a write outright:
//! `install.rs::an_agent_cannot_write_an_oversized_or_unreadable_status`.)

mod support_inmem;

use std::sync::Arc;

use netwave_agent::sim::Answer;
use netwave_api::bounds::{FAILED_NODE_MESSAGE_MAX, REASON_MAX};
use netwave_api::vocab::NodeReason;
use netwave_configurator::testing::inmem;
use netwave_configurator::writer::Intent;
use support_inmem::{Leader, answer, phase_of};

#[test]
fn an_oversized_verdict_fails_the_revision_and_is_copied_bounded() {
    let huge = "x".repeat(400 * 1024);
    let mut s = inmem::samples_snapshot((0..4).map(|i| format!("node-{i}")));
    let mut leader = Leader::new();
    let mut notes = Vec::new();
    for _ in 0..100 {
        let out = leader.reconcile(&mut s);
        notes.extend(out.intents.iter().filter_map(|i| match i {
            Intent::Event { note, .. } => Some(note.len()),
            _ => None,
        }));
        answer(&mut s, |node| {
            if node == "node-0" {
                Answer::Invalid {
                    reason: NodeReason::HealthCheckFailed,
                    message: huge.clone(),
                }
            } else {
                Answer::Provisioned
            }
        });
        // The reason is free text on the wire: an agent may write anything there.
        for c in s.node_configs.iter_mut() {
            if c.metadata.name.as_deref() == Some("node-0")
                && let Some(st) = Arc::make_mut(c).status.as_mut()
                && st.phase.as_deref() == Some("Invalid")
            {
                st.reason = Some(huge.clone());
            }
        }
        let name = s.revisions.first().and_then(|r| r.metadata.name.clone());
        if name.is_some_and(|n| phase_of(&s, &n).as_deref() == Some("Failed")) {
            break;
        }
    }
    let revision = s.revisions.first().expect("a revision was cut");
    let status = revision.status.as_ref().expect("a status");
    assert_eq!(status.phase.as_deref(), Some("Failed"), "{status:#?}");
    let failed = status
        .failed_nodes
        .iter()
        .find(|f| f.node == "node-0")
        .expect("node-0 failed it");
    assert!(
        failed.reason.len() <= REASON_MAX && failed.message.len() <= FAILED_NODE_MESSAGE_MAX,
        "copied bounded: reason {} bytes, message {} bytes",
        failed.reason.len(),
        failed.message.len()
    );
    assert!(failed.reason.ends_with('…') && failed.message.ends_with('…'));
    let bytes = serde_json::to_vec(status).unwrap().len();
    assert!(bytes < 8 * 1024, "the revision status is {bytes} bytes");
    let longest = notes.iter().max().copied().unwrap_or_default();
    assert!(
        longest < 2 * 1024,
        "an Event's note (and its log line) is {longest} bytes"
    );
}
