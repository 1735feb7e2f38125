//! What [`step`](super::step()) returns: the writes to make, the Events to record and a report of what the
//! rollout waits on. Plans are specific: the shell makes no choices, it applies [`Plan::writes`] in order.

use std::fmt;
use std::sync::Arc;

use super::vocab::REASON_PROTOCOL_VIOLATION;
use netwave_api::NetworkConfigRevisionStatus;

pub use super::hold::HoldRecord;
pub use super::quarantine::RecordUpdate;
use crate::sym::Sym;
use crate::types::{Sequence, Timestamp};

/// The outcome of one step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// Node records to write first (a failure streak, a quarantine; [`super::quarantine`]): what a
    /// failure on record in a status means for its node is on record before that status.
    pub records: Vec<RecordUpdate>,
    /// Holds to record: the target is destructive against the last good revision and no hold with
    /// this basis is on record (set `spec.paused: true` and the two annotations).
    pub holds: Vec<HoldRecord>,
    /// Full desired status of each revision whose status changes.
    pub status_updates: Vec<StatusUpdate>,
    /// `NodeNetworkConfig` specs to write (or create), most urgent first.
    pub assignments: Vec<Assignment>,
    /// `NodeNetworkConfig`s of nodes that left the cluster.
    pub delete_configs: Vec<String>,
    /// Revisions beyond the history limit that nothing references.
    pub delete_revisions: Vec<String>,
    /// Kubernetes Events, only for transitions (a repeated step over an unchanged world emits none).
    pub events: Vec<Event>,
    pub report: Report,
}

/// One write of a plan, in the order [`Plan::writes`] yields them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Write<'a> {
    Record(&'a RecordUpdate),
    Hold(&'a HoldRecord),
    Status(&'a StatusUpdate),
    Assign(&'a Assignment),
    DeleteConfig(&'a str),
    DeleteRevision(&'a str),
}

impl Plan {
    /// The writes in the order they must be applied: node records first (a quarantine is on record
    /// before the failure it makes not count), holds (a hold is on record before any status says so),
    /// statuses (a failure and the `Failed` phase are on record before any node is rolled
    /// back, a revision is `Validated` before any node gets it), then assignments, then deletions. The
    /// shell must stop at the first write that fails (a revision is only deleted once the assignments
    /// moving nodes off it are written) and may stop after any write (crash, lost lease): the next
    /// step, on any replica, recomputes the rest from what was written.
    pub fn writes(&self) -> impl Iterator<Item = Write<'_>> {
        self.records
            .iter()
            .map(Write::Record)
            .chain(self.holds.iter().map(Write::Hold))
            .chain(self.status_updates.iter().map(Write::Status))
            .chain(self.assignments.iter().map(Write::Assign))
            .chain(self.delete_configs.iter().map(|n| Write::DeleteConfig(n)))
            .chain(
                self.delete_revisions
                    .iter()
                    .map(|n| Write::DeleteRevision(n)),
            )
    }

    /// Number of API writes.
    pub fn write_count(&self) -> usize {
        self.records.len()
            + self.holds.len()
            + self.status_updates.len()
            + self.assignments.len()
            + self.delete_configs.len()
            + self.delete_revisions.len()
    }

    /// No writes and no events: the world is where the step wants it (or waiting on something).
    pub fn is_empty(&self) -> bool {
        self.write_count() == 0 && self.events.is_empty()
    }
}

/// The full desired status of one revision.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusUpdate {
    pub revision: String,
    /// Shared, not copied, by the configurator's write of it: it lists every failed node (#28).
    pub status: Arc<NetworkConfigRevisionStatus>,
}

/// Write `NodeNetworkConfig/<node>.spec` for `revision` (render the node's config for it, whose hash is
/// `config_hash`) and set the `netwave.dev/assigned-at` annotation: `assigned_at`, or in the
/// configurator the time the write is sent (no earlier: the timeouts count from it, and the wait of a
/// plan's writes on a slow API server is not the agent's time).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    pub node: Sym,
    /// The node has no `NodeNetworkConfig` yet: create it.
    pub create: bool,
    pub revision: Sym,
    pub sequence: Sequence,
    pub config_hash: Sym,
    pub retry: u32,
    pub assigned_at: Timestamp,
    pub reason: AssignReason,
}

impl Assignment {
    /// The annotation to write with the spec: (`netwave.dev/assigned-at`, RFC 3339 time). The apply
    /// timeout counts from it, and [`NodeConfigState::from_api`](super::NodeConfigState::from_api)
    /// reads it back exactly.
    pub fn assigned_at_annotation(&self) -> (&'static str, String) {
        (
            netwave_api::ASSIGNED_AT_ANNOTATION,
            self.assigned_at.to_rfc3339(),
        )
    }

    /// The node's spec once this assignment is written (as the rollout reads it back).
    pub fn spec(&self) -> super::AssignedSpec {
        super::AssignedSpec {
            revision: self.revision.clone(),
            sequence: self.sequence,
            config_hash: self.config_hash.clone(),
            retry: self.retry,
            assigned_at: Some(self.assigned_at),
        }
    }
}

/// Why a node is (re)assigned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AssignReason {
    /// A canary of the target, ahead of everyone else.
    Canary,
    /// The target, in rollout order.
    Rollout,
    /// The target, whose rendered config equals what the node runs: nothing to apply, no budget spent.
    FastPath,
    /// A node without a config: the last good revision, or the target once it has an updated node.
    NewNode,
    /// Off a failed revision (or a node that failed the target) onto the last good revision.
    Rollback,
    /// Same revision, new `spec.retry` after an admin re-armed it.
    Retry,
    /// Same revision, but the node's rendered config changed (its labels changed).
    Rerender,
    /// Same revision, the `netwave.dev/assigned-at` annotation was missing or unreadable.
    Restamp,
}

impl AssignReason {
    pub fn as_str(self) -> &'static str {
        match self {
            AssignReason::Canary => "Canary",
            AssignReason::Rollout => "Rollout",
            AssignReason::FastPath => "FastPath",
            AssignReason::NewNode => "NewNode",
            AssignReason::Rollback => "Rollback",
            AssignReason::Retry => "Retry",
            AssignReason::Rerender => "Rerender",
            AssignReason::Restamp => "Restamp",
        }
    }
}

