//! A standby does not read the agents' reports: only a leader watches the NodeNetworkConfigs (#28). Every
//! report is an event on them, most of a rollout's events; a standby that decoded them all for a
//! takeover that rarely comes spent about half a leader's CPU. A replica lists them once it leads, and
//! plans once that list is in.
//!
//! Measured at the testbed, which counts the watch events it sends each bearer token: two configurators
//! with their own tokens, a rollout with one of them leading, then the leader's task is aborted (its
//! elector, which outlives it, gives the Lease up) and the other takes the free Lease, lists the node
//! configs and finishes the next rollout. The list ahead of a takeover, while a silent leader's Lease
//! runs out, is `lease.rs`'s.

mod common;

use netwave_testbed::ClientIdentity;
use std::time::Duration;

use common::*;

/// The node config watch events the testbed sent to the client with bearer token `token`.
fn config_events(env: &Env, token: &str) -> u64 {
    (env.tb().traffic().get(token))
        .and_then(|t| t.watch_events.get("nodenetworkconfigs").copied())
        .unwrap_or(0)
}

/// Waits until `who` holds the configurator Lease.
async fn leads(env: &Env, who: &str) {
    eventually(
        Duration::from_secs(20),
        &format!("{who} to lead"),
        || async {
            match holder(env).await {
                Some(h) if h == who => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
}

fn configurator(env: &Env, name: &str) -> Configurator {
    let client = env.tb().client_as(ClientIdentity {
        user_agent: None,
        token: Some(name.into()),
    });
    // A longer Lease than the tests' 3 s: the standby lists early only when the leader goes 4 s
    // without renewing, which a loaded CI machine must not stretch a healthy leader's renewals to.
    let argv = ["--identity", name, "--max-unavailable", "4"];
    let lease = ["--lease-duration", "6s", "--renew-deadline", "4s"];
    Configurator::start(client, args(&[&argv[..], &lease[..]].concat()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_reads_no_agent_report_and_lists_the_node_configs_when_it_takes_over() {
    let env = testbed_env().await;
    let names = node_names(12);
    add_nodes(&env.client, &names).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(30));
    apply_samples(&env.client).await;

    let first = configurator(&env, "cfg-a");
    leads(&env, "cfg-a").await;
    let _second = configurator(&env, "cfg-b");
    newest_completes(&env.client, 1, Duration::from_secs(60)).await;
    change_inputs(&env.client, 1400).await;
    newest_completes(&env.client, 2, Duration::from_secs(60)).await;

    let (leader, standby) = (config_events(&env, "cfg-a"), config_events(&env, "cfg-b"));
    println!(
        "node config watch events over two rollouts of 12 nodes: leader {leader}, standby {standby}"
    );
    assert!(
        leader >= 2 * 12,
        "the leader follows every node's report: {leader} events"
    );
    assert_eq!(standby, 0, "the standby watches no node config");

    // The leader goes: the standby takes the Lease, lists, and finishes the next rollout on its own.
    first.kill();
    leads(&env, "cfg-b").await;
    change_inputs(&env.client, 1300).await;
    newest_completes(&env.client, 3, Duration::from_secs(60)).await;
    let configs = configs(&env.client).await;
    assert_eq!(configs.len(), 12);
    let newest = revisions(&env.client).await.pop().expect("three revisions");
    let newest = newest.metadata.name.expect("a name");
    for (node, c) in &configs {
        assert_eq!(c.spec.revision, newest, "{node} runs the newest revision");
    }
    assert!(
        config_events(&env, "cfg-b") >= 12,
        "the new leader follows the reports once it leads"
    );
}
