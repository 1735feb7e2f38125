//! Table tests for the rollout rules of DESIGN.md §3, one test per rule, named after it. Every step in
//! these tests goes through `run`, which also checks that stepping again over the applied plan plans
//! nothing (the configurator relies on that to avoid hot loops).

mod support_step;

use netwave_api::vocab::{
    ConditionStatus, NodeReason, RevisionCondition, RevisionPhase, node_reasons,
};
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use netwave_api::{Canary, NetworkConfigRevisionStatus, RolloutPolicy};
use netwave_core::Timestamp;
use netwave_core::rollout::{
    AgentPhase, AgentReport, AssignReason, AssignedSpec, Budget, EventReason, NodeConfigState,
    Plan, REASON_APPLY_TIMEOUT, REASON_PICKUP_TIMEOUT, WaitingOn, is_in_flight, reasons, step,
};
use netwave_core::sim::Store;
use support_step::run;

const T0: Timestamp = Timestamp(1_700_000_000_000);

fn at(secs: u64) -> Timestamp {
    T0.plus_secs(secs)
}

fn names(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("node-{i:02}")).collect()
}

fn assigned(plan: &Plan) -> Vec<(&str, &str, AssignReason)> {
    plan.assignments
        .iter()
        .map(|a| (a.node.as_str(), a.revision.as_str(), a.reason))
        .collect()
}

fn status<'s>(store: &'s Store, rev: &str) -> &'s NetworkConfigRevisionStatus {
    &store.revisions[rev].status
}

fn phase(store: &Store, rev: &str) -> String {
    status(store, rev).phase.clone().unwrap_or_default()
}

fn condition(store: &Store, rev: &str, type_: &str) -> (String, String) {
    let c = status(store, rev)
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("{rev} has no {type_} condition"));
    (c.status.clone(), c.reason.clone())
}

fn event_reasons(plan: &Plan) -> Vec<EventReason> {
    plan.events.iter().map(|e| e.reason).collect()
}

/// Every agent whose spec is not what it reports finishes successfully.
fn agents_succeed(store: &mut Store) {
    let pending: Vec<String> = store
        .configs
        .values()
        .filter(|c| {
            is_in_flight(c) || c.status.observed_revision.as_deref() != Some(&c.spec.revision)
        })
        .map(|c| c.name.to_string())
        .collect();
    for n in pending {
        store.agent_reports(&n, AgentPhase::Provisioned, None);
    }
}

fn in_flight(store: &Store) -> usize {
    store
        .configs
        .values()
        .filter(|c| store.nodes.contains_key(c.name.as_str()) && is_in_flight(c))
        .count()
}

/// A fleet of `n` nodes all running a completed `r1`.
fn fleet_on_r1(n: usize) -> Store {
    let mut store = Store::with_nodes(&names(n));
    store.add_revision("r1", 1);
    for node in names(n) {
        store.set_running(&node, "r1", T0);
    }
    run(&mut store, T0);
    assert_eq!(phase(&store, "r1"), RevisionPhase::Complete.as_str());
    store
}

fn on_revision(store: &Store, rev: &str) -> Vec<String> {
    store
        .configs
        .values()
        .filter(|c| c.spec.revision == rev)
        .map(|c| c.name.to_string())
        .collect()
}

#[test]
fn target_is_the_newest_revision_that_is_not_failed() {
    let mut store = fleet_on_r1(3);
    store.add_revision("r2", 2);
    store.add_revision("r3", 3).status.phase = Some(RevisionPhase::Failed.as_str().into());
    store.revision("r3").status.observed_retry = Some(0);
    let plan = run(&mut store, at(1));
    assert_eq!(plan.report.target.as_deref(), Some("r2"));
    assert_eq!(plan.report.last_good.as_deref(), Some("r1"));
    assert_eq!(assigned(&plan), [("node-01", "r2", AssignReason::Rollout)]);
    assert_eq!(
        phase(&store, "r3"),
        RevisionPhase::Failed.as_str(),
        "a failed revision stays failed"
    );
}

#[test]
fn validation_failure_fails_the_revision_with_errors_in_status_and_touches_no_node() {
    let mut store = fleet_on_r1(3);
    store.add_revision("r2", 2).validation.errors = vec!["VNI 100 used by vrf a and l2 b".into()];
    store.revision("r2").validation.warnings = vec!["MTU 1500 is tight".into()];
    let plan = run(&mut store, at(1));
    assert!(
        plan.assignments.is_empty(),
        "a revision that fails validation touches no node"
    );
    assert_eq!(phase(&store, "r2"), RevisionPhase::Failed.as_str());
    assert_eq!(
        status(&store, "r2").validation.errors,
        ["VNI 100 used by vrf a and l2 b"]
    );
    assert_eq!(
        condition(&store, "r2", RevisionCondition::Validated.as_str()),
        (
            ConditionStatus::False.as_str().into(),
            reasons::VALIDATION_FAILED.into()
        )
    );
    assert!(event_reasons(&plan).contains(&EventReason::ValidationFailed));
    assert_eq!(plan.report.target.as_deref(), Some("r1"));
    assert!(on_revision(&store, "r2").is_empty());
}

#[test]
fn updated_needs_spec_observed_revision_and_provisioned_stale_status_never_counts() {
    let mut store = fleet_on_r1(2);
    store.add_revision("r2", 2);
    // node-01: spec r2 but its agent still reports Provisioned for r1 (stale): not updated.
    store.set_assigned("node-01", "r2", at(1));
    // node-02: spec r2, agent reports r2 but only Provisioning: not updated.
    store.set_assigned("node-02", "r2", at(1));
    store
        .configs
        .get_mut("node-02")
        .unwrap()
        .status
        .observed_revision = Some("r2".into());
    store.configs.get_mut("node-02").unwrap().status.phase = Some(AgentPhase::Provisioning);
    run(&mut store, at(2));
    assert_eq!(status(&store, "r2").updated, 0);
    assert_eq!(status(&store, "r2").in_progress, 2);
    store.agent_reports("node-01", AgentPhase::Provisioned, None);
    run(&mut store, at(3));
    assert_eq!(status(&store, "r2").updated, 1);
}

#[test]
fn budget_counts_all_in_flight_nodes_whatever_revision() {
    let mut store = fleet_on_r1(6);
    store.add_revision("r2", 2).policy.max_unavailable = Some(IntOrString::Int(2));
    // node-06 is still moving to an old revision and has gone Not Ready: it is in flight all the same.
    store.add_revision("r0", 0);
    store.set_assigned("node-06", "r0", T0);
    store.node("node-06").ready = false;
    let plan = run(&mut store, at(1));
    assert_eq!(
        assigned(&plan),
        [("node-01", "r2", AssignReason::Rollout)],
        "one slot of two is taken by node-06 moving to another revision"
    );
    assert_eq!(plan.report.in_flight, 2);
    assert!(plan.report.waiting.contains(&WaitingOn::Budget {
        in_flight: 2,
        budget: 2
    }));
}

