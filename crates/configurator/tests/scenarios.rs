//! Admin actions and fleet changes during a rollout, against the testbed with simulated agents.

mod common;

use netwave_api::vocab::{ConditionStatus, RevisionCondition, RevisionPhase, revision_reasons};
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use netwave_api::{Layer2NetworkConfiguration, NetworkConfigInputs, NetworkConfigRevision};
use netwave_testbed::Match;
use serde_json::json;

const T: Duration = Duration::from_secs(40);

fn condition(r: &NetworkConfigRevision, type_: &str) -> Option<(String, String)> {
    r.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

async fn only_revision(env: &Env, want_phase: RevisionPhase) -> NetworkConfigRevision {
    eventually(T, &format!("one revision {want_phase:?}"), || async {
        match revisions(&env.client).await.as_slice() {
            [r] if phase(r) == want_phase.as_str() => Ok(r.clone()),
            other => Err(format!("{:?}", other.iter().map(phase).collect::<Vec<_>>())),
        }
    })
    .await
}

async fn set_paused(env: &Env, name: &str, paused: bool) {
    Api::<NetworkConfigRevision>::all(env.client.clone())
        .patch(
            name,
            // As a tool an admin runs identifies itself (kubectl sends kubectl-patch, kubectl-edit, …).
            &PatchParams {
                field_manager: Some("ops-alice".into()),
                ..PatchParams::default()
            },
            &Patch::Merge(json!({"spec": {"paused": paused}})),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_stops_new_assignments_and_resume_completes() {
    let env = env().await;
    add_nodes(&env.client, &node_names(8)).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(400));
    apply_samples(&env.client).await;
    let (a, port) = args_with_metrics(&["--max-unavailable", "2"]);
    let c = Configurator::start(env.client.clone(), a);
    let rev = eventually(T, "a revision rolling out", || async {
        match revisions(&env.client).await.as_slice() {
            [r] if r.status.as_ref().is_some_and(|s| s.in_progress > 0) => {
                Ok(r.metadata.name.clone().unwrap())
            }
            other => Err(format!("{}", other.len())),
        }
    })
    .await;
    set_paused(&env, &rev, true).await;
    let paused = eventually(T, "the Paused condition", || async {
        let r = revisions(&env.client).await.remove(0);
        match condition(&r, RevisionCondition::Paused.as_str()) {
            Some((s, _)) if s == ConditionStatus::True.as_str() => Ok(r),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let st = paused.status.as_ref().unwrap();
    assert!(st.paused_at.is_some());
    let by = st.paused_by.as_deref().unwrap_or_default();
    assert!(by.starts_with("ops-alice at "), "pausedBy: {by:?}");
    assert!(
        condition(&paused, RevisionCondition::Paused.as_str())
            .is_some_and(|(_, reason)| reason == revision_reasons::PAUSED_BY_SPEC)
            && paused
                .status
                .as_ref()
                .unwrap()
                .conditions
                .iter()
                .any(|c| c.type_ == RevisionCondition::Paused.as_str()
                    && c.message.contains("set by ops-alice at ")),
        "the Paused condition names who paused"
    );
    // In-flight nodes finish; nobody new is assigned while paused.
    let assigned = eventually(T, "the in-flight nodes to finish", || async {
        let now = configs(&env.client).await;
        let busy = now
            .values()
            .filter(|c| in_flight(c) && c.spec.revision == rev)
            .count();
        (busy == 0)
            .then(|| now.values().filter(|c| c.spec.revision == rev).count())
            .ok_or(format!("{busy} in flight"))
    })
    .await;
    reconciles_pass(port, 2.0).await;
    let configs_now = configs(&env.client).await;
    assert_eq!(
        configs_now
            .values()
            .filter(|c| c.spec.revision == rev)
            .count(),
        assigned,
        "assigned while paused"
    );
    assert!(assigned < 8, "paused before the end ({assigned} assigned)");
    assert!(
        configs_now
            .values()
            .all(|c| !in_flight(c) || c.spec.revision != rev),
        "in-flight nodes finished"
    );

    set_paused(&env, &rev, false).await;
    let done = only_revision(&env, RevisionPhase::Complete).await;
    let st = done.status.unwrap();
    assert_eq!(st.updated, 8);
    assert_eq!(st.paused_by, None, "cleared on resume");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_progress_sets_the_deadline_condition() {
    let env = env().await;
    add_nodes(&env.client, &node_names(3)).await;
    // Agents never answer, and the apply timeout is long: only the progress deadline can say so.
    let silent: Behaviour = std::sync::Arc::new(|_, _| Answer::Silent);
    let _agents = spawn_agents(env.client.clone(), silent, Duration::from_millis(10));
    apply_samples(&env.client).await;
    let c = Configurator::start(
        env.client.clone(),
        args(&[
            "--max-unavailable",
            "1",
            "--progress-deadline",
            "2s",
            "--apply-timeout",
            "10m",
        ]),
    );
    let r = eventually(T, "Progressing=False", || async {
        let r = revisions(&env.client).await;
        match r
            .first()
            .and_then(|r| condition(r, RevisionCondition::Progressing.as_str()))
        {
            Some((s, reason)) if s == ConditionStatus::False.as_str() => Ok((reason, r[0].clone())),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(r.0, revision_reasons::PROGRESS_DEADLINE_EXCEEDED);
    assert_ne!(
        phase(&r.1),
        RevisionPhase::Failed.as_str(),
        "a stuck rollout is reported, not failed"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_joining_and_leaving_mid_rollout() {
    let env = env().await;
    add_nodes(&env.client, &node_names(6)).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(300));
    apply_samples(&env.client).await;
    let c = Configurator::start(env.client.clone(), args(&["--max-unavailable", "1"]));
    eventually(T, "the rollout to start", || async {
        let n = configs(&env.client).await.len();
        if n >= 1 { Ok(()) } else { Err(format!("{n}")) }
    })
    .await;
    let nodes: Api<Node> = Api::all(env.client.clone());
    create_node(
        &env.client,
        &node(
            "node-late",
            &[("node-restriction.kubernetes.io/netwave-pool", "compute")],
        ),
    )
    .await;
    nodes
        .delete("node-05", &DeleteParams::default())
        .await
        .unwrap();

    let rev = only_revision(&env, RevisionPhase::Complete).await;
    let st = rev.status.clone().unwrap();
    assert_eq!((st.total, st.updated, st.failed), (6, 6, 0), "{st:?}");
    let configs = configs(&env.client).await;
    assert!(
        !configs.contains_key("node-05"),
        "the departed node's config is removed"
    );
    assert_eq!(
        configs["node-late"].spec.revision,
        rev.metadata.name.unwrap(),
        "the new node got the target"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_revision_supersedes_a_running_one_within_budget() {
    let env = env().await;
    add_nodes(&env.client, &node_names(6)).await;
    let history = History::record(&env.client);
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(300));
    apply_samples(&env.client).await;
    let c = Configurator::start(env.client.clone(), args(&["--max-unavailable", "2"]));
    eventually(T, "the first rollout to be under way", || async {
        let n = configs(&env.client)
            .await
            .values()
            .filter(|c| !in_flight(c))
            .count();
        if n >= 2 {
            Ok(())
        } else {
            Err(format!("{n} updated"))
        }
    })
    .await;
    change_inputs(&env.client, 8500).await;
    let (first, second) = eventually(T, "the second revision to complete", || async {
        let revs = revisions(&env.client).await;
        match revs.as_slice() {
            [a, b] if phase(b) == RevisionPhase::Complete.as_str() => Ok((a.clone(), b.clone())),
            other => Err(format!("{:?}", other.iter().map(phase).collect::<Vec<_>>())),
        }
    })
    .await;
    assert_eq!(phase(&first), RevisionPhase::Superseded.as_str());
    let configs = configs(&env.client).await;
    assert!(
        configs
            .values()
            .all(|c| c.spec.revision == second.metadata.name.clone().unwrap())
    );
    assert!(configs.values().all(|c| {
        c.spec
            .config
            .layer2s
            .iter()
            .any(|l| l.vlan == 100 && l.mtu == 8500)
    }));
    c.stop().await;
    let max = history.max_in_flight();
    assert!(max <= 2, "superseding exceeded the budget: {max} in flight");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_applied_one_by_one_become_one_revision() {
    let env = env().await;
    add_nodes(&env.client, &node_names(4)).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(30));
    // The configurator is already running when the admin applies the sample directory, one object
    // every 150 ms: 2.7 s in all, longer than the window, but never quiet for a whole window (the
    // window is wide so that a stall of the test on a loaded machine does not look like quiet).
    let metrics_port = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let c = Configurator::start(
        env.client.clone(),
        args(&[
            "--max-unavailable",
            "2",
            "--input-settle",
            "2s",
            "--metrics-addr",
            &metrics_addr,
        ]),
    );
    let pending = || async move {
        let (_, text) = http_get(metrics_port, "/metrics").await;
        text.lines().find_map(|l| {
            l.strip_prefix("netwave_inputs_pending ")
                .map(|v| v.to_string())
        })
    };
    for m in netwave_api::manifest::samples().unwrap() {
        let netwave_api::manifest::Manifest::Input(o) = m else {
            continue;
        };
        common::create_input(&env.client, &o).await;
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(
            revisions(&env.client).await.is_empty(),
            "a revision was cut from a partial set of inputs"
        );
    }
    // Still within the window of the last object.
    assert_eq!(
        pending().await.as_deref(),
        Some("1"),
        "the settling shows in metrics"
    );
    let done = only_revision(&env, RevisionPhase::Complete).await;
    let inputs: Api<netwave_api::NetworkConfigInputs> = Api::all(env.client.clone());
    let inputs = inputs
        .get(done.metadata.name.as_deref().unwrap())
        .await
        .unwrap()
        .spec;
    assert_eq!(inputs.layer2s.len(), 12, "the whole directory");
    assert_eq!(inputs.routing_tables.len(), 2);
    assert_eq!(done.status.unwrap().updated, 4);
    assert_eq!(pending().await.as_deref(), Some("0"));
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reverting_the_inputs_brings_back_the_earlier_good_revision() {
    let env = env().await;
    add_nodes(&env.client, &node_names(4)).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(30));
    apply_samples(&env.client).await;
    let c = Configurator::start(env.client.clone(), args(&["--max-unavailable", "2"]));
    let first = only_revision(&env, RevisionPhase::Complete)
        .await
        .metadata
        .name
        .unwrap();
    change_inputs(&env.client, 8000).await;
    eventually(T, "the change to complete", || async {
        match revisions(&env.client).await.as_slice() {
            [_, b] if phase(b) == RevisionPhase::Complete.as_str() => Ok(()),
            other => Err(format!("{}", other.len())),
        }
    })
    .await;
    let second = revisions(&env.client).await[1]
        .metadata
        .name
        .clone()
        .unwrap();
    // Only the last good revision reads Complete: the first completed earlier and is superseded (its
    // status is written right after the second's).
    let before = eventually(T, "the first revision superseded", || async {
        let revs = revisions(&env.client).await;
        if phase(&revs[0]) == RevisionPhase::Superseded.as_str() {
            Ok(revs)
        } else {
            Err(phase(&revs[0]))
        }
    })
    .await;
    assert!(before[0].status.as_ref().unwrap().completed_at.is_some());
    change_inputs(&env.client, 9000).await; // the sample's original MTU
    // An admin waits for the revert to be done, as for any rollout.
    let wait = env
        .cp()
        .kubectl()
        .args([
            "wait",
            "--for=jsonpath={.status.phase}=Complete",
            "--timeout=60s",
            &format!("ncr/{first}"),
        ])
        .output()
        .unwrap();
    assert!(
        wait.status.success(),
        "kubectl wait: {}",
        String::from_utf8_lossy(&wait.stderr)
    );
    // It returned only once every node runs the first revision again.
    let configs_now = configs(&env.client).await;
    assert!(
        configs_now
            .values()
            .all(|c| c.spec.revision == first && !in_flight(c)),
        "kubectl wait returned early: {:?}",
        configs_now
            .values()
            .map(|c| (
                c.spec.revision.clone(),
                c.status.as_ref().and_then(|s| s.phase.clone())
            ))
            .collect::<Vec<_>>()
    );
    let back = revisions(&env.client).await;
    assert_eq!(back.len(), 2, "no third revision was created for a revert");
    let reverted = back
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some(first.as_str()))
        .unwrap();
    assert_eq!(reverted.spec.sequence, 1, "a revision's spec never changes");
    let st = reverted.status.as_ref().unwrap();
    assert_eq!(
        st.active_sequence,
        Some(3),
        "the target again under sequence 3"
    );
    assert!(st.reactivated_at.is_some());
    assert_eq!((st.updated, st.total), (4, 4));
    assert_eq!(netwave_api::effective_sequence(reverted), 3);
    eventually(T, "the second revision superseded", || async {
        let r = Api::<NetworkConfigRevision>::all(env.client.clone())
            .get(&second)
            .await
            .unwrap();
        if phase(&r) == RevisionPhase::Superseded.as_str() {
            Ok(())
        } else {
            Err(phase(&r))
        }
    })
    .await;
    // The reactivation is on record as an Event on the revision.
    let events = env
        .cp()
        .kubectl()
        .args([
            "get",
            "events",
            "-A",
            "--field-selector",
            "reason=RevisionReactivated",
            "-o",
            "jsonpath={.items[*].message}",
        ])
        .output()
        .unwrap();
    let note = String::from_utf8_lossy(&events.stdout).into_owned();
    assert!(
        note.contains(&first) && note.contains("sequence 3"),
        "RevisionReactivated Event: {note:?} {}",
        String::from_utf8_lossy(&events.stderr)
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_that_fails_validation_touches_no_node() {
    let env = env().await;
    add_nodes(&env.client, &node_names(3)).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(30));
    apply_samples(&env.client).await;
    // A second segment with VLAN 100's VNI: a fleet-wide error the schema cannot see.
    let mut dup: Layer2NetworkConfiguration = serde_json::from_value(json!({
        "apiVersion": "netwave.dev/v1alpha1", "kind": "Layer2NetworkConfiguration",
        "metadata": {"name": "vlan300-clash"},
        "spec": {"id": 300, "vni": 1000100, "mtu": 1500}
    }))
    .unwrap();
    dup.metadata.resource_version = None;
    Api::<Layer2NetworkConfiguration>::all(env.client.clone())
        .create(&PostParams::default(), &dup)
        .await
        .unwrap();
    let (a, port) = args_with_metrics(&[]);
    let c = Configurator::start(env.client.clone(), a);
    let r = only_revision(&env, RevisionPhase::Failed).await;
    let st = r.status.unwrap();
    assert!(
        st.validation.errors.iter().any(|e| e.contains("1000100")),
        "{st:#?}"
    );
    assert_eq!(
        condition_of(&st, RevisionCondition::Validated.as_str()),
        Some(ConditionStatus::False.as_str().into())
    );
    reconciles_pass(port, 2.0).await;
    assert!(
        configs(&env.client)
            .await
            .values()
            .all(|c| c.spec.revision != r.metadata.name.clone().unwrap())
    );
    c.stop().await;
}

/// #11's case: two routes the kernel holds as one (an IPv6 route without a metric has metric 1024) are
/// accepted by the API server, and used to pass fleet validation and then fail on every node the rollout
/// touched. Fleet validation runs the agent's model now: the revision fails with the field path and no
/// node gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_the_kernel_holds_as_one_fail_validation_and_touch_no_node() {
    let env = env().await;
    add_nodes(&env.client, &node_names(3)).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(30));
    let rt: netwave_api::RoutingTable = serde_json::from_value(json!({
        "apiVersion": "netwave.dev/v1alpha1", "kind": "RoutingTable",
        "metadata": {"name": "storage"},
        "spec": {"tableId": 300, "routes": [
            {"prefix": "fd00:300::/64", "dev": "lo"},
            {"prefix": "fd00:300::/64", "dev": "lo", "via": "fd00::1", "metric": 1024},
        ]}
    }))
    .unwrap();
    Api::<netwave_api::RoutingTable>::all(env.client.clone())
        .create(&PostParams::default(), &rt)
        .await
        .expect("the API server accepts it: the schema cannot see a route's kernel identity");
    let (a, port) = args_with_metrics(&[]);
    let c = Configurator::start(env.client.clone(), a);
    let r = only_revision(&env, RevisionPhase::Failed).await;
    let st = r.status.unwrap();
    assert!(
        st.validation.errors.iter().any(|e| e.starts_with(
            "RoutingTable/storage spec.routes[1]: the same kernel route as spec.routes[0] \
             (fd00:300::/64 table 300 metric 1024)"
        ) && e.contains("node-00")),
        "{:#?}",
        st.validation
    );
    reconciles_pass(port, 2.0).await;
    assert!(configs(&env.client).await.is_empty(), "no node was touched");
    // The Warning that the inputs equal a failed revision advises what can help: a retry cannot fix
    // a validation failure, so it says to fix the inputs, with the error.
    let advice = eventually(T, "the InputsEqualFailedRevision Event", || async {
        let o = env
            .cp()
            .kubectl()
            .args([
                "get",
                "events",
                "-A",
                "--field-selector",
                "reason=InputsEqualFailedRevision",
                "-o",
                "jsonpath={.items[*].message}",
            ])
            .output()
            .unwrap();
        let m = String::from_utf8_lossy(&o.stdout).into_owned();
        if m.is_empty() {
            Err("none yet".to_string())
        } else {
            Ok(m)
        }
    })
    .await;
    assert!(
        advice.contains("fix the inputs") && advice.contains("spec.routes[1]"),
        "{advice}"
    );
    assert!(!advice.contains("spec.retry"), "no retry advice: {advice}");
    c.stop().await;
}

/// An accidental `kubectl delete -f dir/` (every input object gone) is cut as a revision but created
/// paused with `DestructiveChange` saying what it removes; no node moves until an admin resumes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_every_input_is_created_paused_until_an_admin_resumes_it() {
    let env = env().await;
    add_nodes(&env.client, &node_names(3)).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(30));
    apply_samples(&env.client).await;
    let (a, port) = args_with_metrics(&["--max-unavailable", "3"]);
    let c = Configurator::start(env.client.clone(), a);
    let first = only_revision(&env, RevisionPhase::Complete)
        .await
        .metadata
        .name
        .unwrap();
    let before = configs(&env.client).await;

    let dp = DeleteParams::default();
    let lp = kube::api::ListParams::default();
    Api::<netwave_api::VRFRouteConfiguration>::all(env.client.clone())
        .delete_collection(&dp, &lp)
        .await
        .unwrap();
    Api::<Layer2NetworkConfiguration>::all(env.client.clone())
        .delete_collection(&dp, &lp)
        .await
        .unwrap();
    Api::<netwave_api::RoutingTable>::all(env.client.clone())
        .delete_collection(&dp, &lp)
        .await
        .unwrap();
    let guarded = eventually(T, "a second revision, paused by the guard", || async {
        let revs = revisions(&env.client).await;
        let seen = format!(
            "{:?}",
            revs.iter()
                .map(|r| (
                    &r.metadata.name,
                    r.spec.paused,
                    phase(r),
                    condition(r, RevisionCondition::Paused.as_str())
                ))
                .collect::<Vec<_>>()
        );
        revs.into_iter()
            .find(|r| r.metadata.name.as_deref() != Some(first.as_str()))
            .filter(|r| {
                condition(r, RevisionCondition::Paused.as_str())
                    .is_some_and(|(_, reason)| reason == revision_reasons::DESTRUCTIVE_CHANGE)
            })
            .ok_or(seen)
    })
    .await;
    assert!(guarded.spec.paused);
    let message = guarded
        .status
        .as_ref()
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == RevisionCondition::Paused.as_str())
        })
        .map(|c| c.message.clone())
        .unwrap();
    assert!(
        message.contains("removes ") && message.contains("vrf/") && message.contains("resume"),
        "{message}"
    );
    reconciles_pass(port, 2.0).await;
    let specs = |m: &std::collections::BTreeMap<String, netwave_api::NodeNetworkConfig>| {
        m.iter()
            .map(|(n, c)| (n.clone(), c.spec.revision.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        specs(&configs(&env.client).await),
        specs(&before),
        "no node moved"
    );

    // The admin means it: resumed, it rolls out like any revision.
    let name = guarded.metadata.name.clone().unwrap();
    set_paused(&env, &name, false).await;
    eventually(T, "the resumed revision to complete", || async {
        let r = Api::<NetworkConfigRevision>::all(env.client.clone())
            .get(&name)
            .await
            .unwrap();
        (phase(&r) == RevisionPhase::Complete.as_str())
            .then_some(())
            .ok_or_else(|| phase(&r))
    })
    .await;
    c.stop().await;
}

/// #48 item 3, as reported: the samples rolled out on 4 pooled nodes, then `kubectl label node --all
/// node-restriction.kubernetes.io/netwave-pool-` (a label-sync bug, a typo). The label change
/// re-renders the completed revision with nothing on any node. Its inputs did not change, so the
/// input hold never saw it: every VRF was removed from every node, unheld. Now the move is measured
/// on what the nodes run: the revision is held (paused, `DestructiveChange`, an Event), no node
/// config changes over many reconciles, and resuming it approves the removal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_pool_label_from_every_node_is_held_until_an_admin_resumes_it() {
    let env = env().await;
    add_nodes(&env.client, &node_names(4)).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(30));
    apply_samples(&env.client).await;
    let a = args(&["--max-unavailable", "4"]);
    let c = Configurator::start(env.client.clone(), a);
    let first = only_revision(&env, RevisionPhase::Complete)
        .await
        .name_any();
    let vrfs = |m: &std::collections::BTreeMap<String, netwave_api::NodeNetworkConfig>| {
        m.iter()
            .map(|(n, c)| (n.clone(), c.spec.config.vrfs.len()))
            .collect::<Vec<_>>()
    };
    let before = vrfs(&configs(&env.client).await);
    assert!(before.iter().all(|(_, n)| *n > 0), "{before:?}");

    // The labels go while no configurator runs (a label-sync job during a configurator restart), so
    // that the next leader sees the four at once and no node loses anything. (kubectl relabels node by
    // node: a leader that saw one first would re-render it, under the threshold, and hold the rest;
    // the next test walks that way on purpose.)
    c.stop().await;
    let label = "node-restriction.kubernetes.io/netwave-pool";
    kubectl(&env, &["label", "node", "--all", &format!("{label}-")]);
    let (a, port) = args_with_metrics(&["--max-unavailable", "4"]);
    let c = Configurator::start(env.client.clone(), a);
    let message = held_message(&env, &first).await;
    assert!(
        message.contains("takes 36 of the 48 items the nodes run off 4 node(s)")
            && message.contains("node-00 loses vrf/cluster vni 2001000, vrf/storage vni 2002000"),
        "{message}"
    );
    let event = eventually(T, "a DestructiveChange Event", || async {
        let notes = event_notes(&env.client, &first, "DestructiveChange").await;
        notes.into_iter().next().ok_or("none".to_string())
    })
    .await;
    eprintln!("{event}");
    reconciles_pass(port, 3.0).await;
    assert_eq!(
        vrfs(&configs(&env.client).await),
        before,
        "no node lost anything"
    );

    // The admin means it: resumed, the nodes are re-rendered without the pool's networks.
    set_paused(&env, &first, false).await;
    eventually(T, "the nodes re-rendered", || async {
        let now = vrfs(&configs(&env.client).await);
        now.iter()
            .all(|(_, n)| *n == 0)
            .then_some(())
            .ok_or(format!("{now:?}"))
    })
    .await;
    c.stop().await;
}

/// #48 item 3, the slow way: a label-sync job drops the pool label node by node, each re-render
/// completing before the next. Each step alone takes a quarter of the fleet's items or less, under the
/// threshold; measured over the walk, the third step takes 27 of 48 and is held: two nodes lost their
/// networks (under the threshold, as two small deletions would), the other two keep theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_pool_label_node_by_node_is_held_once_the_walk_takes_too_much() {
    let env = env().await;
    let names = node_names(4);
    add_nodes(&env.client, &names).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(30));
    apply_samples(&env.client).await;
    let c = Configurator::start(env.client.clone(), args(&["--max-unavailable", "4"]));
    let first = only_revision(&env, RevisionPhase::Complete)
        .await
        .name_any();
    let vrfs = |node: &str| {
        let node = node.to_string();
        let client = env.client.clone();
        async move { configs(&client).await[&node].spec.config.vrfs.len() }
    };
    let label = "node-restriction.kubernetes.io/netwave-pool-";
    for node in &names[..2] {
        kubectl(&env, &["label", "node", node, label]);
        eventually(T, &format!("{node} re-rendered"), || async {
            match vrfs(node).await {
                0 => Ok(()),
                n => Err(format!("{n} VRFs")),
            }
        })
        .await;
    }
    kubectl(&env, &["label", "node", &names[2], label]);
    let message = held_message(&env, &first).await;
    assert!(
        message.contains("takes 27 of the 48 items the nodes run off 3 node(s)"),
        "{message}"
    );
    kubectl(&env, &["label", "node", &names[3], label]);
    revision_where(&env, "the hold to cover node-03", |r| {
        r.name_any() == first && held(r) && paused_message(r).contains("36 of the 48 items")
    })
    .await;
    let kept = [vrfs(&names[2]).await, vrfs(&names[3]).await];
    assert_eq!(kept, [2, 2], "node-02 and node-03 keep their VRFs");
    c.stop().await;
}

/// An admin as the API server knows one: a ServiceAccount bound to a ClusterRole that may edit the
/// inputs and the revisions' knobs (spec.paused), nothing else. Not system:masters.
async fn admin(env: &Env, name: &str) -> kube::Client {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let pp = PatchParams::apply("netwave-tests").force();
    let sa: ServiceAccount = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": name, "namespace": "netwave-system"},
    }))
    .unwrap();
    Api::<ServiceAccount>::namespaced(env.client.clone(), "netwave-system")
        .patch(name, &pp, &Patch::Apply(&sa))
        .await
        .unwrap();
    let role: ClusterRole = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "netwave-network-admin"},
        "rules": [
            {"apiGroups": ["netwave.dev"],
             "resources": ["vrfrouteconfigurations", "layer2networkconfigurations", "routingtables"],
             "verbs": ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]},
            {"apiGroups": ["netwave.dev"],
             "resources": ["networkconfigrevisions", "networkconfiginputs", "nodenetworkconfigs"],
             "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["netwave.dev"], "resources": ["networkconfigrevisions"],
             "verbs": ["patch"]},
        ],
    }))
    .unwrap();
    Api::<ClusterRole>::all(env.client.clone())
        .patch("netwave-network-admin", &pp, &Patch::Apply(&role))
        .await
        .unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": format!("netwave-network-admin-{name}")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "netwave-network-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "netwave-system"}],
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(env.client.clone())
        .patch(
            &format!("netwave-network-admin-{name}"),
            &pp,
            &Patch::Apply(&binding),
        )
        .await
        .unwrap();
    let token = env
        .cp()
        .service_account_token(&env.client, "netwave-system", name, None)
        .await
        .unwrap();
    env.cp().client_with_token(&token).await.unwrap()
}

