//! The rollout kinds: `NetworkConfigRevision` (one immutable, content-addressed snapshot of all inputs,
//! plus the admin knobs and rollout status), `NetworkConfigInputs` (that snapshot, stored apart under the
//! revision's name) and `NodeNetworkConfig` (one per node; the configurator writes `spec`, the node's
//! agent writes `status`).
//!
//! Status schemas are deliberately permissive (strings, not enums): a rollback of netwave itself must
//! never make stored status invalid against an older CRD.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::inputs::{
    BGPPeeringSpec, Layer2NetworkConfigurationSpec, MirrorDirection, MirrorSelectorSpec,
    MirrorTargetSpec, MirrorTargetType, PrefixItem, RouteType, RoutingTableSpec, TrafficMatch,
    UnderlayNeighborSpec, UnderlaySpec, UnderlayTimersSpec, VRFRouteConfigurationSpec,
};

/// Annotation on a NodeNetworkConfig: RFC 3339 time the configurator assigned `spec.revision`. The apply
/// timeout counts from here, so a dead or brand-new agent also times out.
pub const ASSIGNED_AT_ANNOTATION: &str = "netwave.dev/assigned-at";

/// `status.phase` of a NodeNetworkConfig whose config was re-rendered under the revision its agent reported
/// `Provisioned` for (a Node label change, say), until the agent reports on the new config. Written by the
/// configurator right after the new spec, and only if the agent has not written status since; the
/// agent's next report replaces it. Without it the old `Provisioned` would read as applied.
pub const NODE_PHASE_PENDING: &str = crate::vocab::node_phases::PENDING;

/// `status.phase` that configurators before #28 wrote on a placeholder (`spec.revision` empty), with
/// `status.message` saying what the node waits for. Now that is [`QUEUED_ANNOTATION`], written with the
/// placeholder itself; this is still read from placeholders an older configurator left.
pub const NODE_PHASE_QUEUED: &str = crate::vocab::node_phases::QUEUED;

/// Annotation on a placeholder NodeNetworkConfig (`spec.revision` empty), written by the configurator
/// when it creates it: what the node waits for ("queued for revision … in the rollout", "not Ready or
/// cordoned"). Carried in the object it is created with, so a queued node costs one write, not a
/// create and a status write; `kubectl get nnc` shows it (column `Queued`). The assignment that
/// replaces the placeholder sets it empty (it cannot remove a field its create owns), and the node's
/// next assignment removes it.
pub const QUEUED_ANNOTATION: &str = "netwave.dev/queued";

/// Annotation on a NodeNetworkConfig, written by the configurator (an agent can write only the status):
/// the revisions the node failed in a row while other nodes provisioned them, `name@sequence`
/// separated by spaces, oldest first (`spec.rollout.quarantine`).
pub const FAILURE_STREAK_ANNOTATION: &str = "netwave.dev/failure-streak";

/// Annotation on a NodeNetworkConfig, written by the configurator: the node is quarantined
/// (`spec.rollout.quarantine`), and since when and why. It gets no new revision and its failures do
/// not count against `maxFailures` until an admin removes this annotation (`kubectl annotate nnc
/// <node> netwave.dev/quarantined-`, or `kubectl netwave release <node>`).
pub const QUARANTINED_ANNOTATION: &str = "netwave.dev/quarantined";

/// `status.conditions` type on a quarantined node's NodeNetworkConfig (written by the configurator).
pub const QUARANTINED_CONDITION: &str = crate::vocab::node_conditions::QUARANTINED;

/// See [`crate::vocab::node_reasons::CONFIG_TAMPERED`].
pub const REASON_CONFIG_TAMPERED: &str = crate::vocab::node_reasons::CONFIG_TAMPERED;