#[test]
fn max_unavailable_is_a_count_or_a_percentage_of_eligible_nodes() {
    for (value, fleet, expect) in [
        (IntOrString::Int(3), 10, 3),
        (IntOrString::String("25%".into()), 10, 2),
        (IntOrString::String("10%".into()), 5, 1),
        (IntOrString::String("100%".into()), 4, 4),
    ] {
        let mut store = fleet_on_r1(fleet);
        store.add_revision("r2", 2).policy.max_unavailable = Some(value.clone());
        let plan = run(&mut store, at(1));
        assert_eq!(
            plan.assignments.len(),
            expect,
            "maxUnavailable {value:?} over {fleet}"
        );
        assert_eq!(plan.report.budget as usize, expect);
    }
    assert_eq!(Budget::Percent(25).of(10), 2);
}

#[test]
fn superseding_a_running_revision_never_exceeds_the_budget() {
    let mut store = fleet_on_r1(5);
    store.add_revision("r2", 2).policy.max_unavailable = Some(IntOrString::Int(2));
    let plan = run(&mut store, at(1));
    assert_eq!(plan.assignments.len(), 2);
    // r3 arrives while node-01 and node-02 are mid-apply of r2.
    store.add_revision("r3", 3).policy.max_unavailable = Some(IntOrString::Int(2));
    let plan = run(&mut store, at(2));
    assert_eq!(phase(&store, "r2"), RevisionPhase::Superseded.as_str());
    assert!(
        in_flight(&store) <= 2,
        "never more than maxUnavailable in flight"
    );
    // The nodes already in flight move on to r3 without taking new slots; nobody else starts.
    assert_eq!(
        assigned(&plan),
        [
            ("node-01", "r3", AssignReason::Rollout),
            ("node-02", "r3", AssignReason::Rollout)
        ]
    );
    assert!(event_reasons(&plan).contains(&EventReason::RevisionSuperseded));
}

#[test]
fn not_ready_and_cordoned_nodes_are_skipped_without_budget_and_get_the_target_later() {
    let mut store = fleet_on_r1(4);
    store.node("node-01").ready = false;
    store.node("node-02").unschedulable = true;
    store.add_revision("r2", 2).policy.max_unavailable = Some(IntOrString::Int(4));
    let plan = run(&mut store, at(1));
    assert_eq!(
        assigned(&plan),
        [
            ("node-03", "r2", AssignReason::Rollout),
            ("node-04", "r2", AssignReason::Rollout)
        ]
    );
    assert_eq!(status(&store, "r2").skipped, 2);
    assert!(plan.report.waiting.contains(&WaitingOn::NotReady {
        count: 2,
        first: vec!["node-01".into(), "node-02".into()]
    }));
    agents_succeed(&mut store);
    let plan = run(&mut store, at(2));
    assert!(plan.assignments.is_empty());
    assert_eq!(
        phase(&store, "r2"),
        RevisionPhase::Complete.as_str(),
        "skipped nodes never block completion"
    );
    store.node("node-01").ready = true;
    store.node("node-02").unschedulable = false;
    let plan = run(&mut store, at(3));
    assert_eq!(
        assigned(&plan),
        [
            ("node-01", "r2", AssignReason::Rollout),
            ("node-02", "r2", AssignReason::Rollout)
        ]
    );
}

#[test]
fn a_node_that_leaves_is_forgotten_never_a_failure() {
    let mut store = fleet_on_r1(3);
    store.add_revision("r2", 2);
    run(&mut store, at(1)); // node-01 gets r2 and never reports
    store.nodes.remove("node-01");
    let plan = run(&mut store, at(1000)); // long past the apply timeout
    assert_eq!(plan.delete_configs, ["node-01"]);
    assert!(status(&store, "r2").failed_nodes.is_empty());
    assert_eq!(phase(&store, "r2"), RevisionPhase::Progressing.as_str());
    assert_eq!(assigned(&plan), [("node-02", "r2", AssignReason::Rollout)]);
}

#[test]
fn new_nodes_get_the_last_good_revision_until_the_target_has_an_updated_node() {
    let mut store = fleet_on_r1(3);
    store.add_revision("r2", 2).policy.max_unavailable = Some(IntOrString::Int(3));
    store.revision("r2").policy.canary = Some(Canary {
        count: Some(1),
        bake_seconds: 0,
        selector: None,
    });
    run(&mut store, at(1)); // canary node-01 gets r2
    store.add_node("node-00", BTreeMap::new());
    let plan = run(&mut store, at(2));
    assert_eq!(assigned(&plan), [("node-00", "r1", AssignReason::NewNode)]);
    assert!(
        plan.assignments[0].create,
        "a node without a config gets one created"
    );
    store.agent_reports("node-01", AgentPhase::Provisioned, None);
    store.agent_reports("node-00", AgentPhase::Provisioned, None);
    store.add_node("node-10", BTreeMap::new());
    let plan = run(&mut store, at(3));
    let got = assigned(&plan);
    assert!(
        got.contains(&("node-10", "r2", AssignReason::NewNode)),
        "{got:?}"
    );
}

#[test]
fn failure_is_invalid_for_the_assigned_revision_and_retry() {
    let mut store = fleet_on_r1(3);
    store.add_revision("r2", 2).policy.max_failures = Some(2);
    run(&mut store, at(1));
    // Invalid about another revision (stale report) is not a failure of r2.
    let cfg = store.configs.get_mut("node-01").unwrap();
    cfg.status.phase = Some(AgentPhase::Invalid);
    cfg.status.observed_revision = Some("r1".into());
    run(&mut store, at(2));
    assert!(status(&store, "r2").failed_nodes.is_empty());
    // Invalid for r2 at retry 0 is.
    store.agent_reports(
        "node-01",
        AgentPhase::Invalid,
        Some(NodeReason::HealthCheckFailed.as_str()),
    );
    let plan = run(&mut store, at(3));
    let failed = &status(&store, "r2").failed_nodes;
    assert_eq!(failed.len(), 1);
    assert_eq!(
        (failed[0].node.as_str(), failed[0].reason.as_str()),
        ("node-01", NodeReason::HealthCheckFailed.as_str())
    );
    assert!(event_reasons(&plan).contains(&EventReason::NodeFailed));
    // Under maxFailures: the node goes back to the last good revision; the rollout goes on.
    assert!(assigned(&plan).contains(&("node-01", "r1", AssignReason::Rollback)));
    assert_eq!(phase(&store, "r2"), RevisionPhase::Progressing.as_str());
}

