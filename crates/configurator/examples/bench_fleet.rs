//! Fleet rollout benchmark (#14): the real configurator binary (two replicas, leader election on)
//! against the testbed API server (`netwave-testbed`, its own process) with N simulated agents in this
//! process.
//!
//! `cargo build --release -p netwave-configurator -p netwave-testbed --bins &&
//!  cargo run --release -p netwave-configurator --example bench_fleet [N...]` (default N = 1000)
//!
//! ```text
//!  this process: N simulated agents (one NNC watch) ──► status after 1–3 s (seeded) ──┐
//!                  ▲ spec (revision) observed, timestamped                             ▼
//!  netwave-configurator ×2 (Lease) ◄──────────────── netwave-testbed (request counters)
//! ```
//!
//! Each agent answers its NodeNetworkConfig after an apply delay drawn uniformly from 1–3 s; 0.5% of
//! the nodes report `Invalid`, 0.2% never answer. One rollout per size: the samples (first rollout of
//! an empty fleet). (A second rollout, one RoutingTable added, assigned every node but its revision was
//! not seen terminal within minutes: left out until that is understood.) Prints per rollout: wall time
//! (first assignment → last answer, and → revision terminal), the ideal ⌈N / budget⌉ × mean(delay),
//! their ratio, the reaction latency (an agent's status observed → the next assignment observed, both
//! from this process's watch), API requests and writes per node by verb and resource (the testbed's
//! counters; the agents' own status patches and watch included), and peak RSS and CPU seconds of the
//! configurator leader and standby, the testbed and this process (from /proc).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use netwave_agent::reconcile::Reason;
use netwave_agent::sim::{Answer, status_for};
use netwave_api::{NetworkConfigRevision, NodeNetworkConfig};
use serde_json::{Value, json};

const SEED: u64 = 14;
const MAX_UNAVAILABLE_PERCENT: usize = 10;
/// Per mille of nodes whose agent reports `Invalid` / never answers.
const FAIL_PER_MILLE: usize = 5;
const SILENT_PER_MILLE: usize = 2;
const DELAY_MS: (u64, u64) = (1000, 3000);
const APPLY_TIMEOUT_S: u64 = 10;
const LEASE: (&str, &str) = ("netwave-system", "netwave-configurator");

/// SplitMix64: a seeded, dependency-free generator (the figures must be reproducible).
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What node `i` does in rollout `r`: its answer and apply delay.
fn fate(i: usize, n: usize, r: u64) -> (Answer, Duration) {
    let delay = DELAY_MS.0 + mix(SEED ^ ((i as u64) << 8) ^ r) % (DELAY_MS.1 - DELAY_MS.0 + 1);
    // The failing and silent nodes are spread over the fleet (every k-th by a seeded offset).
    let pick = |per_mille: usize, salt: u64| {
        let k = n.div_ceil(per_mille * n / 1000).max(1);
        per_mille * n / 1000 > 0 && (i + mix(SEED ^ salt) as usize % k).is_multiple_of(k)
    };
    let answer = if pick(SILENT_PER_MILLE, 1) {
        Answer::Silent
    } else if pick(FAIL_PER_MILLE, 2) {
        Answer::Invalid {
            reason: Reason::ApplyFailed,
            message: "ApplyFailed: simulated (bench_fleet)".into(),
        }
    } else {
        Answer::Provisioned
    };
    (answer, Duration::from_millis(delay))
}

/// A process this benchmark started; SIGKILLed and reaped on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Peak RSS (MiB) and CPU seconds (user + system) of `pid` from /proc.
fn usage(pid: u32, tick: f64) -> Result<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let hwm_kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("VmHWM missing")?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').context("bad /proc stat")? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let cpu = (f[11].parse::<f64>()? + f[12].parse::<f64>()?) / tick;
    Ok((hwm_kb / 1024.0, cpu))
}

