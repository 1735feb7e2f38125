//! Stage 2, continued: what a failure means for its node under `spec.rollout.quarantine`, whose
//! streak a success clears, and who goes last ([`crate::rollout::quarantine`] says why).

use std::collections::BTreeSet;

use super::super::plan::{Event, EventReason, ObjectRef};
use super::super::quarantine::{
    NodeRecord, RecordUpdate, StreakEntry, quarantine_note, release_hint,
};
use super::super::vocab::REASON_PROTOCOL_VIOLATION;
use super::super::world::{Fate, Node, Rev, World};
use crate::types::Timestamp;

/// Judges the failures of `rev` found this step (the last `rev.new_failures` of `rev.failed_nodes`):
/// a quarantined node's is flagged and does not count; with the policy on, one with evidence (another
/// node is updated on `rev`, no other node has a counted failure of it) grows the node's streak, and
/// the failure that completes it quarantines the node and is flagged too.
pub(super) fn judge_failures(
    rev: &mut Rev,
    nodes: &[Node],
    now: Timestamp,
    records: &mut Vec<RecordUpdate>,
    events: &mut Vec<Event>,
) {
    let start = rev.failed_nodes.len() - rev.new_failures;
    let node_of = |name: &str| {
        nodes
            .binary_search_by(|n| n.name().as_str().cmp(name))
            .ok()
            .map(|i| &nodes[i])
    };
    if start < rev.failed_nodes.len() {
        for f in &mut rev.failed_nodes.to_mut()[start..] {
            f.quarantined = f.quarantined || node_of(&f.node).is_some_and(|n| n.quarantined);
        }
    }
    let name = rev.name();
    for f in &rev.failed_nodes[start..] {
        if f.reason == REASON_PROTOCOL_VIOLATION {
            events.push(Event {
                object: ObjectRef::NodeConfig(f.node.clone()),
                type_: EventReason::ProtocolViolation.type_(),
                reason: EventReason::ProtocolViolation,
                message: format!("node {}: {}", f.node, f.message),
            });
        }
    }
    let Some(after) = rev.policy.quarantine_after else {
        return;
    };
    let sequence = rev.state.sequence;
    for k in start..rev.failed_nodes.len() {
        let f = &rev.failed_nodes[k];
        // A protocol violation is its own evidence: the node reported on what it was not given.
        let violation = f.reason == REASON_PROTOCOL_VIOLATION;
        let Some(n) = node_of(&f.node).filter(|n| !n.quarantined && (violation || !f.quarantined))
        else {
            continue;
        };
        let others_failed = (rev.failed_nodes.iter()).any(|o| o.node != f.node && !o.quarantined);
        let others_updated = nodes.iter().any(|m| *m.name() != f.node && m.updated(name));
        let evidence = violation || (!others_failed && others_updated);
        if !evidence || n.record.streak.iter().any(|e| e.revision == *name) {
            continue;
        }
        let mut record = NodeRecord {
            quarantined: None,
            ..n.record.clone()
        };
        record.streak.push(StreakEntry {
            revision: name.to_string(),
            sequence,
        });
        if record.streak.len() >= after as usize {
            let note = quarantine_note(&record, after, now, violation);
            events.push(Event {
                object: ObjectRef::NodeConfig(f.node.clone()),
                type_: EventReason::NodeQuarantined.type_(),
                reason: EventReason::NodeQuarantined,
                message: format!(
                    "node {} quarantined {note}: its failures no longer count against maxFailures \
                     ({name} goes on without it), and it keeps its last good config and gets no new \
                     revision until an admin releases it: {}",
                    f.node,
                    release_hint(&f.node)
                ),
            });
            record = NodeRecord {
                streak: Vec::new(),
                quarantined: Some(note),
            };
            rev.failed_nodes.to_mut()[k].quarantined = true;
        }
        records.push(RecordUpdate {
            node: rev.failed_nodes[k].node.clone(),
            record,
        });
    }
}

/// Clears the streak of every node updated on a target newer than its streak (it provisions again),
/// and, with quarantine on in the governing policy, marks the suspects: nodes with a streak, or that
/// failed a `Failed` revision newer than the last good one. Rollout order puts them last.
pub(super) fn streaks_and_suspects(w: &mut World) {
    if let Some(t) = w.target {
        let (name, sequence) = (w.revs[t].name(), w.revs[t].state.sequence);
        for n in &w.nodes {
            let newer = n.record.newest().is_some_and(|s| sequence > s);
            if !n.quarantined
                && newer
                && n.updated(name)
                && !w.records.iter().any(|r| r.node == *n.name())
            {
                w.records.push(RecordUpdate {
                    node: n.name().to_string(),
                    record: NodeRecord::default(),
                });
            }
        }
    }
    let governing = w.target.or(if w.revs.is_empty() { None } else { Some(0) });
    let on = match governing {
        Some(i) => w.revs[i].policy.quarantine_after.is_some(),
        None => w.input.defaults.policy().quarantine_after.is_some(),
    };
    if !on {
        return;
    }
    let last_good = w.last_good.map(|lg| w.revs[lg].state.sequence);
    let failed_lately: BTreeSet<String> = w
        .revs
        .iter()
        .filter(|r| matches!(r.fate, Fate::Failed(_)))
        .filter(|r| last_good.is_none_or(|s| r.state.sequence > s))
        .flat_map(|r| r.failed_nodes.iter().map(|f| f.node.clone()))
        .collect();
    for n in &mut w.nodes {
        n.suspect = !n.record.streak.is_empty() || failed_lately.contains(n.name().as_str());
    }
}
