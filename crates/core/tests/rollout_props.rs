//! Property tests of `rollout::step` over arbitrary worlds (random revisions in any phase, random
//! node configs and agent reports, random policies):
//!
//! - the budget is never exceeded by a plan, even applied only in part (globally and per domain);
//! - no node is given a failed or unvalidated revision, a rollback goes to the last good revision, and
//!   no Not Ready / cordoned node is made in flight;
//! - no node is moved to a revision that removes more than the threshold of the last good revision's
//!   content unless an admin approved its hold, and a destructive target gets its hold recorded;
//! - stepping again over the applied plan plans nothing (no hot loops);
//! - the plan does not depend on input order.
//!
//! Failing cases are kept in `proptest-regressions/` and replayed first.

mod support_props;

use netwave_api::vocab::{ConditionStatus, NodeReason, RevisionCondition};
use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use netwave_api::{Canary, FailedNode, Quarantine, RolloutPolicy};
use netwave_core::Sequence;
use netwave_core::Timestamp;
use netwave_core::render::{InputKind, InputRef};
use netwave_core::rollout::hold;
use netwave_core::rollout::quarantine::{NodeRecord, StreakEntry};
use netwave_core::rollout::{
    AgentPhase, AgentReport, AssignReason, AssignedSpec, NodeConfigState, Phase, Plan,
    REASON_APPLY_TIMEOUT, REASON_PICKUP_TIMEOUT, REASON_PROTOCOL_VIOLATION, StepMemo, Write,
    is_in_flight, resolve, step,
};
use netwave_core::sim::Store;
use proptest::prelude::*;

const NOW: Timestamp = Timestamp(1_800_000_000_000);
const MAX_NODES: usize = 16;
const MAX_REVS: usize = 4;
const ZONE: &str = "zone";

#[derive(Clone, Debug)]
struct RevGen {
    phase: u8,
    retry: u8,
    observed_retry: Option<u8>,
    paused: bool,
    invalid: bool,
    percent: bool,
    budget: u8,
    max_failures: u8,
    canary: Option<(u8, u8)>,
    topology: bool,
    per_domain: Option<u8>,
    failed_mask: u16,
    canaries_ago: Option<u16>,
    progress_ago: Option<u16>,
    /// 0: no footprint (not measured); 1: nothing on any node; else the generated per-node sets.
    content: u8,
    /// 0: no hold on record; 1: a hold with the basis against the last good revision; 2: a hold with
    /// another basis.
    hold: u8,
    /// `quarantine.afterConsecutiveFailures` (off when `None`); with it, every other failure on record
    /// is flagged as a quarantined node's.
    quarantine: Option<u8>,
}

fn rev_gen() -> impl Strategy<Value = RevGen> {
    (
        (
            0u8..7,
            0u8..2,
            proptest::option::of(0u8..2),
            any::<bool>(),
            0u8..8,
        ),
        (any::<bool>(), 1u8..5, 1u8..4),
        (
            proptest::option::of((1u8..4, 0u8..60)),
            any::<bool>(),
            proptest::option::of(1u8..3),
        ),
        (
            any::<u16>(),
            proptest::option::of(0u16..200),
            proptest::option::of(0u16..2000),
        ),
        (0u8..5, 0u8..3, proptest::option::of(1u8..4)),
    )
        .prop_map(
            |(
                (phase, retry, observed_retry, paused, invalid),
                (percent, budget, max_failures),
                (canary, topology, per_domain),
                (failed_mask, canaries_ago, progress_ago),
                (content, hold, quarantine),
            )| RevGen {
                phase,
                retry,
                observed_retry,
                paused: paused && invalid % 3 == 0,
                invalid: invalid == 0,
                percent,
                budget,
                max_failures,
                canary,
                topology,
                per_domain,
                failed_mask,
                canaries_ago,
                progress_ago,
                content,
                hold,
                quarantine,
            },
        )
}

#[derive(Clone, Debug)]
struct NodeGen {
    ready: bool,
    cordoned: bool,
    zone: u8,
    config: Option<ConfigGen>,
}

