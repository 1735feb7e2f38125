//! What one reconcile decides, synchronously and deterministically from a snapshot, the reconciler's
//! memory and `now`: the revision cut, the step's plan, and the write intents that carry both out.
//!
//! ```text
//!   Snapshot ─► integrity ─► the fleet's nodes ─► cut ─► step_input ─► render_for_step
//!          (tampered specs put back)        (create / reactivate ends it)     │
//!                                                   judge_inputs ◄────────────┘
//!                                                        │
//!                                 the step ─► plan_intents ─► Outcome { intents, plan, … }
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use netwave_api::kinds::View;
use netwave_api::{
    InputStatus, NetworkConfigRevision, NetworkConfigRevisionSpec, NodeNetworkConfigSpec,
    RevisionInputs, RolloutPolicy, ValidationResult,
};
use netwave_core::fleet::FleetParams;
use netwave_core::limits::{self, InputsTooLarge};
use netwave_core::render::{self, InputRef};
use netwave_core::revision::{self, ExistingRevision, InputSettle};
use netwave_core::rollout::cut::{self, Cut, Rolling};
use netwave_core::rollout::hold::{self};
use netwave_core::rollout::loss;
use netwave_core::rollout::quarantine;
use netwave_core::rollout::{
    self, InputVerdicts, NodeConfigState, ObjectVerdict, Plan, PolicyDefaults, RenderedHashes,
    RevisionState, RolloutInput,
};
use netwave_core::undecodable::Holds;
use netwave_core::{Sequence, Timestamp};
use tracing::{debug, info, warn};

use crate::events::{ShellEvent, object_ref, rollout_event};
use crate::integrity::Findings;
use crate::memory::{Memory, Rendered};
use crate::observed::{ConfigChanges, Nodes, Observed};
pub use crate::snapshot::Snapshot;
use crate::snapshot::live;
use crate::writer::{Intent, Reactivation};

#[derive(Clone, Debug)]
pub struct Settings {
    pub defaults: PolicyDefaults,
    pub fleet: FleetParams,
    pub resync: Duration,
    /// Quiet time the inputs need before a revision is cut from them (see [`InputSettle`]).
    pub input_settle: Duration,
    /// How long the loop waits after a change for the rest of a burst (`--coalesce-window`), counted
    /// from the first change it has not taken: events during a reconcile coalesce anyway (one stored
    /// wake-up), and one that waited out a reconcile is not made to wait the whole window again.
    pub coalesce: Duration,
    /// What a leader's wait plus the reconcile after it aim at (`--reaction-target`, [`Pace`]).
    pub reaction_target: Duration,
    /// How new revisions are named (`--revision-names`).
    pub naming: revision::Naming,
}

/// What one reconcile wants written, plus what it found.
pub struct Outcome {
    pub intents: Vec<Intent>,
    pub plan: Option<Plan>,
    /// When to reconcile again even without a change.
    pub requeue_at: Option<Timestamp>,
    /// The current inputs equal this Failed revision: nothing new is created for them.
    pub equals_failed: Option<String>,
    /// The inputs changed and are settling: a revision is cut once they stop changing.
    pub inputs_pending: bool,
    /// Revisions and node configs whose spec is not what the configurator wrote.
    pub tampered: Findings,
    /// The node configs as the step read them (placeholders left out); empty without a plan.
    pub configs: Arc<Vec<Arc<NodeConfigState>>>,
    /// Of those, the ones that came or changed, and the names that went, since the last plan.
    pub changes: ConfigChanges,
    /// Live node configs quarantined once this plan is written.
    pub quarantined: usize,
    /// The current inputs (this hash) fold into more than one object can hold: no revision is cut.
    pub too_large: Option<(String, InputsTooLarge)>,
}

impl Outcome {
    /// Nothing decided: `intents` (if any) are written and the next reconcile goes on from there.
    pub(crate) fn only(intents: Vec<Intent>, tampered: Findings) -> Self {
        Outcome {
            intents,
            plan: None,
            requeue_at: None,
            equals_failed: None,
            inputs_pending: false,
            tampered,
            configs: Default::default(),
            changes: ConfigChanges::default(),
            quarantined: 0,
            too_large: None,
        }
    }
}

