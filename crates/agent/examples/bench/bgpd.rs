//! What a large table costs FRR on a node (#49), to size the FRR container: a peer namespace announces
//! 0, 100,000 and 250,000 IPv4 prefixes (every prefix of 198.18.0.0/15 from /32 up, blackhole routes
//! in its kernel, `redistribute kernel`) over eBGP to a node namespace, whose bgpd learns them and whose
//! zebra installs them in its kernel. Printed: the time until the node's kernel has them all, and the
//! node's bgpd and zebra resident memory (RSS) and peak (HWM), with the cost per 1,000 routes.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};

use netwave_control_plane::frr::{FRR_LIB, FrrInstance, INSTALL};
use netwave_control_plane::host::{ip_batch, status_kib};

const SIZES: [u32; 3] = [0, 100_000, 250_000];

/// Deletes the two namespaces (and the veth between them) on drop.
struct Namespaces {
    node: String,
    peer: String,
}

impl Namespaces {
    fn new() -> Result<Namespaces> {
        let id = std::process::id();
        let ns = Namespaces {
            node: format!("nwbench-node-{id}"),
            peer: format!("nwbench-peer-{id}"),
        };
        for n in [&ns.node, &ns.peer] {
            ip(&["netns", "add", n])?;
            ip(&["-n", n, "link", "set", "lo", "up"])?;
        }
        ip(&[
            "link", "add", "nwb-node", "netns", &ns.node, "type", "veth", "peer", "name",
            "nwb-peer", "netns", &ns.peer,
        ])?;
        for (n, dev, addr) in [
            (&ns.node, "nwb-node", "198.18.0.1/30"),
            (&ns.peer, "nwb-peer", "198.18.0.2/30"),
        ] {
            ip(&["-n", n, "addr", "add", addr, "dev", dev])?;
            ip(&["-n", n, "link", "set", dev, "up"])?;
        }
        Ok(ns)
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in [&self.node, &self.peer] {
            let _ = ip(&["netns", "del", n]);
        }
    }
}

fn ip(args: &[&str]) -> Result<String> {
    let out = Command::new("ip").args(args).output()?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ip -n <ns> -batch` lines: `count` blackhole routes, every prefix of 198.18.0.0/15 from /32 up,
/// skipping the /30 of the link between the namespaces.
fn peer_routes(count: u32) -> String {
    let mut out = String::new();
    let mut n = 0;
    for len in (16..=32).rev() {
        let step = 1u32 << (32 - len);
        let start = u32::from(std::net::Ipv4Addr::new(198, 18, 0, 0));
        let mut a = start;
        while a < start + (1 << 17) && n < count {
            let link = u32::from(std::net::Ipv4Addr::new(198, 18, 0, 0));
            if len < 30 || a < link || a >= link + 4 {
                out.push_str(&format!(
                    "route add blackhole {}/{len}\n",
                    std::net::Ipv4Addr::from(a)
                ));
                n += 1;
            }
            a += step;
        }
    }
    out
}

fn vty(f: &FrrInstance, lines: &[&str]) -> Result<()> {
    let mut args = vec!["-c", "configure terminal"];
    for l in lines {
        args.extend(["-c", l]);
    }
    f.vtysh(&args).map(|_| ())
}

struct Row {
    routes: u32,
    learnt: Duration,
    /// (daemon, RSS KiB, HWM KiB)
    memory: Vec<(&'static str, u64, u64)>,
}

fn one_size(count: u32) -> Result<Row> {
    let ns = Namespaces::new()?;
    let batch = peer_routes(count);
    ensure!(
        batch.lines().count() == count as usize,
        "only {} prefixes",
        batch.lines().count()
    );
    ip_batch(Some(&ns.peer), &batch)?;
    let peer = FrrInstance::start_in(&ns.peer)?;
    let node = FrrInstance::start_in(&ns.node)?;
    vty(
        &peer,
        &[
            "router bgp 65001",
            "bgp router-id 198.18.0.2",
            "neighbor 198.18.0.1 remote-as 65000",
            "address-family ipv4 unicast",
            "redistribute kernel",
        ],
    )?;
    let start = Instant::now();
    vty(
        &node,
        &[
            "router bgp 65000",
            "bgp router-id 198.18.0.1",
            "neighbor 198.18.0.2 remote-as 65001",
        ],
    )?;
    let deadline = start + Duration::from_secs(900);
    loop {
        let installed = ip(&["-n", &ns.node, "-4", "route", "show", "proto", "bgp"])?
            .lines()
            .count();
        let up = node
            .vtysh(&["-c", "show bgp ipv4 unicast summary json"])?
            .contains("\"state\":\"Established\"");
        if up && installed >= count as usize {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "{installed} of {count} routes installed after 900 s"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let learnt = start.elapsed();
    // Let both daemons finish what they queued behind the installs.
    std::thread::sleep(Duration::from_secs(3));
    let mut memory = Vec::new();
    for (daemon, pid) in node.pids() {
        memory.push((
            daemon,
            status_kib(pid, "VmRSS:")?,
            status_kib(pid, "VmHWM:")?,
        ));
    }
    drop(node);
    drop(peer);
    Ok(Row {
        routes: count,
        learnt,
        memory,
    })
}

pub fn run() -> Result<()> {
    if !std::path::Path::new(&format!("{FRR_LIB}/bgpd")).is_file() {
        println!("bgpd sizing: SKIPPED ({INSTALL})");
        return Ok(());
    }
    println!(
        "bgpd sizing (#49): a peer announces N IPv4 prefixes over eBGP; the node's daemons once its kernel has them all:"
    );
    let mut base: Option<Row> = None;
    for count in SIZES {
        let row = one_size(count)?;
        let mib = |k: u64| k as f64 / 1024.0;
        let mut line = format!(
            "  {:>7} routes, in the node's kernel after {:>6.1} s:",
            row.routes,
            row.learnt.as_secs_f64()
        );
        for (daemon, rss, hwm) in &row.memory {
            line.push_str(&format!(
                " {daemon} {:.1} MiB (peak {:.1})",
                mib(*rss),
                mib(*hwm)
            ));
            if let Some(b) = &base
                && let Some((_, b_rss, _)) = b.memory.iter().find(|(d, ..)| d == daemon)
                && row.routes > 0
            {
                let per_k = (*rss as f64 - *b_rss as f64) / (row.routes as f64 / 1000.0);
                line.push_str(&format!(" = {per_k:.0} KiB per 1,000 routes;"));
            }
        }
        println!("{line}");
        if base.is_none() {
            base = Some(row);
        }
    }
    Ok(())
}
