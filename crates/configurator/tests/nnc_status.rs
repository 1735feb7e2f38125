//! `kubectl get nnc` tells the truth after a config is re-rendered under the same revision (a Node label
//! change): the node reads `Pending` until its agent reports on the new config, against the real
//! kube-apiserver.

mod common;

use netwave_api::vocab::NodePhase;
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use netwave_api::NODE_PHASE_PENDING;
use serde_json::json;

const T: Duration = Duration::from_secs(60);

fn kubectl_get_nnc(env: &Env) -> String {
    let out = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(env.kubeconfig())
        .args(["get", "nnc"])
        .output()
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerendered_config_reads_pending_until_the_agent_reports_it() {
    let env = env().await;
    let client = env.client.clone();
    let names = node_names(2);
    add_nodes(&client, &names).await;
    apply_samples(&client).await;
    let (a, port) = args_with_metrics(&[]);
    let _configurator = Configurator::start(client.clone(), a);
    let agents = spawn_agents(client.clone(), always_ok(), Duration::from_millis(50));
    let first = eventually(T, "both nodes Provisioned", || async {
        let c = configs(&client).await;
        (c.len() == 2
            && c.values().all(|n| {
                let s = n.status.clone().unwrap_or_default();
                s.phase.as_deref() == Some(NodePhase::Provisioned.as_str())
                    && s.config_hash.as_deref() == Some(n.spec.config_hash.as_str())
            }))
        .then_some(c)
        .ok_or_else(|| "not yet".to_string())
    })
    .await;
    println!("after the rollout:\n{}", kubectl_get_nnc(&env));

    // The agents stop answering; node-00 gets a label that selects the edge VRF.
    drop(agents);
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            &names[0],
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"node-restriction.kubernetes.io/netwave-edge": "true"}}})),
        )
        .await
        .unwrap();
    let old = &first[&names[0]];
    let pending = eventually(T, "node-00 re-rendered and Pending", || async {
        let n = configs(&client).await.remove(&names[0]).unwrap();
        let phase = n.status.clone().unwrap_or_default().phase;
        if n.spec.config_hash != old.spec.config_hash
            && phase.as_deref() == Some(NODE_PHASE_PENDING)
        {
            Ok(n)
        } else {
            Err(format!("configHash {} phase {phase:?}", n.spec.config_hash))
        }
    })
    .await;
    assert_eq!(
        pending.spec.revision, old.spec.revision,
        "a label change re-renders under the same revision"
    );
    let st = pending.status.clone().unwrap();
    assert_eq!(st.observed_revision, Some(old.spec.revision.clone()));
    assert_eq!(
        st.config_hash,
        Some(old.spec.config_hash.clone()),
        "it still runs the old config"
    );
    let table = kubectl_get_nnc(&env);
    println!("re-rendered, agent not yet reported:\n{table}");
    let row = table.lines().find(|l| l.starts_with(&names[0])).unwrap();
    assert!(row.contains(NODE_PHASE_PENDING), "{row}");
    assert!(!row.contains(NodePhase::Provisioned.as_str()), "{row}");
    // The other node's config did not change: still Provisioned.
    let other = &configs(&client).await[&names[1]];
    assert_eq!(
        other.status.as_ref().unwrap().phase.as_deref(),
        Some(NodePhase::Provisioned.as_str())
    );
    // With no agent answering, it stays Pending (nothing else turns it back to Provisioned).
    reconciles_pass(port, 2.0).await;
    let still = &configs(&client).await[&names[0]];
    assert_eq!(
        still.status.as_ref().unwrap().phase.as_deref(),
        Some(NODE_PHASE_PENDING)
    );

    // The agent reports on the new config: Provisioned, running the new hash.
    let _agents = spawn_agents(client.clone(), always_ok(), Duration::from_millis(50));
    eventually(T, "node-00 Provisioned with the new config", || async {
        let n = configs(&client).await.remove(&names[0]).unwrap();
        let s = n.status.clone().unwrap_or_default();
        (s.phase.as_deref() == Some(NodePhase::Provisioned.as_str())
            && s.config_hash.as_deref() == Some(n.spec.config_hash.as_str())
            && n.spec.config_hash == pending.spec.config_hash)
            .then_some(())
            .ok_or_else(|| format!("{s:?}"))
    })
    .await;
    println!("after the agent reported:\n{}", kubectl_get_nnc(&env));
}