/// Decides what to write. Pure apart from the cache. Stages: integrity (tampered specs put back) →
/// the fleet's nodes → the cut ([`rollout::cut`]: a revision created or reactivated ends the reconcile)
/// → [`step_input`] → [`render_for_step`] → [`judge_inputs`] → the step → [`plan_intents`].
pub fn compute(
    s: &Snapshot,
    settings: &Settings,
    cache: &mut Memory,
    settle: &mut InputSettle,
    now: Timestamp,
) -> Outcome {
    let holds = s.holds();
    if !holds.rollout.is_empty() {
        // A revision or its inputs cannot be decoded: what nodes run, and where a failure would take
        // them back, is unknown. Nothing is written until it is fixed; `Reconciler` reports it.
        return Outcome::only(Vec::new(), Findings::default());
    }
    // Specs someone edited. A revision that the current inputs can put back is put back before
    // anything else is decided; the others are never rendered again.
    let tampered = cache.integrity.check(s, now);
    let (inputs, hash) = cache.folded.of(s);
    let restores = restore_revisions(s, &tampered, &inputs, &hash);
    if !restores.is_empty() {
        return Outcome::only(restores, tampered);
    }
    if !tampered.awaiting_inputs.is_empty() {
        // A revision without its inputs yet (they are written right after it): nothing is decided
        // on a partial view. Their watch event wakes the loop; the requeue ends the grace.
        return Outcome {
            requeue_at: Some(Timestamp(now.0 + 1000)),
            ..Outcome::only(Vec::new(), tampered)
        };
    }
    // The live nodes, converted only where they changed since the last reconcile ([`Observed`]).
    let fleet = cache.observed.nodes(s);
    let existing: Vec<ExistingRevision> = live_revisions(s)
        .map(|r| ExistingRevision::from_object(r))
        .collect();
    let decision = revision::decide_named(&hash, &existing, sequence_floor(s), settings.naming);
    let max_bytes = settings.fleet.max_object_bytes;
    let rolling = match cut::cut(
        &hash,
        decision,
        settle,
        settings.input_settle,
        now,
        !holds.cutting.is_empty(),
        || limits::check_inputs(&inputs, max_bytes),
    ) {
        Cut::Create {
            name,
            sequence,
            hash,
        } => {
            // The new revision shows up through the watch and the next reconcile rolls it out.
            let revision = NewRevision {
                name,
                sequence,
                hash,
                inputs: Arc::unwrap_or_clone(inputs),
            };
            let intents = create_revision(s, settings, cache, &fleet, &tampered, revision);
            return Outcome::only(intents, tampered);
        }
        Cut::Reactivate { name, new_sequence } => {
            return Outcome::only(reactivate_revision(s, &name, new_sequence, now), tampered);
        }
        Cut::Roll(rolling) => rolling,
    };
    if rolling.settle_started {
        info!(inputs = %hash, settle = ?settings.input_settle, "inputs changed: a revision is cut once they stop changing");
    }
    if let Some(name) = rolling.current.as_ref().filter(|_| rolling.equals_failed) {
        debug!(revision = %name, "inputs equal a failed revision; bump its spec.retry or change the inputs");
    }

    let mut input = step_input(s, settings, &holds, &fleet, &mut cache.observed);
    let mut renders = render_for_step(s, settings, cache, &fleet, &tampered, &mut input, now);
    let current = Current {
        inputs: &inputs,
        hash: &hash,
        rolling: &rolling,
    };
    let statuses = judge_inputs(s, settings, cache, &fleet, &current, &mut renders, now);
    cache.retain(&renders.used);

    let plan = cache.memo.step(&input, now);
    let mut intents = plan_intents(s, &cache.observed, &plan, &renders.rendered, &tampered, now);
    intents.extend(unrestorable_revision_events(s, &tampered));
    intents.extend(placeholders(&mut cache.observed, &holds, &plan));
    intents.extend(quarantine_conditions(&cache.observed, &plan, now));
    // Last: the input objects' status never holds up a rollout write.
    intents.extend(statuses);
    let quarantined = quarantined_after(&cache.observed, &plan);
    let requeue_at = [plan.report.requeue_at, rolling.settle_until]
        .into_iter()
        .flatten()
        .min();
    Outcome {
        intents,
        plan: Some(plan),
        requeue_at,
        equals_failed: rolling.current.filter(|_| rolling.equals_failed),
        inputs_pending: rolling.settle_until.is_some(),
        tampered,
        configs: input.configs,
        changes: cache.observed.changes(),
        quarantined,
        too_large: rolling.too_large.map(|t| (hash, t)),
    }
}

fn live_revisions(s: &Snapshot) -> impl Iterator<Item = &Arc<NetworkConfigRevision>> {
    s.revisions.iter().filter(|r| live(r.as_ref()))
}

/// The highest sequence any node config holds: sequences stay monotonic when history is deleted.
fn sequence_floor(s: &Snapshot) -> u64 {
    s.node_configs
        .iter()
        .map(|n| n.spec.sequence)
        .max()
        .unwrap_or(0)
}

/// A revision to create from the current inputs.
struct NewRevision {
    name: String,
    sequence: u64,
    hash: String,
    inputs: RevisionInputs,
}

/// The create of a revision cut from the current inputs: held if it is destructive, measured against
/// the last good revision (never the current target), the rule the step holds every target to. Created
/// held, an admin can approve it before any step saw it.
fn create_revision(
    s: &Snapshot,
    settings: &Settings,
    cache: &mut Memory,
    fleet: &Nodes,
    tampered: &Findings,
    new: NewRevision,
) -> Vec<Intent> {
    let states: Vec<RevisionState> = live_revisions(s)
        .filter_map(|r| RevisionState::from_api(r, ValidationResult::default()).ok())
        .collect();
    let last_good = rollout::last_good(&states).and_then(|lg| {
        // A tampered revision is never rendered again (its inputs are not what it hashes to).
        if tampered.revisions.contains_key(lg.name.as_str()) {
            return None;
        }
        let rendered = cache.get(&lg.hash, s.inputs_of(&lg.name)?, fleet, &settings.fleet);
        Some((lg.name.as_str(), rendered))
    });
    let candidate = cache.get(&new.hash, &new.inputs, fleet, &settings.fleet);
    let held = hold::hold_on_creation(
        &new.name,
        Sequence(new.sequence),
        &candidate.footprint,
        last_good.as_ref().map(|(n, r)| (*n, r.footprint.as_ref())),
        settings.defaults.destructive_threshold,
    );
    let spec = NetworkConfigRevisionSpec {
        hash: new.hash,
        sequence: new.sequence,
        rollout: RolloutPolicy::default(),
        paused: held.is_some(),
        retry: 0,
    };
    let event = held.as_ref().map(|h| cut::held_event(h, new.sequence));
    let mut intents = vec![Intent::CreateRevision {
        name: new.name,
        spec: Box::new(spec),
        inputs: Box::new(new.inputs),
        hold: held,
    }];
    intents.extend(event.map(|e| rollout_event(s, &e, "Revision")));
    intents
}

