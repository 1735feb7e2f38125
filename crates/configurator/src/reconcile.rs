//! One reconcile: snapshot the stores, let the core decide, turn its plan into write intents.
//!
//! Everything here except [`Reconciler::run`] is synchronous and deterministic given the snapshot and
//! `now`; the only state kept between reconciles is a cache of rendered configs and fleet validations,
//! keyed by what they are computed from, so a new leader with an empty cache decides exactly the same.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::EventType as KubeEventType;
use netwave_api::kinds::{ByKind, Input, Objects, View, Visit, each_kind};
use netwave_api::vocab::RevisionPhase;
use netwave_api::{
    InputStatus, Named, NetworkConfigRevision, NetworkConfigRevisionSpec, NodeNetworkConfigSpec,
    RevisionInputs, RolloutPolicy, ValidationResult,
};
use netwave_core::fleet::{self, FleetParams};
use netwave_core::limits::{self, InputsTooLarge};
use netwave_core::render::{InputRef, RenderedNode};
use netwave_core::revision::{self, ExistingRevision, InputSettle};
use netwave_core::rollout::cut::{self, Cut, Rolling};
use netwave_core::rollout::hold::{self, Footprint};
use netwave_core::rollout::quarantine;
use netwave_core::rollout::{
    self, AssignReason, EventType, InputVerdicts, NodeConfigState, ObjectRef, ObjectVerdict, Plan,
    PolicyDefaults, RenderedHashes, RevisionState, RolloutInput, StepMemo,
};
use netwave_core::undecodable::{self, Holds, Kind};
use netwave_core::{Sequence, Sym, Timestamp};
use tracing::{Instrument, debug, info, info_span, warn};

use crate::assign_log::AssignLog;
use crate::clock::now;
use crate::integrity::{Findings, IntegrityCache};
use crate::liveness::Liveness;
use crate::metrics::{Metrics, NodeStateLabels, PhaseLabels, ReasonLabels};
use crate::observed::{ConfigChanges, Nodes, Observed};
use crate::pace::Pace;
use crate::recheck;
pub use crate::snapshot::Snapshot;
use crate::snapshot::live;
use crate::watch::{Stores, Wakeups};
use crate::writer::{Intent, Writer};

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
}

/// The admin inputs folded into one snapshot, canonically sorted.
pub fn fold_inputs(s: &Snapshot) -> RevisionInputs {
    struct Fold<'a>(&'a Snapshot, RevisionInputs);
    impl Visit for Fold<'_> {
        fn visit<K: Input>(&mut self) {
            let live = self.0.inputs.get::<K>().iter().filter(|o| live(o.as_ref()));
            *K::named_mut(&mut self.1) = live
                .map(|o| Named::new(o.meta().name.clone().unwrap_or_default(), o.spec().clone()))
                .collect();
        }
    }
    let mut fold = Fold(s, RevisionInputs::default());
    each_kind(&mut fold);
    revision::canonical_inputs(&fold.1)
}

/// Renders and fleet-validates revisions, remembering results per (inputs hash, node labels), and
/// remembers which specs verified (see [`IntegrityCache`]).
#[derive(Default)]
pub struct RenderCache {
    rendered: BTreeMap<(String, u64), Arc<Rendered>>,
    /// Per-object verdicts of the current inputs (the input objects' status).
    verdicts: BTreeMap<(String, u64), Arc<InputVerdicts>>,
    integrity: IntegrityCache,
    /// The nodes' and node configs' states, converted once per change of the object.
    observed: Observed,
    /// What the last step worked out about the fleet (`rollout::StepMemo`): the nodes and configs
    /// sorted and joined, the failure domains, the rendered hashes per node. Checked against each
    /// input before it is used.
    memo: StepMemo,
    /// The inputs folded and hashed, while the stores hold the same input objects.
    folded: FoldedInputs,
}

/// [`fold_inputs`] and [`revision::inputs_hash`] of the last snapshot, kept while the stores hold the
/// very same input objects: folding clones every spec and hashing serializes them all, which was 4 %
/// of the leader's CPU at 5,000 nodes when done on every reconcile (#28).
#[derive(Default)]
struct FoldedInputs {
    /// The objects they were folded from, held so that their addresses name them.
    from: Option<ByKind<Objects>>,
    inputs: Arc<RevisionInputs>,
    hash: String,
}

impl FoldedInputs {
    /// The folded inputs of `s` and their hash: the kept ones if `s` holds the same objects in the
    /// same order (a store that hands them out in another order costs a fold, never a wrong answer).
    fn of(&mut self, s: &Snapshot) -> (Arc<RevisionInputs>, String) {
        let kept = (self.from.as_ref()).is_some_and(|f| f.same_objects(&s.inputs));
        if !kept {
            let inputs = fold_inputs(s);
            self.hash = revision::inputs_hash(&inputs);
            self.inputs = Arc::new(inputs);
            self.from = Some(s.inputs.clone());
        }
        (self.inputs.clone(), self.hash.clone())
    }
}

pub struct Rendered {
    pub nodes: BTreeMap<String, RenderedNode>,
    /// What it puts on each node, for the destructive-change hold (`rollout::hold`).
    pub footprint: Arc<Footprint>,
    /// Every node's configHash, shared with each step input (built once per render, not per reconcile:
    /// at 5,000 nodes the copy was 15% of a reconcile's compute).
    pub hashes: Arc<BTreeMap<Sym, Sym>>,
    pub validation: ValidationResult,
}

impl RenderCache {
    fn get(
        &mut self,
        hash: &str,
        inputs: &RevisionInputs,
        nodes: &Nodes,
        params: &FleetParams,
    ) -> Arc<Rendered> {
        let key = (hash.to_string(), nodes.fingerprint);
        if let Some(r) = self.rendered.get(&key) {
            return r.clone();
        }
        let nodes = &nodes.infos();
        // A render that fails comes with validation errors, so the revision goes Failed and nothing
        // is ever assigned from an empty render.
        let checked = fleet::render_and_validate(inputs, nodes, params);
        // Interned with the node configs' names and hashes, so the step compares them by pointer.
        let strings = self.observed.strings();
        let hashes = checked
            .nodes
            .iter()
            .map(|(n, rn)| (strings.intern(n), strings.intern(&rn.config_hash)))
            .collect::<BTreeMap<_, _>>();
        let r = Arc::new(Rendered {
            footprint: Arc::new(Footprint::of(inputs, nodes)),
            hashes: Arc::new(hashes),
            nodes: checked.nodes,
            validation: checked.validation.to_status(),
        });
        self.rendered.insert(key, r.clone());
        r
    }

