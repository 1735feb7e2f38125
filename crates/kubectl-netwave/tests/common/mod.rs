//! Test support: the real kube-apiserver with netwave's CRDs, objects written as the configurator and
//! agents would write them, and the plugin run in-process (output captured) or as a binary.

#![allow(dead_code)]

use netwave_api::vocab::{ConditionStatus, node_conditions};
use std::sync::{Arc, Mutex};

use clap::Parser;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use kubectl_netwave::{Cli, Exit, Term};
use netwave_api::{
    Layer2NetworkConfiguration, NetworkConfigInputs, NetworkConfigRevision, NodeNetworkConfig,
    RevisionInputs, RoutingTable, VRFRouteConfiguration,
};
use netwave_core::revision::{canonical_inputs, inputs_hash, revision_name};
use serde_json::{Value, json};

pub struct Env {
    pub cp: netwave_control_plane::Shared,
    pub client: Client,
}

/// The real API server, empty but for netwave's CRDs.
pub async fn env() -> Env {
    let cp = netwave_control_plane::shared()
        .await
        .expect("the real control plane starts");
    let client = cp
        .prepared(
            netwave_api::crds().into_iter().map(|(_, c)| c),
            "netwave-system",
        )
        .await
        .unwrap();
    Env { cp, client }
}

/// Runs `kubectl netwave <args>` in-process; returns how it ended and what it printed.
pub async fn kn(client: &Client, args: &[&str]) -> (Exit, String) {
    match try_kn(client, args).await {
        Ok(r) => r,
        Err(e) => panic!("kubectl netwave {args:?} failed: {e:#}"),
    }
}

/// The error `kubectl netwave <args>` ends with.
pub async fn kn_err(client: &Client, args: &[&str]) -> String {
    match try_kn(client, args).await {
        Ok((exit, out)) => panic!("kubectl netwave {args:?} succeeded ({exit:?}): {out}"),
        Err(e) => format!("{e:#}"),
    }
}

pub async fn try_kn(client: &Client, args: &[&str]) -> anyhow::Result<(Exit, String)> {
    let cli = Cli::try_parse_from(std::iter::once("kubectl-netwave").chain(args.iter().copied()))?;
    let mut buf = Vec::new();
    let mut term = Term {
        out: &mut buf,
        tty: false,
    };
    let exit = kubectl_netwave::run(cli, client.clone(), &mut term).await?;
    Ok((exit, String::from_utf8(buf).unwrap()))
}

/// Output written so far by a command running in a task.
#[derive(Clone, Default)]
pub struct Shared(pub Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Shared {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Shared {
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

/// Runs `kubectl netwave <args>` in a task, writing into `out`.
pub fn spawn_kn(
    client: &Client,
    args: &[&str],
    out: Shared,
) -> tokio::task::JoinHandle<anyhow::Result<Exit>> {
    let cli = Cli::try_parse_from(std::iter::once("kubectl-netwave").chain(args.iter().copied()))
        .unwrap();
    let client = client.clone();
    tokio::spawn(async move {
        let mut out = out;
        let mut term = Term {
            out: &mut out,
            tty: false,
        };
        kubectl_netwave::run(cli, client, &mut term).await
    })
}

pub fn node(name: &str, labels: Value) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {},
    }))
    .unwrap()
}

/// Creates a Ready Node (status through the status subresource, as a kubelet reports it).
pub async fn create_node(client: &Client, name: &str, labels: Value) {
    let api: Api<Node> = Api::all(client.clone());
    api.create(&PostParams::default(), &node(name, labels))
        .await
        .unwrap();
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"conditions": [{"type": node_conditions::READY, "status": ConditionStatus::True.as_str()}]}})),
    )
    .await
    .unwrap();
}