/// One immutable snapshot of every input, and the rollout of it across the fleet.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "netwave.dev",
    version = "v1alpha1",
    kind = "NetworkConfigRevision",
    plural = "networkconfigrevisions",
    shortname = "ncr",
    category = "netwave",
    status = "NetworkConfigRevisionStatus",
    derive = "PartialEq",
    doc = "An immutable, content-addressed snapshot of all netwave inputs and the state of its rollout. The inputs themselves are in the NetworkConfigInputs object of the same name (kubectl get nci NAME -o yaml).",
    printcolumn(name = "Seq", type_ = "integer", json_path = ".spec.sequence"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Updated",
        type_ = "integer",
        json_path = ".status.reached.updated"
    ),
    printcolumn(name = "Total", type_ = "integer", json_path = ".status.reached.total"),
    printcolumn(
        name = "Running",
        type_ = "integer",
        json_path = ".status.updated",
        priority = 1
    ),
    printcolumn(
        name = "In-Progress",
        type_ = "integer",
        json_path = ".status.inProgress"
    ),
    printcolumn(name = "Failed", type_ = "integer", json_path = ".status.failed"),
    printcolumn(
        name = "Failed-Node",
        type_ = "string",
        json_path = ".status.failedNodes[0].node"
    ),
    printcolumn(name = "Paused", type_ = "boolean", json_path = ".spec.paused"),
    printcolumn(
        name = "Hash",
        type_ = "string",
        json_path = ".spec.hash",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfigRevisionSpec {
    /// Hex sha256 of the canonical serialization of the inputs (the `NetworkConfigInputs` object of the
    /// same name). Never changes.
    // Enforced by the API server (CEL): whoever may pause a rollout (patch on revisions) must not be able
    // to change what the revision is.
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self == oldSelf",
        "message": "spec.hash is immutable: a revision is what its hash says"
    }]))]
    pub hash: String,
    /// Monotonic revision number; the newest revision that is not `Failed` is the rollout target.
    pub sequence: u64,
    /// How the rollout proceeds. Admins may edit these while it runs.
    #[serde(default)]
    pub rollout: RolloutPolicy,
    /// Stop making new assignments; nodes already in flight finish.
    #[serde(default)]
    pub paused: bool,
    /// Bump to re-arm a `Failed` revision: it is rolled out again and agents re-apply it.
    #[serde(default)]
    pub retry: u32,
}

/// Every input object at the time of the snapshot, each list sorted by name: the spec of the
/// `NetworkConfigInputs` object named after its revision. Stored apart from the revision so that the
/// revision stays small: `kubectl describe ncr` shows its status and Events without the inputs in front,
/// and every status write and watch event of a revision does not carry them.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "netwave.dev",
    version = "v1alpha1",
    kind = "NetworkConfigInputs",
    plural = "networkconfiginputs",
    shortname = "nci",
    category = "netwave",
    derive = "PartialEq",
    doc = "The folded inputs of the NetworkConfigRevision of the same name (every VRF, layer-2 and routing-table spec when it was cut). Written once by the configurator, owned by its revision, never changed.",
    printcolumn(
        name = "VRFs",
        type_ = "string",
        json_path = ".spec.vrfs[*].name",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
// Enforced by the API server (CEL), like the revision's spec.hash: the inputs are what the hash says.
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self == oldSelf",
    "message": "the inputs of a revision are immutable: edit the VRF, layer-2 or routing-table objects instead; the configurator cuts a new revision from them"
}]))]
#[serde(rename_all = "camelCase")]
pub struct RevisionInputs {
    #[serde(default)]
    pub vrfs: Vec<NamedVrf>,
    #[serde(default)]
    pub layer2s: Vec<NamedLayer2>,
    #[serde(default)]
    pub routing_tables: Vec<NamedRoutingTable>,
    /// Left out when empty, so revisions cut before BGPPeerings existed keep their hash.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bgp_peerings: Vec<NamedBgpPeering>,
    /// Left out when empty, so revisions cut before mirroring existed keep their hash.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mirror_targets: Vec<NamedMirrorTarget>,
    /// Left out when empty, like `mirrorTargets`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mirror_selectors: Vec<NamedMirrorSelector>,
    /// Left out when empty, so revisions cut before Underlays existed keep their hash.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub underlays: Vec<NamedUnderlay>,
    /// The configurator rendering this revision's node configs come from (`RENDER_VERSION` in
    /// netwave-core's render). A configurator renders only revisions of its own version: one that
    /// renders differently cuts a new revision, which rolls out in waves, instead of rewriting the
    /// node configs of an existing one. Left out for version 1, so revisions cut before render versions
    /// existed keep their hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 2))]
    pub render_version: Option<u32>,
}

// One input object in a revision's inputs: its name and spec. (A comment, not a doc: the CRD schema
// stays what it was when each kind had its own struct.)
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct Named<S> {
    pub name: String,
    pub spec: S,
}

impl<S> Named<S> {
    pub fn new(name: impl Into<String>, spec: S) -> Self {
        Named {
            name: name.into(),
            spec,
        }
    }
}

