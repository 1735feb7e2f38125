//! Test support: the real kube-apiserver (or, for injected faults and request counters, the testbed)
//! with netwave's CRDs, Nodes, configurators running in-process, and simulated agents that answer
//! NodeNetworkConfig specs the way real agents do.

#![allow(dead_code)]

use netwave_api::vocab::{ConditionStatus, NodePhase, node_conditions};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, NodeCondition, NodeSpec, NodeStatus};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use netwave_api::manifest::{Manifest, samples};
use netwave_api::{AnyInput, NetworkConfigRevision, NodeNetworkConfig};
use netwave_configurator::args::Args;
use netwave_testbed::{Testbed, TestbedOptions};
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The API server a test talks to.
pub enum Server {
    /// The real kube-apiserver + etcd, shared by this test binary's tests one at a time.
    Real(netwave_control_plane::Shared),
    /// Our in-memory server: for injected faults, partitions and request counters.
    Testbed(Testbed),
}

pub struct Env {
    pub server: Server,
    pub client: Client,
}

impl Env {
    /// The testbed, for tests that inject faults or count requests ([`testbed_env`]).
    pub fn tb(&self) -> &Testbed {
        match &self.server {
            Server::Testbed(tb) => tb,
            Server::Real(_) => panic!("this test needs testbed_env(): faults and counters"),
        }
    }

    /// The real control plane ([`env`]).
    pub fn cp(&self) -> &netwave_control_plane::ControlPlane {
        match &self.server {
            Server::Real(cp) => cp,
            Server::Testbed(_) => panic!("this test needs env(): the real API server"),
        }
    }

    /// An admin kubeconfig for binaries the test starts.
    pub fn kubeconfig(&self) -> std::path::PathBuf {
        match &self.server {
            Server::Testbed(tb) => tb.kubeconfig_path().to_path_buf(),
            Server::Real(cp) => cp.kubeconfig().to_path_buf(),
        }
    }
}

/// Installs netwave's CRDs and the `netwave-system` namespace; returns an admin client.
pub async fn prepare(cp: &netwave_control_plane::ControlPlane) -> Client {
    cp.prepared(
        netwave_api::crds().into_iter().map(|(_, c)| c),
        "netwave-system",
    )
    .await
    .unwrap()
}

/// The real API server, empty but for netwave's CRDs and the `netwave-system` namespace.
pub async fn env() -> Env {
    let cp = netwave_control_plane::shared()
        .await
        .expect("the real control plane starts");
    let client = prepare(&cp).await;
    Env {
        server: Server::Real(cp),
        client,
    }
}

/// The testbed, for tests that inject API faults or count requests.
pub async fn testbed_env() -> Env {
    let tb = Testbed::start(
        TestbedOptions::default().with_crds(netwave_api::crds().into_iter().map(|(_, c)| c)),
    )
    .await
    .expect("testbed starts");
    let client = tb.client();
    let ns: Api<Namespace> = Api::all(client.clone());
    ns.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "netwave-system"}})).unwrap(),
    )
    .await
    .unwrap();
    Env {
        server: Server::Testbed(tb),
        client,
    }
}

pub fn node(name: &str, labels: &[(&str, &str)]) -> Node {
    let mut n = Node {
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: node_conditions::READY.into(),
                status: ConditionStatus::True.as_str().into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    n.meta_mut().name = Some(name.into());
    n.meta_mut().labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    n
}

/// Creates a Node, then sets its status: an API server ignores the status in a create (a kubelet
/// registers its Node, then reports conditions through the status subresource).
pub async fn create_node(client: &Client, node: &Node) {
    let api: Api<Node> = Api::all(client.clone());
    let name = node.name_any();
    api.create(&PostParams::default(), node).await.unwrap();
    api.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": node.status})),
    )
    .await
    .unwrap();
}

pub async fn add_nodes(client: &Client, names: &[String]) {
    for name in names {
        create_node(
            client,
            &node(
                name,
                &[("node-restriction.kubernetes.io/netwave-pool", "compute")],
            ),
        )
        .await;
    }
}

pub fn node_names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("node-{i:02}")).collect()
}

/// Creates every object of `deploy/samples/`.
pub async fn apply_samples(client: &Client) {
    for m in samples().unwrap() {
        if let Manifest::Input(o) = m {
            create_input(client, &o).await;
        }
    }
}

/// Creates one input object of any kind.
pub async fn create_input(client: &Client, o: &AnyInput) {
    let api = Api::<DynamicObject>::all_with(client.clone(), &o.kind().api_resource());
    drop(
        api.create(&PostParams::default(), &o.to_dynamic())
            .await
            .unwrap(),
    );
}

/// Changes one L2 segment's MTU: a new revision with a different config on every node.
pub async fn change_inputs(client: &Client, mtu: u32) {
    let api: Api<netwave_api::Layer2NetworkConfiguration> = Api::all(client.clone());
    api.patch(
        "vlan100-frontend",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"mtu": mtu}})),
    )
    .await
    .unwrap();
}

/// A test configurator's arguments (fast timings; the plugin's tests use the same).
pub fn args(extra: &[&str]) -> Args {
    netwave_configurator::testing::args(extra)
}

