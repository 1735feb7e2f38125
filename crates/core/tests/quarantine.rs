//! #27 item 10, one compromised agent's veto: the rules of `rollout::quarantine`, one test per rule.
//! A hostile agent reports `Invalid` for every config it is given (and `Provisioned` for the one it
//! already runs, so rollbacks finish); every other agent applies what it gets. Every step goes through
//! `support_step::run`, which also checks that stepping again over the applied plan plans nothing.

mod support_step;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use netwave_api::vocab::{NodeReason, RevisionPhase};
use netwave_api::{FAILURE_STREAK_ANNOTATION, QUARANTINED_ANNOTATION};
use netwave_core::Timestamp;
use netwave_core::rollout::quarantine::NodeRecord;
use netwave_core::rollout::{AgentPhase, EventReason, Plan, WaitingOn};
use netwave_core::sim::Store;
use support_step::run;

const T0: Timestamp = Timestamp(1_700_000_000_000);
const HOSTILE: &str = "node-01";

fn names() -> Vec<String> {
    (1..=4).map(|i| format!("node-{i:02}")).collect()
}

/// Four nodes on a completed r1; quarantine after `after` failures (off with `None`).
fn fleet(after: Option<u32>) -> (Store, u64) {
    let mut store = Store::with_nodes(&names());
    store.defaults.quarantine_after = after;
    store.add_revision("r1", 1);
    for node in names() {
        store.set_running(&node, "r1", T0);
    }
    run(&mut store, T0);
    (store, 1)
}

/// Every agent answers its spec once: the hostile one `Invalid` for anything it does not run already.
/// Returns whether any answered.
fn agents_answer(store: &mut Store, hostile: Option<&str>) -> bool {
    agents_answer_but(store, hostile, &[])
}

/// [`agents_answer`] by every agent but `silent`'s.
fn agents_answer_but(store: &mut Store, hostile: Option<&str>, silent: &[&str]) -> bool {
    let pending: Vec<(String, AgentPhase)> = store
        .configs
        .values()
        .filter(|c| !silent.contains(&c.name.as_str()))
        .filter(|c| {
            let st = &c.status;
            !(st.observed_revision.as_deref() == Some(c.spec.revision.as_str())
                && st.observed_retry == Some(c.spec.retry)
                && matches!(
                    st.phase,
                    Some(AgentPhase::Provisioned | AgentPhase::Invalid)
                ))
        })
        .map(|c| {
            let runs_it = c.status.config_hash.as_deref() == Some(c.spec.config_hash.as_str());
            let phase = if Some(c.name.as_str()) == hostile && !runs_it {
                AgentPhase::Invalid
            } else {
                AgentPhase::Provisioned
            };
            (c.name.to_string(), phase)
        })
        .collect();
    for (node, phase) in &pending {
        let reason = (*phase == AgentPhase::Invalid).then_some(NodeReason::ApplyFailed.as_str());
        store.agent_reports(node, phase.clone(), reason);
    }
    !pending.is_empty()
}

/// Cuts `rev` (sequence `seq`) and steps, with agents answering (node-01's hostile), until nothing
/// changes; returns the plans.
fn roll(store: &mut Store, t: &mut u64, rev: &str, seq: u64) -> Vec<Plan> {
    roll_with(store, t, rev, seq, Some(HOSTILE))
}

fn roll_with(
    store: &mut Store,
    t: &mut u64,
    rev: &str,
    seq: u64,
    hostile: Option<&str>,
) -> Vec<Plan> {
    store.add_revision(rev, seq);
    let mut plans = Vec::new();
    for _ in 0..60 {
        *t += 1;
        let plan = run(store, T0.plus_secs(*t));
        let answered = agents_answer(store, hostile);
        let done = plan.is_empty() && !answered;
        plans.push(plan);
        if done {
            return plans;
        }
    }
    panic!("{rev} did not settle: {:#?}", store.revisions[rev].status);
}

fn phase(store: &Store, rev: &str) -> String {
    store.revisions[rev]
        .status
        .phase
        .clone()
        .unwrap_or_default()
}

fn on(store: &Store, rev: &str) -> Vec<String> {
    (store.configs.values())
        .filter(|c| c.spec.revision == rev && c.status.observed_revision.as_deref() == Some(rev))
        .filter(|c| c.status.phase == Some(AgentPhase::Provisioned))
        .map(|c| c.name.to_string())
        .collect()
}

fn record(store: &Store, node: &str) -> NodeRecord {
    store.configs[node].record.clone()
}