fn clock_tick() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// What this process's watch saw, timestamped on arrival.
#[derive(Default)]
struct Observed {
    /// (when, node, revision): a node's spec got a new (revision, retry).
    assigned: Vec<(Instant, String, String)>,
    /// (when, node, revision, phase): a node's status reported on its current spec.
    reported: Vec<(Instant, String, String, String)>,
    events: u64,
}

/// The simulated agents: one NNC watch; each new (revision, retry) is answered per [`fate`].
fn spawn_agents(
    client: Client,
    n: usize,
    rollout: Arc<Mutex<u64>>,
    seen: Arc<Mutex<Observed>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<NodeNetworkConfig> = Api::all(client);
        let mut specs: BTreeMap<String, (String, u32)> = BTreeMap::new();
        let mut statuses: BTreeMap<String, (String, String)> = BTreeMap::new();
        let stream = watcher(api.clone(), watcher::Config::default()).default_backoff();
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            let now = Instant::now();
            let nnc = match ev {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => o,
                _ => continue,
            };
            let name = nnc.name_any();
            let key = (nnc.spec.revision.clone(), nnc.spec.retry);
            let st = nnc.status.clone().unwrap_or_default();
            let mut obs = seen.lock().unwrap();
            obs.events += 1;
            if let (Some(rev), Some(phase)) = (&st.observed_revision, &st.phase)
                && *rev == key.0
                && statuses.get(&name) != Some(&(rev.clone(), phase.clone()))
            {
                statuses.insert(name.clone(), (rev.clone(), phase.clone()));
                obs.reported
                    .push((now, name.clone(), rev.clone(), phase.clone()));
            }
            if specs.get(&name) == Some(&key) {
                continue;
            }
            specs.insert(name.clone(), key.clone());
            obs.assigned.push((now, name.clone(), key.0.clone()));
            drop(obs);
            let i: usize = name
                .rsplit('-')
                .next()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            let (answer, delay) = fate(i, n, *rollout.lock().unwrap());
            let api = api.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let Some(body) = status_for(&nnc, &answer) else {
                    return;
                };
                let params = PatchParams::apply(netwave_agent::shell::FIELD_MANAGER).force();
                for _ in 0..100 {
                    match api.patch_status(&name, &params, &Patch::Apply(&body)).await {
                        Ok(_) => break,
                        Err(kube::Error::Api(ae)) if ae.code == 404 => break,
                        Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                }
            });
        }
    })
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `target/<profile>/` of this example (it lives in `examples/` under it).
fn bin_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .context("example has no target dir")?;
    for b in ["netwave-testbed", "netwave-configurator"] {
        if !dir.join(b).exists() {
            bail!(
                "{} is missing: build it first with `cargo build --release -p netwave-configurator -p netwave-testbed --bins`",
                dir.join(b).display()
            );
        }
    }
    Ok(dir.to_path_buf())
}

async fn start_testbed(bins: &Path, dir: &Path) -> Result<(Proc, Client)> {
    let kubeconfig = dir.join("kubeconfig");
    let mut child = Command::new(bins.join("netwave-testbed"))
        .args(["--bind", "127.0.0.1", "--port", "0", "--kubeconfig"])
        .arg(&kubeconfig)
        .arg("--crds")
        .arg(workspace_root().join("crds"))
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(dir.join("testbed.log"))?))
        .stdin(Stdio::null())
        .spawn()
        .context("starting netwave-testbed")?;
    let stdout = child.stdout.take().context("testbed stdout")?;
    let p = Proc(child);
    let url = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    })
    .await??;
    if url.trim().is_empty() {
        bail!(
            "testbed printed no URL (see {})",
            dir.join("testbed.log").display()
        );
    }
    let kc = Kubeconfig::read_from(&kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok((p, Client::try_from(config)?))
}

