//! netwave installed as users install it, on a real cluster (`netwave_control_plane::node`): the test
//! overlay over `deploy/base`, `kubectl` as the admin, polling with the cluster's logs on timeout, and
//! what the tests read back (ready pods, the Lease holder, the agent's metrics, the node's links, refused
//! writes in any component's log). Used by `tests/tests/real_node*.rs`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use netwave_control_plane::node::{Cluster, NETNS, NODE_ADDR, OciImage};

use crate::fleet::workspace_root;

pub const NS: &str = "netwave-system";
pub const TAINT: &str = "netwave.dev/network-unavailable";
/// The taint of [`SimNodes`]' nodes, which have no kubelet.
pub const SIM_TAINT: &str = "netwave.test/no-kubelet";

/// Where images/build.sh writes the layouts (always the repository's target/, like tests/images.rs).
pub fn images_dir() -> PathBuf {
    workspace_root().join("target/images")
}

/// The configurator's and the plain agent's image layouts, or an error saying to build them.
pub fn images() -> Result<Vec<OciImage>> {
    images_of(&["netwave-configurator", "netwave-agent"])
}

/// The layouts of the images `names` (as `make images` names them), or an error saying to build them.
pub fn images_of(names: &[&str]) -> Result<Vec<OciImage>> {
    names
        .iter()
        .map(|name| {
            let layout = images_dir().join(name);
            if !layout.join("index.json").is_file() {
                bail!(
                    "{} has no OCI layout: run `make images` (make test builds them first)",
                    layout.display()
                );
            }
            Ok(OciImage {
                layout,
                name: format!("ghcr.io/netwave/{name}"),
            })
        })
        .collect()
}

/// The previous release's directory (`bin/`, `crds/`, `deploy/`, `build-info`; with `images.sh` also
/// `images/`), built on first use by `tests/previous-release/<script>` (`build.sh` or `images.sh`).
pub fn previous_release(script: &str) -> Result<PathBuf> {
    let out = std::process::Command::new("bash")
        .arg(workspace_root().join("tests/previous-release").join(script))
        .output()
        .with_context(|| format!("running tests/previous-release/{script}"))?;
    if !out.status.success() {
        bail!(
            "building the previous release failed (tests/previous-release/{script}):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let dir = PathBuf::from(String::from_utf8(out.stdout)?.trim());
    eprintln!(
        "previous release: {}",
        std::fs::read_to_string(dir.join("build-info"))?.trim()
    );
    Ok(dir)
}

/// The test overlay over deploy/base, written where kustomize may load deploy/base from (a relative
/// path inside the repository), with the agent's state directory at `state`.
pub fn write_overlay(state: &Path) -> Result<PathBuf> {
    write_overlay_on("deploy/base", state, "")
}

/// The test overlay over `base` (a directory of the repository: `deploy/base`, `deploy/overlays/evpn`):
/// images are never pulled, pods stop in 2 s, the agent's state hostPath is `state`; `extra` is more
/// entries of `patches:` (YAML list items, indented by two spaces).
pub fn write_overlay_on(base: &str, state: &Path, extra: &str) -> Result<PathBuf> {
    let dir = workspace_root().join("target").join(format!(
        "real-node-overlay-{}-{}",
        std::process::id(),
        base.replace('/', "-")
    ));
    std::fs::create_dir_all(&dir)?;
    let base = pathdiff(&workspace_root().join(base), &dir);
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            r#"apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - {base}
patches:
  - target: {{kind: Deployment, name: netwave-configurator}}
    patch: |
      - {{op: add, path: /spec/template/spec/containers/0/imagePullPolicy, value: Never}}
      - {{op: replace, path: /spec/template/spec/terminationGracePeriodSeconds, value: 2}}
  - patch: |
      apiVersion: apps/v1
      kind: DaemonSet
      metadata: {{name: netwave-agent, namespace: netwave-system}}
      spec:
        template:
          spec:
            terminationGracePeriodSeconds: 2
            containers:
              - {{name: agent, imagePullPolicy: Never}}
            volumes:
              - {{name: state, hostPath: {{path: {state}, type: DirectoryOrCreate}}}}
{extra}"#,
            state = state.display()
        ),
    )?;
    Ok(dir)
}