/// The default (no quarantine policy): one node whose agent reports `Invalid` on everything fails
/// every revision (maxFailures 1), and no other node keeps any change. This is the veto the policy
/// is for, and stays the default: a failing node halting the rollout is the safety.
#[test]
fn without_the_policy_one_node_failing_everything_vetoes_every_revision() {
    let (mut store, mut t) = fleet(None);
    for (k, rev) in ["r2", "r3", "r4"].iter().enumerate() {
        roll(&mut store, &mut t, rev, k as u64 + 2);
        assert_eq!(phase(&store, rev), RevisionPhase::Failed.as_str(), "{rev}");
        assert_eq!(store.revisions[*rev].status.failed_nodes[0].node, HOSTILE);
        assert!(on(&store, rev).is_empty(), "no node keeps {rev}");
    }
    assert_eq!(on(&store, "r1").len(), 4, "the whole fleet stays on r1");
    assert!(
        store
            .configs
            .values()
            .all(|c| c.record == NodeRecord::default()),
        "nothing recorded with the policy off"
    );
}

/// With `afterConsecutiveFailures: 2`: the first failure (node-01 goes first, nobody else has the
/// revision) is no evidence; node-01 then gets each next revision after every other node, fails two
/// that the others provisioned, and is quarantined by the second: that failure does not count, the
/// revision completes without it, and the next one reaches every other node while node-01 stays on
/// its last good config. Said in its record, the failure's flag, an Event and the revision's waits.
#[test]
fn a_node_failing_revisions_others_provisioned_is_quarantined_and_vetoes_no_more() {
    let (mut store, mut t) = fleet(Some(2));
    roll(&mut store, &mut t, "r2", 2);
    assert_eq!(phase(&store, "r2"), RevisionPhase::Failed.as_str());
    assert!(
        on(&store, "r2").is_empty(),
        "node-01 went first: no evidence"
    );
    assert_eq!(record(&store, HOSTILE), NodeRecord::default());

    // A suspect now: r3 reaches the other three first, then node-01, which fails it: counted (r3
    // fails and rolls back, as always), and the first of its streak.
    let plans = roll(&mut store, &mut t, "r3", 3);
    let first = plans
        .iter()
        .flat_map(|p| &p.assignments)
        .find(|a| a.revision == "r3")
        .unwrap();
    assert_ne!(first.node, HOSTILE, "the suspect goes last");
    assert_eq!(phase(&store, "r3"), RevisionPhase::Failed.as_str());
    let streak = &record(&store, HOSTILE).streak;
    assert_eq!(
        streak
            .iter()
            .map(|e| e.revision.as_str())
            .collect::<Vec<_>>(),
        ["r3"]
    );

    // The second: quarantined; r4 goes on without it.
    let plans = roll(&mut store, &mut t, "r4", 4);
    let r = record(&store, HOSTILE);
    let note = r.quarantined.clone().expect("quarantined");
    assert!(r.streak.is_empty(), "the streak did its job");
    assert!(
        note.contains("failed r3, r4 in a row while other nodes provisioned them"),
        "{note}"
    );
    assert_eq!(phase(&store, "r4"), RevisionPhase::Complete.as_str());
    let failed = &store.revisions["r4"].status.failed_nodes;
    assert_eq!(failed.len(), 1);
    assert!(failed[0].node == HOSTILE && failed[0].quarantined);
    assert_eq!(on(&store, "r4").len(), 3);
    assert_eq!(
        store.configs[HOSTILE].spec.revision, "r1",
        "back to its last good"
    );
    let event = plans
        .iter()
        .flat_map(|p| &p.events)
        .find(|e| e.reason == EventReason::NodeQuarantined)
        .expect("a NodeQuarantined Event");
    assert!(
        event.message.contains("does not count") || event.message.contains("no longer count"),
        "{}",
        event.message
    );
    assert!(
        event
            .message
            .contains("kubectl annotate nnc node-01 netwave.dev/quarantined-"),
        "says how to release it: {}",
        event.message
    );
    let annotations: Vec<(&str, Option<String>)> = r.annotations().to_vec();
    assert_eq!(annotations[0], (FAILURE_STREAK_ANNOTATION, None));
    assert_eq!(annotations[1].0, QUARANTINED_ANNOTATION);

    // The next revision reaches every other node; node-01 is skipped and stays on r1.
    let plans = roll(&mut store, &mut t, "r5", 5);
    assert_eq!(phase(&store, "r5"), RevisionPhase::Complete.as_str());
    assert_eq!(on(&store, "r5").len(), 3);
    assert!(
        plans
            .iter()
            .flat_map(|p| &p.assignments)
            .all(|a| a.node != HOSTILE)
    );
    assert_eq!(store.configs[HOSTILE].spec.revision, "r1");
    assert_eq!(store.revisions["r5"].status.skipped, 1);
    let waits: Vec<&WaitingOn> = plans.iter().flat_map(|p| &p.report.waiting).collect();
    assert!(
        waits.iter().any(
            |w| matches!(w, WaitingOn::Quarantined { count: 1, first } if first == &[HOSTILE])
        ),
        "{waits:?}"
    );
}

