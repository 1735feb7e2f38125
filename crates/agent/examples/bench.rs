//! Dataplane benchmark (root; runs in throwaway network namespaces, touches nothing on the host):
//!
//! - apply 100 layer-2 segments (bridge + VXLAN + anycast address each) and 1,000 routes from empty with
//!   the agent, against the same objects through `ip -batch`, in the same run: times and ratio;
//! - no-op reconcile (observe + diff, nothing to do): time and netlink write count (must be 0);
//! - with a real zebra + bgpd in the namespace (FRR installed), the agent's whole apply of that config
//!   split into its netlink part and its FRR part (render → check → write → reload → converged);
//! - observation among 0, 100,000 and 1,000,000 foreign routes: time and peak RSS, with the kernel's
//!   filter and without, beside `ip route show table all` (`foreign`, [`foreign`]);
//! - bgpd and zebra memory with 0, 100,000 and 250,000 routes learnt from a peer (`bgpd`, [`bgpd`]);
//! - idle RSS of the real `netwave-agent` binary running that config against the API testbed, split into
//!   binary code and data, libraries, malloc heap and arenas, against the 16 MiB target (#14); and of the
//!   same code built with the plain `release` profile, in the same run, when that binary exists.
//!
//! ```sh
//! cargo build --release -p netwave-agent --bins     # the comparison build (optional)
//! cargo build --profile agent-release -p netwave-agent --bins --examples
//! sudo target/agent-release/examples/bench [dataplane] [frr] [rss] [foreign] [bgpd]   # default: all
//! ```

use netwave_api::vocab::NodePhase;
use std::fmt::Write as _;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use kube::api::{Api, PostParams};
use netwave_agent::backup::StateDir;
use netwave_agent::frr::Frr;
use netwave_agent::health::{HealthConfig, Prober};
use netwave_agent::netlink::Netlink;
use netwave_agent::reconcile::{Agent, Target};
use netwave_api::{
    Layer2Config, NodeConfig, NodeNetworkConfig, NodeNetworkConfigSpec, RouteConfig, RouteType,
};
use netwave_core::dataplane::{NodeSettings, desired};

#[path = "bench/bgpd.rs"]
mod bgpd;
#[path = "bench/util.rs"]
mod util;
use util::{in_netns, median, ms};
#[path = "bench/foreign.rs"]
mod foreign;

/// The FRR harness of the root tests (zebra + bgpd in this thread's namespace, killed by pid on drop).
#[path = "../tests/common/frr.rs"]
mod frr_harness;

const SEGMENTS: u16 = 100;
const ROUTES: u32 = 1000;
const ROUNDS: usize = 5;

fn config() -> NodeConfig {
    let layer2s = (0..SEGMENTS)
        .map(|i| {
            Layer2Config::segment(100 + i, 10_000 + u32::from(i))
                .with_mtu(1450)
                .with_anycast("02:00:5e:00:01:01", &[format!("10.200.{i}.1/24")])
                .with_neigh_suppression(true)
        })
        .collect();
    let routes = (0..ROUTES)
        .map(|r| RouteConfig {
            table: 100,
            prefix: format!("10.{}.{}.0/24", r / 250, r % 250),
            via: Some(format!("10.200.{}.254", r % u32::from(SEGMENTS))),
            dev: None,
            kind: RouteType::Unicast,
            metric: None,
        })
        .collect();
    NodeConfig {
        layer2s,
        routes,
        ..NodeConfig::default()
    }
}

fn settings() -> NodeSettings {
    NodeSettings {
        vxlan_local: Some("198.18.0.10".parse().unwrap()),
        ..NodeSettings::default()
    }
}