/// `kubectl delete vrf,l2,rt --all`, as `client`.
async fn delete_every_input(client: &kube::Client) {
    let (dp, lp) = (DeleteParams::default(), kube::api::ListParams::default());
    Api::<netwave_api::VRFRouteConfiguration>::all(client.clone())
        .delete_collection(&dp, &lp)
        .await
        .unwrap();
    Api::<Layer2NetworkConfiguration>::all(client.clone())
        .delete_collection(&dp, &lp)
        .await
        .unwrap();
    Api::<netwave_api::RoutingTable>::all(client.clone())
        .delete_collection(&dp, &lp)
        .await
        .unwrap();
}

/// Every object of `deploy/samples/`, created as `client`.
async fn apply_samples_as(client: &kube::Client) {
    apply_samples(client).await;
}

/// The revision named `name`, once `check` accepts it.
async fn revision_where(
    env: &Env,
    what: &str,
    check: impl Fn(&NetworkConfigRevision) -> bool,
) -> NetworkConfigRevision {
    eventually(T, what, || async {
        let revs = revisions(&env.client).await;
        let seen = format!(
            "{:?}",
            revs.iter()
                .map(|r| (
                    &r.metadata.name,
                    r.spec.paused,
                    phase(r),
                    condition(r, RevisionCondition::Paused.as_str())
                ))
                .collect::<Vec<_>>()
        );
        revs.into_iter().find(|r| check(r)).ok_or(seen)
    })
    .await
}

