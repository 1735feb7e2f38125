//! The agent's observation among routes it does not own (#49): an edge node learns a large table by
//! BGP. For 0, 100,000 and 1,000,000 foreign routes (protocol bgp, IPv4 from 198.18.0.0/15 and IPv6
//! from fd00::/8, half in the agent's own table) beside the agent's 100, a fresh process observes the
//! kernel the way the agent does and reports its median time and peak RSS, with the kernel's filter on
//! (the agent) and off (the baseline: every route sent, dropped as it arrives); beside them, the
//! kernel's own dump of everything (`ip route show table all`) and of the agent's protocol only.

use std::fmt::Write as _;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use netwave_agent::netlink::Netlink;
use netwave_api::{NodeConfig, RouteConfig, RouteType};
use netwave_core::dataplane::desired;

const SIZES: [u32; 3] = [0, 100_000, 1_000_000];
const AGENT_ROUTES: u32 = 100;
const ROUNDS: usize = 7;

fn agent_config() -> NodeConfig {
    let routes = (0..AGENT_ROUTES)
        .map(|r| RouteConfig {
            table: 100,
            prefix: format!("fd00:a9e:{r:x}::/64"),
            via: None,
            dev: None,
            kind: RouteType::Blackhole,
            metric: None,
        })
        .collect();
    NodeConfig {
        routes,
        ..NodeConfig::default()
    }
}

/// `ip -batch` lines for `count` foreign routes: every prefix of 198.18.0.0/15 from /32 to /24 first
/// (261,632), then IPv6 /64s of fd00:f000::/24.
fn foreign_batch(count: u32) -> String {
    let mut out = String::with_capacity(count as usize * 64);
    let mut n = 0;
    'v4: for len in (24..=32).rev() {
        let step = 1u32 << (32 - len);
        let mut a = u32::from(std::net::Ipv4Addr::new(198, 18, 0, 0));
        let end = a + (1 << 17);
        while a < end {
            if n == count {
                break 'v4;
            }
            let table = if n % 2 == 0 { "main" } else { "100" };
            let ip = std::net::Ipv4Addr::from(a);
            let _ = writeln!(
                out,
                "route add blackhole {ip}/{len} table {table} proto bgp"
            );
            a += step;
            n += 1;
        }
    }
    while n < count {
        let table = if n % 2 == 0 { "main" } else { "100" };
        let _ = writeln!(
            out,
            "route add blackhole fd00:f0{:02x}:{:x}::/64 table {table} proto bgp",
            n >> 16,
            n & 0xffff
        );
        n += 1;
    }
    out
}

/// Lines `ip` prints for `args` and how long it took (its output read and counted, not kept).
fn ip_dump(args: &[&str]) -> Result<(usize, Duration)> {
    let start = Instant::now();
    let out = Command::new("ip").args(args).output()?;
    ensure!(out.status.success(), "ip {args:?} failed");
    let lines = out.stdout.iter().filter(|b| **b == b'\n').count();
    Ok((lines, start.elapsed()))
}

/// The child: observe `ROUNDS` times in this network namespace, print the median in µs, the peak
/// RSS in KiB and the route messages of one observation.
pub fn child(kernel_filter: bool) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let nl = Netlink::connect_with(
            netwave_core::dataplane::NodeSettings::default(),
            kernel_filter,
        )?;
        let want = desired(&agent_config(), nl.settings())?;
        let mut times = Vec::new();
        let mut messages = 0;
        for _ in 0..ROUNDS {
            let before = nl.route_messages();
            let start = Instant::now();
            let snap = nl.observe().await?;
            times.push(start.elapsed());
            messages = nl.route_messages() - before;
            ensure!(snap.observed.managed.routes.len() == want.routes.len());
        }
        let status = std::fs::read_to_string("/proc/self/status")?;
        let hwm = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.split_whitespace().next())
            .context("VmHWM")?;
        println!(
            "{} {hwm} {messages}",
            super::util::median(times).as_micros()
        );
        Ok(())
    })
}

struct Observed {
    median: Duration,
    peak_kib: u64,
    messages: u64,
}

/// Runs [`child`] in a new process; it inherits this thread's network namespace.
fn observe_in_child(kernel_filter: bool) -> Result<Observed> {
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.arg("observe-child");
    if !kernel_filter {
        cmd.arg("unfiltered");
    }
    let out = cmd.output()?;
    ensure!(
        out.status.success(),
        "observe child failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let f: Vec<u64> = text
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .with_context(|| format!("child said {text:?}"))?;
    ensure!(f.len() == 3, "child said {text:?}");
    Ok(Observed {
        median: Duration::from_micros(f[0]),
        peak_kib: f[1],
        messages: f[2],
    })
}

fn one_size(foreign: u32) -> Result<String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let nl = Netlink::connect(netwave_core::dataplane::NodeSettings::default())?;
        nl.reconcile(&desired(&agent_config(), nl.settings())?)
            .await?;
        anyhow::Ok(())
    })?;
    let start = Instant::now();
    netwave_control_plane::host::ip_batch(None, &foreign_batch(foreign))?;
    let loaded = start.elapsed();
    let (v4, t4) = ip_dump(&["-4", "route", "show", "table", "all"])?;
    let (v6, t6) = ip_dump(&["-6", "route", "show", "table", "all"])?;
    let (own4, o4) = ip_dump(&["-4", "route", "show", "table", "all", "proto", "242"])?;
    let (own6, o6) = ip_dump(&["-6", "route", "show", "table", "all", "proto", "242"])?;
    let filtered = observe_in_child(true)?;
    let whole = observe_in_child(false)?;
    Ok(format!(
        "{foreign:>9} | {:>7.1} ms {:>6.1} MiB {:>5} msgs | {:>7.1} ms {:>6.1} MiB {:>7} msgs | {:>7} lines {:>7.1} ms | {:>3} lines {:>6.1} ms | loaded in {:.1} s",
        super::util::ms(filtered.median),
        filtered.peak_kib as f64 / 1024.0,
        filtered.messages,
        super::util::ms(whole.median),
        whole.peak_kib as f64 / 1024.0,
        whole.messages,
        v4 + v6,
        super::util::ms(t4 + t6),
        own4 + own6,
        super::util::ms(o4 + o6),
        loaded.as_secs_f64(),
    ))
}

pub fn run() -> Result<()> {
    println!(
        "observe among foreign routes (#49; {AGENT_ROUTES} routes of the agent, median of {ROUNDS}, peak RSS of a fresh process):"
    );
    println!(
        "  foreign |   agent (kernel filters)         |   baseline (kernel sends all)     | ip route show table all | … proto 242 (kernel-filtered walk)"
    );
    for foreign in SIZES {
        let row = super::util::in_netns(move || one_size(foreign))?;
        println!("  {row}");
    }
    Ok(())
}