/// [`args`] with `--metrics-addr` on a free port, and the port: for [`reconciles_pass`].
pub fn args_with_metrics(extra: &[&str]) -> (Args, u16) {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut all = extra.to_vec();
    all.extend(["--metrics-addr", &addr]);
    (args(&all), port)
}

/// One series' value from the metrics on `port`.
pub async fn metric(port: u16, series: &str) -> Option<f64> {
    let (_, body) = http_get(port, "/metrics").await;
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// Waits until the configurator with metrics on `port` has reconciled `n` more times: a negative
/// ("nothing was assigned") holds over them. Two suffice: the reconcile running when this is called may
/// have read the world before the change; the next one starts after.
pub async fn reconciles_pass(port: u16, n: f64) {
    const SERIES: &str = "netwave_reconcile_duration_seconds_count ";
    let start = metric(port, SERIES).await.unwrap_or_default();
    eventually(
        Duration::from_secs(60),
        &format!("{n} more reconciles"),
        || async {
            let now = metric(port, SERIES).await.unwrap_or_default();
            (now >= start + n)
                .then_some(())
                .ok_or(format!("{now}, from {start}"))
        },
    )
    .await;
}

/// A configurator running in this process; `stop` ends it gracefully, drop aborts it (tests share an API
/// server, so nothing of one test may go on acting in the next).
pub struct Configurator {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Configurator {
    pub fn start(client: Client, args: Args) -> Self {
        let (stop, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(netwave_configurator::runtime::run_with(
            args,
            client,
            async move {
                let _ = rx.await;
            },
        ));
        Configurator {
            stop: Some(stop),
            task,
        }
    }

    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = (&mut self.task).await;
    }

    /// Simulates a crash: no lease release, nothing finishes.
    pub fn kill(self) {
        self.task.abort();
    }
}

impl Drop for Configurator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A background task aborted on drop.
pub struct Task(pub JoinHandle<()>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How a simulated agent answers a revision (the agent crate's simulated agents).
#[allow(unused_imports)]
pub use netwave_agent::reconcile::Reason;
pub use netwave_agent::sim::Answer;

/// The answer of node `(name, revision)`.
pub type Behaviour = Arc<dyn Fn(&str, &str) -> Answer + Send + Sync>;

pub fn always_ok() -> Behaviour {
    Arc::new(|_, _| Answer::Provisioned)
}

/// Simulated agents for every node (`netwave_agent::sim`): each new spec is answered after `delay`
/// with the status a real agent writes (the agent is the only writer of status).
pub fn spawn_agents(client: Client, behaviour: Behaviour, delay: Duration) -> Task {
    let by_node: netwave_agent::sim::Behaviour =
        Arc::new(move |nnc: &NodeNetworkConfig| behaviour(&nnc.name_any(), &nnc.spec.revision));
    Task(netwave_agent::sim::spawn(client, by_node, delay))
}

pub async fn revisions(client: &Client) -> Vec<NetworkConfigRevision> {
    let mut list = Api::<NetworkConfigRevision>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    list.sort_by_key(|r| r.spec.sequence);
    list
}

pub async fn configs(client: &Client) -> BTreeMap<String, NodeNetworkConfig> {
    Api::<NodeNetworkConfig>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| (c.name_any(), c))
        .collect()
}

/// Polls `check` until it returns Ok, or panics after `timeout` with the last state
/// (`netwave_control_plane::poll`).
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    netwave_control_plane::poll::eventually(what, timeout, check)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"))
}

/// The configurator Lease's holder, if any.
pub async fn holder(env: &Env) -> Option<String> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(env.client.clone(), "netwave-system");
    leases
        .get_opt("netwave-configurator")
        .await
        .ok()
        .flatten()?
        .spec?
        .holder_identity
}

/// Waits until there are `expected` revisions and the newest is `Complete`; fails the test after
/// `within`, listing the phases.
pub async fn newest_completes(client: &Client, expected: usize, within: Duration) {
    eventually(within, "the newest revision to complete", || async {
        let revs = revisions(client).await;
        match revs.last() {
            Some(r)
                if revs.len() == expected
                    && phase(r) == netwave_api::vocab::RevisionPhase::Complete.as_str() =>
            {
                Ok(())
            }
            _ => Err(format!("{:?}", revs.iter().map(phase).collect::<Vec<_>>())),
        }
    })
    .await;
}

/// A revision's phase (or "" when it has no status yet).
pub fn phase(r: &NetworkConfigRevision) -> String {
    r.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

/// Every NodeNetworkConfig and NetworkConfigRevision event in resourceVersion order, recorded from the
/// start of the test: the "watch history" the budget and counter checks replay.
pub struct History {
    events: Arc<Mutex<Vec<(u64, Recorded)>>>,
    tasks: Vec<JoinHandle<()>>,
}

#[derive(Clone, Debug)]
pub enum Recorded {
    Config(Box<NodeNetworkConfig>),
    Revision(Box<NetworkConfigRevision>),
}

impl History {
    pub fn record(client: &Client) -> Self {
        let events: Arc<Mutex<Vec<(u64, Recorded)>>> = Arc::default();
        let tasks = vec![
            record_kind(
                Api::<NodeNetworkConfig>::all(client.clone()),
                events.clone(),
                |o| Recorded::Config(Box::new(o)),
            ),
            record_kind(
                Api::<NetworkConfigRevision>::all(client.clone()),
                events.clone(),
                |o| Recorded::Revision(Box::new(o)),
            ),
        ];
        History { events, tasks }
    }

    /// The recorded events, oldest first, each object version once.
    pub fn events(&self) -> Vec<Recorded> {
        let mut ev = self.events.lock().unwrap().clone();
        ev.sort_by_key(|(rv, _)| *rv);
        ev.dedup_by_key(|(rv, _)| *rv);
        ev.into_iter().map(|(_, e)| e).collect()
    }

    /// The largest number of nodes in flight at any moment: spec revision differs from the revision the
    /// agent reports Provisioned (DESIGN.md §3's definition).
    pub fn max_in_flight(&self) -> usize {
        let mut state: BTreeMap<String, bool> = BTreeMap::new();
        let mut max = 0;
        for e in self.events() {
            if let Recorded::Config(c) = e {
                state.insert(c.name_any(), in_flight(&c));
                max = max.max(state.values().filter(|v| **v).count());
            }
        }
        max
    }
}

/// Records every version of every object of one kind, keyed by resourceVersion.
fn record_kind<K>(
    api: Api<K>,
    events: Arc<Mutex<Vec<(u64, Recorded)>>>,
    wrap: fn(K) -> Recorded,
) -> JoinHandle<()>
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    tokio::spawn(async move {
        let s = watcher(api, watcher::Config::default()).default_backoff();
        futures::pin_mut!(s);
        // An error is retried (the watcher resumes from the last version it saw): a loaded API
        // server answers a watch with a transient error now and then ("Too large resource version"
        // while its cache catches up), and a recorder that stopped there recorded nothing more.
        while let Some(ev) = s.next().await {
            let ev = match ev {
                Ok(ev) => ev,
                Err(e) => {
                    eprintln!("history: {} watch error, retrying: {e}", K::kind(&()));
                    continue;
                }
            };
            if let watcher::Event::Apply(o) | watcher::Event::InitApply(o) = ev {
                let rv = o
                    .resource_version()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                events.lock().unwrap().push((rv, wrap(o)));
            }
        }
    })
}

impl Drop for History {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

pub fn in_flight(c: &NodeNetworkConfig) -> bool {
    // A placeholder holds no assignment: nothing is being applied there.
    if c.spec.is_placeholder() {
        return false;
    }
    let st = c.status.clone().unwrap_or_default();
    !(st.phase.as_deref() == Some(NodePhase::Provisioned.as_str())
        && st.observed_revision.as_deref() == Some(c.spec.revision.as_str()))
}

/// A free local port (bound and released; fine for tests).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A plain HTTP/1.0 GET against 127.0.0.1:`port`; returns (status code, body).
pub async fn http_get(port: u16, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    let code = buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

/// The notes of the Events with `reason` about `object` (cluster-scoped objects' Events go to `default`).
pub async fn event_notes(client: &kube::Client, object: &str, reason: &str) -> Vec<String> {
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), "default");
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(object)
        })
        .filter_map(|e| e.note)
        .collect()
}

