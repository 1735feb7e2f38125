//! The world one step evaluates: the nodes joined with their configs, the revisions with their fate,
//! and what the stages of [`step`](mod@super::step) decide on the way. The stages and the status builder
//! ([`status`](super::status)) both read it; neither imports the other's types.
//!
//! ```text
//!   RolloutInput ──► World { nodes, revs, order, budgets, intents, assignments, … } ──► Context
//!                     written by the stages of step, in order                          read by status
//! ```
//!
//! Also here: what *updated* and *in flight* mean (DESIGN.md §3), since every stage asks.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use netwave_api::FailedNode;
use netwave_api::features::FeatureSet;

use super::deadline::{Attempt, Deadline, deadline};

use super::input::{
    AgentPhase, AgentReport, AssignedSpec, NodeConfigState, NodeState, RevisionState, RolloutInput,
};
use super::plan::{AssignReason, Assignment, Event, WaitingOn};
use super::policy::{Policy, PolicyDefaults, resolve};
use super::quarantine::{NodeRecord, RecordUpdate};
use super::vocab::Phase;
use crate::sym::Sym;
use crate::types::Timestamp;

/// Whether a node is *in flight*: its agent may be changing the node's network config because of what
/// the configurator assigned, so it counts against `maxUnavailable`.
///
/// In flight while the spec differs from what the agent reports as provisioned, whatever revision
/// either is. "What it runs" is the reported `configHash` when the agent reports one (so a fast-path
/// assignment, same config under a new revision, never counts, and a re-rendered config for the same
/// revision does), else the observed revision. Two refinements for agents that reported `Invalid`: one
/// that did so for exactly this spec (revision, retry and, when reported, configHash) has restored its last good config and stopped;
/// it is at rest, not in flight (counting it would let failed nodes hold budget slots forever when there
/// is no last good revision to move them to, and deadlock a fail-forward rollout behind them). And the
/// hash it reports is the restored config's, so rolling it back to that config is free too.
pub fn is_in_flight(config: &NodeConfigState) -> bool {
    in_flight_of(
        &config.spec.revision,
        config.spec.retry,
        &config.spec.config_hash,
        &config.status,
    )
}

/// The node is *updated* for `revision`: its spec is `revision`, and its agent reports `Provisioned` for
/// `revision` (and, when it reports a hash, for the config the spec holds). Status about an older
/// revision or an older config never counts.
pub fn is_updated(config: &NodeConfigState, revision: &Sym) -> bool {
    updated_of(
        &config.spec.revision,
        &config.spec.config_hash,
        &config.status,
        revision,
    )
}

pub(super) fn in_flight_of(revision: &Sym, retry: u32, hash: &Sym, st: &AgentReport) -> bool {
    let gave_up = st.phase == Some(AgentPhase::Invalid)
        && st.observed_revision.as_ref() == Some(revision)
        && st.observed_retry == Some(retry)
        && st.observed_config_hash.as_ref().is_none_or(|h| h == hash);
    // An agent that reported Invalid restored its last good config and reports that config's hash.
    let runs_it = match (&st.phase, &st.config_hash) {
        (Some(AgentPhase::Provisioned | AgentPhase::Invalid), Some(h)) => h == hash,
        (Some(AgentPhase::Provisioned), None) => st.observed_revision.as_ref() == Some(revision),
        _ => false,
    };
    !(gave_up || runs_it)
}

pub(super) fn updated_of(
    spec_revision: &Sym,
    hash: &Sym,
    st: &AgentReport,
    revision: &Sym,
) -> bool {
    spec_revision == revision
        && st.phase == Some(AgentPhase::Provisioned)
        && st.observed_revision.as_ref() == Some(revision)
        && st.config_hash.as_ref().is_none_or(|h| h == hash)
}

/// How many node names a status message or report lists before "and N more".
pub(super) const LIST_LIMIT: usize = 5;

/// What earlier rounds of one step wrote about nodes.
#[derive(Default)]
pub(super) struct Overlay {
    /// Node → new spec (`None`: config deleted).
    pub specs: BTreeMap<Sym, Option<AssignedSpec>>,
    /// Node → new record (streak, quarantine).
    pub records: BTreeMap<Sym, NodeRecord>,
}