/// The same kernel objects as `ip -batch` input, written the way an admin script would.
fn ip_batch(cfg: &NodeConfig) -> String {
    let mut s = String::new();
    for l in &cfg.layer2s {
        let mac = l.anycast_mac.as_deref().unwrap_or_default();
        let _ = writeln!(
            s,
            "link add {} mtu {} address {mac} type bridge",
            l.bridge, l.mtu
        );
        let _ = writeln!(
            s,
            "link add {} mtu {} type vxlan id {} local 198.18.0.10 dstport 4789 nolearning",
            l.vxlan, l.mtu, l.vni
        );
    }
    for l in &cfg.layer2s {
        let _ = writeln!(s, "link set {} alias netwave:managed up", l.bridge);
        let _ = writeln!(
            s,
            "link set {} alias netwave:managed master {} up",
            l.vxlan, l.bridge
        );
        let _ = writeln!(
            s,
            "link set dev {} type bridge_slave neigh_suppress on",
            l.vxlan
        );
        for a in &l.anycast_gateways {
            let _ = writeln!(s, "addr add {a} dev {}", l.bridge);
        }
    }
    for r in &cfg.routes {
        let _ = writeln!(
            s,
            "route add {} via {} table {} proto 242",
            r.prefix,
            r.via.as_deref().unwrap_or_default(),
            r.table
        );
    }
    s
}

fn dataplane() -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let nl = Netlink::connect(settings())?;
        let cfg = config();
        let want = desired(&cfg, nl.settings())?;
        let empty = desired(&NodeConfig::default(), nl.settings())?;
        let batch = ip_batch(&cfg);
        let objects = want.object_count();
        let (mut agent, mut ipb) = (Vec::new(), Vec::new());
        let mut writes = 0;
        let mut phases = Vec::new();
        for round in 0..ROUNDS {
            // Alternate who goes first so neither profits from a warm kernel.
            for who in if round % 2 == 0 { [0, 1] } else { [1, 0] } {
                if who == 0 {
                    // The agent's reconcile, step by step: observe, diff, apply, verify (observe again).
                    let t = Instant::now();
                    let w0 = nl.writes();
                    let mut snap = nl.observe().await?;
                    let ops = netwave_core::dataplane::diff::diff(&want, &snap.observed)?;
                    let t_obs = t.elapsed();
                    nl.apply(&ops, &mut snap.index).await?;
                    let t_apply = t.elapsed();
                    let after = nl.observe().await?;
                    ensure!(netwave_core::dataplane::diff::diff(&want, &after.observed)?.is_empty());
                    agent.push(t.elapsed());
                    phases.push((t_obs, t_apply - t_obs, t.elapsed() - t_apply));
                    writes = nl.writes() - w0;
                } else {
                    let t = Instant::now();
                    let mut child = Command::new("ip")
                        .args(["-batch", "-"])
                        .stdin(Stdio::piped())
                        .stderr(Stdio::piped())
                        .spawn()?;
                    child.stdin.take().expect("piped").write_all(batch.as_bytes())?;
                    let out = child.wait_with_output()?;
                    ipb.push(t.elapsed());
                    if !out.status.success() {
                        bail!("ip -batch failed: {}", String::from_utf8_lossy(&out.stderr));
                    }
                    // ip's objects carry the agent's markers: the agent must see exactly its config.
                    let snap = nl.observe().await?;
                    ensure!(
                        netwave_core::dataplane::diff::diff(&want, &snap.observed)?.is_empty(),
                        "ip -batch produced different state"
                    );
                }
                nl.reconcile(&empty).await?;
            }
        }
        nl.reconcile(&want).await?;
        let mut noop = Vec::new();
        let before = nl.writes();
        for _ in 0..20 {
            let t = Instant::now();
            let r = nl.reconcile(&want).await?;
            noop.push(t.elapsed());
            ensure!(r.applied.is_empty());
        }
        let noop_writes = nl.writes() - before;
        let (a, b) = (median(agent), median(ipb));
        println!(
            "apply from empty: {SEGMENTS} L2 segments + {ROUTES} routes ({objects} objects, {writes} netlink writes)"
        );
        println!("  agent (netlink, pipelined) median of {ROUNDS}: {:8.1} ms", ms(a));
        phases.sort_by_key(|p| p.0 + p.1 + p.2);
        let (o, w, v) = phases[phases.len() / 2];
        println!(
            "    of which observe+diff {:.1} ms, netlink writes {:.1} ms, verify {:.1} ms",
            ms(o),
            ms(w),
            ms(v)
        );
        println!("  ip -batch                 median of {ROUNDS}: {:8.1} ms", ms(b));
        println!(
            "  ratio writes only (agent apply / ip -batch): {:.2}x",
            w.as_secs_f64() / b.as_secs_f64()
        );
        println!(
            "  ratio agent / ip -batch: {:.2}x (target <= 1.5x)",
            a.as_secs_f64() / b.as_secs_f64()
        );
        println!(
            "no-op reconcile (observe + diff) median of 20: {:.1} ms, netlink writes: {noop_writes} (target 0)",
            ms(median(noop))
        );
        nl.reconcile(&empty).await?;
        Ok(())
    })
}