#[test]
fn a_spec_refused_as_tampered_is_no_failure_but_the_apply_timeout_still_runs() {
    let mut store = fleet_on_r1(3);
    let r2 = store.add_revision("r2", 2);
    r2.policy.max_failures = Some(1);
    r2.policy.apply_timeout_seconds = Some(60);
    run(&mut store, at(100));
    // Someone edited node-01's spec by hand; its agent refused it without touching the kernel.
    store.agent_reports(
        "node-01",
        AgentPhase::Invalid,
        Some(netwave_api::REASON_CONFIG_TAMPERED),
    );
    let plan = run(&mut store, at(101));
    assert!(status(&store, "r2").failed_nodes.is_empty());
    assert_eq!(phase(&store, "r2"), RevisionPhase::Progressing.as_str());
    assert!(!event_reasons(&plan).contains(&EventReason::NodeFailed));
    // Never put back: after the pickup deadline (the apply timeout, by default) the node is a failure
    // like any node whose agent never starts.
    run(&mut store, at(160));
    let failed = &status(&store, "r2").failed_nodes;
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].reason, REASON_PICKUP_TIMEOUT);
}

/// A node whose agent refuses every apply because its last good backup is corrupt cannot take the
/// revision: unlike a tampered spec, that is a failure at once (the revision fails at maxFailures and
/// the node is not moved on to newer configs silently).
#[test]
fn a_node_refusing_for_a_corrupt_backup_fails_the_revision() {
    let mut store = fleet_on_r1(3);
    store.add_revision("r2", 2).policy.max_failures = Some(1);
    run(&mut store, at(1));
    store.agent_reports(
        "node-01",
        AgentPhase::Invalid,
        Some(netwave_api::vocab::node_reasons::BACKUP_CORRUPT),
    );
    let plan = run(&mut store, at(2));
    let failed = &status(&store, "r2").failed_nodes;
    assert_eq!(
        (failed[0].node.as_str(), failed[0].reason.as_str()),
        ("node-01", node_reasons::BACKUP_CORRUPT)
    );
    assert_eq!(phase(&store, "r2"), RevisionPhase::Failed.as_str());
    assert!(event_reasons(&plan).contains(&EventReason::NodeFailed));
}

#[test]
fn failure_of_a_node_whose_agent_never_starts_is_a_pickup_timeout_counted_from_assignment() {
    let mut store = fleet_on_r1(3);
    store.add_revision("r2", 2).policy.apply_timeout_seconds = Some(60);
    let plan = run(&mut store, at(100));
    assert_eq!(
        plan.report.requeue_at,
        Some(at(160)),
        "requeue when the pickup deadline (the apply timeout by default) passes"
    );
    run(&mut store, at(159));
    assert!(status(&store, "r2").failed_nodes.is_empty());
    let plan = run(&mut store, at(160));
    let failed = &status(&store, "r2").failed_nodes;
    assert_eq!(failed[0].reason, REASON_PICKUP_TIMEOUT);
    assert!(
        failed[0].message.contains("did not start applying")
            && failed[0].message.contains("pickupTimeoutSeconds"),
        "{}",
        failed[0].message
    );
    assert_eq!(phase(&store, "r2"), RevisionPhase::Failed.as_str());
    assert_eq!(assigned(&plan), [("node-01", "r1", AssignReason::Rollback)]);
}

/// The apply timeout measures the agent's work, not the API server's latency (#28): it counts from the
/// agent's start of this attempt (its `Provisioning` report), and a node whose agent never starts
/// fails by the pickup deadline, counted from the assignment. Each row: node-01 is assigned r2 at 100
/// (applyTimeoutSeconds 60, pickupTimeoutSeconds 120); its agent starts at `starts` by its clock (the
/// configurator sees that report at `seen`) and reports Provisioned at `done`; the step at `quiet` must
/// find no failure, the step at `check` the `verdict`.
#[test]
fn apply_timeout_counts_from_the_agents_start_and_a_dead_agent_fails_by_the_pickup_deadline() {
    struct Row {
        case: &'static str,
        starts: Option<(u64, u64)>,
        done: Option<u64>,
        quiet: u64,
        check: u64,
        verdict: Option<&'static str>,
    }
    let rows = [
        Row {
            // The API server is slow: the agent sees the assignment at 150 and its Provisioning report
            // reaches the configurator at 170, past assignment + applyTimeout; the apply takes 15 s.
            case: "slow API server, quick apply",
            starts: Some((150, 170)),
            done: Some(185),
            quiet: 170,
            check: 185,
            verdict: None,
        },
        Row {
            case: "agent never starts",
            starts: None,
            done: None,
            quiet: 219,
            check: 220,
            verdict: Some(REASON_PICKUP_TIMEOUT),
        },
        Row {
            case: "agent starts at once and hangs",
            starts: Some((110, 111)),
            done: None,
            quiet: 169,
            check: 170,
            verdict: Some(REASON_APPLY_TIMEOUT),
        },
        Row {
            // An agent clock running far ahead cannot push the deadline past pickup + apply.
            case: "agent clock an hour ahead, hangs",
            starts: Some((3_700, 111)),
            done: None,
            quiet: 279,
            check: 280,
            verdict: Some(REASON_APPLY_TIMEOUT),
        },
    ];
    for row in rows {
        let mut store = fleet_on_r1(3);
        let r2 = store.add_revision("r2", 2);
        r2.policy.apply_timeout_seconds = Some(60);
        r2.policy.pickup_timeout_seconds = Some(120);
        run(&mut store, at(100));
        assert_eq!(on_revision(&store, "r2"), ["node-01"], "{}", row.case);
        let mut steps: Vec<u64> = vec![row.quiet, row.check];
        if let Some((_, seen)) = row.starts {
            steps.push(seen);
        }
        steps.sort();
        for t in steps {
            if let Some((starts, seen)) = row.starts
                && t == seen
            {
                store.agent_starts("node-01", at(starts));
            }
            if row.done == Some(t) {
                store.agent_reports("node-01", AgentPhase::Provisioned, None);
            }
            run(&mut store, at(t));
            let failed = &status(&store, "r2").failed_nodes;
            if t < row.check {
                assert!(failed.is_empty(), "{} at {t}: {failed:?}", row.case);
                continue;
            }
            assert_eq!(
                failed.first().map(|f| f.reason.as_str()),
                row.verdict,
                "{} at {t}: {failed:?}",
                row.case
            );
        }
        if row.verdict.is_none() {
            assert_eq!(
                phase(&store, "r2"),
                RevisionPhase::Progressing.as_str(),
                "{}",
                row.case
            );
            assert!(
                store
                    .config("node-01")
                    .is_some_and(|c| c.status.phase == Some(AgentPhase::Provisioned)
                        && c.spec.revision == "r2"),
                "{}",
                row.case
            );
        }
    }
}

/// Once the agent's start is seen, the step wakes at its apply deadline, not at the assignment's.
#[test]
fn the_step_wakes_at_the_apply_deadline_counted_from_the_agents_start() {
    let mut store = fleet_on_r1(3);
    let r2 = store.add_revision("r2", 2);
    r2.policy.apply_timeout_seconds = Some(60);
    r2.policy.pickup_timeout_seconds = Some(120);
    let plan = run(&mut store, at(100));
    assert_eq!(plan.report.requeue_at, Some(at(220)), "the pickup deadline");
    store.agent_starts("node-01", at(130));
    let plan = step(&store.input(), at(131));
    assert_eq!(
        plan.report.requeue_at,
        Some(at(190)),
        "start + applyTimeout"
    );
}

