//! Quarantine (opt-in: `spec.rollout.quarantine.afterConsecutiveFailures`, or the configurator's
//! `--quarantine-after`): one node must not veto every change for the fleet (#27 item 10).
//!
//! An agent may write its own NodeNetworkConfig's status. One that reports `Invalid` on everything —
//! compromised, or broken in a way only its node sees — fails every revision it is given, and with
//! `maxFailures: 1` every revision halts and rolls back. That stays the default (off): a failing node
//! halting the rollout is the safety netwave exists for. With the policy on:
//!
//! ```text
//!   failure of node N on revision R, found this step
//!     ├─ N quarantined already ─────────────────────────► flagged, does not count against maxFailures
//!     ├─ evidence: another node is updated on R and no
//!     │  other node has a counted failure of R ─────────► R appended to N's streak
//!     │     └─ streak reaches afterConsecutiveFailures ─► N quarantined, this failure flagged too
//!     └─ no evidence ───────────────────────────────────► counts as always; the streak stays
//!   N reported Invalid for the target while its spec names
//!   another revision (a protocol violation) ──────────► recorded, never counted; N is not given
//!                                                        the target; with the policy on, the target
//!                                                        is appended to N's streak as above
//!   N updated on a revision newer than its streak ──────► streak cleared
//!   N in the streak, or failed a Failed revision newer
//!   than the last good one (a suspect) ─────────────────► N gets the next target after every other node
//! ```
//!
//! - **Evidence.** Only a failure of a revision another node runs counts toward a quarantine, so a
//!   genuinely bad revision (which fails on the first healthy node too) never quarantines anyone. A
//!   suspect is given the next target last, so that evidence exists even when its name sorts first:
//!   a healthy node would then fail a bad revision first and halt it as always.
//! - **Quarantined.** Not eligible: it gets no new revision (counted `skipped`, named in the status's
//!   waits), its rollbacks to the last good revision still happen, and a failure of it is recorded
//!   flagged (`failedNodes[].quarantined`) and never counts. The failure that completes the streak is
//!   the first one that does not count: that revision goes on without the node.
//! - **Where it is kept.** In annotations on the node's NodeNetworkConfig, written by the configurator
//!   ([`netwave_api::FAILURE_STREAK_ANNOTATION`], [`netwave_api::QUARANTINED_ANNOTATION`]): the agent
//!   may write only that object's status (RBAC; the status subresource keeps metadata), never these.
//!   A flag on a failure is on the revision's status, which only the configurator writes.
//! - **Release.** An admin removes `netwave.dev/quarantined`. The node is then eligible again with an
//!   empty streak; it is not given a revision it failed (as any node that failed), so it gets the
//!   next one (or this one again after `spec.retry`).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use netwave_api::{FAILURE_STREAK_ANNOTATION, QUARANTINED_ANNOTATION, QUARANTINED_CONDITION};

use super::vocab::ConditionStatus;
use crate::types::{Sequence, Timestamp};

/// Reason of the `Quarantined` condition.
pub const REASON_CONSECUTIVE_FAILURES: &str = "ConsecutiveFailures";

/// What the configurator keeps about a node where its agent cannot write: the annotations of its
/// NodeNetworkConfig.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeRecord {
    /// Revisions the node failed in a row while other nodes provisioned them, oldest first.
    pub streak: Vec<StreakEntry>,
    /// Quarantined: since when and why (the annotation's value).
    pub quarantined: Option<String>,
}

/// One revision of a streak.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreakEntry {
    pub revision: String,
    pub sequence: Sequence,
}