/// A genuinely bad revision still halts with the policy on: it fails on the first healthy node it
/// meets (maxFailures 1) and rolls back, whoever is quarantined or suspect, and that failure grows no
/// streak.
#[test]
fn a_bad_revision_still_halts_on_a_healthy_node_with_quarantine_on() {
    let (mut store, mut t) = fleet(Some(1));
    // node-01 is quarantined already.
    store.configs.get_mut(HOSTILE).unwrap().record.quarantined = Some("since then".into());
    store.add_revision("bad", 2);
    t += 1;
    let plan = run(&mut store, T0.plus_secs(t));
    let a = &plan.assignments[0];
    assert_eq!((a.node.as_str(), a.revision.as_str()), ("node-02", "bad"));
    store.agent_reports(
        "node-02",
        AgentPhase::Invalid,
        Some(NodeReason::ApplyFailed.as_str()),
    );
    t += 1;
    let plan = run(&mut store, T0.plus_secs(t));
    assert_eq!(
        phase(&store, "bad"),
        RevisionPhase::Failed.as_str(),
        "halted as always"
    );
    let failed = &store.revisions["bad"].status.failed_nodes;
    assert!(failed.len() == 1 && !failed[0].quarantined);
    assert!(
        plan.records.is_empty(),
        "no evidence (nobody runs it): {:?}",
        plan.records
    );
    assert!(
        plan.assignments
            .iter()
            .any(|a| a.node == "node-02" && a.revision == "r1")
    );
}

/// Evidence is another node running the revision and no other node failing it: a failure on a
/// revision another node failed too grows no streak (it may be the revision's fault).
#[test]
fn a_failure_shared_with_another_node_is_no_evidence() {
    let (mut store, mut t) = fleet(Some(1));
    let rev = store.add_revision("r2", 2);
    rev.policy.max_failures = Some(3);
    rev.policy.max_unavailable = Some(IntOrString::Int(4));
    t += 1;
    run(&mut store, T0.plus_secs(t));
    store.agent_reports("node-03", AgentPhase::Provisioned, None);
    store.agent_reports(
        "node-01",
        AgentPhase::Invalid,
        Some(NodeReason::ApplyFailed.as_str()),
    );
    store.agent_reports(
        "node-02",
        AgentPhase::Invalid,
        Some(NodeReason::ApplyFailed.as_str()),
    );
    t += 1;
    let plan = run(&mut store, T0.plus_secs(t));
    assert!(plan.records.is_empty(), "{:?}", plan.records);
    assert!(
        store.revisions["r2"]
            .status
            .failed_nodes
            .iter()
            .all(|f| !f.quarantined),
        "both count"
    );
}

/// A node that provisions a revision newer than its streak is healthy again: the streak is cleared
/// (consecutive means consecutive). With quarantine off nothing is ever written.
#[test]
fn provisioning_a_newer_revision_clears_the_streak() {
    let (mut store, mut t) = fleet(Some(3));
    store.configs.get_mut("node-02").unwrap().record = NodeRecord::from_annotations(Some(
        &[(FAILURE_STREAK_ANNOTATION.to_string(), "r0@0".to_string())].into(),
    ));
    let plans = roll_with(&mut store, &mut t, "r2", 2, None);
    assert_eq!(phase(&store, "r2"), RevisionPhase::Complete.as_str());
    assert_eq!(record(&store, "node-02"), NodeRecord::default());
    let cleared = plans.iter().flat_map(|p| &p.records).collect::<Vec<_>>();
    assert_eq!(cleared.len(), 1, "{cleared:?}");
}

/// Release: an admin removes `netwave.dev/quarantined`. The node is eligible again; it is not given
/// the revision it failed (no node is, automatically), and takes the next one like any node — where
/// its failure counts again (a fresh streak, no evidence yet: it goes first... or last as a suspect).
#[test]
fn a_released_node_takes_the_next_revision_and_counts_again() {
    let (mut store, mut t) = fleet(Some(1));
    store.configs.get_mut(HOSTILE).unwrap().record.quarantined = Some("since then".into());
    roll(&mut store, &mut t, "r2", 2);
    assert_eq!(phase(&store, "r2"), RevisionPhase::Complete.as_str());
    assert_eq!(store.configs[HOSTILE].spec.revision, "r1");
    // Released.
    store.configs.get_mut(HOSTILE).unwrap().record = NodeRecord::default();
    let plans = roll(&mut store, &mut t, "r3", 3);
    let first = plans
        .iter()
        .flat_map(|p| &p.assignments)
        .find(|a| a.revision == "r3")
        .unwrap();
    assert_eq!(first.node, HOSTILE, "no suspect any more: first in order");
    assert_eq!(
        phase(&store, "r3"),
        RevisionPhase::Failed.as_str(),
        "its failure counts again"
    );
}

