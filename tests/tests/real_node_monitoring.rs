//! netwave's monitoring on a real cluster (#26): what `deploy/monitoring` promises an operator, checked
//! against netwave installed as users install it (`netwave_control_plane::node`, as in real_node.rs).
//!
//! ```text
//!  kubectl apply -k <overlay of deploy/overlays/monitoring>   (base + ServiceMonitors, PrometheusRule,
//!        │                                                     dashboard ConfigMap; the operator's CRDs)
//!        ▼
//!  ServiceMonitors as stored ──► scrape jobs as prometheus-operator renders them (role endpoints,
//!        │                       keep by the Services' labels and the port name, job from jobLabel)
//!        │ endpoints discovery under Prometheus's own ServiceAccount (kubernetes_sd::EndpointsDiscovery)
//!        ▼
//!  /usr/bin/prometheus on the host ──► configurator pods (10.244.0.0/24, in the node's namespace) and
//!        │ PrometheusRule as stored  the agent (198.19.0.1:9091, the node's host network)
//!        ▼
//!  scenarios: a revision that cuts the node's host network off the `kubernetes` Service (rolled back),
//!  an agent release whose image the node lacks, the API server stopped while a change settles,
//!  configurators scaled to 0 ──► the alerts written for each fire; every dashboard panel has data
//! ```
//!
//! No Prometheus operator runs here, so the test renders the scrape configuration from the
//! ServiceMonitors the way the operator does: a change to the shipped monitors changes what is scraped
//! (or fails the renderer, naming the field). Debian's Prometheus is built without Kubernetes discovery,
//! so the test discovers the endpoints as it would, with a ServiceAccount token bound to a ClusterRole
//! with only what prometheus-operator's Prometheus needs for it (never the admin's), and hands Prometheus
//! the targets with the same meta labels through a file (`prometheus::Discovery`). Alert expressions are
//! the shipped ones; their `for:` durations are divided by 60 (`for: 5m` fires after 5 s) so the suite
//! runs in about 3 minutes; promtool's cases (alerts.rs) cover the durations.
//!
//! Needs root, the images (`make images`), the node's tools (`tools/deps.sh cluster`) and Debian's
//! prometheus (`tools/deps.sh test`); without them it fails saying which is missing.

use netwave_api::vocab::{NodePhase, NodeReason, RevisionPhase};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::{Client, ResourceExt};
use netwave_api::{NetworkConfigRevision, NodeNetworkConfig};
use netwave_control_plane::node::{Cluster, ClusterOptions, NETNS, NODE_ADDR, POD_CIDR};
use netwave_e2e::fleet::workspace_root;
use netwave_e2e::grafana::{self, TimeRange};
use netwave_e2e::install::{
    NS, TAINT, images, kubectl, leader, pathdiff, ready_pods, refusals, scrape, until,
    write_overlay_on,
};
use netwave_e2e::kubernetes_sd::EndpointsDiscovery;
use netwave_e2e::netns::is_root;
use netwave_e2e::prometheus::{
    Alert, Discovery, Prometheus, binary, monitor_namespaces, rule_file_from, scale_for,
    service_monitor_jobs,
};
use serde_json::{Value, json};

