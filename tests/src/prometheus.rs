//! The alert rules of `deploy/monitoring` as Prometheus runs them, and a real Prometheus for the tests.
//!
//! ```text
//!   deploy/monitoring/prometheusrule.yaml ──rule_file()──► {"groups": spec.groups}  (a plain rule file;
//!        (PrometheusRule, the one copy)                    JSON is YAML to promtool and Prometheus)
//!
//!   Prometheus::start ──► /usr/bin/prometheus on 127.0.0.1:<free port>, its own temp dir, 1 s scrape and
//!                          evaluation; jobs netwave-configurator and netwave-agent (the names the
//!                          ServiceMonitors give them) ──► alerts(): GET /api/v1/alerts
//! ```
//!
//! Both binaries come from Debian's `prometheus` package; a missing one is an error that says so, never a
//! skip. Dropping a [`Prometheus`] stops it by its pid and removes its directory.

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
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
        let bin = binary("prometheus")?;
        let _ = fs::remove_dir_all(dir);
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        fs::write(dir.join("rules.json"), serde_json::to_vec_pretty(rules)?)?;
        let secs = format!("{}s", interval.as_secs().max(1));
        let job = |name: &str, addrs: &[SocketAddr]| {
            json!({
                "job_name": name,
                "scrape_interval": secs,
                "scrape_timeout": secs,
                "static_configs": [{"targets": addrs.iter().map(ToString::to_string).collect::<Vec<_>>()}],
            })
        };
        let config = json!({
            "global": {"scrape_interval": secs, "evaluation_interval": secs},
            "rule_files": ["rules.json"],
            "scrape_configs": [
                job("netwave-configurator", &targets.configurators),
                job("netwave-agent", &targets.agents),
            ],
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
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = p.child.try_wait() {
                bail!(
                    "prometheus exited ({status}) before it was ready:\n{}",
                    p.log_tail(20)
                );
            }
            if let Ok((200, _)) = p.get("/-/ready").await {
                return Ok(p);
            }
            if Instant::now() >= deadline {
                bail!("prometheus not ready after 30 s:\n{}", p.log_tail(20));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
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
    fn query_values_are_percent_encoded() {
        assert_eq!(encode("up{job=\"a b\"}"), "up%7Bjob%3D%22a%20b%22%7D");
    }
}