/// A Kubernetes Event to record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub object: ObjectRef,
    pub type_: EventType,
    pub reason: EventReason,
    pub message: String,
}

/// The object an Event is about.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ObjectRef {
    Revision(String),
    NodeConfig(String),
}

impl ObjectRef {
    /// The object's `metadata.name`.
    pub fn name(&self) -> &str {
        match self {
            ObjectRef::Revision(n) | ObjectRef::NodeConfig(n) => n,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// Stable Event reasons (a small fixed set: fit for metric labels).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EventReason {
    /// The step saw a revision for the first time.
    RevisionCreated,
    ValidationFailed,
    InvalidPolicy,
    RolloutStarted,
    /// Every canary is updated; the bake starts.
    CanariesUpdated,
    NodeFailed,
    /// `maxFailures` reached.
    RevisionFailed,
    RollbackStarted,
    /// A revision failed and there is no last good revision to go back to.
    NoLastGoodRevision,
    RetryStarted,
    RolloutPaused,
    RolloutResumed,
    ProgressDeadlineExceeded,
    RolloutComplete,
    RevisionSuperseded,
    /// The target is held as a destructive change until an admin resumes it.
    DestructiveChange,
    /// A node failed enough revisions other nodes provisioned to be quarantined
    /// ([`super::quarantine`]).
    NodeQuarantined,
    /// The inputs equal an older good revision again: it is the target again ([`super::cut`]).
    RevisionReactivated,
    /// Nodes wait for an agent that can apply their config ([`WaitingOn::AgentLacksFeatures`]).
    WaitingForAgent,
    /// A node's agent reported a verdict on a revision it was not given: ignored, and the node is not
    /// given that revision ([`netwave_api::vocab::node_reasons::PROTOCOL_VIOLATION`]).
    ProtocolViolation,
}

impl EventReason {
    pub fn as_str(self) -> &'static str {
        use super::vocab::reasons;
        match self {
            EventReason::RevisionCreated => "RevisionCreated",
            EventReason::ValidationFailed => reasons::VALIDATION_FAILED,
            EventReason::InvalidPolicy => reasons::INVALID_POLICY,
            EventReason::RolloutStarted => "RolloutStarted",
            EventReason::CanariesUpdated => "CanariesUpdated",
            EventReason::NodeFailed => "NodeFailed",
            EventReason::RevisionFailed => reasons::REVISION_FAILED,
            EventReason::RollbackStarted => "RollbackStarted",
            EventReason::NoLastGoodRevision => "NoLastGoodRevision",
            EventReason::RetryStarted => "RetryStarted",
            EventReason::RolloutPaused => reasons::ROLLOUT_PAUSED,
            EventReason::RolloutResumed => "RolloutResumed",
            EventReason::ProgressDeadlineExceeded => reasons::PROGRESS_DEADLINE_EXCEEDED,
            EventReason::RolloutComplete => reasons::ROLLOUT_COMPLETE,
            EventReason::RevisionSuperseded => "RevisionSuperseded",
            EventReason::DestructiveChange => reasons::DESTRUCTIVE_CHANGE,
            EventReason::NodeQuarantined => "NodeQuarantined",
            EventReason::RevisionReactivated => "RevisionReactivated",
            EventReason::WaitingForAgent => "WaitingForAgent",
            EventReason::ProtocolViolation => REASON_PROTOCOL_VIOLATION,
        }
    }

    pub fn type_(self) -> EventType {
        match self {
            EventReason::ValidationFailed
            | EventReason::InvalidPolicy
            | EventReason::NodeFailed
            | EventReason::RevisionFailed
            | EventReason::RollbackStarted
            | EventReason::NoLastGoodRevision
            | EventReason::ProgressDeadlineExceeded
            | EventReason::DestructiveChange
            | EventReason::NodeQuarantined
            | EventReason::WaitingForAgent
            | EventReason::ProtocolViolation => EventType::Warning,
            _ => EventType::Normal,
        }
    }
}

/// What the step found and what holds the rollout back. Becomes the target's `status.message`, metrics
/// and logs; not written anywhere by itself.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    /// Newest revision that is not `Failed`.
    pub target: Option<String>,
    /// Newest `Complete` revision once this plan is applied: where failed nodes go back to. One
    /// exception: when a node's failure of the target is what lets the target complete in this plan,
    /// that node goes back to the last good revision before it (a node never goes back to a revision
    /// it failed), so a `Rollback` in the plan may name the previous last good revision.
    pub last_good: Option<String>,
    /// Nodes in flight after this plan is applied.
    pub in_flight: u32,
    /// `maxUnavailable` resolved against the eligible nodes.
    pub budget: u32,
    pub waiting: Vec<WaitingOn>,
    /// When something time-based happens next (bake end, an apply timeout, the progress deadline):
    /// step again then even if nothing changes.
    pub requeue_at: Option<Timestamp>,
}