#[test]
fn failing_nodes_go_back_to_the_previous_last_good_revision_even_when_the_target_completes() {
    // The last node still applying r2 fails it, under maxFailures: its failure is what lets r2 complete
    // in the same step. r2 becomes the last good revision, but node-01 goes back to r1 — the last good
    // revision when it failed, and the one its agent restored — never to r2, which failed on it and is
    // not retried on it automatically (proptest regression 443a238a).
    for (case, fail) in [("invalid report", true), ("apply timeout", false)] {
        let mut store = fleet_on_r1(3);
        store.defaults.revision_history_limit = 1;
        let r2 = store.add_revision("r2", 2);
        r2.policy.max_failures = Some(2);
        r2.policy.max_unavailable = Some(IntOrString::Int(3));
        r2.policy.apply_timeout_seconds = Some(60);
        run(&mut store, at(1));
        assert_eq!(on_revision(&store, "r2").len(), 3, "{case}");
        store.agent_reports("node-02", AgentPhase::Provisioned, None);
        store.agent_reports("node-03", AgentPhase::Provisioned, None);
        if fail {
            store.agent_reports(
                "node-01",
                AgentPhase::Invalid,
                Some(NodeReason::ApplyFailed.as_str()),
            );
        }
        let plan = run(&mut store, at(61));
        assert_eq!(
            assigned(&plan),
            [("node-01", "r1", AssignReason::Rollback)],
            "{case}"
        );
        assert_eq!(
            phase(&store, "r2"),
            RevisionPhase::Complete.as_str(),
            "{case}"
        );
        assert_eq!(
            condition(&store, "r2", RevisionCondition::Degraded.as_str()).0,
            ConditionStatus::True.as_str(),
            "{case}"
        );
        assert_eq!(plan.report.last_good.as_deref(), Some("r2"), "{case}");
        // Later steps leave node-01 on r1 (and keep r1, which it references, past the history limit).
        for t in 62..66 {
            agents_succeed(&mut store);
            let plan = run(&mut store, at(t));
            assert!(plan.assignments.is_empty(), "{case}: {plan:#?}");
        }
        assert_eq!(on_revision(&store, "r1"), ["node-01"], "{case}");
        // Only the last good revision reads Complete; r1 completed before r2 did.
        assert_eq!(
            phase(&store, "r1"),
            RevisionPhase::Superseded.as_str(),
            "{case}"
        );
        assert!(status(&store, "r1").completed_at.is_some(), "{case}");
    }
}

#[test]
fn max_failures_fails_the_revision_and_rolls_every_touched_node_back_under_the_budget() {
    let mut store = fleet_on_r1(6);
    store.add_revision("r2", 2).policy.max_unavailable = Some(IntOrString::Int(2));
    run(&mut store, at(1));
    agents_succeed(&mut store); // node-01, node-02 updated
    run(&mut store, at(2)); // node-03, node-04 assigned
    store.agent_reports(
        "node-03",
        AgentPhase::Invalid,
        Some(NodeReason::ApplyFailed.as_str()),
    );
    let plan = run(&mut store, at(3));
    assert_eq!(phase(&store, "r2"), RevisionPhase::Failed.as_str());
    assert_eq!(
        condition(&store, "r2", RevisionCondition::Progressing.as_str()),
        (
            ConditionStatus::False.as_str().into(),
            reasons::MAX_FAILURES_REACHED.into()
        )
    );
    let reasons_ = event_reasons(&plan);
    assert!(reasons_.contains(&EventReason::RevisionFailed));
    assert!(reasons_.contains(&EventReason::RollbackStarted));
    // node-03 failed and already runs its restored r1 config, node-04 is in flight anyway: both move
    // back for free. node-01/02 run the failed revision and need budget: one slot is left.
    assert_eq!(
        assigned(&plan),
        [
            ("node-03", "r1", AssignReason::Rollback),
            ("node-04", "r1", AssignReason::Rollback),
            ("node-01", "r1", AssignReason::Rollback)
        ]
    );
    assert!(in_flight(&store) <= 2);
    for t in 4..10 {
        agents_succeed(&mut store);
        run(&mut store, at(t));
        assert!(in_flight(&store) <= 2);
    }
    assert!(
        on_revision(&store, "r2").is_empty(),
        "every touched node ends on the last good revision"
    );
    assert_eq!(on_revision(&store, "r1").len(), 6);
}

#[test]
fn a_failed_revision_is_never_retried_automatically_and_spec_retry_rearms_it() {
    let mut store = fleet_on_r1(2);
    store.add_revision("r2", 2);
    run(&mut store, at(1));
    store.agent_reports(
        "node-01",
        AgentPhase::Invalid,
        Some(NodeReason::ApplyFailed.as_str()),
    );
    run(&mut store, at(2));
    assert_eq!(phase(&store, "r2"), RevisionPhase::Failed.as_str());
    for t in 3..6 {
        agents_succeed(&mut store);
        let plan = run(&mut store, at(t * 1000));
        assert!(
            plan.assignments.iter().all(|a| a.revision != "r2"),
            "never retried automatically"
        );
    }
    store.revision("r2").retry = 1;
    let plan = run(&mut store, at(6000));
    assert!(event_reasons(&plan).contains(&EventReason::RetryStarted));
    assert_eq!(phase(&store, "r2"), RevisionPhase::Progressing.as_str());
    assert!(status(&store, "r2").failed_nodes.is_empty());
    assert_eq!(status(&store, "r2").observed_retry, Some(1));
    assert_eq!(plan.assignments.len(), 1);
    assert_eq!(
        (
            plan.assignments[0].revision.as_str(),
            plan.assignments[0].retry
        ),
        ("r2", 1)
    );
}

#[test]
fn with_no_last_good_revision_nothing_more_is_assigned_and_status_says_so() {
    let mut store = Store::with_nodes(&names(3));
    store.add_revision("r1", 1);
    let plan = run(&mut store, T0);
    assert_eq!(assigned(&plan), [("node-01", "r1", AssignReason::Rollout)]);
    store.agent_reports(
        "node-01",
        AgentPhase::Invalid,
        Some(NodeReason::KernelUnsupported.as_str()),
    );
    let plan = run(&mut store, at(1));
    assert_eq!(phase(&store, "r1"), RevisionPhase::Failed.as_str());
    assert!(plan.assignments.is_empty());
    assert!(event_reasons(&plan).contains(&EventReason::NoLastGoodRevision));
    let message = status(&store, "r1").message.clone().unwrap();
    assert!(
        message.contains("no revision has ever completed"),
        "{message}"
    );
    assert!(plan.report.waiting.contains(&WaitingOn::NoLastGood {
        failed: "r1".into()
    }));
    store.add_node("node-04", BTreeMap::new());
    assert!(
        run(&mut store, at(2)).assignments.is_empty(),
        "not even new nodes"
    );
}