    /// The per-object verdicts of `inputs` (hashing to `hash`) on these nodes.
    fn verdicts(
        &mut self,
        hash: &str,
        inputs: &RevisionInputs,
        nodes: &Nodes,
        params: &FleetParams,
    ) -> Arc<InputVerdicts> {
        self.verdicts
            .entry((hash.to_string(), nodes.fingerprint))
            .or_insert_with(|| Arc::new(rollout::input_verdicts(inputs, &nodes.infos(), params)))
            .clone()
    }

    /// Drops entries not used by the latest reconcile, so memory stays bounded by the history limit.
    fn retain(&mut self, used: &BTreeSet<(String, u64)>) {
        self.rendered.retain(|k, _| used.contains(k));
        self.verdicts.retain(|k, _| used.contains(k));
    }
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

fn object_ref(kind: &str, name: &str, uid: Option<String>) -> ObjectReference {
    ObjectReference {
        api_version: Some("netwave.dev/v1alpha1".into()),
        kind: Some(kind.into()),
        name: Some(name.into()),
        uid,
        ..Default::default()
    }
}

impl Outcome {
    /// Nothing decided: `intents` (if any) are written and the next reconcile goes on from there.
    fn only(intents: Vec<Intent>, tampered: Findings) -> Self {
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
    cache: &mut RenderCache,
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
    let decision = revision::decide(&hash, &existing, sequence_floor(s));
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
    let mut renders = render_for_step(s, settings, cache, &fleet, &tampered, &mut input);
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

impl RenderCache {
    /// [`RenderCache::get`] on the current fleet.
    fn on(
        &mut self,
        fleet: &Nodes,
        settings: &Settings,
        hash: &str,
        inputs: &RevisionInputs,
    ) -> Arc<Rendered> {
        self.get(hash, inputs, fleet, &settings.fleet)
    }
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
    cache: &mut RenderCache,
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
        let rendered = cache.on(fleet, settings, &lg.hash, s.inputs_of(&lg.name)?);
        Some((lg.name.as_str(), rendered))
    });
    let candidate = cache.on(fleet, settings, &new.hash, &new.inputs);
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
    intents.extend(event.map(|e| event_intent(s, &e, "Revision")));
    intents
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
            sequence: new_sequence,
            at: now.truncate_to_secs().to_rfc3339(),
        },
        event_intent(
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
        rendered: RenderedHashes::default(),
        footprints: Default::default(),
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
    cache: &mut RenderCache,
    fleet: &Nodes,
    tampered: &Findings,
    input: &mut RolloutInput,
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
        let r = cache.on(fleet, settings, &rev.spec.hash, rev_inputs);
        if let Some(state) = state {
            state.validation = r.validation.clone();
        }
        out.used.insert((rev.spec.hash.clone(), fleet.fingerprint));
        input.rendered.set_revision(name.clone(), r.hashes.clone());
        input.footprints.insert(name.clone(), r.footprint.clone());
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
    cache: &mut RenderCache,
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
    let verdicts = verdicts();
    input_statuses(s, &verdicts, |verdict, generation, old| {
        rollout::input_status(verdict, name, &errors, generation, old, now)
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
        intents.push(Intent::ApplyNodeConfig {
            node: a.node.to_string(),
            spec: Box::new(spec),
            // Stamped when sent (the deadlines count from the write, not from this plan).
            assigned_at: None,
            clear_queued: may_be_queued(observed.config(&a.node).map(|(c, _)| c.as_ref())),
            based_on: observed
                .config(&a.node)
                .and_then(|(c, _)| c.metadata.resource_version.clone()),
        });
    }
    intents.extend(restore_node_configs(s, tampered, rendered, plan, now));
    for name in &plan.delete_configs {
        intents.push(Intent::DeleteNodeConfig { name: name.clone() });
    }
    for name in &plan.delete_revisions {
        intents.push(Intent::DeleteRevision { name: name.clone() });
    }
    intents.extend(plan.events.iter().map(|e| event_intent(s, e, "Rollout")));
    intents
}

/// A core Event as an Event write about the live object it names.
fn event_intent(s: &Snapshot, e: &rollout::Event, action: &str) -> Intent {
    let regarding = match &e.object {
        ObjectRef::Revision(n) => {
            let uid = live_revisions(s)
                .find(|r| r.metadata.name.as_deref() == Some(n))
                .and_then(|r| r.metadata.uid.clone());
            object_ref("NetworkConfigRevision", n, uid)
        }
        ObjectRef::NodeConfig(n) => {
            let uid = s.node_config(n).and_then(|c| c.metadata.uid.clone());
            object_ref("NodeNetworkConfig", n, uid)
        }
    };
    Intent::Event {
        regarding,
        type_: match e.type_ {
            EventType::Normal => KubeEventType::Normal,
            EventType::Warning => KubeEventType::Warning,
        },
        reason: e.reason.as_str().to_string(),
        action: action.into(),
        note: e.message.clone(),
    }
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

fn uid_of_input(s: &Snapshot, o: &InputRef) -> Option<String> {
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
        out.push(Intent::Event {
            regarding: object_ref("NetworkConfigRevision", name, uid_of_revision(s, name)),
            type_: KubeEventType::Warning,
            reason: TAMPERED_EVENT_REASON.into(),
            action: "Restore".into(),
            note: format!("{t}; put back from the current inputs, which hash to its name"),
        });
    }
    out
}

/// Event reason for a spec edited by hand (revision or node config).
pub const TAMPERED_EVENT_REASON: &str = "SpecTampered";

/// One Warning Event per edit of a tampered revision that cannot be put back (the inputs it was made
/// from are gone): it is never rendered or assigned again.
fn unrestorable_revision_events(s: &Snapshot, tampered: &Findings) -> Vec<Intent> {
    let mut out = Vec::new();
    for name in &tampered.unreported_revisions {
        let Some(t) = tampered.revisions.get(name) else {
            continue;
        };
        out.push(Intent::Event {
            regarding: object_ref("NetworkConfigRevision", name, uid_of_revision(s, name)),
            type_: KubeEventType::Warning,
            reason: TAMPERED_EVENT_REASON.into(),
            action: "Verify".into(),
            note: format!(
                "{t}; the inputs it was made from are gone, so it is never rendered or assigned again"
            ),
        });
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
                out.push(Intent::ApplyNodeConfig {
                    node: name.to_string(),
                    spec: Box::new(NodeNetworkConfigSpec {
                        config: rn.config(),
                        ..c.spec.clone()
                    }),
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
            out.push(Intent::Event {
                regarding: object_ref("NodeNetworkConfig", name, c.metadata.uid.clone()),
                type_: KubeEventType::Warning,
                reason: TAMPERED_EVENT_REASON.into(),
                action: "Restore".into(),
                note: format!(
                    "spec.config does not hash to spec.configHash {}: edited by hand; {note}",
                    c.spec.config_hash
                ),
            });
        }
    }
    out
}

/// What to tell an admin whose inputs equal a failed revision. A retry can only help a revision that
/// failed on nodes; one that failed fleet validation fails the same way again, so the advice is to fix
/// the inputs, with the first errors.
fn equals_failed_note(name: &str, failed: Option<&NetworkConfigRevision>) -> String {
    let errors = failed
        .and_then(|r| r.status.as_ref())
        .map(|st| st.validation.errors.as_slice())
        .unwrap_or_default();
    if errors.is_empty() {
        format!(
            "the current inputs equal {name}, which failed on nodes: no new revision is created; \
             change the inputs, or bump {name}'s spec.retry to roll it out again"
        )
    } else {
        let first: Vec<&str> = errors.iter().take(3).map(String::as_str).collect();
        format!(
            "the current inputs equal {name}, which failed fleet validation: no new revision is \
             created and a retry would fail the same way; fix the inputs (kubectl get vrf,l2,rt shows \
             which are not accepted): {}{}",
            first.join("; "),
            if errors.len() > 3 {
                format!(" and {} more", errors.len() - 3)
            } else {
                String::new()
            }
        )
    }
}

/// Updates gauges and counters from a plan.
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

/// Records a reconcile's plan in the metrics; `quarantined` is [`Outcome::quarantined`].
pub fn record(metrics: &Metrics, s: &Snapshot, plan: &Plan, quarantined: usize) {
    for a in &plan.assignments {
        metrics
            .assignments
            .get_or_create(&ReasonLabels {
                reason: a.reason.as_str(),
            })
            .inc();
        if a.reason == AssignReason::Rollback {
            metrics.rollbacks.inc();
        }
    }
    metrics.quarantined_nodes.set(quarantined as i64);
    for e in &plan.events {
        if e.reason == rollout::EventReason::NodeFailed {
            metrics.node_failures.inc();
        } else if e.reason == rollout::EventReason::RevisionFailed {
            metrics.revisions_failed.inc();
        }
    }
    // A revision completing now: how long its rollout took.
    for u in &plan.status_updates {
        let before = s
            .revisions
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(u.revision.as_str()));
        let was_complete = before
            .and_then(|r| r.status.as_ref())
            .and_then(|st| st.phase.as_deref())
            == Some(RevisionPhase::Complete.as_str());
        if u.status.phase.as_deref() == Some(RevisionPhase::Complete.as_str())
            && !was_complete
            && let (Some(start), Some(end)) = (&u.status.started_at, &u.status.completed_at)
        {
            let secs = end.0.duration_since(start.0).as_secs_f64();
            metrics.rollout_duration.observe(secs.max(0.0));
        }
    }
    // Gauges reflect the statuses as they will be after this plan.
    let mut phases: BTreeMap<&'static str, i64> = RevisionPhase::ALL
        .into_iter()
        .map(|p| (p.as_str(), 0))
        .collect();
    for r in &s.revisions {
        let updated = plan
            .status_updates
            .iter()
            .find(|u| Some(&u.revision) == r.metadata.name.as_ref());
        let phase = updated
            .map(|u| &*u.status)
            .or(r.status.as_ref())
            .and_then(|st| st.phase.as_deref());
        // Unknown phases (from a newer netwave) are not counted rather than becoming a new label value.
        if let Some(known) = RevisionPhase::parse(phase) {
            *phases.entry(known.as_str()).or_default() += 1;
        }
    }
    for (phase, n) in phases {
        metrics
            .revisions
            .get_or_create(&PhaseLabels { phase })
            .set(n);
    }
    let target = plan.report.target.as_deref();
    // Borrowed, not copied: a status lists every failed node, and this runs at every reconcile.
    let none = netwave_api::NetworkConfigRevisionStatus::default();
    let st = target
        .and_then(|t| {
            (plan.status_updates.iter())
                .find(|u| u.revision == t)
                .map(|u| &*u.status)
                .or_else(|| {
                    (s.revisions.iter())
                        .find(|r| r.metadata.name.as_deref() == Some(t))
                        .and_then(|r| r.status.as_ref())
                })
        })
        .unwrap_or(&none);
    for (state, n) in [
        ("updated", st.updated),
        ("in_progress", st.in_progress),
        ("queued", st.queued),
        ("failed", st.failed),
        ("skipped", st.skipped),
    ] {
        metrics
            .nodes
            .get_or_create(&NodeStateLabels { state })
            .set(i64::from(n));
    }
}

/// Observes, once per (node, revision), how long the node took from assignment to `Provisioned`, and once
/// per wave — the nodes assigned one revision at the same moment — how long until all of them were. The
/// first reconcile of a process only remembers what is already done, so a new leader does not report the
/// history it inherited. After that it reads only the node configs that changed (#28).
#[derive(Default)]
pub struct ApplyTimes {
    started: bool,
    /// Node → the revision it was last seen updated to.
    seen: HashMap<String, String>,
    /// Node → the wave it counts in, and whether it is updated.
    member: HashMap<String, (Wave, bool)>,
    /// Wave → (nodes, updated nodes).
    waves: HashMap<Wave, (usize, usize)>,
    waves_done: HashSet<Wave>,
}

/// A wave: a revision and the moment its nodes were assigned it.
type Wave = (String, i64);

impl ApplyTimes {
    /// From a reconcile's node configs: all of them the first time (`Outcome::configs`), then only
    /// those that changed since the last reconcile (`Outcome::changes`).
    pub fn observe(
        &mut self,
        configs: &[Arc<NodeConfigState>],
        changes: &ConfigChanges,
        now: Timestamp,
        metrics: &Metrics,
    ) {
        let first = !self.started;
        self.started = true;
        let elapsed = |at: Timestamp| now.0.saturating_sub(at.0).max(0) as f64 / 1000.0;
        let (changed, removed): (&[Arc<NodeConfigState>], &[String]) = if first {
            (configs, &[])
        } else {
            (&changes.changed, &changes.removed)
        };
        let mut touched: BTreeSet<Wave> = BTreeSet::new();
        // A config that went is no longer counted in its wave; what it was last seen updated to is
        // kept, so one that comes back as it was is not observed twice.
        for name in removed {
            self.leave(name, &mut touched);
        }
        for state in changed {
            let revision = state.spec.revision.as_str();
            let updated = rollout::is_updated(state, &state.spec.revision);
            self.leave(&state.name, &mut touched);
            if let Some(at) = state.spec.assigned_at {
                let wave = (revision.to_string(), at.0);
                let w = self.waves.entry(wave.clone()).or_default();
                w.0 += 1;
                w.1 += usize::from(updated);
                touched.insert(wave.clone());
                self.member.insert(state.name.to_string(), (wave, updated));
            }
            if !updated {
                self.seen.remove(state.name.as_str());
                continue;
            }
            if self.seen.get(state.name.as_str()).map(String::as_str) == Some(revision) {
                continue;
            }
            if !first && let Some(at) = state.spec.assigned_at {
                metrics.node_apply_duration.observe(elapsed(at));
            }
            self.seen
                .insert(state.name.to_string(), revision.to_string());
        }
        for wave in touched {
            let (nodes, updated) = self.waves.get(&wave).copied().unwrap_or_default();
            if nodes == 0 {
                self.waves.remove(&wave);
            }
            if nodes > 0 && nodes == updated {
                let at = wave.1;
                if self.waves_done.insert(wave) && !first {
                    metrics.wave_duration.observe(elapsed(Timestamp(at)));
                }
            } else {
                self.waves_done.remove(&wave);
            }
        }
    }

    /// `node` no longer counts in the wave it was in.
    fn leave(&mut self, node: &str, touched: &mut BTreeSet<Wave>) {
        if let Some((wave, updated)) = self.member.remove(node) {
            if let Some(w) = self.waves.get_mut(&wave) {
                w.0 -= 1;
                w.1 -= usize::from(updated);
            }
            touched.insert(wave);
        }
    }
}

/// When each revision status write of a plan goes out (`intents` in plan order; `stored`: a
/// revision's status on record; `written`: when each status was last written, kept up to date). A
/// write that only moves counters, and the words and progress stamp that follow them
/// ([`rollout::counters_only`]):
/// - within [`COUNTERS_STATUS_INTERVAL`] of the last write of that status, is held back (the time to
///   write it is returned);
/// - else goes after the node writes: no decision reads it, so the reconcile's assignments need not
///   wait for its round trip (at 15,000 nodes it lists about a hundred failed nodes, 14 KB; #28).
///
/// Any other status write stays where the plan put it, before the assignments that need it on record
/// (a failure before its rollback, `Validated` before the first assignment).
fn schedule_statuses<'s>(
    intents: &mut Vec<Intent>,
    stored: impl Fn(&str) -> Option<&'s netwave_api::NetworkConfigRevisionStatus>,
    written: &mut BTreeMap<String, tokio::time::Instant>,
    now: tokio::time::Instant,
) -> Option<tokio::time::Instant> {
    let mut due = None;
    let mut late = Vec::new();
    let planned = std::mem::take(intents);
    for intent in planned {
        let Intent::RevisionStatus { name, status } = &intent else {
            intents.push(intent);
            continue;
        };
        if !stored(name).is_some_and(|s| rollout::counters_only(s, status)) {
            written.insert(name.clone(), now);
            intents.push(intent);
            continue;
        }
        match written.get(name) {
            Some(&last) if now < last + COUNTERS_STATUS_INTERVAL => {
                let at = last + COUNTERS_STATUS_INTERVAL;
                due = Some(due.map_or(at, |d: tokio::time::Instant| d.min(at)));
            }
            _ => {
                written.insert(name.clone(), now);
                late.push(intent);
            }
        }
    }
    intents.extend(late);
    due
}

/// The reconcile loop: waits for a change or a requeue time, computes, writes when leader.
pub struct Reconciler {
    pub stores: Stores,
    pub writer: Writer,
    pub metrics: Arc<Metrics>,
    pub settings: Settings,
    pub changed: Arc<Wakeups>,
    cache: RenderCache,
    settle: InputSettle,
    apply_times: ApplyTimes,
    /// The Failed revision the inputs were last reported to equal (one Event per occurrence).
    reported_equals_failed: Option<String>,
    /// When each revision's status was last written (see [`COUNTERS_STATUS_INTERVAL`]).
    status_written: BTreeMap<String, tokio::time::Instant>,
    /// Told when a pass starts and ends (a hung pass makes the replica let go of the Lease).
    liveness: Option<Liveness>,
    /// Objects seen not decoding: the error logged for each, and whether this replica wrote its Event.
    undecodable_seen: BTreeMap<(Kind, String), (String, bool)>,
    /// Inputs (by hash) too large to become a revision: last logged, and last told in an Event.
    too_large_logged: Option<String>,
    too_large_evented: Option<String>,
    /// The last reconcile's snapshot, refreshed by the next one ([`Snapshot::refresh`]).
    snapshot: Option<Snapshot>,
    /// Assignments not logged yet (a line per revision and reason at most every ten seconds).
    assign_log: AssignLog,
    /// How long a leader gathers changes before it reconciles, from what its reconciles cost.
    pace: Pace,
}

/// A revision status write that only moves counters (and the words and progress stamp that follow
/// them) goes out at most this often per revision. Every agent report changes the counters: writing
/// them each time cost 0.4-0.6 status patches per node in a rollout (#14); now it is about one per
/// second. Anything else — a phase, a condition, a failure on record, which must be written before
/// the rollbacks that follow it — is written at once.
const COUNTERS_STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// A standby writes nothing: it reconciles at most this often after a change (and at once when it
/// becomes the leader), instead of after every agent report like the leader (which cost the standby
/// as much CPU as the leader, #14). A standby that has not listed the node configs (it does when a
/// takeover is near, `crate::watch`) skips its reconciles; one that has keeps them and plans on
/// them, without writing.
const STANDBY_INTERVAL: Duration = Duration::from_secs(2);

impl Reconciler {
    pub fn new(
        stores: Stores,
        writer: Writer,
        metrics: Arc<Metrics>,
        settings: Settings,
        changed: Arc<Wakeups>,
    ) -> Self {
        let pace = Pace::new(settings.coalesce, settings.reaction_target);
        Self {
            stores,
            writer,
            metrics,
            settings,
            changed,
            cache: RenderCache::default(),
            settle: InputSettle::default(),
            apply_times: ApplyTimes::default(),
            reported_equals_failed: None,
            status_written: BTreeMap::new(),
            liveness: None,
            undecodable_seen: BTreeMap::new(),
            too_large_logged: None,
            too_large_evented: None,
            snapshot: None,
            assign_log: AssignLog::default(),
            pace,
        }
    }

