//! DESIGN.md §6 **A held change stays held**: a revision that takes much of what the last good revision
//! puts on the nodes (or all of it) off them waits for an admin, and none of the ways around it works:
//! a later edit while the hold is pending, an older (or the empty first) revision made the target
//! again, deletion in small steps, emptied selectors, `kubectl netwave undo`. One test per way, named
//! after the rule; every step goes through `run`, which also checks that stepping again plans nothing.

mod support_inputs;
mod support_step;

use netwave_api::vocab::{ConditionStatus, RevisionCondition, RevisionPhase, revision_reasons};
use std::sync::Arc;

use netwave_api::RevisionInputs;
use netwave_core::Timestamp;
use netwave_core::render::NodeInfo;
use netwave_core::revision::DESTRUCTIVE_CHANGE_ANNOTATION;
use netwave_core::rollout::hold::{self, Footprint, destructive, hold_on_creation};
use netwave_core::rollout::loss::MoveLoss;
use netwave_core::rollout::{
    AgentPhase, AssignReason, EventReason, Plan, WaitingOn, is_in_flight, last_good, reasons,
};
use netwave_core::sim::Store;
use netwave_core::sym::Sym;
use netwave_core::types::Sequence;
use support_inputs::*;
use support_step::run;

const T0: Timestamp = Timestamp(1_700_000_000_000);

fn at(secs: u64) -> Timestamp {
    T0.plus_secs(secs)
}

fn nodes() -> Vec<NodeInfo> {
    sample_nodes()
}

fn samples() -> RevisionInputs {
    sample_inputs()
}

/// A small RoutingTable on every node: what an admin applies after deleting everything.
fn one_small_table() -> RevisionInputs {
    inputs(vec![], vec![], vec![rt("small", 300)])
}

/// The samples with every selector pointing at a label no node has: the objects exist, on no node.
fn samples_on_no_node() -> RevisionInputs {
    let mut i = samples();
    let nowhere = || match_labels(&[("netwave.dev/nowhere", "true")]);
    i.vrfs
        .iter_mut()
        .for_each(|o| o.spec.node_selector = nowhere());
    i.layer2s
        .iter_mut()
        .for_each(|o| o.spec.node_selector = nowhere());
    (i.routing_tables.iter_mut()).for_each(|o| o.spec.node_selector = nowhere());
    i
}

/// The samples without the first `n` objects (VRFs, then segments, then tables, in canonical order).
fn samples_without(n: usize) -> RevisionInputs {
    let mut i = netwave_core::revision::canonical_inputs(&samples());
    let drop_v = n.min(i.vrfs.len());
    i.vrfs.drain(..drop_v);
    let drop_l = (n - drop_v).min(i.layer2s.len());
    i.layer2s.drain(..drop_l);
    let drop_r = (n - drop_v - drop_l).min(i.routing_tables.len());
    i.routing_tables.drain(..drop_r);
    i
}

/// A store on the sample nodes with revision `name` cut from `inputs` (its footprint on them).
fn add(store: &mut Store, name: &str, sequence: u64, inputs: &RevisionInputs) {
    store.add_revision(name, sequence);
    store
        .footprints
        .insert(name.into(), Arc::new(Footprint::of(inputs, &nodes())));
}

/// The sample nodes, all running a completed `r1` cut from `inputs`.
fn fleet_on(inputs: &RevisionInputs) -> Store {
    let names: Vec<String> = nodes().into_iter().map(|n| n.name).collect();
    let mut store = Store::with_nodes(&names);
    add(&mut store, "r1", 1, inputs);
    for n in &names {
        store.set_running(n, "r1", T0);
    }
    run(&mut store, T0);
    assert_eq!(phase(&store, "r1"), RevisionPhase::Complete.as_str());
    store
}

fn phase(store: &Store, rev: &str) -> String {
    store.revisions[rev]
        .status
        .phase
        .clone()
        .unwrap_or_default()
}

