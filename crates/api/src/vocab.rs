//! The words netwave's objects carry on the wire, spelled once for every crate (core, the shells, the
//! plugin, the tests): revision and node phases, condition types and statuses, the reasons written
//! beside them, and probe results. The schema keeps these fields free strings (DESIGN §2: a value
//! written by a newer netwave is kept, not refused), so every `parse` answers `None` for a word it does
//! not know, and nothing interprets it.
//!
//! ```text
//!   NetworkConfigRevision.status   phase: RevisionPhase   conditions[type: RevisionCondition,
//!                                                          status: ConditionStatus, reason: revision_reasons]
//!   NodeNetworkConfig.status       phase: NodePhase (agent) | node_phases (configurator placeholders)
//!                                  reason: NodeReason (agent) | node_reasons (read by others)
//!                                  conditions[type: node_conditions::QUARANTINED]
//!                                  probes[].result: probe_results
//!   Node.status.conditions         node_conditions::READY (kubelet), node_conditions::NETWORK_READY (agent)
//!   input objects' status          conditions[type: input_conditions::ACCEPTED, reason: accepted_reasons]
//! ```

/// `NetworkConfigRevision.status.phase`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RevisionPhase {
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

impl RevisionPhase {
    /// Every phase, in lifecycle order (metric label values, dashboards).
    pub const ALL: [RevisionPhase; 5] = [
        RevisionPhase::Pending,
        RevisionPhase::Progressing,
        RevisionPhase::Complete,
        RevisionPhase::Failed,
        RevisionPhase::Superseded,
    ];

    /// The phase a status names; `None` for no phase yet and for anything unknown (a phase written by
    /// a newer configurator is not ours to interpret).
    pub fn parse(s: Option<&str>) -> Option<RevisionPhase> {
        let s = s?;
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            RevisionPhase::Pending => "Pending",
            RevisionPhase::Progressing => "Progressing",
            RevisionPhase::Complete => "Complete",
            RevisionPhase::Failed => "Failed",
            RevisionPhase::Superseded => "Superseded",
        }
    }
}

/// `NodeNetworkConfig.status.phase`, written by the node's agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NodePhase {
    /// Applying the spec's config.
    Provisioning,
    /// The spec's config runs and passed its health checks.
    Provisioned,
    /// The spec's config was refused or rolled back; the node runs its last good config.
    Invalid,
}

impl NodePhase {
    pub const ALL: [NodePhase; 3] = [
        NodePhase::Provisioning,
        NodePhase::Provisioned,
        NodePhase::Invalid,
    ];

    /// `None` for anything unknown: neither a success nor a failure.
    pub fn parse(s: &str) -> Option<NodePhase> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            NodePhase::Provisioning => "Provisioning",
            NodePhase::Provisioned => "Provisioned",
            NodePhase::Invalid => "Invalid",
        }
    }
}

/// `Condition.status`: Kubernetes spells a tri-state as strings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

impl ConditionStatus {
    pub const ALL: [ConditionStatus; 3] = [
        ConditionStatus::True,
        ConditionStatus::False,
        ConditionStatus::Unknown,
    ];

    /// `None` for anything but the three words Kubernetes defines.
    pub fn parse(s: &str) -> Option<ConditionStatus> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }

    pub const fn of(b: bool) -> ConditionStatus {
        if b {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        }
    }
}

/// The condition types a revision's status carries, in the order they are kept in status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RevisionCondition {
    Validated,
    Progressing,
    Available,
    Degraded,
    Paused,
    /// kstatus ([`kstatus`]): the rollout is complete.
    Ready,
    /// kstatus: the rollout is moving.
    Reconciling,
    /// kstatus: the rollout cannot go on without someone (failed, held, paused, past its deadline).
    Stalled,
}

impl RevisionCondition {
    /// Every type, in the order status keeps them.
    pub const ALL: [RevisionCondition; 8] = [
        RevisionCondition::Validated,
        RevisionCondition::Progressing,
        RevisionCondition::Available,
        RevisionCondition::Degraded,
        RevisionCondition::Paused,
        RevisionCondition::Ready,
        RevisionCondition::Reconciling,
        RevisionCondition::Stalled,
    ];

