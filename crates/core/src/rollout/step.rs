//! The transition function. See the module docs of [`crate::rollout`] for the rules and why.

use std::collections::{BTreeMap, BTreeSet};

use netwave_api::FailedNode;

use super::input::{
    AgentPhase, AgentReport, AssignedSpec, NodeConfigState, NodeState, RevisionState, RolloutInput,
};
use super::plan::{AssignReason, Assignment, Plan, Report, StatusUpdate, WaitingOn};
use super::policy::{CanaryNodes, Policy, resolve};
use super::status::{self, Phase};
use crate::types::Timestamp;

/// How many node names a status message or report lists before "and N more".
const LIST_LIMIT: usize = 5;

/// Failure reason recorded when an agent did not report in time.
pub const REASON_APPLY_TIMEOUT: &str = "ApplyTimeout";

/// Whether a node is *in flight*: its agent may be changing the node's network config because of what
/// the configurator assigned, so it counts against `maxUnavailable`.
///
/// In flight while the spec differs from what the agent reports as provisioned, whatever revision
/// either is. "What it runs" is the reported `configHash` when the agent reports one (so a fast-path
/// assignment, same config under a new revision, never counts, and a re-rendered config for the same
/// revision does), else the observed revision. Two refinements for agents that reported `Invalid`: one
/// that did so for exactly this spec (revision and retry) has restored its last good config and stopped;
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
pub fn is_updated(config: &NodeConfigState, revision: &str) -> bool {
    updated_of(
        &config.spec.revision,
        &config.spec.config_hash,
        &config.status,
        revision,
    )
}

fn in_flight_of(revision: &str, retry: u32, hash: &str, st: &AgentReport) -> bool {
    let gave_up = st.phase == Some(AgentPhase::Invalid)
        && st.observed_revision.as_deref() == Some(revision)
        && st.observed_retry == Some(retry);
    // An agent that reported Invalid restored its last good config and reports that config's hash.
    let runs_it = match (&st.phase, &st.config_hash) {
        (Some(AgentPhase::Provisioned | AgentPhase::Invalid), Some(h)) => h == hash,
        (Some(AgentPhase::Provisioned), None) => st.observed_revision.as_deref() == Some(revision),
        _ => false,
    };
    !(gave_up || runs_it)
}

fn updated_of(spec_revision: &str, hash: &str, st: &AgentReport, revision: &str) -> bool {
    spec_revision == revision
        && st.observed_revision.as_deref() == Some(revision)
        && st.phase == Some(AgentPhase::Provisioned)
        && st.config_hash.as_deref().is_none_or(|h| h == hash)
}

/// The revisions whose rendered hashes a step over `input` may need: every revision that could become
/// the target this step (newest first, skipping ones that stay `Failed`) down to and including the
/// newest `Complete` one (the last good revision, where rollbacks go). Render these, fill
/// [`RolloutInput::rendered`], then call [`step`].
pub fn revisions_to_render(input: &RolloutInput) -> Vec<String> {
    let mut revs: Vec<&RevisionState> = input.revisions.iter().collect();
    revs.sort_by(|a, b| b.sequence.cmp(&a.sequence).then(a.name.cmp(&b.name)));
    let mut out = Vec::new();
    for r in revs {
        let phase = Phase::parse(r.status.phase.as_deref());
        let same_attempt = r.status.observed_retry.is_none_or(|x| x == r.retry);
        if phase == Some(Phase::Failed) && same_attempt {
            continue;
        }
        out.push(r.name.clone());
        if phase == Some(Phase::Complete) {
            break;
        }
    }
    out
}

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
    pub failed_nodes: Vec<FailedNode>,
    pub new_failures: usize,
}

impl Rev<'_> {
    pub fn name(&self) -> &str {
        &self.state.name
    }
    pub fn rearmed(&self) -> bool {
        self.stored_phase == Some(Phase::Failed) && !self.same_attempt
    }
}

#[derive(Clone, Copy)]
struct Spec<'a> {
    revision: &'a str,
    retry: u32,
    hash: &'a str,
    assigned_at: Option<Timestamp>,
}

struct Node<'a> {
    state: &'a NodeState,
    has_config: bool,
    status: &'a AgentReport,
    eligible: bool,
    domain: usize,
    spec: Option<Spec<'a>>,
    in_flight: bool,
    assigned: bool,
}

impl Node<'_> {
    fn name(&self) -> &str {
        &self.state.name
    }
    fn updated(&self, revision: &str) -> bool {
        self.spec
            .is_some_and(|s| updated_of(s.revision, s.hash, self.status, revision))
    }
}