fn paused_condition(store: &Store, rev: &str) -> (String, String, String) {
    let c = (store.revisions[rev].status.conditions.iter())
        .find(|c| c.type_ == RevisionCondition::Paused.as_str())
        .unwrap_or_else(|| panic!("{rev} has no Paused condition"));
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

fn moved_to(plan: &Plan, rev: &str) -> Vec<String> {
    (plan.assignments.iter())
        .filter(|a| a.revision == rev)
        .map(|a| format!("{} ({:?})", a.node, a.reason))
        .collect()
}

/// The step holds `rev`: nobody is moved to it, the hold is recorded (paused, both annotations, basis
/// against `last_good`), and the Paused condition says what it removes and how to approve.
fn assert_held(store: &Store, plan: &Plan, rev: &str, last_good: &str) -> String {
    assert_eq!(
        moved_to(plan, rev),
        Vec::<String>::new(),
        "moved to held {rev}"
    );
    let r = &store.revisions[rev];
    assert!(r.paused, "{rev}: spec.paused is set by the hold");
    assert_eq!(
        r.hold_basis.as_deref(),
        Some(hold::basis(r.sequence, last_good).as_str())
    );
    assert!(r.destructive.is_some(), "{DESTRUCTIVE_CHANGE_ANNOTATION}");
    let (status, reason, message) = paused_condition(store, rev);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        (ConditionStatus::True.as_str(), reasons::DESTRUCTIVE_CHANGE)
    );
    assert!(
        message.contains(&format!("the last good revision {last_good} has"))
            && message.contains("resume it to approve"),
        "{message}"
    );
    message
}

// ── The rule itself ────────────────────────────────────────────────────────────────────────────────

#[test]
fn removing_everything_is_held_whatever_the_threshold() {
    let (base, none) = (
        Footprint::of(&samples(), &nodes()),
        Footprint::of(&RevisionInputs::default(), &nodes()),
    );
    let r = destructive("r1", &base, &none, 100).expect("removing everything is held");
    assert_eq!(r.lost, r.placements);
    assert_eq!(r.objects.len(), r.baseline_objects);
    // Replacing everything by something new removes everything too.
    let small = Footprint::of(&one_small_table(), &nodes());
    assert!(destructive("r1", &base, &small, 100).is_some());
}

#[test]
fn removing_more_than_the_threshold_share_of_placements_is_held() {
    let four = |names: &[&str]| {
        let rts = names.iter().map(|n| rt(n, 300)).collect();
        Footprint::of(&inputs(vec![], vec![], rts), &nodes())
    };
    let base = four(&["a", "b", "c", "d"]);
    // 2 of 4 tables on every node = 50%: not more than 50%.
    assert_eq!(destructive("r1", &base, &four(&["c", "d"]), 50), None);
    let r = destructive("r1", &base, &four(&["d"]), 50).expect("75% is held");
    let names: Vec<&str> = r.objects.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    // Renaming is removing one object and adding another.
    assert!(destructive("r1", &base, &four(&["w", "x", "y", "z"]), 50).is_some());
}

#[test]
fn adding_and_changing_is_never_held_and_the_first_revision_has_nothing_to_lose() {
    let base = Footprint::of(&samples(), &nodes());
    let mut more = samples();
    more.routing_tables.push(rt("extra", 301));
    more.layer2s[0].spec.mtu = 1500;
    assert_eq!(
        destructive("r1", &base, &Footprint::of(&more, &nodes()), 0),
        None
    );
    let empty = Footprint::of(&RevisionInputs::default(), &nodes());
    assert_eq!(destructive("r0", &empty, &base, 0), None);
    assert_eq!(
        hold_on_creation("rev-1", Sequence(1), &base, None, 0),
        None,
        "no last good revision: nothing to remove"
    );
}

#[test]
fn emptying_selectors_is_held_like_deleting() {
    let base = Footprint::of(&samples(), &nodes());
    let nowhere = Footprint::of(&samples_on_no_node(), &nodes());
    let r = destructive("r1", &base, &nowhere, 100).expect("objects on no node are removed");
    assert_eq!((r.lost, r.nodes), (r.placements, 4), "{r}");
}

#[test]
fn a_revision_cut_is_measured_against_the_last_good_revision_not_the_target() {
    // The last good revision runs the samples; the target (held) is empty. One small table cut now
    // adds to the target but removes everything the nodes run.
    let base = Footprint::of(&samples(), &nodes());
    let small = Footprint::of(&one_small_table(), &nodes());
    let record = hold_on_creation("rev-3", Sequence(3), &small, Some(("rev-1", &base)), 50)
        .expect("created held");
    assert_eq!(record.basis, "sequence 3 against rev-1");
    assert!(
        record
            .summary
            .starts_with("removes 18 of the 18 objects the last good revision rev-1 has"),
        "{}",
        record.summary
    );
}