/// Everything the stages of one step share. Indices into `nodes` and `revs` stand for nodes and
/// revisions throughout: both are sorted once (nodes by name, revisions newest first) and never move.
pub(super) struct World<'a> {
    pub now: Timestamp,
    pub input: &'a RolloutInput,
    /// Every node, by name, with its spec and its agent's report.
    pub nodes: Vec<Node<'a>>,
    /// Configs of nodes that left: deleted, never counted as failures.
    pub orphans: Vec<String>,
    /// Nodes by the revision their spec names, or their agent reports on (failure detection looks at
    /// these; counts of nodes *assigned* a revision check the spec again).
    pub by_revision: BTreeMap<&'a Sym, Vec<usize>>,
    /// Every revision, newest first, with its fate.
    pub revs: Vec<Rev<'a>>,
    pub target: Option<usize>,
    /// The last good revision as the step begins: where this step's rollbacks and new nodes go. If the
    /// target completes with this plan it becomes the last good revision ([`Context::last_good_after`],
    /// which the statuses and the report show), but a node that failed it still goes back here.
    pub last_good: Option<usize>,
    /// Rollout order: failure domains round-robin, node name within a domain.
    pub order: Vec<usize>,
    pub budgets: Budgets<'a>,
    pub hashes: Hashes<'a>,
    /// Moves wanted this step, most urgent first; admitted under the budget afterwards.
    pub intents: Intents,
    pub canary: CanaryStage,
    /// Every canary became updated this step (the bake starts now).
    pub canaries_done_now: bool,
    /// What the target's rollout waits on besides budget and nodes (canaries, bake).
    pub waiting: Vec<WaitingOn>,
    pub assignments: Vec<Assignment>,
    /// Nodes an intent could not be admitted for because a revision's rendered hash is missing.
    pub missing: BTreeMap<usize, Vec<String>>,
    /// Why moves that were wanted did not happen, judged after the plan.
    pub refused: Refused,
    pub requeue: Requeue,
    /// Node records to write: streaks grown or cleared, quarantines ([`super::quarantine`]).
    pub records: Vec<RecordUpdate>,
    /// Events about nodes decided with those records.
    pub node_events: Vec<Event>,
}

impl<'a> World<'a> {
    /// The features node `node`'s config of revision `rev` needs and its agent does not declare: such
    /// a config is never assigned to it ([`netwave_api::features`]).
    pub fn lacks(&self, rev: usize, node: usize) -> FeatureSet {
        let n = &self.nodes[node];
        let needs = (self.input.rendered).needs(self.revs[rev].name(), n.name());
        if needs.is_empty() {
            return needs;
        }
        let has = match n.has_config {
            true => n.status.features,
            false => (self.input.unassigned_agents.get(n.name()).copied()).unwrap_or_default(),
        };
        needs.without(has)
    }

    pub fn new(input: &'a RolloutInput, now: Timestamp) -> World<'a> {
        World {
            now,
            input,
            nodes: Vec::new(),
            orphans: Vec::new(),
            by_revision: BTreeMap::new(),
            revs: Vec::new(),
            target: None,
            last_good: None,
            order: Vec::new(),
            budgets: Budgets::default(),
            hashes: Hashes::default(),
            intents: Intents::default(),
            canary: CanaryStage::Off,
            canaries_done_now: false,
            waiting: Vec::new(),
            assignments: Vec::new(),
            missing: BTreeMap::new(),
            refused: Refused::default(),
            requeue: Requeue { now, at: None },
            records: Vec::new(),
            node_events: Vec::new(),
        }
    }
}

/// The spec of a node's config, borrowed from the input or from this step's assignments.
#[derive(Clone, Copy)]
pub(super) struct Spec<'a> {
    pub revision: &'a Sym,
    pub retry: u32,
    pub hash: &'a Sym,
    pub assigned_at: Option<Timestamp>,
}