/// The agent's apply of the benchmark config with FRR on: netlink part vs FRR part, each round from an
/// empty node and an empty FRR config file (so the reload always runs).
fn frr_apply() -> Result<()> {
    use frr_harness::{FrrDaemons, VTEP};
    if !std::path::Path::new(&format!("{}/zebra", frr_harness::FRR_LIB)).is_file() {
        println!("FRR apply: SKIPPED ({})", frr_harness::INSTALL);
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let lo = Command::new("ip")
            .args(["addr", "add", &format!("{VTEP}/32"), "dev", "lo"])
            .status()?;
        ensure!(lo.success(), "ip addr add {VTEP}/32 dev lo failed");
        for key in ["net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"] {
            std::fs::write(format!("/proc/sys/{key}"), "1")?;
        }
        let fr = FrrDaemons::start()?;
        let hostname = netwave_agent::frr::kernel_hostname()?;
        let frr = Frr::new(fr.settings(), &hostname)?;
        let netlink = Netlink::connect(NodeSettings {
            vxlan_local: Some(VTEP.parse()?),
            ..NodeSettings::default()
        })?;
        let state = tempfile::tempdir()?;
        let agent = Agent {
            caps: netlink.capabilities().await,
            prober: Prober::new(
                HealthConfig {
                    settle_seconds: 0.0,
                    ..HealthConfig::default()
                },
                netlink.clone(),
                None,
            ),
            state: StateDir::open(state.path())?,
            netlink,
            frr: Some(frr.clone()),
            timings: Default::default(),
            drill: None,
        };
        let (mut nl, mut fr_total, mut reload, mut converge) = (vec![], vec![], vec![], vec![]);
        let mut vnis = 0;
        for round in 0..ROUNDS {
            for (rev, cfg) in [("full", config()), ("empty", NodeConfig::default())] {
                // No frr.conf: the text is new to the agent, so it reloads every round.
                let _ = std::fs::remove_file(frr.config_file());
                let t = Target {
                    revision: format!("{rev}-{round}"),
                    retry: 0,
                    config_hash: format!("{rev}-{round}"),
                    config: cfg,
                };
                let out = agent.apply(&t).await;
                ensure!(out.reason.is_none(), "{}", out.message);
                if rev == "full" {
                    let timings = agent.timings.last().context("timings")?;
                    let f = timings.frr.context("FRR timings")?;
                    nl.push(timings.netlink);
                    fr_total.push(f.total());
                    reload.push(f.reload);
                    converge.push(f.converge);
                    vnis = fr.evpn_vnis()?.len();
                }
            }
        }
        println!(
            "agent apply with FRR on ({SEGMENTS} L2 segments + {ROUTES} routes; zebra's EVPN VNIs right after the apply: {vnis}), median of {ROUNDS}:"
        );
        println!("  netlink part: {:8.1} ms", ms(median(nl)));
        println!(
            "  FRR part:     {:8.1} ms (reload {:.1} ms, converged check {:.1} ms)",
            ms(median(fr_total)),
            ms(median(reload)),
            ms(median(converge))
        );
        drop(fr);
        Ok(())
    })
}

/// Where a process's resident memory is, from /proc/<pid>/smaps (KiB).
#[derive(Debug, Default)]
struct RssBreakdown {
    total: u64,
    /// The executable's own mappings: code, then relocated data and .data/.bss.
    bin_text: u64,
    bin_data: u64,
    /// Shared libraries (libc, libgcc, ld.so).
    libs: u64,
    /// The main malloc arena (`[heap]`, brk).
    heap: u64,
    /// Other anonymous mappings: malloc's per-thread arenas, thread stacks, large allocations.
    anon: u64,
    /// The main thread's stack and the kernel's vdso/vvar.
    other: u64,
    threads: u64,
}