// ── The step: every way around the hold ──────────────────────────────────────────────────────────────

#[test]
fn deleting_everything_is_held_and_resuming_approves_it() {
    let mut store = fleet_on(&samples());
    add(&mut store, "r2", 2, &RevisionInputs::default());
    let plan = run(&mut store, at(1));
    let message = assert_held(&store, &plan, "r2", "r1");
    assert!(
        message.starts_with("held: it removes 18 of the 18 objects the last good revision r1 has"),
        "{message}"
    );
    assert!(
        plan.events
            .iter()
            .any(|e| e.reason == EventReason::DestructiveChange)
    );
    assert_eq!(
        plan.report
            .waiting
            .first()
            .map(|w| matches!(w, WaitingOn::Held { .. })),
        Some(true),
        "{:?}",
        plan.report.waiting
    );
    // Nothing moves however long it waits.
    assert_eq!(run(&mut store, at(3600)).assignments, vec![]);

    // The admin resumes it: approved, it rolls out like any revision and becomes the baseline.
    store.revision("r2").paused = false;
    let plan = run(&mut store, at(3601));
    assert_eq!(moved_to(&plan, "r2").len(), 1, "{plan:#?}");
    assert_eq!(
        paused_condition(&store, "r2").1,
        revision_reasons::NOT_PAUSED,
        "approved: no longer held"
    );
}

#[test]
fn an_edit_while_a_hold_is_pending_is_held_too() {
    // The reported sequence: delete all (held), then apply one small RoutingTable.
    let mut store = fleet_on(&samples());
    add(&mut store, "r2", 2, &RevisionInputs::default());
    run(&mut store, at(1));
    add(&mut store, "r3", 3, &one_small_table());
    let plan = run(&mut store, at(5));
    let message = assert_held(&store, &plan, "r3", "r1");
    assert!(
        message.contains("removes 18 of the 18 objects"),
        "{message}"
    );
    assert_eq!(plan.report.target.as_deref(), Some("r3"));
}

#[test]
fn approving_one_hold_approves_nothing_else() {
    // r2 is approved; before it completes an edit cuts r3: measured against r1 again, held again.
    let mut store = fleet_on(&samples());
    add(&mut store, "r2", 2, &RevisionInputs::default());
    run(&mut store, at(1));
    store.revision("r2").paused = false;
    run(&mut store, at(2));
    add(&mut store, "r3", 3, &one_small_table());
    let plan = run(&mut store, at(3));
    assert_held(&store, &plan, "r3", "r1");
}

#[test]
fn reactivating_the_empty_first_revision_is_held() {
    // The normal install: an empty first revision completes, then the samples do; deleting every
    // object makes the inputs equal the first revision's again, and the configurator reactivates it.
    let names: Vec<String> = nodes().into_iter().map(|n| n.name).collect();
    let mut store = Store::with_nodes(&names);
    add(&mut store, "r0", 1, &RevisionInputs::default());
    for n in &names {
        store.set_running(n, "r0", T0);
    }
    run(&mut store, T0);
    add(&mut store, "r1", 2, &samples());
    for n in &names {
        store.set_running(n, "r1", at(1));
    }
    run(&mut store, at(1));
    assert_eq!(
        (phase(&store, "r0"), phase(&store, "r1")),
        (
            RevisionPhase::Superseded.as_str().into(),
            RevisionPhase::Complete.as_str().into()
        )
    );
    reactivate(&mut store, "r0", 3);
    let plan = run(&mut store, at(2));
    assert_held(&store, &plan, "r0", "r1");
    assert_eq!(plan.report.last_good.as_deref(), Some("r1"));
}

/// What the configurator's reactivation writes: the next sequence and a fresh rollout in status.
fn reactivate(store: &mut Store, name: &str, sequence: u64) {
    let r = store.revision(name);
    r.sequence = Sequence(sequence);
    r.status.phase = Some(RevisionPhase::Pending.as_str().into());
    r.status.started_at = None;
    r.status.completed_at = None;
    r.status.last_progress_at = None;
}