/// `for:` durations are divided by this (see the module docs).
const FOR_SCALE: u32 = 60;
/// prometheus-operator's default global scrape interval (a ServiceMonitor endpoint's own wins), also
/// what the dashboard's datasource is told its scrape interval is.
const GLOBAL_SCRAPE: Duration = Duration::from_secs(30);
const T: Duration = Duration::from_secs(120);
/// The routing table the bad revision brings (and the fix changes).
const BAD_TABLE: &str = "kubernetes-service-blackhole";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitoring_on_a_real_node_scrapes_the_pods_shows_every_panel_and_fires_the_alerts() {
    if !is_root() {
        panic!("the real-node tier needs root (it runs a kubelet and containerd)");
    }
    binary("prometheus").unwrap_or_else(|e| panic!("{e:#}"));
    let images = images().unwrap_or_else(|e| panic!("{e:#}"));
    let t0 = Instant::now();
    let mut cluster = Cluster::start(ClusterOptions {
        taints: vec![format!("{TAINT}=:NoSchedule")],
        images,
        ..ClusterOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    let state = cluster.scratch_dir("agent-state");
    let r = run(&mut cluster, &state).await;
    if let Err(e) = &r {
        eprintln!("{e:#}");
    }
    cluster.stop().await;
    let left = Command::new("ip")
        .args(["route", "show", POD_CIDR])
        .output();
    let left = left.map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    assert_eq!(
        left.unwrap_or_default().trim(),
        "",
        "the host has no route to the pod network after teardown"
    );
    r.unwrap();
    eprintln!(
        "real node monitoring: {:.1} s in all",
        t0.elapsed().as_secs_f64()
    );
}

/// Seconds since the epoch (Prometheus's time axis).
fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Removes on drop what the test added to the host: commands that undo it (a route), a directory.
struct Undo(Vec<Vec<String>>, Option<std::path::PathBuf>);

impl Drop for Undo {
    fn drop(&mut self) {
        for cmd in self.0.iter().rev() {
            let _ = Command::new(&cmd[0]).args(&cmd[1..]).status();
        }
        if let Some(d) = &self.1 {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

fn sh(args: &[&str]) -> Result<String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .with_context(|| format!("running {args:?}"))?;
    ensure!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The host reaches the node's address on its veth; the pod network lives inside the node's namespace,
/// so the host needs a route to it through the node (added only when missing, removed by `undo`).
fn route_to_pods(undo: &mut Undo) -> Result<()> {
    let pod = POD_CIDR.replace(".0/24", ".1");
    let via = sh(&["ip", "route", "get", &pod])?;
    if !via.contains(&format!("via {NODE_ADDR}")) {
        sh(&[
            "ip",
            "route",
            "add",
            POD_CIDR,
            "via",
            &NODE_ADDR.to_string(),
        ])?;
        undo.0.push(
            [
                "ip",
                "route",
                "del",
                POD_CIDR,
                "via",
                &NODE_ADDR.to_string(),
            ]
            .map(String::from)
            .to_vec(),
        );
        eprintln!("host: route {POD_CIDR} via {NODE_ADDR} added (removed at the end)");
    }
    Ok(())
}

/// The node's kernel state netwave manages, comparable between two moments: links, addresses, policy
/// rules and the routes of every table but those the kernel derives from addresses (`proto kernel`, the
/// local table: an IPv6 address's appear only after duplicate address detection).
fn kernel_state() -> Result<String> {
    let n = |args: &[&str]| {
        let mut full = vec!["ip", "-n", NETNS];
        full.extend_from_slice(args);
        sh(&full)
    };
    let links: Vec<String> = n(&["-br", "link"])?
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect();
    let routes: String = n(&["route", "show", "table", "all"])?
        .lines()
        .filter(|l| !l.contains("proto kernel") && !l.contains("table local"))
        .map(|l| format!("{l}\n"))
        .collect();
    Ok(format!(
        "links: {}\naddresses:\n{}rules:\n{}routes:\n{routes}",
        links.join(" "),
        n(&["-br", "addr"])?,
        n(&["rule"])?,
    ))
}

async fn pod_ip(client: &Client, pod: &str) -> Result<String> {
    Api::<Pod>::namespaced(client.clone(), NS)
        .get(pod)
        .await?
        .status
        .and_then(|s| s.pod_ip)
        .with_context(|| format!("pod {pod} has no IP"))
}

/// One sample of `name` (any labels) summed over its series, from an exposition text.
fn metric_sum(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = l.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with(' ') || rest.starts_with('{')) {
            continue;
        }
        if let Some(v) = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

/// The Prometheus identity: a ServiceAccount, a ClusterRole with what prometheus-operator's Prometheus
/// needs for endpoints discovery (and no more), bound in each namespace the monitors discover (a
/// ClusterRoleBinding only if one discovers every namespace). Returns a TokenRequest token.
async fn prometheus_identity(
    cluster: &Cluster,
    admin: &Client,
    namespaces: &BTreeSet<String>,
    all_namespaces: bool,
    dir: &Path,
) -> Result<String> {
    let mut docs = vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "monitoring"}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "prometheus", "namespace": "monitoring"}}),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "netwave-test-prometheus"},
            "rules": [
                {"apiGroups": [""], "resources": ["services", "endpoints", "pods"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
            ],
        }),
    ];
    let subject =
        json!([{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}]);
    let role_ref = json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "netwave-test-prometheus"});
    if all_namespaces {
        docs.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "netwave-test-prometheus"}, "roleRef": role_ref, "subjects": subject,
        }));
    }
    for ns in namespaces {
        docs.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "netwave-test-prometheus", "namespace": ns},
            "roleRef": role_ref, "subjects": subject,
        }));
    }
    let file = dir.join("prometheus-rbac.json");
    std::fs::write(
        &file,
        serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "List", "items": docs}))?,
    )?;
    kubectl(cluster, &["apply", "-f", &file.display().to_string()])?;
    cluster
        .cp
        .service_account_token(admin, "monitoring", "prometheus", None)
        .await
}

/// Installs the operator's CRDs, then `kubectl apply -k` of the test overlay over
/// deploy/overlays/monitoring. Returns the overlay's directory.
fn install(cluster: &Cluster, state: &Path) -> Result<std::path::PathBuf> {
    let operator = cluster.cp.binaries().prometheus_operator_crds.clone();
    kubectl(
        cluster,
        &[
            "apply",
            "--server-side",
            "-f",
            &operator.display().to_string(),
        ],
    )?;
    for crd in ["prometheusrules", "servicemonitors"] {
        kubectl(
            cluster,
            &[
                "wait",
                "--for=condition=Established",
                &format!("crd/{crd}.monitoring.coreos.com"),
            ],
        )?;
    }
    let overlay = write_overlay_on("deploy/overlays/monitoring", state, "")?;
    let rel = pathdiff(&overlay, &workspace_root());
    let applied = kubectl(cluster, &["apply", "-k", &rel])?;
    eprintln!(
        "installed deploy/overlays/monitoring ({} objects)",
        applied.lines().count()
    );
    Ok(overlay)
}

/// The operator's kinds as stored, by plural.
async fn monitoring_objects(admin: &Client, kind: &str) -> Result<Vec<Value>> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("monitoring.coreos.com", "v1", kind));
    let list = Api::<DynamicObject>::all_with(admin.clone(), &ar)
        .list(&ListParams::default())
        .await?;
    list.items
        .into_iter()
        .map(|o| {
            let mut v = serde_json::to_value(o)?;
            v["apiVersion"] = json!("monitoring.coreos.com/v1");
            v["kind"] = json!(kind);
            Ok(v)
        })
        .collect()
}