pub type NamedVrf = Named<VRFRouteConfigurationSpec>;
pub type NamedLayer2 = Named<Layer2NetworkConfigurationSpec>;
pub type NamedRoutingTable = Named<RoutingTableSpec>;
pub type NamedBgpPeering = Named<BGPPeeringSpec>;
pub type NamedMirrorTarget = Named<MirrorTargetSpec>;
pub type NamedMirrorSelector = Named<MirrorSelectorSpec>;
pub type NamedUnderlay = Named<UnderlaySpec>;

/// The schema pattern of the string form of a count-or-percent: 1% to 100% (what
/// [`CountOrPercent::parse`] accepts; 0% would never let a node move).
pub const PERCENT_PATTERN: &str = "^(100|[1-9][0-9]?)%$";

/// A `maxUnavailable`-style budget: a count of nodes (at least 1) or a share of a node set (1% to 100%).
/// The one parser for it, used for the CRD fields and the configurator's flags alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CountOrPercent {
    Count(u32),
    Percent(u32),
}

/// A value that is not a count-or-percent, and why.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("{value:?}: {reason}")]
pub struct CountOrPercentError {
    pub value: String,
    pub reason: &'static str,
}

impl CountOrPercent {
    /// `2` or `"10%"`, as written in a command-line flag.
    pub fn parse(s: &str) -> Result<Self, CountOrPercentError> {
        let err = |reason| CountOrPercentError {
            value: s.to_string(),
            reason,
        };
        match s.strip_suffix('%') {
            // `PERCENT_PATTERN`'s digits: no sign, no leading zero.
            Some(p) if p.starts_with(|c: char| !c.is_ascii_digit() || c == '0') => {
                Err(err("a percentage must be 1% to 100%"))
            }
            Some(p) => match p.parse::<u32>() {
                Ok(v @ 1..=100) => Ok(CountOrPercent::Percent(v)),
                _ => Err(err("a percentage must be 1% to 100%")),
            },
            None => match s.parse::<u32>() {
                Ok(0) => Err(err(
                    "a count must be at least 1 (0 would never let a node move)",
                )),
                Ok(v) => Ok(CountOrPercent::Count(v)),
                Err(_) => Err(err(
                    "want a count (2) or a percentage from 1% to 100% (\"10%\")",
                )),
            },
        }
    }

    /// The API's int-or-string form: an integer ≥ 1 or a string `"N%"`.
    pub fn from_api(value: &IntOrString) -> Result<Self, CountOrPercentError> {
        match value {
            IntOrString::Int(n) => match u32::try_from(*n) {
                Ok(n @ 1..) => Ok(CountOrPercent::Count(n)),
                _ => Err(CountOrPercentError {
                    value: n.to_string(),
                    reason: "a count must be at least 1 (0 would never let a node move)",
                }),
            },
            IntOrString::String(s) if s.ends_with('%') => Self::parse(s),
            IntOrString::String(s) => Err(CountOrPercentError {
                value: s.clone(),
                reason: "want a count (2) or a percentage from 1% to 100% (\"10%\")",
            }),
        }
    }

    /// The number of nodes this allows for a set of `base` nodes: never below 1, so a rollout over a
    /// small or mostly-unready fleet still moves.
    pub fn of(self, base: usize) -> u32 {
        match self {
            CountOrPercent::Count(n) => n.max(1),
            CountOrPercent::Percent(p) => ((base as u64 * p as u64 / 100) as u32).max(1),
        }
    }
}

