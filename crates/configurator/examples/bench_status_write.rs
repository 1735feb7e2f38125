//! What one NodeNetworkConfig status write costs kube-apiserver (#28, "patch vs apply"): server-side
//! apply (as the agent writes its status) against a JSON merge patch of the same fields, each on its
//! own N node configs (ownership never changes hands), 32 writes in flight, three rounds each, with no
//! watch open and then with three (as the two configurators' and the agents' watches); CPU of
//! kube-apiserver and etcd per write from /proc. No audit log (bench_fleet's costs some more).
//!
//! `BENCH_NNC_SPEC=nnc.json cargo run --release -p netwave-configurator --example bench_status_write [N]`
//! (default 1000 per kind of write). `nnc.json` is a NodeNetworkConfig as the API returns it, whose
//! spec every node config gets: e.g. one of a `bench_fleet` fleet (`GET
//! /apis/netwave.dev/v1alpha1/nodenetworkconfigs/node-5` on its server, about 3.9 KB of spec with the
//! samples).

use std::time::Instant;

use anyhow::{Context, Result};
use futures::StreamExt;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use netwave_api::NodeNetworkConfig;
use serde_json::{Value, json};

fn cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = &stat[stat.rfind(')').map_or(0, |p| p + 2)..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    (f[11].parse::<f64>().unwrap_or(0.0) + f[12].parse::<f64>().unwrap_or(0.0)) / 100.0
}

fn status(i: usize, round: usize, phase: &str) -> Value {
    json!({
        "phase": phase,
        "observedRevision": format!("rev-{round}"),
        "observedRetry": 0,
        "observedConfigHash": format!("{:064x}", round),
        "configHash": format!("{:064x}", round + 1000),
        "lastGoodRevision": format!("rev-{}", round.saturating_sub(1)),
        "message": format!("applying revision rev-{round} on node-{i}"),
        "lastTransitionTime": "2026-11-26T07:00:00Z",
        "probes": [],
        "agentVersion": "0.1.0",
    })
}

async fn round(
    api: &Api<NodeNetworkConfig>,
    n: usize,
    r: usize,
    apply: bool,
    pids: (u32, u32),
) -> Result<(f64, f64, f64)> {
    let (a0, e0, t0) = (cpu_s(pids.0), cpu_s(pids.1), Instant::now());
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                // Each kind of write on its own node configs: ownership never changes hands.
                let name = format!("node-{}", if apply { i } else { n + i });
                let st = status(i, r, if r.is_multiple_of(2) { "Provisioning" } else { "Provisioned" });
                if apply {
                    let body = json!({"apiVersion": "netwave.dev/v1alpha1", "kind": "NodeNetworkConfig", "status": st});
                    api.patch_status(&name, &PatchParams::apply("netwave-agent").force(), &Patch::Apply(&body))
                        .await?;
                } else {
                    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&json!({"status": st})))
                        .await?;
                }
                anyhow::Ok(())
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
    Ok((
        (cpu_s(pids.0) - a0) * 1e3 / n as f64,
        (cpu_s(pids.1) - e0) * 1e3 / n as f64,
        t0.elapsed().as_secs_f64(),
    ))
}

#[tokio::main]
async fn main() -> Result<()> {
    let n: usize = std::env::args().nth(1).map_or(Ok(1000), |s| s.parse())?;
    let spec: Value = serde_json::from_str(&std::fs::read_to_string(
        std::env::var("BENCH_NNC_SPEC").context("BENCH_NNC_SPEC: an NNC's JSON")?,
    )?)?;
    let spec = spec["spec"].clone();
    let cp = netwave_control_plane::ControlPlane::start(Default::default()).await?;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crds");
    let out = cp
        .kubectl()
        .args(["apply", "--server-side", "-f"])
        .arg(&dir)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cp
        .kubectl()
        .args([
            "wait",
            "--for=condition=Established",
            "crd",
            "--all",
            "--timeout=60s",
        ])
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let client: Client = cp.client().await?;
    let api: Api<NodeNetworkConfig> = Api::all(client.clone());
    for i in 0..2 * n {
        let o: NodeNetworkConfig = serde_json::from_value(
            json!({"apiVersion": "netwave.dev/v1alpha1", "kind": "NodeNetworkConfig", "metadata": {"name": format!("node-{i}")}, "spec": spec}),
        )?;
        api.create(&PostParams::default(), &o).await?;
    }
    let pids = (
        cp.apiserver_pid().context("apiserver")?,
        cp.etcd_pid().context("etcd")?,
    );
    let mut r = 0;
    for watchers in [0usize, 3] {
        let mut tasks = Vec::new();
        for _ in 0..watchers {
            let c = cp.client().await?;
            tasks.push(tokio::spawn(async move {
                let s = watcher(Api::<NodeNetworkConfig>::all(c), watcher::Config::default())
                    .default_backoff();
                futures::pin_mut!(s);
                while s.next().await.is_some() {}
            }));
        }
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        for rep in 0..3 {
            for apply in [true, false] {
                r += 1;
                let (a, e, wall) = round(&api, n, r, apply, pids).await?;
                println!(
                    "watchers {watchers} rep {rep} {:<11} kube-apiserver {a:6.2} ms/write, etcd {e:5.2} ms/write, {wall:5.1} s for {n}",
                    if apply { "apply" } else { "merge patch" }
                );
            }
        }
        for t in tasks {
            t.abort();
        }
    }
    Ok(())
}
