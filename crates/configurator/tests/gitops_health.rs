//! #50, slice 1: what generic tools conclude about netwave's objects, on the real kube-apiserver. A
//! GitOps engine syncs the input objects (VRFs, layer-2 segments, routing tables); it may go on to its
//! next wave or cluster only once the change reached the nodes, and must stop at a failed or held one.
//! The objects are taken from the API server in every phase a rollout goes through and judged by the
//! libraries those tools use (`tests/gitops-health`): cli-utils' kstatus (`kubectl wait`, Flux) and
//! netwave's Argo CD health check (`deploy/argocd/resource_customizations/netwave.dev/_/health.lua`)
//! in gopher-lua, as Argo CD runs it.
//!
//! `NETWAVE_RECORD_HEALTH_TESTDATA=1` writes the objects it judges into that health check's `testdata/`
//! and `health_test.yaml` (Argo CD's format, to propose it upstream); the test always runs those
//! committed cases too.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams};
use netwave_api::vocab::RevisionPhase;
use netwave_api::{InputKind, NetworkConfigRevision, NodeNetworkConfig};
use serde_json::Value;

const T: Duration = Duration::from_secs(90);

fn customizations() -> PathBuf {
    repo().join("deploy/argocd/resource_customizations")
}

/// What the tools say about one object.
#[derive(Clone, Debug, PartialEq)]
struct Judged {
    /// kstatus: `Current`, `InProgress`, `Failed`, …, and why.
    kstatus: String,
    kstatus_message: String,
    /// Argo CD: `Healthy`, `Progressing`, `Degraded`, `Suspended`, …
    health: String,
    message: String,
    object: Value,
}

/// Every input object and revision on the server, judged by kstatus and the Argo CD health check,
/// by `Kind/name`.
async fn judge(client: &kube::Client) -> BTreeMap<String, Judged> {
    let mut objects: Vec<Value> = Vec::new();
    for kind in InputKind::ALL {
        let api = Api::<DynamicObject>::all_with(client.clone(), &kind.api_resource());
        for o in api.list(&ListParams::default()).await.unwrap().items {
            objects.push(serde_json::to_value(o).unwrap());
        }
    }
    let revs = Api::<NetworkConfigRevision>::all(client.clone());
    for r in revs.list(&ListParams::default()).await.unwrap().items {
        let mut v = serde_json::to_value(r).unwrap();
        v["apiVersion"] = "netwave.dev/v1alpha1".into();
        v["kind"] = "NetworkConfigRevision".into();
        objects.push(v);
    }
    judge_objects(objects)
}

/// `objects` judged by kstatus and the Argo CD health check, by `Kind/name`.
fn judge_objects(objects: Vec<Value>) -> BTreeMap<String, Judged> {
    let tool = netwave_control_plane::gitops_health().unwrap();
    let mut child = Command::new(tool)
        .arg("check")
        .arg(customizations())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let input = serde_json::to_vec(&objects).unwrap();
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "gitops-health check: {}", out.status);
    let mut judged = BTreeMap::new();
    for (line, object) in String::from_utf8(out.stdout).unwrap().lines().zip(objects) {
        let v: Value = serde_json::from_str(line).unwrap();
        let key = format!(
            "{}/{}",
            v["kind"].as_str().unwrap(),
            v["name"].as_str().unwrap()
        );
        judged.insert(
            key,
            Judged {
                kstatus: v["kstatus"]["status"].as_str().unwrap().to_string(),
                kstatus_message: v["kstatus"]["message"].as_str().unwrap_or("").to_string(),
                health: v["health"]["status"].as_str().unwrap_or("none").to_string(),
                message: v["health"]["message"].as_str().unwrap_or("").to_string(),
                object,
            },
        );
    }
    judged
}

/// Waits until every input object is judged `(kstatus, health)` (the configurator writes their
/// statuses one by one); returns all judgements then.
async fn until_inputs_judged(
    client: &kube::Client,
    want: (&str, &str),
) -> BTreeMap<String, Judged> {
    let what = format!("every input object to be judged {want:?}");
    eventually(T, &what, || async {
        let j = judge(client).await;
        let off: Vec<_> = (j.iter())
            .filter(|(k, _)| !k.starts_with("NetworkConfigRevision/"))
            .filter(|(_, x)| (x.kstatus.as_str(), x.health.as_str()) != want)
            .map(|(k, x)| format!("{k}: {} {} {}", x.kstatus, x.health, x.message))
            .collect();
        if off.is_empty() {
            Ok(j)
        } else {
            Err(off.join("; "))
        }
    })
    .await
}