static NO_REPORT: AgentReport = AgentReport {
    phase: None,
    observed_revision: None,
    observed_retry: None,
    config_hash: None,
    last_good_revision: None,
    reason: None,
    message: None,
};

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

struct Intent {
    node: usize,
    rev: usize,
    reason: AssignReason,
}

/// What the status builder needs to know about the target after the assignments.
pub(super) struct TargetView {
    pub idx: usize,
    pub total: u32,
    pub updated: u32,
    pub in_progress: u32,
    pub queued: u32,
    pub skipped: u32,
    pub started: bool,
    pub halted_by_policy: bool,
    /// A completed target whose validation now fails: no further assignments.
    pub invalid: bool,
    pub canary_stage: CanaryStage,
    /// Set when every canary became updated this step.
    pub canaries_done_now: bool,
    pub waiting: Vec<WaitingOn>,
}

/// Per-revision node counts after the plan (for revisions other than the target).
#[derive(Clone, Copy, Default)]
pub(super) struct Counts {
    pub assigned: u32,
    pub updated: u32,
}

/// Most rounds [`step`] folds together; a cascade is at most a rollback followed by a move onward.
const MAX_ROUNDS: usize = 4;

/// Computes the next plan. Pure: the same input and `now` give the same plan, whatever order the input
/// lists things in.
///
/// Idempotent by construction: one round of decisions can enable another at the same instant (a node
/// rolled back to the last good revision that never started the failed one is at rest and may take the
/// target right away; a revision completing makes the old last good one deletable). `step` applies each
/// round to a private copy of the input and decides again until nothing changes, folding the rounds into
/// one plan: the last write per object wins, in the order objects first appeared, and every round's
/// Events are kept. Stepping again over the applied plan therefore plans nothing.
pub fn step(input: &RolloutInput, now: Timestamp) -> Plan {
    let mut overlay = Overlay::new();
    let mut plan = step_once(input, &input.revisions, &overlay, now);
    if plan.write_count() == 0 {
        return plan;
    }
    // Only revision statuses and node specs change between rounds; nodes and agent reports do not.
    let mut revisions = input.revisions.clone();
    let mut round = plan.clone();
    for _ in 1..MAX_ROUNDS {
        apply_writes(&mut revisions, &mut overlay, &round);
        round = step_once(input, &revisions, &overlay, now);
        if round.is_empty() {
            break;
        }
        merge(&mut plan, round.clone());
    }
    plan.report = round.report;
    plan
}

/// Node specs written by earlier rounds of one step: node → new spec (`None`: config deleted).
type Overlay = BTreeMap<String, Option<AssignedSpec>>;

/// Applies a plan's writes to revisions and the spec overlay, as the API server would.
fn apply_writes(revisions: &mut Vec<RevisionState>, overlay: &mut Overlay, plan: &Plan) {
    for u in &plan.status_updates {
        if let Some(r) = revisions.iter_mut().find(|r| r.name == u.revision) {
            r.status = u.status.clone();
        }
    }
    for a in &plan.assignments {
        overlay.insert(
            a.node.clone(),
            Some(AssignedSpec {
                revision: a.revision.clone(),
                sequence: a.sequence,
                config_hash: a.config_hash.clone(),
                retry: a.retry,
                assigned_at: Some(a.assigned_at),
            }),
        );
    }
    for n in &plan.delete_configs {
        overlay.insert(n.clone(), None);
    }
    revisions.retain(|r| !plan.delete_revisions.contains(&r.name));
}

/// Joins a map keyed by node name with the nodes (both sorted by name): O(n), no per-node lookups.
fn join_by_name<'a, V>(
    names: impl Iterator<Item = &'a str>,
    map: Option<&'a BTreeMap<String, V>>,
) -> Vec<Option<&'a V>> {
    let mut it = map.map(|m| m.iter().peekable());
    names
        .map(|name| {
            let it = it.as_mut()?;
            while it.peek().is_some_and(|(k, _)| k.as_str() < name) {
                it.next();
            }
            match it.peek() {
                Some((k, v)) if k.as_str() == name => Some(*v),
                _ => None,
            }
        })
        .collect()
}

/// Folds a later round into a plan: last write per object wins, first-appearance order is kept.
fn merge(plan: &mut Plan, next: Plan) {
    for u in next.status_updates {
        match plan
            .status_updates
            .iter_mut()
            .find(|p| p.revision == u.revision)
        {
            Some(p) => *p = u,
            None => plan.status_updates.push(u),
        }
    }
    for a in next.assignments {
        match plan.assignments.iter_mut().find(|p| p.node == a.node) {
            Some(p) => {
                let create = p.create;
                *p = a;
                p.create = create;
            }
            None => plan.assignments.push(a),
        }
    }
    // A revision deleted in a later round has no status update worth writing.
    plan.status_updates
        .retain(|u| !next.delete_revisions.contains(&u.revision));
    plan.delete_configs.extend(next.delete_configs);
    plan.delete_revisions.extend(next.delete_revisions);
    plan.events.extend(next.events);
}