pub(super) struct Node<'a> {
    pub state: &'a NodeState,
    pub has_config: bool,
    pub status: &'a AgentReport,
    /// Ready and not cordoned, its config can be read, and it is not quarantined.
    pub eligible: bool,
    /// Its `NodeNetworkConfig` cannot be decoded ([`RolloutInput::unreadable_configs`]).
    pub unreadable: bool,
    /// The configurator's record of it (as an earlier round left it).
    pub record: &'a NodeRecord,
    /// Quarantined ([`super::quarantine`]): not eligible, its failures do not count.
    pub quarantined: bool,
    /// Failed the latest revisions: gets the target after every other node (with quarantine on).
    pub suspect: bool,
    /// Index into [`Budgets::domain_names`].
    pub domain: usize,
    pub spec: Option<Spec<'a>>,
    pub in_flight: bool,
    /// Its agent reports `spec` provisioned ([`updated_of`] the spec's own revision).
    pub updated_spec: bool,
    /// Assigned by this step.
    pub assigned: bool,
    /// On record (or found this step) as failed by the target's current attempt.
    pub failed_target: bool,
}

impl<'a> Node<'a> {
    pub fn name(&self) -> &'a Sym {
        &self.state.name
    }
    /// Its current assignment and when it has failed that unless its agent reports, under `policy`
    /// (`None`: no assignment, or no assignment time).
    pub fn deadline(&self, policy: &Policy) -> Option<(Attempt<'a>, Deadline)> {
        let s = self.spec?;
        let attempt = Attempt {
            revision: s.revision,
            retry: s.retry,
            config_hash: s.hash,
            assigned_at: s.assigned_at?,
        };
        Some((attempt, deadline(&attempt, self.status, policy.timeouts())))
    }
    pub fn updated(&self, revision: &Sym) -> bool {
        self.updated_spec && self.spec.is_some_and(|s| s.revision == revision)
    }
    /// May be made in flight by a move for `reason`: an eligible node; and a quarantined one that is
    /// Ready and schedulable only to go back to the last good revision (off a failed one), which is
    /// nothing new.
    pub fn may_spend(&self, reason: AssignReason) -> bool {
        self.eligible
            || (self.quarantined
                && reason == AssignReason::Rollback
                && self.state.eligible()
                && !self.unreadable)
    }
}

/// The record of a node without a config.
pub(super) static NO_RECORD: NodeRecord = NodeRecord {
    streak: Vec::new(),
    quarantined: None,
};