/// The fresh rollout a reactivated revision starts over with, as the next sequence: `Pending`, no
/// start, completion or failures of the earlier one.
fn reactivation(sequence: u64, now: Timestamp) -> Reactivation {
    Reactivation {
        active_sequence: sequence,
        reactivated_at: now.truncate_to_secs().to_rfc3339(),
        phase: netwave_api::vocab::RevisionPhase::Pending.as_str(),
        started_at: None,
        completed_at: None,
        canaries_updated_at: None,
        last_progress_at: None,
        failed_nodes: Vec::new(),
        failed: 0,
    }
}

/// Makes an older good revision the target again, with the Event that says so.
fn reactivate_revision(s: &Snapshot, name: &str, new_sequence: u64, now: Timestamp) -> Vec<Intent> {
    let created = s
        .revisions
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some(name))
        .map(|r| r.spec.sequence)
        .unwrap_or_default();
    vec![
        Intent::ReactivateRevision {
            name: name.to_string(),
            status: reactivation(new_sequence, now),
        },
        rollout_event(
            s,
            &cut::reactivated_event(name, created, new_sequence),
            "Revision",
        ),
    ]
}

/// The step's input: every live revision (with the validation on record until it is rendered), the
/// nodes and their configs (a placeholder holds no assignment: to the step, its node has none yet).
fn step_input(
    s: &Snapshot,
    settings: &Settings,
    holds: &Holds,
    fleet: &Nodes,
    observed: &mut Observed,
) -> RolloutInput {
    let nodes = fleet.states.clone();
    let configs = observed.configs(s);
    RolloutInput {
        defaults: settings.defaults.clone(),
        revisions: live_revisions(s)
            // Revisions the step will not render keep the validation on record (a Failed revision's
            // errors must stay in its status); the ones it may roll out are validated afresh.
            .filter_map(|r| {
                let stored = r
                    .status
                    .as_ref()
                    .map(|s| s.validation.clone())
                    .unwrap_or_default();
                RevisionState::interned(r, stored, observed.strings()).ok()
            })
            .collect(),
        nodes,
        configs,
        unreadable_configs: holds.unreadable_nodes.clone(),
        unassigned_agents: observed.unassigned_agents(),
        rendered: RenderedHashes::default(),
        footprints: Default::default(),
        move_losses: Default::default(),
    }
}

/// The renders of the revisions the step may assign, and the cache keys this reconcile used.
struct Renders {
    rendered: BTreeMap<String, Arc<Rendered>>,
    used: BTreeSet<(String, u64)>,
}

/// Renders and validates what the step may assign, into `input` (hashes, footprints, validation). A
/// tampered revision is never rendered: its nodes get nothing from it, and the step sees why in its
/// validation.
fn render_for_step(
    s: &Snapshot,
    settings: &Settings,
    cache: &mut Memory,
    fleet: &Nodes,
    tampered: &Findings,
    input: &mut RolloutInput,
    now: Timestamp,
) -> Renders {
    let mut out = Renders {
        rendered: BTreeMap::new(),
        used: BTreeSet::new(),
    };
    for name in rollout::revisions_to_render(input) {
        let Some(rev) = live_revisions(s).find(|r| r.metadata.name.as_deref() == Some(&name))
        else {
            continue;
        };
        let state = input.revisions.iter_mut().find(|s| s.name == name);
        if let Some(t) = tampered.revisions.get(&name) {
            if let Some(state) = state {
                state.validation = ValidationResult {
                    errors: vec![t.to_string()],
                    warnings: Vec::new(),
                };
            }
            continue;
        }
        let Some(rev_inputs) = s.inputs_of(&name) else {
            continue;
        };
        // Cut by a configurator that renders differently (an upgrade or a downgrade in flight): its
        // node configs are that one's, never re-rendered here. Its nodes keep them until the rollout
        // moves them to a revision of this version, which the cut makes from the same inputs.
        let version = render::render_version_of(rev_inputs);
        if version != render::RENDER_VERSION {
            if let Some(state) = state {
                state.other_render_version = Some(version);
            }
            continue;
        }
        let r = cache.get(&rev.spec.hash, rev_inputs, fleet, &settings.fleet);
        if let Some(state) = state {
            state.validation = r.validation.clone();
        }
        out.used.insert((rev.spec.hash.clone(), fleet.fingerprint));
        input.rendered.set_revision(name.clone(), r.hashes.clone());
        input.rendered.set_needs(name.clone(), r.needs.clone());
        input.footprints.insert(name.clone(), r.footprint.clone());
        let basis = r.basis.get_or_init(|| loss::rendering_basis(&r.hashes));
        let rendering = (&r.nodes, basis.as_str());
        if let Some(loss) = cache.items.move_loss(rev, rendering, &s.node_configs, now) {
            input.move_losses.insert(name.clone(), loss);
        }
        out.rendered.insert(name, r);
    }
    out
}

/// The current inputs and what the cut said about them.
struct Current<'a> {
    inputs: &'a RevisionInputs,
    hash: &'a str,
    rolling: &'a Rolling,
}

