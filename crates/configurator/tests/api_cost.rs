//! API cost of a rollout, measured at the testbed: how many writes the configurator makes per node, for
//! the first rollout of an empty fleet and for a rollout after it. Prints the figures; the assertions are
//! on counts, not on time.
//!
//! The first rollout pays for making every node visible: a node that waits for its turn gets a
//! placeholder NodeNetworkConfig, created with what it waits for — 1 write per queued node on top of
//! the assignment (#28; before, a `Queued` status write and a `Pending` mark after the assignment made
//! it 3). A later rollout finds every node's config in place and pays for the assignment alone. The
//! rest (revision status per wave, Events, the Lease) is spread over the nodes.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::*;

/// Configurator writes per node of the rollout that makes the newest revision `Complete`, with the
/// counters reset before `start`; `answers` counts the simulated agents' status writes.
async fn cost(
    env: &Env,
    nodes: usize,
    answers: &AtomicU64,
    revisions_expected: usize,
) -> (f64, String) {
    newest_completes(&env.client, revisions_expected, Duration::from_secs(120)).await;
    let counts = env.tb().counters();
    // Input objects' status is two writes per object (the samples: 18), not per node: accepted and
    // rolling out, then ready (the kstatus conditions of #50). A reconcile that runs before the watch
    // brought back the second write still sees the first and writes the same status again (measured:
    // 37 for 18 objects), so up to three. Counted apart.
    let input_status_writes: u64 = netwave_api::InputKind::ALL
        .iter()
        .map(|k| counts.get("patch", &format!("{}/status", k.api_resource().plural)))
        .sum();
    assert!(
        input_status_writes <= 3 * 18,
        "at most three status requests per input object: {input_status_writes}; requests: {}",
        counts.to_json()
    );
    // Each answer of a simulated agent is two status writes, as a real agent's: `Provisioning` when
    // it picks the spec up, then the answer (the agents' only writes).
    let agent_writes = 2 * answers.load(Ordering::SeqCst);
    // The test's own input edit and the leader election's Lease renewals are no rollout cost.
    let other = counts.get("patch", "layer2networkconfigurations")
        + counts.get("create", "leases")
        + counts.get("update", "leases");
    let configurator_writes = counts.writes() - agent_writes - input_status_writes - other;
    let per_node = configurator_writes as f64 / nodes as f64;
    // Events by reason (all of them, this rollout's and earlier ones').
    let mut reasons = std::collections::BTreeMap::<String, u32>::new();
    for e in kube::Api::<k8s_openapi::api::core::v1::Event>::all(env.client.clone())
        .list(&Default::default())
        .await
        .unwrap()
    {
        *reasons.entry(e.reason.unwrap_or_default()).or_default() += 1;
    }
    // (Reads in the detail include this test's own polling of the revision list.)
    (
        per_node,
        format!("{}; events {reasons:?}", counts.to_json()),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_api_cost_per_node() {
    for (nodes, budget) in [(20, "5"), (100, "10%")] {
        let env = testbed_env().await;
        add_nodes(&env.client, &node_names(nodes)).await;
        let answers = Arc::new(AtomicU64::new(0));
        let counted = answers.clone();
        let behaviour: Behaviour = Arc::new(move |_, _| {
            counted.fetch_add(1, Ordering::SeqCst);
            Answer::Provisioned
        });
        let _agents = spawn_agents(env.client.clone(), behaviour, Duration::from_millis(20));
        apply_samples(&env.client).await;
        env.tb().reset_counters();
        let c = Configurator::start(env.client.clone(), args(&["--max-unavailable", budget]));
        let (first, detail) = cost(&env, nodes, &answers, 1).await;
        eprintln!(
            "API cost, {nodes} nodes, maxUnavailable {budget}, first rollout: {first:.2} \
             configurator writes/node; requests: {detail}"
        );
        env.tb().reset_counters();
        answers.store(0, Ordering::SeqCst);
        change_inputs(&env.client, 1450).await;
        let (second, detail) = cost(&env, nodes, &answers, 2).await;
        eprintln!(
            "API cost, {nodes} nodes, maxUnavailable {budget}, second rollout: {second:.2} \
             configurator writes/node; requests: {detail}"
        );
        c.stop().await;
        // Assignment and placeholder (2 per node at most, 1 for the first wave), plus revision status,
        // Events and the Lease spread over the nodes (2.20 at 20 nodes, 2.04 at 100).
        assert!(
            first <= 2.5,
            "{nodes} nodes, first rollout: {first:.2} writes per node (target <= 2.5)"
        );
        assert!(
            second <= 2.0,
            "{nodes} nodes, second rollout: {second:.2} writes per node (target <= 2)"
        );
    }
}