/// The report of a node without a config (or whose config an earlier round deleted).
pub(super) static NO_REPORT: AgentReport = AgentReport {
    phase: None,
    observed_revision: None,
    observed_retry: None,
    observed_config_hash: None,
    config_hash: None,
    last_good_revision: None,
    reason: None,
    message: None,
    started_at: None,
    features: FeatureSet::NONE,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FailCause {
    /// Already `Failed` in status (this attempt).
    Stored,
    Validation,
    MaxFailures,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fate {
    Failed(FailCause),
    Target,
    /// Older than the target and not failed.
    Older,
}

/// One revision after evaluation.
pub(super) struct Rev<'a> {
    pub state: &'a RevisionState,
    pub stored_phase: Option<Phase>,
    /// `status.observedRetry` matches `spec.retry`: the failures on record belong to this attempt.
    pub same_attempt: bool,
    pub policy: Policy,
    pub policy_errors: Vec<String>,
    pub fate: Fate,
    /// Failures of the current attempt, including the ones found this step (at the end).
    pub failed_nodes: Cow<'a, [FailedNode]>,
    pub new_failures: usize,
    /// The target only: it is destructive against the last good revision ([`super::hold`]).
    pub hold: Option<Hold>,
}

/// A target that is destructive: against the last good revision ([`super::hold`]), or in what moving
/// the nodes to its rendering takes off them ([`super::loss`]).
pub(super) struct Hold {
    /// What it removes, for people ([`super::hold::Removal`]'s or [`super::loss::MoveLoss`]'s text).
    pub summary: String,
    /// [`super::hold::basis`] of this target and last good revision, or the rendering's
    /// ([`super::loss::MoveLoss::basis`]).
    pub basis: String,
    /// The hold with this basis is on record (`spec.paused` set with it, annotations written).
    pub recorded: bool,
    /// An admin resumed it after it was recorded: the only way through.
    pub approved: bool,
}

impl<'a> Rev<'a> {
    /// The revision as stored, before this step judges it ([`Fate::Older`] until then).
    pub fn new(state: &'a RevisionState, defaults: &PolicyDefaults) -> Rev<'a> {
        let same_attempt = state.status.observed_retry.is_none_or(|r| r == state.retry);
        let (policy, errors) = resolve(&state.policy, defaults);
        Rev {
            state,
            stored_phase: Phase::parse(state.status.phase.as_deref()),
            same_attempt,
            policy,
            policy_errors: errors.iter().map(ToString::to_string).collect(),
            fate: Fate::Older,
            // Borrowed until this step finds a failure: most steps find none, and copying every
            // revision's failed nodes at every step was 1 % of a leader's CPU (#28).
            failed_nodes: if same_attempt {
                Cow::Borrowed(&state.status.failed_nodes)
            } else {
                Cow::Borrowed(&[])
            },
            new_failures: 0,
            hold: None,
        }
    }
    pub fn name(&self) -> &'a Sym {
        &self.state.name
    }
    /// `Failed` on record for this attempt: stays failed until `spec.retry` changes.
    pub fn stays_failed(&self) -> bool {
        self.stored_phase == Some(Phase::Failed) && self.same_attempt
    }
    pub fn rearmed(&self) -> bool {
        self.stored_phase == Some(Phase::Failed) && !self.same_attempt
    }
    /// Held as a destructive change and not approved.
    pub fn held(&self) -> Option<&Hold> {
        self.hold.as_ref().filter(|h| !h.approved)
    }
    /// Paused: `spec.paused`, or held (the hold may not be written yet; this step writes it first).
    pub fn paused(&self) -> bool {
        self.state.paused || self.held().is_some()
    }
    /// The target gives itself to no further node: paused or held, an invalid policy, or validation
    /// errors. Validation errors on the target are only possible once it completed (before, they fail
    /// it): the fleet changed under it. It stays the last good revision, but no further node gets it.
    pub fn halted(&self) -> bool {
        !self.state.validation.errors.is_empty() || self.paused() || !self.policy_errors.is_empty()
    }
}

/// Where the target's canary stage stands.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum CanaryStage {
    /// No canaries configured, or the target already completed.
    Off,
    /// Only these nodes (indices) may get the target.
    Canaries {
        nodes: BTreeSet<usize>,
        pending: u32,
    },
    Baking {
        until: Timestamp,
    },
    Done,
}

/// Failure domains and what is in flight in each, against `maxUnavailable` and
/// `maxUnavailablePerDomain`.
#[derive(Default)]
pub(super) struct Budgets<'a> {
    /// `maxUnavailable` of the eligible nodes.
    pub total: u32,
    /// In-flight nodes, whatever revision and whether eligible or not.
    pub in_flight: u32,
    /// Domains sorted by name (one unnamed domain without a `topologyKey`).
    pub domain_names: Vec<&'a str>,
    pub domain_budget: Vec<Option<u32>>,
    pub domain_in_flight: Vec<u32>,
}

impl Budgets<'_> {
    pub fn full(&self) -> bool {
        self.in_flight >= self.total
    }
    pub fn domain_full(&self, domain: usize) -> bool {
        self.domain_budget[domain].is_some_and(|b| self.domain_in_flight[domain] >= b)
    }
    /// Records a node of `domain` entering (`true`) or leaving flight.
    pub fn set(&mut self, domain: usize, in_flight: bool) {
        if in_flight {
            self.in_flight += 1;
            self.domain_in_flight[domain] += 1;
        } else {
            self.in_flight -= 1;
            self.domain_in_flight[domain] -= 1;
        }
    }
}