/// More `patches:` for an overlay over deploy/overlays/evpn: the FRR container's image is never pulled,
/// FRR's config directory is `frr_dir` (not the host's /var/lib/netwave/frr), and with `underlay` the
/// ConfigMap's frr.yaml is that text.
pub fn evpn_patches(frr_dir: &Path, underlay: Option<&str>) -> String {
    let mut out = format!(
        r#"  - patch: |
      apiVersion: apps/v1
      kind: DaemonSet
      metadata: {{name: netwave-agent, namespace: netwave-system}}
      spec:
        template:
          spec:
            initContainers:
              - {{name: frr, imagePullPolicy: Never}}
            volumes:
              - {{name: frr-config, hostPath: {{path: {frr}, type: DirectoryOrCreate}}}}
"#,
        frr = frr_dir.display()
    );
    if let Some(text) = underlay {
        out.push_str(
            "  - patch: |\n      apiVersion: v1\n      kind: ConfigMap\n      metadata: {name: \
             netwave-agent-frr, namespace: netwave-system}\n      data:\n        frr.yaml: |\n",
        );
        for l in text.lines() {
            out.push_str(&format!("          {l}\n"));
        }
    }
    out
}

/// `to` relative to `from` (both absolute, `to` inside the repository).
pub fn pathdiff(to: &Path, from: &Path) -> String {
    let root = workspace_root();
    let up = from
        .strip_prefix(&root)
        .map(|p| p.components().count())
        .unwrap_or(0);
    let rel = to.strip_prefix(&root).unwrap_or(to);
    format!("{}{}", "../".repeat(up), rel.display())
}

