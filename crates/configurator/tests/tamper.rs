//! Specs edited by hand, where the API server does not refuse the edit (the testbed has no CEL; the real
//! server's refusal is in `crates/api/tests/apiserver.rs`), and inputs deleted: a revision is what its
//! hash says, and a node's spec is what the configurator wrote.

mod common;

use netwave_api::vocab::RevisionPhase;
use netwave_api::vocab::{ConditionStatus, RevisionCondition};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use netwave_api::{NetworkConfigInputs, NetworkConfigRevision, NodeNetworkConfig};
use netwave_testbed::Match;
use serde_json::json;

const T: Duration = Duration::from_secs(30);

fn specs(
    configs: &std::collections::BTreeMap<String, NodeNetworkConfig>,
) -> Vec<(String, netwave_api::NodeNetworkConfigSpec)> {
    configs
        .iter()
        .map(|(n, c)| (n.clone(), c.spec.clone()))
        .collect()
}

fn tamper_route() -> Patch<json_patch::Patch> {
    // The issue's edit: a route's next hop in the revision's folded inputs.
    Patch::Json(
        serde_json::from_value(json!([{
            "op": "replace",
            "path": "/spec/routingTables/0/spec/routes/0/via",
            "value": "10.0.0.99",
        }]))
        .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_edited_specs_are_put_back_or_never_rendered_and_reported() {
    let env = testbed_env().await;
    add_nodes(&env.client, &node_names(4)).await;
    // Agents answer the first revision and never a later one: the second stays in flight.
    let first: Arc<std::sync::Mutex<Option<String>>> = Default::default();
    let f = first.clone();
    let behaviour: Behaviour = Arc::new(move |_, rev| {
        let mut first = f.lock().unwrap();
        if first.get_or_insert_with(|| rev.to_string()) == rev {
            Answer::Provisioned
        } else {
            Answer::Silent
        }
    });
    let _agents = spawn_agents(env.client.clone(), behaviour, Duration::from_millis(50));
    apply_samples(&env.client).await;
    let metrics_port = free_port();
    let m = format!("127.0.0.1:{metrics_port}");
    let c = Configurator::start(
        env.client.clone(),
        args(&["--max-unavailable", "1", "--metrics-addr", &m]),
    );
    let revs: Api<NetworkConfigRevision> = Api::all(env.client.clone());
    let inputs: Api<NetworkConfigInputs> = Api::all(env.client.clone());
    let r1 = eventually(T, "the first revision to complete", || async {
        match revisions(&env.client).await.as_slice() {
            [r] if phase(r) == RevisionPhase::Complete.as_str() => Ok(r.clone()),
            other => Err(format!("{}", other.len())),
        }
    })
    .await;
    let r1_name = r1.metadata.name.clone().unwrap();
    let r1_inputs = inputs.get(&r1_name).await.unwrap().spec;
    let before = specs(&configs(&env.client).await);

    // 1. A node's spec edited by hand (the config, not its hash) is put back and reported.
    node_spec_edit_is_put_back(&env.client, &before, json!({})).await;

    // 2. The issue's edit of the current revision's inputs: put back from the current inputs, nothing
    //    re-rendered.
    inputs
        .patch(&r1_name, &PatchParams::default(), &tamper_route())
        .await
        .unwrap();
    eventually(T, "the revision's inputs to be put back", || async {
        let now = inputs.get(&r1_name).await.map_err(|e| e.to_string())?;
        (now.spec == r1_inputs)
            .then_some(())
            .ok_or_else(|| "still edited".to_string())
    })
    .await;
    let notes = eventually(T, "a SpecTampered Event on the revision", || async {
        let n = event_notes(&env.client, &r1_name, "SpecTampered").await;
        (!n.is_empty())
            .then_some(n)
            .ok_or_else(|| "none yet".to_string())
    })
    .await;
    assert!(
        notes[0].starts_with(&format!("inputs: NetworkConfigInputs {r1_name} hashes to"))
            && notes[0].contains("put back"),
        "{notes:?}"
    );
    reconciles_pass(metrics_port, 2.0).await;
    assert_eq!(
        specs(&configs(&env.client).await),
        before,
        "no node got a config rendered from the edited inputs"
    );

    // 3. A new target is rolling out; the last good revision is edited. The inputs it was made from are
    //    gone, so it cannot be put back: it is never rendered again, says so, and is counted.
    change_inputs(&env.client, 8000).await;
    let r2_name = eventually(T, "the second revision to start", || async {
        let revs = revisions(&env.client).await;
        let cfgs = configs(&env.client).await;
        let r2 = revs
            .iter()
            .find(|r| r.metadata.name.as_deref() != Some(r1_name.as_str()))
            .and_then(|r| r.metadata.name.clone())
            .ok_or_else(|| "no second revision".to_string())?;
        cfgs.values()
            .any(|c| c.spec.revision == r2)
            .then_some(r2)
            .ok_or_else(|| "not assigned yet".to_string())
    })
    .await;
    let before = specs(&configs(&env.client).await);
    inputs
        .patch(&r1_name, &PatchParams::default(), &tamper_route())
        .await
        .unwrap();
    let notes = eventually(
        T,
        "a SpecTampered Event saying it is never rendered",
        || async {
            let n = event_notes(&env.client, &r1_name, "SpecTampered").await;
            n.into_iter()
                .find(|n| n.contains("never rendered or assigned again"))
                .ok_or_else(|| "none yet".to_string())
        },
    )
    .await;
    assert!(notes.starts_with("inputs: NetworkConfigInputs"), "{notes}");
    let validated = eventually(T, "the Validated condition to say why", || async {
        let r = revs.get(&r1_name).await.unwrap();
        r.status
            .and_then(|s| {
                s.conditions
                    .into_iter()
                    .find(|c| c.type_ == RevisionCondition::Validated.as_str())
            })
            .filter(|c| c.status == ConditionStatus::False.as_str())
            .ok_or_else(|| "not yet".to_string())
    })
    .await;
    assert!(
        validated.message.starts_with("inputs: NetworkConfigInputs"),
        "{validated:?}"
    );
    let series = r#"netwave_tampered_specs{kind="NetworkConfigRevision"}"#;
    eventually(T, "the tampered-spec gauge", || async {
        (metric(metrics_port, series).await == Some(1.0))
            .then_some(())
            .ok_or_else(|| "not 1".to_string())
    })
    .await;
    reconciles_pass(metrics_port, 2.0).await;
    let after = specs(&configs(&env.client).await);
    assert_eq!(
        after, before,
        "nothing was rendered from the edited revision"
    );
    assert!(
        after
            .iter()
            .all(|(_, s)| s.revision == r1_name || s.revision == r2_name),
        "{after:?}"
    );

    // 4. The current target's inputs deleted (by hand, or lost between the two creates): once the grace
    //    for inputs on their way is over, they are put back from the current inputs and reported.
    let r2_inputs = inputs.get(&r2_name).await.unwrap().spec;
    inputs
        .delete(&r2_name, &DeleteParams::default())
        .await
        .unwrap();
    let notes = eventually(
        Duration::from_secs(40),
        "a SpecTampered Event saying the inputs are gone",
        || async {
            let n = event_notes(&env.client, &r2_name, "SpecTampered").await;
            n.into_iter()
                .find(|n| n.contains("is gone") && n.contains("put back"))
                .ok_or_else(|| "none yet".to_string())
        },
    )
    .await;
    assert!(notes.starts_with("inputs: NetworkConfigInputs"), "{notes}");
    let back = eventually(T, "the deleted inputs to be put back", || async {
        inputs.get(&r2_name).await.map_err(|e| e.to_string())
    })
    .await;
    assert_eq!(back.spec, r2_inputs);
    assert_eq!(
        specs(&configs(&env.client).await),
        before,
        "no node was assigned anything while the inputs were gone"
    );
    c.stop().await;
}

/// After an API server outage a replica's watches come back one by one (each backs off on its own):
/// a revision cut meanwhile is seen without its inputs for longer than the grace. That is the cache
/// behind, not the inputs gone (a fresh read finds them): no `SpecTampered` Event, no count, and the
/// revision rolls out. (The real-node monitoring test saw
/// `NetwaveSpecTampered` fire this way after its API server restart.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revision_is_not_judged_tampered_while_the_inputs_watch_is_behind() {
    let env = testbed_env().await;
    add_nodes(&env.client, &node_names(3)).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(50));
    apply_samples(&env.client).await;
    let (a, metrics_port) = args_with_metrics(&["--max-unavailable", "3"]);
    let c = Configurator::start(env.client.clone(), a);
    let complete = |skip: Option<String>| {
        let client = env.client.clone();
        async move {
            let revs = revisions(&client).await;
            revs.into_iter()
                .find(|r| r.metadata.name != skip && phase(r) == RevisionPhase::Complete.as_str())
                .and_then(|r| r.metadata.name)
                .ok_or_else(|| "not yet".to_string())
        }
    };
    let r1 = eventually(T, "the first revision to complete", || complete(None)).await;

    // The inputs' watch goes down and stays down: every list and watch of them is refused.
    let faults = env.tb().faults();
    for verb in ["list", "watch"] {
        faults.fail_fraction(Match::verb(verb).resource("networkconfiginputs"), 1.0, 503);
    }
    faults.cut_watches();
    change_inputs(&env.client, 8000).await;
    let r2 = eventually(T, "the second revision to be cut", || async {
        revisions(&env.client)
            .await
            .into_iter()
            .filter_map(|r| r.metadata.name)
            .find(|n| *n != r1)
            .ok_or_else(|| "not yet".to_string())
    })
    .await;
    // The revision completes with the inputs' watch still down: the configurator reads them fresh
    // once the grace is over (before, nothing is decided), so completing means it judged them there.
    let done = eventually(
        Duration::from_secs(60),
        "the second revision to complete with the inputs' watch still down",
        || complete(Some(r1.clone())),
    )
    .await;
    assert_eq!(done, r2);
    reconciles_pass(metrics_port, 2.0).await;
    let series = r#"netwave_tampered_specs{kind="NetworkConfigRevision"}"#;
    assert_eq!(metric(metrics_port, series).await, Some(0.0));
    assert_eq!(
        event_notes(&env.client, &r2, "SpecTampered").await,
        Vec::<String>::new()
    );
    faults.clear();
    c.stop().await;
}