    /// `None` for a condition type netwave does not write.
    pub fn parse(s: &str) -> Option<RevisionCondition> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            RevisionCondition::Validated => "Validated",
            RevisionCondition::Progressing => "Progressing",
            RevisionCondition::Available => "Available",
            RevisionCondition::Degraded => "Degraded",
            RevisionCondition::Paused => "Paused",
            RevisionCondition::Ready => kstatus::READY,
            RevisionCondition::Reconciling => kstatus::RECONCILING,
            RevisionCondition::Stalled => kstatus::STALLED,
        }
    }
}

/// The condition types generic tools compute an object's health from — kstatus, the convention of
/// `sigs.k8s.io/cli-utils` that `kubectl wait`, Flux's health checks and cli-utils read — on every
/// netwave kind the configurator writes status for (revisions and input objects). With
/// `status.observedGeneration`: an object whose spec was not judged yet is in progress.
///
/// | the rollout (of the revision that carries an input) | Ready | Reconciling | Stalled | kstatus |
/// |---|---|---|---|---|
/// | no status yet, `Pending`, `Progressing` (also baking canaries) | False | True | False | InProgress |
/// | `Complete` | True | False | False | Current |
/// | `Failed`, held as a destructive change, paused, past its progress deadline, invalid policy | False | False | True | Failed |
/// | `Superseded` (revisions only) | — | — | — | Current |
///
/// A superseded revision carries none of the three: kstatus reads `Ready=False` as in progress, and
/// nothing is left to do for it. A held or paused rollout is `Stalled`: it does not go on until an admin acts, so a tool waiting
/// for it (a GitOps engine's health check before its next wave or cluster) must not see it healthy
/// and must not wait for ever either. An input object fleet validation refuses is `Stalled` too.
pub mod kstatus {
    pub const READY: &str = "Ready";
    pub const RECONCILING: &str = "Reconciling";
    pub const STALLED: &str = "Stalled";
    /// Reason on an input object while its inputs cannot become a revision (too large).
    pub const INPUTS_NOT_CUT: &str = "InputsNotCut";
    /// Reason while there is no status yet.
    pub const PENDING: &str = "Pending";
}

/// `NetworkConfigRevision.status.conditions[].reason` values (and the Event reasons that share them).
/// Tests, the alerts and `kubectl` users match on them.
pub mod revision_reasons {
    pub const PROGRESS_DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";
    pub const VALIDATION_FAILED: &str = "ValidationFailed";
    pub const MAX_FAILURES_REACHED: &str = "MaxFailuresReached";
    pub const INVALID_POLICY: &str = "InvalidPolicy";
    pub const ROLLOUT_PAUSED: &str = "RolloutPaused";
    /// Held: the target removes much of what the last good revision puts on the nodes.
    pub const DESTRUCTIVE_CHANGE: &str = "DestructiveChange";
    pub const ROLLOUT_COMPLETE: &str = "RolloutComplete";
    pub const CANARY_BAKE: &str = "CanaryBake";
    pub const ROLLOUT_PROGRESSING: &str = "RolloutProgressing";
    pub const SUPERSEDED: &str = "Superseded";
    pub const VALIDATED: &str = "Validated";
    /// `Paused=True`: `spec.paused` (an admin's pause, `kubectl netwave pause`), not a hold.
    pub const PAUSED_BY_SPEC: &str = "PausedBySpec";
    pub const NOT_PAUSED: &str = "NotPaused";
    pub const ALL_NODES_UPDATED: &str = "AllNodesUpdated";
    pub const ROLLOUT_INCOMPLETE: &str = "RolloutIncomplete";
    pub const NO_FAILURES: &str = "NoFailures";
    pub const NODES_FAILED: &str = "NodesFailed";
    pub const REVISION_FAILED: &str = "RevisionFailed";
}

/// `NodeNetworkConfig.status.phase` values the configurator writes while the agent has nothing to say
/// yet; [`NodePhase::parse`] answers `None` for them (not applied, neither success nor failure).
pub mod node_phases {
    /// The config was re-rendered under the revision the agent reported `Provisioned` for (a Node label
    /// change, say), until the agent reports on the new config.
    pub const PENDING: &str = "Pending";
    /// A placeholder NNC (`spec.revision` empty): the node waits for its first config.
    pub const QUEUED: &str = "Queued";
}

