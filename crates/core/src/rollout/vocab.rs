//! The words a revision's status is written in: phases, condition types and statuses, and reasons.
//!
//! Each of these strings is spelled here and nowhere else in `rollout`: the rest names them by enum or
//! constant, so a misspelled condition is a compile error instead of a condition no alert matches.
//! Tests, the configurator's alerts and `kubectl` users match on them; they are part of the API.

/// `status.phase` of a revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// The target; no node assigned yet.
    Pending,
    /// The target; rolling out.
    Progressing,
    /// Every eligible node was updated at some point. Sticky: the revision is a proven last good one.
    Complete,
    /// Validation failed, or `maxFailures` nodes failed. Sticky until `spec.retry` changes.
    Failed,
    /// A newer revision became the target before this one completed.
    Superseded,
}

impl Phase {
    const ALL: [Phase; 5] = [
        Phase::Pending,
        Phase::Progressing,
        Phase::Complete,
        Phase::Failed,
        Phase::Superseded,
    ];

    /// The phase a status names; `None` for no phase yet and for anything unknown (a phase written by
    /// a newer configurator is not ours to interpret).
    pub fn parse(s: Option<&str>) -> Option<Phase> {
        let s = s?;
        Phase::ALL.into_iter().find(|p| p.as_str() == s)
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Progressing => "Progressing",
            Phase::Complete => "Complete",
            Phase::Failed => "Failed",
            Phase::Superseded => "Superseded",
        }
    }
}

/// The condition types a revision's status carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ConditionType {
    Validated,
    Progressing,
    Available,
    Degraded,
    Paused,
}

impl ConditionType {
    pub(super) const fn as_str(self) -> &'static str {
        match self {
            ConditionType::Validated => "Validated",
            ConditionType::Progressing => "Progressing",
            ConditionType::Available => "Available",
            ConditionType::Degraded => "Degraded",
            ConditionType::Paused => "Paused",
        }
    }
}

/// Condition types, in the order they are kept in status.
pub const CONDITION_TYPES: [&str; 5] = [
    ConditionType::Validated.as_str(),
    ConditionType::Progressing.as_str(),
    ConditionType::Available.as_str(),
    ConditionType::Degraded.as_str(),
    ConditionType::Paused.as_str(),
];

/// The `Node` condition type the rollout reads (a node is eligible only while it is `True`).
pub(super) const NODE_READY: &str = "Ready";

/// `Condition.status`: Kubernetes spells a tri-state as strings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ConditionStatus {
    True,
    False,
    Unknown,
}

impl ConditionStatus {
    pub(super) const fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }
}

/// Failure reason recorded when an agent did not report in time.
pub const REASON_APPLY_TIMEOUT: &str = "ApplyTimeout";

/// Condition reasons with a meaning beyond display (tests and the configurator's alerts match on them).
pub mod reasons {
    pub const PROGRESS_DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";
    pub const VALIDATION_FAILED: &str = "ValidationFailed";
    pub const MAX_FAILURES_REACHED: &str = "MaxFailuresReached";
    pub const INVALID_POLICY: &str = "InvalidPolicy";
    pub const ROLLOUT_PAUSED: &str = "RolloutPaused";
    pub const ROLLOUT_COMPLETE: &str = "RolloutComplete";
    pub const CANARY_BAKE: &str = "CanaryBake";
    pub const ROLLOUT_PROGRESSING: &str = "RolloutProgressing";
    pub const SUPERSEDED: &str = "Superseded";

    // The rest only describe; nothing outside `rollout` matches on them (yet), so they stay private to
    // keep the public API what it was.
    pub(in crate::rollout) const VALIDATED: &str = "Validated";
    pub(in crate::rollout) const PAUSED_BY_SPEC: &str = "PausedBySpec";
    pub(in crate::rollout) const NOT_PAUSED: &str = "NotPaused";
    pub(in crate::rollout) const ALL_NODES_UPDATED: &str = "AllNodesUpdated";
    pub(in crate::rollout) const ROLLOUT_INCOMPLETE: &str = "RolloutIncomplete";
    pub(in crate::rollout) const NO_FAILURES: &str = "NoFailures";
    pub(in crate::rollout) const NODES_FAILED: &str = "NodesFailed";
    pub(in crate::rollout) const REVISION_FAILED: &str = "RevisionFailed";
}
