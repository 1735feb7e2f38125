//! What [`step`](super::step()) looks at: plain data the shell rebuilds from its watch caches on every
//! reconcile. Nothing here remembers anything between steps; all rollout state lives in the API objects
//! these are read from, which is what lets a new leader continue exactly where the old one stopped.

use netwave_api::bounds;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use netwave_api::features::FeatureSet;
use netwave_api::vocab::NodePhase;
use netwave_api::{
    ASSIGNED_AT_ANNOTATION, NetworkConfigRevision, NetworkConfigRevisionStatus, NodeNetworkConfig,
    RolloutPolicy, ValidationResult,
};
use thiserror::Error;

use super::policy::PolicyDefaults;
use super::quarantine::NodeRecord;
use super::vocab::{ConditionStatus, NODE_READY};
use crate::sym::{Interner, Sym};
use crate::types::{Sequence, Timestamp};

/// Everything one step decides on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RolloutInput {
    pub defaults: PolicyDefaults,
    /// Every `NetworkConfigRevision`, in any order.
    pub revisions: Vec<RevisionState>,
    /// Every `Node`, in any order. Shared: the configurator keeps each node's state between steps and
    /// converts only the objects that changed, and hands the list over without copying it.
    pub nodes: Arc<Vec<Arc<NodeState>>>,
    /// Every `NodeNetworkConfig`, in any order (some may belong to nodes that have left). Shared, as
    /// `nodes`.
    pub configs: Arc<Vec<Arc<NodeConfigState>>>,
    /// Nodes whose `NodeNetworkConfig` exists but cannot be decoded (not in `configs`): their state is
    /// unknown, so they are skipped — not updated, not failed, not in flight, never assigned — and no
    /// revision is pruned meanwhile (see `crate::undecodable`).
    pub unreadable_configs: BTreeSet<String>,
    /// What the agents of nodes without an assignment declare they can apply (the
    /// `status.agentFeatures` of their placeholder config, which `configs` leaves out); a node
    /// missing here has an agent that declared nothing.
    pub unassigned_agents: BTreeMap<Sym, FeatureSet>,
    /// Rendered `configHash` per (revision, node), for at least the revisions
    /// [`revisions_to_render`](super::revisions_to_render) names.
    pub rendered: RenderedHashes,
    /// What each of those revisions puts on the nodes ([`Footprint::of`](super::hold::Footprint::of)),
    /// for the destructive-change hold. The hold is measured only where both the target's and the last
    /// good revision's are given: a tool that leaves them out (`kubectl netwave plan`'s waves) plans
    /// as if every hold were approved.
    pub footprints: super::hold::Footprints,
    /// What moving nodes to each of those revisions' renderings takes off them, by revision name
    /// ([`super::loss`]): only where some node would move. Left out, the target is held only on its
    /// footprint.
    pub move_losses: BTreeMap<String, Arc<super::loss::MoveLoss>>,
}

/// One `NetworkConfigRevision`: identity, admin knobs, current status and this step's fleet validation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RevisionState {
    pub name: Sym,
    /// `metadata.generation`, mirrored to `status.observedGeneration`.
    pub generation: Option<i64>,
    pub sequence: Sequence,
    pub hash: String,
    /// `spec.rollout` as written; merged over [`PolicyDefaults`] inside the step.
    pub policy: RolloutPolicy,
    pub paused: bool,
    /// Who last wrote `spec.paused` (field manager and time, from managedFields), when known.
    pub paused_by: Option<String>,
    pub retry: u32,
    /// Held as a destructive change: what it removes, as recorded
    /// (`revision::DESTRUCTIVE_CHANGE_ANNOTATION`).
    pub destructive: Option<String>,
    /// The basis of that hold (`revision::DESTRUCTIVE_CHANGE_BASIS_ANNOTATION`, [`super::hold::basis`]).
    pub hold_basis: Option<String>,
    pub status: NetworkConfigRevisionStatus,
    /// Fleet-wide validation of this revision against the current nodes, computed by the caller.
    pub validation: ValidationResult,
    /// The render version this revision was cut for, when it is not the caller's
    /// (`render::RENDER_VERSION`): the caller renders nothing of it, so nothing is assigned from it and
    /// its nodes keep what they run. Set by the caller with its renders.
    pub other_render_version: Option<u32>,
}

/// One `Node`, reduced to what the rollout needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeState {
    pub name: Sym,
    pub labels: BTreeMap<String, String>,
    /// The `Ready` condition is `True`.
    pub ready: bool,
    /// Cordoned (`spec.unschedulable`).
    pub unschedulable: bool,
}

