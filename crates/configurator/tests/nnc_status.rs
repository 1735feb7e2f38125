//! `kubectl get nnc` tells the truth after a config is re-rendered under the same revision (a Node label
//! change): the node reads `Pending` until its agent reports on the new config, against the real
//! kube-apiserver.

mod common;

use netwave_api::vocab::NodePhase;
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use netwave_api::NODE_PHASE_PENDING;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

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
    let writes = NodeConfigWrites::default();
    let _configurator = Configurator::start(writes.client(&env).await, a);
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
    // With no agent answering, it stays Pending (nothing else turns it back to Provisioned), and the
    // mark was written once for this transition: every write of node-00's status by the configurator.
    reconciles_pass(port, 2.0).await;
    let still = &configs(&client).await[&names[0]];
    assert_eq!(
        still.status.as_ref().unwrap().phase.as_deref(),
        Some(NODE_PHASE_PENDING)
    );
    let marks: Vec<String> = writes.0.lock().unwrap()[&names[0]]
        .iter()
        .filter(|w| w.ends_with("/status"))
        .cloned()
        .collect();
    assert_eq!(marks.len(), 1, "node-00's status written once: {marks:?}");

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
/// turn has a placeholder whose `Queued` column says what it waits for (a cordoned node says so), no
/// agent applies a placeholder, an assignment replaces it (the column empties; the status stays the
/// agent's), and a node that leaves takes its placeholder with it.
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
    // One node at a time; the agents answer after 5 s, and one of them (node-02) never does. Once
    // node-02 is assigned (after node-00's and node-01's answers) only the cordoned node waits: the
    // table below must be read before that, and kubectl's discovery on a loaded machine took more
    // than 2 s.
    let _configurator = Configurator::start(client.clone(), args(&["--max-unavailable", "1"]));
    let silent = names[2].clone();
    let behaviour: Behaviour = std::sync::Arc::new(move |node: &str, _revision: &str| {
        if node == silent {
            Answer::Silent
        } else {
            Answer::Provisioned
        }
    });
    let _agents = spawn_agents(client.clone(), behaviour, Duration::from_secs(5));

    let queued = eventually(T, "four configs, queued ones saying so", || async {
        let c = configs(&client).await;
        let queued: Vec<&str> = c
            .iter()
            .filter(|(_, n)| n.queued_message().is_some())
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
    let message = waiting.queued_message().unwrap();
    assert!(
        message.contains(&format!("queued for revision {revision}")),
        "{message}"
    );
    // The table was read after the configs above: it shows a node waiting for the revision, whichever
    // it is by then.
    assert!(
        table
            .lines()
            .any(|l| !l.starts_with("node-03") && l.contains("queued for revision")),
        "the Queued column says no node waits for the revision:\n{table}"
    );
    let message = queued["node-03"].queued_message().unwrap();
    assert!(message.contains("not Ready or cordoned"), "{message}");
    // A placeholder is no assignment: no agent reported on one, and nobody wrote its status.
    assert!(
        queued
            .values()
            .filter(|n| n.spec.is_placeholder())
            .all(|n| n.status.is_none())
    );

    // The rollout reaches every schedulable node: each placeholder was replaced by its assignment,
    // which emptied what it waited for; the silent node reads its revision and no phase (assigned, its
    // agent never reported), not Queued.
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
            (ok("node-00") && ok("node-01") && c["node-02"].spec.revision == revision)
                .then(|| c.clone())
                .ok_or_else(|| "not yet".to_string())
        },
    )
    .await;
    assert_eq!(
        done["node-02"].status, None,
        "nobody wrote node-02's status"
    );
    for n in ["node-00", "node-01", "node-02"] {
        assert_eq!(done[n].queued_message(), None, "{n}");
        let annotation = done[n]
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(netwave_api::QUEUED_ANNOTATION));
        assert!(
            annotation.is_none_or(|m| m.is_empty()),
            "{n}: {annotation:?}"
        );
    }
    assert!(
        done["node-03"].spec.is_placeholder(),
        "a cordoned node is not assigned"
    );
    let table = kubectl_get_nnc(&env);
    println!("after the rollout:\n{table}");
    let row = table.lines().find(|l| l.starts_with("node-02")).unwrap();
    assert!(!row.contains("queued for revision"), "{row}");

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