    /// Inputs too large to become a revision: one log line per replica and one Event (on the largest
    /// object) from the leader per occurrence, not one of each per reconcile.
    fn report_too_large(&mut self, s: &Snapshot, outcome: &mut Outcome) {
        let hash = outcome.too_large.as_ref().map(|(h, _)| h.as_str());
        let problem = outcome.too_large.as_ref().map(|(_, p)| p);
        if revision::equals_failed_notice(self.too_large_logged.as_deref(), hash).is_some()
            && let Some(p) = problem
        {
            warn!(inputs = ?hash, bytes = p.bytes, limit = p.limit, "{p}");
        }
        self.too_large_logged = hash.map(str::to_string);
        if !self.writer.is_leader() {
            return;
        }
        if revision::equals_failed_notice(self.too_large_evented.as_deref(), hash).is_some()
            && let Some(p) = problem
            && let Some(largest) = p.largest()
        {
            outcome.intents.push(Intent::Event {
                regarding: object_ref(
                    largest.kind.as_str(),
                    &largest.name,
                    uid_of_input(s, largest),
                ),
                type_: KubeEventType::Warning,
                reason: limits::REASON.into(),
                action: "Revision".into(),
                note: p.to_string(),
            });
        }
        self.too_large_evented = hash.map(str::to_string);
    }