/// Rollout knobs. Anything omitted falls back to the configurator's defaults.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutPolicy {
    /// Nodes in flight at once: a count (`2`) or a share of eligible nodes (`"10%"`, rounded down, at
    /// least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = PERCENT_PATTERN, "minimum" = 1))]
    pub max_unavailable: Option<IntOrString>,
    /// Failed nodes that halt the rollout and roll touched nodes back. Defaults to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_failures: Option<u32>,
    /// How long a node's agent may take to apply a revision: a node not `Provisioned` this long after
    /// its agent started this attempt (the `lastTransitionTime` of its `Provisioning` report for this
    /// revision and retry) has failed (`ApplyTimeout`). Counted from the agent's start, not from the
    /// assignment, so an API server slow to deliver the assignment or the report fails no node. The
    /// start is read no earlier than the assignment and no later than the pickup deadline
    /// (`pickupTimeoutSeconds`), so a skewed agent clock moves it at most within that window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub apply_timeout_seconds: Option<u32>,
    /// How long after assignment a node's agent may take to start applying (report `Provisioning`,
    /// or its verdict, for this revision and retry). A node whose agent has not started by then has
    /// failed (`PickupTimeout`: a dead agent, a deleted pod, an agent that cannot reach the API
    /// server). Defaults to `applyTimeoutSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub pickup_timeout_seconds: Option<u32>,
    /// No node updated for this long sets `Progressing=False` (`ProgressDeadlineExceeded`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub progress_deadline_seconds: Option<u32>,
    /// Canary nodes go first, then the rollout waits `bakeSeconds` before continuing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<Canary>,
    /// Node label that names a failure domain (e.g. `topology.kubernetes.io/zone`); the rollout moves
    /// round-robin across domains.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_key: Option<String>,
    /// Nodes in flight at once within one failure domain: a count or a share of the domain's nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = PERCENT_PATTERN, "minimum" = 1))]
    pub max_unavailable_per_domain: Option<IntOrString>,
    /// Opt-in: a node that keeps failing revisions other nodes provision is quarantined instead of
    /// failing every revision for the fleet. Off when omitted (and by default): then one node's
    /// failure counts against `maxFailures` like any other's, so with `maxFailures: 1` a node whose
    /// agent reports `Invalid` on everything vetoes every change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantine: Option<Quarantine>,
}

/// `spec.rollout.quarantine`. A node that failed `afterConsecutiveFailures` revisions in a row, each
/// of which other nodes had provisioned and no other node failed, is quarantined: that failure and its
/// later ones do not count against `maxFailures`, it keeps its last good config and gets no new
/// revision until an admin releases it (removes the NodeNetworkConfig annotation
/// `netwave.dev/quarantined`). A node that failed the last revisions is given the next one after every
/// other node, so that evidence exists. A revision that fails on any other node halts as always.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Quarantine {
    /// Consecutive failures (of revisions other nodes provisioned) that quarantine a node.
    #[schemars(range(min = 1))]
    pub after_consecutive_failures: u32,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Canary {
    /// How many nodes (first in rollout order) are canaries. Ignored when `selector` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub count: Option<u32>,
    /// Nodes matching this selector are the canaries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// Wait this long after the last canary is updated before going on.
    #[serde(default)]
    pub bake_seconds: u32,
}

/// Rollout progress, written by the configurator only.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct NetworkConfigRevisionStatus {
    /// `Pending`, `Progressing`, `Complete`, `Failed` or `Superseded`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// `Validated`, `Progressing`, `Available`, `Degraded`, `Paused`.
    pub conditions: Vec<Condition>,
    /// Nodes in the fleet. Every revision counts against the whole fleet, so an older revision's
    /// `updated` says how many nodes still run it.
    pub total: u32,
    /// Nodes whose agent reports `Provisioned` for this revision.
    pub updated: u32,
    /// Nodes assigned this revision that have not reported yet.
    pub in_progress: u32,
    /// Eligible nodes not yet assigned.
    pub queued: u32,
    /// Nodes that failed this revision.
    pub failed: u32,
    /// Not Ready or cordoned nodes, left for later.
    pub skipped: u32,
    /// Nodes left for later because their agent lacks a feature their config of this revision needs
    /// (an agent older than the configurator, `netwave_api::features`); also counted in `skipped`.
    #[serde(skip_serializing_if = "is_zero")]
    pub waiting_for_agent: u32,
    /// The nodes that failed this attempt, in order. Past the first 50 an entry's `message` is left
    /// empty (the node's own status and its `NodeFailed` Event keep it), so a wave of thousands of
    /// failures still fits one object.
    pub failed_nodes: Vec<FailedNode>,
    pub validation: ValidationResult,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
    /// When `spec.paused` was first seen set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused_at: Option<Time>,
    /// Who set `spec.paused`: the field manager that owns it in `metadata.managedFields` (e.g.
    /// `kubectl-patch`, `kubectl-edit`, `argocd-controller`) and when it wrote it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused_by: Option<String>,
    /// Last time a node became updated (or the rollout became the target, resumed or was retried); the
    /// progress deadline counts from here. Kept in status so a new leader continues the same clock.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_progress_at: Option<Time>,
    /// When every canary was updated; the rollout continues `canary.bakeSeconds` after this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub canaries_updated_at: Option<Time>,
    /// The `spec.retry` value the current attempt belongs to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_retry: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// What the rollout is waiting on, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Set when the inputs went back to this revision's after a newer one: the sequence it is the
    /// target under now. `spec.sequence` stays its creation order (a revision never changes);
    /// ordering and the choice of target use [`effective_sequence`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_sequence: Option<u64>,
    /// When it was made the target again (see `activeSequence`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reactivated_at: Option<Time>,
    /// How far its rollout got while it was the target: the counts follow `updated` and `total`
    /// while it is, and stay as they were once it no longer is (superseded by a newer revision, or
    /// failed), so history says what happened. `updated` then says how many nodes still run it.
    /// Absent on a revision that was never the target under a configurator that records it
    /// (0.2.0 on), or was failed by validation before any node moved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reached: Option<Reached>,
}

