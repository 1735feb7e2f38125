//! The words a revision's status is written in: phases, condition types and statuses, and reasons.
//!
//! Each of these strings is spelled here and nowhere else in `rollout`: the rest names them by enum or
//! constant, so a misspelled condition is a compile error instead of a condition no alert matches.
//! Tests, the configurator's alerts and `kubectl` users match on them; they are part of the API.

/// `status.phase` of a revision: the API's word list (`netwave_api::vocab`).
pub use netwave_api::vocab::RevisionPhase as Phase;

/// The condition types a revision's status carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConditionType {
    Validated,
    Progressing,
    Available,
    Degraded,
    Paused,
}

impl ConditionType {
    pub const fn as_str(self) -> &'static str {
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

pub(super) use netwave_api::vocab::ConditionStatus;

/// Failure reason recorded when an agent did not report in time.
pub const REASON_APPLY_TIMEOUT: &str = netwave_api::vocab::node_reasons::APPLY_TIMEOUT;

/// Condition reasons with a meaning beyond display (tests and the configurator's alerts match on them).
pub mod reasons {
    pub const PROGRESS_DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";
    pub const VALIDATION_FAILED: &str = "ValidationFailed";
    pub const MAX_FAILURES_REACHED: &str = "MaxFailuresReached";
    pub const INVALID_POLICY: &str = "InvalidPolicy";
    pub const ROLLOUT_PAUSED: &str = "RolloutPaused";
    /// Held: the target removes much of what the last good revision puts on the nodes (`rollout::hold`).
    pub const DESTRUCTIVE_CHANGE: &str = "DestructiveChange";
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