/// The revision (`NetworkConfigRevision/name`) whose inputs set the segment's MTU to `mtu`.
async fn revision_with_mtu(client: &kube::Client, mtu: u32) -> String {
    let want = format!("\"mtu\":{mtu}");
    eventually(T, &format!("a revision with mtu {mtu}"), || async {
        let inputs = Api::<netwave_api::NetworkConfigInputs>::all(client.clone());
        let list = inputs.list(&ListParams::default()).await.unwrap();
        list.items
            .iter()
            .find(|i| serde_json::to_string(&i.spec).unwrap().contains(&want))
            .map(|i| format!("NetworkConfigRevision/{}", i.metadata.name.clone().unwrap()))
            .ok_or_else(|| "none yet".to_string())
    })
    .await
}

/// Asserts `(kstatus, health)` of every object whose key starts with `prefix`.
fn all_are(j: &BTreeMap<String, Judged>, prefix: &str, want: (&str, &str)) {
    let of: Vec<_> = j.iter().filter(|(k, _)| k.starts_with(prefix)).collect();
    assert!(!of.is_empty(), "no {prefix}");
    for (k, x) in of {
        assert_eq!(
            (x.kstatus.as_str(), x.health.as_str()),
            want,
            "{k}: {} (kstatus: {}) {}",
            x.message,
            x.kstatus_message,
            x.object["status"]
        );
    }
}

/// A case of the Argo CD health check's tests: the object written into `testdata/`.
struct Case {
    file: String,
    judged: Judged,
}

fn case(j: &BTreeMap<String, Judged>, key: &str, file: &str) -> Case {
    Case {
        file: file.to_string(),
        judged: j[key].clone(),
    }
}

/// Writes the cases as Argo CD's `health_test.yaml` and `testdata/` (metadata the server fills in for
/// its own bookkeeping left out).
fn record(cases: &[Case]) {
    let dir = customizations().join("netwave.dev/_");
    let mut tests = String::from("tests:\n");
    for c in cases {
        let mut o = c.judged.object.clone();
        let meta = o["metadata"].as_object_mut().unwrap();
        for k in ["managedFields", "uid", "resourceVersion", "ownerReferences"] {
            meta.remove(k);
        }
        let path = format!("testdata/{}.yaml", c.file);
        std::fs::write(dir.join(&path), serde_saphyr::to_string(&o).unwrap()).unwrap();
        tests.push_str(&format!(
            "- healthStatus:\n    status: {}\n    message: {}\n  inputPath: {path}\n",
            c.judged.health,
            serde_json::to_string(&c.judged.message).unwrap()
        ));
    }
    std::fs::write(dir.join("health_test.yaml"), tests).unwrap();
}

/// The committed cases pass in gopher-lua as Argo CD runs them.
fn committed_cases_pass() {
    let tool = netwave_control_plane::gitops_health().unwrap();
    let out = Command::new(tool)
        .arg("test")
        .arg(customizations())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(out.status.success(), "{text}");
}

