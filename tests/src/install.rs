//! netwave installed as users install it, on a real cluster (`netwave_control_plane::node`): the test
//! overlay over `deploy/base`, `kubectl` as the admin, polling with the cluster's logs on timeout, and
//! what the tests read back (ready pods, the Lease holder, the agent's metrics, the node's links, refused
//! writes in any component's log). Used by `tests/tests/real_node*.rs`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use netwave_control_plane::node::{Cluster, NETNS, NODE_ADDR, OciImage};

use crate::fleet::workspace_root;

pub const NS: &str = "netwave-system";
pub const TAINT: &str = "netwave.dev/network-unavailable";

/// Where images/build.sh writes the layouts (always the repository's target/, like tests/images.rs).
pub fn images_dir() -> PathBuf {
    workspace_root().join("target/images")
}

/// The configurator's and the plain agent's image layouts, or an error saying to build them.
pub fn images() -> Result<Vec<OciImage>> {
    ["netwave-configurator", "netwave-agent"]
        .into_iter()
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

/// The test overlay over deploy/base, written where kustomize may load deploy/base from (a relative
/// path inside the repository), with the agent's state directory at `state`.
pub fn write_overlay(state: &Path) -> Result<PathBuf> {
    let dir = workspace_root()
        .join("target")
        .join(format!("real-node-overlay-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let base = pathdiff(&workspace_root().join("deploy/base"), &dir);
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
  - target: {{kind: DaemonSet, name: netwave-agent}}
    patch: |
      - {{op: add, path: /spec/template/spec/containers/0/imagePullPolicy, value: Never}}
      - {{op: add, path: /spec/template/spec/terminationGracePeriodSeconds, value: 2}}
      - {{op: replace, path: /spec/template/spec/volumes/0/hostPath/path, value: {state}}}
"#,
            state = state.display()
        ),
    )?;
    Ok(dir)
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

/// Polls `f` every 250 ms until it returns `Some`, or fails after `timeout` with `what` and the cluster's
/// logs.
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
    let deadline = Instant::now() + timeout;
    loop {
        match f().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) | Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await
            }
            r => bail!(
                "{what}: not within {timeout:?} ({:?})\n{}\n{}",
                r.err(),
                pods_summary(cluster).await,
                cluster.logs_tail(10)
            ),
        }
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect((NODE_ADDR, 9091)).await?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: agent\r\n\r\n")
        .await?;
    let mut body = String::new();
    s.read_to_string(&mut body).await?;
    body.lines()
        .find_map(|l| {
            l.strip_prefix(name)
                .filter(|r| r.starts_with(' '))
                .and_then(|r| r.trim().parse().ok())
        })
        .with_context(|| format!("no {name} in the agent's metrics"))
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
                if l.contains("forbidden") || l.contains("Forbidden") || l.contains(" 403") {
                    out.push(format!("{p}/{c}: {l}"));
                }
            }
        }
    }
    out
}