    /// Objects that do not decode: one log line per object and error in every replica, one Event on
    /// the object from the leader, and the gauge by kind. Not one of each per reconcile.
    fn report_undecodable(&mut self, s: &Snapshot, intents: &mut Vec<Intent>) {
        let leader = self.writer.is_leader();
        let mut seen = BTreeMap::new();
        for (u, uid) in &s.undecodable {
            let key = (u.kind, u.name.clone());
            let mut evented = match self.undecodable_seen.remove(&key) {
                Some((error, evented)) if error == u.error => evented,
                _ => {
                    warn!(kind = %u.kind, name = %u.name, error = %u.error, "{}", undecodable::note(u));
                    false
                }
            };
            if leader && !evented {
                intents.push(Intent::Event {
                    regarding: object_ref(u.kind.as_str(), &u.name, uid.clone()),
                    type_: KubeEventType::Warning,
                    reason: undecodable::REASON.into(),
                    action: "Decode".into(),
                    note: undecodable::note(u),
                });
                evented = true;
            }
            seen.insert(key, (u.error.clone(), evented));
        }
        for (kind, name) in self.undecodable_seen.keys() {
            info!(%kind, %name, "decodes again (or is gone)");
        }
        self.undecodable_seen = seen;
        for kind in Kind::all() {
            let n = s.undecodable.iter().filter(|(u, _)| u.kind == kind).count();
            self.metrics
                .undecodable_objects
                .get_or_create(&crate::metrics::KindLabels {
                    kind: kind.as_str(),
                })
                .set(n as i64);
        }
    }

