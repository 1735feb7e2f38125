//! Installing netwave as an admin would, on the real kube-apiserver: every manifest in `deploy/` is
//! accepted (the PrometheusRule against the Prometheus operator's own CRD), the RBAC it ships is enough for
//! the configurator to run a rollout under its service account, and the admission policy binds each
//! agent to its own node.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use netwave_api::NodeNetworkConfig;
use netwave_control_plane::ControlPlane;
use serde_json::json;

const T: Duration = Duration::from_secs(60);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `kubectl …` from the repository root that must succeed; returns (stdout, stderr).
fn kubectl(cp: &ControlPlane, args: &[&str]) -> (String, String) {
    let out = cp
        .kubectl()
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap();
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "kubectl {args:?} failed:\n{e}\n{o}");
    (o, e)
}

/// Every object of every manifest file `deploy/` ships (all but the samples, the admins' objects tested
/// on their own), as `Kind/name`.
fn shipped_objects() -> Vec<String> {
    let mut out = Vec::new();
    for dir in ["deploy/base", "deploy/monitoring"] {
        for e in std::fs::read_dir(repo().join(dir)).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if p.extension().is_none_or(|x| x != "yaml") || name == "kustomization.yaml" {
                continue;
            }
            out.extend(objects(&std::fs::read_to_string(&p).unwrap()));
        }
    }
    out.sort();
    out
}