#[test]
fn an_approval_does_not_survive_a_reactivation() {
    // r2 (empty) was held and approved once, then the inputs went back to r1's before it completed.
    // Deleting everything again reactivates r2 under a new sequence: held again.
    let mut store = fleet_on(&samples());
    add(&mut store, "r2", 2, &RevisionInputs::default());
    run(&mut store, at(1));
    store.revision("r2").paused = false;
    run(&mut store, at(2));
    reactivate(&mut store, "r1", 3);
    run(&mut store, at(3));
    reactivate(&mut store, "r2", 4);
    let plan = run(&mut store, at(4));
    assert_held(&store, &plan, "r2", "r1");
}

#[test]
fn deleting_in_small_steps_is_measured_against_the_last_good_revision() {
    // Each step removes a few objects, cut before the one before it completed: together they remove
    // most of what the nodes run.
    let mut store = fleet_on(&samples());
    add(&mut store, "r2", 2, &samples_without(4));
    let plan = run(&mut store, at(1));
    assert!(!moved_to(&plan, "r2").is_empty(), "a small step rolls out");
    add(&mut store, "r3", 3, &samples_without(8));
    run(&mut store, at(2));
    add(&mut store, "r4", 4, &samples_without(14));
    let plan = run(&mut store, at(3));
    assert_held(&store, &plan, "r4", "r1");
}

#[test]
fn emptying_selectors_is_held_like_deleting_the_objects() {
    let mut store = fleet_on(&samples());
    add(&mut store, "r2", 2, &samples_on_no_node());
    let plan = run(&mut store, at(1));
    assert_held(&store, &plan, "r2", "r1");
}

#[test]
fn undo_to_an_older_revision_is_held_like_any_target() {
    // `kubectl netwave undo --to r0` puts r0's inputs back; the configurator reactivates r0. r0 had
    // a few tables, r1 added the samples: going back removes most of what the nodes run.
    let names: Vec<String> = nodes().into_iter().map(|n| n.name).collect();
    let mut store = Store::with_nodes(&names);
    add(&mut store, "r0", 1, &one_small_table());
    for n in &names {
        store.set_running(n, "r0", T0);
    }
    run(&mut store, T0);
    add(&mut store, "r1", 2, &samples());
    for n in &names {
        store.set_running(n, "r1", at(1));
    }
    run(&mut store, at(1));
    reactivate(&mut store, "r0", 3);
    let plan = run(&mut store, at(2));
    assert_held(&store, &plan, "r0", "r1");
}

#[test]
fn an_approved_revision_once_complete_is_the_new_baseline() {
    let mut store = fleet_on(&samples());
    add(&mut store, "r2", 2, &samples_without(14));
    run(&mut store, at(1));
    store.revision("r2").paused = false;
    for s in 2..20 {
        run(&mut store, at(s));
        let busy: Vec<String> = (store.configs.values())
            .filter(|c| is_in_flight(c))
            .map(|c| c.name.to_string())
            .collect();
        for n in busy {
            store.agent_reports(&n, AgentPhase::Provisioned, None);
        }
    }
    assert_eq!(phase(&store, "r2"), RevisionPhase::Complete.as_str());
    assert_eq!(
        last_good(&store.input().revisions).map(|r| r.name.as_str()),
        Some("r2")
    );
    // A small edit of what r2 has is measured against r2: not held.
    add(&mut store, "r3", 3, &samples_without(15));
    let plan = run(&mut store, at(30));
    assert_eq!(
        plan.assignments
            .first()
            .map(|a| (a.revision.as_str(), a.reason)),
        Some(("r3", AssignReason::Rollout))
    );
}

// ── What the nodes run (#48 item 3) ───────────────────────────────────────────────────────────────

/// The completed r1 re-rendered for every node (a Node label dropped from all of them), with what the
/// configurator measured that moving them takes off them.
fn relabelled(store: &mut Store, lost: u64, items: u64) {
    let names: Vec<String> = nodes().into_iter().map(|n| n.name).collect();
    let hashes: std::collections::BTreeMap<Sym, Sym> = (names.iter())
        .map(|n| {
            (
                Sym::from(n.as_str()),
                Sym::from(format!("relabelled-{n}").as_str()),
            )
        })
        .collect();
    store.rendered.set_revision(Sym::from("r1"), hashes);
    let loss = MoveLoss {
        basis: "rendering 1f2e".into(),
        nodes: names.len(),
        lost,
        items,
        examples: vec![(names[0].clone(), vec!["vrf/blue vni 100".into()])],
    };
    store.move_losses.insert("r1".into(), Arc::new(loss));
}