#[derive(Clone, Debug)]
struct ConfigGen {
    spec_rev: u8,
    spec_retry: u8,
    /// None: the rendered hash of the spec revision; Some(h): `h<h>`.
    spec_hash: Option<u8>,
    assigned_ago: Option<u16>,
    phase: u8,
    observed_rev: Option<u8>,
    observed_retry: u8,
    status_hash: Option<u8>,
    last_good: Option<u8>,
    /// The configurator's record: 0, 1 none; 2 a streak of one revision; 3 quarantined.
    record: u8,
}

fn node_gen() -> impl Strategy<Value = NodeGen> {
    let config = (
        (0u8..=MAX_REVS as u8, 0u8..2, proptest::option::of(0u8..4)),
        (proptest::option::of(0u16..700), 0u8..5, 0u8..4),
        (
            proptest::option::of(0u8..=MAX_REVS as u8),
            0u8..2,
            proptest::option::of(0u8..4),
            proptest::option::of(0u8..=MAX_REVS as u8),
        ),
    )
        .prop_map(
            |(
                (spec_rev, spec_retry, spec_hash),
                (assigned_ago, phase, record),
                (observed_rev, observed_retry, status_hash, last_good),
            )| ConfigGen {
                spec_rev,
                spec_retry,
                spec_hash,
                assigned_ago,
                phase,
                observed_rev,
                observed_retry,
                status_hash,
                last_good,
                record,
            },
        );
    (0u8..10, 0u8..3, proptest::option::weighted(0.8, config)).prop_map(|(health, zone, config)| {
        NodeGen {
            ready: health != 0,
            cordoned: health == 1,
            zone,
            config,
        }
    })
}

#[derive(Clone, Debug)]
struct WorldGen {
    revisions: Vec<RevGen>,
    nodes: Vec<NodeGen>,
    /// Rendered hash index per (revision, node): few values, so configs often coincide (fast path).
    rendered: Vec<u8>,
    history_limit: u8,
    /// Objects per (revision, node), as a bit mask over four routing tables.
    objects: Vec<u8>,
    threshold: u32,
}

fn world_gen() -> impl Strategy<Value = WorldGen> {
    (
        prop::collection::vec(rev_gen(), 1..=MAX_REVS),
        prop::collection::vec(node_gen(), 0..=MAX_NODES),
        prop::collection::vec(0u8..3, MAX_REVS * MAX_NODES),
        1u8..6,
        prop::collection::vec(0u8..16, MAX_REVS * MAX_NODES),
        prop::sample::select(vec![0u32, 30, 50, 100]),
    )
        .prop_map(
            |(revisions, nodes, rendered, history_limit, objects, threshold)| WorldGen {
                revisions,
                nodes,
                rendered,
                history_limit,
                objects,
                threshold,
            },
        )
}

/// The last good revision before a step: the newest `Complete` one (a Complete revision is never
/// failed).
fn last_good(store: &Store) -> Option<String> {
    store
        .revisions
        .values()
        .filter(|r| r.status.phase.as_deref() == Some(Phase::Complete.as_str()))
        .max_by_key(|r| r.sequence)
        .map(|r| r.name.to_string())
}

/// Whether `rev` is destructive against the last good revision `lg` in `store`'s footprints.
fn destructive(store: &Store, lg: &str, rev: &str) -> Option<hold::Removal> {
    let (base, cand) = (store.footprints.get(lg)?, store.footprints.get(rev)?);
    hold::destructive(lg, base, cand, store.defaults.destructive_threshold)
}

fn rev_name(i: u8) -> String {
    // Index 0 is a revision that no longer exists.
    format!("r{i}")
}

fn node_name(i: usize) -> String {
    format!("n{i:02}")
}

