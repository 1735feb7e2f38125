//! #50, slice 2: one network change rolled across clusters in waves by a real GitOps engine, halted by
//! the first cluster whose netwave halts it.
//!
//! Three clusters (a kube-apiserver each, with its own configurator and simulated agents) take their
//! netwave inputs from one Git repository through Flux (source-controller and kustomize-controller
//! v1.9.6, built from Go modules) running on the canary's API server, with the manifests a user copies
//! (`deploy/flux/fleet.yaml`): the canary first, the other two `dependsOn` it, every Kustomization
//! `wait: true`. Nothing here sequences the clusters but Flux reading netwave's kstatus conditions.
//!
//! - A good change reaches the canary, completes there, and only then reaches the other two.
//! - A bad change (the canary's first node reports it invalid) fails the canary's revision; its nodes are
//!   back on the last good revision; Flux marks the canary's Kustomization unhealthy and never applies
//!   the change to the other two: 0 of their node configs change.
//! - Reverting the commit brings the canary back to Ready and the rest apply the revert, which changes
//!   nothing on their nodes.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use netwave_api::vocab::RevisionPhase;
use netwave_api::{NetworkConfigRevision, NodeNetworkConfig};
use netwave_control_plane::flux::{self, Flux};
use netwave_control_plane::{ControlPlane, Options};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(180);
/// The segment whose MTU the changes set, and where it is in the repository.
const SEGMENT: &str = "vlan100-frontend";
const LAYER2: &str = "network/layer2.yaml";
/// The MTU the canary's agents report invalid (the probe behind the segment fails).
const BAD_MTU: u32 = 1400;

/// How long a node's agent takes to apply a config and answer: a cluster's rollout (three nodes, one
/// at a time) takes several seconds, longer than Flux takes to apply a commit to the next cluster if
/// nothing made it wait for the canary's rollout.
const AGENT_DELAY: Duration = Duration::from_millis(1500);

/// One cluster: its API server, configurator and simulated agents.
struct Cluster {
    name: &'static str,
    cp: ControlPlane,
    client: kube::Client,
    _configurator: Configurator,
    _agents: Task,
}

async fn cluster(name: &'static str) -> Cluster {
    let cp = ControlPlane::start(Options::default())
        .await
        .expect("a control plane starts");
    let client = prepare(&cp).await;
    add_nodes(&client, &node_names(3)).await;
    let behaviour: netwave_agent::sim::Behaviour = Arc::new(|nnc: &NodeNetworkConfig| {
        if (nnc.spec.config.layer2s.iter()).any(|l| l.mtu == BAD_MTU) {
            Answer::Invalid {
                reason: Reason::HealthCheckFailed,
                message: "probe gateway 10.250.0.1: no answer".into(),
            }
        } else {
            Answer::Provisioned
        }
    });
    let agents = Task(netwave_agent::sim::spawn(
        client.clone(),
        behaviour,
        AGENT_DELAY,
    ));
    let configurator = Configurator::start(client.clone(), args(&["--max-unavailable", "1"]));
    Cluster {
        name,
        cp,
        client,
        _configurator: configurator,
        _agents: agents,
    }
}

/// The repository's `network/` directory: netwave's samples, as an admin keeps them in Git.
fn samples() -> Vec<(String, String)> {
    ["layer2.yaml", "routing-tables.yaml", "vrfs.yaml"]
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(repo().join("deploy/samples").join(f)).unwrap();
            (format!("network/{f}"), text)
        })
        .collect()
}

/// `network/layer2.yaml` with the segment's MTU set to `mtu` (the samples' first `mtu:` is its own).
fn layer2_with_mtu(mtu: u32) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo().join("deploy/samples/layer2.yaml")).unwrap();
    let at = text.find(&format!("name: {SEGMENT}")).unwrap();
    let line = at + text[at..].find("  mtu: 9000\n").unwrap();
    let changed = format!(
        "{}  mtu: {mtu}\n{}",
        &text[..line],
        &text[line + "  mtu: 9000\n".len()..]
    );
    vec![(LAYER2.to_string(), changed)]
}