impl NodeRecord {
    /// From a NodeNetworkConfig's annotations. A streak entry that does not read as `name@sequence`
    /// is left out (the configurator writes the next one whole).
    pub fn from_annotations(annotations: Option<&BTreeMap<String, String>>) -> NodeRecord {
        let get = |k: &str| annotations.and_then(|a| a.get(k));
        let streak = get(FAILURE_STREAK_ANNOTATION)
            .map(|v| {
                v.split_whitespace()
                    .filter_map(|e| {
                        let (revision, seq) = e.rsplit_once('@')?;
                        Some(StreakEntry {
                            revision: revision.to_string(),
                            sequence: Sequence(seq.parse().ok()?),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        NodeRecord {
            streak,
            quarantined: get(QUARANTINED_ANNOTATION).cloned(),
        }
    }

    /// The two annotations' values (`None`: remove it), as [`NodeRecord::from_annotations`] reads them.
    pub fn annotations(&self) -> [(&'static str, Option<String>); 2] {
        let streak = (!self.streak.is_empty()).then(|| {
            self.streak
                .iter()
                .map(|e| format!("{}@{}", e.revision, e.sequence.0))
                .collect::<Vec<_>>()
                .join(" ")
        });
        [
            (FAILURE_STREAK_ANNOTATION, streak),
            (QUARANTINED_ANNOTATION, self.quarantined.clone()),
        ]
    }

    pub fn is_quarantined(&self) -> bool {
        self.quarantined.is_some()
    }

    /// The newest revision of the streak.
    pub(super) fn newest(&self) -> Option<Sequence> {
        self.streak.iter().map(|e| e.sequence).max()
    }

    pub(super) fn names(&self) -> String {
        self.streak
            .iter()
            .map(|e| e.revision.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A node's record to write (both annotations, a missing one removed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordUpdate {
    pub node: String,
    pub record: NodeRecord,
}

/// The annotation value when a node is quarantined: since when and why (`violation`: the streak's
/// last entry is a verdict on a revision the node was not given).
pub(super) fn quarantine_note(
    streak: &NodeRecord,
    after: u32,
    now: Timestamp,
    violation: bool,
) -> String {
    let how = if violation {
        ", the last by reporting Invalid for a revision it was not given"
    } else {
        " while other nodes provisioned them"
    };
    format!(
        "since {}: failed {} in a row{how} (quarantine.afterConsecutiveFailures {after})",
        now.truncate_to_secs().to_time().0,
        streak.names()
    )
}

/// How an admin releases `node`.
pub fn release_hint(node: &str) -> String {
    format!(
        "kubectl annotate nnc {node} {QUARANTINED_ANNOTATION}- (or kubectl netwave release {node})"
    )
}

/// The `Quarantined` condition a node's NodeNetworkConfig status should carry (`None`: none), given
/// the conditions it carries now: the configurator writes it where the two differ, and puts it back
/// if the agent removed it. Its transition time is kept while it stays.
pub fn condition(
    node: &str,
    record: &NodeRecord,
    current: &[Condition],
    now: Timestamp,
) -> Option<Condition> {
    let note = record.quarantined.as_ref()?;
    let old = current.iter().find(|c| c.type_ == QUARANTINED_CONDITION);
    Some(Condition {
        type_: QUARANTINED_CONDITION.to_string(),
        status: ConditionStatus::True.as_str().to_string(),
        reason: REASON_CONSECUTIVE_FAILURES.to_string(),
        message: format!(
            "quarantined {note}: its failures do not count against maxFailures, and it keeps its last \
             good config and gets no new revision until an admin releases it: {}",
            release_hint(node)
        ),
        last_transition_time: old
            .filter(|c| c.status == ConditionStatus::True.as_str())
            .map_or_else(
                || now.truncate_to_secs().to_time(),
                |c| c.last_transition_time.clone(),
            ),
        observed_generation: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_reads_back_what_it_writes_and_skips_garbage() {
        let r = NodeRecord {
            streak: vec![
                StreakEntry {
                    revision: "rev-a".into(),
                    sequence: Sequence(3),
                },
                StreakEntry {
                    revision: "rev-b".into(),
                    sequence: Sequence(5),
                },
            ],
            quarantined: None,
        };
        let map: BTreeMap<String, String> = r
            .annotations()
            .into_iter()
            .filter_map(|(k, v)| Some((k.to_string(), v?)))
            .collect();
        assert_eq!(map[FAILURE_STREAK_ANNOTATION], "rev-a@3 rev-b@5");
        assert_eq!(NodeRecord::from_annotations(Some(&map)), r);
        let garbage: BTreeMap<String, String> = [(
            FAILURE_STREAK_ANNOTATION.to_string(),
            "x rev-c@7 y@z".into(),
        )]
        .into();
        assert_eq!(
            NodeRecord::from_annotations(Some(&garbage)).streak,
            [StreakEntry {
                revision: "rev-c".into(),
                sequence: Sequence(7)
            }]
        );
        assert_eq!(NodeRecord::from_annotations(None), NodeRecord::default());
    }
}