/// The status of every input object: judged against the revision cut from the current inputs, or
/// refused whole when they are too large to cut; none while they wait for a revision.
fn judge_inputs(
    s: &Snapshot,
    settings: &Settings,
    cache: &mut Memory,
    fleet: &Nodes,
    current: &Current,
    renders: &mut Renders,
    now: Timestamp,
) -> Vec<Intent> {
    let mut verdicts = || {
        renders
            .used
            .insert((current.hash.to_string(), fleet.fingerprint));
        cache.verdicts(current.hash, current.inputs, fleet, &settings.fleet)
    };
    if let Some(problem) = &current.rolling.too_large {
        let verdicts = verdicts();
        let problem = problem.to_string();
        return input_statuses(s, &verdicts, |verdict, generation, old| {
            rollout::input_status_uncut(verdict, &problem, generation, old, now)
        });
    }
    let Some(name) = &current.rolling.current else {
        return Vec::new();
    };
    let errors = renders
        .rendered
        .get(name)
        .map(|r| r.validation.errors.clone())
        .or_else(|| {
            live_revisions(s)
                .find(|r| r.metadata.name.as_deref() == Some(name))
                .and_then(|r| r.status.as_ref())
                .map(|st| st.validation.errors.clone())
        })
        .unwrap_or_default();
    // The rollout of the revision that carries the inputs, as stored (a phase it reaches in this
    // reconcile's plan shows on the inputs at the next one, which the status write wakes).
    let health = rollout::health::of_revision(
        live_revisions(s)
            .find(|r| r.metadata.name.as_deref() == Some(name))
            .and_then(|r| r.status.as_ref()),
    );
    let verdicts = verdicts();
    input_statuses(s, &verdicts, |verdict, generation, old| {
        rollout::input_status(verdict, name, &errors, &health, generation, old, now)
    })
}

/// The plan as writes, in the order they must land: node records first (a quarantine is on record
/// before the failure it makes not count), holds, revision status, assignments, node configs put
/// back, deletes, then the plan's Events. A leader then holds back or sends last the status writes
/// that only move counters ([`schedule_statuses`]).
fn plan_intents(
    s: &Snapshot,
    observed: &Observed,
    plan: &Plan,
    rendered: &BTreeMap<String, Arc<Rendered>>,
    tampered: &Findings,
    now: Timestamp,
) -> Vec<Intent> {
    let mut intents = Vec::new();
    for r in &plan.records {
        intents.push(Intent::NodeRecord {
            node: r.node.clone(),
            record: r.record.clone(),
        });
    }
    for h in &plan.holds {
        let resource_version = live_revisions(s)
            .find(|r| r.metadata.name.as_deref() == Some(h.revision.as_str()))
            .and_then(|r| r.metadata.resource_version.clone());
        intents.push(Intent::HoldRevision {
            hold: h.clone(),
            resource_version,
        });
    }
    for u in &plan.status_updates {
        intents.push(Intent::RevisionStatus {
            name: u.revision.clone(),
            status: Arc::clone(&u.status),
        });
    }
    for a in &plan.assignments {
        let Some(config) = rendered
            .get(a.revision.as_str())
            .and_then(|r| r.nodes.get(a.node.as_str()))
        else {
            warn!(node = %a.node, revision = %a.revision, "no rendered config for an assignment; skipped");
            continue;
        };
        let spec = NodeNetworkConfigSpec {
            revision: a.revision.to_string(),
            sequence: a.sequence.0,
            config_hash: a.config_hash.to_string(),
            retry: a.retry,
            config: config.config(),
        };
        let current = observed.config(&a.node).map(|(c, _)| c.as_ref());
        intents.push(Intent::ApplyNodeConfig {
            node: a.node.to_string(),
            pending: pending_mark(current, &spec),
            spec: Box::new(spec),
            // Stamped when sent (the deadlines count from the write, not from this plan).
            assigned_at: None,
            clear_queued: may_be_queued(current),
            based_on: current.and_then(|c| c.metadata.resource_version.clone()),
        });
    }
    intents.extend(restore_node_configs(s, tampered, rendered, plan, now));
    for name in &plan.delete_configs {
        intents.push(Intent::DeleteNodeConfig { name: name.clone() });
    }
    for name in &plan.delete_revisions {
        intents.push(Intent::DeleteRevision { name: name.clone() });
    }
    intents.extend(plan.events.iter().map(|e| rollout_event(s, e, "Rollout")));
    intents
}

/// The `Pending` mark an assignment of `spec` over `current` (as the cache has it) carries: its status
/// would otherwise say the node runs (`Provisioned`) a config it has not been given yet, or is
/// `Queued` although assigned. `None` when the status tells no lie; a node whose status nobody
/// wrote (a first assignment, over a placeholder or none) needs none.
fn pending_mark(
    current: Option<&netwave_api::NodeNetworkConfig>,
    spec: &NodeNetworkConfigSpec,
) -> Option<String> {
    let status = current?.status.as_ref()?;
    Some(match status.stale_for(spec)? {
        netwave_api::StaleReport::OlderConfig { reported } => format!(
            "config re-rendered under revision {} (configHash {}); waiting for the agent to report \
             on it (it runs configHash {reported})",
            spec.revision, spec.config_hash
        ),
        netwave_api::StaleReport::Queued => format!(
            "assigned revision {} (configHash {}); waiting for the agent to report on it",
            spec.revision, spec.config_hash
        ),
    })
}

/// Whether an assignment over `current` (as the cache has it) must set `netwave.dev/queued` empty: it
/// is a placeholder, or one the cache does not show yet (the create may have landed), or an
/// assignment still carrying a message. Not once it is empty: the assignment then leaves it out, which
/// removes it.
fn may_be_queued(current: Option<&netwave_api::NodeNetworkConfig>) -> bool {
    current.is_none_or(|c| {
        c.spec.is_placeholder()
            || c.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(netwave_api::QUEUED_ANNOTATION))
                .is_some_and(|m| !m.is_empty())
    })
}