/// The Paused message of revision `name` once it is held.
async fn held_message(env: &Env, name: &str) -> String {
    let r = revision_where(env, "the revision held", |r| {
        r.name_any() == name && held(r)
    })
    .await;
    let message = paused_message(&r);
    eprintln!("{message}");
    message
}

fn paused_message(r: &NetworkConfigRevision) -> String {
    r.status
        .as_ref()
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == RevisionCondition::Paused.as_str())
        })
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

fn held(r: &NetworkConfigRevision) -> bool {
    r.spec.paused
        && condition(r, RevisionCondition::Paused.as_str()).is_some_and(|(s, reason)| {
            s == ConditionStatus::True.as_str() && reason == revision_reasons::DESTRUCTIVE_CHANGE
        })
}

fn annotation<'r>(r: &'r NetworkConfigRevision, key: &str) -> Option<&'r str> {
    r.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// Node configs that ever named one of `revisions` (watch history).
fn assigned_any(history: &History, revisions: &[&str]) -> Vec<String> {
    history
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Recorded::Config(c) if revisions.contains(&c.spec.revision.as_str()) => Some(format!(
                "{} → {}",
                c.metadata.name.clone().unwrap_or_default(),
                c.spec.revision
            )),
            _ => None,
        })
        .collect()
}