fn summary(alerts: &[Alert]) -> String {
    let mut lines: Vec<String> = alerts
        .iter()
        .map(|a| format!("{} {} {:?}", a.name, a.state, a.labels.get("instance")))
        .collect();
    lines.sort();
    lines.dedup();
    format!("[{}]", lines.join("; "))
}

/// Waits until every alert of `names` is firing; returns how long it took.
async fn firing(
    cluster: &Cluster,
    prom: &Prometheus,
    log: &AlertLog,
    names: &[&str],
) -> Result<Duration> {
    let t = Instant::now();
    let what = format!("alerts {names:?} firing");
    let last = std::sync::Mutex::new(String::new());
    let r = until(cluster, &what, T, || {
        let last = &last;
        async move {
            let alerts = prom.alerts().await?;
            log.record(&alerts);
            *last.lock().unwrap() = summary(&alerts);
            let all = names
                .iter()
                .all(|n| alerts.iter().any(|a| a.name == *n && a.state == "firing"));
            Ok(all.then_some(()))
        }
    })
    .await;
    r.with_context(|| {
        format!(
            "active alerts: {}\n--- prometheus\n{}",
            last.lock().unwrap(),
            prom.log_tail(10)
        )
    })?;
    Ok(t.elapsed())
}

/// When each alert was first seen pending and firing (unix seconds) and the instance it first fired
/// for, polled from Prometheus's alerts API every 500 ms for the whole run (and recorded by every wait
/// for an alert).
#[derive(Clone, Debug, Default)]
struct Seen {
    pending: Option<f64>,
    firing: Option<f64>,
    instance: Option<String>,
    /// The firing alert's labels but its name and severity, as `k=v` (which object kind, which job).
    labels: String,
}

struct AlertLog {
    seen: Arc<Mutex<BTreeMap<String, Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

fn record(log: &Mutex<BTreeMap<String, Seen>>, alerts: &[Alert]) {
    let now = unix_now();
    let mut log = log.lock().unwrap();
    for a in alerts {
        let e = log.entry(a.name.clone()).or_default();
        if a.state == "pending" {
            e.pending.get_or_insert(now);
        } else if a.state == "firing" && e.firing.is_none() {
            e.firing = Some(now);
            e.instance = a.labels.get("instance").cloned();
            e.labels = (a.labels.iter())
                .filter(|(k, _)| *k != "alertname" && *k != "severity")
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ");
        }
    }
}

impl AlertLog {
    fn start(prom: Arc<Prometheus>) -> AlertLog {
        let seen: Arc<Mutex<BTreeMap<String, Seen>>> = Arc::default();
        let log = seen.clone();
        let task = tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(500));
            loop {
                every.tick().await;
                if let Ok(alerts) = prom.alerts().await {
                    record(&log, &alerts);
                }
            }
        });
        AlertLog { seen, task }
    }

    fn record(&self, alerts: &[Alert]) {
        record(&self.seen, alerts);
    }

    fn first(&self) -> BTreeMap<String, Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for AlertLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The scenarios, in order: what was done, when (unix seconds), and the alerts written for it.