impl Report {
    /// What a node without an assignment waits for, in words (the status of its placeholder
    /// NodeNetworkConfig); `None` when there is nothing to wait for (no revision exists yet).
    pub fn queued_message(&self, eligible: bool) -> Option<String> {
        if let Some(target) = &self.target {
            return Some(if eligible {
                format!(
                    "queued for revision {target}: the node gets its first config when its turn in \
                     the rollout comes (the revision's status says what the rollout waits on)"
                )
            } else {
                format!(
                    "not Ready or cordoned: the node gets revision {target} once it is Ready and \
                     schedulable"
                )
            });
        }
        self.waiting.iter().find_map(|w| match w {
            WaitingOn::NoLastGood { failed } => Some(format!(
                "nothing to roll out: {failed} failed and no revision has completed yet; fix the \
                 inputs, or bump {failed}'s spec.retry"
            )),
            _ => None,
        })
    }
}

/// One thing the rollout waits on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WaitingOn {
    /// No revision to roll out (none yet, or all failed).
    NoTarget,
    /// The target's `spec.rollout` has errors; nothing new is assigned until they are fixed.
    InvalidPolicy { errors: Vec<String> },
    /// The (completed) target fails fleet validation now: it is given to no further node.
    ValidationErrors { errors: Vec<String> },
    /// `spec.paused` is set.
    Paused { since: Timestamp },
    /// Held as a destructive change: what it removes from the last good revision.
    Held { removal: String },
    /// Canaries not updated yet; other nodes wait.
    Canaries { pending: u32 },
    /// Canaries are updated; other nodes wait until `until`.
    CanaryBake { until: Timestamp },
    /// `maxUnavailable` nodes are in flight.
    Budget { in_flight: u32, budget: u32 },
    /// `maxUnavailablePerDomain` nodes are in flight in `domain`.
    DomainBudget {
        domain: String,
        in_flight: u32,
        budget: u32,
    },
    /// Nodes assigned the target whose agents have not reported `Provisioned` yet.
    NodesInFlight { count: u32, first: Vec<String> },
    /// Not Ready or cordoned nodes left for later.
    NotReady { count: u32, first: Vec<String> },
    /// Nodes whose `NodeNetworkConfig` cannot be decoded: state unknown, left for later.
    UnreadableConfigs { count: u32, first: Vec<String> },
    /// Quarantined nodes ([`super::quarantine`]): left on their last good config until released.
    Quarantined { count: u32, first: Vec<String> },
    /// Nodes whose agent lacks a feature their config of the target needs (`missing`, in words:
    /// `netwave_api::features`): left on what they run until their agent is upgraded.
    AgentLacksFeatures {
        count: u32,
        first: Vec<String>,
        missing: String,
    },
    /// Nodes that need configs of a revision cut for another render version than the configurator's
    /// (`render::RENDER_VERSION`), which it cannot render: they keep what they run.
    OtherRenderVersion {
        revision: String,
        version: u32,
        count: u32,
        first: Vec<String>,
    },
    /// The caller did not supply rendered hashes for these nodes.
    MissingRender {
        revision: String,
        count: u32,
        first: Vec<String>,
    },
    /// A revision failed while no revision had ever completed: nothing more is assigned.
    NoLastGood { failed: String },
}