/// The reported sequence (issue #27, DESIGN.md §6): every input deleted is held; one small RoutingTable
/// applied while the hold is pending cuts a revision that removes the same objects from what the nodes
/// run (the 12 samples that select them), and it is held too. No node moves, over many reconciles, until the admin resumes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_while_a_deletion_is_held_is_held_too_until_an_admin_resumes_it() {
    let env = env().await;
    let alice = admin(&env, "ops-alice").await;
    add_nodes(&env.client, &node_names(4)).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(30));
    let history = History::record(&env.client);
    apply_samples_as(&alice).await;
    let port = free_port();
    let m = format!("127.0.0.1:{port}");
    let c = Configurator::start(
        env.client.clone(),
        args(&["--max-unavailable", "4", "--metrics-addr", &m]),
    );
    let first = only_revision(&env, RevisionPhase::Complete)
        .await
        .metadata
        .name
        .unwrap();

    delete_every_input(&alice).await;
    let deletion = revision_where(&env, "the deletion held", |r| {
        r.metadata.name.as_deref() != Some(first.as_str()) && held(r)
    })
    .await;
    let deletion = deletion.metadata.name.unwrap();
    Api::<netwave_api::RoutingTable>::all(alice.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "netwave.dev/v1alpha1", "kind": "RoutingTable",
                "metadata": {"name": "small"},
                "spec": {"tableId": 300, "routes": [{"prefix": "10.9.0.0/16", "type": "blackhole"}]},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let edit = revision_where(&env, "the edit held too", |r| {
        let n = r.metadata.name.as_deref();
        n != Some(first.as_str()) && n != Some(deletion.as_str()) && held(r)
    })
    .await;
    let name = edit.metadata.name.clone().unwrap();
    let message = paused_message(&edit);
    assert!(
        message.starts_with(&format!(
            "held: it removes 12 of the 12 objects the last good revision {first} has (from 4 node(s): \
             48 of 48 node placements)"
        )) && message.contains("resume it to approve"),
        "{message}"
    );
    assert_eq!(
        annotation(
            &edit,
            netwave_core::revision::DESTRUCTIVE_CHANGE_BASIS_ANNOTATION
        ),
        Some(format!("sequence 3 against {first}").as_str())
    );
    reconciles_pass(port, 5.0).await;
    assert_eq!(
        assigned_any(&history, &[&deletion, &name]),
        Vec::<String>::new(),
        "no node moved to a held revision"
    );
    assert!(
        configs(&env.client)
            .await
            .values()
            .all(|c| c.spec.revision == first),
        "every node still runs {first}"
    );

    // The admin approves: resumed, it rolls out and becomes the last good revision.
    Api::<NetworkConfigRevision>::all(alice.clone())
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paused": false}})),
        )
        .await
        .unwrap();
    revision_where(&env, "the approved edit complete", |r| {
        r.metadata.name.as_deref() == Some(name.as_str())
            && phase(r) == RevisionPhase::Complete.as_str()
    })
    .await;
    assert!(
        configs(&env.client)
            .await
            .values()
            .all(|c| c.spec.revision == name)
    );
    c.stop().await;
}