impl NodeState {
    /// Ready and not cordoned: may be given a new revision.
    pub fn eligible(&self) -> bool {
        self.ready && !self.unschedulable
    }
}

/// One `NodeNetworkConfig`: the configurator's assignment and the agent's report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeConfigState {
    /// = node name.
    pub name: Sym,
    pub spec: AssignedSpec,
    pub status: AgentReport,
    /// The configurator's record of the node in annotations its agent cannot write (failure streak,
    /// quarantine: [`super::quarantine`]).
    pub record: NodeRecord,
}

/// `NodeNetworkConfig.spec` without the config body, plus the assignment time annotation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AssignedSpec {
    pub revision: Sym,
    pub sequence: Sequence,
    pub config_hash: Sym,
    pub retry: u32,
    /// From `netwave.dev/assigned-at`; `None` when missing or unreadable (the step then re-stamps the
    /// assignment, so the apply timeout always has a start).
    pub assigned_at: Option<Timestamp>,
}

/// `NodeNetworkConfig.status`, as far as the rollout cares.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentReport {
    pub phase: Option<AgentPhase>,
    pub observed_revision: Option<Sym>,
    pub observed_retry: Option<u32>,
    /// `spec.configHash` the phase refers to (`None` from agents that do not report it).
    pub observed_config_hash: Option<Sym>,
    /// Hash of the config the kernel runs now.
    pub config_hash: Option<Sym>,
    pub last_good_revision: Option<Sym>,
    pub reason: Option<String>,
    pub message: Option<String>,
    /// `status.lastTransitionTime` of a `Provisioning` report: when the agent started applying the
    /// attempt it names (the agent's clock; [`super::deadline`] bounds it). `None` in any other phase.
    pub started_at: Option<Timestamp>,
    /// What the agent can apply beyond release 0.1.0 (`status.agentFeatures`).
    pub features: FeatureSet,
}

/// The agent's `status.phase`. Status is a free string in the schema; anything unknown is neither a
/// success nor a failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentPhase {
    Provisioning,
    Provisioned,
    Invalid,
    Other(String),
}

impl AgentPhase {
    pub fn parse(s: &str) -> AgentPhase {
        match NodePhase::parse(s) {
            Some(NodePhase::Provisioning) => AgentPhase::Provisioning,
            Some(NodePhase::Provisioned) => AgentPhase::Provisioned,
            Some(NodePhase::Invalid) => AgentPhase::Invalid,
            None => AgentPhase::Other(s.to_string()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            AgentPhase::Provisioning => NodePhase::Provisioning.as_str(),
            AgentPhase::Provisioned => NodePhase::Provisioned.as_str(),
            AgentPhase::Invalid => NodePhase::Invalid.as_str(),
            AgentPhase::Other(s) => s,
        }
    }
}

/// Rendered `configHash` per revision and node. Each revision's map is shared (`Arc`), so a caller that
/// caches rendered hashes per revision builds an input without copying them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RenderedHashes {
    by_revision: BTreeMap<Sym, Arc<BTreeMap<Sym, Sym>>>,
    /// The agent features each node's config of a revision needs (`netwave_api::features`), for the
    /// nodes whose config needs any: most configs need none, and those nodes are left out.
    needs: BTreeMap<Sym, Arc<BTreeMap<Sym, FeatureSet>>>,
}

impl RenderedHashes {
    pub fn insert(&mut self, revision: impl Into<Sym>, node: impl Into<Sym>, hash: impl Into<Sym>) {
        Arc::make_mut(self.by_revision.entry(revision.into()).or_default())
            .insert(node.into(), hash.into());
    }

    /// Sets every node's hash for one revision at once.
    pub fn set_revision(
        &mut self,
        revision: impl Into<Sym>,
        hashes: impl Into<Arc<BTreeMap<Sym, Sym>>>,
    ) {
        self.by_revision.insert(revision.into(), hashes.into());
    }

    pub fn get(&self, revision: &str, node: &str) -> Option<&Sym> {
        self.by_revision.get(revision).and_then(|m| m.get(node))
    }

    /// Every node's hash for one revision, shared.
    pub fn revision(&self, revision: &str) -> Option<&Arc<BTreeMap<Sym, Sym>>> {
        self.by_revision.get(revision)
    }