impl RssBreakdown {
    fn read(pid: u32, bin: &std::path::Path) -> Result<RssBreakdown> {
        let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps"))?;
        let bin = std::fs::canonicalize(bin)?;
        let mut b = RssBreakdown::default();
        // Each mapping: a header line `start-end perms offset dev inode [path]`, then `Key: value kB`.
        let mut current: Option<(String, String)> = None;
        for line in smaps.lines() {
            let mut f = line.split_whitespace();
            let first = f.next().unwrap_or_default();
            if first.contains('-') && !first.ends_with(':') {
                let perms = f.next().unwrap_or_default().to_string();
                let path = f.nth(3).unwrap_or_default().to_string();
                current = Some((perms, path));
            } else if first == "Rss:" {
                let kib: u64 = f.next().unwrap_or_default().parse()?;
                let (perms, path) = current.as_ref().context("smaps: Rss before a mapping")?;
                b.total += kib;
                let slot = if !path.is_empty() && std::path::Path::new(path) == bin {
                    if perms.contains('x') {
                        &mut b.bin_text
                    } else {
                        &mut b.bin_data
                    }
                } else if path.starts_with('/') {
                    &mut b.libs
                } else if path == "[heap]" {
                    &mut b.heap
                } else if path.is_empty() {
                    &mut b.anon
                } else {
                    &mut b.other
                };
                *slot += kib;
            }
        }
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        b.threads = status
            .lines()
            .find_map(|l| l.strip_prefix("Threads:"))
            .and_then(|v| v.trim().parse().ok())
            .context("no Threads in /proc/<pid>/status")?;
        Ok(b)
    }

    fn mib(&self) -> f64 {
        self.total as f64 / 1024.0
    }
}

impl std::fmt::Display for RssBreakdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = |k: u64| k as f64 / 1024.0;
        write!(
            f,
            "{:.1} MiB = binary code {:.1} + binary data {:.1} + libraries {:.1} + heap {:.1} + \
             other anonymous (arenas, stacks) {:.1} + stack/vdso {:.1}; {} threads",
            m(self.total),
            m(self.bin_text),
            m(self.bin_data),
            m(self.libs),
            m(self.heap),
            m(self.anon),
            m(self.other),
            self.threads
        )
    }
}

/// The idle RSS target of #14, and the figure measured before that work (ce5257d, release profile).
const RSS_TARGET_MIB: f64 = 16.0;
const RSS_BEFORE_MIB: f64 = 18.8;

/// Idle RSS of the real `netwave-agent` binary built with the profile this benchmark was built with
/// (`make bench`: `agent-release`, the one the image ships) and, when it is there too, of the same code
/// built with the plain `release` profile: the agent's build before #14, measured in the same run.
fn idle_rss() -> Result<()> {
    let exe = std::env::current_exe()?;
    // target/<profile>/examples/bench → target/<profile>/netwave-agent
    let profile_dir = exe
        .parent()
        .and_then(|d| d.parent())
        .context("locating the target directory")?;
    let bin = profile_dir.join("netwave-agent");
    if !bin.exists() {
        println!(
            "idle RSS: skipped ({} not built; cargo build --profile agent-release -p netwave-agent --bins)",
            bin.display()
        );
        return Ok(());
    }
    let profile = profile_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // Each run in a fresh network namespace: both agents apply the config from an empty node.
    let (rss, later) = in_netns(move || agent_idle_rss(bin))?;
    let verdict = if rss.mib().max(later.mib()) <= RSS_TARGET_MIB {
        "met"
    } else {
        "MISSED"
    };
    println!(
        "idle RSS of netwave-agent running that config (profile {profile}): {rss}\n  after three \
         more drift checks: {later}\n  target <= {RSS_TARGET_MIB} MiB: {verdict}; before #14 (ce5257d, \
         release profile): {RSS_BEFORE_MIB} MiB"
    );
    let plain = profile_dir.with_file_name("release").join("netwave-agent");
    if profile != "release" && plain.exists() {
        let (base, _) = in_netns(move || agent_idle_rss(plain))?;
        println!(
            "  the same code built with the release profile, this run: {base}\n  the {profile} \
             profile saves {:.1} MiB",
            base.mib() - rss.mib()
        );
    }
    Ok(())
}