/// The normal install: the configurator cuts an empty first revision before any input exists, then
/// the samples complete. Deleting every input makes the inputs equal the empty revision's again; it is
/// made the target again, measured against the last good revision (the samples) and held: no node
/// moves until the admin resumes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reactivating_the_empty_first_revision_is_held_until_an_admin_resumes_it() {
    let env = env().await;
    let alice = admin(&env, "ops-alice").await;
    add_nodes(&env.client, &node_names(4)).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(30));
    let history = History::record(&env.client);
    let port = free_port();
    let m = format!("127.0.0.1:{port}");
    let c = Configurator::start(
        env.client.clone(),
        args(&["--max-unavailable", "4", "--metrics-addr", &m]),
    );
    let empty = only_revision(&env, RevisionPhase::Complete)
        .await
        .metadata
        .name
        .unwrap();
    apply_samples_as(&alice).await;
    let samples = revision_where(&env, "the samples complete", |r| {
        r.metadata.name.as_deref() != Some(empty.as_str())
            && phase(r) == RevisionPhase::Complete.as_str()
    })
    .await
    .metadata
    .name
    .unwrap();
    let mark = history.events().len();

    delete_every_input(&alice).await;
    let back = revision_where(&env, "the empty revision reactivated and held", |r| {
        r.metadata.name.as_deref() == Some(empty.as_str())
            && r.status
                .as_ref()
                .is_some_and(|s| s.active_sequence == Some(3))
            && held(r)
    })
    .await;
    let message = paused_message(&back);
    assert!(
        message.starts_with(&format!(
            "held: it removes 12 of the 12 objects the last good revision {samples} has (from 4 \
             node(s): 48 of 48 node placements)"
        )),
        "{message}"
    );
    assert_eq!(
        annotation(
            &back,
            netwave_core::revision::DESTRUCTIVE_CHANGE_BASIS_ANNOTATION
        ),
        Some(format!("sequence 3 against {samples}").as_str())
    );
    reconciles_pass(port, 5.0).await;
    let moved: Vec<String> = history.events()[mark..]
        .iter()
        .filter_map(|e| match e {
            Recorded::Config(c) if c.spec.revision == empty => c.metadata.name.clone(),
            _ => None,
        })
        .collect();
    assert_eq!(moved, Vec::<String>::new(), "no node moved back to {empty}");
    assert_eq!(revisions(&env.client).await.len(), 2, "no revision was cut");

    // Resumed by the admin, the deletion rolls out.
    Api::<NetworkConfigRevision>::all(alice.clone())
        .patch(
            &empty,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paused": false}})),
        )
        .await
        .unwrap();
    revision_where(&env, "the approved deletion complete", |r| {
        r.metadata.name.as_deref() == Some(empty.as_str())
            && phase(r) == RevisionPhase::Complete.as_str()
    })
    .await;
    c.stop().await;
}