/// `deploy/flux/fleet.yaml` as the test runs it: the local repository, and intervals of seconds.
fn fleet_manifests(url: &str) -> String {
    let text = std::fs::read_to_string(repo().join("deploy/flux/fleet.yaml")).unwrap();
    let mut out = text.clone();
    for (from, to) in [
        ("https://git.example.com/network/fleet.git", url),
        ("interval: 1m\n", "interval: 2s\n"),
        ("interval: 10m\n", "interval: 20s\n"),
        ("retryInterval: 1m\n", "retryInterval: 2s\n"),
    ] {
        assert!(out.contains(from), "deploy/flux/fleet.yaml has no {from:?}");
        out = out.replace(from, to);
    }
    out
}

fn kustomizations() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "kustomize.toolkit.fluxcd.io",
        "v1",
        "Kustomization",
    ))
}

/// A Flux object's `Ready` condition (null when it has none).
fn ready_of(status: &Value) -> Value {
    (status["conditions"].as_array().into_iter().flatten())
        .find(|c| c["type"] == "Ready")
        .cloned()
        .unwrap_or(Value::Null)
}

/// A Kustomization's `(Ready status, reason, message, lastAppliedRevision)`.
async fn kustomization(hub: &kube::Client, name: &str) -> (String, String, String, String) {
    let api =
        Api::<DynamicObject>::namespaced_with(hub.clone(), flux::NAMESPACE, &kustomizations());
    let k = api.get(name).await.unwrap();
    let status = &k.data["status"];
    let ready = ready_of(status);
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    (
        s(&ready["status"]),
        s(&ready["reason"]),
        s(&ready["message"]),
        s(&status["lastAppliedRevision"]),
    )
}

/// What Flux says: each GitRepository's and Kustomization's Ready condition and revision, for failures.
async fn fleet_state(hub: &kube::Client) -> String {
    let repos = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "source.toolkit.fluxcd.io",
        "v1",
        "GitRepository",
    ));
    let mut out = Vec::new();
    for ar in [repos, kustomizations()] {
        let api = Api::<DynamicObject>::namespaced_with(hub.clone(), flux::NAMESPACE, &ar);
        for o in api.list(&Default::default()).await.unwrap().items {
            let st = &o.data["status"];
            let c = ready_of(st);
            let ready = format!("{} {} {}", c["status"], c["reason"], c["message"]);
            let rev =
                (st.get("artifact").map(|a| &a["revision"])).unwrap_or(&st["lastAppliedRevision"]);
            out.push(format!(
                "{} {}: {ready} at {rev}",
                ar.kind,
                o.metadata.name.unwrap_or_default()
            ));
        }
    }
    out.join("; ")
}

/// The segment's MTU on a cluster (None before Flux created it).
async fn segment_mtu(c: &kube::Client) -> Option<u64> {
    let api: Api<netwave_api::Layer2NetworkConfiguration> = Api::all(c.clone());
    api.get_opt(SEGMENT)
        .await
        .unwrap()
        .map(|l| u64::from(l.spec.mtu))
}

/// The newest revision on a cluster whose segment has `mtu`, if any, and its phase.
async fn revision_with(c: &kube::Client, mtu: u32) -> Option<(String, String)> {
    let inputs = Api::<netwave_api::NetworkConfigInputs>::all(c.clone());
    let list = inputs.list(&Default::default()).await.unwrap();
    let want = format!("\"mtu\":{mtu}");
    let names: Vec<String> = (list.items.iter())
        .filter(|i| serde_json::to_string(&i.spec).unwrap().contains(&want))
        .filter_map(|i| i.metadata.name.clone())
        .collect();
    let revs: Vec<NetworkConfigRevision> = revisions(c).await;
    revs.iter()
        .rev()
        .find(|r| names.iter().any(|n| Some(n) == r.metadata.name.as_ref()))
        .map(|r| (r.metadata.name.clone().unwrap(), phase(r)))
}

/// Every node config's generation and spec, by node: what a change moves.
async fn node_specs(c: &kube::Client) -> BTreeMap<String, (Option<i64>, Value)> {
    (configs(c).await.into_iter())
        .map(|(n, c)| {
            (
                n,
                (
                    c.metadata.generation,
                    serde_json::to_value(&c.spec).unwrap(),
                ),
            )
        })
        .collect()
}