/// Runs `bin` against an in-process testbed with the benchmark config until it reports Provisioned, and
/// reads where its resident memory is 3 s later and again after three more drift checks.
fn agent_idle_rss(bin: std::path::PathBuf) -> Result<(RssBreakdown, RssBreakdown)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let crds: Vec<_> = netwave_api::crds().into_iter().map(|(_, c)| c).collect();
        let tb = netwave_testbed::Testbed::start(
            netwave_testbed::TestbedOptions::default().with_crds(crds),
        )
        .await?;
        let mut node = k8s_openapi::api::core::v1::Node::default();
        node.metadata.name = Some("n1".into());
        Api::all(tb.client())
            .create(&PostParams::default(), &node)
            .await?;
        let nncs: Api<NodeNetworkConfig> = Api::all(tb.client());
        let spec = NodeNetworkConfigSpec {
            revision: "r1".into(),
            sequence: 1,
            config_hash: netwave_core::render::config_hash(&config()),
            retry: 0,
            config: config(),
        };
        nncs.create(&PostParams::default(), &NodeNetworkConfig::new("n1", spec))
            .await?;
        let dir = tempfile::tempdir()?;
        std::fs::write(
            dir.path().join("health.yaml"),
            "apiServer: true\nsettleSeconds: 0\n",
        )?;
        let mut child = Command::new(&bin)
            .args([
                "--node-name",
                "n1",
                "--vxlan-local",
                "198.18.0.10",
                "--log-format",
                "text",
                // Idle still checks the kernel for drift: a few checks happen before the second reading.
                "--drift-interval",
                "5s",
            ])
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .arg("--kubeconfig")
            .arg(tb.kubeconfig_path())
            .arg("--health-config")
            .arg(dir.path().join("health.yaml"))
            .args([
                "--metrics-addr",
                "127.0.0.1:0",
                "--health-addr",
                "127.0.0.1:0",
            ])
            .env("RUST_LOG", "warn")
            .spawn()?;
        let pid = child.id();
        let measured = async {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let phase = nncs.get("n1").await?.status.and_then(|s| s.phase);
                if phase.as_deref() == Some(NodePhase::Provisioned.as_str()) {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("agent did not provision in time (phase {phase:?})");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            tokio::time::sleep(Duration::from_secs(3)).await;
            let first = RssBreakdown::read(pid, &bin)?;
            tokio::time::sleep(Duration::from_secs(16)).await;
            Ok((first, RssBreakdown::read(pid, &bin)?))
        }
        .await;
        // Killed by pid on every path: an agent left behind would keep applying in a dead namespace.
        let _ = child.kill();
        let _ = child.wait();
        measured
    })
}

fn main() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("the benchmark needs root (it creates network namespaces)");
    }
    // `bench [dataplane] [frr] [rss] [foreign]`: only those parts (default: all).
    let parts: Vec<String> = std::env::args().skip(1).collect();
    if parts.first().map(String::as_str) == Some("observe-child") {
        return foreign::child(parts.get(1).map(String::as_str) != Some("unfiltered"));
    }
    let run = |p: &str| parts.is_empty() || parts.iter().any(|a| a == p);
    if let Some(bad) = parts
        .iter()
        .find(|a| !["dataplane", "frr", "rss", "foreign", "bgpd"].contains(&a.as_str()))
    {
        bail!("unknown part {bad:?} (dataplane, frr, rss, foreign, bgpd)");
    }
    if run("dataplane") {
        in_netns(dataplane)?;
    }
    if run("frr") {
        in_netns(frr_apply)?;
    }
    if run("rss") {
        idle_rss()?;
    }
    if run("foreign") {
        foreign::run()?;
    }
    if run("bgpd") {
        bgpd::run()?;
    }
    Ok(())
}