/// Input objects: a VRF, a layer-2 segment on nodes labelled `rack: a` with `mtu`, and, with
/// `extra`, a routing table on every node.
pub fn inputs(mtu: u32, extra: bool) -> RevisionInputs {
    let mut v = json!({
        "vrfs": [{"name": "tenant", "spec": {"vrf": "tenant", "vni": 2000, "routeTarget": "64512:2000", "tableId": 200, "seq": 1}}],
        "layer2s": [{"name": "vlan100", "spec": {
            "id": 100, "vni": 1000100, "mtu": mtu, "vrf": "tenant",
            "anycastGateways": ["10.250.0.1/24"], "anycastMac": "02:00:5e:00:01:01",
            "nodeSelector": {"matchLabels": {"rack": "a"}}
        }}],
        "routingTables": [],
    });
    if extra {
        v["routingTables"] = json!([{"name": "extra", "spec": {
            "tableId": 300, "routes": [{"prefix": "10.9.0.0/16", "type": "blackhole"}]
        }}]);
    }
    canonical_inputs(&serde_json::from_value(v).unwrap())
}

/// Creates (or replaces the spec of) every input object of `inputs` on the cluster.
pub async fn create_inputs(client: &Client, inputs: &RevisionInputs) {
    let pp = PostParams::default();
    for o in &inputs.vrfs {
        Api::<VRFRouteConfiguration>::all(client.clone())
            .create(&pp, &VRFRouteConfiguration::new(&o.name, o.spec.clone()))
            .await
            .unwrap();
    }
    for o in &inputs.layer2s {
        Api::<Layer2NetworkConfiguration>::all(client.clone())
            .create(
                &pp,
                &Layer2NetworkConfiguration::new(&o.name, o.spec.clone()),
            )
            .await
            .unwrap();
    }
    for o in &inputs.routing_tables {
        Api::<RoutingTable>::all(client.clone())
            .create(&pp, &RoutingTable::new(&o.name, o.spec.clone()))
            .await
            .unwrap();
    }
}

/// Creates the revision of `inputs` with `sequence` and sets its status (as the configurator would).
pub async fn create_revision(
    client: &Client,
    inputs: &RevisionInputs,
    sequence: u64,
    status: Value,
) -> String {
    let inputs = canonical_inputs(inputs);
    let hash = inputs_hash(&inputs);
    let name = revision_name(&hash);
    let api: Api<NetworkConfigRevision> = Api::all(client.clone());
    let rev: NetworkConfigRevision = serde_json::from_value(json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "NetworkConfigRevision",
        "metadata": {"name": name},
        "spec": {"hash": hash, "sequence": sequence},
    }))
    .unwrap();
    api.create(&PostParams::default(), &rev).await.unwrap();
    Api::<NetworkConfigInputs>::all(client.clone())
        .create(
            &PostParams::default(),
            &NetworkConfigInputs::new(&name, inputs),
        )
        .await
        .unwrap();
    set_revision_status(client, &name, status).await;
    name
}

pub async fn set_revision_status(client: &Client, name: &str, status: Value) {
    Api::<NetworkConfigRevision>::all(client.clone())
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .unwrap();
}

/// A NodeNetworkConfig assigned `revision` at `assigned_at`, with the agent's `status`.
pub async fn create_config(
    client: &Client,
    node: &str,
    revision: &str,
    sequence: u64,
    assigned_at: &str,
    status: Value,
) {
    let api: Api<NodeNetworkConfig> = Api::all(client.clone());
    let nnc: NodeNetworkConfig = serde_json::from_value(json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "NodeNetworkConfig",
        "metadata": {"name": node, "annotations": {"netwave.dev/assigned-at": assigned_at}},
        "spec": {"revision": revision, "sequence": sequence, "configHash": "h", "config": {}},
    }))
    .unwrap();
    api.create(&PostParams::default(), &nnc).await.unwrap();
    api.patch_status(
        node,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": status})),
    )
    .await
    .unwrap();
}

pub async fn revision(client: &Client, name: &str) -> NetworkConfigRevision {
    Api::<NetworkConfigRevision>::all(client.clone())
        .get(name)
        .await
        .unwrap()
}

/// The inputs on the cluster, folded as the configurator folds them.
pub async fn live_inputs(client: &Client) -> RevisionInputs {
    kubectl_netwave::cluster::live_inputs(client).await.unwrap()
}

pub fn names<K: ResourceExt>(list: &[K]) -> Vec<String> {
    list.iter().map(|o| o.name_any()).collect()
}

/// A background task aborted on drop (tests share an API server: nothing may go on acting after one).
pub struct Task<T>(pub tokio::task::JoinHandle<T>);

impl<T> Drop for Task<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
