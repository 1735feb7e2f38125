//! Installing netwave as an admin would, on the real kube-apiserver: every manifest in `deploy/` is
//! accepted (the PrometheusRule against the Prometheus operator's own CRD) and a second apply changes
//! nothing, the RBAC it ships is enough for the configurator to run a rollout under its service account
//! without one refused write, and the admission policy binds each agent to its own node and, there, to
//! the taints and conditions it owns (DESIGN §6 "Identity"), also under a renamed, re-namespaced install.
//! The attacks are made with the identity an attacker on a node has: the agent's pod-bound token.

mod common;

use netwave_api::vocab::RevisionPhase;
use netwave_api::vocab::{ConditionStatus, NodePhase, node_conditions};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event as KubeEvent;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource, ResourceExt};
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
    install_dir(cp, "deploy/overlays/monitoring")
}

/// `kubectl apply -k dir` (relative to the repository root, or absolute), after the Prometheus
/// operator's CRDs and netwave's. Returns the rendered objects.
fn install_dir(cp: &ControlPlane, dir: &str) -> Vec<String> {
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
    let rendered = objects(&render(cp, dir));
    let (out, err) = kubectl(cp, &["apply", "-k", dir]);
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

/// A second `kubectl apply` of the install finds nothing to change: every manifest spells out what the
/// API server would default (a GitOps tool would otherwise show the install out of sync forever).
#[tokio::test]
async fn a_second_apply_of_the_install_changes_nothing() {
    let env = env().await;
    let rendered = install(env.cp());
    let (out, _) = kubectl(env.cp(), &["apply", "-k", "deploy/overlays/monitoring"]);
    let changed: Vec<&str> = out.lines().filter(|l| !l.ends_with(" unchanged")).collect();
    assert!(
        changed.is_empty(),
        "changed on the second apply: {changed:#?}"
    );
    assert_eq!(out.lines().count(), rendered.len(), "{out}");
}

/// The configurator runs a whole rollout under its own service account with the RBAC `deploy/` ships:
/// revisions, NodeNetworkConfigs and their placeholder status, the Lease and Events; not one of its
/// writes is refused on the way (a refused write is retried and the rollout may still complete, so
/// completion alone proves nothing: the writer's failed-write counter does).
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
    let metrics_port = free_port();
    let m = format!("127.0.0.1:{metrics_port}");
    // Two at a time: the other two nodes get placeholders (status Queued) first.
    let c = Configurator::start(sa, args(&["--max-unavailable", "2", "--metrics-addr", &m]));
    let rev = eventually(T, "the rollout to complete", || async {
        match revisions(&env.client).await.as_slice() {
            [r] if phase(r) == RevisionPhase::Complete.as_str() => Ok(r.clone()),
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
    // Every write went through: the server refused none (403 and the like count as "client", a
    // refused object as "invalid").
    let (_, body) = http_get(metrics_port, "/metrics").await;
    let errors: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("netwave_api_errors_total"))
        .collect();
    // (Every verb and category is there from the start with 0.)
    let refused: Vec<&&str> = errors
        .iter()
        .filter(|l| l.contains(r#"category="client""#) || l.contains(r#"category="invalid""#))
        .filter(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) != Some(0.0))
        .collect();
    assert!(
        refused.is_empty(),
        "writes the API server refused under the shipped RBAC: {refused:?}"
    );
    c.stop().await;
}

/// An agent on `node` as the API server sees it: its pod (as the DaemonSet controller and scheduler
/// would have made it) and a client with that pod's bound token. `namespace`/`account` name the
/// agent's ServiceAccount (renamed installs have other names).
async fn agent_on(env: &Env, node: &str, namespace: &str, account: &str) -> Client {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), namespace);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"generateName": format!("{account}-")},
        "spec": {"nodeName": node, "serviceAccountName": account,
                 "containers": [{"name": "agent", "image": "netwave-agent"}]},
    }))
    .unwrap();
    let pod = pods.create(&PostParams::default(), &pod).await.unwrap();
    env.cp()
        .client_with_token(
            &env.cp()
                .service_account_token(&env.client, namespace, account, Some(&pod))
                .await
                .unwrap(),
        )
        .await
        .unwrap()
}