/// A label change re-renders the completed last good revision and takes everything off the nodes: its
/// inputs did not change, yet it is held like a destructive cut (the nodes keep what they run), and
/// resuming it approves exactly this rendering, through every wave.
#[test]
fn a_label_change_that_takes_what_the_nodes_run_is_held_until_approved() {
    let mut store = fleet_on(&samples());
    relabelled(&mut store, 72, 72);
    let plan = run(&mut store, at(1));
    assert_eq!(
        moved_to(&plan, "r1"),
        Vec::<String>::new(),
        "re-rendered unheld"
    );
    let r = &store.revisions["r1"];
    assert!(r.paused, "spec.paused is set by the hold");
    assert_eq!(r.hold_basis.as_deref(), Some("rendering 1f2e"));
    let (status, reason, message) = paused_condition(&store, "r1");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        (ConditionStatus::True.as_str(), reasons::DESTRUCTIVE_CHANGE)
    );
    assert!(
        message.contains("held: it takes 72 of the 72 items the nodes run off")
            && message.contains("loses vrf/blue vni 100"),
        "{message}"
    );
    assert!(
        plan.events
            .iter()
            .any(|e| e.reason == EventReason::DestructiveChange)
    );
    assert_eq!(run(&mut store, at(3600)).assignments, vec![]);

    store.revision("r1").paused = false;
    let plan = run(&mut store, at(3601));
    let moved = moved_to(&plan, "r1");
    assert!(
        !moved.is_empty() && moved.iter().all(|m| m.ends_with("(Rerender)")),
        "{moved:?}"
    );
    // Later waves of the same rendering stay approved (the measure shrinks as nodes move).
    relabelled(&mut store, 40, 72);
    let plan = run(&mut store, at(3602));
    assert_eq!(
        paused_condition(&store, "r1").1,
        revision_reasons::NOT_PAUSED
    );
    assert!(!store.revisions["r1"].paused, "{plan:#?}");
}

/// A re-rendering that takes less than the threshold's share goes on unheld, as any small edit does.
#[test]
fn a_label_change_that_takes_a_little_is_not_held() {
    let mut store = fleet_on(&samples());
    relabelled(&mut store, 4, 72);
    let plan = run(&mut store, at(1));
    assert!(!moved_to(&plan, "r1").is_empty());
    assert!(!store.revisions["r1"].paused);
}

/// The measure on the samples, as rendered: four compute nodes lose the pool label. Their VRFs and
/// most segments select the pool; the routing table selects every node and stays. 9 of the 12 items
/// each runs go: held at the default threshold.
#[test]
fn dropping_the_pool_label_takes_everything_the_samples_put_on_pooled_nodes() {
    use netwave_core::rollout::loss::{Move, config_items};
    let pool = [("node-restriction.kubernetes.io/netwave-pool", "compute")];
    let pooled: Vec<NodeInfo> = (0..4).map(|i| node(&format!("n{i}"), &pool)).collect();
    let bare: Vec<NodeInfo> = (0..4).map(|i| node(&format!("n{i}"), &[])).collect();
    let before = netwave_core::render::render(&samples(), &pooled).unwrap();
    let after = netwave_core::render::render(&samples(), &bare).unwrap();
    let items = |r: &std::collections::BTreeMap<String, netwave_core::render::RenderedNode>,
                 n: &str| { config_items(&r[n].config()) };
    let runs: Vec<_> = (0..4).map(|i| items(&before, &format!("n{i}"))).collect();
    let gets: Vec<_> = (0..4).map(|i| items(&after, &format!("n{i}"))).collect();
    let total: u64 = runs.iter().map(|s| s.len() as u64).sum();
    let names: Vec<String> = (0..4).map(|i| format!("n{i}")).collect();
    let moves = (0..4).map(|i| Move {
        node: &names[i],
        runs: &runs[i],
        gets: &gets[i],
    });
    let loss = MoveLoss::measure("r".into(), total, moves);
    assert_eq!((loss.nodes, loss.lost, loss.items), (4, 36, 48), "{loss}");
    assert!(loss.exceeds(hold::DEFAULT_DESTRUCTIVE_THRESHOLD), "{loss}");
    assert!(
        loss.to_string()
            .contains("n0 loses vrf/cluster vni 2001000"),
        "{loss}"
    );
}