/// The agent's verdict in `NodeNetworkConfig.status.reason` when it did not provision a config.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NodeReason {
    InvalidConfig,
    KernelUnsupported,
    ApplyFailed,
    HealthCheckFailed,
    /// The agent died mid-apply; the last good config was restored at start.
    ApplyInterrupted,
    /// The spec's config does not hash to its configHash: refused without touching the kernel
    /// ([`node_reasons::CONFIG_TAMPERED`]).
    ConfigTampered,
    /// The config has BGP content and FRR is off on this node, or FRR's check cannot run: refused
    /// before any change, instead of applying the kernel half.
    FrrUnavailable,
    /// FRR's own check (`vtysh -C`) refused the rendered text: refused before any change.
    FrrRejected,
    /// Writing, reloading or converging FRR's config failed after the kernel was changed: the last
    /// good config was restored (kernel and FRR).
    FrrReloadFailed,
    /// The last good backup is corrupt: refused before any change, and every apply after it, until an
    /// admin moves the file aside ([`node_reasons::BACKUP_CORRUPT`]).
    BackupCorrupt,
    /// The spec's config has a field this agent does not know (a newer configurator wrote it): refused
    /// before any change, never applied in part; the message names the field and the agent's version.
    UnknownField,
}

impl NodeReason {
    pub const ALL: [NodeReason; 11] = [
        NodeReason::InvalidConfig,
        NodeReason::KernelUnsupported,
        NodeReason::ApplyFailed,
        NodeReason::HealthCheckFailed,
        NodeReason::ApplyInterrupted,
        NodeReason::ConfigTampered,
        NodeReason::FrrUnavailable,
        NodeReason::FrrRejected,
        NodeReason::FrrReloadFailed,
        NodeReason::BackupCorrupt,
        NodeReason::UnknownField,
    ];

    /// `None` for a reason the agent does not write (the configurator's `ApplyTimeout`, a newer
    /// agent's word).
    pub fn parse(s: &str) -> Option<NodeReason> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            NodeReason::InvalidConfig => "InvalidConfig",
            NodeReason::KernelUnsupported => "KernelUnsupported",
            NodeReason::ApplyFailed => "ApplyFailed",
            NodeReason::HealthCheckFailed => "HealthCheckFailed",
            NodeReason::ApplyInterrupted => "ApplyInterrupted",
            NodeReason::ConfigTampered => node_reasons::CONFIG_TAMPERED,
            NodeReason::FrrUnavailable => "FrrUnavailable",
            NodeReason::FrrRejected => "FrrRejected",
            NodeReason::FrrReloadFailed => "FrrReloadFailed",
            NodeReason::BackupCorrupt => node_reasons::BACKUP_CORRUPT,
            NodeReason::UnknownField => "UnknownField",
        }
    }
}