    /// Reports each pass to `liveness`.
    pub fn with_liveness(mut self, liveness: Liveness) -> Self {
        self.liveness = Some(liveness);
        self
    }

    /// Holds back revision status writes that only move counters within [`COUNTERS_STATUS_INTERVAL`]
    /// of the last write of that status, and sends the other counter moves after the node writes
    /// ([`schedule_statuses`]); returns when to write what was held back.
    fn defer_counter_statuses(
        &mut self,
        snapshot: &Snapshot,
        intents: &mut Vec<Intent>,
    ) -> Option<tokio::time::Instant> {
        let stored = |name: &str| {
            (snapshot.revisions.iter())
                .find(|r| r.metadata.name.as_deref() == Some(name))
                .and_then(|r| r.status.as_ref())
        };
        let now = tokio::time::Instant::now();
        let due = schedule_statuses(intents, stored, &mut self.status_written, now);
        self.status_written.retain(|name, _| {
            snapshot
                .revisions
                .iter()
                .any(|r| r.metadata.name.as_deref() == Some(name))
        });
        due
    }

    /// Runs until `shutdown` resolves; the write in progress finishes first.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut leadership = self.writer.gate();
        let mut wake = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                first = self.changed.wait() => {
                    // Coalesce bursts (a watch relist delivers many events at once, a rollout
                    // hundreds of reports a second), counting from the first change not taken.
                    tokio::time::sleep_until(first + self.pace.wait()).await;
                    // A standby waits out its interval, or until it leads.
                    if !self.writer.is_leader() {
                        let until = tokio::time::Instant::now() + STANDBY_INTERVAL;
                        leadership.leads_by(until).await;
                    }
                }
                _ = tokio::time::sleep_until(wake) => {}
            }
            let pass = self.liveness.as_ref().map(Liveness::pass);
            let retry = self.reconcile_once().await;
            drop(pass);
            wake = tokio::time::Instant::now() + retry.unwrap_or(self.settings.resync);
            // Writes by this reconcile come back through the watches and notify `changed`; the core
            // returns an empty plan for them, so that converges instead of looping.
        }
    }

    /// `compute` again on `fresher`, in place of the `first` outcome, which is dropped: what it
    /// reported as new is due again.
    fn decide_again(
        &mut self,
        fresher: Snapshot,
        first: &Outcome,
        now: Timestamp,
    ) -> (Snapshot, Outcome) {
        self.cache.integrity.not_reported(&first.tampered);
        let outcome = compute(
            &fresher,
            &self.settings,
            &mut self.cache,
            &mut self.settle,
            now,
        );
        (fresher, outcome)
    }

    /// Revisions whose inputs the cache misses past the grace are judged gone only on a fresh read
    /// ([`recheck`]). Every replica asks: a standby's count of tampered specs feeds the alert too.
    async fn recheck_inputs_gone(
        &mut self,
        snapshot: Snapshot,
        outcome: Outcome,
        now: Timestamp,
    ) -> (Snapshot, Outcome) {
        let names = recheck::new_inputs_gone(&outcome.tampered);
        if names.is_empty() {
            return (snapshot, outcome);
        }
        match recheck::read_revisions(self.writer.client().clone(), &names).await {
            Ok(fresh) => {
                let Some(fresher) = snapshot.with_fresh_revisions(&fresh) else {
                    // Gone on the API server as in the cache: the verdict stands.
                    return (snapshot, outcome);
                };
                debug!(
                    revisions = ?names,
                    "inputs missing from the cache are not gone on the API server (their watch is \
                     behind, or the revision's deletion is on its way): deciding on a fresh read"
                );
                self.decide_again(fresher, &outcome, now)
            }
            Err(e) => {
                warn!(
                    revisions = ?names, error = %e,
                    "could not read revisions' inputs again to confirm they are gone; nothing is \
                     decided until they can be"
                );
                self.cache.integrity.not_reported(&outcome.tampered);
                let mut tampered = outcome.tampered;
                tampered.revisions.retain(|n, _| !names.contains(n));
                tampered.unreported_revisions.clear();
                tampered.unreported_node_configs.clear();
                let outcome = Outcome {
                    requeue_at: Some(Timestamp(now.0 + 1000)),
                    ..Outcome::only(Vec::new(), tampered)
                };
                (snapshot, outcome)
            }
        }
    }

    /// The plan again on fresh objects, when it fails nodes by a timeout and the cache turns out to
    /// be behind on any of them ([`crate::recheck`]); else the plan as it is. Only a leader reads:
    /// a standby's plans are never written.
    async fn recheck_timeouts(
        &mut self,
        snapshot: Snapshot,
        outcome: Outcome,
        now: Timestamp,
    ) -> (Snapshot, Outcome) {
        let names = match &outcome.plan {
            Some(plan) if self.writer.is_leader() => recheck::new_timeouts(&snapshot, plan),
            _ => return (snapshot, outcome),
        };
        if names.is_empty() {
            return (snapshot, outcome);
        }
        let fresh = recheck::read_fresh(self.writer.client().clone(), names.clone()).await;
        let Some(fresher) = snapshot.with_fresh_configs(fresh) else {
            return (snapshot, outcome);
        };
        self.metrics.timeout_rechecks_behind.inc();
        info!(
            nodes = names.len(),
            "the cache was behind on nodes about to fail by a timeout: deciding again on a fresh read"
        );
        self.decide_again(fresher, &outcome, now)
    }

    /// One reconcile; returns how long until the next time-based wake-up.
    pub async fn reconcile_once(&mut self) -> Option<Duration> {
        let span = info_span!("reconcile");
        let _g = span.enter();
        let started = std::time::Instant::now();
        // Changes from here on are for the next reconcile's window (those before the snapshot below
        // are in it as well: that reconcile then plans nothing).
        self.changed.take();
        if !self.stores.node_configs_ready() {
            // A standby keeps no node configs (`crate::watch`); a new leader's list of them is on
            // its way, and its end wakes this loop. Nothing can be planned without them.
            self.metrics.leader.set(i64::from(self.writer.is_leader()));
            self.snapshot = None;
            return None;
        }
        // The nodes and node configs read again only where their watches saw a change.
        let snapshot = match self.snapshot.take() {
            Some(last) => last.refresh(&self.stores),
            None => Snapshot::take(&self.stores),
        };
        let now = now();
        let outcome = compute(
            &snapshot,
            &self.settings,
            &mut self.cache,
            &mut self.settle,
            now,
        );
        drop(_g);
        let (snapshot, outcome) = self
            .recheck_inputs_gone(snapshot, outcome, now)
            .instrument(span.clone())
            .await;
        let (snapshot, outcome) = self
            .recheck_timeouts(snapshot, outcome, now)
            .instrument(span.clone())
            .await;
        let _g = span.enter();
        if !self.writer.is_leader() {
            // Changes a standby passes over are not followed: a leader again starts afresh.
            self.apply_times = ApplyTimes::default();
        }
        if let Some(plan) = &outcome.plan
            && self.writer.is_leader()
        {
            record(&self.metrics, &snapshot, plan, outcome.quarantined);
            self.apply_times
                .observe(&outcome.configs, &outcome.changes, now, &self.metrics);
            for w in &plan.report.waiting {
                debug!(waiting = %w);
            }
        }
        self.metrics.leader.set(i64::from(self.writer.is_leader()));
        self.metrics
            .inputs_pending
            .set(i64::from(outcome.inputs_pending));
        let [rev_kind, nnc_kind] = crate::metrics::TAMPERED_KINDS;
        for (kind, n) in [
            (rev_kind, outcome.tampered.revisions.len()),
            (nnc_kind, outcome.tampered.node_configs.len()),
        ] {
            self.metrics
                .tampered_specs
                .get_or_create(&crate::metrics::KindLabels { kind })
                .set(n as i64);
        }
        drop(_g);
        let mut outcome = outcome;
        self.report_undecodable(&snapshot, &mut outcome.intents);
        self.report_too_large(&snapshot, &mut outcome);
        if self.writer.is_leader() {
            if let Some(name) = revision::equals_failed_notice(
                self.reported_equals_failed.as_deref(),
                outcome.equals_failed.as_deref(),
            ) {
                let failed = snapshot
                    .revisions
                    .iter()
                    .find(|r| r.metadata.name.as_deref() == Some(name));
                let uid = failed.and_then(|r| r.metadata.uid.clone());
                outcome.intents.push(Intent::Event {
                    regarding: object_ref("NetworkConfigRevision", name, uid),
                    type_: KubeEventType::Warning,
                    reason: "InputsEqualFailedRevision".into(),
                    action: "Revision".into(),
                    note: equals_failed_note(name, failed.map(AsRef::as_ref)),
                });
            }
            self.reported_equals_failed = outcome.equals_failed.clone();
        }
        let deferred = if self.writer.is_leader() {
            self.defer_counter_statuses(&snapshot, &mut outcome.intents)
        } else {
            None
        };
        self.metrics
            .reconcile_compute_duration
            .observe(started.elapsed().as_secs_f64());
        let n = outcome.intents.len();
        let written = if n > 0 {
            self.writer.execute(outcome.intents, &self.metrics).await
        } else {
            Default::default()
        };
        let sent: HashSet<&str> = written.assigned.iter().map(String::as_str).collect();
        let logged = std::time::Instant::now();
        for line in self.assign_log.record(outcome.plan.as_ref(), &sent, logged) {
            info!(revision = %line.revision, reason = %line.reason, count = line.count, "{}", line.message);
        }
        let took = started.elapsed();
        self.metrics.reconcile_duration.observe(took.as_secs_f64());
        if self.writer.is_leader() {
            self.pace.observe(took);
        }
        if n > 0 {
            debug!(
                intents = n,
                written = written.written,
                failed = written.failed,
                dropped = written.dropped,
                "reconciled"
            );
        }
        self.snapshot = Some(snapshot);
        let time_based = outcome
            .requeue_at
            .map(|t| Duration::from_millis(t.0.saturating_sub(now.0).max(0) as u64));
        let summary = (self.assign_log.next_due())
            .map(|t| t.saturating_duration_since(std::time::Instant::now()));
        let retry = [written.retry_at, deferred]
            .into_iter()
            .flatten()
            .min()
            .map(|t| t.saturating_duration_since(tokio::time::Instant::now()));
        let retry = [retry, summary].into_iter().flatten().min();
        [time_based, retry].into_iter().flatten().min()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use netwave_api::vocab::{
        ConditionStatus, NodeReason, RevisionCondition, RevisionPhase, revision_reasons,
    };
    use netwave_api::{FailedNode, NetworkConfigRevisionStatus};

    use netwave_core::rollout::counters_only;

    fn progressing(updated: u32) -> NetworkConfigRevisionStatus {
        NetworkConfigRevisionStatus {
            phase: Some(RevisionPhase::Progressing.as_str().into()),
            conditions: vec![Condition {
                type_: RevisionCondition::Progressing.as_str().into(),
                status: ConditionStatus::True.as_str().into(),
                reason: revision_reasons::ROLLOUT_PROGRESSING.into(),
                message: format!("{updated} of 10 node(s) updated"),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ),
                observed_generation: Some(1),
            }],
            total: 10,
            updated,
            in_progress: 10 - updated,
            message: Some(format!("{updated} of 10 node(s) updated")),
            ..Default::default()
        }
    }

    /// Only a change of counters (and the words that follow them) may wait for the next status write;
    /// a phase or a failure on record never waits (a rollback must find the failure written first).
    #[test]
    fn only_counter_moves_may_be_held_back() {
        let stored = progressing(3);
        assert!(counters_only(&stored, &progressing(4)));
        let mut complete = progressing(10);
        complete.phase = Some(RevisionPhase::Complete.as_str().into());
        assert!(!counters_only(&stored, &complete));
        let mut failed = progressing(4);
        failed.failed_nodes.push(FailedNode {
            node: "node-1".into(),
            reason: NodeReason::ApplyFailed.as_str().into(),
            ..Default::default()
        });
        failed.failed = 1;
        assert!(!counters_only(&stored, &failed));
        let mut condition = progressing(4);
        condition.conditions[0].status = ConditionStatus::False.as_str().into();
        assert!(!counters_only(&stored, &condition));
    }

    /// A plan's counter moves go out after its node writes (and at most once a second); a failure on
    /// record stays before them, where the rollback that follows needs it.
    #[test]
    fn counter_moves_go_after_the_node_writes_and_a_failure_before_them() {
        use std::collections::BTreeMap;
        use std::sync::Arc;
        use std::time::Duration;

        use crate::writer::Intent;

        let status = |name: &str, st: NetworkConfigRevisionStatus| Intent::RevisionStatus {
            name: name.into(),
            status: Arc::new(st),
        };
        let assign = |node: &str| Intent::ApplyNodeConfig {
            node: node.into(),
            spec: Box::new(netwave_api::NodeNetworkConfigSpec {
                revision: "rev-a".into(),
                sequence: 1,
                config_hash: "hash".into(),
                retry: 0,
                config: netwave_api::NodeConfig::default(),
            }),
            assigned_at: None,
            clear_queued: false,
            based_on: None,
        };
        let failing = |updated: u32| {
            let mut st = progressing(updated);
            st.failed_nodes.push(FailedNode {
                node: "node-9".into(),
                reason: NodeReason::ApplyFailed.as_str().into(),
                ..Default::default()
            });
            st.failed = 1;
            st
        };
        let on_record = progressing(3);
        let keys = |intents: &[Intent]| intents.iter().map(Intent::key).collect::<Vec<_>>();
        let t0 = tokio::time::Instant::now();
        let mut written = BTreeMap::new();

        let mut intents = vec![
            status("rev-a", progressing(4)),
            status("rev-b", failing(4)),
            assign("node-1"),
            assign("node-2"),
        ];
        let due = super::schedule_statuses(&mut intents, |_| Some(&on_record), &mut written, t0);
        assert_eq!(
            keys(&intents),
            [
                "ncr-status/rev-b",
                "nnc/node-1",
                "nnc/node-2",
                "ncr-status/rev-a"
            ]
        );
        assert_eq!(due, None);

        // Half a second later the counters of rev-a wait for their second; a failure never waits.
        let mut intents = vec![
            status("rev-a", progressing(5)),
            status("rev-b", failing(5)),
            assign("node-3"),
        ];
        let later = t0 + Duration::from_millis(500);
        let due = super::schedule_statuses(&mut intents, |_| Some(&on_record), &mut written, later);
        assert_eq!(keys(&intents), ["ncr-status/rev-b", "nnc/node-3"]);
        assert_eq!(due, Some(t0 + Duration::from_secs(1)));

        // A revision with no status on record: its status stays where the plan put it.
        let mut intents = vec![assign("node-4"), status("rev-c", progressing(0))];
        let due = super::schedule_statuses(&mut intents, |_| None, &mut written, later);
        assert_eq!(keys(&intents), ["nnc/node-4", "ncr-status/rev-c"]);
        assert_eq!(due, None);
    }

    /// `compute` on built snapshots (no API server): the cut stage's outcomes.
    mod compute_table {
        use std::sync::Arc;
        use std::time::Duration;

        use kube::api::ObjectMeta;
        use netwave_api::vocab::RevisionPhase;
        use netwave_api::{NetworkConfigRevision, RoutingTable};
        use netwave_core::Timestamp;
        use netwave_core::revision::{self, InputSettle};

        use crate::reconcile::{RenderCache, Settings, Snapshot, compute, fold_inputs};
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

        fn run(s: &Snapshot, settle: Duration) -> crate::reconcile::Outcome {
            compute(
                s,
                &settings(settle),
                &mut RenderCache::default(),
                &mut InputSettle::default(),
                NOW,
            )
        }

        #[test]
        fn folded_inputs_are_kept_only_while_the_stores_hold_the_same_objects() {
            let mut folded = super::super::FoldedInputs::default();
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
                Intent::ReactivateRevision { name, sequence, .. },
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
            assert_eq!((name.as_str(), *sequence), ("rev-old", 3));
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
                &mut RenderCache::default(),
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

        use super::{PLACEHOLDER_WRITES_PER_RECONCILE, RenderCache, compute};
        use crate::writer::Intent;

        const NODES: usize = 600;
        let mut s = inmem::samples_snapshot((0..NODES).map(|i| format!("node-{i:04}")));
        let settings = inmem::settings();
        let (mut cache, mut settle) = (RenderCache::default(), InputSettle::default());
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
}

#[cfg(test)]
mod apply_times_tests {
    use super::*;
    use netwave_core::rollout::{AgentPhase, AgentReport, AssignedSpec};

    /// The metrics as a full pass over every config observed them before #28 (the reference).
    #[derive(Default)]
    struct FullPass {
        seen: Option<BTreeMap<String, String>>,
        waves_done: BTreeSet<(String, i64)>,
    }

    impl FullPass {
        fn observe(&mut self, configs: &[Arc<NodeConfigState>], now: Timestamp, m: &Metrics) {
            let first = self.seen.is_none();
            let seen = self.seen.get_or_insert_with(BTreeMap::new);
            let mut waves: BTreeMap<(&str, i64), (usize, usize)> = BTreeMap::new();
            let elapsed = |at: Timestamp| now.0.saturating_sub(at.0).max(0) as f64 / 1000.0;
            for state in configs {
                let revision = state.spec.revision.as_str();
                let updated = rollout::is_updated(state, &state.spec.revision);
                if let Some(at) = state.spec.assigned_at {
                    let w = waves.entry((revision, at.0)).or_default();
                    w.0 += 1;
                    w.1 += usize::from(updated);
                }
                if !updated {
                    seen.remove(state.name.as_str());
                    continue;
                }
                if seen.get(state.name.as_str()).map(String::as_str) == Some(revision) {
                    continue;
                }
                if !first && let Some(at) = state.spec.assigned_at {
                    m.node_apply_duration.observe(elapsed(at));
                }
                seen.insert(state.name.to_string(), revision.to_string());
            }
            let done: BTreeSet<(String, i64)> = waves
                .into_iter()
                .filter(|(_, (n, updated))| n == updated)
                .map(|((rev, at), _)| (rev.to_string(), at))
                .collect();
            if !first {
                for (_, at) in done.difference(&self.waves_done) {
                    m.wave_duration.observe(elapsed(Timestamp(*at)));
                }
            }
            self.waves_done = done;
        }
    }

    fn histograms(m: &Metrics) -> Vec<String> {
        m.encode()
            .lines()
            .filter(|l| l.starts_with("netwave_node_apply") || l.starts_with("netwave_wave"))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn apply_times_from_changes_observe_what_a_full_pass_over_every_config_observed() {
        for seed in 1..=200u64 {
            let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut below = |n: u64| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x % n
            };
            let (incremental, reference) = (Metrics::default(), Metrics::default());
            let (mut new, mut old) = (ApplyTimes::default(), FullPass::default());
            let mut store: BTreeMap<String, Arc<NodeConfigState>> = BTreeMap::new();
            for step in 0..80i64 {
                let now = Timestamp(1_000_000 + step * 500);
                let mut changes = ConfigChanges::default();
                for _ in 0..=below(4) {
                    let name = format!("n{}", below(10));
                    if below(6) == 0 {
                        if store.remove(&name).is_some() {
                            changes.removed.retain(|n| n != &name);
                            changes.changed.retain(|c| c.name != name);
                            changes.removed.push(name);
                        }
                        continue;
                    }
                    let revision = format!("r{}", below(2));
                    let assigned = Timestamp(1_000_000 + below(4) as i64 * 1_000);
                    let provisioned = below(2) == 0;
                    let state = Arc::new(NodeConfigState {
                        name: (&name).into(),
                        spec: AssignedSpec {
                            revision: (&revision).into(),
                            config_hash: format!("h-{revision}").into(),
                            assigned_at: (below(5) != 0).then_some(assigned),
                            ..AssignedSpec::default()
                        },
                        status: AgentReport {
                            phase: provisioned.then_some(AgentPhase::Provisioned),
                            observed_revision: Some((&revision).into()),
                            observed_retry: Some(0),
                            config_hash: Some(format!("h-{revision}").into()),
                            ..AgentReport::default()
                        },
                        record: Default::default(),
                    });
                    store.insert(name.clone(), state.clone());
                    changes.removed.retain(|n| n != &name);
                    changes.changed.retain(|c| c.name != name);
                    changes.changed.push(state);
                }
                let configs: Vec<Arc<NodeConfigState>> = store.values().cloned().collect();
                new.observe(&configs, &changes, now, &incremental);
                old.observe(&configs, now, &reference);
                assert_eq!(
                    histograms(&incremental),
                    histograms(&reference),
                    "seed {seed}, step {step}"
                );
            }
        }
    }
}