fn step_once(
    input: &RolloutInput,
    revisions: &[RevisionState],
    overlay: &Overlay,
    now: Timestamp,
) -> Plan {
    // ---- index --------------------------------------------------------------------------------------
    // Sorting is stable and adaptive: inputs that arrive sorted (watch caches usually are) cost O(n).
    let mut node_states: Vec<&NodeState> = input.nodes.iter().collect();
    node_states.sort_by(|a, b| a.name.cmp(&b.name));
    node_states.dedup_by(|a, b| a.name == b.name);
    let mut config_list: Vec<&NodeConfigState> = input.configs.iter().collect();
    config_list.sort_by(|a, b| a.name.cmp(&b.name));
    config_list.dedup_by(|a, b| a.name == b.name);
    let mut rev_states: Vec<&RevisionState> = revisions.iter().collect();
    rev_states.sort_by(|a, b| b.sequence.cmp(&a.sequence).then(a.name.cmp(&b.name)));
    rev_states.dedup_by(|a, b| a.name == b.name);

    let mut config_matched = vec![false; config_list.len()];
    let mut ci = 0;
    let mut nodes: Vec<Node> = Vec::with_capacity(node_states.len());
    for &state in &node_states {
        while ci < config_list.len() && config_list[ci].name < state.name {
            ci += 1;
        }
        let cfg = (ci < config_list.len() && config_list[ci].name == state.name).then(|| {
            config_matched[ci] = true;
            config_list[ci]
        });
        let over = if overlay.is_empty() {
            None
        } else {
            overlay.get(&state.name)
        };
        let (spec, status) = match over {
            Some(None) => (None, &NO_REPORT),
            Some(Some(s)) => (Some(s), cfg.map_or(&NO_REPORT, |c| &c.status)),
            None => (cfg.map(|c| &c.spec), cfg.map_or(&NO_REPORT, |c| &c.status)),
        };
        let spec = spec.map(|s| Spec {
            revision: s.revision.as_str(),
            retry: s.retry,
            hash: s.config_hash.as_str(),
            assigned_at: s.assigned_at,
        });
        let in_flight = spec.is_some_and(|s| in_flight_of(s.revision, s.retry, s.hash, status));
        nodes.push(Node {
            state,
            has_config: spec.is_some(),
            status,
            eligible: state.eligible(),
            domain: 0,
            spec,
            in_flight,
            assigned: false,
        });
    }
    // Configs of nodes that left (and were not deleted by an earlier round).
    let orphans: Vec<String> = config_list
        .iter()
        .zip(&config_matched)
        .filter(|(c, matched)| !**matched && !matches!(overlay.get(&c.name), Some(None)))
        .map(|(c, _)| c.name.clone())
        .collect();
    // Nodes by the revision their spec names, or their agent reports on (failure detection looks at
    // these; counts of nodes *assigned* a revision check the spec again).
    let mut by_revision: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, n) in nodes.iter().enumerate() {
        if let Some(s) = n.spec {
            by_revision.entry(s.revision).or_default().push(i);
        }
        // Nodes whose agent reports on a revision other than its spec: an `Invalid` report about R is a
        // failure of R even after the spec moved on (the agent will not apply R again at this retry).
        if let Some(obs) = n.status.observed_revision.as_deref()
            && n.spec.is_some_and(|s| s.revision != obs)
        {
            by_revision.entry(obs).or_default().push(i);
        }
    }

    // ---- revisions: re-arm, validate, detect failures, pick the target -----------------------------------
    let mut revs: Vec<Rev> = Vec::with_capacity(rev_states.len());
    let mut target: Option<usize> = None;
    for &state in &rev_states {
        let stored_phase = Phase::parse(state.status.phase.as_deref());
        let same_attempt = state.status.observed_retry.is_none_or(|r| r == state.retry);
        let (policy, errors) = resolve(&state.policy, &input.defaults);
        let mut rev = Rev {
            state,
            stored_phase,
            same_attempt,
            policy,
            policy_errors: errors.iter().map(ToString::to_string).collect(),
            fate: Fate::Older,
            failed_nodes: if same_attempt {
                state.status.failed_nodes.clone()
            } else {
                Vec::new()
            },
            new_failures: 0,
        };
        let stays_failed = stored_phase == Some(Phase::Failed) && same_attempt;
        if target.is_some() {
            if stays_failed {
                rev.fate = Fate::Failed(FailCause::Stored);
            }
            revs.push(rev);
            continue;
        }
        if stays_failed {
            rev.fate = Fate::Failed(FailCause::Stored);
            revs.push(rev);
            continue;
        }
        // A completed revision is the proven last good one: it is never failed afterwards (a node that
        // fails it later is recorded and marks it Degraded), or one bad node would roll back the fleet.
        let complete = stored_phase == Some(Phase::Complete);
        if !complete && !state.validation.errors.is_empty() {
            rev.fate = Fate::Failed(FailCause::Validation);
            revs.push(rev);
            continue;
        }
        let found = detect_failures(&nodes, by_revision.get(state.name.as_str()), &rev, now);
        rev.new_failures = found.len();
        rev.failed_nodes.extend(found);
        if !complete && rev.failed_nodes.len() >= rev.policy.max_failures as usize {
            rev.fate = Fate::Failed(FailCause::MaxFailures);
            revs.push(rev);
            continue;
        }
        rev.fate = Fate::Target;
        target = Some(revs.len());
        revs.push(rev);
    }
    // The last good revision as the step begins: where this round's rollbacks and new nodes go. If the
    // target completes with this plan it becomes the last good revision (`status::last_good_after`,
    // which the statuses and the report show), but a node that failed it still goes back here.
    let last_good = revs.iter().position(|r| {
        !matches!(r.fate, Fate::Failed(_)) && r.stored_phase == Some(Phase::Complete)
    });
    let failed_revs: BTreeSet<&str> = revs
        .iter()
        .filter(|r| matches!(r.fate, Fate::Failed(_)))
        .map(|r| r.state.name.as_str())
        .collect();

    // The policy that sets the budget and the order: the target's, else the newest revision's.
    let defaults_policy = input.defaults.policy();
    let gov: &Policy = target
        .or(if revs.is_empty() { None } else { Some(0) })
        .map_or(&defaults_policy, |i| &revs[i].policy);

    // ---- failure domains, rollout order, budgets -----------------------------------------------------------
    let mut domain_names: Vec<&str> = Vec::new();
    if let Some(key) = gov.topology_key.as_deref() {
        let set: BTreeSet<&str> = nodes
            .iter()
            .map(|n| n.state.labels.get(key).map_or("", String::as_str))
            .collect();
        domain_names = set.into_iter().collect();
        for n in nodes.iter_mut() {
            let d = n.state.labels.get(key).map_or("", String::as_str);
            n.domain = domain_names.binary_search(&d).unwrap_or(0);
        }
    } else {
        domain_names.push("");
    }
    let domains = domain_names.len();
    // Round-robin over domains (sorted by name), by node name within a domain.
    let mut per_domain: Vec<Vec<usize>> = vec![Vec::new(); domains];
    for (i, n) in nodes.iter().enumerate() {
        per_domain[n.domain].push(i);
    }
    let longest = per_domain.iter().map(Vec::len).max().unwrap_or(0);
    let mut order: Vec<usize> = Vec::with_capacity(nodes.len());
    for round in 0..longest {
        for d in &per_domain {
            if let Some(&i) = d.get(round) {
                order.push(i);
            }
        }
    }

    let eligible_total = nodes.iter().filter(|n| n.eligible).count();
    let budget = gov.max_unavailable.of(eligible_total);
    let mut domain_eligible = vec![0usize; domains];
    let mut domain_in_flight = vec![0u32; domains];
    let mut in_flight = 0u32;
    for n in &nodes {
        if n.eligible {
            domain_eligible[n.domain] += 1;
        }
        if n.in_flight {
            in_flight += 1;
            domain_in_flight[n.domain] += 1;
        }
    }
    let domain_budget: Vec<Option<u32>> = domain_eligible
        .iter()
        .map(|&e| gov.max_unavailable_per_domain.map(|b| b.of(e)))
        .collect();

    // Rendered hashes of the target and the last good revision per node (the only ones assigned).
    let t_hashes = join_by_name(
        nodes.iter().map(|n| n.state.name.as_str()),
        target.and_then(|t| input.rendered.revision(revs[t].name()).map(|m| &**m)),
    );
    let lg_hashes = join_by_name(
        nodes.iter().map(|n| n.state.name.as_str()),
        last_good.and_then(|l| input.rendered.revision(revs[l].name()).map(|m| &**m)),
    );
    let hash_for = |rev: usize, i: usize| -> Option<&str> {
        if Some(rev) == target {
            t_hashes[i].map(String::as_str)
        } else if Some(rev) == last_good {
            lg_hashes[i].map(String::as_str)
        } else {
            None
        }
    };

    // ---- intents, most urgent first ------------------------------------------------------------------------
    let mut intents: Vec<Intent> = Vec::new();
    let mut has_intent = vec![false; nodes.len()];
    let mut waiting: Vec<WaitingOn> = Vec::new();
    let t_failed: BTreeSet<&str> = target.map_or_else(BTreeSet::new, |t| {
        revs[t]
            .failed_nodes
            .iter()
            .map(|f| f.node.as_str())
            .collect()
    });

    // 1. Rollbacks: off every failed revision, and failed nodes off the target, to the last good one.
    if let Some(lg) = last_good {
        let lg_name = revs[lg].name();
        let target_name = target.map(|t| revs[t].name());
        for &i in &order {
            let Some(spec) = nodes[i].spec else { continue };
            let off_failed = failed_revs.contains(spec.revision);
            let failed_here = Some(spec.revision) == target_name
                && spec.revision != lg_name
                && t_failed.contains(nodes[i].name());
            if off_failed || failed_here {
                intents.push(Intent {
                    node: i,
                    rev: lg,
                    reason: AssignReason::Rollback,
                });
                has_intent[i] = true;
            }
        }
    }

    // Validation errors on the target are only possible once it completed (before, they fail it): the
    // fleet changed under it. It stays the last good revision, but it is given to no further node.
    let t_invalid = target.is_some_and(|t| !revs[t].state.validation.errors.is_empty());
    let t_halted = t_invalid
        || target.is_some_and(|t| revs[t].state.paused || !revs[t].policy_errors.is_empty());
    let t_updated_before = target.map_or(0, |t| {
        let name = revs[t].name();
        by_revision
            .get(name)
            .map_or(0, |v| v.iter().filter(|&&i| nodes[i].updated(name)).count())
    });

    // 2. New nodes: the last good revision until the target has an updated node (or while the rollout
    //    is halted), then the target. Without a last good revision they are ordinary rollout candidates.
    if let (Some(t), Some(lg)) = (target, last_good) {
        let rev = if !t_halted && t_updated_before > 0 {
            t
        } else {
            lg
        };
        // A node that never ran a revision gets none with validation errors.
        let usable = revs[rev].state.validation.errors.is_empty();
        for &i in &order {
            if usable && !nodes[i].has_config && nodes[i].eligible && !has_intent[i] {
                intents.push(Intent {
                    node: i,
                    rev,
                    reason: AssignReason::NewNode,
                });
                has_intent[i] = true;
            }
        }
    }

    // 3. The rollout of the target, in order, gated by canaries and bake.
    let mut canary_stage = CanaryStage::Off;
    let mut canaries_done_now = false;
    if let Some(t) = target {
        let trev = &revs[t];
        let tname = trev.name();
        let complete = trev.stored_phase == Some(Phase::Complete);
        let stored_canaries_at = if trev.same_attempt {
            trev.state
                .status
                .canaries_updated_at
                .as_ref()
                .map(Timestamp::from_time)
        } else {
            None
        };
        if let (Some(canary), false) = (&trev.policy.canary, complete) {
            let canaries_at = match stored_canaries_at {
                Some(at) => Some(at),
                None => {
                    let set: BTreeSet<usize> = match &canary.nodes {
                        CanaryNodes::Selector(sel) => order
                            .iter()
                            .copied()
                            .filter(|&i| {
                                nodes[i].eligible
                                    && !t_failed.contains(nodes[i].name())
                                    && sel.matches(&nodes[i].state.labels)
                            })
                            .collect(),
                        // Nodes already given the target are the canaries chosen by an earlier step:
                        // they come first, so a node that joins and sorts early does not take over.
                        CanaryNodes::Count(k) => {
                            let ok = |i: &usize| {
                                nodes[*i].eligible && !t_failed.contains(nodes[*i].name())
                            };
                            let on_target =
                                |i: &usize| nodes[*i].spec.is_some_and(|s| s.revision == tname);
                            order
                                .iter()
                                .copied()
                                .filter(|i| ok(i) && on_target(i))
                                .chain(order.iter().copied().filter(|i| ok(i) && !on_target(i)))
                                .take(*k as usize)
                                .collect()
                        }
                    };
                    let pending = set.iter().filter(|&&i| !nodes[i].updated(tname)).count() as u32;
                    if pending == 0 {
                        canaries_done_now = true;
                        Some(now.truncate_to_secs())
                    } else {
                        canary_stage = CanaryStage::Canaries {
                            nodes: set,
                            pending,
                        };
                        None
                    }
                }
            };
            if let Some(at) = canaries_at {
                let until = at.plus_secs(canary.bake_seconds as u64);
                canary_stage = if now < until {
                    CanaryStage::Baking { until }
                } else {
                    CanaryStage::Done
                };
            }
        }
        if !t_halted {
            let mut gated = false;
            for &i in &order {
                let n = &nodes[i];
                if has_intent[i] || !n.eligible || t_failed.contains(n.name()) {
                    continue;
                }
                if n.spec.is_none() && last_good.is_some() {
                    continue; // new nodes were handled above
                }
                // A move to the last good revision (rollback, new node) finishes before the node
                // moves on to the target.
                if let (Some(s), Some(lg)) = (n.spec, last_good)
                    && s.revision == revs[lg].name()
                    && lg != t
                    && n.in_flight
                {
                    continue;
                }
                let want = hash_for(t, i);
                let reason = match n.spec {
                    Some(s) if s.revision == tname => {
                        let hash_ok = want.is_none_or(|h| h == s.hash);
                        if !hash_ok {
                            AssignReason::Rerender
                        } else if n.updated(tname) {
                            continue;
                        } else if s.retry != trev.state.retry {
                            AssignReason::Retry
                        } else if s.assigned_at.is_none() {
                            AssignReason::Restamp
                        } else {
                            continue;
                        }
                    }
                    _ => AssignReason::Rollout,
                };
                let reason = match &canary_stage {
                    CanaryStage::Canaries { nodes: set, .. } => {
                        if !set.contains(&i) {
                            gated = true;
                            continue;
                        }
                        if reason == AssignReason::Rollout {
                            AssignReason::Canary
                        } else {
                            reason
                        }
                    }
                    CanaryStage::Baking { .. } => {
                        gated = true;
                        continue;
                    }
                    _ => reason,
                };
                intents.push(Intent {
                    node: i,
                    rev: t,
                    reason,
                });
                has_intent[i] = true;
            }
            match &canary_stage {
                CanaryStage::Canaries { pending, .. } => {
                    waiting.push(WaitingOn::Canaries { pending: *pending })
                }
                CanaryStage::Baking { until } if gated => {
                    waiting.push(WaitingOn::CanaryBake { until: *until })
                }
                _ => {}
            }
        }
    }

    // ---- apply intents: first every one that spends no budget, then the rest in order -----------------
    let mut assignments: Vec<Assignment> = Vec::new();
    let mut missing: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for pass in [0, 1] {
        for intent in &intents {
            let n = &nodes[intent.node];
            if n.assigned {
                continue;
            }
            let rev = &revs[intent.rev];
            let Some(hash) = hash_for(intent.rev, intent.node) else {
                if pass == 0 {
                    missing
                        .entry(intent.rev)
                        .or_default()
                        .push(n.name().to_string());
                }
                continue;
            };
            let will = in_flight_of(rev.name(), rev.state.retry, hash, n.status);
            let spends = will && !n.in_flight;
            if (pass == 0) == spends {
                continue;
            }
            if spends {
                if !n.eligible {
                    continue;
                }
                if in_flight >= budget {
                    continue;
                }
                if let Some(db) = domain_budget[n.domain]
                    && domain_in_flight[n.domain] >= db
                {
                    continue;
                }
            }
            let reason = match intent.reason {
                AssignReason::Canary | AssignReason::Rollout | AssignReason::NewNode
                    if !will && n.spec.is_some_and(|s| s.revision != rev.name()) =>
                {
                    AssignReason::FastPath
                }
                r => r,
            };
            let n = &mut nodes[intent.node];
            if will != n.in_flight {
                if will {
                    in_flight += 1;
                    domain_in_flight[n.domain] += 1;
                } else {
                    in_flight -= 1;
                    domain_in_flight[n.domain] -= 1;
                }
            }
            n.in_flight = will;
            n.assigned = true;
            n.spec = Some(Spec {
                revision: rev.name(),
                retry: rev.state.retry,
                hash,
                assigned_at: Some(now),
            });
            assignments.push(Assignment {
                node: n.name().to_string(),
                create: !n.has_config,
                revision: rev.name().to_string(),
                sequence: rev.state.sequence,
                config_hash: hash.to_string(),
                retry: rev.state.retry,
                assigned_at: now,
                reason,
            });
        }
    }

    // What holds back the moves that did not happen, judged on the counts after the plan (what the next
    // step will see), so a repeated step reports the same and writes nothing.
    let mut refused_budget = false;
    let mut refused_domains: BTreeSet<usize> = BTreeSet::new();
    for intent in &intents {
        let n = &nodes[intent.node];
        let rev = &revs[intent.rev];
        if n.assigned || !n.eligible {
            continue;
        }
        let Some(hash) = hash_for(intent.rev, intent.node) else {
            continue;
        };
        if !in_flight_of(rev.name(), rev.state.retry, hash, n.status) || n.in_flight {
            continue;
        }
        if in_flight >= budget {
            refused_budget = true;
        } else if domain_budget[n.domain].is_some_and(|b| domain_in_flight[n.domain] >= b) {
            refused_domains.insert(n.domain);
        }
    }

    // ---- after the plan: counts, waits ---------------------------------------------------------------------
    let mut counts: BTreeMap<&str, Counts> = BTreeMap::new();
    for n in &nodes {
        if let Some(s) = n.spec {
            let c = counts.entry(s.revision).or_default();
            c.assigned += 1;
            if updated_of(s.revision, s.hash, n.status, s.revision) {
                c.updated += 1;
            }
        }
    }

    let mut requeue: Option<Timestamp> = None;
    let mut wake = |at: Timestamp| {
        if at > now {
            requeue = Some(requeue.map_or(at, |r: Timestamp| r.min(at)));
        }
    };

    let target_view = target.map(|t| {
        let trev = &revs[t];
        let tname = trev.name();
        let (mut updated, mut in_progress, mut queued, mut skipped) = (0u32, 0u32, 0u32, 0u32);
        let mut applying: Vec<String> = Vec::new();
        let mut unready: Vec<String> = Vec::new();
        let mut started = trev.same_attempt && trev.state.status.started_at.is_some();
        let timeout = trev.policy.apply_timeout_seconds as u64;
        for &i in &order {
            let n = &nodes[i];
            if t_failed.contains(n.name()) {
                continue;
            }
            match n.spec {
                Some(s) if s.revision == tname => {
                    started = true;
                    if n.updated(tname) {
                        updated += 1;
                    } else {
                        in_progress += 1;
                        if applying.len() < LIST_LIMIT {
                            applying.push(n.name().to_string());
                        }
                        if s.retry == trev.state.retry
                            && let Some(at) = s.assigned_at
                        {
                            wake(at.plus_secs(timeout));
                        }
                    }
                }
                _ if !n.eligible => {
                    skipped += 1;
                    if unready.len() < LIST_LIMIT {
                        unready.push(n.name().to_string());
                    }
                }
                _ => queued += 1,
            }
        }
        if let CanaryStage::Baking { until } = canary_stage {
            wake(until);
        }
        let mut w = Vec::new();
        if trev.state.paused {
            let since = trev
                .state
                .status
                .paused_at
                .as_ref()
                .map_or(now.truncate_to_secs(), Timestamp::from_time);
            w.push(WaitingOn::Paused { since });
        }
        if !trev.policy_errors.is_empty() {
            w.push(WaitingOn::InvalidPolicy {
                errors: trev.policy_errors.clone(),
            });
        }
        if !trev.state.validation.errors.is_empty() {
            w.push(WaitingOn::ValidationErrors {
                errors: trev.state.validation.errors.clone(),
            });
        }
        w.append(&mut waiting);
        if queued > 0 && refused_budget {
            w.push(WaitingOn::Budget { in_flight, budget });
        }
        if queued > 0 {
            for &d in &refused_domains {
                w.push(WaitingOn::DomainBudget {
                    domain: domain_names[d].to_string(),
                    in_flight: domain_in_flight[d],
                    budget: domain_budget[d].unwrap_or(0),
                });
            }
        }
        if in_progress > 0 {
            w.push(WaitingOn::NodesInFlight {
                count: in_progress,
                first: applying,
            });
        }
        if skipped > 0 {
            w.push(WaitingOn::NotReady {
                count: skipped,
                first: unready,
            });
        }
        TargetView {
            idx: t,
            total: nodes.len() as u32,
            updated,
            in_progress,
            queued,
            skipped,
            started,
            halted_by_policy: !trev.policy_errors.is_empty(),
            invalid: !trev.state.validation.errors.is_empty(),
            canary_stage: canary_stage.clone(),
            canaries_done_now,
            waiting: w,
        }
    });

    // ---- statuses and events ----------------------------------------------------------------------------------
    let ctx = status::Context {
        now,
        revs: &revs,
        target: target_view.as_ref(),
        last_good,
        counts: &counts,
    };
    let mut status_updates = Vec::new();
    let mut events = Vec::new();

    // ---- history ---------------------------------------------------------------------------------------------------
    // Judged on the world after this plan (so the next step agrees): a node's spec once the plan's
    // assignments are written, its agent's last good revision, the target and the last good revision.
    // The shell stops at the first failed write, so a revision is only deleted once the assignments
    // moving nodes off it are written.
    let mut protected: BTreeSet<&str> = BTreeSet::new();
    for n in &nodes {
        if let Some(s) = n.spec {
            protected.insert(s.revision);
        }
        if let Some(lg) = &n.status.last_good_revision {
            protected.insert(lg);
        }
    }
    if let Some(t) = target {
        protected.insert(revs[t].name());
    }
    let last_good_after = status::last_good_after(&ctx);
    if let Some(lg) = last_good_after {
        protected.insert(revs[lg].name());
    }
    let limit = input.defaults.revision_history_limit;
    let delete_revisions: Vec<String> = revs
        .iter()
        .skip(limit)
        .filter(|r| !protected.contains(r.name()))
        .map(|r| r.name().to_string())
        .collect();

    for (i, rev) in revs.iter().enumerate() {
        if delete_revisions.iter().any(|d| d == rev.name()) {
            continue;
        }
        let (new_status, mut evs) = status::build(&ctx, i);
        if new_status != rev.state.status {
            status_updates.push(StatusUpdate {
                revision: rev.name().to_string(),
                status: new_status,
            });
            events.append(&mut evs);
        }
        if let Some(tv) = ctx.target
            && tv.idx == i
            && let Some(at) = status::deadline_at(&ctx, i)
        {
            wake(at);
        }
    }

    // ---- nodes that left ------------------------------------------------------------------------------------------
    let delete_configs = orphans;

    let mut report_waiting = target_view.map(|t| t.waiting).unwrap_or_default();
    if target.is_none() {
        report_waiting.push(WaitingOn::NoTarget);
    }
    if last_good.is_none()
        && let Some(f) = revs.iter().find(|r| {
            matches!(
                r.fate,
                Fate::Failed(FailCause::MaxFailures | FailCause::Stored)
            )
        })
        && counts.get(f.name()).is_some_and(|c| c.assigned > 0)
    {
        report_waiting.push(WaitingOn::NoLastGood {
            failed: f.name().to_string(),
        });
    }
    for (r, names) in missing {
        report_waiting.push(WaitingOn::MissingRender {
            revision: revs[r].name().to_string(),
            count: names.len() as u32,
            first: names.into_iter().take(LIST_LIMIT).collect(),
        });
    }

    Plan {
        status_updates,
        assignments,
        delete_configs,
        delete_revisions,
        events,
        report: Report {
            target: target.map(|t| revs[t].name().to_string()),
            last_good: last_good_after.map(|i| revs[i].name().to_string()),
            in_flight,
            budget,
            waiting: report_waiting,
            requeue_at: requeue,
        },
    }
}