/// Waits until every cluster completed the revision with `mtu` and every Kustomization is Ready on
/// `commit`.
async fn until_all_on(hub: &kube::Client, clusters: &[Cluster], mtu: u32, commit: &str) {
    eventually(
        T,
        &format!("every cluster on mtu {mtu}, commit {commit}"),
        || async {
            let mut off = Vec::new();
            for c in clusters {
                let k = kustomization(hub, &format!("netwave-{}", c.name)).await;
                if k.0 != "True" || !k.3.ends_with(commit) {
                    off.push(format!("{}: Kustomization {k:?}", c.name));
                }
                match revision_with(&c.client, mtu).await {
                    Some((_, p)) if p == RevisionPhase::Complete.as_str() => {}
                    other => off.push(format!("{}: revision {other:?}", c.name)),
                }
            }
            if off.is_empty() {
                Ok(())
            } else {
                Err(off.join("; "))
            }
        },
    )
    .await;
}

/// How many times kustomize-controller found the Kustomization of cluster `name` waiting for its
/// dependency, by its log (one line per check).
fn dependency_checks(flux: &Flux, name: &str) -> usize {
    let object = format!("\"name\":\"netwave-{name}\"");
    (flux.log("kustomize-controller").lines())
        .filter(|l| l.contains("Dependencies do not meet ready condition") && l.contains(&object))
        .count()
}

