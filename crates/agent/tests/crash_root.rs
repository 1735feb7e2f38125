//! SIGKILL during an apply: the real `netwave-agent` binary against the real kube-apiserver, with the
//! agent's deployed identity (`real_api`), in a throwaway network namespace (root). After a restart the
//! last good config is restored first. A first interruption is retried (the revision then provisions); a
//! revision interrupted twice is reported `Invalid` (`ApplyInterrupted`), the last good config stays in
//! the kernel and it is not applied again.

mod common;
mod real_api;

use netwave_api::vocab::{NodePhase, NodeReason};
use std::process::{Child, Command};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use common::{in_netns, ip, until};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use netwave_api::{
    Layer2Config, NodeConfig, NodeNetworkConfig, NodeNetworkConfigSpec, NodeNetworkConfigStatus,
};
use real_api::RealApi;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

fn l2(vlan: u16, vni: u32) -> Layer2Config {
    Layer2Config {
        anycast_gateways: vec![format!("198.18.{vlan}.1/24")],
        ..Layer2Config::segment(vlan, vni).with_mtu(1450)
    }
}

fn spec(rev: &str, layer2s: Vec<Layer2Config>) -> NodeNetworkConfigSpec {
    let config = NodeConfig {
        layer2s,
        ..NodeConfig::default()
    };
    NodeNetworkConfigSpec {
        revision: rev.into(),
        sequence: 1,
        config_hash: netwave_core::render::config_hash(&config),
        retry: 0,
        config,
    }
}

/// The agent binary, SIGKILLed on drop (a process this test started, ended by its id).
struct AgentProc(Child);