/// `kubectl …` as the admin, from the repository root; fails with its output.
pub fn kubectl(cluster: &Cluster, args: &[&str]) -> Result<String> {
    let out = cluster
        .cp
        .kubectl()
        .args(args)
        .current_dir(workspace_root())
        .output()?;
    if !out.status.success() {
        bail!(
            "kubectl {args:?}: {}{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Polls `f` until it returns `Some`, or fails after `timeout` with `what`, the last error and the
/// cluster's logs.
pub async fn until<T, F, Fut>(
    cluster: &Cluster,
    what: &str,
    timeout: Duration,
    mut f: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let waited = netwave_control_plane::poll::eventually(what, timeout, || {
        let answer = f();
        async move {
            match answer.await {
                Ok(Some(v)) => Ok(v),
                Ok(None) => Err("not yet".to_string()),
                Err(e) => Err(format!("{e:#}")),
            }
        }
    })
    .await;
    match waited {
        Ok(v) => Ok(v),
        Err(e) => bail!(
            "{e:#}\n{}\n{}",
            pods_summary(cluster).await,
            cluster.logs_tail(10)
        ),
    }
}

pub async fn pods_summary(cluster: &Cluster) -> String {
    let Ok(client) = cluster.admin().await else {
        return String::new();
    };
    let Ok(pods) = Api::<Pod>::namespaced(client, NS)
        .list(&ListParams::default())
        .await
    else {
        return String::new();
    };
    let mut out = String::from("pods:\n");
    for p in pods.items {
        let st = p.status.clone().unwrap_or_default();
        out.push_str(&format!(
            "  {} {:?} {:?}\n",
            p.name_any(),
            st.phase,
            st.container_statuses
                .unwrap_or_default()
                .iter()
                .map(|c| (c.ready, c.restart_count, c.state.clone()))
                .collect::<Vec<_>>()
        ));
        for c in ["configurator", "agent"] {
            let log = cluster.container_log(NS, &p.name_any(), c);
            let lines: Vec<&str> = log.lines().collect();
            for l in &lines[lines.len().saturating_sub(8)..] {
                out.push_str(&format!("    {l}\n"));
            }
        }
    }
    out
}

/// Ready pods of a workload (by its `app.kubernetes.io/name`), sorted by name.
pub async fn ready_pods(client: &Client, app: &str) -> Result<Vec<String>> {
    let pods = Api::<Pod>::namespaced(client.clone(), NS)
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/name={app}")))
        .await?;
    let mut ready: Vec<String> = pods
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .map(|p| p.name_any())
        .collect();
    ready.sort();
    Ok(ready)
}

pub async fn leader(client: &Client) -> Result<Option<String>> {
    let lease = Api::<Lease>::namespaced(client.clone(), NS)
        .get_opt("netwave-configurator")
        .await?;
    Ok(lease.and_then(|l| l.spec).and_then(|s| s.holder_identity))
}

/// The agent's counter `name` from its /metrics (hostNetwork: the node's address).
pub async fn agent_metric(name: &str) -> Result<f64> {
    metric_at((NODE_ADDR, 9091).into(), name).await
}

/// `GET /metrics` at `addr` (HTTP/1.0, so the body ends with the connection): the response, or an
/// error after 5 s without one.
pub async fn scrape(addr: std::net::SocketAddr) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let limit = Duration::from_secs(5);
    let mut s = tokio::time::timeout(limit, tokio::net::TcpStream::connect(addr))
        .await
        .with_context(|| format!("connecting to {addr}: timed out"))??;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: metrics\r\n\r\n")
        .await?;
    let mut body = String::new();
    tokio::time::timeout(limit, s.read_to_string(&mut body))
        .await
        .with_context(|| format!("reading {addr}/metrics: timed out"))??;
    Ok(body)
}

/// The value of metric `name` (a line `name value`) at `addr`'s /metrics.
pub async fn metric_at(addr: std::net::SocketAddr, name: &str) -> Result<f64> {
    let body = scrape(addr).await?;
    body.lines()
        .find_map(|l| {
            l.strip_prefix(name)
                .filter(|r| r.starts_with(' '))
                .and_then(|r| r.trim().parse().ok())
        })
        .with_context(|| format!("no {name} in the metrics of {addr}"))
}

/// `ip -br link` in the node's namespace.
pub fn node_links() -> String {
    std::process::Command::new("ip")
        .args(["-n", NETNS, "-br", "link"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// What every netwave component logged that says a write was refused (a 403 of RBAC or the admission
/// policy): none is the only right count.
pub fn refusals(cluster: &Cluster, pods: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for p in pods {
        for c in ["configurator", "agent"] {
            for l in cluster.container_log(NS, p, c).lines() {
                if says_refused(l) {
                    out.push(format!("{p}/{c}: {l}"));
                }
            }
        }
    }
    out
}

/// Whether a log line reports a refusal: the API server's 403 reads "... is forbidden: ...: Forbidden"
/// in kube's errors, and an HTTP-level one "(403 Forbidden)"; a bare status code counts only where it
/// is written as one. A number in a message is not a status: "too old resource version: 403 (404):
/// Expired" is a watch resuming after an outage, not a refusal.
fn says_refused(line: &str) -> bool {
    line.to_ascii_lowercase().contains("forbidden")
        || ["(403)", "code: 403", "\"code\":403", "status: 403"]
            .iter()
            .any(|code| line.contains(code))
}

/// Nodes without a kubelet beside the real one, each answered by a simulated agent
/// (`netwave_agent::sim`) under the agent's own credentials: a token bound to the DaemonSet's pod on that
/// node, as the kubelet would mount it, so the admission policy lets it write that node's status only.
/// The harness keeps each Node Ready as its kubelet would (Lease renewals and the Ready condition, as the
/// admin). Rollouts then cover several nodes, so budgets, order and rollback are exercised with the real
/// node among them.
pub struct SimNodes {
    pub names: Vec<String>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl SimNodes {
    /// Registers `names` as Ready Nodes, waits for the agent DaemonSet's pod on each, and starts each
    /// node's simulated agent with `behaviour` (answers after `delay`) under that pod's token. The pods
    /// stay as the DaemonSet made them (never Ready, never replaced).
    pub async fn start(
        cluster: &Cluster,
        names: &[&str],
        behaviour: netwave_agent::sim::Behaviour,
        delay: Duration,
    ) -> Result<SimNodes> {
        let (admin, mut me) = Self::register(cluster, names).await?;
        for name in names {
            let pod = Self::agent_pod(cluster, &admin, name).await?;
            let client = agent_client(&admin, &cluster.cp.endpoint(), &pod).await?;
            me.tasks.push(netwave_agent::sim::spawn_node(
                client,
                name,
                behaviour.clone(),
                delay,
            ));
        }
        Ok(me)
    }

    /// As [`SimNodes::start`] (each spec answered after `pace` of it), and the harness plays each node's kubelet for the agent DaemonSet's pod:
    /// it reports the pod Ready (so the DaemonSet's rolling update counts it available and moves on), it
    /// confirms a deleted pod's end (the DaemonSet then makes the new one), and it restarts the simulated
    /// agent under the new pod's token, as the new pod's agent would start. An upgrade of the DaemonSet
    /// then rolls over these nodes too.
    pub async fn start_with_kubelet(
        cluster: &Cluster,
        names: &[&str],
        behaviour: netwave_agent::sim::Behaviour,
        pace: netwave_agent::sim::Pace,
    ) -> Result<SimNodes> {
        let (admin, mut me) = Self::register(cluster, names).await?;
        for name in names {
            Self::agent_pod(cluster, &admin, name).await?;
            me.tasks.push(tokio::spawn(sim_kubelet(
                admin.clone(),
                cluster.cp.endpoint(),
                name.to_string(),
                behaviour.clone(),
                pace.clone(),
            )));
        }
        Ok(me)
    }

    /// Creates the Nodes and starts their heartbeats.
    async fn register(cluster: &Cluster, names: &[&str]) -> Result<(Client, SimNodes)> {
        use k8s_openapi::api::core::v1::Node;
        use kube::api::PostParams;
        let admin = cluster.admin().await?;
        let nodes: Api<Node> = Api::all(admin.clone());
        let mut me = SimNodes {
            names: names.iter().map(|n| n.to_string()).collect(),
            tasks: Vec::new(),
        };
        for name in names {
            // No kubelet runs there: only the agent DaemonSet (it tolerates every taint) may have pods
            // on it, so a configurator pod the Deployment replaces never waits for ever on such a node.
            let node: Node = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                "spec": {"taints": [{"key": SIM_TAINT, "effect": "NoSchedule"}]},
            }))?;
            nodes.create(&PostParams::default(), &node).await?;
        }
        // The kubelet's heartbeats: the node's Lease and its Ready condition, every 5 s.
        let heartbeat_names = me.names.clone();
        let heartbeat_admin = admin.clone();
        me.tasks.push(tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(5));
            loop {
                every.tick().await;
                for n in &heartbeat_names {
                    let _ = heartbeat(&heartbeat_admin, n).await;
                }
            }
        }));
        for name in names {
            heartbeat(&admin, name).await?;
        }
        Ok((admin, me))
    }

    /// Waits for the agent DaemonSet's pod on `node`.
    async fn agent_pod(cluster: &Cluster, admin: &Client, node: &str) -> Result<Pod> {
        until(
            cluster,
            &format!("the agent DaemonSet's pod on {node}"),
            Duration::from_secs(60),
            || async move { Ok(agent_pods(admin, node).await?.into_iter().next()) },
        )
        .await
    }

    /// Stops the simulated agents and heartbeats, deletes the Nodes and their pods (no kubelet would ever
    /// confirm those pods' deletion: they go at once).
    pub async fn stop(mut self, cluster: &Cluster) {
        use k8s_openapi::api::core::v1::Node;
        use kube::api::DeleteParams;
        for t in self.tasks.drain(..) {
            t.abort();
        }
        let Ok(admin) = cluster.admin().await else {
            return;
        };
        for name in &self.names {
            let _ = Api::<Node>::all(admin.clone())
                .delete(name, &DeleteParams::default())
                .await;
            let pods: Api<Pod> = Api::all(admin.clone());
            if let Ok(list) = pods
                .list(&ListParams::default().fields(&format!("spec.nodeName={name}")))
                .await
            {
                for p in list.items {
                    let ns = p.metadata.namespace.clone().unwrap_or_default();
                    let _ = Api::<Pod>::namespaced(admin.clone(), &ns)
                        .delete(&p.name_any(), &DeleteParams::default().grace_period(0))
                        .await;
                }
            }
        }
    }
}

