//! Time of one `rollout::step` over a 5,000-node fleet, in a few scenarios (target: < 20 ms each).
//!
//! ```sh
//! cargo run --release -p netwave-core --example bench_step
//! ```
//!
//! Each scenario builds its input once, then times `step` (median and worst of several runs) two ways:
//! from scratch (a new `StepMemo`, the baseline), and as a live leader steps, with the memo of a step
//! over the fleet just before the change and an input that shares every object that did not change
//! (as the configurator's inputs do). Both must plan the same. The fleet has 20 failure domains, a 5%
//! budget, 2 canaries and a per-domain budget; rendered hashes are supplied for both revisions, as the
//! configurator would.

use netwave_api::vocab::NodeReason;
use netwave_api::vocab::RevisionPhase;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use netwave_api::{Canary, RolloutPolicy};
use netwave_core::Timestamp;
use netwave_core::rollout::{AgentPhase, Plan, StepMemo, step};
use netwave_core::sim::Store;

const NODES: usize = 5_000;
const DOMAINS: usize = 20;
const RUNS: usize = 25;
const T0: Timestamp = Timestamp(1_800_000_000_000);

fn policy() -> RolloutPolicy {
    RolloutPolicy {
        max_unavailable: Some(IntOrString::String("5%".into())),
        max_failures: Some(3),
        apply_timeout_seconds: Some(600),
        pickup_timeout_seconds: None,
        progress_deadline_seconds: Some(1800),
        canary: Some(Canary {
            count: Some(2),
            selector: None,
            bake_seconds: 60,
        }),
        topology_key: Some("topology.kubernetes.io/zone".into()),
        max_unavailable_per_domain: Some(IntOrString::Int(20)),
        quarantine: None,
    }
}

/// 5,000 nodes on a completed r1, r2 created; each node's r2 config differs from its r1 config except
/// for one node in ten (fast path).
fn fleet() -> Store {
    let mut store = Store::default();
    for i in 0..NODES {
        let name = format!("node-{i:05}");
        let labels = BTreeMap::from([
            (
                "topology.kubernetes.io/zone".to_string(),
                format!("zone-{:02}", i % DOMAINS),
            ),
            ("kubernetes.io/hostname".to_string(), name.clone()),
        ]);
        store.add_node(&name, labels);
        store
            .rendered
            .insert("r1", name.clone(), format!("r1-{i:05}"));
        let r2 = if i % 10 == 0 {
            format!("r1-{i:05}")
        } else {
            format!("r2-{i:05}")
        };
        store.rendered.insert("r2", name.clone(), r2);
    }
    store.add_revision("r1", 1).policy = policy();
    for i in 0..NODES {
        store.set_running(&format!("node-{i:05}"), "r1", T0);
    }
    // r1 is the completed, last good revision; then r2 arrives.
    let plan = step(&store.input(), T0);
    store.apply_plan(&plan).expect("applies");
    assert_eq!(
        store.revisions["r1"].status.phase.as_deref(),
        Some(RevisionPhase::Complete.as_str())
    );
    store.add_revision("r2", 2).policy = policy();
    store
}

/// Times `step` over `input` with a new memo, and with the memo of a step over `before` (the fleet
/// just before the change), as a live leader steps; the plans must be the same.
fn time(name: &str, before: &Store, after: &Store, now: Timestamp) -> Plan {
    let before = &before.input();
    let input = &after.input_sharing(before);
    let mut kept = StepMemo::default();
    kept.step(before, now);
    let mut fresh: Vec<Duration> = Vec::with_capacity(RUNS);
    let mut with_memo: Vec<Duration> = Vec::with_capacity(RUNS);
    let mut plan = Plan::default();
    for _ in 0..RUNS {
        let start = Instant::now();
        plan = std::hint::black_box(step(std::hint::black_box(input), now));
        fresh.push(start.elapsed());
    }
    for _ in 0..RUNS {
        let mut memo = kept.clone();
        let start = Instant::now();
        let again = std::hint::black_box(memo.step(std::hint::black_box(input), now));
        with_memo.push(start.elapsed());
        assert_eq!(
            again, plan,
            "{name}: a kept memo plans what a new one plans"
        );
    }
    let ms = |samples: &mut Vec<Duration>, q: usize| {
        samples.sort();
        samples[q].as_secs_f64() * 1e3
    };
    let (median, worst) = (ms(&mut fresh, RUNS / 2), ms(&mut fresh, RUNS - 1));
    let (median_kept, worst_kept) = (ms(&mut with_memo, RUNS / 2), ms(&mut with_memo, RUNS - 1));
    println!(
        "{name:<44} {median:>7.2} {worst:>7.2}   {median_kept:>7.2} {worst_kept:>7.2}  {:>5.2}   ({} assignments, {} status writes, target {})",
        median_kept / median,
        plan.assignments.len(),
        plan.status_updates.len(),
        if median_kept < 20.0 { "met" } else { "MISSED" },
    );
    plan
}