impl std::fmt::Display for NodeReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `NodeNetworkConfig.status.reason` values that another component than the agent acts on. (The
/// agent's own verdicts are `netwave_agent::reconcile::Reason`.)
pub mod node_reasons {
    /// The agent refused a spec whose `config` does not hash to its `configHash` (edited by hand, not
    /// written by the configurator). The kernel was not touched. Not a verdict on the revision: the
    /// rollout does not count it as a node failure, and the configurator puts the spec back.
    pub const CONFIG_TAMPERED: &str = "ConfigTampered";
    /// Recorded by the configurator for a node whose agent started applying this attempt but did not
    /// report its verdict within `applyTimeoutSeconds` of that start.
    pub const APPLY_TIMEOUT: &str = "ApplyTimeout";
    /// Recorded by the configurator for a node whose agent did not start applying (no `Provisioning`
    /// report, nor a verdict, for this revision and retry) within `pickupTimeoutSeconds` of the
    /// assignment: a dead agent, a deleted pod, an agent that cannot reach the API server.
    pub const PICKUP_TIMEOUT: &str = "PickupTimeout";
    /// The agent's last good backup (`last-good.json` in its state dir) is corrupt: it does not parse,
    /// its checksum does not match, or its generation is wrong. The agent refuses every apply and
    /// touches no kernel object until an admin repairs it (moves the file aside), since it could not
    /// roll a failed apply back. Unlike `ConfigTampered` this *is* a node failure for the rollout: the
    /// node cannot take the revision, and it must not be moved on to new configs silently.
    pub const BACKUP_CORRUPT: &str = "BackupCorrupt";
    /// Recorded by the configurator (on the revision's `failedNodes`, never counted against
    /// `maxFailures`) for a node whose agent reported `Invalid` for a revision and retry its spec does
    /// not name: a verdict on a config it was never given. The verdict is ignored and the node is not
    /// given that revision; it keeps what it runs. With quarantine on, such reports count towards the
    /// node's quarantine like failures do.
    pub const PROTOCOL_VIOLATION: &str = "ProtocolViolation";
}

/// Condition types on Nodes and NodeNetworkConfigs.
pub mod node_conditions {
    /// Kubernetes' own `Node` condition (the kubelet's): a node is eligible for a rollout only while it
    /// is `True`.
    pub const READY: &str = "Ready";
    /// The `Node` condition the agent writes: the node's network config is applied.
    pub const NETWORK_READY: &str = "NetworkReady";
    /// On a quarantined node's NodeNetworkConfig (written by the configurator).
    pub const QUARANTINED: &str = "Quarantined";
}

/// `NodeNetworkConfig.status.probes[].result`.
pub mod probe_results {
    pub const PASSED: &str = "Passed";
    pub const FAILED: &str = "Failed";
}

/// The condition and its reasons on every input object (VRFRouteConfiguration,
/// Layer2NetworkConfiguration, RoutingTable); see `crate::input_status`.
pub mod input_conditions {
    /// The condition type on every input object.
    pub const ACCEPTED: &str = "Accepted";
}

/// `status.conditions[Accepted].reason` values on input objects.
pub mod accepted_reasons {
    /// Fleet validation finds no problem with this object.
    pub const VALID: &str = "Valid";
    /// Fleet validation finds problems with this object (its own fields, or with other objects).
    pub const INVALID: &str = "Invalid";
    /// Nothing wrong with this object, but the revision made from the current inputs fails validation
    /// because of other objects (or no revision can be made from them: they fold into more than one
    /// object can hold): no node gets it either.
    pub const REVISION_INVALID: &str = "RevisionInvalid";
}

/// Field managers (server-side apply ownership): who wrote a field.
pub mod managers {
    /// Every configurator write: revisions, their status, node specs.
    pub const CONFIGURATOR: &str = "netwave-configurator";
    /// Every agent write: node status, the Node's NetworkReady condition.
    pub const AGENT: &str = "netwave-agent";
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DESIGN §2: a word written by a newer netwave is kept and not interpreted.
    #[test]
    fn parse_answers_none_for_unknown_words() {
        assert_eq!(RevisionPhase::parse(Some("Rolling")), None);
        assert_eq!(NodePhase::parse(node_phases::PENDING), None);
        assert_eq!(NodePhase::parse(node_phases::QUEUED), None);
        assert_eq!(ConditionStatus::parse("true"), None);
        assert_eq!(RevisionCondition::parse("Healthy"), None);
        assert_eq!(NodeReason::parse(node_reasons::APPLY_TIMEOUT), None);
    }

    #[test]
    fn every_word_parses_back_to_itself() {
        for p in RevisionPhase::ALL {
            assert_eq!(RevisionPhase::parse(Some(p.as_str())), Some(p));
        }
        for p in NodePhase::ALL {
            assert_eq!(NodePhase::parse(p.as_str()), Some(p));
        }
        for c in ConditionStatus::ALL {
            assert_eq!(ConditionStatus::parse(c.as_str()), Some(c));
        }
        for c in RevisionCondition::ALL {
            assert_eq!(RevisionCondition::parse(c.as_str()), Some(c));
        }
        for r in NodeReason::ALL {
            assert_eq!(NodeReason::parse(r.as_str()), Some(r));
        }
    }
}