#[test]
fn fail_forward_a_newer_revision_becomes_the_target_without_cleanup() {
    let mut store = fleet_on_r1(4);
    store.add_revision("r2", 2).policy.max_unavailable = Some(IntOrString::Int(2));
    run(&mut store, at(1));
    store.agent_reports(
        "node-01",
        AgentPhase::Invalid,
        Some(NodeReason::ApplyFailed.as_str()),
    );
    run(&mut store, at(2));
    assert_eq!(phase(&store, "r2"), RevisionPhase::Failed.as_str());
    // The admin fixes the inputs before the rollback finished.
    store.add_revision("r3", 3).policy.max_unavailable = Some(IntOrString::Int(2));
    let plan = run(&mut store, at(3));
    assert_eq!(plan.report.target.as_deref(), Some("r3"));
    for t in 4..12 {
        agents_succeed(&mut store);
        run(&mut store, at(t));
    }
    assert_eq!(on_revision(&store, "r3").len(), 4);
    assert_eq!(phase(&store, "r3"), RevisionPhase::Complete.as_str());
    assert_eq!(phase(&store, "r2"), RevisionPhase::Failed.as_str());
}

fn labelled(store: &mut Store, name: &str, zone: &str) {
    store.add_node(
        name,
        BTreeMap::from([("zone".to_string(), zone.to_string())]),
    );
}

#[test]
fn order_is_canaries_then_bake_then_failure_domains_round_robin_then_name() {
    let mut store = Store::default();
    for (n, z) in [
        ("a1", "a"),
        ("a2", "a"),
        ("a3", "a"),
        ("b1", "b"),
        ("b2", "b"),
        ("c1", "c"),
    ] {
        labelled(&mut store, n, z);
    }
    store.add_revision("r1", 1);
    for n in ["a1", "a2", "a3", "b1", "b2", "c1"] {
        store.set_running(n, "r1", T0);
    }
    let r2 = store.add_revision("r2", 2);
    r2.policy = RolloutPolicy {
        max_unavailable: Some(IntOrString::Int(1)),
        topology_key: Some("zone".into()),
        canary: Some(Canary {
            count: None,
            selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([("zone".into(), "b".into())])),
                ..LabelSelector::default()
            }),
            bake_seconds: 30,
        }),
        ..RolloutPolicy::default()
    };
    let mut order = Vec::new();
    let mut t = 1;
    let mut bake_seen = None;
    while order.len() < 6 && t < 200 {
        let plan = run(&mut store, at(t));
        for a in &plan.assignments {
            order.push(a.node.clone());
        }
        for w in &plan.report.waiting {
            if let WaitingOn::CanaryBake { until } = w {
                bake_seen = Some(*until);
            }
        }
        agents_succeed(&mut store);
        t += 1;
    }
    assert_eq!(order, ["b1", "b2", "a1", "c1", "a2", "a3"]);
    let bake_until = bake_seen.expect("the rollout waited for the bake");
    // b2 was updated before the step at t=3 noticed: the bake runs 30s from then.
    assert_eq!(bake_until, at(33));
    let started_rest = store.configs["a1"].spec.assigned_at.unwrap();
    assert!(
        started_rest >= bake_until,
        "nobody else starts before the bake ends"
    );
}

#[test]
fn canary_count_takes_the_first_nodes_in_order_and_nobody_else_moves_until_they_are_updated() {
    let mut store = fleet_on_r1(5);
    store.add_revision("r2", 2).policy = RolloutPolicy {
        max_unavailable: Some(IntOrString::Int(5)),
        canary: Some(Canary {
            count: Some(2),
            selector: None,
            bake_seconds: 0,
        }),
        ..RolloutPolicy::default()
    };
    let plan = run(&mut store, at(1));
    assert_eq!(
        assigned(&plan),
        [
            ("node-01", "r2", AssignReason::Canary),
            ("node-02", "r2", AssignReason::Canary)
        ]
    );
    assert!(
        plan.report
            .waiting
            .contains(&WaitingOn::Canaries { pending: 2 })
    );
    store.agent_reports("node-01", AgentPhase::Provisioned, None);
    assert!(run(&mut store, at(2)).assignments.is_empty());
    store.agent_reports("node-02", AgentPhase::Provisioned, None);
    let plan = run(&mut store, at(3));
    assert!(event_reasons(&plan).contains(&EventReason::CanariesUpdated));
    assert_eq!(plan.assignments.len(), 3);
}

#[test]
fn max_unavailable_per_domain_limits_each_failure_domain() {
    let mut store = Store::default();
    for (n, z) in [
        ("a1", "a"),
        ("a2", "a"),
        ("a3", "a"),
        ("b1", "b"),
        ("b2", "b"),
    ] {
        labelled(&mut store, n, z);
    }
    store.add_revision("r1", 1);
    for n in ["a1", "a2", "a3", "b1", "b2"] {
        store.set_running(n, "r1", T0);
    }
    store.add_revision("r2", 2).policy = RolloutPolicy {
        max_unavailable: Some(IntOrString::Int(10)),
        topology_key: Some("zone".into()),
        max_unavailable_per_domain: Some(IntOrString::Int(1)),
        ..RolloutPolicy::default()
    };
    let plan = run(&mut store, at(1));
    assert_eq!(
        assigned(&plan),
        [
            ("a1", "r2", AssignReason::Rollout),
            ("b1", "r2", AssignReason::Rollout)
        ]
    );
    assert!(plan.report.waiting.iter().any(|w| matches!(
        w,
        WaitingOn::DomainBudget { domain, in_flight: 1, budget: 1 } if domain == "a"
    )));
}

#[test]
fn pause_stops_new_assignments_while_nodes_in_flight_finish() {
    let mut store = fleet_on_r1(4);
    store.add_revision("r2", 2).policy.max_unavailable = Some(IntOrString::Int(2));
    run(&mut store, at(1));
    store.revision("r2").paused = true;
    store.revision("r2").paused_by = Some("kubectl-patch at 2026-11-21T10:03:00Z".into());
    let plan = run(&mut store, at(2));
    assert!(plan.assignments.is_empty());
    assert!(event_reasons(&plan).contains(&EventReason::RolloutPaused));
    assert!(
        plan.events.iter().any(|e| e
            .message
            .contains("set by kubectl-patch at 2026-11-21T10:03:00Z")),
        "the event says who paused"
    );
    assert_eq!(status(&store, "r2").paused_at, Some(at(2).to_time()));
    assert_eq!(
        status(&store, "r2").paused_by.as_deref(),
        Some("kubectl-patch at 2026-11-21T10:03:00Z")
    );
    assert_eq!(
        condition(&store, "r2", RevisionCondition::Paused.as_str()).0,
        ConditionStatus::True.as_str()
    );
    assert!(
        plan.report
            .waiting
            .contains(&WaitingOn::Paused { since: at(2) })
    );
    agents_succeed(&mut store); // in-flight nodes finish
    let plan = run(&mut store, at(3));
    assert!(plan.assignments.is_empty());
    assert_eq!(status(&store, "r2").updated, 2);
    store.revision("r2").paused = false;
    let plan = run(&mut store, at(4));
    assert!(event_reasons(&plan).contains(&EventReason::RolloutResumed));
    assert_eq!(plan.assignments.len(), 2);
    assert_eq!(status(&store, "r2").paused_at, None);
    assert_eq!(status(&store, "r2").paused_by, None);
}