/// `status.reached`: a revision's rollout counts as of its last step as the target.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Reached {
    /// Nodes whose agent reported `Provisioned` for it.
    pub updated: u32,
    /// Nodes in the fleet then.
    pub total: u32,
}

/// The sequence a revision is ordered by: `status.activeSequence` once it was reactivated, else
/// `spec.sequence`. The target is the revision with the highest one that is not `Failed`.
pub fn effective_sequence(rev: &NetworkConfigRevision) -> u64 {
    rev.status
        .as_ref()
        .and_then(|s| s.active_sequence)
        .map_or(rev.spec.sequence, |a| a.max(rev.spec.sequence))
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailedNode {
    pub node: String,
    pub reason: String,
    #[serde(default)]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<Time>,
    /// Does not count against `maxFailures`: the node was quarantined (`spec.rollout.quarantine`) when
    /// it failed or by this failure, or the entry is a protocol violation (`reason`
    /// `ProtocolViolation`: a verdict on a revision the node was not given). The name is kept for
    /// configurators before 0.2.0, which skip flagged entries the same way.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub quarantined: bool,
}

/// Fleet-wide validation of a revision before anything is rolled out.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct ValidationResult {
    /// Problems that block the revision.
    pub errors: Vec<String>,
    /// Problems worth knowing about that do not block it.
    pub warnings: Vec<String>,
}

/// The desired network configuration of one node, fully resolved. `metadata.name` is the node name.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "netwave.dev",
    version = "v1alpha1",
    kind = "NodeNetworkConfig",
    plural = "nodenetworkconfigs",
    shortname = "nnc",
    category = "netwave",
    status = "NodeNetworkConfigStatus",
    derive = "PartialEq",
    doc = "The fully resolved network configuration of one node (name = node name) and its agent's report.",
    printcolumn(name = "Revision", type_ = "string", json_path = ".spec.revision"),
    printcolumn(
        name = "Observed",
        type_ = "string",
        json_path = ".status.observedRevision"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Last-Good",
        type_ = "string",
        json_path = ".status.lastGoodRevision",
        priority = 1
    ),
    printcolumn(name = "Reason", type_ = "string", json_path = ".status.reason"),
    printcolumn(
        name = "Queued",
        type_ = "string",
        json_path = r".metadata.annotations.netwave\.dev/queued"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NodeNetworkConfigSpec {
    /// Name of the NetworkConfigRevision this config was rendered from. Empty in a placeholder: the
    /// node has not been assigned anything yet (it is queued in its first rollout; the annotation
    /// `netwave.dev/queued` says what for), and its agent changes nothing.
    pub revision: String,
    /// That revision's sequence.
    pub sequence: u64,
    /// Hex sha256 of `config`; equal hashes mean equal kernel state.
    pub config_hash: String,
    /// The revision's `spec.retry`: an agent re-applies a revision it reported `Invalid` only when this
    /// changes.
    #[serde(default)]
    pub retry: u32,
    pub config: NodeConfig,
}

/// Everything the agent creates on the node, with final device names and table ids.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeConfig {
    #[serde(default)]
    pub vrfs: Vec<VrfConfig>,
    #[serde(default)]
    pub layer2s: Vec<Layer2Config>,
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    #[serde(default)]
    pub rules: Vec<RuleConfig>,
    /// BGP sessions with workloads (BGPPeerings), by name. Left out when empty, so configs without
    /// them keep their hash.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bgp_peers: Vec<BgpPeerConfig>,
    /// GRE tunnels to mirror collectors (the MirrorTargets this node's mirrors use), by target name.
    /// Left out when empty, so configs without them keep their hash.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mirror_tunnels: Vec<MirrorTunnelConfig>,
    /// Traffic mirrors (MirrorSelectors) on this node, by name. Left out when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mirrors: Vec<MirrorConfig>,
    /// The EVPN underlay of the Underlay that selects this node. Left out when none does: the agent
    /// keeps its bootstrap underlay (`--frr-config`), and configs without one keep their hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub underlay: Option<UnderlayConfig>,
}