impl Drop for SimNodes {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// What a kubelet does every few seconds: renew its Lease in `kube-node-lease` and report Ready.
async fn heartbeat(admin: &Client, node: &str) -> Result<()> {
    use k8s_openapi::api::core::v1::Node;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use kube::api::{Patch, PatchParams};
    let now = k8s_openapi::jiff::Timestamp::now();
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
    let lease = serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": node, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": MicroTime(now)},
    });
    let apply = PatchParams::apply("netwave-test-kubelet").force();
    leases.patch(node, &apply, &Patch::Apply(&lease)).await?;
    let status = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        // What the scheduler needs to place the DaemonSet's pod there.
        "status": {
          "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
          "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
          "conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "simulated by the test harness",
            "lastHeartbeatTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
        }]},
    });
    Api::<Node>::all(admin.clone())
        .patch_status(node, &apply, &Patch::Apply(&status))
        .await?;
    Ok(())
}

/// A client with the agent's credentials on `pod`'s node: a token bound to that pod, as the kubelet
/// mounts it.
async fn agent_client(
    admin: &Client,
    endpoint: &netwave_control_plane::Endpoint,
    pod: &Pod,
) -> Result<Client> {
    let token =
        netwave_control_plane::service_account_token(admin, NS, "netwave-agent", Some(pod)).await?;
    endpoint.client_with_token(&token).await
}

