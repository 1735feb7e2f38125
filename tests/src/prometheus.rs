//! The alert rules of `deploy/monitoring` as Prometheus runs them, and a real Prometheus for the tests.
//!
//! ```text
//!   deploy/monitoring/prometheusrule.yaml ──rule_file()──► {"groups": spec.groups}  (a plain rule file;
//!        (PrometheusRule, the one copy)                    JSON is YAML to promtool and Prometheus)
//!
//!   Prometheus::start ──► /usr/bin/prometheus on 127.0.0.1:<free port>, its own temp dir, 1 s scrape and
//!                          evaluation; jobs netwave-configurator and netwave-agent (the names the
//!                          ServiceMonitors give them) ──► alerts(): GET /api/v1/alerts
//!
//!   ServiceMonitors (as installed) ──service_monitor_jobs()──► the scrape jobs prometheus-operator
//!                                        renders for them (endpoints of the monitor's namespaces, keep by
//!                                        the Services' labels and the port name, job from jobLabel), their
//!                                        targets from kubernetes_sd's endpoints discovery (a file: see
//!                                        Discovery) ──► Prometheus::start_with (a real cluster,
//!                                        tests/tests/real_node_monitoring.rs)
//! ```
//!
//! Both binaries come from Debian's `prometheus` package; a missing one is an error that says so, never a
//! skip. Dropping a [`Prometheus`] stops it by its pid and removes its directory.

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use netwave_control_plane::poll::until;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::fleet::workspace_root;

/// The PrometheusRule that `deploy/` ships.
pub fn prometheus_rule_path() -> PathBuf {
    workspace_root().join("deploy/monitoring/prometheusrule.yaml")
}

/// The `promtool test rules` cases of that PrometheusRule.
pub fn rule_tests_path() -> PathBuf {
    workspace_root().join("deploy/monitoring/tests/alerts.test.yaml")
}

/// How to get the binaries.
pub const INSTALL: &str = "install Debian's prometheus package \
     (apt-get install -y --no-install-recommends prometheus; .ci/run does)";