/// node-a and node-b with a NodeNetworkConfig each; node-a tainted with the agent's taint and another.
async fn two_nodes(admin: &Client) {
    for n in ["node-a", "node-b"] {
        let mut node = node(n, &[("kubernetes.io/hostname", n)]);
        node.spec = Some(
            serde_json::from_value(json!({"taints": [
                {"key": "netwave.dev/network-unavailable", "effect": "NoSchedule"},
                {"key": "example.com/maintenance", "effect": "NoSchedule"},
            ]}))
            .unwrap(),
        );
        create_node(admin, &node).await;
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
}

/// The API server loads a new admission policy asynchronously (its informers, about a second): waits
/// until a dry run of relabelling its own Node is refused to `agent`, writing nothing meanwhile.
async fn policy_in_force(agent: &Client) {
    let nodes: Api<Node> = Api::all(agent.clone());
    let dry = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let relabel = Patch::Merge(json!({"metadata": {"labels": {"netwave.dev/probe": "x"}}}));
    eventually(T, "the admission policy to be in force", || async {
        match nodes.patch("node-a", &dry, &relabel).await {
            Err(kube::Error::Api(e)) if e.code == 403 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// The base install, node-a and node-b, and node-a's agent with the policy in force.
async fn installed_agent(env: &Env) -> Client {
    install(env.cp());
    two_nodes(&env.client).await;
    let agent = agent_on(env, "node-a", "netwave-system", "netwave-agent").await;
    policy_in_force(&agent).await;
    agent
}

fn merge(v: serde_json::Value) -> Patch<serde_json::Value> {
    Patch::Merge(v)
}

/// The admission policy: an agent's pod-bound token may write only its own node's NodeNetworkConfig
/// status and its own Node; another node's are refused with the policy's message.
#[tokio::test]
async fn an_agent_writes_only_its_own_node() {
    let env = env().await;
    let admin = env.client.clone();
    let agent_a = installed_agent(&env).await;
    let nncs: Api<NodeNetworkConfig> = Api::all(agent_a.clone());
    let nodes: Api<Node> = Api::all(agent_a.clone());
    let status = merge(
        json!({"status": {"phase": NodePhase::Provisioned.as_str(), "observedRevision": "r1"}}),
    );
    let pp = PatchParams::default();

    nncs.patch_status("node-a", &pp, &status)
        .await
        .expect("its own NNC status");
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
                &merge(json!({"spec": {"taints": [
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
        nncs.patch("node-a", &pp, &merge(json!({"spec": {"revision": "r2"}})))
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

/// An agent may create Events in `default` (its Role), and RBAC cannot say about what: with node-a's
/// pod-bound token, an Event about its own NodeNetworkConfig or Node is accepted; one about node-b's, a
/// revision ("rollout complete", forged), or related to another object is refused (#48).
#[tokio::test]
async fn an_agent_reports_events_only_about_its_own_node() {
    let env = env().await;
    let agent = installed_agent(&env).await;
    let events: Api<KubeEvent> = Api::namespaced(agent, "default");
    let event = |kind: &str, name: &str, related: Option<(&str, &str)>| -> KubeEvent {
        let mut e = json!({
            "metadata": {"generateName": "netwave-agent-"},
            "eventTime": "2026-11-28T10:00:00.000000Z",
            "reportingController": "netwave.dev/agent", "reportingInstance": "node-a",
            "action": "Report", "reason": "RolloutComplete", "type": "Normal",
            "note": "all 4 eligible node(s) updated",
            "regarding": {"apiVersion": "netwave.dev/v1alpha1", "kind": kind, "name": name},
        });
        if let Some((kind, name)) = related {
            e["related"] =
                json!({"apiVersion": "netwave.dev/v1alpha1", "kind": kind, "name": name});
        }
        serde_json::from_value(e).unwrap()
    };
    let pp = PostParams::default();
    // The events policy loads on its own (about a second after the install).
    let forged = event("NetworkConfigRevision", "rev-1", None);
    let msg = eventually(T, "the events policy to be in force", || async {
        let dry = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        match events.create(&dry, &forged).await {
            Err(kube::Error::Api(e)) if e.code == 403 => Ok(e.message),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(
        msg.contains(
            "netwave-agent on node node-a may report Events only about its own NodeNetworkConfig or \
             Node, not NetworkConfigRevision rev-1"
        ),
        "{msg}"
    );
    for (what, e) in [
        (
            "about node-b's config",
            event("NodeNetworkConfig", "node-b", None),
        ),
        ("about node-b", event("Node", "node-b", None)),
        (
            "related to a revision",
            event(
                "NodeNetworkConfig",
                "node-a",
                Some(("NetworkConfigRevision", "rev-1")),
            ),
        ),
    ] {
        let msg = refused(events.create(&pp, &e).await, what);
        assert!(
            msg.contains("may report Events only about its own"),
            "{what}: {msg}"
        );
    }
    for (kind, what) in [("NodeNetworkConfig", "its config"), ("Node", "its Node")] {
        events
            .create(&pp, &event(kind, "node-a", None))
            .await
            .unwrap_or_else(|e| panic!("an Event about {what}: {e}"));
    }
}

/// Labels decide which VRFs, segments and routing tables a node gets: an agent may not move its own
/// Node into other tenants' networks, through the Node or through its status subresource (which the
/// API server lets change labels).
#[tokio::test]
async fn an_agent_cannot_relabel_its_own_node() {
    let env = env().await;
    let agent = installed_agent(&env).await;
    let nodes: Api<Node> = Api::all(agent);
    let pp = PatchParams::default();
    // The issue's two, and the labels the samples select on (which no kubelet may set either).
    for (key, value) in [
        ("netwave.dev/pool", "storage"),
        ("netwave.dev/edge", "true"),
        ("node-restriction.kubernetes.io/netwave-pool", "storage"),
        ("node-restriction.kubernetes.io/netwave-edge", "true"),
    ] {
        let relabel = merge(json!({"metadata": {"labels": {key: value}}}));
        let msg = refused(nodes.patch("node-a", &pp, &relabel).await, key);
        assert!(
            msg.contains("netwave-agent on node node-a may not change metadata.labels of its Node")
                && msg.ends_with(key),
            "{msg}"
        );
        let msg = refused(
            nodes.patch_status("node-a", &pp, &relabel).await,
            "relabelling through nodes/status",
        );
        assert!(
            msg.contains("metadata.labels") && msg.ends_with(key),
            "{msg}"
        );
    }
    let msg = refused(
        nodes
            .patch(
                "node-a",
                &pp,
                &merge(json!({"metadata": {"labels": {"kubernetes.io/hostname": null}}})),
            )
            .await,
        "removing a label",
    );
    assert!(msg.ends_with("metadata.labels of its Node (labels decide which tenant networks a node gets): kubernetes.io/hostname"), "{msg}");
    let labels = Api::<Node>::all(env.client.clone())
        .get("node-a")
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap_or_default();
    assert_eq!(
        labels,
        [("kubernetes.io/hostname".to_string(), "node-a".to_string())].into()
    );
}

/// Annotations and the rest of a Node's metadata are not the agent's either.
#[tokio::test]
async fn an_agent_cannot_annotate_its_own_node() {
    let env = env().await;
    let agent = installed_agent(&env).await;
    let nodes: Api<Node> = Api::all(agent);
    let pp = PatchParams::default();
    let annotate = merge(json!({"metadata": {"annotations": {"example.com/owner": "me"}}}));
    for r in [
        nodes.patch("node-a", &pp, &annotate).await,
        nodes.patch_status("node-a", &pp, &annotate).await,
    ] {
        let msg = refused(r, "annotating node-a");
        assert!(
            msg.contains("may not change metadata.annotations of its Node: example.com/owner"),
            "{msg}"
        );
    }
    let msg = refused(
        nodes
            .patch(
                "node-a",
                &pp,
                &merge(json!({"metadata": {"finalizers": ["example.com/hold"]}})),
            )
            .await,
        "a finalizer",
    );
    assert!(
        msg.contains("may not change its Node's metadata.finalizers"),
        "{msg}"
    );
}

/// On its own Node the agent may change only the taint it owns (`netwave.dev/network-unavailable`,
/// which it removes once the network is healthy), never another taint or another spec field.
#[tokio::test]
async fn an_agent_changes_only_its_own_taint_on_its_node() {
    let env = env().await;
    let agent = installed_agent(&env).await;
    let nodes: Api<Node> = Api::all(agent);
    let pp = PatchParams::default();
    // As the admin and the API server left them (TaintNodesByCondition adds its own on create).
    let before = taints(&env.client, "node-a").await;
    let with = |keep: &dyn Fn(&serde_json::Value) -> bool, add: Option<serde_json::Value>| {
        let mut list: Vec<serde_json::Value> = before.iter().filter(|t| keep(t)).cloned().collect();
        list.extend(add);
        merge(json!({"spec": {"taints": list}}))
    };
    let key_is = |k: &'static str| move |t: &serde_json::Value| t["key"] == k;
    let msg = refused(
        nodes
            .patch(
                "node-a",
                &pp,
                &with(&|t| !key_is("example.com/maintenance")(t), None),
            )
            .await,
        "removing another taint",
    );
    assert!(
        msg.ends_with(
            "may change only the spec.taints it owns (netwave.dev/network-unavailable) on its Node, \
             not example.com/maintenance"
        ),
        "{msg}"
    );
    let drain = json!({"key": "example.com/drain", "effect": "NoExecute"});
    let msg = refused(
        nodes
            .patch("node-a", &pp, &with(&|_| true, Some(drain)))
            .await,
        "adding a taint",
    );
    assert!(msg.ends_with("on its Node, not example.com/drain"), "{msg}");
    for (field, patch) in [
        ("unschedulable", json!({"spec": {"unschedulable": true}})),
        ("providerID", json!({"spec": {"providerID": "x://y"}})),
    ] {
        let msg = refused(nodes.patch("node-a", &pp, &merge(patch)).await, field);
        assert!(
            msg.ends_with(&format!("in its Node's spec, not spec.{field}")),
            "{msg}"
        );
    }
    // Its own taint it may remove.
    let owned = key_is("netwave.dev/network-unavailable");
    nodes
        .patch("node-a", &pp, &with(&|t| !owned(t), None))
        .await
        .expect("removing its own taint");
    let after = taints(&env.client, "node-a").await;
    let want: Vec<_> = before.iter().filter(|t| !owned(t)).cloned().collect();
    assert_eq!(after, want);
}

/// A Node's taints as JSON, in order.
async fn taints(client: &Client, node: &str) -> Vec<serde_json::Value> {
    let n = Api::<Node>::all(client.clone()).get(node).await.unwrap();
    let taints = n.spec.and_then(|s| s.taints).unwrap_or_default();
    taints
        .iter()
        .map(|t| serde_json::to_value(t).unwrap())
        .collect()
}

/// In its own Node's status the agent may set only its `NetworkReady` condition: never another
/// condition (Ready, say) nor another status field (addresses steer traffic to the node).
#[tokio::test]
async fn an_agent_changes_only_its_own_condition_on_its_node() {
    let env = env().await;
    let agent = installed_agent(&env).await;
    let nodes: Api<Node> = Api::all(agent);
    let pp = PatchParams::apply("netwave-agent").force();
    let condition = |type_: &str| {
        Patch::Apply(
            json!({"apiVersion": "v1", "kind": "Node", "status": {"conditions": [
            {"type": type_, "status": ConditionStatus::False.as_str(), "reason": "Forged", "message": "forged"}]}}),
        )
    };
    let msg = refused(
        nodes
            .patch_status("node-a", &pp, &condition(node_conditions::READY))
            .await,
        "the Ready condition",
    );
    assert!(
        msg.contains(
            "may change only the status.conditions it owns (NetworkReady) on its Node, not Ready"
        ),
        "{msg}"
    );
    let addresses = Patch::Apply(json!({"apiVersion": "v1", "kind": "Node", "status": {
        "addresses": [{"type": "InternalIP", "address": "198.18.0.99"}]}}));
    let msg = refused(
        nodes.patch_status("node-a", &pp, &addresses).await,
        "the addresses",
    );
    assert!(
        msg.contains("in its Node's status, not status.addresses"),
        "{msg}"
    );
    nodes
        .patch_status("node-a", &pp, &condition(node_conditions::NETWORK_READY))
        .await
        .expect("its own condition");
}

/// The policy allows exactly what the agent writes: its real reporting code
/// (`netwave_agent::shell::report`), under node-a's pod-bound token and the shipped RBAC, reports its
/// NodeNetworkConfig's status, sets `NetworkReady`, removes its taint (and only its taint) and
/// publishes an Event.
#[tokio::test]
async fn the_agents_own_writes_pass_the_policy() {
    use netwave_agent::shell::report::Reporter as AgentReporter;
    let env = env().await;
    let admin = env.client.clone();
    let agent = installed_agent(&env).await;
    let before = taints(&admin, "node-a").await;
    let nnc = Api::<NodeNetworkConfig>::all(admin.clone())
        .get("node-a")
        .await
        .unwrap();
    let recorder = Recorder::new(
        agent.clone(),
        Reporter {
            controller: netwave_agent::shell::FIELD_MANAGER.into(),
            instance: Some("node-a".into()),
        },
    );
    let metrics = std::sync::Arc::new(netwave_agent::shell::metrics::Metrics::default());
    let reporter = AgentReporter::start(
        agent,
        "node-a".into(),
        vec!["netwave.dev/network-unavailable".into()],
        recorder,
        metrics.clone(),
    );
    reporter.status(
        "node-a",
        serde_json::from_value(
            json!({"phase": NodePhase::Provisioned.as_str(), "observedRevision": "r1"}),
        )
        .unwrap(),
    );
    reporter.network_ready(true);
    reporter.event(
        Event {
            type_: EventType::Normal,
            reason: NodePhase::Provisioned.as_str().into(),
            note: Some("applied r1".into()),
            action: "Apply".into(),
            secondary: None,
        },
        nnc.object_ref(&()),
    );
    // Delivered, or retried (a refused write is) until the grace runs out.
    reporter.shutdown(Duration::from_secs(15)).await;

    let node = Api::<Node>::all(admin.clone()).get("node-a").await.unwrap();
    let keys: Vec<String> = node
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.key)
        .collect();
    let want: Vec<String> = before
        .iter()
        .filter_map(|t| t["key"].as_str())
        .filter(|k| *k != "netwave.dev/network-unavailable")
        .map(str::to_string)
        .collect();
    assert!(want.iter().any(|k| k == "example.com/maintenance"));
    assert_eq!(keys, want, "only its own taint is gone");
    let ready = node
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == netwave_agent::shell::NETWORK_READY);
    assert_eq!(
        ready.map(|c| c.status).as_deref(),
        Some(ConditionStatus::True.as_str())
    );
    let st = Api::<NodeNetworkConfig>::all(admin.clone())
        .get("node-a")
        .await
        .unwrap()
        .status
        .unwrap_or_default();
    assert_eq!(st.phase.as_deref(), Some(NodePhase::Provisioned.as_str()));
    assert_eq!(metrics.status_write_errors.get(), 0);
    // Events about a cluster-scoped object live in `default`, where the agent's Role lets it write.
    let events = Api::<KubeEvent>::namespaced(admin, "default")
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(
        events.items.iter().any(
            |e| e.reason.as_deref() == Some(NodePhase::Provisioned.as_str())
                && e.reporting_instance.as_deref() == Some("node-a")
        ),
        "the agent's Event: {:?}",
        events.items.iter().map(|e| &e.reason).collect::<Vec<_>>()
    );
}

/// The policy stays on when the install is renamed and re-namespaced: `deploy/base` under a kustomize
/// overlay with `namespace:` and `namePrefix:`, installed on the real API server, and the node-relabel
/// attack made with that install's agent identity (its renamed ServiceAccount in its new namespace).
#[tokio::test]
async fn the_agent_policy_stays_on_when_the_install_is_renamed() {
    let env = env().await;
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("netwave-renamed-install-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // kustomize takes no absolute path to a base: a link to it inside the overlay.
    std::os::unix::fs::symlink(repo().join("deploy/base"), dir.join("base")).unwrap();
    std::fs::write(
        dir.join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
         namespace: tenant-network\nnamePrefix: acme-\nresources:\n  - base\n",
    )
    .unwrap();
    let rendered = install_dir(env.cp(), dir.to_str().unwrap());
    let _ = std::fs::remove_dir_all(&dir);
    for want in [
        "ServiceAccount/acme-netwave-agent",
        "ValidatingAdmissionPolicy/acme-netwave-agent-own-node",
        "ValidatingAdmissionPolicyBinding/acme-netwave-agent-own-node",
    ] {
        assert!(rendered.iter().any(|o| o == want), "{want} in {rendered:?}");
    }
    two_nodes(&env.client).await;
    let agent = agent_on(&env, "node-a", "tenant-network", "acme-netwave-agent").await;
    policy_in_force(&agent).await;
    let nodes: Api<Node> = Api::all(agent);
    let msg = refused(
        nodes
            .patch(
                "node-a",
                &PatchParams::default(),
                &merge(json!({"metadata": {"labels": {"netwave.dev/pool": "storage"}}})),
            )
            .await,
        "the renamed agent relabelling its node",
    );
    assert!(
        msg.contains("acme-netwave-agent-own-node")
            && msg.contains("may not change metadata.labels of its Node"),
        "{msg}"
    );
}

/// The policy holds for every identity the agent's role is granted to (#48): a ServiceAccount of its own,
/// bound to the agent's ClusterRole by a binding of its own (as a hurried admin or a second install
/// would), with a pod-bound token on node-a, may write neither node-b's NodeNetworkConfig status nor
/// node-a's labels. It used to be restricted only if the binding carried a label, and a missing label
/// let everything through.
#[tokio::test]
async fn the_agent_policy_holds_for_any_binding_of_the_agent_role() {
    let env = env().await;
    let _agent = installed_agent(&env).await;
    let ns = "rogue-tools";
    env.cp().ensure_namespace(&env.client, ns).await.unwrap();
    let apply = |v: serde_json::Value| {
        let client = env.client.clone();
        async move {
            let o: kube::core::DynamicObject = serde_json::from_value(v).unwrap();
            let types = o.types.clone().unwrap();
            let gvk = kube::core::GroupVersionKind::try_from(&types).unwrap();
            let (ar, caps) = kube::discovery::pinned_kind(&client, &gvk).await.unwrap();
            let api: Api<kube::core::DynamicObject> = match caps.scope {
                kube::discovery::Scope::Cluster => Api::all_with(client, &ar),
                kube::discovery::Scope::Namespaced => Api::namespaced_with(client, ns, &ar),
            };
            let pp = PatchParams::apply("netwave-test").force();
            api.patch(&o.name_any(), &pp, &Patch::Apply(&o))
                .await
                .unwrap();
        }
    };
    apply(json!({"apiVersion": "v1", "kind": "ServiceAccount",
                 "metadata": {"name": "helper", "namespace": ns}}))
    .await;
    apply(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                 "metadata": {"name": "rogue-helper-as-agent"},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                             "name": "netwave-agent"},
                 "subjects": [{"kind": "ServiceAccount", "name": "helper", "namespace": ns}]}),
    )
    .await;
    let helper = agent_on(&env, "node-a", ns, "helper").await;
    let pp = PatchParams::default();
    let status = merge(json!({"status": {"phase": NodePhase::Provisioned.as_str(),
                                         "observedRevision": "r1"}}));
    let nncs: Api<NodeNetworkConfig> = Api::all(helper.clone());
    // RBAC is cached for a moment after the binding: its first refusal may be RBAC's own.
    let msg = eventually(T, "node-b's status refused by the policy", || async {
        match nncs.patch_status("node-b", &pp, &status).await {
            Err(kube::Error::Api(e)) if e.message.contains("netwave-agent-own-node") => {
                Ok(e.message)
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(
        msg.contains("may write only its own NodeNetworkConfig, not node-b"),
        "{msg}"
    );
    let msg = refused(
        Api::<Node>::all(helper)
            .patch(
                "node-a",
                &pp,
                &merge(json!({"metadata": {"labels": {"netwave.dev/pool": "storage"}}})),
            )
            .await,
        "relabelling node-a",
    );
    assert!(
        msg.contains("may not change metadata.labels of its Node"),
        "{msg}"
    );
    kube::Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(env.client.clone())
        .delete("rogue-helper-as-agent", &Default::default())
        .await
        .unwrap();
}

/// An agent's verdict is bounded by the CRD (#48): with node-a's pod-bound token, a status with a
/// 400 KB reason, an oversized message or probe, a long kernel capability name or a time the
/// configurator could not read is refused whole (naming the field), and nothing of it is stored; the same report cut by
/// `NodeNetworkConfigStatus::bounded`, as the agent sends it, is accepted.
#[tokio::test]
async fn an_agent_cannot_write_an_oversized_or_unreadable_status() {
    use netwave_api::NodeNetworkConfigStatus;
    let env = env().await;
    let agent_a = installed_agent(&env).await;
    let nncs: Api<NodeNetworkConfig> = Api::all(agent_a.clone());
    let pp = PatchParams::default();
    let huge = "x".repeat(400 * 1024);
    let attacks = [
        (
            "status.reason",
            json!({"phase": "Invalid", "observedRevision": "r1", "reason": huge}),
        ),
        (
            "status.message",
            json!({"phase": "Invalid", "message": "m".repeat(9000)}),
        ),
        (
            "status.probes[0].message",
            json!({"probes": [{"name": "api", "result": "Failed", "message": "p".repeat(2000)}]}),
        ),
        (
            "status.kernelCapabilities",
            json!({"kernelCapabilities": {"k".repeat(100): true}}),
        ),
        // Go's date-time parser takes this offset; the Rust one, which lists every node config,
        // does not: the node would drop out of every rollout.
        (
            "status.lastTransitionTime",
            json!({"phase": "Invalid", "lastTransitionTime": "2026-01-01T00:00:00+99:00"}),
        ),
    ];
    for (field, status) in attacks {
        let msg = invalid(
            nncs.patch_status("node-a", &pp, &merge(json!({ "status": status })))
                .await,
            field,
        );
        assert!(msg.contains(field), "{field}: {msg}");
    }
    let stored = Api::<NodeNetworkConfig>::all(env.client.clone())
        .get("node-a")
        .await
        .unwrap();
    assert!(
        stored.status.is_none(),
        "nothing stored: {:?}",
        stored.status
    );

    // What the agent sends: the same verdict, cut to the bounds.
    let st = NodeNetworkConfigStatus {
        phase: Some("Invalid".into()),
        observed_revision: Some("r1".into()),
        reason: Some(huge.clone()),
        message: Some(huge),
        ..NodeNetworkConfigStatus::default()
    }
    .bounded();
    nncs.patch_status("node-a", &pp, &merge(json!({ "status": st })))
        .await
        .expect("a bounded status is accepted");
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

/// The message of a 422 (the object is invalid against its schema); panics on anything else.
fn invalid<T>(r: Result<T, kube::Error>, what: &str) -> String {
    match r {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 422, "{what}: {}", e.message);
            e.message
        }
        Err(e) => panic!("{what}: {e}"),
        // (Not the object: it holds the oversized field.)
        Ok(_) => panic!("{what} was accepted"),
    }
}