    /// Sets, for one revision, the features each node's config needs (nodes needing none left out).
    pub fn set_needs(
        &mut self,
        revision: impl Into<Sym>,
        needs: impl Into<Arc<BTreeMap<Sym, FeatureSet>>>,
    ) {
        let needs = needs.into();
        let revision = revision.into();
        if needs.is_empty() {
            self.needs.remove(&revision);
        } else {
            self.needs.insert(revision, needs);
        }
    }

    /// The agent features `node`'s config of `revision` needs.
    pub fn needs(&self, revision: &str, node: &str) -> FeatureSet {
        if self.needs.is_empty() {
            return FeatureSet::NONE;
        }
        (self.needs.get(revision))
            .and_then(|m| m.get(node).copied())
            .unwrap_or_default()
    }

    /// What each node's config of `revision` needs, for the nodes needing any.
    pub fn needs_of(&self, revision: &str) -> Option<&Arc<BTreeMap<Sym, FeatureSet>>> {
        self.needs.get(revision)
    }

    /// Every revision's map.
    pub(crate) fn maps(&self) -> impl Iterator<Item = &Arc<BTreeMap<Sym, Sym>>> {
        self.by_revision.values()
    }
}

/// An API object that cannot be turned into step input.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum InputError {
    #[error("{kind} without metadata.name")]
    MissingName { kind: &'static str },
}

impl RevisionState {
    /// From the API object and this step's fleet validation of it.
    pub fn from_api(
        rev: &NetworkConfigRevision,
        validation: ValidationResult,
    ) -> Result<RevisionState, InputError> {
        Self::interned(rev, validation, &mut Interner::default())
    }

    /// [`from_api`](Self::from_api), its name taken from `strings`.
    pub fn interned(
        rev: &NetworkConfigRevision,
        validation: ValidationResult,
        strings: &mut Interner,
    ) -> Result<RevisionState, InputError> {
        let name = rev
            .metadata
            .name
            .as_deref()
            .ok_or(InputError::MissingName {
                kind: "NetworkConfigRevision",
            })?;
        let name = strings.intern(name);
        let annotation = |key: &str| rev.metadata.annotations.as_ref()?.get(key).cloned();
        Ok(RevisionState {
            name,
            generation: rev.metadata.generation,
            // A reactivated revision is ordered by the sequence it was made the target under.
            sequence: Sequence(netwave_api::effective_sequence(rev)),
            hash: rev.spec.hash.clone(),
            policy: rev.spec.rollout.clone(),
            paused: rev.spec.paused,
            paused_by: field_writer(&rev.metadata, &["spec", "paused"]),
            retry: rev.spec.retry,
            destructive: annotation(crate::revision::DESTRUCTIVE_CHANGE_ANNOTATION),
            hold_basis: annotation(crate::revision::DESTRUCTIVE_CHANGE_BASIS_ANNOTATION),
            status: rev.status.clone().unwrap_or_default(),
            validation,
            other_render_version: None,
        })
    }
}

/// The field manager that last wrote the field at `path` (e.g. `["spec", "paused"]`), with the time of
/// that write: `kubectl-patch at 2026-11-21T10:03:00Z`. Several owners (server-side apply): the latest.
pub fn field_writer(meta: &ObjectMeta, path: &[&str]) -> Option<String> {
    meta.managed_fields
        .iter()
        .flatten()
        .filter(|e| {
            let mut v = e.fields_v1.as_ref().map(|f| &f.0);
            for p in path {
                v = v.and_then(|v| v.get(format!("f:{p}")));
            }
            v.is_some()
        })
        .max_by_key(|e| e.time.as_ref().map(|t| t.0))
        .and_then(|e| {
            let who = e.manager.clone()?;
            Some(match &e.time {
                Some(t) => format!("{who} at {}", t.0),
                None => who,
            })
        })
}

impl NodeConfigState {
    /// From the API object; an unreadable `netwave.dev/assigned-at` annotation reads as missing.
    pub fn from_api(nnc: &NodeNetworkConfig) -> Result<NodeConfigState, InputError> {
        Self::interned(nnc, &mut Interner::default())
    }