/// An Underlay on this node: what FRR's underlay sessions are rendered from, beside the node's own VTEP
/// address and router id.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnderlayConfig {
    /// The Underlay's name.
    pub name: String,
    pub asn: u32,
    pub neighbors: Vec<UnderlayNeighborSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timers: Option<UnderlayTimersSpec>,
}

/// A MirrorTarget on this node: its GRE tunnel, resolved.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MirrorTunnelConfig {
    /// The MirrorTarget's name.
    pub name: String,
    /// Tunnel device (`gre-<hash>` for l3gre, `gtap-<hash>` for l2gre, from the target's name).
    pub device: String,
    #[serde(rename = "type")]
    pub kind: MirrorTargetType,
    /// VRF device the tunnel is enslaved to and routes its packets in.
    pub vrf: String,
    /// This node's address of the target's source loopback (no prefix length).
    pub local: String,
    /// The collector (`spec.destinationIP`, canonical).
    pub remote: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<u32>,
}

/// What a MirrorSelector copies on this node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MirrorConfig {
    /// The MirrorSelector's name.
    pub name: String,
    /// The source: a layer-2 segment's VLAN or a VRF's name (one of the two).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vrf: Option<String>,
    pub direction: MirrorDirection,
    /// The tunnel device the copies go to (`mirrorTunnels[].device`).
    pub tunnel: String,
    /// The selector's `trafficMatch`, as written.
    #[serde(default)]
    pub traffic_match: TrafficMatch,
}

/// One BGPPeering on this node, resolved: where FRR listens or whom it calls, and the session's
/// settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BgpPeerConfig {
    /// The BGPPeering's name.
    pub name: String,
    /// VRF device the session lives in (the peering segment's VRF); the default VRF when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vrf: Option<String>,
    /// `peeringVlan`: the segment's anycast gateway subnets, canonical and sorted; FRR accepts
    /// sessions from any address in them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listen_ranges: Vec<String>,
    /// `loopbackPeer`: the workload addresses FRR peers with (multihop), canonical and sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    #[serde(rename = "remoteASN")]
    pub remote_asn: u32,
    #[serde(default)]
    pub bfd: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maximum_prefixes: Option<u32>,
    /// Seconds (`spec.holdTime`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_time: Option<u32>,
    /// Seconds (`spec.keepaliveTime`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keepalive_time: Option<u32>,
    /// Accepted from the workload, items with their effective `seq`, sorted by it.
    #[serde(default)]
    pub import: Vec<PrefixItem>,
    /// Announced to the workload, same form.
    #[serde(default)]
    pub export: Vec<PrefixItem>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VrfConfig {
    /// VRF name as the admin wrote it (`spec.vrf`).
    pub name: String,
    /// VRF device name.
    pub device: String,
    /// Kernel routing table bound to the VRF device.
    pub table: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vni: Option<u32>,
    pub mtu: u32,
    /// Bridge and VXLAN device of the layer-3 VNI, when the VRF has a VNI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vxlan: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_target: Option<String>,
    #[serde(default)]
    pub import: Vec<PrefixItem>,
    #[serde(default)]
    pub export: Vec<PrefixItem>,
    #[serde(default)]
    pub aggregate: Vec<String>,
    #[serde(default)]
    pub communities: Vec<String>,
    /// Source-based routing (`spec.sbrPrefixes`), when the VRF has any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sbr: Option<SbrConfig>,
    /// This node's loopback addresses in the VRF (`spec.loopbacks`), by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub loopbacks: Vec<LoopbackConfig>,
}

/// A VRF's source-based routing: policy rules in the default VRF send traffic from `prefixes` to the
/// table of a local VRF `device` whose BGP instance imports the VRF's and the default VRF's routes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SbrConfig {
    /// The local VRF device (`s-<vrf>`).
    pub device: String,
    /// Its kernel routing table.
    pub table: u32,
    /// Priority of the policy rules.
    pub priority: u32,
    /// Source prefixes, canonical and sorted.
    pub prefixes: Vec<String>,
}