fn build(g: &WorldGen) -> Store {
    let mut store = Store::default();
    store.defaults.revision_history_limit = g.history_limit as usize;
    store.defaults.destructive_threshold = g.threshold;
    for (i, n) in g.nodes.iter().enumerate() {
        let node = store.add_node(
            &node_name(i),
            BTreeMap::from([(ZONE.to_string(), format!("z{}", n.zone))]),
        );
        node.ready = n.ready;
        node.unschedulable = n.cordoned;
    }
    let phases = [
        None,
        Some(Phase::Pending),
        Some(Phase::Progressing),
        Some(Phase::Complete),
        Some(Phase::Failed),
        Some(Phase::Superseded),
        Some(Phase::Complete),
    ];
    for (k, r) in g.revisions.iter().enumerate() {
        let name = rev_name(k as u8 + 1);
        for i in 0..g.nodes.len() {
            store.rendered.insert(
                name.clone(),
                node_name(i),
                format!("h{}", g.rendered[k * MAX_NODES + i]),
            );
        }
        let rev = store.add_revision(&name, k as u64 + 1);
        rev.retry = r.retry as u32;
        rev.paused = r.paused;
        rev.status.phase = phases[r.phase as usize].map(|p| p.as_str().to_string());
        rev.status.observed_retry = r.observed_retry.map(u32::from);
        if r.invalid {
            rev.validation.errors = vec!["generated validation error".into()];
        }
        rev.policy = RolloutPolicy {
            max_unavailable: Some(if r.percent {
                IntOrString::String(format!("{}%", r.budget as u32 * 15))
            } else {
                IntOrString::Int(r.budget as i32)
            }),
            max_failures: Some(r.max_failures as u32),
            apply_timeout_seconds: Some(300),
            pickup_timeout_seconds: Some(400),
            progress_deadline_seconds: Some(600),
            canary: r.canary.map(|(count, bake)| Canary {
                count: Some(count as u32),
                selector: None,
                bake_seconds: bake as u32,
            }),
            topology_key: r.topology.then(|| ZONE.to_string()),
            max_unavailable_per_domain: r
                .per_domain
                .filter(|_| r.topology)
                .map(|n| IntOrString::Int(n as i32)),
            quarantine: r.quarantine.map(|n| Quarantine {
                after_consecutive_failures: n as u32,
            }),
        };
        rev.status.failed_nodes = (0..g.nodes.len())
            .filter(|i| r.failed_mask & (1 << i) != 0 && i % 3 == 0)
            .map(|i| FailedNode {
                node: node_name(i),
                reason: NodeReason::ApplyFailed.as_str().into(),
                message: String::new(),
                at: Some(NOW.to_time()),
                quarantined: r.quarantine.is_some() && (i / 3) % 2 == 1,
            })
            .collect();
        rev.status.canaries_updated_at = r
            .canaries_ago
            .map(|s| Timestamp(NOW.0 - s as i64 * 1000).to_time());
        rev.status.last_progress_at = r
            .progress_ago
            .map(|s| Timestamp(NOW.0 - s as i64 * 1000).to_time());
        if r.content > 0 {
            let mut fp = hold::Footprint::default();
            for i in 0..g.nodes.len() {
                let mask = if r.content == 1 {
                    0
                } else {
                    g.objects[k * MAX_NODES + i]
                };
                let objects = (0..4)
                    .filter(|b| mask & (1 << b) != 0)
                    .map(|b| InputRef::new(InputKind::RoutingTable, format!("t{b}")))
                    .collect();
                fp.insert(node_name(i), Arc::new(objects));
            }
            store.footprints.insert(name.clone(), Arc::new(fp));
        }
    }
    // Holds on record, against the last good revision or another basis.
    let lg = last_good(&store);
    for (k, r) in g.revisions.iter().enumerate() {
        let rev = store.revision(&rev_name(k as u8 + 1));
        let against = match (r.hold, &lg) {
            (1, Some(lg)) => lg.clone(),
            (0, _) | (1, None) => continue,
            _ => "r9".to_string(),
        };
        rev.destructive = Some("generated hold".into());
        rev.hold_basis = Some(hold::basis(rev.sequence, &against));
    }
    let revs = g.revisions.len() as u8;
    for (i, n) in g.nodes.iter().enumerate() {
        let Some(c) = &n.config else { continue };
        let spec_rev = rev_name(c.spec_rev % (revs + 1));
        let spec_hash = match c.spec_hash {
            None => store.hash_of(&spec_rev, &node_name(i)),
            Some(h) => format!("h{h}").into(),
        };
        let phase = match c.phase {
            0 => None,
            1 => Some(AgentPhase::Provisioning),
            2 | 3 => Some(AgentPhase::Provisioned),
            _ => Some(AgentPhase::Invalid),
        };
        store.configs.insert(
            node_name(i),
            NodeConfigState {
                name: node_name(i).into(),
                spec: AssignedSpec {
                    revision: spec_rev.into(),
                    sequence: Default::default(),
                    config_hash: spec_hash,
                    retry: c.spec_retry as u32,
                    assigned_at: c.assigned_ago.map(|s| Timestamp(NOW.0 - s as i64 * 1000)),
                },
                status: AgentReport {
                    phase: phase.clone(),
                    observed_revision: c.observed_rev.map(|r| rev_name(r % (revs + 1)).into()),
                    observed_retry: Some(c.observed_retry as u32),
                    observed_config_hash: None,
                    config_hash: c.status_hash.map(|h| format!("h{h}").into()),
                    last_good_revision: c.last_good.map(|r| rev_name(r % (revs + 1)).into()),
                    reason: None,
                    message: None,
                    // An agent that reports Provisioning started halfway between the assignment
                    // and now (by its clock).
                    started_at: (phase == Some(AgentPhase::Provisioning))
                        .then_some(c.assigned_ago)
                        .flatten()
                        .map(|s| Timestamp(NOW.0 - s as i64 * 500)),
                    features: Default::default(),
                },
                record: match c.record {
                    2 => NodeRecord {
                        streak: vec![StreakEntry {
                            revision: rev_name(c.spec_rev % (revs + 1)),
                            sequence: Sequence(c.spec_rev as u64),
                        }],
                        quarantined: None,
                    },
                    3 => NodeRecord {
                        streak: Vec::new(),
                        quarantined: Some("since then: generated".into()),
                    },
                    _ => NodeRecord::default(),
                },
            },
        );
    }
    // A config of a node that left.
    if g.history_limit == 3 {
        store.configs.insert(
            "gone".into(),
            NodeConfigState {
                name: "gone".into(),
                ..NodeConfigState::default()
            },
        );
    }
    store
}

