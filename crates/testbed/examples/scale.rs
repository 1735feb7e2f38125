//! Scale benchmark: 5,000 Nodes + 5,000 NodeNetworkConfigs with 20 watchers open.
//!
//! `cargo run --release -p netwave-testbed --example scale`
//!
//! The server runs in a child process (this binary re-executed with `--serve`) so its memory and
//! CPU time are measured alone, from /proc. Prints RSS and CPU per phase and request latencies
//! (p50/p99) for creates, gets, status patches and watch fan-out.

use netwave_api::vocab::NodePhase;
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use netwave_api::{
    Layer2Config, NodeConfig, NodeNetworkConfig, NodeNetworkConfigSpec, RouteConfig, VrfConfig,
};
use netwave_testbed::{Testbed, TestbedOptions};

const NODES: usize = 5_000;
const WATCHERS: usize = 20;
const CONCURRENCY: usize = 32;

fn node_config(i: usize) -> NodeConfig {
    let vrfs = (0..4)
        .map(|v| VrfConfig {
            aggregate: vec![format!("10.{v}.0.0/16")],
            communities: vec!["65188:100".into()],
            ..VrfConfig::named(&format!("vrf{v}"))
                .with_table(2000 + v as u32)
                .with_l3_vni(2_000_000 + v as u32)
                .with_route_target(&format!("65188:{v}"))
        })
        .collect();
    let layer2s = (0..12)
        .map(|l| {
            Layer2Config::segment(100 + l as u16, 1_000_100 + l as u32)
                .with_anycast(
                    "02:00:00:00:00:01",
                    &[format!("10.250.{l}.1/24"), format!("fd00:250:{l}::1/64")],
                )
                .with_vrf(Some(&format!("vrf{}", l % 4)))
                .with_neigh_suppression(true)
        })
        .collect();
    let routes = (0..8)
        .map(|r| -> RouteConfig {
            serde_json::from_value(serde_json::json!({"table": 2000 + r, "prefix": format!("10.{r}.{}.0/24", i % 250), "via": "10.0.0.1"})).unwrap()
        })
        .collect();
    NodeConfig {
        bgp_peers: Vec::new(),
        mirror_tunnels: Vec::new(),
        mirrors: Vec::new(),
        underlay: None,
        vrfs,
        layer2s,
        routes,
        rules: Vec::new(),
    }
}

fn proc_stats(pid: u32) -> (u64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    // utime and stime are fields 14 and 15 (1-based), i.e. 11 and 12 after the `)`.
    let ticks: u64 = fields
        .get(11)
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        + fields
            .get(12)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    (rss_kb, ticks as f64 / clock_ticks())
}

fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

struct Phase {
    pid: u32,
    last_cpu: f64,
}

impl Phase {
    fn report(&mut self, name: &str, wall: Duration) {
        let (rss, cpu) = proc_stats(self.pid);
        println!(
            "{name:<38} wall {:>7.2}s  server CPU {:>6.2}s  server RSS {:>7.1} MiB",
            wall.as_secs_f64(),
            cpu - self.last_cpu,
            rss as f64 / 1024.0
        );
        self.last_cpu = cpu;
    }
}

fn percentiles(mut v: Vec<Duration>) -> String {
    v.sort();
    let p = |q: f64| v[((v.len() as f64 - 1.0) * q) as usize].as_secs_f64() * 1000.0;
    format!(
        "p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms  (n={})",
        p(0.5),
        p(0.99),
        p(1.0),
        v.len()
    )
}