/// Most placeholder writes one reconcile makes: a first rollout creates them in batches behind the
/// rollout's own writes, so an agent's report never waits behind thousands of them. Two rounds of
/// concurrent node writes: a report that comes in while a reconcile writes waits for them (with 250,
/// a first rollout of 15,000 nodes spent its first seconds in reconciles of 100 ms and more, #28).
const PLACEHOLDER_WRITES_PER_RECONCILE: usize = 2 * crate::writer::CONCURRENT_NODE_WRITES;

/// Every node of the fleet has a NodeNetworkConfig, so `kubectl get nnc` lists it: a node the plan
/// leaves without an assignment (queued in a first rollout, or not Ready) gets a placeholder created
/// with `netwave.dev/queued` saying what it waits for (one write; its status is never written).
/// Placeholders of nodes that left are deleted. At most
/// [`PLACEHOLDER_WRITES_PER_RECONCILE`] writes; the next reconcile makes the rest.
fn placeholders(observed: &mut Observed, holds: &Holds, plan: &Plan) -> Vec<Intent> {
    // The words depend only on whether the node is eligible: made twice, not once per queued node.
    let words = [false, true].map(|eligible| plan.report.queued_message(eligible));
    let (work, placeholders) = observed.placeholder_work(&words);
    let mut out: Vec<Intent> = (work.orphans.iter())
        .map(|name| Intent::DeleteNodeConfig { name: name.clone() })
        .collect();
    let assigned: BTreeSet<&str> = plan.assignments.iter().map(|a| a.node.as_str()).collect();
    // Last names first: a rollout assigns nodes in name order (round-robin over failure domains,
    // by name within each), so the placeholders go to the nodes whose turn comes last and meet the
    // rollout once. Made in name order they ran just ahead of it: a placeholder its node's
    // assignment followed at once (two writes where the assignment alone is one), or a create
    // racing the assignment's own create (a conflict).
    let queue = work.unqueued.iter().rev().filter(|(node, _)| {
        // A node whose config cannot be decoded is never written, placeholder or not.
        !assigned.contains(node.as_str()) && !holds.unreadable_nodes.contains(node.as_str())
    });
    let room = PLACEHOLDER_WRITES_PER_RECONCILE.saturating_sub(out.len());
    let intents: Vec<Intent> = queue
        .take(room)
        .filter_map(|(node, &eligible)| {
            let message = words[usize::from(eligible)].clone()?;
            let current = placeholders.get(node);
            Some(Intent::QueueNode {
                node: node.clone(),
                message,
                resource_version: current.and_then(|c| c.metadata.resource_version.clone()),
            })
        })
        .collect();
    out.extend(intents);
    out
}

/// The `Quarantined` condition of every node config whose stored one differs from what its record
/// (after this plan) says: set while quarantined, put back if its agent removed it, removed once an
/// admin released the node.
fn quarantine_conditions(observed: &Observed, plan: &Plan, now: Timestamp) -> Vec<Intent> {
    // The configs whose stored record asks for another condition, and those the plan gives a new
    // record: no other config can need a write.
    let names: BTreeSet<&str> = (observed.condition_fixes().iter().map(String::as_str))
        .chain(plan.records.iter().map(|r| r.node.as_str()))
        .collect();
    let mut out = Vec::new();
    for name in names {
        let Some((c, stored)) = observed.config(name) else {
            continue;
        };
        let record = plan
            .records
            .iter()
            .find(|r| r.node == name)
            .map_or(stored, |r| &r.record);
        let current = c
            .status
            .as_ref()
            .map_or(&[][..], |st| st.conditions.as_slice());
        let want = quarantine::condition(name, record, current, now);
        let have = current
            .iter()
            .find(|c| c.type_ == netwave_api::QUARANTINED_CONDITION);
        if want.as_ref() != have {
            out.push(Intent::NodeCondition {
                node: name.to_string(),
                condition: want,
            });
        }
    }
    out
}

/// The status each live input object should carry, for the ones whose stored status differs: a status
/// is written only when it changes, so a steady fleet costs no write at all.
fn input_statuses(
    s: &Snapshot,
    verdicts: &InputVerdicts,
    judge: impl Fn(&ObjectVerdict, Option<i64>, Option<&InputStatus>) -> InputStatus,
) -> Vec<Intent> {
    let mut out = Vec::new();
    for View {
        kind,
        meta,
        status: old,
    } in s.inputs.views()
    {
        let Some(name) = meta
            .name
            .as_deref()
            .filter(|_| meta.deletion_timestamp.is_none())
        else {
            continue;
        };
        let Some(verdict) = verdicts.get(kind, name) else {
            continue;
        };
        let want = judge(verdict, meta.generation, old);
        if old != Some(&want) {
            out.push(Intent::InputStatus {
                kind,
                name: name.to_string(),
                status: Box::new(want),
                based_on: meta.resource_version.clone(),
            });
        }
    }
    out
}

pub(crate) fn uid_of_input(s: &Snapshot, o: &InputRef) -> Option<String> {
    s.inputs.view(o.kind, &o.name)?.meta.uid.clone()
}

fn uid_of_revision(s: &Snapshot, name: &str) -> Option<String> {
    s.revisions
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some(name))
        .and_then(|r| r.metadata.uid.clone())
}