/// `name` (`prometheus` or `promtool`) on the PATH or in /usr/bin, or an error saying how to install it.
pub fn binary(name: &str) -> Result<PathBuf> {
    let dirs = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    dirs.into_iter()
        .chain([PathBuf::from("/usr/bin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .with_context(|| format!("{name} not found on PATH or in /usr/bin: {INSTALL}"))
}

/// The rule groups of the PrometheusRule in `path`, as a Prometheus rule file (`{"groups": [...]}`).
/// Refuses anything but one PrometheusRule with at least one group, naming the file.
pub fn rule_file(path: &Path) -> Result<Value> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    rule_file_from(&text).with_context(|| format!("{}", path.display()))
}

/// [`rule_file`] of a YAML text.
pub fn rule_file_from(yaml: &str) -> Result<Value> {
    let doc: Value = serde_saphyr::from_str(yaml).context("not a YAML document")?;
    let kind = doc["kind"].as_str().unwrap_or_default();
    let api = doc["apiVersion"].as_str().unwrap_or_default();
    if kind != "PrometheusRule" || !api.starts_with("monitoring.coreos.com/") {
        bail!(
            "expected a monitoring.coreos.com PrometheusRule, found kind {kind:?} apiVersion {api:?}"
        );
    }
    let groups = match &doc["spec"]["groups"] {
        Value::Array(g) if !g.is_empty() => g.clone(),
        _ => bail!("spec.groups is missing or empty"),
    };
    for (i, g) in groups.iter().enumerate() {
        if !g["name"].is_string() || !g["rules"].is_array() {
            bail!("spec.groups[{i}] needs a name and a list of rules");
        }
    }
    Ok(json!({ "groups": groups }))
}

/// Names of the alerting rules in a rule file, in file order.
pub fn alert_names(rules: &Value) -> Vec<String> {
    rules["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect()
}

/// What a Prometheus scrapes.
#[derive(Clone, Debug, Default)]
pub struct Targets {
    /// Job `netwave-configurator`.
    pub configurators: Vec<SocketAddr>,
    /// Job `netwave-agent`.
    pub agents: Vec<SocketAddr>,
}

/// One entry of `/api/v1/alerts`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Alert {
    pub name: String,
    /// `pending` or `firing`.
    pub state: String,
    /// The alert's labels (alertname included).
    pub labels: std::collections::BTreeMap<String, String>,
}

/// A Prometheus server this process started.
pub struct Prometheus {
    pub addr: SocketAddr,
    pub dir: PathBuf,
    pub log: PathBuf,
    child: Child,
}

impl Prometheus {
    /// Starts Prometheus on 127.0.0.1 with its data in `dir` (created; removed on drop), evaluating
    /// `rules` (a rule file, see [`rule_file`]) and scraping `targets` every `interval`; returns once it
    /// reports ready.
    pub async fn start(
        dir: &Path,
        rules: &Value,
        targets: &Targets,
        interval: Duration,
    ) -> Result<Prometheus> {
        let secs = format!("{}s", interval.as_secs().max(1));
        let job = |name: &str, addrs: &[SocketAddr]| {
            json!({
                "job_name": name,
                "scrape_interval": secs,
                "scrape_timeout": secs,
                "static_configs": [{"targets": addrs.iter().map(ToString::to_string).collect::<Vec<_>>()}],
            })
        };
        let jobs = [
            job("netwave-configurator", &targets.configurators),
            job("netwave-agent", &targets.agents),
        ];
        Prometheus::start_with(dir, rules, &jobs, interval, interval).await
    }

    /// Starts Prometheus on 127.0.0.1 with its data in `dir` (created; removed on drop), evaluating
    /// `rules` every `evaluation` and running `scrape_configs` as given (jobs without an interval of
    /// their own are scraped every `scrape`); returns once it reports ready. Files a job names by a
    /// relative path (a token, a CA) are read from `dir`.
    pub async fn start_with(
        dir: &Path,
        rules: &Value,
        scrape_configs: &[Value],
        scrape: Duration,
        evaluation: Duration,
    ) -> Result<Prometheus> {
        let bin = binary("prometheus")?;
        let _ = fs::remove_dir_all(dir);
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        fs::write(dir.join("rules.json"), serde_json::to_vec_pretty(rules)?)?;
        let config = json!({
            "global": {
                "scrape_interval": duration_text(scrape),
                "evaluation_interval": duration_text(evaluation),
            },
            "rule_files": ["rules.json"],
            "scrape_configs": scrape_configs,
        });
        fs::write(
            dir.join("prometheus.yml"),
            serde_json::to_vec_pretty(&config)?,
        )?;
        let addr: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let log = dir.join("prometheus.log");
        let out = fs::File::create(&log)?;
        let child = Command::new(&bin)
            .current_dir(dir)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone()?))
            .stderr(Stdio::from(out))
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut p = Prometheus {
            addr,
            dir: dir.to_path_buf(),
            log,
            child,
        };
        let ready = until("prometheus ready", Duration::from_secs(30), async || {
            if let Ok(Some(status)) = p.child.try_wait() {
                bail!("prometheus exited ({status}) before it was ready");
            }
            Ok(match p.get("/-/ready").await {
                Ok((200, _)) => Ok(()),
                r => Err(format!("{r:?}")),
            })
        })
        .await;
        match ready {
            Ok(()) => Ok(p),
            Err(e) => bail!("{e:#}:\n{}", p.log_tail(20)),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Replaces the rule file with `rules` and reloads (SIGHUP, by pid); returns once the rules API
    /// lists exactly the new groups.
    /// Waits until Prometheus has evaluated every rule group `n` more times: an alert that has not
    /// fired by then did not fire on what it has scraped.
    pub async fn evaluations_pass(&self, n: u32) -> Result<()> {
        let last_evaluations = async || -> Result<Vec<String>> {
            let data = self.api("/api/v1/rules").await?;
            Ok(data["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|g| g["lastEvaluation"].to_string())
                .collect())
        };
        for _ in 0..n {
            let before = last_evaluations().await?;
            until("a rule evaluation", Duration::from_secs(60), async || {
                let now = last_evaluations().await?;
                let done =
                    now.len() == before.len() && now.iter().zip(&before).all(|(a, b)| a != b);
                Ok(done.then_some(()).ok_or(format!("{now:?}")))
            })
            .await?;
        }
        Ok(())
    }

    pub async fn reload_rules(&self, rules: &Value) -> Result<()> {
        fs::write(
            self.dir.join("rules.json"),
            serde_json::to_vec_pretty(rules)?,
        )?;
        let want: std::collections::BTreeSet<&str> = rules["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| g["name"].as_str())
            .collect();
        let status = Command::new("kill")
            .args(["-HUP", &self.pid().to_string()])
            .status()?;
        ensure!(status.success(), "kill -HUP {}: {status}", self.pid());
        let loaded = until(
            "prometheus to load the rule groups",
            Duration::from_secs(30),
            async || {
                let data = self.api("/api/v1/rules").await?;
                let loaded: std::collections::BTreeSet<String> = data["groups"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|g| g["name"].as_str().map(str::to_string))
                    .collect();
                let have: std::collections::BTreeSet<&str> =
                    loaded.iter().map(String::as_str).collect();
                Ok(if have == want {
                    Ok(())
                } else {
                    Err(format!("want {want:?}, it has {loaded:?}"))
                })
            },
        )
        .await;
        loaded.map_err(|e| anyhow::anyhow!("{e:#}:\n{}", self.log_tail(10)))
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// `GET path` (path and query, already encoded): (status code, body).
    pub async fn get(&self, path: &str) -> Result<(u16, String)> {
        let mut s = tokio::net::TcpStream::connect(self.addr).await?;
        // HTTP/1.0: the body ends when the server closes the connection (no chunking to decode).
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr).as_bytes())
            .await?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await?;
        let text = String::from_utf8_lossy(&raw);
        let (head, body) = text
            .split_once("\r\n\r\n")
            .with_context(|| format!("GET {path}: no HTTP response: {text:?}"))?;
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .with_context(|| format!("GET {path}: bad status line in {head:?}"))?;
        Ok((code, body.to_string()))
    }

    /// `GET path` of the HTTP API: its `data`, or an error with Prometheus's own.
    pub async fn api(&self, path: &str) -> Result<Value> {
        let (code, body) = self.get(path).await?;
        let v: Value = serde_json::from_str(&body)
            .with_context(|| format!("GET {path}: HTTP {code}, not JSON: {body}"))?;
        if code != 200 || v["status"] != "success" {
            bail!("GET {path}: HTTP {code}: {}", v["error"]);
        }
        Ok(v["data"].clone())
    }

    /// Active alerts (pending and firing).
    pub async fn alerts(&self) -> Result<Vec<Alert>> {
        let data = self.api("/api/v1/alerts").await?;
        Ok(data["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| {
                let labels: std::collections::BTreeMap<String, String> = a["labels"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                    .collect();
                Alert {
                    name: labels.get("alertname").cloned().unwrap_or_default(),
                    state: a["state"].as_str().unwrap_or_default().to_string(),
                    labels,
                }
            })
            .collect())
    }

    /// Scrape targets as (job, address, health) (`up`, `down` or `unknown` before the first scrape).
    pub async fn targets(&self) -> Result<Vec<(String, String, String)>> {
        let data = self.api("/api/v1/targets?state=active").await?;
        Ok(data["activeTargets"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
                (
                    s(&t["labels"]["job"]),
                    s(&t["labels"]["instance"]),
                    s(&t["health"]),
                )
            })
            .collect())
    }

    /// An instant query's result vector.
    pub async fn query(&self, promql: &str) -> Result<Vec<Value>> {
        let data = self
            .api(&format!("/api/v1/query?query={}", encode(promql)))
            .await?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// A range query's result matrix (one entry per series, `values` as [unix seconds, "value"]) from
    /// `start` to `end` (unix seconds) every `step`.
    pub async fn query_range(
        &self,
        promql: &str,
        start: f64,
        end: f64,
        step: Duration,
    ) -> Result<Vec<Value>> {
        let data = self
            .api(&format!(
                "/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step={}",
                encode(promql),
                step.as_secs_f64()
            ))
            .await
            .with_context(|| format!("query_range {promql}"))?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// SIGTERM by pid, then SIGKILL (also by pid, through the child handle) if it is still running
    /// after 5 s; reaps it.
    pub fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("kill")
                .args(["-TERM", &self.pid().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.stop();
        if std::env::var_os("NETWAVE_E2E_KEEP_LOGS").is_none() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// A Prometheus duration (`1h30m`, `15s`, `500ms`) as a [`Duration`].
pub fn parse_duration(text: &str) -> Result<Duration> {
    let mut total = Duration::ZERO;
    let mut rest = text;
    if rest.is_empty() {
        bail!("empty duration");
    }
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let n: u64 = rest[..digits]
            .parse()
            .with_context(|| format!("duration {text:?}: a number expected at {rest:?}"))?;
        rest = &rest[digits..];
        let unit_len = rest.len()
            - rest
                .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                .len();
        let ms = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "w" => 7 * 86_400_000,
            "y" => 365 * 86_400_000,
            u => bail!("duration {text:?}: unknown unit {u:?}"),
        };
        rest = &rest[unit_len..];
        total += Duration::from_millis(n * ms);
    }
    Ok(total)
}

/// A [`Duration`] as Prometheus writes one: whole seconds as `15s`, anything finer in milliseconds.
pub fn duration_text(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// `rules` with every alert's `for:` divided by `by` (`for: 5m` becomes `5s` for 60), nothing else
/// changed: what an alert matches and when it resolves stay the shipped rule's; a test that cannot wait
/// minutes for an alert still sees it fire after the same number of evaluations as a real cluster would
/// (the `for:` timings themselves are promtool's cases).
pub fn scale_for(rules: &Value, by: u32) -> Result<Value> {
    let mut out = rules.clone();
    for g in out["groups"].as_array_mut().into_iter().flatten() {
        for r in g["rules"].as_array_mut().into_iter().flatten() {
            if let Some(f) = r["for"].as_str() {
                let d = parse_duration(f).with_context(|| format!("rule {}", r["alert"]))?;
                r["for"] = Value::String(duration_text(d / by));
            }
        }
    }
    Ok(out)
}

/// Where the jobs [`service_monitor_jobs`] renders get their targets. The operator writes
/// `kubernetes_sd_configs: [{role: endpoints, namespaces: {names: [...]}}]`; Debian's Prometheus is built
/// without Kubernetes discovery (its client-go is not packaged), so the same discovery runs beside it
/// ([`crate::kubernetes_sd`], under Prometheus's ServiceAccount) and hands it the targets, with the
/// same `__meta_kubernetes_*` labels, as a file per set of namespaces in `dir` (`file_sd_configs`).
/// The rendered relabelings then run in Prometheus unchanged.
#[derive(Clone, Debug)]
pub struct Discovery {
    pub dir: PathBuf,
}

impl Discovery {
    /// The file the targets of `namespaces` (`None`: every namespace) are written to.
    pub fn file(&self, namespaces: Option<&[String]>) -> PathBuf {
        match namespaces {
            None => self.dir.join("all-namespaces.json"),
            Some(ns) => self.dir.join(format!("{}.json", ns.join(","))),
        }
    }
}

/// The namespaces a ServiceMonitor discovers in (`None`: all), as the operator reads
/// `spec.namespaceSelector`: its own namespace unless `any: true` or `matchNames` says otherwise.
pub fn monitor_namespaces(m: &Value) -> Option<Vec<String>> {
    let own = m["metadata"]["namespace"].as_str().unwrap_or_default();
    match &m["spec"]["namespaceSelector"] {
        Value::Null => Some(vec![own.to_string()]),
        sel if sel["any"] == true => None,
        sel => Some(
            sel["matchNames"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| n.as_str().map(String::from))
                .collect(),
        ),
    }
}

/// The scrape jobs prometheus-operator renders for `monitors` (ServiceMonitor objects as stored), their
/// targets discovered as [`Discovery`] says: per endpoint of a monitor, a job
/// `serviceMonitor/<namespace>/<name>/<index>` over the endpoints of the monitor's namespaces that keeps
/// those of Services its selector matches and of the named port, names the job after the Service's
/// `jobLabel` label (else the Service), labels targets with namespace, service, pod, container, node and
/// endpoint, then applies the endpoint's own relabelings. What the operator would render and this does
/// not know is an error naming the field, never a silently different scrape.
pub fn service_monitor_jobs(monitors: &[Value], sd: &Discovery) -> Result<Vec<Value>> {
    let mut jobs = Vec::new();
    for m in monitors {
        let ns = m["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = m["metadata"]["name"].as_str().unwrap_or_default();
        let jobs_of =
            monitor_jobs(m, ns, name, sd).with_context(|| format!("ServiceMonitor {ns}/{name}"))?;
        jobs.extend(jobs_of);
    }
    Ok(jobs)
}

/// `__meta_kubernetes_service_label_<name>`'s suffix for a label name (Prometheus's sanitising).
fn sanitize(label: &str) -> String {
    label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Fails on any key of `obj` not in `known` (the ones this renderer handles).
fn only_known(obj: &Value, what: &str, known: &[&str]) -> Result<()> {
    for k in obj.as_object().into_iter().flatten().map(|(k, _)| k) {
        if !known.contains(&k.as_str()) {
            bail!(
                "{what}.{k} is not rendered by this test's ServiceMonitor renderer: teach it to service_monitor_jobs"
            );
        }
    }
    Ok(())
}

fn monitor_jobs(m: &Value, ns: &str, name: &str, sd: &Discovery) -> Result<Vec<Value>> {
    let spec = &m["spec"];
    only_known(
        spec,
        "spec",
        &[
            "jobLabel",
            "selector",
            "namespaceSelector",
            "endpoints",
            "targetLabels",
            "podTargetLabels",
        ],
    )?;
    only_known(
        &spec["selector"],
        "spec.selector",
        &["matchLabels", "matchExpressions"],
    )?;
    only_known(
        &spec["namespaceSelector"],
        "spec.namespaceSelector",
        &["any", "matchNames"],
    )?;
    let sd_config = json!({"files": [sd.file(monitor_namespaces(m).as_deref())]});
    // Services the selector matches (by their labels, as the operator renders it).
    let mut select = Vec::new();
    let mut keys: Vec<(&String, &Value)> = spec["selector"]["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .collect();
    keys.sort_by_key(|(k, _)| *k);
    for (k, v) in keys {
        let k = sanitize(k);
        select.push(json!({
            "action": "keep",
            "source_labels": [format!("__meta_kubernetes_service_label_{k}"), format!("__meta_kubernetes_service_labelpresent_{k}")],
            "regex": format!("({});true", v.as_str().unwrap_or_default()),
        }));
    }
    for e in spec["selector"]["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let k = sanitize(e["key"].as_str().unwrap_or_default());
        let values: Vec<&str> = e["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let label = format!("__meta_kubernetes_service_label_{k}");
        let present = format!("__meta_kubernetes_service_labelpresent_{k}");
        select.push(match e["operator"].as_str().unwrap_or_default() {
            "In" => json!({"action": "keep", "source_labels": [label, present], "regex": format!("({});true", values.join("|"))}),
            "NotIn" => json!({"action": "drop", "source_labels": [label, present], "regex": format!("({});true", values.join("|"))}),
            "Exists" => json!({"action": "keep", "source_labels": [present], "regex": "true"}),
            "DoesNotExist" => json!({"action": "drop", "source_labels": [present], "regex": "true"}),
            op => bail!("spec.selector.matchExpressions: unknown operator {op:?}"),
        });
    }
    let endpoints = spec["endpoints"]
        .as_array()
        .filter(|e| !e.is_empty())
        .context("spec.endpoints is missing or empty")?;
    let mut jobs = Vec::new();
    for (i, ep) in endpoints.iter().enumerate() {
        let what = format!("spec.endpoints[{i}]");
        only_known(
            ep,
            &what,
            &[
                "port",
                "interval",
                "scrapeTimeout",
                "path",
                "scheme",
                "honorLabels",
                "relabelings",
                "metricRelabelings",
            ],
        )?;
        let port = ep["port"].as_str().with_context(|| {
            format!("{what}.port: a named port is needed (targetPort is not rendered here)")
        })?;
        let mut relabel =
            vec![json!({"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"})];
        relabel.extend(select.iter().cloned());
        relabel.push(json!({"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": port}));
        for (kind, label) in [("Node", "node"), ("Pod", "pod")] {
            relabel.push(json!({
                "source_labels": ["__meta_kubernetes_endpoint_address_target_kind", "__meta_kubernetes_endpoint_address_target_name"],
                "separator": ";", "regex": format!("{kind};(.*)"), "replacement": "${1}", "target_label": label,
            }));
        }
        for (meta, label) in [
            ("namespace", "namespace"),
            ("service_name", "service"),
            ("pod_name", "pod"),
            ("pod_container_name", "container"),
        ] {
            relabel.push(json!({"source_labels": [format!("__meta_kubernetes_{meta}")], "target_label": label}));
        }
        relabel.push(json!({"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"}));
        for (field, meta) in [("targetLabels", "service"), ("podTargetLabels", "pod")] {
            for l in spec[field]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                relabel.push(json!({
                    "source_labels": [format!("__meta_kubernetes_{meta}_label_{}", sanitize(l))],
                    "target_label": sanitize(l), "regex": "(.+)", "replacement": "${1}",
                }));
            }
        }
        relabel.push(json!({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"}));
        if let Some(job_label) = spec["jobLabel"].as_str() {
            relabel.push(json!({
                "source_labels": [format!("__meta_kubernetes_service_label_{}", sanitize(job_label))],
                "target_label": "job", "regex": "(.+)", "replacement": "${1}",
            }));
        }
        relabel.push(json!({"target_label": "endpoint", "replacement": port}));
        for (j, r) in ep["relabelings"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            relabel.push(relabel_config(r).with_context(|| format!("{what}.relabelings[{j}]"))?);
        }
        let mut job = json!({
            "job_name": format!("serviceMonitor/{ns}/{name}/{i}"),
            "honor_labels": ep["honorLabels"].as_bool().unwrap_or(false),
            "file_sd_configs": [sd_config.clone()],
            "relabel_configs": relabel,
        });
        for (field, key) in [
            ("interval", "scrape_interval"),
            ("scrapeTimeout", "scrape_timeout"),
            ("path", "metrics_path"),
            ("scheme", "scheme"),
        ] {
            if let Some(v) = ep[field].as_str() {
                job[key] = json!(v);
            }
        }
        let metric_relabel: Vec<Value> = ep["metricRelabelings"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(j, r)| {
                relabel_config(r).with_context(|| format!("{what}.metricRelabelings[{j}]"))
            })
            .collect::<Result<_>>()?;
        if !metric_relabel.is_empty() {
            job["metric_relabel_configs"] = json!(metric_relabel);
        }
        jobs.push(job);
    }
    Ok(jobs)
}

/// A ServiceMonitor RelabelConfig (camelCase) as Prometheus's relabel_config (snake_case; the operator
/// lower-cases the action).
fn relabel_config(r: &Value) -> Result<Value> {
    let mut out = serde_json::Map::new();
    for (k, v) in r.as_object().into_iter().flatten() {
        let key = match k.as_str() {
            "sourceLabels" => "source_labels",
            "targetLabel" => "target_label",
            "separator" | "regex" | "modulus" | "replacement" => k.as_str(),
            "action" => {
                out.insert(
                    "action".into(),
                    json!(v.as_str().unwrap_or_default().to_lowercase()),
                );
                continue;
            }
            other => bail!("unknown relabeling field {other:?}"),
        };
        out.insert(key.into(), v.clone());
    }
    Ok(Value::Object(out))
}

/// Percent-encoding of a query-string value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_rule_has_groups_and_alerts() {
        let rules = rule_file(&prometheus_rule_path()).unwrap();
        assert!(alert_names(&rules).contains(&"NetwaveConfiguratorDown".to_string()));
    }

    #[test]
    fn anything_but_a_prometheus_rule_is_refused_with_what_is_wrong() {
        let err = |y: &str| format!("{:#}", rule_file_from(y).unwrap_err());
        assert!(
            err("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n").contains(
                "expected a monitoring.coreos.com PrometheusRule, found kind \"ConfigMap\""
            ),
        );
        assert!(
            err("apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nspec: {groups: []}\n")
                .contains("spec.groups is missing or empty")
        );
        assert!(
            err("apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nspec:\n  groups:\n    - rules: []\n")
                .contains("spec.groups[0] needs a name")
        );
        let missing = format!(
            "{:#}",
            rule_file(Path::new("/nonexistent/rule.yaml")).unwrap_err()
        );
        assert!(
            missing.contains("reading /nonexistent/rule.yaml"),
            "{missing}"
        );
    }

    #[test]
    fn durations_parse_print_and_for_is_scaled_alone() {
        for (text, secs) in [
            ("15s", 15.0),
            ("2m", 120.0),
            ("1h30m", 5400.0),
            ("500ms", 0.5),
        ] {
            assert_eq!(parse_duration(text).unwrap().as_secs_f64(), secs, "{text}");
        }
        assert!(parse_duration("5 minutes").is_err());
        assert_eq!(duration_text(Duration::from_millis(2500)), "2500ms");
        let rules = rule_file(&prometheus_rule_path()).unwrap();
        let scaled = scale_for(&rules, 60).unwrap();
        let rule = |v: &Value, name: &str| {
            v["groups"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|g| g["rules"].as_array().unwrap())
                .find(|r| r["alert"] == name)
                .unwrap()
                .clone()
        };
        let (before, after) = (
            rule(&rules, "NetwaveAgentDown"),
            rule(&scaled, "NetwaveAgentDown"),
        );
        assert_eq!(
            (before["for"].as_str(), after["for"].as_str()),
            (Some("5m"), Some("5s"))
        );
        assert_eq!(before["expr"], after["expr"]);
        assert_eq!(rule(&scaled, "NetwaveRevisionFailed")["for"], Value::Null);
    }

    fn shipped_monitors() -> Vec<Value> {
        let text =
            fs::read_to_string(workspace_root().join("deploy/monitoring/servicemonitors.yaml"))
                .unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
        docs.into_iter()
            .filter(|d| d["kind"] == "ServiceMonitor")
            .collect()
    }

    fn sd() -> Discovery {
        Discovery { dir: "/sd".into() }
    }

    #[test]
    fn the_shipped_service_monitors_render_as_the_operator_renders_them() {
        let jobs = service_monitor_jobs(&shipped_monitors(), &sd()).unwrap();
        let names: Vec<&str> = jobs.iter().filter_map(|j| j["job_name"].as_str()).collect();
        assert_eq!(
            names,
            [
                "serviceMonitor/netwave-system/netwave-configurator/0",
                "serviceMonitor/netwave-system/netwave-agent/0"
            ]
        );
        let configurator = &jobs[0];
        assert_eq!(configurator["scrape_interval"], "15s");
        // The endpoints of the monitor's own namespace (no namespaceSelector).
        assert_eq!(
            configurator["file_sd_configs"][0]["files"],
            json!(["/sd/netwave-system.json"])
        );
        let relabel = configurator["relabel_configs"].as_array().unwrap();
        assert!(relabel.contains(&json!({
            "action": "keep",
            "source_labels": ["__meta_kubernetes_service_label_app_kubernetes_io_name", "__meta_kubernetes_service_labelpresent_app_kubernetes_io_name"],
            "regex": "(netwave-configurator);true",
        })), "{relabel:?}");
        assert!(relabel.contains(&json!({"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": "metrics"})));
        // The job is the Service's jobLabel, after the fallback to the Service's name.
        let job_rules: Vec<&Value> = relabel
            .iter()
            .filter(|r| r["target_label"] == "job")
            .collect();
        assert_eq!(job_rules.len(), 2);
        assert_eq!(
            job_rules[1]["source_labels"],
            json!(["__meta_kubernetes_service_label_app_kubernetes_io_name"])
        );
        let agent = &jobs[1];
        assert_eq!(agent["scrape_interval"], "30s");
        assert_eq!(
            agent["relabel_configs"].as_array().unwrap().last().unwrap(),
            &json!({"action": "replace", "source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"})
        );
    }

    #[test]
    fn a_service_monitor_field_the_renderer_does_not_know_is_an_error_naming_it() {
        let mut m = shipped_monitors();
        m[1]["spec"]["endpoints"][0]["bearerTokenSecret"] = json!({"name": "x", "key": "y"});
        let err = format!("{:#}", service_monitor_jobs(&m, &sd()).unwrap_err());
        assert!(
            err.contains("ServiceMonitor netwave-system/netwave-agent")
                && err.contains("spec.endpoints[0].bearerTokenSecret"),
            "{err}"
        );
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(encode("up{job=\"a b\"}"), "up%7Bjob%3D%22a%20b%22%7D");
    }
}