fn condition_of(st: &netwave_api::NetworkConfigRevisionStatus, t: &str) -> Option<String> {
    st.conditions
        .iter()
        .find(|c| c.type_ == t)
        .map(|c| c.status.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_faults_slow_the_rollout_but_fail_nothing() {
    let env = std::sync::Arc::new(testbed_env().await);
    add_nodes(&env.client, &node_names(6)).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(30));
    apply_samples(&env.client).await;
    for verb in ["create", "patch", "update", "delete"] {
        env.tb().faults().fail_fraction(Match::verb(verb), 0.3, 500);
    }
    let c = Configurator::start(env.client.clone(), args(&["--max-unavailable", "2"]));
    let cutter = {
        let env = env.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(700));
            every.tick().await; // the first tick is at once
            loop {
                every.tick().await;
                env.tb().faults().cut_watches();
            }
        })
    };
    let r = only_revision(&env, RevisionPhase::Complete).await;
    cutter.abort();
    let st = r.status.unwrap();
    assert_eq!((st.updated, st.failed), (6, 0));
    assert!(st.failed_nodes.is_empty());
    let failed_writes = env.tb().counters();
    assert!(failed_writes.writes() > 0);
    c.stop().await;
}

/// The hold cannot be switched off by deleting its baseline (#48): with the configurator down, someone
/// deletes the last good revision's NetworkConfigInputs (so nothing can put them back from the current
/// inputs), then every input. The new revision has no last good inputs to be measured against, but the
/// hold also measures what the nodes run: it is held, naming what they would lose, and no node moves
/// until an admin resumes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_last_good_inputs_first_does_not_switch_the_hold_off() {
    let env = env().await;
    add_nodes(&env.client, &node_names(3)).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(30));
    let history = History::record(&env.client);
    apply_samples(&env.client).await;
    let c = Configurator::start(env.client.clone(), args(&["--max-unavailable", "3"]));
    let first = only_revision(&env, RevisionPhase::Complete)
        .await
        .metadata
        .name
        .unwrap();
    c.stop().await;

    Api::<NetworkConfigInputs>::all(env.client.clone())
        .delete(&first, &DeleteParams::default())
        .await
        .unwrap();
    delete_every_input(&env.client).await;
    let (a, port) = args_with_metrics(&["--max-unavailable", "3"]);
    let c = Configurator::start(env.client.clone(), a);
    let held_rev = revision_where(&env, "a revision held", |r| {
        r.metadata.name.as_deref() != Some(first.as_str()) && held(r)
    })
    .await;
    let name = held_rev.metadata.name.clone().unwrap();
    let message = held_message(&env, &name).await;
    assert!(
        message.contains("vrf/"),
        "names what the nodes lose: {message}"
    );
    reconciles_pass(port, 3.0).await;
    assert_eq!(
        assigned_any(&history, &[name.as_str()]),
        Vec::<String>::new(),
        "no node gets the held revision"
    );
    c.stop().await;
}