/// The configurator's write requests per NodeNetworkConfig name, counted by a layer on its client
/// (creates by the name in their body, everything else by the name in the path); reads are not counted.
#[derive(Clone, Default)]
struct NodeConfigWrites(Arc<Mutex<BTreeMap<String, Vec<String>>>>);

impl NodeConfigWrites {
    async fn client(&self, env: &Env) -> kube::Client {
        let kc = Kubeconfig::read_from(env.kubeconfig()).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .unwrap();
        let writes = self.clone();
        let layer =
            tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
                writes.record(&req);
                req
            });
        kube::client::ClientBuilder::try_from(config)
            .unwrap()
            .with_layer(&layer)
            .build()
    }

    fn record(&self, req: &http::Request<kube::client::Body>) {
        const PREFIX: &str = "/apis/netwave.dev/v1alpha1/nodenetworkconfigs";
        if req.method() == http::Method::GET {
            return;
        }
        let Some(rest) = req.uri().path().strip_prefix(PREFIX) else {
            return;
        };
        let name = match rest.strip_prefix('/') {
            Some(rest) => rest.split('/').next().unwrap_or_default().to_string(),
            // A create: the name is in the body (kube sends it whole, so this is ready at once).
            None => req
                .body()
                .try_clone()
                .and_then(|b| futures::executor::block_on(b.collect_bytes()).ok())
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|v| v["metadata"]["name"].as_str().map(str::to_string))
                .unwrap_or_default(),
        };
        let what = format!("{} {}", req.method(), req.uri().path());
        self.0.lock().unwrap().entry(name).or_default().push(what);
    }
}

/// #28: a first rollout costs at most 2 configurator writes per node, the placeholders included: a
/// node queued behind the first waves is its placeholder's create (which says what it waits for) and
/// its assignment; one assigned at once is its assignment alone. No status write: the configurator
/// never wrote a status a first assignment would have to correct. Counted by a layer on the
/// configurator's client (every request it sends, failed ones too), against the real API server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_rollout_costs_at_most_two_configurator_writes_per_node() {
    let env = env().await;
    let client = env.client.clone();
    let names = node_names(12);
    add_nodes(&client, &names).await;
    apply_samples(&client).await;
    // Two at a time: six waves, so most nodes wait behind the first ones with a placeholder.
    let writes = NodeConfigWrites::default();
    let (a, port) = args_with_metrics(&["--max-unavailable", "2"]);
    let _configurator = Configurator::start(writes.client(&env).await, a);
    let _agents = spawn_agents(client.clone(), always_ok(), Duration::from_millis(300));
    let revision = eventually(T, "every node Provisioned on the revision", || async {
        let c = configs(&client).await;
        let revision = c.values().next().map(|n| n.spec.revision.clone());
        (c.len() == names.len()
            && c.values().all(|n| {
                !n.spec.is_placeholder()
                    && Some(&n.spec.revision) == revision.as_ref()
                    && n.status.as_ref().and_then(|s| s.phase.as_deref())
                        == Some(NodePhase::Provisioned.as_str())
            }))
        .then_some(revision)
        .flatten()
        .ok_or_else(|| format!("{} configs", c.len()))
    })
    .await;
    // Writes that follow the last report (a late mark) would show in the next reconciles.
    reconciles_pass(port, 2.0).await;
    let counted = writes.0.lock().unwrap().clone();
    for (node, w) in &counted {
        println!("{node}: {} writes: {w:?}", w.len());
    }
    assert_eq!(
        counted.keys().collect::<Vec<_>>(),
        names.iter().collect::<Vec<_>>(),
        "every node's config was written, and only those"
    );
    for (node, w) in &counted {
        assert!(w.len() <= 2, "{node} (revision {revision}): {w:#?}");
        assert!(
            !w.iter().any(|w| w.ends_with("/status")),
            "{node}: the configurator wrote its status: {w:#?}"
        );
    }
    let queued = counted.values().filter(|w| w.len() == 2).count();
    assert!(
        queued >= names.len() / 2,
        "most nodes waited with a placeholder: {queued} of {}",
        names.len()
    );
}