/// One loopback address of this node in a VRF; it lives on the VRF device (the VRF's own loopback).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoopbackConfig {
    /// `spec.loopbacks[].name`.
    pub name: String,
    /// The subnet it was allocated from.
    pub subnet: String,
    /// This node's address, as a host prefix (`10.250.91.3/32`).
    pub address: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Layer2Config {
    pub vlan: u16,
    pub vni: u32,
    pub mtu: u32,
    /// Bridge device carrying the anycast gateway.
    pub bridge: String,
    /// VXLAN device enslaved to the bridge.
    pub vxlan: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anycast_mac: Option<String>,
    #[serde(default)]
    pub anycast_gateways: Vec<String>,
    /// VRF device the bridge is enslaved to; the default VRF when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vrf: Option<String>,
    #[serde(default)]
    pub neigh_suppression: bool,
    /// EVPN route target of the VNI; FRR's automatic one when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_target: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouteConfig {
    pub table: u32,
    pub prefix: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev: Option<String>,
    #[serde(rename = "type", default)]
    pub kind: RouteType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<u32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuleConfig {
    pub priority: u32,
    pub table: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iif: Option<String>,
    // Both omitted when unset, so a config without marks keeps its `configHash`.
    /// Firewall mark the packet must carry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fwmark: Option<u32>,
    /// Bits of the mark compared; all of them when omitted. A full mask on a non-zero mark is the
    /// kernel's default and is written omitted, so one kernel rule has one form (and one hash).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fwmask: Option<u32>,
}

impl NodeNetworkConfigSpec {
    /// A placeholder for a node that has not been assigned anything yet (see [`NODE_PHASE_QUEUED`]).
    pub fn placeholder() -> Self {
        NodeNetworkConfigSpec {
            revision: String::new(),
            sequence: 0,
            config_hash: String::new(),
            retry: 0,
            config: NodeConfig::default(),
        }
    }

    /// No revision is assigned: a placeholder, which nobody applies.
    pub fn is_placeholder(&self) -> bool {
        self.revision.is_empty()
    }
}

impl NodeNetworkConfig {
    /// What a placeholder's node waits for: [`QUEUED_ANNOTATION`], or the `Queued` status an older
    /// configurator wrote. `None` for an assignment.
    pub fn queued_message(&self) -> Option<&str> {
        if !self.spec.is_placeholder() {
            return None;
        }
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(QUEUED_ANNOTATION))
            .map(String::as_str)
            .filter(|m| !m.is_empty())
            .or_else(|| {
                let st = self.status.as_ref()?;
                (st.phase.as_deref() == Some(NODE_PHASE_QUEUED))
                    .then_some(st.message.as_deref())
                    .flatten()
            })
    }
}

impl NodeNetworkConfigStatus {
    /// What an assignment of `spec` over this status must mark `Pending`, because the status would
    /// otherwise tell something else: [`StaleReport::OlderConfig`] when it reports `Provisioned` for
    /// `spec.revision` but another config than `spec.configHash` (re-rendered under the same
    /// revision, and the agent has not reported on it yet), [`StaleReport::Queued`] when it still says
    /// `Queued` (a placeholder an older configurator marked so in its status).
    pub fn stale_for(&self, spec: &NodeNetworkConfigSpec) -> Option<StaleReport<'_>> {
        if self.phase.as_deref() == Some(crate::vocab::NodePhase::Provisioned.as_str())
            && self.observed_revision.as_deref() == Some(spec.revision.as_str())
        {
            let reported = self.config_hash.as_deref()?;
            return (reported != spec.config_hash).then_some(StaleReport::OlderConfig { reported });
        }
        (!spec.is_placeholder() && self.phase.as_deref() == Some(NODE_PHASE_QUEUED))
            .then_some(StaleReport::Queued)
    }
}

/// Why a node config's status no longer describes its spec (see [`NodeNetworkConfigStatus::stale_for`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StaleReport<'a> {
    /// `Provisioned` for the same revision with this other configHash.
    OlderConfig { reported: &'a str },
    /// `Queued`, over an assignment.
    Queued,
}

