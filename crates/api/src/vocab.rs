//! The words netwave's objects carry on the wire, spelled once: revision and node phases, condition
//! statuses, and the node-status reasons another component acts on. The schema keeps these fields free
//! strings (DESIGN §2: a value written by a newer netwave is kept, not refused), so every `parse`
//! answers `None` for a word it does not know, and nothing interprets it.

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

/// `NodeNetworkConfig.status.reason` values that another component than the agent acts on. (The
/// agent's own verdicts are `netwave_agent::reconcile::Reason`.)
pub mod node_reasons {
    /// The agent refused a spec whose `config` does not hash to its `configHash` (edited by hand, not
    /// written by the configurator). The kernel was not touched. Not a verdict on the revision: the
    /// rollout does not count it as a node failure, and the configurator puts the spec back.
    pub const CONFIG_TAMPERED: &str = "ConfigTampered";
    /// Recorded by the configurator for a node that did not report in time (`applyTimeoutSeconds`).
    pub const APPLY_TIMEOUT: &str = "ApplyTimeout";
    /// The agent's last good backup (`last-good.json` in its state dir) is corrupt: it does not parse,
    /// its checksum does not match, or its generation is wrong. The agent refuses every apply and
    /// touches no kernel object until an admin repairs it (moves the file aside), since it could not
    /// roll a failed apply back. Unlike `ConfigTampered` this *is* a node failure for the rollout: the
    /// node cannot take the revision, and it must not be moved on to new configs silently.
    pub const BACKUP_CORRUPT: &str = "BackupCorrupt";
}

/// Field managers (server-side apply ownership): who wrote a field.
pub mod managers {
    /// Every configurator write: revisions, their status, node specs.
    pub const CONFIGURATOR: &str = "netwave-configurator";
    /// Every agent write: node status, the Node's NetworkReady condition.
    pub const AGENT: &str = "netwave-agent";
}