/// `kubectl get nnc` lists every node of the fleet during a first rollout: a node that waits for its
/// turn has a placeholder reading `Queued` with what it waits for (a cordoned node says so), no agent
/// applies a placeholder, an assignment replaces it (`Pending` until the agent reports), and a node that
/// leaves takes its placeholder with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_has_a_config_queued_ones_say_what_they_wait_for() {
    let env = env().await;
    let client = env.client.clone();
    let names = node_names(4);
    add_nodes(&client, &names[..3]).await;
    let mut cordoned = node("node-03", &[]);
    cordoned.spec.get_or_insert_default().unschedulable = Some(true);
    create_node(&client, &cordoned).await;
    apply_samples(&client).await;
    // One node at a time; the agents answer after 2 s, and one of them (node-02) never does.
    let _configurator = Configurator::start(client.clone(), args(&["--max-unavailable", "1"]));
    let silent = names[2].clone();
    let behaviour: Behaviour = std::sync::Arc::new(move |node: &str, _revision: &str| {
        if node == silent {
            Answer::Silent
        } else {
            Answer::Provisioned
        }
    });
    let _agents = spawn_agents(client.clone(), behaviour, Duration::from_secs(2));

    let queued = eventually(T, "four configs, queued ones saying so", || async {
        let c = configs(&client).await;
        let queued: Vec<&str> = c
            .iter()
            .filter(|(_, n)| {
                n.spec.is_placeholder()
                    && n.status.as_ref().and_then(|s| s.phase.as_deref())
                        == Some(netwave_api::NODE_PHASE_QUEUED)
            })
            .map(|(name, _)| name.as_str())
            .collect();
        let placeholders = c.values().filter(|n| n.spec.is_placeholder()).count();
        (c.len() == 4 && queued.len() >= 2 && queued.len() == placeholders)
            .then(|| c.clone())
            .ok_or_else(|| format!("{} configs, queued {queued:?}", c.len()))
    })
    .await;
    let table = kubectl_get_nnc(&env);
    println!("during the first rollout:\n{table}");
    for n in &names {
        assert!(
            table.lines().any(|l| l.starts_with(n.as_str())),
            "{n} missing:\n{table}"
        );
    }
    let revision = revisions(&client)
        .await
        .pop()
        .unwrap()
        .metadata
        .name
        .unwrap();
    let waiting = queued
        .values()
        .find(|n| n.spec.is_placeholder() && n.metadata.name.as_deref() != Some("node-03"))
        .unwrap();
    let message = waiting.status.clone().unwrap().message.unwrap();
    assert!(
        message.contains(&format!("queued for revision {revision}")),
        "{message}"
    );
    let message = queued["node-03"].status.clone().unwrap().message.unwrap();
    assert!(message.contains("not Ready or cordoned"), "{message}");
    // A placeholder is no assignment: no agent reported on one.
    assert!(
        queued
            .values()
            .filter(|n| n.spec.is_placeholder())
            .all(|n| n
                .status
                .as_ref()
                .is_some_and(|s| s.observed_revision.is_none()))
    );

    // The rollout reaches every schedulable node: each placeholder was replaced by its assignment; the
    // silent node reads Pending (assigned, its agent never reported), not Queued.
    let done = eventually(
        T,
        "node-00, node-01 Provisioned; node-02 assigned",
        || async {
            let c = configs(&client).await;
            let ok = |n: &str| {
                c[n].status.as_ref().and_then(|s| s.phase.as_deref())
                    == Some(NodePhase::Provisioned.as_str())
                    && c[n].spec.revision == revision
            };
            // The Pending mark is the write right after the assignment: wait for both.
            let pending = c["node-02"]
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                == Some(NODE_PHASE_PENDING);
            (ok("node-00") && ok("node-01") && c["node-02"].spec.revision == revision && pending)
                .then(|| c.clone())
                .ok_or_else(|| "not yet".to_string())
        },
    )
    .await;
    let silent = done["node-02"].status.clone().unwrap_or_default();
    assert!(
        silent
            .message
            .is_some_and(|m| m.contains(&format!("assigned revision {revision}"))),
        "node-02 says it was assigned"
    );
    assert!(
        done["node-03"].spec.is_placeholder(),
        "a cordoned node is not assigned"
    );
    println!("after the rollout:\n{}", kubectl_get_nnc(&env));

    // node-03 leaves the cluster: its placeholder goes with it.
    Api::<Node>::all(client.clone())
        .delete("node-03", &Default::default())
        .await
        .unwrap();
    eventually(T, "node-03's placeholder deleted", || async {
        let c = configs(&client).await;
        (!c.contains_key("node-03"))
            .then_some(())
            .ok_or_else(|| "still there".to_string())
    })
    .await;
}