/// The agent's report, written by the node's agent (and phase `Pending` by the configurator).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct NodeNetworkConfigStatus {
    /// `Provisioning`, `Provisioned` or `Invalid` (the agent's); or the configurator's `Pending` (the
    /// config was re-rendered under the revision the agent reported `Provisioned` for, and the agent
    /// has not reported on the new one yet). `Queued` on placeholders of configurators before #28.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = crate::bounds::PHASE_MAX))]
    pub phase: Option<String>,
    /// Revision the phase refers to.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = crate::bounds::NAME_MAX))]
    pub observed_revision: Option<String>,
    /// `spec.retry` the phase refers to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_retry: Option<u32>,
    /// `spec.configHash` the phase refers to: a config re-rendered under the same revision and retry
    /// (a Node label change) is a new config, judged afresh even where the earlier one was `Invalid`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = crate::bounds::HASH_MAX))]
    pub observed_config_hash: Option<String>,
    /// `configHash` of the config the kernel is running now.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = crate::bounds::HASH_MAX))]
    pub config_hash: Option<String>,
    /// Newest revision this node ran healthily; what it restores on failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = crate::bounds::NAME_MAX))]
    pub last_good_revision: Option<String>,
    /// Machine-readable cause, e.g. `ApplyFailed`, `HealthCheckFailed`, `KernelUnsupported`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = crate::bounds::REASON_MAX))]
    pub reason: Option<String>,
    /// What happened, for people (at most 8 KiB: the agent cuts a longer one: `netwave_api::bounds`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = crate::bounds::MESSAGE_MAX))]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    #[schemars(length(max = crate::bounds::PROBES_MAX))]
    pub probes: Vec<ProbeResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = crate::bounds::VERSION_MAX))]
    pub agent_version: Option<String>,
    /// What the agent can apply beyond release 0.1.0 (`netwave_api::features`): the configurator
    /// assigns no config that needs a feature the node's agent does not declare. Agents before 0.2.0
    /// leave it out.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = crate::bounds::FEATURES_MAX), inner(length(max = crate::bounds::FEATURE_NAME_MAX)))]
    pub agent_features: Option<Vec<String>>,
    /// Kernel features by name (`vrf`, `vlan`, `bridgeVlanFiltering`, …) and whether they work.
    #[schemars(extend(
        "maxProperties" = crate::bounds::CAPABILITIES_MAX,
        "x-kubernetes-validations" = [{
            "rule": format!("self.all(k, size(k) <= {})", crate::bounds::CAPABILITY_NAME_MAX),
            "message": format!(
                "a kernel capability's name has at most {} characters",
                crate::bounds::CAPABILITY_NAME_MAX
            )
        }]
    ))]
    pub kernel_capabilities: BTreeMap<String, bool>,
    /// `metadata.generation` of the config the agent's conditions judge: kstatus (`kubectl wait`, Flux,
    /// cli-utils) takes the node config as in progress while it is older than the spec. Agents before
    /// 0.2.0 leave it out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// A map keyed by `type`, so each writer applies its own: the agent's kstatus conditions `Ready`,
    /// `Reconciling` and `Stalled` (#50: whether the node runs its config, is applying it, or refused
    /// it), and the configurator's `Quarantined` while the node is quarantined
    /// (`spec.rollout.quarantine`; the record itself is the annotation `netwave.dev/quarantined`, which
    /// the agent cannot write). Before 0.2.0 the list was atomic and only the configurator wrote it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend(
        "x-kubernetes-list-type" = "map",
        "x-kubernetes-list-map-keys" = ["type"],
        "maxItems" = crate::bounds::CONDITIONS_MAX
    ))]
    pub conditions: Vec<Condition>,
}

/// Status fields an agent leaves out together when the NodeNetworkConfig CRD is older than it
/// (`netwave_runtime::apply::apply_status`'s `along`): a CRD without `status.observedGeneration` is
/// one from before 0.2.0, whose `conditions` list is atomic and the configurator's alone.
pub const NNC_STATUS_TOGETHER: [(&str, &str); 1] =
    [(".status.observedGeneration", ".status.conditions")];

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProbeResult {
    /// What was probed, e.g. `interface eth0`, `tcp 198.18.0.1:179`, `icmp 198.18.0.1`, `api`.
    #[schemars(length(max = crate::bounds::PROBE_NAME_MAX))]
    pub name: String,
    /// `Passed`, `Failed` or `Skipped`.
    #[schemars(length(max = crate::bounds::PROBE_RESULT_MAX))]
    pub result: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = crate::bounds::PROBE_MESSAGE_MAX))]
    pub message: Option<String>,
    /// Whether this probe gated the apply (it passed before the apply started).
    #[serde(default)]
    pub gating: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_seconds: Option<f64>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}