#[derive(Default)]
struct Timeline(Vec<(&'static str, f64, &'static [&'static str])>);

impl Timeline {
    fn start(&mut self, what: &'static str, alerts: &'static [&'static str]) -> f64 {
        let now = unix_now();
        self.0.push((what, now, alerts));
        now
    }

    /// The scenario running at `t`, and when it began.
    fn at(&self, t: f64) -> Option<(&'static str, f64)> {
        self.0
            .iter()
            .rev()
            .find(|(_, s, _)| *s <= t)
            .map(|(w, s, _)| (*w, *s))
    }
}

/// A CRI log line's timestamp (`2026-01-01T00:00:00.123456789Z stderr F …`) in unix seconds.
fn log_time(line: &str) -> Option<f64> {
    let ts: k8s_openapi::jiff::Timestamp = line.split_whitespace().next()?.parse().ok()?;
    Some(ts.as_millisecond() as f64 / 1000.0)
}

async fn run(cluster: &mut Cluster, state: &Path) -> Result<()> {
    let admin = cluster.admin().await?;
    let node = cluster.node().to_string();
    let mut undo = Undo(Vec::new(), None);
    let mut timeline = Timeline::default();

    // 1. Install with monitoring, as the README says for a cluster with the Prometheus operator.
    let t = Instant::now();
    let overlay = install(cluster, state)?;
    undo.1 = Some(overlay);
    route_to_pods(&mut undo)?;

    // 2. Prometheus from what the cluster now stores: the ServiceMonitors (rendered as the operator
    // does) and the PrometheusRule, reading the API server as its own ServiceAccount.
    let monitors = monitoring_objects(&admin, "ServiceMonitor").await?;
    let sd = Discovery {
        dir: cluster.scratch_dir("prometheus-sd"),
    };
    std::fs::create_dir_all(&sd.dir)?;
    let jobs = service_monitor_jobs(&monitors, &sd)?;
    let selections: BTreeSet<Option<Vec<String>>> =
        monitors.iter().map(monitor_namespaces).collect();
    let namespaces: BTreeSet<String> = selections.iter().flatten().flatten().cloned().collect();
    let token = prometheus_identity(
        cluster,
        &admin,
        &namespaces,
        selections.contains(&None),
        &sd.dir,
    )
    .await?;
    // Endpoints discovery as Prometheus's kubernetes_sd does it, under Prometheus's token (Debian's
    // Prometheus is built without it: prometheus::Discovery).
    let as_prometheus = cluster.cp.client_with_token(&token).await?;
    let discoveries: Vec<EndpointsDiscovery> = selections
        .iter()
        .map(|ns| {
            let file = sd.file(ns.as_deref());
            std::fs::write(&file, "[]")?;
            Ok(EndpointsDiscovery::start(
                as_prometheus.clone(),
                ns.clone(),
                file,
                Duration::from_secs(1),
            ))
        })
        .collect::<Result<_>>()?;
    // Least privilege, as Prometheus itself: it may not read what endpoints discovery does not need.
    match Api::<Secret>::namespaced(as_prometheus.clone(), NS)
        .list(&ListParams::default())
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 403 => {}
        other => bail!("Prometheus's ServiceAccount lists Secrets in {NS}: {other:?}"),
    }
    let rule = Api::<DynamicObject>::namespaced_with(
        admin.clone(),
        NS,
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "monitoring.coreos.com",
            "v1",
            "PrometheusRule",
        )),
    )
    .get("netwave")
    .await?;
    let rules = scale_for(&rule_file_from(&serde_json::to_string(&rule)?)?, FOR_SCALE)?;
    // The rules are loaded once every target is up: a Prometheus that has run all along would not
    // evaluate a cluster's first seconds either, and `for:` divided by 60 would fire on them.
    let prom = Arc::new(
        Prometheus::start_with(
            &cluster.scratch_dir("prometheus"),
            &json!({"groups": []}),
            &jobs,
            GLOBAL_SCRAPE,
            Duration::from_secs(1),
        )
        .await?,
    );
    let prom_started = unix_now();
    eprintln!(
        "prometheus {} with {} jobs from {} ServiceMonitors (intervals {:?})",
        prom.addr,
        jobs.len(),
        monitors.len(),
        jobs.iter()
            .map(|j| j["scrape_interval"].as_str().unwrap_or("global"))
            .collect::<Vec<_>>()
    );

    let configurators = until(cluster, "2 configurator pods Ready", T, || {
        let admin = admin.clone();
        async move {
            let r = ready_pods(&admin, "netwave-configurator").await?;
            Ok((r.len() == 2).then_some(r))
        }
    })
    .await?;
    until(cluster, "the agent pod Ready", T, || {
        let admin = admin.clone();
        async move { Ok((ready_pods(&admin, "netwave-agent").await?.len() == 1).then_some(())) }
    })
    .await?;
    eprintln!(
        "pods Ready {:.1} s after the install",
        t.elapsed().as_secs_f64()
    );

    // 3. Both jobs' targets: exactly the configurator pods' and the agent's metrics ports, all up.
    let mut want: BTreeSet<(String, String)> = BTreeSet::new();
    for p in &configurators {
        want.insert((
            "netwave-configurator".into(),
            format!("{}:9090", pod_ip(&admin, p).await?),
        ));
    }
    want.insert(("netwave-agent".into(), format!("{NODE_ADDR}:9091")));
    // The configurators' first (15 s interval), before the samples, so that their rollout's histograms
    // are seen going up; the rules once they are scraped (until then netwave_leader is absent).
    let t = Instant::now();
    targets_up(cluster, &prom, &want, Some("netwave-configurator")).await?;
    prom.reload_rules(&rules).await?;
    let alert_log = AlertLog::start(prom.clone());

    // 4. The samples.
    let before = newest_sequence(&admin).await?;
    kubectl(cluster, &["apply", "-f", "deploy/samples/"])?;
    // (`kubectl apply -f` creates the objects one by one: wait for the revision with all of them, the
    // default-VRF segment every node gets, vlan103-monitoring's bridge l2.103, in the kernel.)
    let good = provisioned_on_newest(cluster, &admin, &node, before, |k| {
        k.lines()
            .next()
            .is_some_and(|links| links.split_whitespace().any(|l| l == "l2.103"))
    })
    .await?;
    eprintln!(
        "samples: {good} Provisioned on {node} in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let up = targets_up(cluster, &prom, &want, None).await?;
    eprintln!(
        "targets up {:.1} s after the pods were Ready: {up:?}",
        t.elapsed().as_secs_f64()
    );
    let good_kernel = kernel_state()?;

    // 5. A bad revision: a routing table that blackholes the `kubernetes` Service's address for the
    // node's own traffic. The agent (host network, reaching the API server through that Service) loses
    // the API server after the apply: its probe fails, it restores the last good config and reports
    // Invalid; the revision fails and the node is sent back to the last good revision.
    // (The agent's API probe fails for the ~30 s of its health deadline: past NetwaveAgentProbeDown's
    // `for:` once divided by 60.)
    timeline.start(
        "the bad revision",
        &[
            "NetwaveRevisionFailed",
            "NetwaveAgentApplyFailures",
            "NetwaveAgentProbeDown",
        ],
    );
    bad_revision(cluster, &admin, &node, &good, &good_kernel).await?;
    // Both sides, before the next scenarios take the agent and the leader away.
    let fired = firing(
        cluster,
        &prom,
        &alert_log,
        &["NetwaveRevisionFailed", "NetwaveAgentApplyFailures"],
    )
    .await?;
    eprintln!(
        "NetwaveRevisionFailed and NetwaveAgentApplyFailures firing {:.1} s after the node was back",
        fired.as_secs_f64()
    );

    // 6. An agent release whose image the node does not have: the DaemonSet replaces the agent pod with
    // one that never starts (its endpoint stays, not ready), so the agent's metrics do not answer. Its
    // alert comes with the agent's next scrape, while the next scenario runs.
    timeline.start("the agent's image missing", &["NetwaveAgentDown"]);
    kubectl(
        cluster,
        &[
            "-n",
            NS,
            "set",
            "image",
            "daemonset/netwave-agent",
            "agent=ghcr.io/netwave/netwave-agent:v0.0.0-not-on-this-node",
        ],
    )?;

    // 7. The API server goes down while a change waits to be cut: the leader's write fails, nobody can
    // renew the Lease.
    let leader_pod = leader(&admin)
        .await?
        .context("a leader before the outage")?;
    let not_ready = api_server_outage(
        cluster,
        &admin,
        &leader_pod,
        &prom,
        &alert_log,
        &mut timeline,
    )
    .await?;

    // 8. No configurator at all.
    timeline.start("configurators scaled to 0", &["NetwaveConfiguratorDown"]);
    kubectl(
        cluster,
        &[
            "-n",
            NS,
            "scale",
            "deployment/netwave-configurator",
            "--replicas=0",
        ],
    )?;
    let fired = firing(
        cluster,
        &prom,
        &alert_log,
        &["NetwaveConfiguratorDown", "NetwaveAgentDown"],
    )
    .await?;
    eprintln!(
        "configurators scaled to 0: NetwaveConfiguratorDown firing after {:.1} s (and NetwaveAgentDown)",
        fired.as_secs_f64()
    );

    // 9. Every panel of the dashboard the install ships (the ConfigMap Grafana's sidecar loads) over the
    // whole run.
    let end = unix_now();
    let cm = Api::<ConfigMap>::namespaced(admin.clone(), NS)
        .get("netwave-grafana-dashboard")
        .await?;
    let text = cm
        .data
        .and_then(|d| d.get("netwave.json").cloned())
        .context("ConfigMap netwave-grafana-dashboard has no netwave.json")?;
    let dashboard: Value = serde_json::from_str(&text)?;
    let panels = grafana::panels(
        &dashboard,
        TimeRange {
            range: Duration::from_secs_f64(end - prom_started),
            scrape_interval: GLOBAL_SCRAPE,
        },
    )?;
    let mut empty = Vec::new();
    for p in &panels {
        let mut with_data = Vec::new();
        for q in &p.queries {
            let series = if q.instant {
                prom.query(&q.expr).await?
            } else {
                prom.query_range(&q.expr, prom_started, end, q.step).await?
            };
            let finite = series.iter().any(|s| {
                s["values"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .chain(std::iter::once(&s["value"]))
                    .filter_map(|v| v[1].as_str()?.parse::<f64>().ok())
                    .any(f64::is_finite)
            });
            // The write errors are there from the start with 0: the outage's must show, not only zeros.
            let needs_nonzero = q.expr.contains("netwave_api_errors_total");
            let nonzero = series.iter().any(|s| {
                s["values"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v[1].as_str()?.parse::<f64>().ok())
                    .any(|v| v.is_finite() && v > 0.0)
            });
            if finite && (nonzero || !needs_nonzero) {
                with_data.push(q.ref_id.clone());
            }
        }
        eprintln!(
            "  panel {:?} ({}): data from {:?} of {} queries",
            p.title,
            p.kind,
            with_data,
            p.queries.len()
        );
        if with_data.is_empty() {
            empty.push(format!(
                "{:?}: {:?}",
                p.title,
                p.queries.iter().map(|q| &q.expr).collect::<Vec<_>>()
            ));
        }
    }
    eprintln!(
        "dashboard: panels with data {}/{} (range {:.0} s, $__interval {:?})",
        panels.len() - empty.len(),
        panels.len(),
        end - prom_started,
        panels
            .first()
            .and_then(|p| p.queries.first())
            .map(|q| q.step)
    );

    // 10. When each alert fired: never before the scenario it is written for began, none that no
    // scenario here is written for, and each for the instance it is about; the probe the rollback
    // mended reads up again, so its alert resolved.
    let first = alert_log.first();
    drop(alert_log);
    let still_probe_down: Vec<Alert> = prom
        .alerts()
        .await?
        .into_iter()
        .filter(|a| a.name == "NetwaveAgentProbeDown")
        .collect();
    eprintln!("alerts (rules loaded with for: divided by {FOR_SCALE}):");
    let mut wrong = Vec::new();
    for (name, seen) in &first {
        let Some(at) = seen.firing else {
            eprintln!("  {name}: pending only");
            continue;
        };
        let (scenario, since) = timeline.at(at).unwrap_or(("no scenario", prom_started));
        eprintln!(
            "  {name}{}: firing {:.1} s after \"{scenario}\" began{}",
            seen.instance
                .as_ref()
                .map_or(String::new(), |i| format!(" ({i})")),
            at - since,
            seen.pending.map_or(String::new(), |p| format!(
                " (pending {:.1} s before)",
                at - p
            ))
        );
        match timeline
            .0
            .iter()
            .find(|(_, _, alerts)| alerts.contains(&name.as_str()))
        {
            None => wrong.push(format!(
                "{name} {{{}}} fired during \"{scenario}\", and no scenario here is written for it",
                seen.labels
            )),
            Some((w, began, _)) if at < *began => wrong.push(format!(
                "{name} fired before \"{w}\", the scenario it is written for"
            )),
            _ => {}
        }
    }
    let agent = format!("{NODE_ADDR}:9091");
    for name in ["NetwaveAgentApplyFailures", "NetwaveAgentDown"] {
        if let Some(i) = first.get(name).and_then(|s| s.instance.as_ref())
            && *i != agent
        {
            wrong.push(format!(
                "{name} fired for {i}, not the node's agent {agent}"
            ));
        }
    }
    let missing: Vec<&str> = timeline
        .0
        .iter()
        .flat_map(|(_, _, alerts)| alerts.iter().copied())
        .filter(|a| first.get(*a).is_none_or(|s| s.firing.is_none()))
        .collect();

    // 11. Nothing any netwave component did was refused, nor Prometheus's discovery. (While the API
    // server starts it is not ready, and refuses until its authorizers have synced: not a verdict.)
    let during_start =
        |t: Option<f64>| t.is_some_and(|t| not_ready.iter().any(|(a, b)| *a <= t && t <= *b));
    let pods = cluster.logged_pods(NS);
    let (excused, refused): (Vec<String>, Vec<String>) = refusals(cluster, &pods)
        .into_iter()
        .partition(|l| during_start(l.split_once(": ").and_then(|(_, line)| log_time(line))));
    if !excused.is_empty() {
        eprintln!(
            "{} refusal(s) while the API server was starting, not counted:\n{}",
            excused.len(),
            excused.join("\n")
        );
    }
    ensure!(
        refused.is_empty(),
        "netwave's components were refused:\n{}",
        refused.join("\n")
    );
    // The API server's own record of netwave's service accounts and Prometheus's (less the one refusal
    // this test asked for: Prometheus listing Secrets), and what discovery was told.
    let audit: Vec<(f64, String)> = cluster
        .refused_at(NS)
        .into_iter()
        .chain(
            cluster
                .refused_at("monitoring")
                .into_iter()
                .filter(|(_, l)| !l.contains(" list secrets/")),
        )
        .collect();
    let (audit_excused, audit_refused): (Vec<_>, Vec<_>) =
        audit.into_iter().partition(|(t, _)| during_start(Some(*t)));
    if !audit_excused.is_empty() {
        eprintln!(
            "audit log: {} refusal(s) while the API server was starting, not counted",
            audit_excused.len()
        );
    }
    let audit_refused: Vec<String> = audit_refused
        .into_iter()
        .map(|(_, l): (f64, String)| l)
        .collect();
    ensure!(
        audit_refused.is_empty(),
        "the audit log shows refused requests of netwave's or Prometheus's service accounts:\n{}",
        audit_refused.join("\n")
    );
    let (sd_excused, sd_refused): (Vec<_>, Vec<_>) = discoveries
        .iter()
        .flat_map(|d| d.refusals())
        .partition(|(t, _)| during_start(Some(*t)));
    if !sd_excused.is_empty() {
        eprintln!(
            "endpoints discovery: {} refusal(s) while the API server was starting, not counted",
            sd_excused.len()
        );
    }
    let sd_refused: Vec<String> = sd_refused
        .into_iter()
        .map(|(_, l): (f64, String)| l)
        .collect();
    ensure!(
        sd_refused.is_empty(),
        "endpoints discovery as Prometheus was refused:\n{}",
        sd_refused.join("\n")
    );
    ensure!(
        empty.is_empty(),
        "panels without data:\n{}",
        empty.join("\n")
    );
    ensure!(
        missing.is_empty(),
        "alerts that never fired in their scenario: {missing:?}"
    );
    ensure!(
        wrong.is_empty(),
        "alerts out of their scenario:\n{}",
        wrong.join("\n")
    );
    ensure!(
        still_probe_down.is_empty(),
        "the rollback mended the API probe, yet NetwaveAgentProbeDown is still active: {}",
        summary(&still_probe_down)
    );
    eprintln!("logs of {} netwave pods: no refusal", pods.len());
    drop(discoveries);
    drop(prom);
    drop(undo);
    Ok(())
}

/// Waits until Prometheus's targets (of `job`, or all) are exactly `want`'s and all up.
async fn targets_up(
    cluster: &Cluster,
    prom: &Prometheus,
    want: &BTreeSet<(String, String)>,
    job: Option<&str>,
) -> Result<Vec<(String, String, String)>> {
    let of_job = |j: &str| job.is_none_or(|job| job == j);
    let want: BTreeSet<&(String, String)> = want.iter().filter(|(j, _)| of_job(j)).collect();
    until(
        cluster,
        &format!("targets {want:?} up in Prometheus"),
        T,
        || {
            let want = &want;
            async move {
                let targets: Vec<(String, String, String)> = prom
                    .targets()
                    .await?
                    .into_iter()
                    .filter(|(j, _, _)| of_job(j))
                    .collect();
                let seen: BTreeSet<(String, String)> = targets
                    .iter()
                    .map(|(j, i, _)| (j.clone(), i.clone()))
                    .collect();
                let all_up = targets.iter().all(|(_, _, h)| h == "up");
                let same = seen.len() == want.len() && want.iter().all(|w| seen.contains(*w));
                Ok((same && all_up).then_some(targets))
            }
        },
    )
    .await
}

/// The highest revision sequence so far (0 before the first).
async fn newest_sequence(admin: &Client) -> Result<u64> {
    Ok(Api::<NetworkConfigRevision>::all(admin.clone())
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|r| r.spec.sequence)
        .max()
        .unwrap_or(0))
}

/// Waits until the node runs the newest revision that did not fail, one cut after sequence `after`
/// (Provisioned on it, `check` true of the node's kernel); returns its name.
async fn provisioned_on_newest(
    cluster: &Cluster,
    admin: &Client,
    node: &str,
    after: u64,
    check: impl Fn(&str) -> bool,
) -> Result<String> {
    let nnc: Api<NodeNetworkConfig> = Api::all(admin.clone());
    let revisions: Api<NetworkConfigRevision> = Api::all(admin.clone());
    until(
        cluster,
        "the node Provisioned on the newest revision",
        T,
        || {
            let (nnc, revisions, check) = (nnc.clone(), revisions.clone(), &check);
            async move {
                let Some(n) = nnc.get_opt(node).await? else {
                    return Ok(None);
                };
                let newest = revisions
                    .list(&ListParams::default())
                    .await?
                    .items
                    .into_iter()
                    .filter(|r| {
                        r.status.as_ref().and_then(|s| s.phase.as_deref())
                            != Some(RevisionPhase::Failed.as_str())
                    })
                    .max_by_key(|r| r.spec.sequence);
                let Some(newest) = newest.filter(|r| r.spec.sequence > after) else {
                    return Ok(None);
                };
                let st = n.status.clone().unwrap_or_default();
                let on_it = n.spec.revision == newest.name_any()
                    && st.observed_revision.as_deref() == Some(newest.name_any().as_str())
                    && st.phase.as_deref() == Some(NodePhase::Provisioned.as_str())
                    && check(&kernel_state()?);
                Ok(on_it.then_some(newest.name_any()))
            }
        },
    )
    .await
}

async fn bad_revision(
    cluster: &Cluster,
    admin: &Client,
    node: &str,
    good: &str,
    good_kernel: &str,
) -> Result<()> {
    let api_ip = Api::<Service>::namespaced(admin.clone(), "default")
        .get("kubernetes")
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .context("the kubernetes Service has a cluster IP")?;
    let bad = json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "RoutingTable",
        "metadata": {"name": BAD_TABLE},
        "spec": {
            "tableId": 300,
            "routes": [{"prefix": format!("{api_ip}/32"), "type": "blackhole"}],
            "rules": [{"to": format!("{api_ip}/32"), "priority": 300}],
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
        }
    });
    let file = cluster.scratch_dir("bad-routing-table.json");
    std::fs::write(&file, serde_json::to_vec(&bad)?)?;
    let before = newest_sequence(admin).await?;
    let t = Instant::now();
    let applied_at = unix_now();
    kubectl(cluster, &["apply", "-f", &file.display().to_string()])?;

    // Watch the node: the bad rule in its kernel and gone again, the revision Failed (the agent's
    // Invalid report is short-lived: the configurator moves the node back at once, so its time is the
    // one the revision records), the node Provisioned on the last good revision again.
    let nnc: Api<NodeNetworkConfig> = Api::all(admin.clone());
    let revisions: Api<NetworkConfigRevision> = Api::all(admin.clone());
    let marker = format!("to {api_ip} lookup 300");
    let mut seen: BTreeMap<&str, Duration> = BTreeMap::new();
    let mut bad_rev: Option<NetworkConfigRevision> = None;
    let deadline = Instant::now() + T;
    loop {
        let rules = sh(&["ip", "-n", NETNS, "rule"])?;
        if rules.contains(&marker) {
            seen.entry("bad rule in the kernel").or_insert(t.elapsed());
        } else if seen.contains_key("bad rule in the kernel") {
            seen.entry("bad rule gone").or_insert(t.elapsed());
        }
        let newest = revisions
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|r| r.spec.sequence > before)
            .max_by_key(|r| r.spec.sequence);
        if let Some(r) = newest
            && r.status.as_ref().and_then(|s| s.phase.as_deref())
                == Some(RevisionPhase::Failed.as_str())
        {
            seen.entry("revision Failed").or_insert(t.elapsed());
            bad_rev = Some(r);
        }
        if let Ok(n) = nnc.get(node).await {
            let st = n.status.clone().unwrap_or_default();
            if bad_rev.is_some()
                && n.spec.revision == good
                && st.observed_revision.as_deref() == Some(good)
                && st.phase.as_deref() == Some(NodePhase::Provisioned.as_str())
            {
                seen.entry("back on the last good revision")
                    .or_insert(t.elapsed());
            }
        }
        if seen.contains_key("back on the last good revision") && seen.contains_key("bad rule gone")
        {
            break;
        }
        if Instant::now() > deadline {
            let status = nnc
                .get(node)
                .await
                .ok()
                .map(|n| (n.spec.revision, n.status));
            bail!(
                "the bad revision was not rolled back within {T:?}: seen {seen:?}; the node's config: {status:?}\n{}",
                netwave_e2e::install::pods_summary(cluster).await
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let failed = bad_rev.context("the bad revision")?;
    let bad_name = failed.name_any();
    let st = failed.status.clone().unwrap_or_default();
    ensure!(
        st.failed == 1 && st.failed_nodes.len() == 1 && st.failed_nodes[0].node == node,
        "the rollout halted at its first failure, on {node}: {st:?}"
    );
    let failure = &st.failed_nodes[0];
    ensure!(
        failure.reason == NodeReason::HealthCheckFailed.as_str(),
        "the node failed its health check: {failure:?}"
    );
    if let Some(at) = &failure.at {
        let at = at.0.as_millisecond() as f64 / 1000.0;
        seen.insert(
            "Invalid reported",
            Duration::from_secs_f64((at - applied_at).max(0.0)),
        );
    }
    let kernel = kernel_state()?;
    ensure!(
        kernel == good_kernel,
        "the node's kernel is the last good revision's again:\n--- last good\n{good_kernel}\n--- now\n{kernel}"
    );
    // While cut off, the agent's watch of its NodeNetworkConfig fails and backs off (kube-runtime's
    // default: up to 30 s), which is when it next sees its config.
    let watch_errors: usize = cluster
        .logged_pods(NS)
        .iter()
        .filter(|p| p.starts_with("netwave-agent-"))
        .map(|p| {
            cluster
                .container_log(NS, p, "agent")
                .lines()
                .filter(|l| l.contains("watch error"))
                .count()
        })
        .sum();
    let mut steps: Vec<(&&str, &Duration)> = seen.iter().collect();
    steps.sort_by_key(|(_, d)| **d);
    eprintln!(
        "bad revision {bad_name} rolled back on {node} in {:.1} s ({}; the agent's watch failed {watch_errors} times while cut off); {}: {}",
        seen["back on the last good revision"].as_secs_f64(),
        steps
            .iter()
            .map(|(k, d)| format!("{k} +{:.1} s", d.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", "),
        failure.reason,
        failure.message
    );
    Ok(())
}

/// The leader's /metrics, read directly (its pod IP through the host's route).
async fn leader_metrics(admin: &Client, pod: &str) -> Result<String> {
    let addr: SocketAddr = format!("{}:9090", pod_ip(admin, pod).await?).parse()?;
    scrape(addr).await
}

/// The control plane goes down while a change waits to be cut (an upgrade of kube-apiserver, say): the
/// leader's write fails and nobody can renew the Lease; back up, the change rolls out. Returns when the
/// API server was not ready (unix seconds, from its stop until it reported ready again).
async fn api_server_outage(
    cluster: &mut Cluster,
    admin: &Client,
    leader_pod: &str,
    prom: &Prometheus,
    log: &AlertLog,
    timeline: &mut Timeline,
) -> Result<Vec<(f64, f64)>> {
    let node = cluster.node().to_string();
    // The fail-forward change first: the admin fixes the routing table (it now blackholes a
    // documentation address, not the Service). The leader sees new inputs and waits for them to settle
    // (--input-settle) before it cuts a revision; the API server stops inside that wait.
    let fixed = json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "RoutingTable",
        "metadata": {"name": BAD_TABLE},
        "spec": {
            "tableId": 300,
            "routes": [{"prefix": "192.0.2.7/32", "type": "blackhole"}],
            "rules": [{"to": "192.0.2.7/32", "priority": 300}],
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
        }
    });
    let file = cluster.scratch_dir("fixed-routing-table.json");
    std::fs::write(&file, serde_json::to_vec(&fixed)?)?;
    let failed_seq = newest_sequence(admin).await?;
    let errors_before = metric_sum(
        &leader_metrics(admin, leader_pod).await?,
        "netwave_api_errors_total",
    )
    .unwrap_or(0.0);
    let leader_addr: SocketAddr = format!("{}:9090", pod_ip(admin, leader_pod).await?).parse()?;
    kubectl(cluster, &["apply", "-f", &file.display().to_string()])?;
    until(cluster, "the leader sees the change settle", T, || async {
        let m = scrape(leader_addr).await?;
        Ok((metric_sum(&m, "netwave_inputs_pending") == Some(1.0)).then_some(()))
    })
    .await?;
    let start = timeline.start("the API server stopped", &["NetwaveNoLeader"]);
    let t = Instant::now();
    tokio::task::block_in_place(|| cluster.cp.stop_apiserver());
    let stopped = t.elapsed();
    // The leader's first request to fail is the quorum read that confirms the cut (or a write).
    let errors = until(cluster, "the leader's requests failing", T, || async {
        let m = scrape(leader_addr).await?;
        Ok(metric_sum(&m, "netwave_api_errors_total").filter(|e| *e > errors_before))
    })
    .await?;
    eprintln!(
        "API server stopped ({:.1} s) while the change settled: the leader's request failed {:.1} s later (netwave_api_errors_total {errors})",
        stopped.as_secs_f64(),
        t.elapsed().as_secs_f64()
    );
    firing(cluster, prom, log, &["NetwaveNoLeader"]).await?;
    eprintln!(
        "NetwaveNoLeader firing {:.1} s after the API server stopped",
        t.elapsed().as_secs_f64()
    );
    // Back up: a leader again, and the write that failed is retried: the change is cut.
    cluster.cp.restart_apiserver().await?;
    let ready = unix_now();
    let t = Instant::now();
    let (holder, cut) = until(cluster, "a leader and the change cut", T, || async {
        let holder = leader(admin).await?;
        let seq = newest_sequence(admin).await?;
        Ok(holder.filter(|_| seq > failed_seq).map(|h| (h, seq)))
    })
    .await?;
    eprintln!(
        "API server back: {holder} leads, revision {cut} (the fixed routing table on {node}) cut {:.1} s later",
        t.elapsed().as_secs_f64()
    );
    Ok(vec![(start, ready)])
}