/// #48 item 2: liars that report `Invalid` on the newest revision as soon as it exists, before their
/// node is given it (what an agent's token can do: it may write its node's status, and it can see the
/// revision's name on other nodes' configs). Honest agents answer their own specs.
fn roll_lying(store: &mut Store, t: &mut u64, rev: &str, seq: u64, liars: &[&str]) -> Vec<Plan> {
    store.add_revision(rev, seq);
    let mut plans = Vec::new();
    for _ in 0..60 {
        for liar in liars {
            let c = store.configs.get_mut(*liar).unwrap();
            c.status.phase = Some(AgentPhase::Invalid);
            c.status.observed_revision = Some(rev.into());
            c.status.observed_retry = Some(0);
            c.status.observed_config_hash = None;
            c.status.reason = Some(NodeReason::ApplyFailed.as_str().to_string());
        }
        *t += 1;
        let plan = run(store, T0.plus_secs(*t));
        let answered = agents_answer_but(store, None, liars);
        let done = plan.is_empty() && !answered;
        plans.push(plan);
        if done {
            return plans;
        }
    }
    panic!("{rev} did not settle: {:#?}", store.revisions[rev].status);
}

fn violations(plans: &[Plan]) -> Vec<String> {
    let events = plans.iter().flat_map(|p| &p.events);
    events
        .filter(|e| e.reason == EventReason::ProtocolViolation)
        .map(|e| e.message.clone())
        .collect()
}

/// Without the policy: a verdict on a revision the node was not given counts for nothing. Each
/// revision completes on the honest nodes; each liar is recorded once per revision as a protocol
/// violation (flagged, an Event), is not given the revision and keeps what it runs.
#[test]
fn two_agents_reporting_on_revisions_they_were_not_given_veto_nothing() {
    let liars = ["node-01", "node-03"];
    let (mut store, mut t) = fleet(None);
    for (k, rev) in ["r2", "r3", "r4"].iter().enumerate() {
        let plans = roll_lying(&mut store, &mut t, rev, k as u64 + 2, &liars);
        assert_eq!(
            phase(&store, rev),
            RevisionPhase::Complete.as_str(),
            "{rev}"
        );
        assert_eq!(on(&store, rev), ["node-02", "node-04"]);
        let failed = &store.revisions[*rev].status.failed_nodes;
        let flagged: Vec<(&str, &str, bool)> = failed
            .iter()
            .map(|f| (f.node.as_str(), f.reason.as_str(), f.quarantined))
            .collect();
        assert_eq!(
            flagged,
            [
                ("node-01", "ProtocolViolation", true),
                ("node-03", "ProtocolViolation", true)
            ]
        );
        let events = violations(&plans);
        assert_eq!(
            events.len(),
            2,
            "one Event per liar and revision: {events:?}"
        );
        assert!(
            events[0].contains(&format!("reported Invalid for {rev}")) && events[0].contains("r1"),
            "{}",
            events[0]
        );
        for liar in liars {
            assert_eq!(store.configs[liar].spec.revision, "r1", "{liar} keeps r1");
        }
    }
}

/// With `afterConsecutiveFailures: 2`, violations count towards the quarantine like failures the
/// others provisioned: both liars are quarantined by the second revision and named in the note.
#[test]
fn repeated_violations_quarantine_the_liars() {
    let liars = ["node-01", "node-03"];
    let (mut store, mut t) = fleet(Some(2));
    roll_lying(&mut store, &mut t, "r2", 2, &liars);
    assert_eq!(phase(&store, "r2"), RevisionPhase::Complete.as_str());
    for liar in liars {
        let streak: Vec<String> = (record(&store, liar).streak.iter())
            .map(|e| e.revision.clone())
            .collect();
        assert_eq!(streak, ["r2"], "{liar}");
    }
    let plans = roll_lying(&mut store, &mut t, "r3", 3, &liars);
    assert_eq!(phase(&store, "r3"), RevisionPhase::Complete.as_str());
    for liar in liars {
        let note = record(&store, liar).quarantined.expect("quarantined");
        assert!(
            note.contains("failed r2, r3 in a row, the last by reporting Invalid"),
            "{note}"
        );
    }
    let quarantined = plans.iter().flat_map(|p| &p.events);
    let quarantined = quarantined.filter(|e| e.reason == EventReason::NodeQuarantined);
    assert_eq!(quarantined.count(), 2);
    // Once quarantined they are skipped; the next revision reaches the others and records nothing new
    // against the policy (their reports are still violations, flagged).
    roll_lying(&mut store, &mut t, "r4", 4, &liars);
    assert_eq!(phase(&store, "r4"), RevisionPhase::Complete.as_str());
    assert_eq!(on(&store, "r4"), ["node-02", "node-04"]);
}