#[test]
fn progress_deadline_sets_progressing_false_with_an_event() {
    let mut store = fleet_on_r1(3);
    store.add_revision("r2", 2).policy = RolloutPolicy {
        progress_deadline_seconds: Some(100),
        apply_timeout_seconds: Some(10_000),
        ..RolloutPolicy::default()
    };
    run(&mut store, at(0));
    let plan = run(&mut store, at(99));
    assert_eq!(plan.report.requeue_at, Some(at(100)));
    assert_eq!(
        condition(&store, "r2", RevisionCondition::Progressing.as_str()).0,
        ConditionStatus::True.as_str()
    );
    let plan = run(&mut store, at(100));
    assert_eq!(
        condition(&store, "r2", RevisionCondition::Progressing.as_str()),
        (
            ConditionStatus::False.as_str().into(),
            reasons::PROGRESS_DEADLINE_EXCEEDED.into()
        )
    );
    assert!(event_reasons(&plan).contains(&EventReason::ProgressDeadlineExceeded));
    assert!(
        run(&mut store, at(150)).is_empty(),
        "the event is emitted once"
    );
    agents_succeed(&mut store);
    run(&mut store, at(151));
    assert_eq!(
        condition(&store, "r2", RevisionCondition::Progressing.as_str()).0,
        ConditionStatus::True.as_str(),
        "progress clears it"
    );
}

#[test]
fn history_keeps_the_limit_and_never_deletes_a_referenced_revision() {
    let mut store = fleet_on_r1(2);
    store.defaults.revision_history_limit = 2;
    for (name, seq) in [("r2", 2), ("r3", 3), ("r4", 4)] {
        store.add_revision(name, seq).validation.errors = vec!["bad".into()];
    }
    store.add_revision("r5", 5);
    // node-02's agent still names r2 as its last good revision.
    store
        .configs
        .get_mut("node-02")
        .unwrap()
        .status
        .last_good_revision = Some("r2".into());
    let plan = run(&mut store, at(1));
    assert_eq!(plan.delete_revisions, ["r3"]);
    assert!(
        store.revisions.contains_key("r1"),
        "r1 is the last good revision and in use"
    );
    assert!(
        store.revisions.contains_key("r2"),
        "referenced by node-02's lastGoodRevision"
    );
}

#[test]
fn fast_path_moves_nodes_with_an_unchanged_config_without_spending_budget() {
    let mut store = fleet_on_r1(4);
    store.add_revision("r2", 2);
    // r2 changes only node-04's config.
    for n in ["node-01", "node-02", "node-03"] {
        store.rendered.insert("r2", n, "cfg-r1");
    }
    let plan = run(&mut store, at(1));
    assert_eq!(
        assigned(&plan),
        [
            ("node-01", "r2", AssignReason::FastPath),
            ("node-02", "r2", AssignReason::FastPath),
            ("node-03", "r2", AssignReason::FastPath),
            ("node-04", "r2", AssignReason::Rollout)
        ]
    );
    assert_eq!(in_flight(&store), 1, "fast-path nodes are not in flight");
    agents_succeed(&mut store);
    run(&mut store, at(2));
    assert_eq!(phase(&store, "r2"), RevisionPhase::Complete.as_str());
}

#[test]
fn leader_failover_resumes_from_api_state_after_any_partial_plan() {
    // One uninterrupted leader vs. leaders killed after each possible number of writes.
    let mut base = fleet_on_r1(5);
    base.add_revision("r2", 2).policy.max_unavailable = Some(IntOrString::Int(2));
    run(&mut base, at(1));
    base.agent_reports(
        "node-01",
        AgentPhase::Invalid,
        Some(NodeReason::ApplyFailed.as_str()),
    );
    let plan = step(&base.input(), at(2));
    assert!(plan.write_count() >= 3);
    let mut whole = base.clone();
    whole.apply_plan(&plan).unwrap();
    for k in 0..plan.write_count() {
        let mut store = base.clone();
        for w in plan.writes().take(k) {
            store.apply(w).unwrap();
        }
        // A new leader steps from what was written. It never reverts and ends where the old one would.
        let next = step(&store.input(), at(2));
        for w in next.writes() {
            store.apply(w).unwrap();
        }
        assert_eq!(store.configs, whole.configs, "after {k} writes");
        assert_eq!(
            store.revisions["r2"].status, whole.revisions["r2"].status,
            "after {k} writes"
        );
    }
}

#[test]
fn events_are_emitted_only_on_transitions() {
    let mut store = fleet_on_r1(2);
    store.add_revision("r2", 2);
    let first = run(&mut store, at(1));
    assert_eq!(
        event_reasons(&first),
        [EventReason::RevisionCreated, EventReason::RolloutStarted]
    );
    for t in 2..5 {
        assert!(run(&mut store, at(t)).events.is_empty());
    }
}

#[test]
fn an_invalid_policy_halts_the_rollout_and_names_the_field() {
    let mut store = fleet_on_r1(2);
    store.add_revision("r2", 2).policy.max_unavailable = Some(IntOrString::String("lots".into()));
    let plan = run(&mut store, at(1));
    assert!(plan.assignments.is_empty());
    assert_eq!(
        condition(&store, "r2", RevisionCondition::Progressing.as_str()),
        (
            ConditionStatus::False.as_str().into(),
            reasons::INVALID_POLICY.into()
        )
    );
    let msg = status(&store, "r2").message.clone().unwrap();
    assert!(msg.contains("spec.rollout.maxUnavailable"), "{msg}");
    assert!(event_reasons(&plan).contains(&EventReason::InvalidPolicy));
}

#[test]
fn a_complete_revision_is_never_failed_by_a_late_node() {
    let mut store = fleet_on_r1(2);
    store.add_node("node-03", BTreeMap::new());
    let plan = run(&mut store, at(1));
    assert_eq!(assigned(&plan), [("node-03", "r1", AssignReason::NewNode)]);
    store.agent_reports(
        "node-03",
        AgentPhase::Invalid,
        Some(NodeReason::KernelUnsupported.as_str()),
    );
    run(&mut store, at(2));
    assert_eq!(phase(&store, "r1"), RevisionPhase::Complete.as_str());
    assert_eq!(
        condition(&store, "r1", RevisionCondition::Degraded.as_str()).0,
        ConditionStatus::True.as_str()
    );
    assert_eq!(on_revision(&store, "r1").len(), 3, "nobody is rolled back");
}

#[test]
fn the_plan_does_not_depend_on_input_order() {
    let mut store = fleet_on_r1(6);
    store.add_revision("r2", 2).policy.max_unavailable = Some(IntOrString::Int(3));
    store.add_revision("r3", 3).validation.errors = vec!["bad".into()];
    store.set_assigned("node-04", "r2", at(1));
    let input = store.input();
    let plan = step(&input, at(5));
    let mut reversed = input.clone();
    std::sync::Arc::make_mut(&mut reversed.nodes).reverse();
    std::sync::Arc::make_mut(&mut reversed.configs).reverse();
    reversed.revisions.reverse();
    assert_eq!(step(&reversed, at(5)), plan);
}