/// Creates the Secrets with each cluster's kubeconfig and applies the fleet's Flux manifests on the hub
/// (the first cluster, the canary).
async fn install_fleet(clusters: &[Cluster], flux: &Flux) {
    let hub = &clusters[0];
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(hub.client.clone(), flux::NAMESPACE);
    for c in clusters {
        let secret = json!({
            "metadata": {"name": format!("{}-kubeconfig", c.name)},
            "stringData": {"value": flux::remote_kubeconfig(&c.cp).unwrap()},
        });
        secrets
            .create(
                &PostParams::default(),
                &serde_json::from_value(secret).unwrap(),
            )
            .await
            .unwrap();
    }
    let file = std::env::temp_dir().join(format!("netwave-fleet-{}.yaml", std::process::id()));
    std::fs::write(&file, fleet_manifests(flux.url())).unwrap();
    let out = hub
        .cp
        .kubectl()
        .arg("apply")
        .arg("-f")
        .arg(&file)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    assert!(
        out.status.success(),
        "kubectl apply deploy/flux/fleet.yaml: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// When each cluster, after a commit setting the segment's MTU to `mtu`, first had the segment synced
/// and its revision Complete, in seconds since `since`. Each poll looks at the clusters after the
/// canary before the canary itself, so "the canary completed no later than another cluster synced" is
/// what happened, not an artefact of the polling order.
async fn arrivals(clusters: &[Cluster], mtu: u32, since: Instant) -> Vec<(f64, f64)> {
    let mut synced = vec![None; clusters.len()];
    let mut complete = vec![None; clusters.len()];
    let deadline = Instant::now() + T;
    while complete.iter().any(Option::is_none) {
        if Instant::now() > deadline {
            panic!(
                "mtu {mtu} did not complete everywhere: synced {synced:?}, complete {complete:?}; {}",
                fleet_state(&clusters[0].client).await
            );
        }
        for i in (0..clusters.len()).rev() {
            let c = &clusters[i].client;
            let now = since.elapsed().as_secs_f64();
            if synced[i].is_none() && segment_mtu(c).await == Some(u64::from(mtu)) {
                synced[i] = Some(now);
            }
            let done = revision_with(c, mtu).await;
            if complete[i].is_none()
                && done.is_some_and(|(_, p)| p == RevisionPhase::Complete.as_str())
            {
                complete[i] = Some(now);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    synced
        .into_iter()
        .zip(complete)
        .map(|(s, c)| (s.unwrap(), c.unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_halted_by_the_canary_clusters_netwave_never_reaches_the_other_clusters() {
    let clusters = vec![
        cluster("canary").await,
        cluster("eu-1").await,
        cluster("eu-2").await,
    ];
    let (canary, rest) = (&clusters[0], &clusters[1..]);
    let hub = &canary.client;
    let flux = Flux::start(&canary.cp, Duration::from_secs(1))
        .await
        .unwrap();
    let first = flux.commit(&samples(), "netwave inputs").unwrap();
    install_fleet(&clusters, &flux).await;
    until_all_on(hub, &clusters, 9000, &first).await;

    // A good change: the canary completes it before either other cluster is given it.
    let since = Instant::now();
    let good = flux
        .commit(&layer2_with_mtu(8900), "frontend mtu 8900")
        .unwrap();
    let times = arrivals(&clusters, 8900, since).await;
    for (c, (synced, complete)) in clusters.iter().zip(&times) {
        println!(
            "mtu 8900 on {}: synced after {synced:.1} s, complete after {complete:.1} s",
            c.name
        );
    }
    for (c, (synced, _)) in rest.iter().zip(&times[1..]) {
        assert!(
            times[0].1 <= *synced,
            "{} was given the change ({synced:.1} s) before the canary completed it ({:.1} s)",
            c.name,
            times[0].1
        );
    }
    until_all_on(hub, &clusters, 8900, &good).await;
    let last_good = revision_with(hub, 8900).await.unwrap().0;

    // A bad change: the canary's netwave fails it on its first node and its nodes return to the last
    // good revision; Flux sees the inputs stalled and never applies the change to the others.
    let mut untouched = Vec::new();
    for c in rest {
        untouched.push(node_specs(&c.client).await);
    }
    let bad = flux
        .commit(&layer2_with_mtu(BAD_MTU), "frontend mtu 1400")
        .unwrap();
    eventually(
        T,
        "the canary to fail the change and be back on the last good revision",
        || async {
            let failed = revision_with(hub, BAD_MTU).await;
            let k = kustomization(hub, "netwave-canary").await;
            let nodes = configs(hub).await;
            let off: Vec<String> = (nodes.values())
                .filter(|n| n.spec.revision != last_good || in_flight(n))
                .map(|n| {
                    format!(
                        "{} on {}",
                        n.metadata.name.as_deref().unwrap_or(""),
                        n.spec.revision
                    )
                })
                .collect();
            let failed_ok = failed
                .as_ref()
                .is_some_and(|(_, p)| p == RevisionPhase::Failed.as_str());
            if failed_ok && k.0 == "False" && off.is_empty() {
                Ok(k)
            } else {
                Err(format!(
                    "revision {failed:?}, Kustomization {k:?}, nodes not back: {off:?}"
                ))
            }
        },
    )
    .await;
    let k = kustomization(hub, "netwave-canary").await;
    println!("canary's Kustomization: {k:?}");
    assert!(k.1 == "HealthCheckFailed", "{k:?}");
    for c in rest {
        let name = format!("netwave-{}", c.name);
        eventually(T, &format!("{name} to wait for the canary"), || async {
            let k = kustomization(hub, &name).await;
            if k.1 == "DependencyNotReady" {
                Ok(())
            } else {
                Err(format!("{k:?}"))
            }
        })
        .await;
    }
    // Not applied yet is not never applied: wait until kustomize-controller has checked each one's
    // dependency five more times (its log says so at each check), with the bad commit fetched.
    let checks = |name: &str| dependency_checks(&flux, name);
    let seen: Vec<usize> = rest.iter().map(|c| checks(c.name)).collect();
    for (c, n) in rest.iter().zip(seen) {
        eventually(
            T,
            &format!("5 more dependency checks of {}", c.name),
            || async {
                let now = checks(c.name);
                if now >= n + 5 {
                    Ok(())
                } else {
                    Err(format!("{} since the canary failed", now - n))
                }
            },
        )
        .await;
    }
    for (c, before) in rest.iter().zip(&untouched) {
        let k = kustomization(hub, &format!("netwave-{}", c.name)).await;
        println!("{}'s Kustomization: {k:?}", c.name);
        assert!(
            k.3.ends_with(&good),
            "{}: applied {} (bad commit {bad})",
            c.name,
            k.3
        );
        assert_eq!(segment_mtu(&c.client).await, Some(8900), "{}", c.name);
        let now = node_specs(&c.client).await;
        let changed: Vec<_> = (now.iter())
            .filter(|(n, s)| before.get(*n) != Some(s))
            .map(|(n, _)| n)
            .collect();
        assert!(
            changed.is_empty(),
            "{}: node configs changed: {changed:?}",
            c.name
        );
    }

    // Revert the commit: the canary is Ready again and the rest apply the revert: nothing moves there.
    let revert = flux
        .commit(&layer2_with_mtu(8900), "Revert \"frontend mtu 1400\"")
        .unwrap();
    until_all_on(hub, &clusters, 8900, &revert).await;
    for (c, before) in rest.iter().zip(&untouched) {
        assert_eq!(
            &node_specs(&c.client).await,
            before,
            "{}: node configs changed",
            c.name
        );
    }
}