/// The answer of every node's agent, by the MTU of the segment it is given: 1300 never answers (a
/// rollout in progress), 1400 fails.
fn agents(client: &kube::Client) -> Task {
    let behaviour: netwave_agent::sim::Behaviour = Arc::new(|nnc: &NodeNetworkConfig| {
        let mtus: Vec<u32> = nnc.spec.config.layer2s.iter().map(|l| l.mtu).collect();
        if mtus.contains(&1300) {
            Answer::Silent
        } else if mtus.contains(&1400) {
            Answer::Invalid {
                reason: Reason::HealthCheckFailed,
                message: "probe gateway 10.250.0.1: no answer".into(),
            }
        } else {
            Answer::Provisioned
        }
    });
    Task(netwave_agent::sim::spawn(
        client.clone(),
        behaviour,
        Duration::from_millis(100),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kstatus_and_argo_cd_see_every_phase_of_a_rollout_as_netwave_does() {
    let env = env().await;
    let c = &env.client;
    add_nodes(c, &node_names(3)).await;
    let _agents = agents(c);
    let _configurator = Configurator::start(
        c.clone(),
        args(&["--max-unavailable", "1", "--destructive-threshold", "1"]),
    );
    apply_samples(c).await;
    // Objects created one by one may cut an intermediate revision first.
    eventually(T, "the newest revision to complete", || async {
        let revs = revisions(c).await;
        match revs.last() {
            Some(r) if phase(r) == RevisionPhase::Complete.as_str() => Ok(()),
            _ => Err(format!("{:?}", revs.iter().map(phase).collect::<Vec<_>>())),
        }
    })
    .await;
    let l2 = "Layer2NetworkConfiguration/vlan100-frontend";

    // Complete: every input is Ready (kstatus Current, Argo CD Healthy), and so is the revision.
    let done = until_inputs_judged(c, ("Current", "Healthy")).await;
    for kind in [
        "VRFRouteConfiguration/",
        "Layer2NetworkConfiguration/",
        "RoutingTable/",
    ] {
        all_are(&done, kind, ("Current", "Healthy"));
    }
    all_are(&done, "NetworkConfigRevision/", ("Current", "Healthy"));
    // Just synced (generation 1 more than the status judged): in progress, whatever it said before.
    let mut synced = done[l2].object.clone();
    let judged_gen = synced["status"]["observedGeneration"].as_i64().unwrap();
    synced["metadata"]["generation"] = (judged_gen + 1).into();
    let just_synced = judge_objects(vec![synced]);
    let just = &just_synced[l2];
    assert_eq!(
        (just.kstatus.as_str(), just.health.as_str()),
        ("InProgress", "Progressing"),
        "{}",
        just.message
    );
    let mut cases = vec![
        case(&just_synced, l2, "input_synced"),
        case(&done, l2, "input_ready"),
        case(
            &done,
            done.keys()
                .find(|k| k.starts_with("NetworkConfigRevision/"))
                .unwrap(),
            "revision_complete",
        ),
    ];

    // A change rolling out (its first node never answers): the changed segment and every other input
    // in the same revision are in progress, not healthy.
    change_inputs(c, 1300).await;
    let rolling_rev = revision_with_mtu(c, 1300).await;
    let rolling = until_inputs_judged(c, ("InProgress", "Progressing")).await;
    assert_eq!(
        (
            rolling[&rolling_rev].kstatus.as_str(),
            rolling[&rolling_rev].health.as_str()
        ),
        ("InProgress", "Progressing")
    );
    cases.push(case(&rolling, l2, "input_progressing"));
    cases.push(case(&rolling, &rolling_rev, "revision_progressing"));

    // Another change, which fails on its first node: its inputs are stalled (Degraded), as is the
    // revision. The one rolling out stays the target (the newest that has not failed).
    change_inputs(c, 1400).await;
    let failed_rev = revision_with_mtu(c, 1400).await;
    let failed = until_inputs_judged(c, ("Failed", "Degraded")).await;
    let rev_phase = |j: &BTreeMap<String, Judged>, k: &str| {
        j[k].object["status"]["phase"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let judged =
        |j: &BTreeMap<String, Judged>, k: &str| (j[k].kstatus.clone(), j[k].health.clone());
    let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
    assert_eq!(
        rev_phase(&failed, &failed_rev),
        RevisionPhase::Failed.as_str()
    );
    assert_eq!(judged(&failed, &failed_rev), pair("Failed", "Degraded"));
    assert_eq!(
        judged(&failed, &rolling_rev),
        pair("InProgress", "Progressing")
    );
    assert!(
        failed[l2].message.contains("node(s) failed"),
        "{}",
        failed[l2].message
    );
    cases.push(case(&failed, l2, "input_failed"));
    cases.push(case(&failed, &failed_rev, "revision_failed"));

    // Back to a good MTU, minus a routing table: held as a destructive change (threshold 1 %). The
    // inputs wait for an admin: stalled for kstatus, Suspended for Argo CD; neither says healthy.
    change_inputs(c, 9000).await;
    // `oob` is on every node (`edge-uplink` on none of these).
    let tables = Api::<DynamicObject>::all_with(c.clone(), &InputKind::RoutingTable.api_resource());
    tables
        .delete("oob", &DeleteParams::default())
        .await
        .unwrap();
    let held = until_inputs_judged(c, ("Failed", "Suspended")).await;
    let held_key = (held.iter())
        .find(|(k, x)| {
            k.starts_with("NetworkConfigRevision/") && x.object["spec"]["paused"] == true
        })
        .map(|(k, _)| k)
        .expect("a held revision");
    assert_eq!(judged(&held, held_key), pair("Failed", "Suspended"));
    assert!(
        held[l2].message.starts_with("held: it removes"),
        "{}",
        held[l2].message
    );
    cases.push(case(&held, l2, "input_held"));
    cases.push(case(&held, held_key, "revision_held"));
    // The rollout the held revision replaced as the target is superseded: nothing to wait for.
    assert_eq!(
        rev_phase(&held, &rolling_rev),
        RevisionPhase::Superseded.as_str()
    );
    assert_eq!(judged(&held, &rolling_rev), pair("Current", "Healthy"));
    cases.push(case(&held, &rolling_rev, "revision_superseded"));

    if std::env::var_os("NETWAVE_RECORD_HEALTH_TESTDATA").is_some() {
        record(&cases);
    }
    committed_cases_pass();
}

/// The configurator's `Quarantined` condition on a node config, applied as its writer applies it
/// (server-side, its own field manager, forced).
async fn quarantine(nncs: &Api<NodeNetworkConfig>, name: &str) {
    let patch = serde_json::json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "NodeNetworkConfig",
        "status": {"conditions": [{
            "type": netwave_api::QUARANTINED_CONDITION,
            "status": "True",
            "reason": "Quarantined",
            "message": "failed 3 revisions in a row that others provisioned",
            "lastTransitionTime": "2026-12-02T00:00:00Z",
        }]},
    });
    let apply = kube::api::PatchParams::apply(netwave_api::vocab::managers::CONFIGURATOR).force();
    nncs.patch_status(name, &apply, &kube::api::Patch::Apply(&patch))
        .await
        .unwrap();
}

/// A node config on the server, with the spec of `revision`.
async fn node_config(
    nncs: &Api<NodeNetworkConfig>,
    name: &str,
    revision: &str,
) -> NodeNetworkConfig {
    let spec = netwave_api::NodeNetworkConfigSpec {
        revision: revision.into(),
        sequence: 1,
        config_hash: format!("hash-of-{revision}"),
        retry: 0,
        config: Default::default(),
    };
    let nnc = NodeNetworkConfig::new(name, spec);
    nncs.create(&kube::api::PostParams::default(), &nnc)
        .await
        .unwrap()
}

/// Writes what the agent writes: `Provisioning`, then `answer` (as `netwave_agent::sim` does, with the
/// agent's own status code); returns the object after each write.
async fn agent_reports(
    nncs: &Api<NodeNetworkConfig>,
    nnc: &NodeNetworkConfig,
    answer: &Answer,
) -> (NodeNetworkConfig, NodeNetworkConfig) {
    use netwave_agent::sim;
    let name = nnc.metadata.name.clone().unwrap();
    let provisioning = sim::provisioning_for(nnc, answer).unwrap();
    let during = sim::write_status(nncs, &name, &sim::status_apply(&provisioning), 3)
        .await
        .unwrap();
    let body = sim::answer_after(&during, &provisioning, answer).unwrap();
    let after = sim::write_status(nncs, &name, &body, 3).await.unwrap();
    (during, after)
}

fn as_object(nnc: &NodeNetworkConfig) -> Value {
    let mut v = serde_json::to_value(nnc).unwrap();
    v["apiVersion"] = "netwave.dev/v1alpha1".into();
    v["kind"] = "NodeNetworkConfig".into();
    v
}

fn condition_types(nnc: &NodeNetworkConfig) -> Vec<String> {
    let mut t: Vec<String> = (nnc.status.iter())
        .flat_map(|s| s.conditions.iter().map(|c| c.type_.clone()))
        .collect();
    t.sort();
    t
}

/// NodeNetworkConfigs (#50): kstatus and the Argo CD health check say whether the node runs the config
/// it was given, from what the agent writes beside its verdict (on kube-apiserver): in progress while
/// it applies it and again once the spec changes under it, current once it runs it, failed when it
/// refused it. The agent's conditions and the configurator's `Quarantined` live side by side in one
/// list (a map keyed by type): neither writer removes the other's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_configs_say_whether_their_node_runs_its_config() {
    let env = env().await;
    let nncs = Api::<NodeNetworkConfig>::all(env.client.clone());
    let nnc = node_config(&nncs, "node-00", "rev-a").await;
    quarantine(&nncs, "node-00").await;
    let (during, done) = agent_reports(&nncs, &nnc, &Answer::Provisioned).await;
    let j = |o: &NodeNetworkConfig| {
        let judged = judge_objects(vec![as_object(o)]);
        let x = &judged["NodeNetworkConfig/node-00"];
        (x.kstatus.clone(), x.health.clone(), x.message.clone())
    };
    assert_eq!(j(&during).0, "InProgress", "{:?}", j(&during));
    assert_eq!(j(&during).1, "Progressing");
    assert_eq!(
        (j(&done).0, j(&done).1),
        ("Current".to_string(), "Healthy".to_string())
    );
    assert_eq!(
        condition_types(&done),
        ["Quarantined", "Ready", "Reconciling", "Stalled"],
        "the agent's conditions beside the configurator's"
    );
    // The configurator lifts the quarantine (applies no condition): the agent's stay.
    let lift = serde_json::json!({"apiVersion": "netwave.dev/v1alpha1", "kind": "NodeNetworkConfig",
                                  "status": {"conditions": []}});
    let apply = kube::api::PatchParams::apply(netwave_api::vocab::managers::CONFIGURATOR).force();
    let lifted = nncs
        .patch_status("node-00", &apply, &kube::api::Patch::Apply(&lift))
        .await
        .unwrap();
    assert_eq!(
        condition_types(&lifted),
        ["Ready", "Reconciling", "Stalled"]
    );

    // A new config: in progress until the agent has judged it, whatever it said of the last one.
    let moved = nncs
        .patch(
            "node-00",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                serde_json::json!({"spec": {"revision": "rev-b", "configHash": "hash-of-rev-b"}}),
            ),
        )
        .await
        .unwrap();
    let (kstatus, health, message) = j(&moved);
    assert_eq!(
        (kstatus.as_str(), health.as_str()),
        ("InProgress", "Progressing"),
        "{message}"
    );
    quarantine(&nncs, "node-00").await;
    let refused = Answer::Invalid {
        reason: Reason::HealthCheckFailed,
        message: "probe gateway 10.250.0.1: no answer".into(),
    };
    let (_, failed) = agent_reports(&nncs, &moved, &refused).await;
    let (kstatus, health, message) = j(&failed);
    assert_eq!(
        (kstatus.as_str(), health.as_str()),
        ("Failed", "Degraded"),
        "{message}"
    );
    assert!(message.contains("HealthCheckFailed"), "{message}");
    assert_eq!(
        condition_types(&failed),
        ["Quarantined", "Ready", "Reconciling", "Stalled"]
    );
}

/// A 0.2.0 agent under the 0.1.0 NodeNetworkConfig CRD (during a downgrade): that CRD has no
/// `status.observedGeneration` and its `conditions` list is atomic and the configurator's, so the
/// agent's forced apply of its conditions would take the whole list over and drop `Quarantined`. The
/// agent leaves both out there, and its verdict still lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_the_older_crd_the_agent_leaves_the_configurators_conditions_alone() {
    let env = env().await;
    let older: Vec<_> = netwave_api::crds()
        .into_iter()
        .map(|(_, mut crd)| {
            if crd.spec.names.kind == "NodeNetworkConfig" {
                let mut v = serde_json::to_value(&crd).unwrap();
                for version in v["spec"]["versions"].as_array_mut().unwrap() {
                    let status = &mut version["schema"]["openAPIV3Schema"]["properties"]["status"];
                    status["properties"]
                        .as_object_mut()
                        .unwrap()
                        .remove("observedGeneration");
                    let conditions = status["properties"]["conditions"].as_object_mut().unwrap();
                    for k in [
                        "x-kubernetes-list-type",
                        "x-kubernetes-list-map-keys",
                        "maxItems",
                    ] {
                        conditions.remove(k);
                    }
                }
                crd = serde_json::from_value(v).unwrap();
            }
            crd
        })
        .collect();
    let nncs = Api::<NodeNetworkConfig>::all(env.client.clone());
    let nnc = node_config(&nncs, "node-00", "rev-a").await;
    // In effect once the server takes nine conditions, which this tree's CRD bounds at eight.
    let probe = || async {
        let nine: Vec<Value> = (0..9)
            .map(|i| {
                serde_json::json!({"type": format!("T{i}"), "status": "True", "reason": "R",
                                   "message": "", "lastTransitionTime": "2026-12-02T00:00:00Z"})
            })
            .collect();
        let body = serde_json::json!({"status": {"conditions": nine}});
        let dry = kube::api::PatchParams::default().dry_run();
        nncs.patch_status("node-00", &dry, &kube::api::Patch::Merge(&body))
            .await
            .map(drop)
    };
    env.cp()
        .install_crds_validating(&env.client, older, true, probe)
        .await
        .unwrap();
    quarantine(&nncs, "node-00").await;
    let (_, done) = agent_reports(&nncs, &nnc, &Answer::Provisioned).await;
    let st = done.status.clone().unwrap();
    assert_eq!(st.phase.as_deref(), Some("Provisioned"));
    assert_eq!(
        condition_types(&done),
        ["Quarantined"],
        "{:?}",
        st.conditions
    );
    assert_eq!(st.observed_generation, None);
    // Back to this tree's CRDs for the next test on this server.
    env.cp()
        .install_crds_validating(
            &env.client,
            netwave_api::crds().into_iter().map(|(_, c)| c),
            false,
            probe,
        )
        .await
        .unwrap();
}