/// In flight over existing nodes: (total, per zone).
fn in_flight(store: &Store) -> (u32, BTreeMap<String, u32>) {
    let mut total = 0;
    let mut per = BTreeMap::new();
    for (name, node) in &store.nodes {
        if store.configs.get(name).is_some_and(is_in_flight) {
            total += 1;
            *per.entry(node.labels[ZONE].clone()).or_insert(0) += 1;
        }
    }
    (total, per)
}

/// In flight as the budget counts it: a joining node given a proven revision (`joining`: judged on the
/// store before the plan; no report from its agent yet) takes no slot.
fn budgeted_in_flight(
    store: &Store,
    joining: &std::collections::BTreeSet<String>,
) -> (u32, BTreeMap<String, u32>) {
    let mut total = 0;
    let mut per = BTreeMap::new();
    for (name, node) in &store.nodes {
        if store.configs.get(name).is_some_and(|c| {
            let still_joining = joining.contains(name) && c.status.phase.is_none();
            is_in_flight(c) && !still_joining
        }) {
            total += 1;
            *per.entry(node.labels[ZONE].clone()).or_insert(0) += 1;
        }
    }
    (total, per)
}

/// The budget the plan must respect: the target's policy (or the newest revision's).
fn budgets(store: &Store, plan: &Plan) -> (u32, Option<BTreeMap<String, u32>>) {
    let gov = plan
        .report
        .target
        .clone()
        .or_else(|| {
            store
                .revisions
                .values()
                .max_by_key(|r| r.sequence)
                .map(|r| r.name.to_string())
        })
        .expect("at least one revision");
    let (policy, _) = resolve(&store.revisions[&gov].policy, &store.defaults);
    let eligible: Vec<_> = store.nodes.values().filter(|n| n.eligible()).collect();
    let budget = policy.max_unavailable.of(eligible.len());
    let per = policy.max_unavailable_per_domain.map(|b| {
        let mut m = BTreeMap::new();
        for z in ["z0", "z1", "z2"] {
            let n = eligible.iter().filter(|e| e.labels[ZONE] == z).count();
            m.insert(z.to_string(), b.of(n));
        }
        m
    });
    (budget, per)
}