fn detect_failures(
    nodes: &[Node],
    assigned: Option<&Vec<usize>>,
    rev: &Rev,
    now: Timestamp,
) -> Vec<FailedNode> {
    let Some(assigned) = assigned else {
        return Vec::new();
    };
    let known: BTreeSet<&str> = rev.failed_nodes.iter().map(|f| f.node.as_str()).collect();
    let name = rev.name();
    let retry = rev.state.retry;
    let timeout = rev.policy.apply_timeout_seconds as u64;
    let mut out = Vec::new();
    for &i in assigned {
        let n = &nodes[i];
        let (Some(spec), st) = (n.spec, n.status) else {
            continue;
        };
        if known.contains(n.name()) || out.iter().any(|f: &FailedNode| f.node == n.name()) {
            continue;
        }
        // A spec the agent refused as tampered says nothing about the revision: the configurator puts
        // the spec back, and the apply timeout still catches a node that never gets it.
        let tampered = st.reason.as_deref() == Some(netwave_api::REASON_CONFIG_TAMPERED);
        if st.phase == Some(AgentPhase::Invalid)
            && !tampered
            && st.observed_revision.as_deref() == Some(name)
            && st.observed_retry == Some(retry)
        {
            out.push(FailedNode {
                node: n.name().to_string(),
                reason: st.reason.clone().unwrap_or_else(|| "Invalid".to_string()),
                message: st.message.clone().unwrap_or_default(),
                at: Some(now.to_time()),
            });
        } else if spec.revision == name
            && spec.retry == retry
            && !n.updated(name)
            && let Some(at) = spec.assigned_at
            && now >= at.plus_secs(timeout)
        {
            out.push(FailedNode {
                node: n.name().to_string(),
                reason: REASON_APPLY_TIMEOUT.to_string(),
                message: format!(
                    "no Provisioned report within {timeout}s of assignment at {}",
                    at.to_time().0
                ),
                at: Some(now.to_time()),
            });
        }
    }
    out
}
