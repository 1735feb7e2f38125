//! The words a revision's status is written in, as `rollout` names them. They are spelled once, in
//! `netwave_api::vocab` (every crate and the plugin read them from there); this module gives them the
//! names the rollout code uses, so a misspelled condition is a compile error instead of a condition no
//! alert matches.

/// `status.phase` of a revision: the API's word list (`netwave_api::vocab`).
pub use netwave_api::vocab::RevisionPhase as Phase;

/// The condition types a revision's status carries.
pub use netwave_api::vocab::RevisionCondition as ConditionType;

/// Condition types, in the order they are kept in status.
pub const CONDITION_TYPES: [&str; 8] = [
    ConditionType::ALL[0].as_str(),
    ConditionType::ALL[1].as_str(),
    ConditionType::ALL[2].as_str(),
    ConditionType::ALL[3].as_str(),
    ConditionType::ALL[4].as_str(),
    ConditionType::ALL[5].as_str(),
    ConditionType::ALL[6].as_str(),
    ConditionType::ALL[7].as_str(),
];

/// The `Node` condition type the rollout reads (a node is eligible only while it is `True`).
pub(super) use netwave_api::vocab::node_conditions::READY as NODE_READY;

pub(super) use netwave_api::vocab::ConditionStatus;

/// Failure reason recorded when an agent started applying but did not report its verdict in time.
pub const REASON_APPLY_TIMEOUT: &str = netwave_api::vocab::node_reasons::APPLY_TIMEOUT;

/// Failure reason recorded when an agent did not start applying in time.
pub const REASON_PICKUP_TIMEOUT: &str = netwave_api::vocab::node_reasons::PICKUP_TIMEOUT;

/// Recorded, never counted, when an agent reports a verdict on a revision it was not given.
pub const REASON_PROTOCOL_VIOLATION: &str = netwave_api::vocab::node_reasons::PROTOCOL_VIOLATION;

/// Condition reasons (tests and the configurator's alerts match on them).
pub use netwave_api::vocab::revision_reasons as reasons;
