//! The whole agent (Kubernetes shell + dataplane, in-process) against an API server, in a throwaway
//! network namespace (root): status reporting, skip-until-retry, drift repair, Node condition and taints,
//! Events, metrics.
//!
//! The agent runs on the real kube-apiserver with its deployed identity (`deploy/base/agent.yaml`'s
//! ServiceAccount and RBAC, `real_api`), except where a test cuts the node off the API server: partitions
//! are injected faults, which only the testbed has.

mod common;
mod real_api;

use netwave_api::vocab::{
    ConditionStatus, NodePhase, NodeReason, node_conditions, node_reasons, probe_results,
};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use common::{in_netns, ip, until};
use k8s_openapi::api::authorization::v1::SelfSubjectAccessReview;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use netwave_agent::shell::{self, args::Args};
use netwave_api::{
    Layer2Config, NodeConfig, NodeNetworkConfig, NodeNetworkConfigSpec, NodeNetworkConfigStatus,
    RouteConfig, RouteType,
};
use netwave_testbed::{ClientIdentity, Partition, Testbed, TestbedOptions};
use real_api::RealApi;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(20);

fn good() -> NodeConfig {
    NodeConfig {
        layer2s: vec![
            Layer2Config::segment(10, 1010)
                .with_mtu(1450)
                .with_anycast("02:00:5e:00:01:01", &["198.18.10.1/24".into()])
                .with_neigh_suppression(true),
        ],
        ..NodeConfig::default()
    }
}

fn hash(config: &NodeConfig) -> String {
    netwave_core::render::config_hash(config)
}

fn spec(rev: &str, retry: u32, config: NodeConfig) -> NodeNetworkConfigSpec {
    NodeNetworkConfigSpec {
        revision: rev.into(),
        sequence: 1,
        config_hash: hash(&config),
        retry,
        config,
    }
}

async fn wait_status(
    api: &Api<NodeNetworkConfig>,
    what: &str,
    ok: impl Fn(&NodeNetworkConfigStatus) -> bool,
) -> Result<NodeNetworkConfigStatus> {
    until(what, WAIT, async || {
        Ok(match api.get("n1").await?.status {
            Some(s) if ok(&s) => Ok(s),
            s => Err(format!("status {s:?}")),
        })
    })
    .await
}

/// Agent arguments for node `n1` with its state in `dir`, drift repair every second, `/metrics` on
/// `metrics_port` and `/healthz` on the next port.
fn agent_args(
    dir: &std::path::Path,
    health: std::path::PathBuf,
    metrics_port: u16,
) -> Result<Args> {
    Ok(Args {
        node_name: "n1".into(),
        state_dir: dir.join("state"),
        health_config: Some(health),
        drift_interval: Duration::from_secs(1),
        vxlan_local: Some("198.18.0.10".parse()?),
        vxlan_port: 4789,
        vlan_trunk: None,
        protected: vec![],
        name_prefixes: vec![],
        kubeconfig: None,
        api_stale_after: Duration::from_secs(1),
        metrics_addr: ([127, 0, 0, 1], metrics_port).into(),
        health_addr: ([127, 0, 0, 1], metrics_port + 1).into(),
        log_format: shell::args::LogFormat::Text,
        frr_config: None,
        rendering_drill: None,
    })
}

/// `GET path` on 127.0.0.1:`port`: the status code and the body.
async fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    let code = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("an HTTP status line")?;
    let body = out.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    Ok((code, body))
}

async fn metrics() -> Result<String> {
    metrics_at(19091).await
}

async fn metrics_at(port: u16) -> Result<String> {
    Ok(http_get(port, "/metrics").await?.1)
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// An agent running in-process: `stop` ends it as SIGTERM would; dropping it (a failed test) aborts it,
/// so nothing of one test acts on the server the next test gets.
struct RunningAgent {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: JoinHandle<Result<()>>,
}

impl RunningAgent {
    fn start(args: Args, client: kube::Client) -> RunningAgent {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(shell::run_with(args, client, async {
            let _ = stopped.await;
        }));
        RunningAgent {
            stop: Some(stop),
            task,
        }
    }

    /// Stops the agent and returns what `run_with` returned.
    async fn stop(mut self) -> Result<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        (&mut self.task).await.context("agent task")?
    }
}

impl Drop for RunningAgent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The reasons of the Events the agent published about NodeNetworkConfig `n1` (cluster-scoped objects'
/// Events go to the `default` namespace).
async fn event_reasons(client: &kube::Client) -> Result<Vec<String>> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    Ok(events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.reporting_controller.as_deref() == Some(shell::FIELD_MANAGER)
                && e.regarding.as_ref().is_some_and(|r| {
                    r.kind.as_deref() == Some("NodeNetworkConfig")
                        && r.name.as_deref() == Some("n1")
                })
        })
        .filter_map(|e| e.reason)
        .collect())
}

async fn wait_event(client: &kube::Client, reason: &str) -> Result<()> {
    until(
        &format!("a {reason} Event from the agent"),
        WAIT,
        async || {
            let reasons = event_reasons(client).await?;
            Ok(if reasons.iter().any(|r| r == reason) {
                Ok(())
            } else {
                Err(format!("its Events: {reasons:?}"))
            })
        },
    )
    .await
}