impl AgentProc {
    fn start(kubeconfig: &std::path::Path, dir: &std::path::Path) -> Result<AgentProc> {
        let child = Command::new(env!("CARGO_BIN_EXE_netwave-agent"))
            .args([
                "--node-name",
                "n1",
                "--log-format",
                "text",
                "--drift-interval",
                "1h",
            ])
            .arg("--state-dir")
            .arg(dir.join("state"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--health-config")
            .arg(dir.join("health.yaml"))
            .args([
                "--metrics-addr",
                "127.0.0.1:0",
                "--health-addr",
                "127.0.0.1:0",
            ])
            .env("RUST_LOG", "warn")
            .spawn()
            .context("starting netwave-agent")?;
        Ok(AgentProc(child))
    }
    fn kill(&mut self) {
        let _ = self.0.kill(); // SIGKILL
        let _ = self.0.wait();
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn status(api: &Api<NodeNetworkConfig>) -> Result<Option<NodeNetworkConfigStatus>> {
    Ok(api.get("n1").await?.status)
}

/// One node `n1`, its agent running r1, and r2 (a VNI change and a new segment) just assigned. The settle
/// delay holds each apply (marker written, kernel changed) long enough to kill it.
struct Scene {
    // Fields drop in this order: the agent process dies before the server goes back to the pool (the next
    // test gets it) and before its state directory is removed.
    agent: Option<AgentProc>,
    server: RealApi,
    dir: tempfile::TempDir,
    kubeconfig: std::path::PathBuf,
    marker: std::path::PathBuf,
}

impl Scene {
    async fn start() -> Result<Scene> {
        let server = RealApi::start().await?;
        // The agent's node, as its kubelet registered it (the agent writes its NetworkReady condition).
        let mut node = Node::default();
        node.metadata.name = Some("n1".into());
        Api::<Node>::all(server.admin.clone())
            .create(&PostParams::default(), &node)
            .await?;
        let nncs: Api<NodeNetworkConfig> = Api::all(server.admin.clone());
        nncs.create(
            &PostParams::default(),
            &NodeNetworkConfig::new("n1", spec("r1", vec![l2(10, 1010)])),
        )
        .await?;
        let dir = tempfile::tempdir()?;
        std::fs::write(
            dir.path().join("health.yaml"),
            "interfaces: [\"lo\"]\napiServer: true\nsettleSeconds: 2\ndeadlineSeconds: 5\n",
        )?;
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_agent_kubeconfig(&kubeconfig).await?;
        let marker = dir.path().join("state/applying.json");
        let mut scene = Scene {
            agent: None,
            server,
            dir,
            kubeconfig,
            marker,
        };
        scene.start_agent()?;
        scene.phase(NodePhase::Provisioned.as_str(), "r1").await?;
        let patch = json!({ "spec": spec("r2", vec![l2(10, 2010), l2(20, 1020)]) });
        nncs.patch("n1", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(scene)
    }

    fn nncs(&self) -> Api<NodeNetworkConfig> {
        Api::all(self.server.admin.clone())
    }

    /// Starts the agent binary (after the previous one is gone).
    fn start_agent(&mut self) -> Result<()> {
        self.kill_agent();
        self.agent = Some(AgentProc::start(&self.kubeconfig, self.dir.path())?);
        Ok(())
    }

    /// SIGKILLs the agent.
    fn kill_agent(&mut self) {
        if let Some(mut a) = self.agent.take() {
            a.kill();
        }
    }

    /// Waits until the agent reports `phase` for `revision`.
    async fn phase(&self, phase: &str, revision: &str) -> Result<NodeNetworkConfigStatus> {
        until(&format!("{revision} {phase}"), WAIT, async || {
            Ok(match status(&self.nncs()).await? {
                Some(s)
                    if s.phase.as_deref() == Some(phase)
                        && s.observed_revision.as_deref() == Some(revision) =>
                {
                    Ok(s)
                }
                s => Err(format!("{s:?}")),
            })
        })
        .await
    }

    /// Waits until r2 is half-applied: marker on disk (carrying `interruptions` earlier ones) and vx.20 in
    /// the kernel.
    async fn half_applied(&self, interruptions: u32) -> Result<()> {
        let want = format!("\"interruptions\":{interruptions}");
        until("r2 half-applied", WAIT, async || {
            let marked = std::fs::read_to_string(&self.marker).is_ok_and(|m| m.contains(&want));
            let vx20 = ip(&["-o", "link", "show"])?.contains("vx.20");
            Ok((marked && vx20)
                .then_some(())
                .ok_or(format!("marker: {marked}, vx.20: {vx20}")))
        })
        .await
    }
}

#[test]
fn sigkill_mid_apply_twice_restores_last_good_and_reports() {
    in_netns(
        "sigkill_mid_apply_twice_restores_last_good_and_reports",
        || async {
            let mut scene = Scene::start().await?;
            scene.half_applied(0).await?;
            scene.kill_agent();
            ensure!(scene.marker.exists(), "marker gone before the kill");
            ensure!(ip(&["-d", "link", "show", "vx.10"])?.contains("vxlan id 2010"));

            // Restart: r1 restored, then r2 applied again (one interruption is not a verdict)... and
            // interrupted again, mid-way through that second attempt.
            scene.start_agent()?;
            scene.half_applied(1).await?;
            scene.kill_agent();

            // Second restart: r1 restored first, r2 reported as interrupted and left alone.
            scene.start_agent()?;
            let s = scene.phase(NodePhase::Invalid.as_str(), "r2").await?;
            ensure!(
                s.reason.as_deref() == Some(NodeReason::ApplyInterrupted.as_str()),
                "{s:?}"
            );
            ensure!(s.last_good_revision.as_deref() == Some("r1"), "{s:?}");
            ensure!(
                s.config_hash.as_deref()
                    == Some(spec("r1", vec![l2(10, 1010)]).config_hash.as_str()),
                "{s:?}"
            );
            ensure!(ip(&["-d", "link", "show", "vx.10"])?.contains("vxlan id 1010"));
            ensure!(!ip(&["-o", "link", "show"])?.contains("vx.20"));
            ensure!(!scene.marker.exists());
            // It stays so until the retry is bumped: the rule is the unit test
            // invalid_revision_is_not_reapplied_until_retry_changes.
            let phase = status(&scene.nncs()).await?.and_then(|s| s.phase);
            ensure!(
                phase.as_deref() == Some(NodePhase::Invalid.as_str()),
                "{phase:?}"
            );
            Ok(())
        },
    );
}

#[test]
fn sigkill_mid_apply_once_then_restart_applies_the_revision() {
    in_netns(
        "sigkill_mid_apply_once_then_restart_applies_the_revision",
        || async {
            let mut scene = Scene::start().await?;
            scene.half_applied(0).await?;
            scene.kill_agent();

            // The restarted agent restores r1, applies r2 again, and r2 provisions: the rollout goes on.
            scene.start_agent()?;
            let s = scene.phase(NodePhase::Provisioned.as_str(), "r2").await?;
            ensure!(s.last_good_revision.as_deref() == Some("r2"), "{s:?}");
            ensure!(ip(&["-d", "link", "show", "vx.10"])?.contains("vxlan id 2010"));
            ensure!(ip(&["-o", "link", "show"])?.contains("vx.20"));
            ensure!(!scene.marker.exists());
            ensure!(!scene.dir.path().join("state/interrupted.json").exists());
            Ok(())
        },
    );
}