/// Puts back a tampered revision whose name belongs to the current inputs' hash: those inputs are what
/// it was created from. One Warning Event names what was edited.
fn restore_revisions(
    s: &Snapshot,
    tampered: &Findings,
    inputs: &RevisionInputs,
    hash: &str,
) -> Vec<Intent> {
    let intact_holds_hash = s.revisions.iter().any(|r| {
        r.spec.hash == hash
            && r.metadata
                .name
                .as_deref()
                .is_some_and(|n| !tampered.revisions.contains_key(n))
    });
    if intact_holds_hash {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (name, t) in &tampered.revisions {
        if !revision::name_matches(name, hash) {
            continue;
        }
        out.push(Intent::RestoreRevisionSpec {
            name: name.clone(),
            hash: hash.to_string(),
            inputs: Box::new(inputs.clone()),
        });
        if !tampered.unreported_revisions.contains(name) {
            continue;
        }
        out.push(ShellEvent::SpecRestored.intent(
            object_ref("NetworkConfigRevision", name, uid_of_revision(s, name)),
            format!("{t}; put back from the current inputs, which hash to its name"),
        ));
    }
    out
}

/// One Warning Event per edit of a tampered revision that cannot be put back (the inputs it was made
/// from are gone): it is never rendered or assigned again.
fn unrestorable_revision_events(s: &Snapshot, tampered: &Findings) -> Vec<Intent> {
    let mut out = Vec::new();
    for name in &tampered.unreported_revisions {
        let Some(t) = tampered.revisions.get(name) else {
            continue;
        };
        out.push(ShellEvent::SpecUnrestorable.intent(
            object_ref("NetworkConfigRevision", name, uid_of_revision(s, name)),
            format!(
                "{t}; the inputs it was made from are gone, so it is never rendered or assigned again"
            ),
        ));
    }
    out
}

/// Puts back a node config whose `spec.config` no longer hashes to its `configHash`, from the render of
/// the same assignment (revision and configHash unchanged, so this is no new assignment and spends no
/// budget); the node's agent refused the edited spec without touching the kernel. A node the plan
/// assigns anew is put right by that assignment.
fn restore_node_configs(
    s: &Snapshot,
    tampered: &Findings,
    rendered: &BTreeMap<String, Arc<Rendered>>,
    plan: &Plan,
    now: Timestamp,
) -> Vec<Intent> {
    let mut out = Vec::new();
    for name in &tampered.node_configs {
        let Some(c) = s.node_config(name) else {
            continue;
        };
        let name = name.as_str();
        let reassigned = plan.assignments.iter().any(|a| a.node == name);
        let same = rendered
            .get(&c.spec.revision)
            .and_then(|r| r.nodes.get(name))
            .filter(|rn| rn.config_hash == c.spec.config_hash);
        let note = match (reassigned, same) {
            (false, Some(rn)) => {
                let assigned_at = c
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(netwave_api::ASSIGNED_AT_ANNOTATION))
                    .cloned()
                    .unwrap_or_else(|| now.to_rfc3339());
                let spec = NodeNetworkConfigSpec {
                    config: rn.config(),
                    ..c.spec.clone()
                };
                out.push(Intent::ApplyNodeConfig {
                    node: name.to_string(),
                    pending: pending_mark(Some(c.as_ref()), &spec),
                    spec: Box::new(spec),
                    assigned_at: Some(assigned_at),
                    clear_queued: may_be_queued(Some(c.as_ref())),
                    based_on: c.metadata.resource_version.clone(),
                });
                "put back from its revision"
            }
            (true, _) => "replaced by a new assignment",
            (false, None) => {
                "its revision is no longer rendered: the node's agent refuses it until the rollout \
                 gives the node another config"
            }
        };
        if tampered.unreported_node_configs.contains(name) {
            out.push(ShellEvent::SpecRestored.intent(
                object_ref("NodeNetworkConfig", name, c.metadata.uid.clone()),
                format!(
                    "spec.config does not hash to spec.configHash {}: edited by hand; {note}",
                    c.spec.config_hash
                ),
            ));
        }
    }
    out
}

/// The live node configs quarantined once `plan` is written: those on record, with the records the
/// plan writes instead of theirs.
fn quarantined_after(observed: &Observed, plan: &Plan) -> usize {
    let mut n = observed.quarantined();
    for r in &plan.records {
        if let Some((_, stored)) = observed.config(&r.node) {
            n = n - usize::from(stored.is_quarantined()) + usize::from(r.record.is_quarantined());
        }
    }
    n
}

#[cfg(test)]
mod tests {
    /// `compute` on built snapshots (no API server): the cut stage's outcomes.
    mod compute_table {
        use std::sync::Arc;
        use std::time::Duration;

        use kube::api::ObjectMeta;
        use netwave_api::vocab::RevisionPhase;
        use netwave_api::{NetworkConfigRevision, RoutingTable};
        use netwave_core::Timestamp;
        use netwave_core::revision::{self, InputSettle};

        use crate::decide::{Settings, compute};
        use crate::memory::Memory;
        use crate::snapshot::{Snapshot, fold_inputs};
        use crate::writer::Intent;

        const NOW: Timestamp = Timestamp(1_700_000_000_000);

        fn settings(settle: Duration) -> Settings {
            Settings {
                defaults: Default::default(),
                fleet: Default::default(),
                resync: Duration::from_secs(60),
                input_settle: settle,
                coalesce: Duration::from_millis(15),
                reaction_target: Duration::from_millis(15),
                naming: Default::default(),
            }
        }

        fn table(name: &str, id: u32) -> Arc<RoutingTable> {
            let mut t: RoutingTable = serde_json::from_value(serde_json::json!({
                "apiVersion": "netwave.dev/v1alpha1", "kind": "RoutingTable",
                "metadata": {"name": name, "generation": 1},
                "spec": {"tableId": id},
            }))
            .expect("a RoutingTable");
            t.metadata.uid = Some(format!("uid-{name}"));
            Arc::new(t)
        }