#[test]
fn agent_reports_status_skips_invalid_until_retry_and_repairs_drift() {
    in_netns(
        "agent_reports_status_skips_invalid_until_retry_and_repairs_drift",
        || async {
            let server = RealApi::start().await?;
            let client = server.admin.clone();
            let nodes: Api<Node> = Api::all(client.clone());
            let mut node = Node::default();
            node.metadata.name = Some("n1".into());
            let taint = |key: &str| k8s_openapi::api::core::v1::Taint {
                key: key.into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            };
            // Ours, and one the agent must leave alone.
            node.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
                taints: Some(vec![
                    taint("netwave.dev/network-unavailable"),
                    taint("example.com/maintenance"),
                ]),
                ..Default::default()
            });
            let created = nodes.create(&PostParams::default(), &node).await?;
            let taint_keys = |n: &Node| -> Vec<String> {
                let taints = n.spec.as_ref().and_then(|s| s.taints.clone());
                taints
                    .unwrap_or_default()
                    .into_iter()
                    .map(|t| t.key)
                    .collect()
            };
            // The real server adds taints of its own on create (node.kubernetes.io/not-ready, from the
            // TaintNodesByCondition admission plugin): they are not the agent's to remove either.
            let mut others = taint_keys(&created);
            ensure!(
                others
                    .iter()
                    .any(|k| k == "netwave.dev/network-unavailable"),
                "{others:?}"
            );
            others.retain(|k| k != "netwave.dev/network-unavailable");
            let nncs: Api<NodeNetworkConfig> = Api::all(client.clone());
            nncs.create(
                &PostParams::default(),
                &NodeNetworkConfig::new("n1", spec("r1", 0, good())),
            )
            .await?;

            let dir = tempfile::tempdir()?;
            let health = dir.path().join("health.yaml");
            std::fs::write(
                &health,
                "interfaces: [\"lo\"]\napiServer: true\nsettleSeconds: 0\ndeadlineSeconds: 2\n\
             taints: [\"netwave.dev/network-unavailable\"]\n",
            )?;
            let args = agent_args(dir.path(), health, 19091)?;
            // Declared after the server: dropped (aborted) before the server goes back to the pool.
            let agent = RunningAgent::start(args, server.agent_client().await?);

            // r1 applies and is reported.
            let s = wait_status(&nncs, "r1 Provisioned", |s| {
                s.phase.as_deref() == Some(NodePhase::Provisioned.as_str())
                    && s.observed_revision.as_deref() == Some("r1")
            })
            .await?;
            ensure!(
                s.config_hash.as_deref() == Some(hash(&good()).as_str()),
                "{s:?}"
            );
            ensure!(s.last_good_revision.as_deref() == Some("r1"));
            ensure!(s.agent_version.is_some() && s.kernel_capabilities.contains_key("vrf"));
            ensure!(
                s.probes
                    .iter()
                    .any(|p| p.name == "api" && p.result == probe_results::PASSED && p.gating),
                "{:?}",
                s.probes
            );
            ensure!(ip(&["-d", "link", "show", "vx.10"])?.contains("vxlan id 1010"));
            // Healthy: the configured taint is gone (every other one stays) and NetworkReady is True.
            until("the taint gone and NetworkReady True", WAIT, async || {
                let n = nodes.get("n1").await?;
                let dump = format!("{:?} {:?}", n.spec, n.status);
                let tainted = taint_keys(&n) != others;
                let ready = n.status.and_then(|s| s.conditions).is_some_and(|c| {
                    c.iter().any(|c| {
                        c.type_ == node_conditions::NETWORK_READY
                            && c.status == ConditionStatus::True.as_str()
                    })
                });
                Ok((!tainted && ready).then_some(()).ok_or(dump))
            })
            .await?;

            // A spec edited by hand (the config, not its hash) is refused: the kernel is not touched.
            let mut edited = good();
            edited.layer2s[0].mtu = 1300;
            let patch = json!({ "spec": { "config": edited } });
            nncs.patch("n1", &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            let s = wait_status(&nncs, "r1 refused as tampered", |s| {
                s.reason.as_deref() == Some(netwave_api::REASON_CONFIG_TAMPERED)
            })
            .await?;
            ensure!(
                s.phase.as_deref() == Some(NodePhase::Invalid.as_str()),
                "{s:?}"
            );
            ensure!(
                s.message
                    .as_deref()
                    .is_some_and(|m| m.contains("does not hash to")),
                "{s:?}"
            );
            ensure!(
                s.config_hash.as_deref() == Some(hash(&good()).as_str()),
                "{s:?}"
            );
            ensure!(ip(&["link", "show", "l2.10"])?.contains("mtu 1450"));
            wait_event(&client, netwave_api::REASON_CONFIG_TAMPERED).await?;
            // Put back (as the configurator does): the same revision is Provisioned again, nothing applied.
            let patch = json!({ "spec": { "config": good() } });
            nncs.patch("n1", &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            wait_status(&nncs, "r1 Provisioned after the spec was put back", |s| {
                s.phase.as_deref() == Some(NodePhase::Provisioned.as_str()) && s.reason.is_none()
            })
            .await?;
            ensure!(ip(&["link", "show", "l2.10"])?.contains("mtu 1450"));

            // r2 cannot be applied: Invalid, r1 keeps running.
            let mut bad = good();
            bad.routes.push(RouteConfig {
                table: 100,
                prefix: "203.0.113.0/24".into(),
                via: Some("192.0.2.77".into()),
                dev: None,
                kind: RouteType::Unicast,
                metric: None,
            });
            let patch = json!({ "spec": spec("r2", 0, bad.clone()) });
            nncs.patch("n1", &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            let s = wait_status(&nncs, "r2 Invalid", |s| {
                s.phase.as_deref() == Some(NodePhase::Invalid.as_str())
                    && s.observed_revision.as_deref() == Some("r2")
            })
            .await?;
            ensure!(
                s.reason.as_deref() == Some(NodeReason::ApplyFailed.as_str()),
                "{s:?}"
            );
            ensure!(
                s.config_hash.as_deref() == Some(hash(&good()).as_str())
                    && s.last_good_revision.as_deref() == Some("r1")
            );
            let invalid = r#"netwave_agent_applies_total{phase="Invalid",reason="ApplyFailed"}"#;
            ensure!(metric(&metrics().await?, invalid) == 1.0);
            // Published with the agent's own RBAC (a refused Event is only a warning in its log).
            wait_event(&client, NodeReason::ApplyFailed.as_str()).await?;

            // A change that does not bump retry does not re-apply it …
            let patch = json!({ "metadata": { "annotations": { "touch": "1" } } });
            nncs.patch("n1", &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            // … a retry bump does, once: the agent sees both edits in order, so a re-apply on the first
            // would count twice (the rule itself: invalid_revision_is_not_reapplied_until_retry_changes).
            let patch = json!({ "spec": { "retry": 1 } });
            nncs.patch("n1", &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            wait_status(&nncs, "r2 retry 1 Invalid", |s| {
                s.phase.as_deref() == Some(NodePhase::Invalid.as_str())
                    && s.observed_retry == Some(1)
            })
            .await?;
            ensure!(metric(&metrics().await?, invalid) == 2.0);

            // Drift is repaired on the timer and counted.
            ip(&["link", "set", "l2.10", "mtu", "1400"])?;
            until("l2.10's MTU repaired", WAIT, async || {
                let link = ip(&["link", "show", "l2.10"])?;
                Ok(link.contains("mtu 1450").then_some(()).ok_or(link))
            })
            .await?;
            // The counter moves after the repair is verified, a moment after the kernel is fixed.
            until("the repair counted", WAIT, async || {
                let m = metrics().await?;
                let n = metric(&m, "netwave_agent_drift_corrections_total");
                Ok((n >= 1.0).then_some(()).ok_or(m))
            })
            .await?;
            wait_event(&client, "DriftCorrected").await?;
            // Every status the agent wrote was accepted the first time (a refused write is retried).
            let m = metrics().await?;
            ensure!(
                m.lines()
                    .any(|l| l == "netwave_agent_status_write_errors_total 0"),
                "status writes failed: {m}"
            );

            agent.stop().await?;
            Ok(())
        },
    );
}

/// A probe the target breaks and the rollback mends reads up again in `netwave_agent_probe_up` (the
/// re-check after the rollback is the probe's last run): the gauge used to keep the apply's failure
/// until the next successful apply, so NetwaveAgentProbeDown fired on a healthy node after every health
/// rollback (found by tests/tests/real_node_monitoring.rs). The status keeps the failure the verdict is
/// about.
#[test]
fn a_probe_the_rollback_mends_reads_up_again() {
    in_netns("a_probe_the_rollback_mends_reads_up_again", || async {
        let server = RealApi::start().await?;
        let client = server.admin.clone();
        let mut node = Node::default();
        node.metadata.name = Some("n1".into());
        Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &node)
            .await?;
        let nncs: Api<NodeNetworkConfig> = Api::all(client.clone());
        nncs.create(
            &PostParams::default(),
            &NodeNetworkConfig::new("n1", spec("r1", 0, good())),
        )
        .await?;
        let dir = tempfile::tempdir()?;
        let health = dir.path().join("health.yaml");
        // The segment's bridge must be up: r1 has it, r2 removes it.
        std::fs::write(
            &health,
            "interfaces: [\"l2.10\"]\napiServer: false\nsettleSeconds: 0\ndeadlineSeconds: 1\n",
        )?;
        let args = agent_args(dir.path(), health, 19107)?;
        let agent = RunningAgent::start(args, server.agent_client().await?);
        wait_status(&nncs, "r1 Provisioned", |s| {
            s.phase.as_deref() == Some(NodePhase::Provisioned.as_str())
                && s.observed_revision.as_deref() == Some("r1")
        })
        .await?;
        let up = r#"netwave_agent_probe_up{probe="interface l2.10"}"#;
        ensure!(metric(&metrics_at(19107).await?, up) == 1.0);

        let patch = json!({ "spec": spec("r2", 0, NodeConfig::default()) });
        nncs.patch("n1", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        let s = wait_status(&nncs, "r2 Invalid", |s| {
            s.phase.as_deref() == Some(NodePhase::Invalid.as_str())
                && s.observed_revision.as_deref() == Some("r2")
        })
        .await?;
        ensure!(
            s.reason.as_deref() == Some(NodeReason::HealthCheckFailed.as_str()),
            "{s:?}"
        );
        ensure!(
            s.probes
                .iter()
                .any(|p| p.name == "interface l2.10" && p.result != probe_results::PASSED),
            "the status says which probe failed r2: {:?}",
            s.probes
        );
        // (r1's bridge is back: `ip link show` fails on a missing link.)
        ip(&["link", "show", "l2.10"])?;
        let m = metrics_at(19107).await?;
        let rollbacks = metric(&m, "netwave_agent_rollbacks_total");
        ensure!(rollbacks == 1.0, "one rollback: {rollbacks}\n{m}");
        ensure!(
            metric(&m, up) == 1.0,
            "r1 is back and its bridge is up, so is the probe: {}",
            m.lines()
                .filter(|l| l.contains("probe_up"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        agent.stop().await?;
        Ok(())
    });
}

/// DESIGN.md §6 on the agent: its own NodeNetworkConfig stored with a value its Rust type cannot hold
/// (`spec.retry` 2^32, written while the CRD had no bound, as an older CRD allowed) must not blind it.
/// It reports that (an Event on the object naming the field, the gauge), applies nothing new and keeps
/// the node running; once the object is fixed it applies the next config.
#[test]
fn an_agent_whose_own_config_cannot_be_decoded_reports_it_and_applies_again_once_fixed() {
    in_netns(
        "an_agent_whose_own_config_cannot_be_decoded_reports_it_and_applies_again_once_fixed",
        || async {
            let server = RealApi::start().await?;
            let client = server.admin.clone();
            let mut node = Node::default();
            node.metadata.name = Some("n1".into());
            Api::<Node>::all(client.clone())
                .create(&PostParams::default(), &node)
                .await?;
            let nncs: Api<NodeNetworkConfig> = Api::all(client.clone());
            nncs.create(
                &PostParams::default(),
                &NodeNetworkConfig::new("n1", spec("r1", 0, good())),
            )
            .await?;
            let dir = tempfile::tempdir()?;
            let health = dir.path().join("health.yaml");
            std::fs::write(&health, "settleSeconds: 0\ndeadlineSeconds: 2\n")?;
            let args = agent_args(dir.path(), health, 19097)?;
            let agent_client = server.agent_client().await?;
            // The agent reports once, best effort: its Events Role must be in force first (the API
            // server's RBAC cache takes a moment after the RoleBinding is written).
            let reviews: Api<SelfSubjectAccessReview> = Api::all(agent_client.clone());
            let may_report = serde_json::from_value(json!({"spec": {"resourceAttributes": {
                "group": "events.k8s.io", "resource": "events", "verb": "create",
                "namespace": "default"}}}))?;
            until("the Events RBAC in force", WAIT, async || {
                let review = reviews.create(&PostParams::default(), &may_report).await?;
                Ok(match review.status {
                    Some(s) if s.allowed => Ok(()),
                    s => Err(format!("{s:?}")),
                })
            })
            .await?;
            let agent = RunningAgent::start(args, agent_client);
            wait_status(&nncs, "r1 Provisioned", |s| {
                s.phase.as_deref() == Some(NodePhase::Provisioned.as_str())
                    && s.observed_revision.as_deref() == Some("r1")
            })
            .await?;

            // The CRD without the bound on spec.retry, the bad value stored, the bound back. Untyped:
            // the answers hold a value the Rust type cannot.
            let raw = Api::<kube::core::DynamicObject>::all_with(
                client.clone(),
                &kube::core::ApiResource::erase::<NodeNetworkConfig>(&()),
            );
            let retry = |r: u64| Patch::Merge(json!({"spec": {"retry": r}}));
            let dry = PatchParams {
                dry_run: true,
                ..PatchParams::default()
            };
            let loose = netwave_api::crds().into_iter().map(|(f, c)| {
                if f != "nodenetworkconfigs.yaml" {
                    return c;
                }
                let mut v = serde_json::to_value(c).unwrap();
                v["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
                    ["properties"]["retry"]
                    .as_object_mut()
                    .unwrap()
                    .remove("maximum");
                serde_json::from_value(v).unwrap()
            });
            server.install_crds(loose).await?;
            until("the loose CRD in force", WAIT, async || {
                Ok(raw
                    .patch("n1", &dry, &retry(1 << 32))
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string()))
            })
            .await?;
            raw.patch("n1", &PatchParams::default(), &retry(1 << 32))
                .await?;
            server
                .install_crds(netwave_api::crds().into_iter().map(|(_, c)| c))
                .await?;

            wait_event(&client, "Undecodable").await?;
            let events: Api<Event> = Api::namespaced(client.clone(), "default");
            let notes: Vec<String> = events
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("Undecodable"))
                .filter_map(|e| e.note)
                .collect();
            ensure!(
                notes.len() == 1
                    && notes[0].starts_with(
                        "this node's NodeNetworkConfig cannot be decoded (spec.retry: invalid \
                         value: integer `4294967296`, expected u32): nothing new is applied"
                    ),
                "{notes:?}"
            );
            ensure!(
                metric(
                    &metrics_at(19097).await?,
                    "netwave_agent_undecodable_config"
                ) == 1.0
            );
            ensure!(
                ip(&["link", "show", "l2.10"])?.contains("mtu 1450"),
                "r1 still runs"
            );

            // Fixed (the configurator assigns r2): applied and reported, the gauge back to 0.
            let mut r2 = good();
            r2.layer2s[0].mtu = 1400;
            let patch = json!({ "spec": spec("r2", 0, r2) });
            nncs.patch("n1", &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            wait_status(&nncs, "r2 Provisioned", |s| {
                s.phase.as_deref() == Some(NodePhase::Provisioned.as_str())
                    && s.observed_revision.as_deref() == Some("r2")
            })
            .await?;
            ensure!(ip(&["link", "show", "l2.10"])?.contains("mtu 1400"));
            ensure!(
                metric(
                    &metrics_at(19097).await?,
                    "netwave_agent_undecodable_config"
                ) == 0.0
            );
            agent.stop().await?;
            Ok(())
        },
    );
}

/// On the testbed: the node is cut off the API server mid-apply by an injected partition of the agent's
/// token, and healed later; the real server has no such fault. (Everything here hinges on the cut, so the
/// test is not split.) The testbed runs in this test's runtime and namespace and ends with it.
#[test]
fn api_cut_by_a_new_config_rolls_back_locally_repairs_drift_and_reports_after_a_restart() {
    in_netns(
        "api_cut_by_a_new_config_rolls_back_locally_repairs_drift_and_reports_after_a_restart",
        || async {
            let crds: Vec<_> = netwave_api::crds().into_iter().map(|(_, c)| c).collect();
            let tb = Testbed::start(TestbedOptions::default().with_crds(crds)).await?;
            let admin = tb.client();
            let mut node = Node::default();
            node.metadata.name = Some("n1".into());
            Api::<Node>::all(admin.clone())
                .create(&PostParams::default(), &node)
                .await?;
            let nncs: Api<NodeNetworkConfig> = Api::all(admin.clone());
            nncs.create(
                &PostParams::default(),
                &NodeNetworkConfig::new("n1", spec("r1", 0, good())),
            )
            .await?;
            let dir = tempfile::tempdir()?;
            let health = dir.path().join("health.yaml");
            std::fs::write(
                &health,
                "apiServer: true\nsettleSeconds: 1\ndeadlineSeconds: 2\nattemptTimeoutSeconds: 0.5\n",
            )?;
            let args = agent_args(dir.path(), health, 19093)?;
            let agent_client = tb.client_as(ClientIdentity {
                token: Some("agent-n1".into()),
                ..Default::default()
            });
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let agent = tokio::spawn(shell::run_with(args.clone(), agent_client.clone(), async {
                let _ = stopped.await;
            }));
            wait_status(&nncs, "r1 Provisioned", |s| {
                s.phase.as_deref() == Some(NodePhase::Provisioned.as_str())
                    && s.observed_revision.as_deref() == Some("r1")
            })
            .await?;

            // r2 "cuts the node off the API server": the partition starts while r2 is being applied.
            let mut r2 = good();
            let mut seg = r2.layer2s[0].clone();
            seg.vlan = 20;
            seg.vni = 1020;
            seg.bridge = "l2.20".into();
            seg.vxlan = "vx.20".into();
            seg.anycast_gateways = vec!["198.18.20.1/24".into()];
            r2.layer2s.push(seg);
            let patch = json!({ "spec": spec("r2", 0, r2) });
            nncs.patch("n1", &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            let marker = dir.path().join("state/applying.json");
            until("r2 started", WAIT, async || {
                let vx20 = ip(&["-o", "link", "show"])?.contains("vx.20");
                Ok((marker.exists() && vx20)
                    .then_some(())
                    .ok_or(format!("marker: {}, vx.20: {vx20}", marker.exists())))
            })
            .await?;
            tb.faults().partition(Partition::Token("agent-n1".into()));

            // The agent rolls back on its own, without the API server.
            until(
                "a local rollback while cut off",
                Duration::from_secs(10),
                async || {
                    let vx20 = ip(&["-o", "link", "show"])?.contains("vx.20");
                    Ok((!vx20 && !marker.exists())
                        .then_some(())
                        .ok_or(format!("marker: {}, vx.20: {vx20}", marker.exists())))
                },
            )
            .await?;
            let s = nncs.get("n1").await?.status.unwrap_or_default();
            ensure!(
                s.phase.as_deref() != Some(NodePhase::Invalid.as_str()),
                "reported while cut off?! {s:?}"
            );

            // Cut off for longer than --api-stale-after: not ready, saying why (an agent rollout
            // stops here), but alive.
            let not_ready = until("/readyz to name the failing watch", WAIT, async || {
                Ok(match http_get(19094, "/readyz").await? {
                    (503, why) if why.contains("NodeNetworkConfig watch has failed") => Ok(why),
                    other => Err(format!("{other:?}")),
                })
            })
            .await?;
            ensure!(http_get(19094, "/healthz").await?.0 == 200, "{not_ready}");

            // Still cut off, with the Invalid report undelivered: drift is repaired all the same.
            ip(&["link", "del", "vx.10"])?;
            let cut_off = "a drift repair while the API server is unreachable";
            until(cut_off, Duration::from_secs(10), async || {
                let links = ip(&["-o", "link", "show"])?;
                Ok(links.contains("vx.10").then_some(()).ok_or(links))
            })
            .await?;

            // SIGTERM while cut off: the agent stops after its short grace for undelivered reports.
            let _ = stop.send(());
            let started = std::time::Instant::now();
            tokio::time::timeout(Duration::from_secs(10), agent)
                .await
                .context("the agent did not stop while cut off from the API server")?
                .context("agent task")??;
            let took = started.elapsed();
            ensure!(took < Duration::from_secs(8), "stopping took {took:?}");

            // Back online, a new agent process: it reports the verdict from before the restart instead
            // of applying r2 again.
            tb.faults().heal();
            let args = Args {
                metrics_addr: ([127, 0, 0, 1], 19095).into(),
                health_addr: ([127, 0, 0, 1], 19096).into(),
                ..args
            };
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let agent = tokio::spawn(shell::run_with(args, agent_client, async {
                let _ = stopped.await;
            }));
            let s = wait_status(&nncs, "r2 Invalid", |s| {
                s.phase.as_deref() == Some(NodePhase::Invalid.as_str())
                    && s.observed_revision.as_deref() == Some("r2")
            })
            .await?;
            ensure!(
                s.reason.as_deref() == Some(NodeReason::HealthCheckFailed.as_str()),
                "{s:?}"
            );
            ensure!(
                s.message
                    .as_deref()
                    .unwrap_or_default()
                    .contains("HealthCheckFailed: api"),
                "{s:?}"
            );
            ensure!(
                s.last_good_revision.as_deref() == Some("r1")
                    && s.config_hash.as_deref() == Some(hash(&good()).as_str())
            );
            ensure!(
                !ip(&["-o", "link", "show"])?.contains("vx.20"),
                "r2 was applied again"
            );
            let m = metrics_at(19095).await?;
            ensure!(
                metric(&m, "netwave_agent_netlink_writes_total") == 0.0,
                "the restarted agent changed the kernel: {m}"
            );
            let _ = stop.send(());
            agent.await.context("agent task")??;
            Ok(())
        },
    );
}

/// The whole agent with `--frr-config` and a real zebra + bgpd: the FRR part of an apply is in the
/// status message, a hand edit of FRR is repaired by the drift timer (with an Event), and an agent with
/// FRR off reports a config with BGP content `Invalid/FrrUnavailable`.
#[test]
fn agent_with_frr_applies_it_repairs_its_drift_and_without_frr_refuses_bgp_content() {
    let test = "agent_with_frr_applies_it_repairs_its_drift_and_without_frr_refuses_bgp_content";
    if common::is_root()
        && !std::path::Path::new(common::frr::FRR_LIB)
            .join("zebra")
            .is_file()
    {
        panic!("{test}: {}", common::frr::INSTALL);
    }
    in_netns(test, || async {
        use common::frr::{FrrDaemons, VTEP, body};
        ip(&["addr", "add", &format!("{VTEP}/32"), "dev", "lo"])?;
        for key in ["net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"] {
            std::fs::write(format!("/proc/sys/{key}"), "1")?;
        }
        let fr = FrrDaemons::start()?;
        let d = fr.dir().display();
        let dir = tempfile::tempdir()?;
        let frr_yaml = dir.path().join("frr.yaml");
        std::fs::write(
            &frr_yaml,
            format!(
                "underlay:\n  asn: 65000\n  vtepAddress: {VTEP}\n  neighbors:\n    - address: \
                 198.18.0.254\n      remoteAs: internal\nconfigDir: {d}\nvtySocket: {d}\nrunDir: {d}\n"
            ),
        )?;
        let health = dir.path().join("health.yaml");
        std::fs::write(
            &health,
            "apiServer: true\nsettleSeconds: 0\ndeadlineSeconds: 2\n",
        )?;

        let server = RealApi::start().await?;
        let client = server.admin.clone();
        let mut node = Node::default();
        node.metadata.name = Some("n1".into());
        Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &node)
            .await?;
        let nncs: Api<NodeNetworkConfig> = Api::all(client.clone());
        let mut r1 = good();
        let mut second = r1.layer2s[0].clone();
        second.vlan = 20;
        second.vni = 1020;
        second.bridge = "l2.20".into();
        second.vxlan = "vx.20".into();
        second.anycast_gateways = vec!["198.18.20.1/24".into()];
        r1.layer2s.push(second);
        nncs.create(
            &PostParams::default(),
            &NodeNetworkConfig::new("n1", spec("r1", 0, r1.clone())),
        )
        .await?;
        let args = Args {
            vxlan_local: Some(VTEP.parse()?),
            frr_config: Some(frr_yaml.clone()),
            ..agent_args(dir.path(), health.clone(), 19101)?
        };
        let want = args
            .frr(&netwave_agent::frr::kernel_hostname()?)
            .map_err(anyhow::Error::msg)?
            .context("FRR on")?
            .render(&r1)?;
        let agent = RunningAgent::start(args, server.agent_client().await?);

        let s = wait_status(&nncs, "r1 Provisioned", |s| {
            s.phase.as_deref() == Some(NodePhase::Provisioned.as_str())
                && s.observed_revision.as_deref() == Some("r1")
        })
        .await?;
        let message = s.message.clone().unwrap_or_default();
        ensure!(message.contains("FRR config applied in"), "{s:?}");
        ensure!(fr.running()? == body(&want), "FRR does not run the render");
        ensure!(fr.evpn_vnis()? == [1010, 1020], "{:?}", fr.evpn_vnis()?);
        eprintln!("r1 through the shell: {message}");

        // A hand edit of FRR: the drift timer (1 s here) puts the render back and says so.
        fr.vtysh(&[
            "-c",
            "configure terminal",
            "-c",
            "router bgp 65000",
            "-c",
            "coalesce-time 100",
        ])?;
        wait_event(&client, "DriftCorrected").await?;
        until("FRR's drift repaired", WAIT, async || {
            let running = fr.running()?;
            Ok((running == body(&want)).then_some(()).ok_or(running))
        })
        .await?;
        ensure!(
            metric(
                &metrics_at(19101).await?,
                "netwave_agent_drift_corrections_total"
            ) >= 1.0
        );
        ensure!(
            metric(
                &metrics_at(19101).await?,
                "netwave_agent_frr_apply_duration_seconds_count"
            ) >= 1.0
        );
        agent.stop().await?;

        // The same node with FRR off gets a revision with BGP content: refused, nothing changed.
        let mut r2 = r1.clone();
        r2.vrfs.push(netwave_api::VrfConfig {
            communities: vec!["65000:1".into()],
            ..netwave_api::VrfConfig::named("red").with_vni(2000)
        });
        let patch = json!({ "spec": spec("r2", 0, r2) });
        nncs.patch("n1", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        let args = Args {
            vxlan_local: Some(VTEP.parse()?),
            ..agent_args(dir.path(), health, 19103)?
        };
        let agent = RunningAgent::start(args, server.agent_client().await?);
        let s = wait_status(&nncs, "r2 Invalid", |s| {
            s.phase.as_deref() == Some(NodePhase::Invalid.as_str())
                && s.observed_revision.as_deref() == Some("r2")
        })
        .await?;
        ensure!(
            s.reason.as_deref() == Some(NodeReason::FrrUnavailable.as_str()),
            "{s:?}"
        );
        ensure!(
            s.message
                .as_deref()
                .is_some_and(|m| m.contains("VRF red: vni, communities")),
            "{s:?}"
        );
        ensure!(s.last_good_revision.as_deref() == Some("r1"), "{s:?}");
        ensure!(ip(&["-d", "link", "show", "vx.20"])?.contains("vxlan id 1020"));
        wait_event(&client, NodeReason::FrrUnavailable.as_str()).await?;
        agent.stop().await?;
        Ok(())
    });
}

/// The ifindex of link `name` (a link deleted and created again gets a new one).
fn ifindex(name: &str) -> Result<String> {
    let out = ip(&["-o", "link", "show", name])?;
    Ok(out.split(':').next().unwrap_or_default().to_string())
}

/// A node's last good backup is corrupted (edited by hand) while it runs r1: at the next drift tick its
/// agent reports r1 `Invalid/BackupCorrupt`, naming the file and what is wrong, and refuses r2 too,
/// touching nothing — once per revision, not on every watch event or tick. When the admin moves the
/// file aside, r2 is applied in place (the links r1 made stay the same links: nothing was removed first)
/// and reported `Provisioned`.
#[test]
fn a_corrupt_backup_is_reported_once_and_refuses_applies_until_it_is_moved_aside() {
    in_netns(
        "a_corrupt_backup_is_reported_once_and_refuses_applies_until_it_is_moved_aside",
        || async {
            let server = RealApi::start().await?;
            let client = server.admin.clone();
            let mut node = Node::default();
            node.metadata.name = Some("n1".into());
            Api::<Node>::all(client.clone())
                .create(&PostParams::default(), &node)
                .await?;
            let nncs: Api<NodeNetworkConfig> = Api::all(client.clone());
            nncs.create(
                &PostParams::default(),
                &NodeNetworkConfig::new("n1", spec("r1", 0, good())),
            )
            .await?;
            let dir = tempfile::tempdir()?;
            let health = dir.path().join("health.yaml");
            std::fs::write(
                &health,
                "interfaces: [\"lo\"]\nsettleSeconds: 0\ndeadlineSeconds: 2\n",
            )?;
            let backup = dir
                .path()
                .join("state")
                .join(netwave_agent::backup::LAST_GOOD_FILE);
            let agent = RunningAgent::start(
                agent_args(dir.path(), health, 19105)?,
                server.agent_client().await?,
            );
            wait_status(&nncs, "r1 Provisioned", |s| {
                s.phase.as_deref() == Some(NodePhase::Provisioned.as_str())
                    && s.observed_revision.as_deref() == Some("r1")
            })
            .await?;
            let (bridge, vxlan) = (ifindex("l2.10")?, ifindex("vx.10")?);

            let text = std::fs::read_to_string(&backup)?;
            std::fs::write(&backup, text.replace("198.18.10.1/24", "198.18.99.1/24"))?;
            let s = wait_status(&nncs, "r1 refused for the corrupt backup", |s| {
                s.reason.as_deref() == Some(node_reasons::BACKUP_CORRUPT)
            })
            .await?;
            let message = s.message.clone().unwrap_or_default();
            ensure!(
                s.phase.as_deref() == Some(NodePhase::Invalid.as_str())
                    && s.observed_revision.as_deref() == Some("r1")
                    && message.contains(&backup.display().to_string())
                    && message.contains("checksum")
                    && message.contains("move the file aside"),
                "{s:?}"
            );
            wait_event(&client, node_reasons::BACKUP_CORRUPT).await?;
            eprintln!("status message: {message}");

            // r2 (another MTU) is refused too; the kernel keeps running r1.
            let mut r2 = good();
            r2.layer2s[0].mtu = 1400;
            let patch = json!({ "spec": spec("r2", 0, r2) });
            nncs.patch("n1", &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            wait_status(&nncs, "r2 refused for the corrupt backup", |s| {
                s.reason.as_deref() == Some(node_reasons::BACKUP_CORRUPT)
                    && s.observed_revision.as_deref() == Some("r2")
            })
            .await?;
            ensure!(ip(&["link", "show", "l2.10"])?.contains("mtu 1450"));
            ensure!(!ip(&["addr", "show", "l2.10"])?.contains("198.18.99.1"));
            // Watch events do not make it report (or apply) again.
            for i in 0..3 {
                let patch = json!({ "metadata": { "annotations": { "touch": i.to_string() } } });
                nncs.patch("n1", &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }

            // The admin moves the file aside: r2 is applied as on a node without a last good config,
            // in place.
            std::fs::rename(&backup, backup.with_extension("json.corrupt"))?;
            let s = wait_status(&nncs, "r2 Provisioned after the repair", |s| {
                s.phase.as_deref() == Some(NodePhase::Provisioned.as_str())
                    && s.observed_revision.as_deref() == Some("r2")
            })
            .await?;
            ensure!(s.last_good_revision.as_deref() == Some("r2"), "{s:?}");
            ensure!(ip(&["link", "show", "l2.10"])?.contains("mtu 1400"));
            ensure!(
                (ifindex("l2.10")?, ifindex("vx.10")?) == (bridge, vxlan),
                "the repair removed and recreated r1's links"
            );
            ensure!(backup.is_file(), "r2 backed up afresh");
            let refusals = r#"netwave_agent_applies_total{phase="Invalid",reason="BackupCorrupt"}"#;
            ensure!(
                metric(&metrics_at(19105).await?, refusals) == 2.0,
                "one report per revision"
            );
            agent.stop().await?;
            Ok(())
        },
    );
}

/// #46, the whole agent on the real API server with its deployed identity: a new agent whose rendering
/// of the running config cuts a probe target is stopped at start. The node is back on what it ran (no
/// blackhole route), its config still reads `Provisioned` for r1 (no verdict on the revision), `/readyz`
/// answers 503 saying why (a DaemonSet rolling update stops here), the metric the alert reads is 1 and
/// the Event names the probe. The previous agent (the way back) is ready at once and writes nothing; an
/// agent with a benign rendering change passes the gate and says so.
#[test]
fn a_new_agent_whose_rendering_fails_the_gate_stays_unready_and_the_node_keeps_what_it_ran() {
    in_netns("a_new_agent_whose_rendering_fails_the_gate", || async {
        let peer = common::PeerNs::wired("198.18.8.1/24", "198.18.8.2/24")?;
        let _listener = peer.run(|| Ok(std::net::TcpListener::bind("198.18.8.2:179")?))?;
        let server = RealApi::start().await?;
        let client = server.admin.clone();
        let mut node = Node::default();
        node.metadata.name = Some("n1".into());
        Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &node)
            .await?;
        let nncs: Api<NodeNetworkConfig> = Api::all(client.clone());
        nncs.create(
            &PostParams::default(),
            &NodeNetworkConfig::new("n1", spec("r1", 0, good())),
        )
        .await?;
        let dir = tempfile::tempdir()?;
        let health = dir.path().join("health.yaml");
        std::fs::write(
            &health,
            "tcp: [\"198.18.8.2:179\"]\nsettleSeconds: 0\ndeadlineSeconds: 2\n\
             attemptTimeoutSeconds: 0.5\n",
        )?;
        // Each agent on its own ports: a stopped agent's endpoints stay bound in this process.
        let args = |port: u16, drill: Option<&str>| -> Result<Args> {
            let mut a = agent_args(dir.path(), health.clone(), port)?;
            a.rendering_drill = drill
                .map(netwave_agent::drill::Drill::parse)
                .transpose()
                .map_err(anyhow::Error::msg)?;
            Ok(a)
        };
        let readyz = async |port: u16| http_get(port + 1, "/readyz").await;
        let provisioned_r1 = |s: &NodeNetworkConfigStatus| {
            s.phase.as_deref() == Some(NodePhase::Provisioned.as_str())
                && s.observed_revision.as_deref() == Some("r1")
        };

        let old = RunningAgent::start(args(19097, None)?, server.agent_client().await?);
        wait_status(&nncs, "r1 Provisioned", provisioned_r1).await?;
        old.stop().await?;
        let ran = ip(&["-4", "route", "show", "table", "all"])?;

        let bad = RunningAgent::start(
            args(19100, Some("blackhole:198.18.8.2/32"))?,
            server.agent_client().await?,
        );
        wait_event(&client, "AgentUpgradeRefused").await?;
        let (code, body) = readyz(19100).await?;
        ensure!(
            code == 503 && body.contains("upgrade refused") && body.contains("198.18.8.2:179"),
            "{code} {body}"
        );
        ensure!(metric(&metrics_at(19100).await?, "netwave_agent_upgrade_refused") == 1.0);
        let now = ip(&["-4", "route", "show", "table", "all"])?;
        ensure!(
            now == ran,
            "the node is back on the routes it ran:\n{ran}\nnow:\n{now}"
        );
        let s = nncs.get("n1").await?.status.unwrap_or_default();
        ensure!(provisioned_r1(&s), "no verdict on r1: {s:?}");
        // A revision assigned to the refused agent meanwhile: its failure says it may be the agent's.
        let mut r2 = good();
        r2.layer2s[0].mtu = 1400;
        let patch = json!({ "spec": spec("r2", 0, r2) });
        nncs.patch("n1", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        let s = wait_status(&nncs, "r2 judged", |s| {
            s.observed_revision.as_deref() == Some("r2")
                && s.phase.as_deref() == Some(NodePhase::Invalid.as_str())
        })
        .await?;
        let message = s.message.unwrap_or_default();
        ensure!(
            message.contains("may be the agent's, not the revision's"),
            "{message}"
        );
        bad.stop().await?;

        // The way back: the previous agent finds its own rendering and is ready.
        let back = RunningAgent::start(args(19103, None)?, server.agent_client().await?);
        until("the previous agent ready", WAIT, async || {
            // Refused until it binds its endpoints.
            Ok(match readyz(19103).await {
                Ok((200, _)) => Ok(()),
                Ok((code, body)) => Err(format!("{code} {body}")),
                Err(e) => Err(e.to_string()),
            })
        })
        .await?;
        ensure!(metric(&metrics_at(19103).await?, "netwave_agent_upgrade_refused") == 0.0);
        ensure!(ip(&["-4", "route", "show", "table", "all"])? == ran);
        back.stop().await?;

        // A benign rendering change passes the gate.
        let new = RunningAgent::start(
            args(19106, Some("blackhole:198.19.255.0/24"))?,
            server.agent_client().await?,
        );
        wait_event(&client, "AgentUpgradeApplied").await?;
        until("the new agent ready", WAIT, async || {
            // Refused until it binds its endpoints.
            Ok(match readyz(19106).await {
                Ok((200, _)) => Ok(()),
                Ok((code, body)) => Err(format!("{code} {body}")),
                Err(e) => Err(e.to_string()),
            })
        })
        .await?;
        ensure!(ip(&["route", "show", "table", "main"])?.contains("blackhole 198.19.255.0/24"));
        ensure!(
            metric(
                &metrics_at(19106).await?,
                "netwave_agent_upgrade_applies_total"
            ) == 1.0
        );
        new.stop().await?;
        Ok(())
    });
}

/// #46, the skew contract's last line, on the real API server: the CRDs of a newer release have a
/// field this agent does not know, and a newer configurator wrote it. The agent applies nothing, not
/// even the part it understands, and reports `Invalid` with `UnknownField`, naming the field and its
/// own version (its own decode drops the field, so the config no longer hashes to its configHash;
/// the object as the API server has it says why).
#[test]
fn an_agent_refuses_a_config_with_a_field_it_does_not_know_and_names_it() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    in_netns(
        "an_agent_refuses_a_config_with_a_field_it_does_not_know",
        || async {
            let server = RealApi::start().await?;
            let client = server.admin.clone();
            let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
            let name = "nodenetworkconfigs.netwave.dev";
            let original = crds.get(name).await?;
            // The next release's CRD: one more (optional) field in a node's config.
            let mut newer = serde_json::to_value(&original)?;
            newer["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
                ["config"]["properties"]["futureField"] = json!({ "type": "string" });
            let newer: CustomResourceDefinition = serde_json::from_value(newer)?;
            crds.replace(name, &PostParams::default(), &newer).await?;

            let mut node = Node::default();
            node.metadata.name = Some("n1".into());
            Api::<Node>::all(client.clone())
                .create(&PostParams::default(), &node)
                .await?;
            // As the newer configurator writes it: the field in the config, and in the hash.
            let mut config = serde_json::to_value(good())?;
            config["futureField"] = json!("on");
            let hash = netwave_core::render::config_hash(&good()) + "-with-futureField";
            let object = json!({
                "apiVersion": "netwave.dev/v1alpha1",
                "kind": "NodeNetworkConfig",
                "metadata": { "name": "n1" },
                "spec": { "revision": "r1", "sequence": 1, "configHash": hash, "retry": 0, "config": config },
            });
            let resource = kube::api::ApiResource::erase::<NodeNetworkConfig>(&());
            let dynamic: Api<kube::api::DynamicObject> = Api::all_with(client.clone(), &resource);
            dynamic
                .create(&PostParams::default(), &serde_json::from_value(object)?)
                .await?;

            let dir = tempfile::tempdir()?;
            let health = dir.path().join("health.yaml");
            std::fs::write(&health, "settleSeconds: 0\ndeadlineSeconds: 2\n")?;
            let agent = RunningAgent::start(
                agent_args(dir.path(), health, 19109)?,
                server.agent_client().await?,
            );
            let nncs: Api<NodeNetworkConfig> = Api::all(client.clone());
            let s = wait_status(&nncs, "r1 refused for its unknown field", |s| {
                s.reason.as_deref() == Some(NodeReason::UnknownField.as_str())
            })
            .await?;
            let message = s.message.clone().unwrap_or_default();
            ensure!(
                s.phase.as_deref() == Some(NodePhase::Invalid.as_str())
                    && message.contains("spec.config.futureField")
                    && message.contains(&format!("agent {}", env!("CARGO_PKG_VERSION"))),
                "{s:?}"
            );
            ensure!(
                !ip(&["-o", "link", "show"])?.contains("vx.10"),
                "nothing of the config was applied"
            );
            agent.stop().await?;
            // The pooled server's CRD as the next test expects it.
            let mut back = crds.get(name).await?;
            back.spec = original.spec;
            crds.replace(name, &PostParams::default(), &back).await?;
            Ok(())
        },
    );
}