/// A content change that takes a tenant's service away is held like a removal (#48 item 7): every
/// route of the only routing table made a blackhole keeps the table, but the nodes would lose what it
/// delivers. The revision is held naming the table, and no node gets it until an admin resumes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_whose_every_route_becomes_a_blackhole_is_held() {
    let env = env().await;
    add_nodes(&env.client, &node_names(3)).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(30));
    let history = History::record(&env.client);
    let table = |delivers: bool| -> netwave_api::RoutingTable {
        let route = |prefix: &str, via: &str| match delivers {
            true => json!({"prefix": prefix, "via": via}),
            false => json!({"prefix": prefix, "type": "blackhole"}),
        };
        serde_json::from_value(json!({
            "apiVersion": "netwave.dev/v1alpha1", "kind": "RoutingTable",
            "metadata": {"name": "storage"},
            "spec": {"tableId": 300, "routes": [
                route("198.18.8.0/24", "198.18.0.1"),
                route("fd00:300::/64", "fd00::1"),
            ]}
        }))
        .unwrap()
    };
    let tables = Api::<netwave_api::RoutingTable>::all(env.client.clone());
    tables
        .create(&PostParams::default(), &table(true))
        .await
        .unwrap();
    let (a, port) = args_with_metrics(&["--max-unavailable", "3"]);
    let c = Configurator::start(env.client.clone(), a);
    let first = only_revision(&env, RevisionPhase::Complete)
        .await
        .name_any();
    let dropped = table(false);
    tables
        .patch(
            "storage",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": dropped.spec})),
        )
        .await
        .unwrap();
    let held_rev = revision_where(&env, "the blackholing revision held", |r| {
        r.name_any() != first && held(r)
    })
    .await;
    let name = held_rev.name_any();
    let message = held_message(&env, &name).await;
    assert!(
        message.contains("takes 3 of the 3 items") && message.contains("table/300"),
        "names the table the nodes lose: {message}"
    );
    reconciles_pass(port, 3.0).await;
    assert_eq!(
        assigned_any(&history, &[name.as_str()]),
        Vec::<String>::new(),
        "no node gets the held revision"
    );
    c.stop().await;
}