proptest! {
    #![proptest_config(support_props::config(512, "proptest-regressions/rollout_props.txt"))]

    #[test]
    fn budget_is_never_exceeded_even_by_a_partly_applied_plan(g in world_gen()) {
        let store = build(&g);
        let plan = step(&store.input(), NOW);
        let (budget, per_budget) = budgets(&store, &plan);
        let joining: std::collections::BTreeSet<String> = store
            .configs
            .values()
            .filter(|c| store.joining(c))
            .map(|c| c.name.to_string())
            .collect();
        let (before, before_per) = budgeted_in_flight(&store, &joining);
        let mut world = store.clone();
        for w in plan.writes() {
            world.apply(w).expect("plan applies");
            // Joining as the plan found them, or made them (a new config of a proven revision).
            let mut joining = joining.clone();
            joining.extend(
                world
                    .configs
                    .values()
                    .filter(|c| !store.configs.contains_key(c.name.as_str()) && store.joining(c))
                    .map(|c| c.name.to_string()),
            );
            let (now_total, now_per) = budgeted_in_flight(&world, &joining);
            prop_assert!(
                now_total <= before.max(budget),
                "in flight {now_total} > max(before {before}, budget {budget})"
            );
            if let Some(per_budget) = &per_budget {
                for (z, &n) in &now_per {
                    let b = before_per.get(z).copied().unwrap_or(0).max(per_budget[z]);
                    prop_assert!(n <= b, "zone {z}: {n} in flight > {b}");
                }
            }
        }
        prop_assert_eq!(plan.report.in_flight, in_flight(&world).0);
    }

    #[test]
    fn no_node_gets_a_failed_or_unvalidated_revision_or_is_moved_while_not_ready(g in world_gen()) {
        let store = build(&g);
        let plan = step(&store.input(), NOW);
        // The last good revision when the step begins (the newest Complete one; a Complete revision is
        // never failed) and once the plan is applied (the report). They differ only when the target
        // completes in this plan, and then a node that failed the target goes back to the former: it
        // never goes back to a revision it failed (regression 443a238a, and the table test
        // failing_nodes_go_back_to_the_previous_last_good_revision_even_when_the_target_completes).
        let last_good_before = store
            .revisions
            .values()
            .filter(|r| r.status.phase.as_deref() == Some(Phase::Complete.as_str()))
            .max_by_key(|r| r.sequence)
            .map(|r| r.name.to_string());
        let target_completes_now = plan.report.target.is_some()
            && plan.report.target == plan.report.last_good
            && plan.report.last_good != last_good_before;
        let mut after = store.clone();
        after.apply_plan(&plan).expect("plan applies");
        let mut seen = std::collections::BTreeSet::new();
        for a in &plan.assignments {
            prop_assert!(seen.insert(a.node.clone()), "{} assigned twice", a.node);
            let rev = &after.revisions[a.revision.as_str()];
            prop_assert_ne!(rev.status.phase.as_deref(), Some(Phase::Failed.as_str()));
            // Going back to the last good revision is allowed even if the fleet no longer validates
            // with it: the node ran it before.
            if a.reason != AssignReason::Rollback {
                prop_assert!(rev.validation.errors.is_empty(), "{} has validation errors", a.revision);
                prop_assert!(
                    rev.status.conditions.iter().any(|c| c.type_ == RevisionCondition::Validated.as_str() && c.status == ConditionStatus::True.as_str()),
                    "{} not validated", a.revision
                );
            } else if Some(a.revision.as_str()) != plan.report.last_good.as_deref() {
                prop_assert!(
                    target_completes_now && Some(a.revision.as_str()) == last_good_before.as_deref(),
                    "rollback of {} to {}: last good before {:?}, after {:?}, target {:?}",
                    a.node, a.revision, last_good_before, plan.report.last_good, plan.report.target
                );
            }
            let node = &store.nodes[a.node.as_str()];
            let was = store.configs.get(a.node.as_str()).is_some_and(is_in_flight);
            let now = is_in_flight(&after.configs[a.node.as_str()]);
            prop_assert!(node.eligible() || was || !now, "{} made in flight while not eligible", a.node);
        }
    }

    /// #27 item 10: a quarantined node gets no new revision (only a rollback to the last good one), and
    /// a failure goes uncounted only when its node is quarantined on record once the plan's records
    /// are written (records go first). With quarantine off in every policy, nothing is flagged.
    #[test]
    fn a_quarantined_node_gets_nothing_new_and_only_its_failures_go_uncounted(g in world_gen()) {
        let store = build(&g);
        let plan = step(&store.input(), NOW);
        for a in &plan.assignments {
            let quarantined = store.configs.get(a.node.as_str()).is_some_and(|c| c.record.is_quarantined());
            prop_assert!(
                !quarantined || a.reason == AssignReason::Rollback,
                "quarantined {} moved to {} ({:?})", a.node, a.revision, a.reason
            );
        }
        let mut after = store.clone();
        for r in &plan.records {
            after.apply(Write::Record(r)).expect("record applies");
        }
        for u in &plan.status_updates {
            let before = &store.revisions[&u.revision].status.failed_nodes;
            for f in u.status.failed_nodes.iter().filter(|f| f.quarantined) {
                if before.iter().any(|b| b.node == f.node && b.quarantined) {
                    continue;
                }
                if f.reason == REASON_PROTOCOL_VIOLATION {
                    let spec = store.configs.get(&f.node).map(|c| c.spec.revision.as_str());
                    prop_assert!(
                        spec.is_some_and(|s| s != u.revision.as_str()),
                        "{}'s report on {} taken for a violation while its spec names it", f.node, u.revision
                    );
                    continue;
                }
                prop_assert!(
                    after.configs.get(&f.node).is_some_and(|c| c.record.is_quarantined()),
                    "{}'s failure of {} flagged, node not quarantined", f.node, u.revision
                );
            }
        }
    }

    /// #48: a verdict counts only for what the node was given. A counted failure an agent reported
    /// (not a deadline the configurator found) names the revision and retry the node's spec holds.
    #[test]
    fn a_counted_verdict_is_always_on_what_the_node_was_given(g in world_gen()) {
        let store = build(&g);
        let plan = step(&store.input(), NOW);
        for u in &plan.status_updates {
            let before = &store.revisions[&u.revision].status.failed_nodes;
            let retry = store.revisions[&u.revision].retry;
            for f in u.status.failed_nodes.iter().filter(|f| !f.quarantined) {
                let deadline = [REASON_PICKUP_TIMEOUT, REASON_APPLY_TIMEOUT].contains(&f.reason.as_str());
                if deadline || before.iter().any(|b| b.node == f.node) {
                    continue;
                }
                let spec = store.configs.get(&f.node).map(|c| (c.spec.revision.as_str(), c.spec.retry));
                prop_assert_eq!(
                    spec, Some((u.revision.as_str(), retry)),
                    "{}'s verdict counted against {}", f.node, u.revision
                );
            }
        }
    }

    /// DESIGN.md §6 **A held change stays held**, over arbitrary worlds.
    #[test]
    fn no_node_is_moved_to_a_destructive_revision_an_admin_did_not_approve(g in world_gen()) {
        let store = build(&g);
        let plan = step(&store.input(), NOW);
        let Some(lg) = last_good(&store) else { return Ok(()) };
        for a in &plan.assignments {
            let moves = store.configs.get(a.node.as_str()).is_none_or(|c| c.spec.revision != a.revision);
            if !moves || a.reason == AssignReason::Rollback || a.revision == lg {
                continue;
            }
            if let Some(r) = destructive(&store, &lg, &a.revision) {
                let rev = &store.revisions[a.revision.as_str()];
                let approved = rev.hold_basis.as_deref() == Some(&hold::basis(rev.sequence, &lg))
                    && !rev.paused;
                prop_assert!(approved, "{} moved to {} ({:?}), which {r}", a.node, a.revision, a.reason);
            }
        }
        // A destructive target's hold is recorded (spec.paused and the basis), unless it is.
        if let Some(t) = plan.report.target.as_ref().filter(|t| **t != lg)
            && destructive(&store, &lg, t).is_some()
        {
            let rev = &store.revisions[t];
            let basis = hold::basis(rev.sequence, &lg);
            let recorded = rev.hold_basis.as_deref() == Some(&basis);
            prop_assert_eq!(
                plan.holds.iter().any(|h| &h.revision == t && h.basis == basis),
                !recorded,
                "holds {:?}", plan.holds
            );
        }
    }

    #[test]
    fn stepping_again_over_the_applied_plan_plans_nothing(g in world_gen()) {
        let mut store = build(&g);
        let plan = step(&store.input(), NOW);
        store.apply_plan(&plan).expect("plan applies");
        let again = step(&store.input(), NOW);
        prop_assert!(again.is_empty(), "second plan: {:#?}", again);
    }

    #[test]
    fn the_plan_does_not_depend_on_input_order(g in world_gen(), rotate in 0usize..17) {
        let store = build(&g);
        let input = store.input();
        let plan = step(&input, NOW);
        let mut shuffled = input.clone();
        let nodes = Arc::make_mut(&mut shuffled.nodes);
        nodes.reverse();
        let n = nodes.len();
        if n > 0 {
            nodes.rotate_left(rotate % n);
        }
        Arc::make_mut(&mut shuffled.configs).reverse();
        shuffled.revisions.reverse();
        prop_assert_eq!(step(&shuffled, NOW), plan);
    }

    /// A leader keeps a `StepMemo` between steps; whatever changed in between, it plans what a step
    /// from scratch plans: the plan applied and some agents answering, a node moved to another zone,
    /// a node gone, a rendering changed, the lists in another order. What did not change is the very
    /// same object, as in the configurator's inputs.
    #[test]
    fn a_memo_kept_across_changes_plans_what_a_step_from_scratch_plans(
        g in world_gen(),
        relabel in proptest::option::of(0usize..16),
        gone in proptest::option::of(0usize..16),
        rerender in proptest::option::of(0usize..16),
        answered: u16,
        reorder: bool,
    ) {
        let mut store = build(&g);
        let mut memo = StepMemo::default();
        let before = store.input();
        let plan = memo.step(&before, NOW);
        prop_assert_eq!(&plan, &step(&before, NOW));
        store.apply_plan(&plan).expect("plan applies");
        let names: Vec<String> = store.nodes.keys().cloned().collect();
        let later = NOW.plus_secs(30);
        for (i, name) in names.iter().enumerate() {
            let on = store.configs.get(name.as_str()).map(|c| c.spec.revision.to_string());
            if let Some(rev) = on
                .filter(|r| store.revisions.contains_key(r))
                .filter(|_| answered & (1 << i) != 0)
            {
                store.set_running(name, &rev, later);
            }
        }
        if let Some(node) = relabel.and_then(|i| names.get(i)) {
            let labels = &mut store.nodes.get_mut(node).expect("listed").labels;
            labels.insert(ZONE.to_string(), "z-moved".to_string());
        }
        if let Some(node) = gone.and_then(|i| names.get(i)) {
            store.nodes.remove(node);
        }
        if let (Some(node), Some(rev)) =
            (rerender.and_then(|i| names.get(i)), store.revisions.keys().next().cloned())
        {
            store.rendered.insert(rev, node.clone(), "rerendered");
        }
        let mut after = store.input_sharing(&before);
        if reorder {
            Arc::make_mut(&mut after.nodes).reverse();
            Arc::make_mut(&mut after.configs).reverse();
        }
        let again = memo.step(&after, later);
        prop_assert_eq!(again, step(&after, later));
    }
}