/// No netwave component was refused anything: none of `pods` logged a 403, and the API server's audit
/// log shows no 403 for any netwave-system service account (a component that swallowed the error
/// would still show there).
pub fn assert_nothing_refused(cluster: &Cluster, pods: &[String]) {
    let refused = refusals(cluster, pods);
    assert!(
        refused.is_empty(),
        "netwave's components were refused:\n{}",
        refused.join("\n")
    );
    let refused = cluster.refused(NS);
    assert!(
        refused.is_empty(),
        "the audit log shows refused requests of netwave's service accounts:\n{}",
        refused.join("\n")
    );
}

/// The agent DaemonSet's pods on `node`, the ones being deleted included.
async fn agent_pods(admin: &Client, node: &str) -> Result<Vec<Pod>> {
    let pods = Api::<Pod>::namespaced(admin.clone(), NS)
        .list(
            &ListParams::default()
                .labels("app.kubernetes.io/name=netwave-agent")
                .fields(&format!("spec.nodeName={node}")),
        )
        .await?;
    Ok(pods.items)
}

/// A simulated node's kubelet for the agent DaemonSet's pod ([`SimNodes::start_with_kubelet`]), once a
/// second until aborted; the simulated agent it started ends with it.
async fn sim_kubelet(
    admin: Client,
    endpoint: netwave_control_plane::Endpoint,
    node: String,
    behaviour: netwave_agent::sim::Behaviour,
    pace: netwave_agent::sim::Pace,
) {
    /// Aborts the simulated agent when the kubelet replaces it or ends.
    struct Running(String, tokio::task::JoinHandle<()>);
    impl Drop for Running {
        fn drop(&mut self) {
            self.1.abort();
        }
    }
    let mut running: Option<Running> = None;
    let mut every = tokio::time::interval(Duration::from_secs(1));
    loop {
        every.tick().await;
        let Ok(pods) = agent_pods(&admin, &node).await else {
            continue;
        };
        let api = Api::<Pod>::namespaced(admin.clone(), NS);
        for gone in pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
        {
            let _ = api
                .delete(
                    &gone.name_any(),
                    &kube::api::DeleteParams::default().grace_period(0),
                )
                .await;
        }
        let Some(pod) = pods
            .into_iter()
            .find(|p| p.metadata.deletion_timestamp.is_none())
        else {
            running = None;
            continue;
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if running.as_ref().is_some_and(|r| r.0 == uid) {
            continue;
        }
        running = None;
        let started = async {
            let client = agent_client(&admin, &endpoint, &pod).await?;
            let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            );
            let status = serde_json::json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "status": {"phase": "Running", "conditions": [
                    {"type": "Ready", "status": "True", "lastTransitionTime": now},
                    {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                ]},
            });
            let apply = kube::api::PatchParams::apply("netwave-test-kubelet").force();
            api.patch_status(&pod.name_any(), &apply, &kube::api::Patch::Apply(&status))
                .await?;
            anyhow::Ok(client)
        };
        match started.await {
            Ok(client) => {
                let agent = netwave_agent::sim::spawn_node_paced(
                    client,
                    &node,
                    behaviour.clone(),
                    pace.clone(),
                );
                running = Some(Running(uid, agent));
            }
            Err(e) => eprintln!("simulated kubelet of {node}: pod {}: {e:#}", pod.name_any()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::says_refused;

    #[test]
    fn a_refusal_is_told_from_a_number_in_a_message() {
        for refused in [
            r#"{"message":"write failed","error":"ApiError: nodenetworkconfigs.network.netwave.io \"n1\" is forbidden: User \"system:serviceaccount:netwave-system:netwave-agent\" cannot patch resource: Forbidden"}"#,
            "HTTP status client error (403 Forbidden) for url (https://198.19.0.254/api)",
            r#"ErrorResponse { status: "Failure", message: "denied", reason: "Forbidden", code: 403 }"#,
            r#"{"kind":"Status","code":403}"#,
        ] {
            assert!(says_refused(refused), "{refused}");
        }
        for not in [
            r#"{"message":"watch error","error":"error returned by apiserver during watch: too old resource version: 403 (404): Expired"}"#,
            "reconciled 403 nodes in 12 ms",
            "revision rev-4030 cut",
        ] {
            assert!(!says_refused(not), "{not}");
        }
    }
}