        /// A live revision of the inputs `s` folds into now, as sequence `sequence` in `phase`.
        fn revision_of(
            s: &Snapshot,
            name: &str,
            sequence: u64,
            phase: &str,
        ) -> Arc<NetworkConfigRevision> {
            let hash = revision::inputs_hash(&fold_inputs(s));
            let mut r: NetworkConfigRevision = serde_json::from_value(serde_json::json!({
                "apiVersion": "netwave.dev/v1alpha1", "kind": "NetworkConfigRevision",
                "metadata": {"name": name, "uid": format!("uid-{name}")},
                "spec": {"hash": hash, "sequence": sequence},
                "status": {"phase": phase},
            }))
            .expect("a NetworkConfigRevision");
            r.metadata = ObjectMeta {
                name: Some(name.into()),
                uid: Some(format!("uid-{name}")),
                ..r.metadata
            };
            Arc::new(r)
        }

        fn run(s: &Snapshot, settle: Duration) -> crate::decide::Outcome {
            compute(
                s,
                &settings(settle),
                &mut Memory::default(),
                &mut InputSettle::default(),
                NOW,
            )
        }

        #[test]
        fn folded_inputs_are_kept_only_while_the_stores_hold_the_same_objects() {
            let mut folded = crate::memory::FoldedInputs::default();
            let mut s = Snapshot {
                inputs: netwave_api::ByKind {
                    routing_tables: vec![table("rt-a", 100), table("rt-b", 200)],
                    ..Default::default()
                },
                ..Default::default()
            };
            let (first, hash) = folded.of(&s);
            assert_eq!(hash, revision::inputs_hash(&fold_inputs(&s)));
            let (again, _) = folded.of(&s);
            assert!(Arc::ptr_eq(&first, &again), "the same objects: kept");

            // An edit is a new object of the same name, as the watch delivers it.
            s.inputs.routing_tables[1] = table("rt-b", 201);
            let (edited, hash) = folded.of(&s);
            assert_eq!(*edited, fold_inputs(&s));
            assert_eq!(hash, revision::inputs_hash(&fold_inputs(&s)));
            // The store handing the same objects out in another order: the same answer.
            s.inputs.routing_tables.reverse();
            assert_eq!(folded.of(&s).1, hash);
            // One gone.
            s.inputs.routing_tables.pop();
            assert_eq!(folded.of(&s).1, revision::inputs_hash(&fold_inputs(&s)));
            assert_ne!(folded.of(&s).1, hash);
        }

        #[test]
        fn new_inputs_cut_a_revision_once_settled() {
            let s = Snapshot {
                inputs: netwave_api::ByKind {
                    routing_tables: vec![table("rt-a", 100)],
                    ..Default::default()
                },
                ..Default::default()
            };
            let hash = revision::inputs_hash(&fold_inputs(&s));
            let out = run(&s, Duration::ZERO);
            let [
                Intent::CreateRevision {
                    name, spec, hold, ..
                },
            ] = out.intents.as_slice()
            else {
                panic!("one CreateRevision, got {:?}", out.intents);
            };
            assert_eq!(name, &revision::revision_name(&hash));
            assert_eq!(
                (spec.sequence, spec.paused, hold.is_none()),
                (1, false, true)
            );
            assert!(
                out.plan.is_none(),
                "nothing else is decided until the watch shows it"
            );

            // Still changing: nothing is cut, the target rolls on, and the reconcile comes back then.
            let out = run(&s, Duration::from_secs(10));
            assert!(
                !out.intents
                    .iter()
                    .any(|i| matches!(i, Intent::CreateRevision { .. }))
            );
            assert!(out.inputs_pending);
            assert_eq!(out.requeue_at, Some(Timestamp(NOW.0 + 10_000)));
        }

        #[test]
        fn inputs_equal_to_an_older_good_revision_reactivate_it() {
            let mut s = Snapshot {
                inputs: netwave_api::ByKind {
                    routing_tables: vec![table("rt-a", 100)],
                    ..Default::default()
                },
                ..Default::default()
            };
            let old = revision_of(&s, "rev-old", 1, RevisionPhase::Complete.as_str());
            s.inputs.routing_tables = vec![table("rt-b", 200)];
            let new = revision_of(&s, "rev-new", 2, RevisionPhase::Complete.as_str());
            s.inputs.routing_tables = vec![table("rt-a", 100)];
            s.revisions = vec![old, new];
            let out = run(&s, Duration::ZERO);
            let [
                Intent::ReactivateRevision { name, status },
                Intent::Event {
                    regarding,
                    reason,
                    note,
                    ..
                },
            ] = out.intents.as_slice()
            else {
                panic!("a reactivation and its Event, got {:?}", out.intents);
            };
            assert_eq!((name.as_str(), status.active_sequence), ("rev-old", 3));
            assert_eq!(status.phase, "Pending", "a fresh rollout");
            assert_eq!(reason, "RevisionReactivated");
            assert_eq!(regarding.uid.as_deref(), Some("uid-rev-old"));
            assert!(
                note.contains("(created as sequence 1) again") && note.contains("as sequence 3"),
                "{note}"
            );
        }

        #[test]
        fn inputs_equal_to_a_failed_revision_cut_nothing() {
            let mut s = Snapshot {
                inputs: netwave_api::ByKind {
                    routing_tables: vec![table("rt-a", 100)],
                    ..Default::default()
                },
                ..Default::default()
            };
            s.revisions = vec![revision_of(
                &s,
                "rev-bad",
                1,
                RevisionPhase::Failed.as_str(),
            )];
            let out = run(&s, Duration::ZERO);
            assert_eq!(out.equals_failed.as_deref(), Some("rev-bad"));
            assert!(out.plan.is_some(), "the step rolls the current target on");
            assert!(!out.intents.iter().any(|i| matches!(
                i,
                Intent::CreateRevision { .. } | Intent::ReactivateRevision { .. }
            )));
        }