/// Edits node-01's config (not its hash) as an admin would, with `annotations` added in the same
/// write, and waits for the configurator to put the spec back to `before` and report it.
async fn node_spec_edit_is_put_back(
    client: &kube::Client,
    before: &[(String, netwave_api::NodeNetworkConfigSpec)],
    annotations: serde_json::Value,
) {
    let nncs: Api<NodeNetworkConfig> = Api::all(client.clone());
    nncs.patch(
        "node-01",
        &PatchParams::default(),
        &Patch::Merge(json!({
            "metadata": {"annotations": annotations},
            "spec": {"config": {"routes": []}},
        })),
    )
    .await
    .unwrap();
    eventually(T, "node-01's spec to be put back", || async {
        let now = specs(&configs(client).await);
        (now == before)
            .then_some(())
            .ok_or_else(|| "still edited".to_string())
    })
    .await;
    let notes = eventually(T, "a SpecTampered Event on node-01", || async {
        let n = event_notes(client, "node-01", "SpecTampered").await;
        (!n.is_empty())
            .then_some(n)
            .ok_or_else(|| "none yet".to_string())
    })
    .await;
    assert!(
        notes[0].contains("does not hash to spec.configHash") && notes[0].contains("put back"),
        "{notes:?}"
    );
}

/// On the real API server, whose server-side apply gives the hand edit's fields to another manager: the
/// configurator's forced apply takes them back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_edited_node_spec_is_put_back_on_the_real_api_server() {
    let env = env().await;
    add_nodes(&env.client, &node_names(3)).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(50));
    apply_samples(&env.client).await;
    let c = Configurator::start(env.client.clone(), args(&["--max-unavailable", "3"]));
    eventually(T, "the revision to complete", || async {
        match revisions(&env.client).await.as_slice() {
            [r] if phase(r) == RevisionPhase::Complete.as_str() => Ok(()),
            other => Err(format!("{}", other.len())),
        }
    })
    .await;
    let before = specs(&configs(&env.client).await);
    assert!(!before.is_empty());
    node_spec_edit_is_put_back(&env.client, &before, json!({})).await;
    c.stop().await;
}