#[test]
fn the_requeue_hint_is_the_bake_end_while_baking() {
    let mut store = fleet_on_r1(3);
    store.add_revision("r2", 2).policy = RolloutPolicy {
        canary: Some(Canary {
            count: Some(1),
            selector: None,
            bake_seconds: 120,
        }),
        apply_timeout_seconds: Some(60),
        progress_deadline_seconds: Some(600),
        ..RolloutPolicy::default()
    };
    let plan = run(&mut store, at(10));
    assert_eq!(
        plan.report.requeue_at,
        Some(at(70)),
        "the canary's apply timeout"
    );
    store.agent_reports("node-01", AgentPhase::Provisioned, None);
    let plan = run(&mut store, at(20));
    assert!(plan.assignments.is_empty());
    assert!(
        plan.report
            .waiting
            .contains(&WaitingOn::CanaryBake { until: at(140) })
    );
    assert_eq!(plan.report.requeue_at, Some(at(140)), "the bake end");
    assert_eq!(
        condition(&store, "r2", RevisionCondition::Progressing.as_str()),
        (
            ConditionStatus::True.as_str().into(),
            reasons::CANARY_BAKE.into()
        )
    );
    let plan = run(&mut store, at(140));
    assert_eq!(
        plan.assignments.len(),
        1,
        "the rollout goes on when the bake ends"
    );
}

#[test]
fn an_empty_or_fully_skipped_fleet_never_exceeds_the_progress_deadline() {
    let mut store = fleet_on_r1(2);
    store.node("node-01").ready = false;
    store.node("node-02").unschedulable = true;
    store.add_revision("r2", 2).policy.progress_deadline_seconds = Some(10);
    run(&mut store, at(1));
    run(&mut store, at(1000));
    assert_ne!(
        condition(&store, "r2", RevisionCondition::Progressing.as_str()).1,
        reasons::PROGRESS_DEADLINE_EXCEEDED,
        "nothing could move: no alert"
    );
    assert_eq!(status(&store, "r2").skipped, 2);
}

/// The inputs go back to an older good revision (#18): the configurator makes it the target again in
/// its status (`activeSequence`, a fresh `Pending`; its spec and `spec.sequence` never change). It reads
/// Progressing until every node runs it again, so `kubectl wait --for=jsonpath={.status.phase}=Complete`
/// returns only then; the revision it replaces stays the last good one meanwhile, and afterwards only
/// the newest complete revision reads Complete, the others Superseded.
#[test]
fn a_reactivated_revision_is_progressing_until_its_nodes_are_back() {
    let mut store = fleet_on_r1(3);
    store.add_revision("r2", 2);
    for t in 1..10 {
        agents_succeed(&mut store);
        run(&mut store, at(t));
    }
    assert_eq!(phase(&store, "r2"), RevisionPhase::Complete.as_str());
    assert_eq!(
        phase(&store, "r1"),
        RevisionPhase::Superseded.as_str(),
        "completed earlier, not the last good"
    );
    let (_, reason) = condition(&store, "r1", RevisionCondition::Progressing.as_str());
    assert_eq!(reason, reasons::SUPERSEDED);
    assert!(status(&store, "r1").completed_at.is_some());
    // Counted against the whole fleet: no node of the 3 runs it any more.
    assert_eq!(
        (status(&store, "r1").total, status(&store, "r1").updated),
        (3, 0)
    );

    // What the configurator's reactivation writes (Intent::ReactivateRevision).
    {
        let r1 = store.revision("r1");
        r1.sequence = netwave_core::types::Sequence(3);
        let st = &mut r1.status;
        st.active_sequence = Some(3);
        st.phase = Some(RevisionPhase::Pending.as_str().into());
        st.started_at = None;
        st.completed_at = None;
        st.last_progress_at = None;
    }
    let plan = run(&mut store, at(20));
    assert_eq!(plan.report.target.as_deref(), Some("r1"));
    assert_eq!(
        plan.report.last_good.as_deref(),
        Some("r2"),
        "where a failure goes back to"
    );
    assert_eq!(phase(&store, "r2"), RevisionPhase::Complete.as_str());
    let mut t = 21;
    while on_revision(&store, "r1").len() < 3
        || store
            .configs
            .values()
            .any(|c| !netwave_core::rollout::is_updated(c, &"r1".into()))
    {
        assert_eq!(
            phase(&store, "r1"),
            RevisionPhase::Progressing.as_str(),
            "not Complete before every node runs it again ({} of 3 assigned)",
            on_revision(&store, "r1").len()
        );
        assert!(t < 60, "the reactivated rollout converges");
        agents_succeed(&mut store);
        run(&mut store, at(t));
        t += 1;
    }
    assert_eq!(phase(&store, "r1"), RevisionPhase::Complete.as_str());
    assert_eq!(status(&store, "r1").updated, 3);
    assert_eq!(phase(&store, "r2"), RevisionPhase::Superseded.as_str());
    assert_eq!(
        store.revisions["r1"].status.active_sequence,
        Some(3),
        "the reactivation stays on record"
    );
}

/// A joining node has nothing of ours running to disrupt (#18): it gets the last good revision at once,
/// even while the budget is full behind a stuck node, instead of waiting up to the apply timeout. It is
/// in flight until its agent reports, so the target's rollout waits for it.
#[test]
fn a_joining_node_gets_the_last_good_revision_without_waiting_for_the_budget() {
    let mut store = fleet_on_r1(3);
    store.add_revision("r2", 2).policy.max_unavailable = Some(IntOrString::Int(1));
    let plan = run(&mut store, at(1));
    assert_eq!(assigned(&plan), [("node-01", "r2", AssignReason::Rollout)]);
    // node-01's agent never answers: the budget (1) is full.
    store.add_node("node-04", BTreeMap::new());
    let plan = run(&mut store, at(2));
    assert_eq!(
        assigned(&plan),
        [("node-04", "r1", AssignReason::NewNode)],
        "the joining node does not wait for the budget"
    );
    assert_eq!(
        plan.report.in_flight, 2,
        "it is in flight until its agent reports"
    );
    // Once it reports, the rollout goes on under the budget as before.
    store.agent_reports("node-04", AgentPhase::Provisioned, None);
    let plan = run(&mut store, at(3));
    assert!(
        plan.assignments.is_empty(),
        "node-01 still holds the slot: {plan:#?}"
    );
    store.agent_reports("node-01", AgentPhase::Provisioned, None);
    let plan = run(&mut store, at(4));
    assert_eq!(plan.assignments.len(), 1, "one at a time: {plan:#?}");
}