/// The first `count` nodes given r2 whose agents have not answered yet.
fn in_flight_on_r2(store: &Store, count: usize) -> Vec<String> {
    store
        .configs
        .values()
        .filter(|c| c.spec.revision == "r2" && c.status.observed_revision.as_deref() != Some("r2"))
        .take(count)
        .map(|c| c.name.to_string())
        .collect()
}

fn succeed_in_flight(store: &mut Store) {
    let names: Vec<String> = store
        .configs
        .values()
        .filter(|c| c.status.observed_revision.as_deref() != Some(c.spec.revision.as_str()))
        .map(|c| c.name.to_string())
        .collect();
    for n in names {
        store.agent_reports(&n, AgentPhase::Provisioned, None);
    }
}

fn main() {
    println!("one rollout::step over {NODES} nodes, {DOMAINS} domains, {RUNS} runs each");
    println!(
        "{:<44} {:>7} {:>7}   {:>7} {:>7}  {:>5}",
        "ms: new memo (a step from scratch) | memo kept",
        "median",
        "worst",
        "median",
        "worst",
        "kept/new"
    );
    let mut store = fleet();

    // 1. Start of the rollout: canaries are picked and assigned (the memo saw the fleet before r2).
    let now = T0.plus_secs(10);
    let mut before = store.clone();
    before.revisions.remove("r2");
    let plan = time("start (picks and assigns 2 canaries)", &before, &store, now);
    store.apply_plan(&plan).expect("applies");
    succeed_in_flight(&mut store);

    // 2. Canaries done and baked: the first wave (5% budget, domain round-robin, fast paths).
    let now = T0.plus_secs(100);
    let before = store.clone();
    let plan = step(&store.input(), now); // records the bake start
    store.apply_plan(&plan).expect("applies");
    let now = T0.plus_secs(200);
    let plan = time(
        "first wave after the bake (5% + fast paths)",
        &before,
        &store,
        now,
    );
    store.apply_plan(&plan).expect("applies");

    // 3. Mid-rollout: half the fleet updated, a wave in flight.
    let mut now = now;
    let mut waves = 0;
    let mut before = store.clone();
    while store.revisions["r2"].status.updated < (NODES / 2) as u32 && waves < 200 {
        succeed_in_flight(&mut store);
        now = now.plus_secs(30);
        before = store.clone();
        let plan = step(&store.input(), now);
        store.apply_plan(&plan).expect("applies");
        waves += 1;
    }
    let mid = store.clone();
    time(
        "mid-rollout (half updated, a wave in flight)",
        &before,
        &store,
        now.plus_secs(1),
    );

    // 3b. What a live leader mostly steps on: a few agents report their new config good, and as many
    // nodes move on.
    let mut reported = mid.clone();
    for n in &in_flight_on_r2(&reported, 4) {
        reported.agent_reports(n, AgentPhase::Provisioned, None);
    }
    time(
        "mid-rollout, 4 agents report (4 move on)",
        &mid,
        &reported,
        now.plus_secs(1),
    );

    // 4. A node fails mid-rollout with maxFailures reached: rollback planning.
    let mut failing = mid.clone();
    for n in ["node-02501", "node-02502", "node-02503"] {
        if failing.configs[n].spec.revision == "r2" {
            failing.agent_reports(
                n,
                AgentPhase::Invalid,
                Some(NodeReason::HealthCheckFailed.as_str()),
            );
        }
    }
    for n in &in_flight_on_r2(&failing, 3) {
        failing.agent_reports(
            n,
            AgentPhase::Invalid,
            Some(NodeReason::HealthCheckFailed.as_str()),
        );
    }
    time(
        "mid-rollout, revision fails (rollback)",
        &mid,
        &failing,
        now.plus_secs(2),
    );

    // 5. All done: nothing to write.
    while store.revisions["r2"].status.phase.as_deref() != Some(RevisionPhase::Complete.as_str())
        && waves < 400
    {
        succeed_in_flight(&mut store);
        now = now.plus_secs(30);
        before = store.clone();
        let plan = step(&store.input(), now);
        store.apply_plan(&plan).expect("applies");
        waves += 1;
    }
    let plan = time(
        "all done (steady state)",
        &before,
        &store,
        now.plus_secs(30),
    );
    assert!(plan.is_empty(), "a finished rollout plans nothing");
}