/// Whoever can edit a node's spec can add annotations in the same write: one naming the configurator's
/// in-memory mark for a config it verified (`netwave.dev/cached-config-verified`) does not switch the
/// tamper check off; the edit is put back and reported like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_spec_edit_cannot_mark_itself_verified() {
    let env = env().await;
    add_nodes(&env.client, &node_names(3)).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(50));
    apply_samples(&env.client).await;
    let c = Configurator::start(env.client.clone(), args(&["--max-unavailable", "3"]));
    eventually(T, "the revision to complete", || async {
        match revisions(&env.client).await.as_slice() {
            [r] if phase(r) == RevisionPhase::Complete.as_str() => Ok(()),
            other => Err(format!("{}", other.len())),
        }
    })
    .await;
    let before = specs(&configs(&env.client).await);
    let forged = json!({ netwave_configurator::watch::CONFIG_VERIFIED: "true" });
    node_spec_edit_is_put_back(&env.client, &before, forged).await;
    c.stop().await;
}

/// A revision is never cut from a cache that is behind (#48): the RoutingTables' watch is down (every
/// re-watch refused, as after an API server restart while that watch waits out its backoff) when an
/// admin deletes a table and then changes a segment. The cache still holds the table: a cut from it
/// would bring the deleted table back to every node. The configurator confirms the inputs on a quorum
/// read first: it cuts nothing while the watch is behind, says which kind is, and cuts the revision
/// without the table once the watch is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revision_is_never_cut_from_a_watch_that_is_behind() {
    const TABLE: &str = "edge-uplink";
    let env = testbed_env().await;
    add_nodes(&env.client, &node_names(3)).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(50));
    apply_samples(&env.client).await;
    let (a, metrics_port) = args_with_metrics(&[]);
    let c = Configurator::start(env.client.clone(), a);
    let completed = || async {
        let revs = revisions(&env.client).await;
        let done: Vec<String> = (revs.iter())
            .filter(|r| phase(r) == RevisionPhase::Complete.as_str())
            .filter_map(|r| r.metadata.name.clone())
            .collect();
        let names: Vec<String> = revs
            .iter()
            .filter_map(|r| r.metadata.name.clone())
            .collect();
        (done, names)
    };
    let r1 = eventually(T, "the first revision to complete", || async {
        match completed().await {
            (done, _) if done.len() == 1 => Ok(done[0].clone()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    let faults = env.tb().faults();
    faults.fail_fraction(Match::verb("watch").resource("routingtables"), 1.0, 503);
    faults.cut_watches();
    Api::<netwave_api::RoutingTable>::all(env.client.clone())
        .delete(TABLE, &DeleteParams::default())
        .await
        .unwrap();
    change_inputs(&env.client, 8000).await;
    // Well past the settle window (300 ms): many reconciles asked to cut.
    reconciles_pass(metrics_port, 6.0).await;
    let (_, names) = completed().await;
    assert_eq!(
        names,
        vec![r1.clone()],
        "no revision is cut while the RoutingTables' cache is behind"
    );
    let behind = "netwave_cut_rechecks_behind_total ";
    assert!(
        metric(metrics_port, behind).await.unwrap_or_default() >= 1.0,
        "the put-off cuts are counted"
    );

    faults.clear();
    // (Removing a table from every node may be held for approval: cut is enough here.)
    let r2 = eventually(T, "a revision once the watch is back", || async {
        match completed().await {
            (_, names) if names.len() == 2 => Ok(names.into_iter().find(|n| *n != r1).unwrap()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let inputs = Api::<NetworkConfigInputs>::all(env.client.clone())
        .get(&r2)
        .await
        .unwrap();
    let tables: Vec<&str> = (inputs.spec.routing_tables.iter())
        .map(|t| t.name.as_str())
        .collect();
    assert!(
        !tables.contains(&TABLE),
        "the deleted table stays deleted: {tables:?}"
    );
    c.stop().await;
}