/// An agent that reported `Invalid` for a spec is at rest (it restored its last good config); a config
/// re-rendered under the same revision and retry is a new spec it applies, so it is in flight again.
#[test]
fn invalid_is_at_rest_only_for_the_config_it_judged() {
    let config = |hash: &str, observed: Option<&str>| NodeConfigState {
        name: "node-01".into(),
        spec: AssignedSpec {
            revision: "r2".into(),
            config_hash: hash.into(),
            ..AssignedSpec::default()
        },
        status: AgentReport {
            phase: Some(AgentPhase::Invalid),
            observed_revision: Some("r2".into()),
            observed_retry: Some(0),
            observed_config_hash: observed.map(Into::into),
            config_hash: Some("h1".into()),
            ..AgentReport::default()
        },
        ..NodeConfigState::default()
    };
    assert!(!is_in_flight(&config("h2", Some("h2"))));
    // Agents that do not report the judged hash: the revision and retry decide, as before.
    assert!(!is_in_flight(&config("h2", None)));
    assert!(is_in_flight(&config("h2b", Some("h2"))));
}

/// A node whose move to the last good revision can no longer finish — its agent never answered it
/// within that revision's apply timeout — is not waited on forever: it takes the next target (it is in
/// flight already, so that costs no budget), where its apply timeout counts as that revision's failure,
/// and the target completes. Waiting on it left the target `Progressing` with nodes queued for good
/// (#14: the benchmark's second rollout never finished behind the first rollout's silent nodes).
#[test]
fn a_node_silent_on_the_last_good_revision_does_not_hold_up_the_next_target() {
    // The first rollout: node-01's agent never answers, its apply timeout fails it (under maxFailures)
    // and r1 completes without it; with no earlier revision there is nowhere to roll it back to.
    let mut store = Store::with_nodes(&names(3));
    let r1 = store.add_revision("r1", 1);
    r1.policy.max_unavailable = Some(IntOrString::Int(3));
    r1.policy.max_failures = Some(2);
    r1.policy.apply_timeout_seconds = Some(60);
    run(&mut store, T0);
    store.agent_reports("node-02", AgentPhase::Provisioned, None);
    store.agent_reports("node-03", AgentPhase::Provisioned, None);
    run(&mut store, at(60));
    assert_eq!(phase(&store, "r1"), RevisionPhase::Complete.as_str());
    assert_eq!(status(&store, "r1").failed_nodes[0].node, "node-01");
    // The second rollout: every node gets r2, node-01 too.
    let r2 = store.add_revision("r2", 2);
    r2.policy.max_unavailable = Some(IntOrString::Int(3));
    r2.policy.max_failures = Some(2);
    r2.policy.apply_timeout_seconds = Some(60);
    let plan = run(&mut store, at(100));
    assert_eq!(on_revision(&store, "r2").len(), 3, "{plan:#?}");
    store.agent_reports("node-02", AgentPhase::Provisioned, None);
    store.agent_reports("node-03", AgentPhase::Provisioned, None);
    run(&mut store, at(160));
    assert_eq!(phase(&store, "r2"), RevisionPhase::Complete.as_str());
    assert_eq!(status(&store, "r2").failed_nodes[0].node, "node-01");
    assert_eq!(status(&store, "r2").queued, 0);

    // A node that joins gets the last good revision and its agent never answers: after r1's apply
    // timeout it takes the target too; before, it finishes its move to r1 first (a requeue says when).
    let mut store = fleet_on_r1(2);
    store.revision("r1").policy.apply_timeout_seconds = Some(60);
    store.add_node("node-03", BTreeMap::new());
    let plan = run(&mut store, at(1));
    assert_eq!(assigned(&plan), [("node-03", "r1", AssignReason::NewNode)]);
    store.add_revision("r2", 2).policy.max_unavailable = Some(IntOrString::Int(3));
    let plan = run(&mut store, at(2));
    assert_eq!(on_revision(&store, "r2"), ["node-01", "node-02"]);
    assert_eq!(plan.report.requeue_at, Some(at(61)));
    agents_succeed_except(&mut store, "node-03");
    run(&mut store, at(30));
    let plan = run(&mut store, at(61));
    assert_eq!(assigned(&plan), [("node-03", "r2", AssignReason::Rollout)]);
}

/// Like [`agents_succeed`], except `silent`'s agent.
fn agents_succeed_except(store: &mut Store, silent: &str) {
    let pending: Vec<String> = store
        .configs
        .values()
        .filter(|c| c.name != silent && is_in_flight(c))
        .map(|c| c.name.to_string())
        .collect();
    for n in pending {
        store.agent_reports(&n, AgentPhase::Provisioned, None);
    }
}

/// DESIGN.md §6, "One bad object never blinds the fleet": a node whose NodeNetworkConfig the leader
/// cannot decode is a node whose state is unknown. It is skipped (not updated, not failed, never
/// assigned, not in flight even if its stored config is mid-apply, so it holds no budget slot), the
/// others roll on and the target completes; no revision is pruned while it is unknown; once it can be
/// read again it gets the target like any node left for later.
#[test]
fn a_node_whose_config_cannot_be_read_is_skipped_and_the_others_roll_on() {
    let mut store = fleet_on_r1(4);
    store.defaults.revision_history_limit = 1;
    // Stored mid-apply: counted, it would fill the budget of one for good.
    store.set_assigned("node-02", "r1", at(0));
    store.configs.get_mut("node-02").unwrap().status.phase = Some(AgentPhase::Provisioning);
    store.unreadable_configs.insert("node-02".into());
    store.add_revision("r2", 2).policy.max_unavailable = Some(IntOrString::Int(1));
    let mut assigned_nodes = Vec::new();
    for i in 1..=10 {
        let plan = run(&mut store, at(i));
        assigned_nodes.extend(plan.assignments.iter().map(|a| a.node.clone()));
        assert!(plan.delete_revisions.is_empty(), "nothing pruned: {plan:?}");
        agents_succeed(&mut store);
    }
    assert_eq!(assigned_nodes, ["node-01", "node-03", "node-04"]);
    assert_eq!(phase(&store, "r2"), RevisionPhase::Complete.as_str());
    let st = status(&store, "r2");
    assert_eq!((st.updated, st.skipped, st.failed), (3, 1, 0), "{st:?}");
    let plan = step(&store.input(), at(11));
    assert!(
        plan.report.waiting.contains(&WaitingOn::UnreadableConfigs {
            count: 1,
            first: vec!["node-02".into()]
        }),
        "{:?}",
        plan.report.waiting
    );
    assert!(store.revisions.contains_key("r1"), "not pruned");

    // Readable again (an admin fixed its status): the agent finished r1, the node takes r2, and r1
    // (beyond the history limit of one, referenced by nobody) is pruned.
    store.unreadable_configs.clear();
    store.agent_reports("node-02", AgentPhase::Provisioned, None);
    let plan = run(&mut store, at(12));
    assert_eq!(assigned(&plan), [("node-02", "r2", AssignReason::Rollout)]);
    agents_succeed(&mut store);
    let plan = run(&mut store, at(13));
    assert_eq!(plan.delete_revisions, ["r1"]);
}