        #[test]
        fn inputs_too_large_for_one_object_are_never_cut() {
            let s = Snapshot {
                inputs: netwave_api::ByKind {
                    routing_tables: vec![table("rt-a", 100), table("rt-b", 200)],
                    ..Default::default()
                },
                ..Default::default()
            };
            let mut settings = settings(Duration::ZERO);
            settings.fleet.max_object_bytes = 64;
            let out = compute(
                &s,
                &settings,
                &mut Memory::default(),
                &mut InputSettle::default(),
                NOW,
            );
            assert!(out.too_large.is_some());
            assert!(
                !out.intents
                    .iter()
                    .any(|i| matches!(i, Intent::CreateRevision { .. }))
            );
            // Every input says why, and names no revision.
            let refused = out
                .intents
                .iter()
                .filter(|i| matches!(i, Intent::InputStatus { .. }))
                .count();
            assert_eq!(refused, 2);
        }
    }

    /// A first rollout gives every node a config (its assignment or a placeholder), the placeholders
    /// at most [`PLACEHOLDER_WRITES_PER_RECONCILE`] at a time behind the rollout's own writes: a
    /// report that comes in during a reconcile waits for that reconcile's writes.
    #[test]
    fn placeholders_come_in_batches_behind_the_rollouts_writes() {
        use crate::testing::inmem;
        use netwave_core::revision::InputSettle;

        use super::{PLACEHOLDER_WRITES_PER_RECONCILE, compute};
        use crate::memory::Memory;
        use crate::writer::Intent;

        const NODES: usize = 600;
        let mut s = inmem::samples_snapshot((0..NODES).map(|i| format!("node-{i:04}")));
        let settings = inmem::settings();
        let (mut cache, mut settle) = (Memory::default(), InputSettle::default());
        let mut now = netwave_core::Timestamp(1_800_000_000_000);
        let (mut batches, mut first_batch) = (Vec::new(), Vec::<String>::new());
        while s.node_configs.len() < NODES && batches.len() < 100 {
            let out = compute(&s, &settings, &mut cache, &mut settle, now);
            let queued = (out.intents.iter())
                .filter(|i| matches!(i, Intent::QueueNode { .. }))
                .count();
            let first = (out.intents.iter())
                .position(|i| matches!(i, Intent::QueueNode { .. }))
                .unwrap_or(out.intents.len());
            assert!(
                !out.intents[first..]
                    .iter()
                    .any(|i| matches!(i, Intent::ApplyNodeConfig { .. })),
                "placeholders go after the plan's assignments"
            );
            if first_batch.is_empty() {
                first_batch = (out.intents.iter())
                    .filter_map(|i| match i {
                        Intent::QueueNode { node, .. } => Some(node.clone()),
                        _ => None,
                    })
                    .collect();
            }
            batches.push(queued);
            inmem::apply(&mut s, out.intents, now);
            now = netwave_core::Timestamp(now.0 + 10);
        }
        assert_eq!(s.node_configs.len(), NODES, "every node has a config");
        assert!(
            batches
                .iter()
                .all(|&n| n <= PLACEHOLDER_WRITES_PER_RECONCILE),
            "placeholder writes per reconcile: {batches:?}"
        );
        assert!(
            batches.contains(&PLACEHOLDER_WRITES_PER_RECONCILE),
            "full batches while there is more to do: {batches:?}"
        );
        assert!(
            first_batch.iter().all(|n| n.as_str() >= "node-0500"),
            "the first placeholders are for the nodes whose turn comes last: {first_batch:?}"
        );
    }

    /// The `Pending` mark is the plan's: a re-render under the revision the agent reported on, and an
    /// assignment over an old `Queued` status, carry it; a first assignment and a status that already
    /// reports this config carry none.
    #[test]
    fn an_assignment_carries_the_pending_mark_its_status_needs() {
        use netwave_api::{NodeNetworkConfig, NodeNetworkConfigSpec, NodeNetworkConfigStatus};

        use super::pending_mark;

        let spec = NodeNetworkConfigSpec {
            revision: "rev-2".into(),
            sequence: 2,
            config_hash: "h2".into(),
            ..NodeNetworkConfigSpec::placeholder()
        };
        let with = |phase: &str, revision: &str, hash: &str| {
            let mut c = NodeNetworkConfig::new("node-1", NodeNetworkConfigSpec::placeholder());
            c.status = Some(NodeNetworkConfigStatus {
                phase: Some(phase.into()),
                observed_revision: Some(revision.into()),
                config_hash: Some(hash.into()),
                ..Default::default()
            });
            c
        };
        let rerendered = pending_mark(Some(&with("Provisioned", "rev-2", "h1")), &spec);
        assert_eq!(
            rerendered.as_deref(),
            Some(
                "config re-rendered under revision rev-2 (configHash h2); waiting for the agent to \
                 report on it (it runs configHash h1)"
            )
        );
        let queued = pending_mark(Some(&with("Queued", "", "")), &spec);
        assert!(
            queued.is_some_and(|m| m.starts_with("assigned revision rev-2 (configHash h2)")),
            "an old Queued status is marked"
        );
        for (current, why) in [
            (None, "a first assignment"),
            (
                Some(NodeNetworkConfig::new("node-1", spec.clone())),
                "a status nobody wrote",
            ),
            (
                Some(with("Provisioned", "rev-2", "h2")),
                "already reports it",
            ),
            (Some(with("Provisioned", "rev-1", "h1")), "another revision"),
        ] {
            assert_eq!(pending_mark(current.as_ref(), &spec), None, "{why}");
        }
    }
}