    /// [`from_api`](Self::from_api), its names and hashes taken from `strings`: equal ones across
    /// configs and revisions then compare by pointer.
    pub fn interned(
        nnc: &NodeNetworkConfig,
        strings: &mut Interner,
    ) -> Result<NodeConfigState, InputError> {
        let name = nnc
            .metadata
            .name
            .as_deref()
            .ok_or(InputError::MissingName {
                kind: "NodeNetworkConfig",
            })?;
        let name = strings.intern(name);
        let assigned_at = nnc
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ASSIGNED_AT_ANNOTATION))
            .and_then(|v| Timestamp::parse_rfc3339(v).ok());
        // Only the fields the rollout reads: the agent's status also holds its probes and
        // conditions, and cloning all of it for 5,000 nodes per reconcile was a quarter of the
        // configurator's compute (#14).
        let status = nnc.status.as_ref();
        // Bounded where they are read (#48): whatever an agent wrote (an older CRD has no bounds),
        // the revision status, Events and logs that copy them stay small.
        let text = |f: fn(&netwave_api::NodeNetworkConfigStatus) -> &Option<String>, max| {
            status.and_then(|s| f(s).as_deref().map(|v| bounds::truncate(v, max)))
        };
        let mut sym = |f: fn(&netwave_api::NodeNetworkConfigStatus) -> &Option<String>| {
            strings.intern_opt(status.and_then(|s| f(s).as_deref()))
        };
        let observed_revision = sym(|s| &s.observed_revision);
        let observed_config_hash = sym(|s| &s.observed_config_hash);
        let config_hash = sym(|s| &s.config_hash);
        let last_good_revision = sym(|s| &s.last_good_revision);
        let phase = status
            .and_then(|s| s.phase.as_deref())
            .map(AgentPhase::parse);
        let started_at = status
            .filter(|_| phase == Some(AgentPhase::Provisioning))
            .and_then(|s| s.last_transition_time.as_ref())
            .map(Timestamp::from_time);
        Ok(NodeConfigState {
            name,
            spec: AssignedSpec {
                revision: strings.intern(&nnc.spec.revision),
                sequence: Sequence(nnc.spec.sequence),
                config_hash: strings.intern(&nnc.spec.config_hash),
                retry: nnc.spec.retry,
                assigned_at,
            },
            status: AgentReport {
                phase,
                observed_revision,
                observed_retry: status.and_then(|s| s.observed_retry),
                observed_config_hash,
                config_hash,
                last_good_revision,
                reason: text(|s| &s.reason, bounds::REASON_MAX),
                message: text(|s| &s.message, bounds::FAILED_NODE_MESSAGE_MAX),
                started_at,
                features: FeatureSet::of_agent(status),
            },
            record: NodeRecord::from_annotations(nnc.metadata.annotations.as_ref()),
        })
    }
}

impl NodeState {
    /// From the API object: `Ready` means a `Ready` condition with status `True`; cordoned means
    /// `spec.unschedulable`.
    pub fn from_api(node: &Node) -> Result<NodeState, InputError> {
        Self::interned(node, &mut Interner::default())
    }

    /// [`from_api`](Self::from_api), its name taken from `strings`.
    pub fn interned(node: &Node, strings: &mut Interner) -> Result<NodeState, InputError> {
        let name = node
            .metadata
            .name
            .as_deref()
            .ok_or(InputError::MissingName { kind: "Node" })?;
        let name = strings.intern(name);
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == NODE_READY && c.status == ConditionStatus::True.as_str())
            });
        let unschedulable = node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        Ok(NodeState {
            name,
            labels: node.metadata.labels.clone().unwrap_or_default(),
            ready,
            unschedulable,
        })
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, Time};
    use serde_json::json;

    use super::*;

    fn entry(manager: &str, time: &str, fields: serde_json::Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some("Update".into()),
            time: Some(Time(time.parse().unwrap())),
            fields_v1: Some(FieldsV1(fields)),
            ..Default::default()
        }
    }

    #[test]
    fn the_writer_of_a_field_comes_from_managed_fields() {
        let meta = ObjectMeta {
            managed_fields: Some(vec![
                entry(
                    "netwave-configurator",
                    "2026-11-21T10:00:00Z",
                    json!({"f:spec": {"f:hash": {}, "f:paused": {}}}),
                ),
                entry(
                    "kubectl-patch",
                    "2026-11-21T10:03:00Z",
                    json!({"f:spec": {"f:paused": {}}}),
                ),
                entry(
                    "argocd-controller",
                    "2026-11-21T10:09:00Z",
                    json!({"f:spec": {"f:rollout": {}}}),
                ),
            ]),
            ..Default::default()
        };
        assert_eq!(
            field_writer(&meta, &["spec", "paused"]).as_deref(),
            Some("kubectl-patch at 2026-11-21T10:03:00Z")
        );
        assert_eq!(field_writer(&meta, &["spec", "retry"]), None);
        assert_eq!(
            field_writer(&ObjectMeta::default(), &["spec", "paused"]),
            None
        );
    }
}