/// `Kind/name` of every document in a multi-document YAML text.
fn objects(yaml: &str) -> Vec<String> {
    serde_saphyr::from_multiple::<serde_json::Value>(yaml)
        .unwrap()
        .iter()
        .filter(|d| !d.is_null())
        .map(|d| {
            format!(
                "{}/{}",
                d["kind"].as_str().unwrap(),
                d["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect()
}

/// `kubectl kustomize <dir>`: the rendered install.
fn render(cp: &ControlPlane, dir: &str) -> String {
    kubectl(cp, &["kustomize", dir]).0
}

/// Installs netwave as an admin would, `kubectl apply -k deploy/overlays/monitoring`, after the
/// Prometheus operator's CRDs. Returns the rendered objects.
fn install(cp: &ControlPlane) -> Vec<String> {
    let operator = cp
        .binaries()
        .prometheus_operator_crds
        .to_str()
        .unwrap()
        .to_string();
    kubectl(cp, &["apply", "--server-side", "-f", &operator]);
    for crd in ["prometheusrules", "servicemonitors"] {
        kubectl(
            cp,
            &[
                "wait",
                "--for=condition=Established",
                &format!("crd/{crd}.monitoring.coreos.com"),
            ],
        );
    }
    // The CRDs alone, as most operators document it: every file there is a CRD, so this exits 0
    // (`kubectl()` asserts it) and the kustomize install below finds them unchanged.
    kubectl(cp, &["apply", "-f", "crds/"]);
    let rendered = objects(&render(cp, "deploy/overlays/monitoring"));
    let (out, err) = kubectl(cp, &["apply", "-k", "deploy/overlays/monitoring"]);
    // (The test harness created netwave-system without kubectl; kubectl says so. Any other warning is ours.)
    let warnings: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("Warning") && !l.contains("last-applied-configuration"))
        .collect();
    assert!(
        warnings.is_empty(),
        "the server warns about deploy/:\n{err}"
    );
    assert_eq!(
        out.lines().count(),
        rendered.len(),
        "one line per object:\n{out}"
    );
    rendered
}

#[tokio::test]
async fn the_kustomize_install_renders_everything_shipped_and_the_server_accepts_it() {
    let env = env().await;
    let cp = env.cp();
    let base = objects(&render(cp, "deploy/base"));
    let rendered = install(cp);
    // Nothing shipped is left out of the install, and the base needs no Prometheus operator.
    let shipped = shipped_objects();
    let missing: Vec<&String> = shipped.iter().filter(|o| !rendered.contains(o)).collect();
    assert!(missing.is_empty(), "shipped but not installed: {missing:?}");
    for crd in netwave_api::crds() {
        let name = format!("CustomResourceDefinition/{}", crd.1.metadata.name.unwrap());
        assert!(base.contains(&name), "{name} in the base");
    }
    assert!(
        !base
            .iter()
            .any(|o| o.starts_with("PrometheusRule/") || o.starts_with("ServiceMonitor/")),
        "the base installs without the Prometheus operator: {base:?}"
    );
    for want in [
        "PrometheusRule/netwave",
        "ServiceMonitor/netwave-agent",
        "ConfigMap/netwave-grafana-dashboard",
    ] {
        assert!(rendered.iter().any(|o| o == want), "{want} in {rendered:?}");
    }
    let (rules, _) = kubectl(cp, &["get", "prometheusrules", "-A", "-o", "name"]);
    assert!(!rules.trim().is_empty(), "the PrometheusRule is stored");
    let (policies, _) = kubectl(cp, &["get", "validatingadmissionpolicies", "-o", "name"]);
    assert!(policies.contains("netwave-agent-own-node"), "{policies}");
}

/// The configurator runs a whole rollout under its own service account with the RBAC `deploy/` ships:
/// revisions, NodeNetworkConfigs, the Lease and Events.
#[tokio::test]
async fn the_shipped_rbac_is_enough_for_the_configurator() {
    let env = env().await;
    install(env.cp());
    let sa = env
        .cp()
        .client_with_token(
            &env.cp()
                .service_account_token(&env.client, "netwave-system", "netwave-configurator", None)
                .await
                .unwrap(),
        )
        .await
        .unwrap();
    let names = node_names(4);
    add_nodes(&env.client, &names).await;
    let _agents = spawn_agents(env.client.clone(), always_ok(), Duration::from_millis(50));
    apply_samples(&env.client).await;
    let c = Configurator::start(sa, args(&["--max-unavailable", "2"]));
    let rev = eventually(T, "the rollout to complete", || async {
        match revisions(&env.client).await.as_slice() {
            [r] if phase(r) == "Complete" => Ok(r.clone()),
            other => Err(format!("{:?}", other.iter().map(phase).collect::<Vec<_>>())),
        }
    })
    .await;
    let st = rev.status.clone().unwrap();
    assert_eq!((st.total, st.updated, st.failed), (4, 4, 0), "{st:?}");

    // What an admin runs next: wait on the revision, describe it, read its Events.
    let name = rev.name_any();
    kubectl(
        env.cp(),
        &[
            "wait",
            "--for=condition=Available",
            "--timeout=30s",
            &format!("ncr/{name}"),
        ],
    );
    let (described, _) = kubectl(env.cp(), &["describe", "ncr", &name]);
    assert!(described.contains("Events:"), "{described}");
    // Status and Events come without scrolling: the folded inputs (about 400 lines with the samples)
    // are not in front of them, they are in the NetworkConfigInputs of the same name.
    let status_line = described.lines().position(|l| l.starts_with("Status:"));
    assert!(
        status_line.is_some_and(|l| l < 30) && !described.contains("Routing Tables"),
        "{described}"
    );
    let (inputs, _) = kubectl(
        env.cp(),
        &[
            "get",
            "nci",
            &name,
            "-o",
            "jsonpath={.spec.routingTables[*].name} {.metadata.ownerReferences[0].name}",
        ],
    );
    assert_eq!(
        inputs,
        format!("edge-uplink oob {name}"),
        "the inputs, sorted by name and owned by their revision"
    );
    let (events, _) = kubectl(
        env.cp(),
        &[
            "events",
            "-A",
            "--for",
            &format!("NetworkConfigRevision/{name}"),
        ],
    );
    assert!(
        events.lines().count() > 1,
        "the configurator's Events (written under its service account) are there:\n{events}"
    );
    c.stop().await;
}

/// The admission policy: an agent's pod-bound token may write only its own node's NodeNetworkConfig
/// status and its own Node; another node's are refused with the policy's message.
#[tokio::test]
async fn an_agent_writes_only_its_own_node() {
    let env = env().await;
    install(env.cp());
    let admin = env.client.clone();
    for n in ["node-a", "node-b"] {
        create_node(&admin, &node(n, &[])).await;
        let nnc: NodeNetworkConfig = serde_json::from_value(json!({
            "apiVersion": "netwave.dev/v1alpha1", "kind": "NodeNetworkConfig",
            "metadata": {"name": n},
            "spec": {"revision": "r1", "sequence": 1, "configHash": "h1", "config": {}},
        }))
        .unwrap();
        Api::<NodeNetworkConfig>::all(admin.clone())
            .create(&PostParams::default(), &nnc)
            .await
            .unwrap();
    }
    // The agent's pod on node-a, as the DaemonSet controller and scheduler would have made it.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "netwave-system");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": format!("netwave-agent-{}", std::process::id())},
        "spec": {"nodeName": "node-a", "serviceAccountName": "netwave-agent",
                 "containers": [{"name": "agent", "image": "netwave-agent"}]},
    }))
    .unwrap();
    let pod = pods.create(&PostParams::default(), &pod).await.unwrap();
    let agent_a = env
        .cp()
        .client_with_token(
            &env.cp()
                .service_account_token(&admin, "netwave-system", "netwave-agent", Some(&pod))
                .await
                .unwrap(),
        )
        .await
        .unwrap();

    let nncs: Api<NodeNetworkConfig> = Api::all(agent_a.clone());
    let nodes: Api<Node> = Api::all(agent_a.clone());
    let status =
        Patch::Merge(json!({"status": {"phase": "Provisioned", "observedRevision": "r1"}}));
    let pp = PatchParams::default();

    nncs.patch_status("node-a", &pp, &status)
        .await
        .expect("its own NNC status");
    nodes
        .patch(
            "node-a",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .expect("its own Node");
    nodes
        .patch_status(
            "node-a",
            &pp,
            &Patch::Merge(json!({"status": {"conditions": [
            {"type": "NetworkReady", "status": "True", "reason": "Provisioned", "message": ""}]}})),
        )
        .await
        .expect("its own Node's status");

    // The API server loads a new admission policy asynchronously (its informer, about a second): wait
    // until a dry run of the forbidden write is refused, without writing anything meanwhile.
    let dry = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    eventually(T, "the admission policy to be in force", || async {
        match nncs.patch_status("node-b", &dry, &status).await {
            Err(kube::Error::Api(e)) if e.code == 403 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let msg = refused(
        nncs.patch_status("node-b", &pp, &status).await,
        "node-b's NNC status",
    );
    assert!(
        msg.contains(
            "netwave-agent on node node-a may write only its own NodeNetworkConfig, not node-b"
        ),
        "{msg}"
    );
    let msg = refused(
        nodes
            .patch(
                "node-b",
                &pp,
                &Patch::Merge(json!({"spec": {"taints": [
                {"key": "netwave.dev/network-unavailable", "effect": "NoSchedule"}]}})),
            )
            .await,
        "tainting node-b",
    );
    assert!(
        msg.contains("may write only its own Node, not node-b"),
        "{msg}"
    );
    // RBAC still holds beneath the policy: an agent never writes a spec.
    let msg = refused(
        nncs.patch(
            "node-a",
            &pp,
            &Patch::Merge(json!({"spec": {"revision": "r2"}})),
        )
        .await,
        "its own NNC spec",
    );
    assert!(msg.contains("forbidden"), "{msg}");

    // A token bound to no pod names no node: refused everywhere.
    let unbound = env
        .cp()
        .client_with_token(
            &env.cp()
                .service_account_token(&admin, "netwave-system", "netwave-agent", None)
                .await
                .unwrap(),
        )
        .await
        .unwrap();
    let msg = refused(
        Api::<NodeNetworkConfig>::all(unbound)
            .patch_status("node-a", &pp, &status)
            .await,
        "an unbound token",
    );
    assert!(msg.contains("bound to a pod on a node"), "{msg}");

    let nnc = Api::<NodeNetworkConfig>::all(admin)
        .get("node-b")
        .await
        .unwrap();
    assert!(
        nnc.status.is_none(),
        "node-b's status is untouched: {:?}",
        nnc.status
    );
}

/// The message of a 403; panics on anything else.
fn refused<T: std::fmt::Debug>(r: Result<T, kube::Error>, what: &str) -> String {
    match r {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 403, "{what}: {e:?}");
            e.message
        }
        other => panic!("{what} was not refused: {other:?}"),
    }
}