fn names(f: &mut fmt::Formatter<'_>, count: u32, first: &[String]) -> fmt::Result {
    write!(f, "{}", first.join(", "))?;
    if count as usize > first.len() {
        write!(f, " and {} more", count as usize - first.len())?;
    }
    Ok(())
}

impl fmt::Display for WaitingOn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitingOn::NoTarget => write!(f, "no revision to roll out"),
            WaitingOn::InvalidPolicy { errors } => {
                write!(f, "invalid rollout policy: {}", errors.join("; "))
            }
            WaitingOn::ValidationErrors { errors } => write!(
                f,
                "fleet validation fails now: no further node gets it: {}",
                errors.join("; ")
            ),
            WaitingOn::Paused { since } => {
                write!(f, "paused (spec.paused) since {}", since.to_time().0)
            }
            WaitingOn::Held { removal } => write!(
                f,
                "held as a destructive change: it {removal}; resume it to approve (spec.paused: \
                 false), or restore the inputs"
            ),
            WaitingOn::Canaries { pending } => {
                write!(f, "waiting for {pending} canary node(s) to update")
            }
            WaitingOn::CanaryBake { until } => {
                write!(f, "canaries updated; baking until {}", until.to_time().0)
            }
            WaitingOn::Budget { in_flight, budget } => write!(
                f,
                "waiting for budget: {in_flight} node(s) in flight, maxUnavailable {budget}"
            ),
            WaitingOn::DomainBudget {
                domain,
                in_flight,
                budget,
            } => write!(
                f,
                "waiting for budget in domain {domain:?}: {in_flight} in flight, maxUnavailablePerDomain {budget}"
            ),
            WaitingOn::NodesInFlight { count, first } => {
                write!(f, "{count} node(s) applying: ")?;
                names(f, *count, first)
            }
            WaitingOn::NotReady { count, first } => {
                write!(f, "{count} node(s) not ready or cordoned, left for later: ")?;
                names(f, *count, first)
            }
            WaitingOn::UnreadableConfigs { count, first } => {
                write!(
                    f,
                    "{count} node(s) whose NodeNetworkConfig cannot be decoded, state unknown, left \
                     for later: "
                )?;
                names(f, *count, first)
            }
            WaitingOn::Quarantined { count, first } => {
                write!(
                    f,
                    "{count} node(s) quarantined (they kept failing revisions other nodes \
                     provisioned), left on their last good config until an admin releases them: "
                )?;
                names(f, *count, first)
            }
            WaitingOn::AgentLacksFeatures {
                count,
                first,
                missing,
            } => {
                write!(
                    f,
                    "{count} node(s) wait for their agent: their config needs {missing}, which \
                     their agent does not declare (upgrade it; they keep what they run meanwhile): "
                )?;
                names(f, *count, first)
            }
            WaitingOn::OtherRenderVersion {
                revision,
                version,
                count,
                first,
            } => {
                write!(
                    f,
                    "{revision} was cut for render version {version} and this configurator renders \
                     version {}: it cannot put {count} node(s) on it, so they keep what they run (a \
                     configurator that renders version {version} can): ",
                    crate::render::RENDER_VERSION
                )?;
                names(f, *count, first)
            }
            WaitingOn::MissingRender {
                revision,
                count,
                first,
            } => {
                write!(f, "no rendered config of {revision} for {count} node(s): ")?;
                names(f, *count, first)
            }
            WaitingOn::NoLastGood { failed } => write!(
                f,
                "{failed} failed and no revision has ever completed: nothing more is assigned; touched \
                 nodes keep what their agents restored locally"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queued_node_is_told_what_it_waits_for() {
        let mut report = Report {
            target: Some("rev-b".into()),
            ..Report::default()
        };
        assert!(
            report
                .queued_message(true)
                .unwrap()
                .starts_with("queued for revision rev-b")
        );
        assert!(
            report
                .queued_message(false)
                .unwrap()
                .starts_with("not Ready or cordoned")
        );
        report.target = None;
        assert_eq!(
            report.queued_message(true),
            None,
            "no revision: nothing to wait for"
        );
        report.waiting = vec![WaitingOn::NoLastGood {
            failed: "rev-a".into(),
        }];
        let m = report.queued_message(true).unwrap();
        assert!(m.contains("rev-a failed"), "{m}");
    }
}