#[test]
fn writes_come_in_a_safe_order() {
    // Holds before statuses before assignments before deletions, whatever the plan. Two completed
    // revisions, the second with four tables on every node, and a pending one with nothing: held.
    let complete = RevGen {
        phase: 3,
        retry: 0,
        observed_retry: None,
        paused: false,
        invalid: false,
        percent: false,
        budget: 2,
        max_failures: 1,
        canary: None,
        topology: false,
        per_domain: None,
        failed_mask: 0,
        canaries_ago: None,
        progress_ago: None,
        content: 0,
        hold: 0,
        quarantine: None,
    };
    let store = build(&WorldGen {
        revisions: vec![
            complete.clone(),
            RevGen {
                content: 2,
                ..complete.clone()
            },
            RevGen {
                phase: 1,
                content: 1,
                ..complete
            },
        ],
        nodes: vec![
            NodeGen {
                ready: true,
                cordoned: false,
                zone: 0,
                config: None,
            };
            3
        ],
        rendered: vec![1; MAX_REVS * MAX_NODES],
        history_limit: 3,
        objects: vec![15; MAX_REVS * MAX_NODES],
        threshold: 50,
    });
    let plan = step(&store.input(), NOW);
    assert_eq!(plan.holds.len(), 1, "{plan:#?}");
    let kinds: Vec<u8> = plan
        .writes()
        .map(|w| match w {
            Write::Record(_) => 0,
            Write::Hold(_) => 1,
            Write::Status(_) => 2,
            Write::Assign(_) => 3,
            Write::DeleteConfig(_) => 4,
            Write::DeleteRevision(_) => 5,
        })
        .collect();
    assert!(!kinds.is_empty());
    assert!(kinds.is_sorted(), "{kinds:?}");
}