async fn serve() -> anyhow::Result<()> {
    let crds: Vec<_> = netwave_api::crds().into_iter().map(|(_, c)| c).collect();
    let tb = Testbed::start(TestbedOptions::default().with_crds(crds)).await?;
    println!("{}", tb.url());
    // Serve until the parent closes our stdin (or ^C), then clean up (the kubeconfig's temp dir).
    let mut stdin = tokio::io::stdin();
    let mut buf = [0u8; 64];
    tokio::select! {
        _ = async { while tokio::io::AsyncReadExt::read(&mut stdin, &mut buf).await.is_ok_and(|n| n > 0) {} } => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tb.shutdown().await;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if std::env::args().any(|a| a == "--serve") {
        return serve().await;
    }
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .arg("--serve")
        .stdout(std::process::Stdio::piped())
        .stdin(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().expect("child runs");
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(
        child.stdout.take().expect("piped"),
    ));
    let url = lines.next_line().await?.expect("server prints its URL");
    let mut cfg = kube::Config::new(url.parse()?);
    cfg.default_namespace = "default".into();
    let client = kube::Client::try_from(cfg)?;
    let mut phase = Phase { pid, last_cpu: 0.0 };
    phase.report("started (netwave CRDs installed)", Duration::ZERO);
    let (base_rss_kb, _) = proc_stats(pid);

    let nodes: Api<Node> = Api::all(client.clone());
    let nncs: Api<NodeNetworkConfig> = Api::all(client.clone());
    let mut create_lat = Vec::with_capacity(2 * NODES);
    let wall = Instant::now();
    let results: Vec<Duration> = stream::iter(0..NODES)
        .map(|i| {
            let nodes = nodes.clone();
            let nncs = nncs.clone();
            async move {
                let mut n = Node::default();
                n.metadata.name = Some(format!("node-{i:05}"));
                n.metadata.labels =
                    Some([("netwave.dev/pool".to_string(), format!("pool-{}", i % 8))].into());
                let t = Instant::now();
                nodes
                    .create(&PostParams::default(), &n)
                    .await
                    .expect("create node");
                let a = t.elapsed();
                let obj = NodeNetworkConfig::new(
                    &format!("node-{i:05}"),
                    NodeNetworkConfigSpec {
                        revision: "rev-1".into(),
                        sequence: 1,
                        config_hash: format!("{i:064x}"),
                        retry: 0,
                        config: node_config(i),
                    },
                );
                let t = Instant::now();
                nncs.create(&PostParams::default(), &obj)
                    .await
                    .expect("create nnc");
                [a, t.elapsed()]
            }
        })
        .buffer_unordered(CONCURRENCY)
        .flat_map(stream::iter)
        .collect()
        .await;
    create_lat.extend(results);
    phase.report("created 5,000 Nodes + 5,000 NNCs", wall.elapsed());
    println!("  create latency: {}", percentiles(create_lat));
    let nnc_bytes = serde_json::to_vec(&nncs.get("node-00000").await?)?.len();
    let node_bytes = serde_json::to_vec(&nodes.get("node-00000").await?)?.len();
    let (rss_kb, _) = proc_stats(pid);
    let grown = (rss_kb.saturating_sub(base_rss_kb) * 1024) as f64;
    let json_total = ((nnc_bytes + node_bytes) * NODES) as f64;
    println!(
        "  objects are {nnc_bytes} (NNC) + {node_bytes} (Node) bytes of JSON; server RSS grew {:.2}x their total JSON size",
        grown / json_total
    );

    // 20 watchers: 10 on Nodes, 10 on NodeNetworkConfigs, each listing in pages of 500.
    let wall = Instant::now();
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let mut tasks = Vec::new();
    for w in 0..WATCHERS {
        let ready = ready_tx.clone();
        let seen = seen_tx.clone();
        if w % 2 == 0 {
            let s = watcher(nodes.clone(), watcher::Config::default());
            tasks.push(tokio::spawn(async move {
                let mut s = s.boxed();
                while let Some(ev) = s.next().await {
                    if matches!(ev, Ok(watcher::Event::InitDone)) {
                        let _ = ready.send(());
                    }
                }
            }));
        } else {
            let s = watcher(nncs.clone(), watcher::Config::default());
            tasks.push(tokio::spawn(async move {
                let mut s = s.boxed();
                while let Some(ev) = s.next().await {
                    match ev {
                        Ok(watcher::Event::InitDone) => {
                            let _ = ready.send(());
                        }
                        Ok(watcher::Event::Apply(_)) => {
                            let _ = seen.send(Instant::now());
                        }
                        _ => {}
                    }
                }
            }));
        }
    }
    for _ in 0..WATCHERS {
        ready_rx.recv().await;
    }
    phase.report("20 watchers listed (pages of 500)", wall.elapsed());

    // Status patches fan out to the 10 NNC watchers.
    let patches = 1_000;
    let wall = Instant::now();
    let lat: Vec<Duration> = stream::iter(0..patches)
        .map(|i| {
            let nncs = nncs.clone();
            async move {
                let body = serde_json::json!({"status": {"phase": NodePhase::Provisioned.as_str(), "observedRevision": "rev-1", "configHash": format!("{i:064x}")}});
                let t = Instant::now();
                nncs.patch_status(&format!("node-{i:05}"), &PatchParams::default(), &Patch::Merge(body)).await.expect("patch status");
                t.elapsed()
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let patched = Instant::now();
    let want = patches * WATCHERS / 2;
    let mut last = patched;
    for _ in 0..want {
        last = seen_rx.recv().await.expect("watch events");
    }
    phase.report("1,000 status patches, 10 watchers each", wall.elapsed());
    println!("  patch latency: {}", percentiles(lat));
    println!(
        "  all {want} watch events delivered {:.1} ms after the last patch returned",
        last.saturating_duration_since(patched).as_secs_f64() * 1000.0
    );

    let wall = Instant::now();
    let lat: Vec<Duration> = stream::iter(0..2_000)
        .map(|i| {
            let nncs = nncs.clone();
            async move {
                let t = Instant::now();
                nncs.get(&format!("node-{:05}", (i * 7) % NODES))
                    .await
                    .expect("get");
                t.elapsed()
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    phase.report("2,000 gets (8 concurrent)", wall.elapsed());
    println!("  get latency: {}", percentiles(lat));

    let wall = Instant::now();
    let t = Instant::now();
    let l = nncs
        .list(&ListParams::default().labels("missing-label"))
        .await?;
    let selective = t.elapsed();
    let t = Instant::now();
    let all = nncs.list(&ListParams::default()).await?;
    let full = t.elapsed();
    phase.report("list all NNCs / filtered list", wall.elapsed());
    println!(
        "  full list of {} NNCs: {:.1} ms; label-filtered list ({} hits): {:.1} ms",
        all.items.len(),
        full.as_secs_f64() * 1000.0,
        l.items.len(),
        selective.as_secs_f64() * 1000.0
    );
    for t in tasks {
        t.abort();
    }
    drop(child.stdin.take());
    child.wait().await?;
    Ok(())
}
