//! API cost of a rollout, measured at the testbed: how many requests the configurator makes per node.
//! Prints the figures; the assertion is on counts (target: at most 3 configurator writes per node), not
//! on time.

mod common;

use std::time::Duration;

use common::*;

async fn rollout_cost(nodes: usize, max_unavailable: &str) -> (f64, String) {
    let env = testbed_env().await;
    add_nodes(&env.client, &node_names(nodes)).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(20));
    apply_samples(&env.client).await;
    env.tb().reset_counters();
    let c = Configurator::start(
        env.client.clone(),
        args(&["--max-unavailable", max_unavailable]),
    );
    eventually(
        Duration::from_secs(120),
        "the rollout to complete",
        || async {
            match revisions(&env.client).await.as_slice() {
                [r] if phase(r) == "Complete" => Ok(()),
                other => Err(format!("{:?}", other.iter().map(phase).collect::<Vec<_>>())),
            }
        },
    )
    .await;
    c.stop().await;
    let counts = env.tb().counters();
    // Agents write only NodeNetworkConfig status; everything else written is the configurator's.
    let agent_writes = counts.get("patch", "nodenetworkconfigs/status");
    // Input objects' status is one write per object (the samples: 18), not per node: counted apart.
    let input_status_writes: u64 = [
        "vrfrouteconfigurations",
        "layer2networkconfigurations",
        "routingtables",
    ]
    .iter()
    .map(|k| counts.get("patch", &format!("{k}/status")))
    .sum();
    assert!(
        input_status_writes <= 18,
        "at most one status write per input object: {input_status_writes}"
    );
    let configurator_writes = counts.writes() - agent_writes - input_status_writes;
    let per_node = configurator_writes as f64 / nodes as f64;
    // (Reads in the detail include this test's own polling of the revision list.)
    (per_node, counts.to_json().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_costs_at_most_three_configurator_writes_per_node() {
    for (nodes, budget) in [(20, "5"), (100, "10%")] {
        let (writes, detail) = rollout_cost(nodes, budget).await;
        eprintln!(
            "API cost, {nodes} nodes, maxUnavailable {budget}: {writes:.2} configurator writes/node; \
             requests: {detail}"
        );
        assert!(
            writes <= 3.0,
            "{nodes} nodes: {writes:.2} writes per node (target <= 3): {detail}"
        );
    }
}