/// Rendered hashes per node of the target and the last good revision: the only revisions assigned.
#[derive(Default)]
pub(super) struct Hashes<'a> {
    pub target: Option<usize>,
    pub last_good: Option<usize>,
    pub of_target: Option<&'a [Option<Sym>]>,
    pub of_last_good: Option<&'a [Option<Sym>]>,
}

impl<'a> Hashes<'a> {
    pub fn get(&self, rev: usize, node: usize) -> Option<&'a Sym> {
        let of = if Some(rev) == self.target {
            self.of_target
        } else if Some(rev) == self.last_good {
            self.of_last_good
        } else {
            None
        };
        of.and_then(|of| of[node].as_ref())
    }
}

/// A move wanted this step: `node` to revision `rev`.
pub(super) struct Intent {
    pub node: usize,
    pub rev: usize,
    pub reason: AssignReason,
}

/// At most one intent per node: the first one wanted is the most urgent.
#[derive(Default)]
pub(super) struct Intents {
    pub list: Vec<Intent>,
    has: Vec<bool>,
}

impl Intents {
    pub fn new(nodes: usize) -> Intents {
        Intents {
            list: Vec::new(),
            has: vec![false; nodes],
        }
    }
    pub fn has(&self, node: usize) -> bool {
        self.has[node]
    }
    pub fn push(&mut self, node: usize, rev: usize, reason: AssignReason) {
        self.list.push(Intent { node, rev, reason });
        self.has[node] = true;
    }
}

/// Why wanted moves did not happen: the global budget, or these domains' budgets.
#[derive(Default)]
pub(super) struct Refused {
    pub budget: bool,
    pub domains: BTreeSet<usize>,
}

/// The earliest future instant something changes without anyone writing: an apply timeout, the end of
/// a bake, the progress deadline. The shell steps again then.
pub(super) struct Requeue {
    now: Timestamp,
    pub at: Option<Timestamp>,
}

impl Requeue {
    pub fn wake(&mut self, at: Timestamp) {
        if at > self.now {
            self.at = Some(self.at.map_or(at, |r| r.min(at)));
        }
    }
}

/// What the status builder needs to know about the target after the assignments.
pub(super) struct TargetView {
    pub idx: usize,
    pub total: u32,
    pub updated: u32,
    pub in_progress: u32,
    pub queued: u32,
    pub skipped: u32,
    /// Of `skipped`: their agent lacks a feature their config of the target needs.
    pub waiting_for_agent: u32,
    pub started: bool,
    pub halted_by_policy: bool,
    /// A completed target whose validation now fails: no further assignments.
    pub invalid: bool,
    pub canary_stage: CanaryStage,
    /// Set when every canary became updated this step.
    pub canaries_done_now: bool,
    pub waiting: Vec<WaitingOn>,
}

impl TargetView {
    /// Every eligible node not failed is updated (and at least one is).
    pub fn all_done(&self) -> bool {
        self.updated >= 1 && self.in_progress == 0 && self.queued == 0
    }
}

/// Per-revision node counts after the plan (for revisions other than the target).
#[derive(Clone, Copy, Default)]
pub(super) struct Counts {
    pub assigned: u32,
    pub updated: u32,
}

/// The world after the plan, as the status builder sees it.
pub(super) struct Context<'a, 'b> {
    pub now: Timestamp,
    pub revs: &'b [Rev<'a>],
    pub target: Option<&'b TargetView>,
    pub last_good: Option<usize>,
    pub counts: &'b BTreeMap<&'a Sym, Counts>,
    /// Nodes in the fleet: every revision's `total`, so each revision's counters read against the
    /// whole fleet (an older revision's `updated` is how many nodes still run it).
    pub fleet: u32,
}

impl Context<'_, '_> {
    /// The last good revision once this plan is applied: the target itself if it completes now.
    pub fn last_good_after(&self) -> Option<usize> {
        match self.target {
            Some(tv) if self.target_complete(tv) => Some(tv.idx),
            _ => self.last_good,
        }
    }

    pub fn target_complete(&self, tv: &TargetView) -> bool {
        self.revs[tv.idx].stored_phase == Some(Phase::Complete) || tv.all_done()
    }
}