fn start_configurator(bins: &Path, dir: &Path, i: usize, max_failures: usize) -> Result<Proc> {
    let identity = format!("configurator-{i}");
    let log = std::fs::File::create(dir.join(format!("{identity}.log")))?;
    let port = || -> Result<String> {
        Ok(std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .to_string())
    };
    let child = Command::new(bins.join("netwave-configurator"))
        .arg("--kubeconfig")
        .arg(dir.join("kubeconfig"))
        .args(["--lease-namespace", LEASE.0, "--lease-name", LEASE.1])
        .args(["--identity", &identity])
        .args(["--lease-duration", "3s", "--renew-deadline", "2s"])
        .args(["--retry-period", "300ms", "--input-settle", "500ms"])
        .args(["--max-unavailable", &format!("{MAX_UNAVAILABLE_PERCENT}%")])
        .args(["--max-failures", &max_failures.to_string()])
        .args(["--apply-timeout", &format!("{APPLY_TIMEOUT_S}s")])
        .args(["--metrics-addr", &port()?])
        .args(["--health-addr", &port()?])
        .args(["--log-format", "text"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::from(log.try_clone()?))
        .stderr(Stdio::from(log))
        .stdin(Stdio::null())
        .spawn()
        .context("starting netwave-configurator")?;
    Ok(Proc(child))
}

async fn admin(client: &Client, method: &str, path: &str) -> Result<String> {
    let req = axum::http::Request::builder()
        .method(method)
        .uri(path)
        .body(Vec::new())?;
    Ok(client.request_text(req).await?)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

struct Run<'a> {
    client: &'a Client,
    n: usize,
    seen: &'a Arc<Mutex<Observed>>,
    rollout: &'a Arc<Mutex<u64>>,
    pids: [(String, u32); 4],
    tick: f64,
}

impl Run<'_> {
    /// Triggers a change with `trigger`, waits for its revision to finish, prints the figures.
    async fn measure(&self, label: &str, r: u64, trigger: Value) -> Result<()> {
        *self.rollout.lock().unwrap() = r;
        let revs: Api<NetworkConfigRevision> = Api::all(self.client.clone());
        let before = revs.list(&ListParams::default()).await?.items.len();
        let mark = {
            let o = self.seen.lock().unwrap();
            (o.assigned.len(), o.reported.len(), o.events)
        };
        admin(self.client, "DELETE", "/testbed/counters").await?;
        let cpu0 = self.cpu()?;
        let kind = trigger["kind"].as_str().unwrap_or_default().to_string();
        match kind.as_str() {
            "RoutingTable" => {
                Api::<netwave_api::RoutingTable>::all(self.client.clone())
                    .create(&PostParams::default(), &serde_json::from_value(trigger)?)
                    .await?;
            }
            _ => {
                for m in netwave_api::manifest::samples()? {
                    use netwave_api::manifest::Manifest;
                    let pp = PostParams::default();
                    match m {
                        Manifest::Vrf(o) => {
                            drop(Api::all(self.client.clone()).create(&pp, &o).await?)
                        }
                        Manifest::Layer2(o) => {
                            drop(Api::all(self.client.clone()).create(&pp, &o).await?)
                        }
                        Manifest::RoutingTable(o) => {
                            drop(Api::all(self.client.clone()).create(&pp, &o).await?)
                        }
                        _ => {}
                    }
                }
            }
        }
        let started = Instant::now();
        // The newest revision, once terminal (Complete or Failed, or nothing left in flight or queued), or
        // 10 minutes.
        let (rev, done) = loop {
            let mut list = revs.list(&ListParams::default()).await?.items;
            list.sort_by_key(|r| r.spec.sequence);
            if list.len() > before
                && let Some(last) = list.last()
                && let Some(st) = &last.status
                && (matches!(st.phase.as_deref(), Some("Complete" | "Failed"))
                    || (st.in_progress == 0 && st.queued == 0 && st.updated > 0))
            {
                break (last.clone(), Instant::now());
            }
            if started.elapsed() > Duration::from_secs(600) {
                bail!("{label}: no terminal revision after 10 minutes");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let counts: BTreeMap<String, u64> =
            serde_json::from_str(&admin(self.client, "GET", "/testbed/counters").await?)?;
        let cpu1 = self.cpu()?;
        let name = rev.name_any();
        let st = rev.status.clone().unwrap_or_default();
        let o = self.seen.lock().unwrap();
        let assigned: Vec<Instant> = o.assigned[mark.0..]
            .iter()
            .filter(|a| a.2 == name)
            .map(|a| a.0)
            .collect();
        let reported: Vec<(Instant, &str)> = o.reported[mark.1..]
            .iter()
            .filter(|a| a.2 == name)
            .map(|a| (a.0, a.3.as_str()))
            .collect();
        let (Some(&first), Some(&last_assigned)) = (assigned.first(), assigned.last()) else {
            bail!("{label}: revision {name} was assigned to no node");
        };
        let last_answer = reported.iter().map(|r| r.0).max().unwrap_or(first);
        // Reaction: each status observed while nodes still wait → the next assignment observed.
        let mut reaction: Vec<Duration> = reported
            .iter()
            .filter(|r| r.0 < last_assigned)
            .filter_map(|r| assigned.iter().find(|a| **a >= r.0).map(|a| *a - r.0))
            .collect();
        reaction.sort();
        let budget = (self.n * MAX_UNAVAILABLE_PERCENT / 100).max(1);
        let mean_delay = (DELAY_MS.0 + DELAY_MS.1) as f64 / 2000.0;
        let ideal = self.n.div_ceil(budget) as f64 * mean_delay;
        let wall = (last_answer - first).as_secs_f64();
        let wall_done = (done - first).as_secs_f64();
        let n = self.n as f64;
        println!(
            "\n== {label}: N={} maxUnavailable {MAX_UNAVAILABLE_PERCENT}% (budget {budget}), revision {name} {}: \
             updated {} failed {} of {}",
            self.n,
            st.phase.as_deref().unwrap_or("?"),
            st.updated,
            st.failed,
            st.total
        );
        println!(
            "wall: first assignment -> last answer {wall:.1} s, -> revision {} {wall_done:.1} s \
             (silent nodes wait out applyTimeout {APPLY_TIMEOUT_S} s); input -> first assignment {:.2} s",
            st.phase.as_deref().unwrap_or("?"),
            (first - started).as_secs_f64()
        );
        println!(
            "ideal: ceil({}/{budget}) x {mean_delay:.1} s = {ideal:.1} s; ratio {:.3} (to last answer), {:.3} (to terminal)",
            self.n,
            wall / ideal,
            wall_done / ideal
        );
        println!(
            "reaction (status observed -> next assignment observed, {} samples): median {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            reaction.len(),
            percentile(&reaction, 0.5).as_secs_f64() * 1e3,
            percentile(&reaction, 0.99).as_secs_f64() * 1e3,
            reaction.last().copied().unwrap_or_default().as_secs_f64() * 1e3
        );
        println!(
            "watch events received by the agents' watch: {} ({:.2} per node)",
            o.events - mark.2,
            (o.events - mark.2) as f64 / n
        );
        drop(o);
        let writes = ["create", "update", "patch", "delete", "deletecollection"];
        let total: u64 = counts.values().sum();
        let written: u64 = counts
            .iter()
            .filter(|(k, _)| writes.iter().any(|w| k.starts_with(&format!("{w} "))))
            .map(|(_, v)| v)
            .sum();
        println!(
            "API requests {total} ({:.2}/node), writes {written} ({:.2}/node; the agents' status patches are 1/node of them):",
            total as f64 / n,
            written as f64 / n
        );
        for (k, v) in &counts {
            println!("  {k:<40} {v:>8} {:>8.3}/node", *v as f64 / n);
        }
        for ((who, rss, cpu), (_, _, cpu_before)) in cpu1.iter().zip(&cpu0) {
            println!(
                "  {who:<28} peak RSS {rss:>7.1} MiB, CPU {:>6.2} s this rollout",
                cpu - cpu_before
            );
        }
        Ok(())
    }

    /// (who, peak RSS MiB, CPU s) of the configurator leader and standby, the testbed and this process.
    fn cpu(&self) -> Result<Vec<(String, f64, f64)>> {
        self.pids
            .iter()
            .map(|(who, pid)| {
                let (rss, cpu) = usage(*pid, self.tick)?;
                Ok((who.clone(), rss, cpu))
            })
            .collect()
    }
}

async fn bench(bins: &Path, n: usize) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("netwave-bench-fleet-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let (testbed, client) = start_testbed(bins, &dir).await?;
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": LEASE.0}}))?,
        )
        .await?;
    let setup = Instant::now();
    let nodes = Api::<Node>::all(client.clone());
    futures::stream::iter(0..n)
        .map(|i| {
            let nodes = nodes.clone();
            async move {
                let name = format!("node-{i}");
                let pool = if i % 2 == 0 { "compute" } else { "storage" };
                let node: Node = serde_json::from_value(json!({
                    "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "netwave.dev/pool": pool}},
                    "spec": {},
                }))?;
                nodes.create(&PostParams::default(), &node).await?;
                let status = json!({"status": {
                    "conditions": [{"type": "Ready", "status": "True"}],
                    "addresses": [{"type": "InternalIP", "address": format!("198.18.{}.{}", i / 250, i % 250 + 1)}],
                }});
                nodes
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
                    .await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
    let seen: Arc<Mutex<Observed>> = Arc::default();
    let rollout = Arc::new(Mutex::new(0));
    let agents = spawn_agents(client.clone(), n, rollout.clone(), seen.clone());
    let silent = (0..n)
        .filter(|&i| fate(i, n, 0).0 == Answer::Silent)
        .count();
    let failing = (0..n)
        .filter(|&i| matches!(fate(i, n, 0).0, Answer::Invalid { .. }))
        .count();
    let max_failures = 2 * (silent + failing) + 1;
    let c0 = start_configurator(bins, &dir, 0, max_failures)?;
    let c1 = start_configurator(bins, &dir, 1, max_failures)?;
    // The leader, once elected.
    let leases = Api::<Lease>::namespaced(client.clone(), LEASE.0);
    let leader = loop {
        if let Some(h) = leases
            .get_opt(LEASE.1)
            .await?
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty())
        {
            break h;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (lp, sp) = if leader == "configurator-0" {
        (c0.0.id(), c1.0.id())
    } else {
        (c1.0.id(), c0.0.id())
    };
    println!(
        "\n#### fleet rollout benchmark: N={n}, {silent} silent and {failing} failing agents, \
         apply delay uniform {}-{} ms (seed {SEED}), maxFailures {max_failures}; setup {:.1} s; logs in {}",
        DELAY_MS.0,
        DELAY_MS.1,
        setup.elapsed().as_secs_f64(),
        dir.display()
    );
    let run = Run {
        client: &client,
        n,
        seen: &seen,
        rollout: &rollout,
        pids: [
            (format!("configurator leader ({leader})"), lp),
            ("configurator standby".into(), sp),
            ("netwave-testbed".into(), testbed.0.id()),
            ("this process (agents)".into(), std::process::id()),
        ],
        tick: clock_tick(),
    };
    run.measure("rollout 1 (samples, first rollout)", 1, Value::Null)
        .await?;
    agents.abort();
    drop((c0, c1, testbed));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let bins = bin_dir()?;
    let sizes: Vec<usize> = match std::env::args().skip(1).collect::<Vec<_>>() {
        a if a.is_empty() => vec![1000],
        a => a
            .iter()
            .map(|s| {
                s.parse()
                    .with_context(|| format!("bench_fleet: size {s:?} is not a count"))
            })
            .collect::<Result<_>>()?,
    };
    for n in sizes {
        bench(&bins, n).await?;
    }
    Ok(())
}