/// How many times Events with `reason` about `object` were recorded: the recorder folds repeats of one
/// (object, reason) into a series, which keeps the first note and counts.
pub async fn event_count(client: &kube::Client, object: &str, reason: &str) -> i32 {
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), "default");
    let list = events.list(&ListParams::default()).await.unwrap().items;
    list.into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(object)
        })
        .map(|e| e.series.map_or(1, |s| s.count))
        .sum()
}

/// The repository root (for `kubectl apply -k deploy/base`).
pub fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `kubectl …` from the repository root that must succeed.
pub fn kubectl(env: &Env, args: &[&str]) {
    let out = env
        .cp()
        .kubectl()
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// netwave's install without the workloads' images mattering (`deploy/base`: CRDs, service accounts,
/// RBAC, the agents' admission policy), and a client holding the pod-bound token the kubelet would mount
/// into the agent's pod on `node`: the identity an attacker who owns that node's agent has.
pub async fn agent_on(env: &Env, node: &str) -> Client {
    kubectl(env, &["apply", "-k", "deploy/base"]);
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(env.client.clone(), "netwave-system");
    let name = format!("netwave-agent-{node}");
    let pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": node, "serviceAccountName": "netwave-agent",
                 "containers": [{"name": "agent", "image": "netwave-agent"}]},
    }))
    .unwrap();
    // Pods outlive a test's reset of the shared control plane: an earlier test's is the same pod.
    let pod = match pods.create(&PostParams::default(), &pod).await {
        Err(kube::Error::Api(ae)) if ae.code == 409 => pods.get(&name).await.unwrap(),
        other => other.unwrap(),
    };
    let token = env
        .cp()
        .service_account_token(&env.client, "netwave-system", "netwave-agent", Some(&pod))
        .await
        .unwrap();
    env.cp().client_with_token(&token).await.unwrap()
}
