//! `make demo`: netwave's main job on one machine. Six nodes in network namespaces, the testbed API
//! server, two configurators, one agent per node; roll out `deploy/samples/`, prove the data plane, roll
//! out a bad change, watch it halt and roll back, print a summary, leave nothing behind.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use netwave_api::manifest::{Manifest, samples};
use netwave_api::vocab::RevisionPhase;
use netwave_api::{AnyInput, NetworkConfigRevision};
use netwave_e2e::fleet::{
    ApiServer, Bins, DATA_GATEWAY, DATA_VLAN, Fleet, FleetOptions, PROBE_TARGET,
};
use netwave_e2e::netns::{is_root, namespaces_of, ping_in};
use netwave_e2e::probe::{Flow, Probe};
use serde_json::json;

const NODES: usize = 6;
const BAD_NODE: &str = "node-3";
const T: Duration = Duration::from_secs(180);

/// Inside the full-kernel VM (software emulation), where everything is ~10x slower.
fn emulated() -> bool {
    std::env::var_os("NETWAVE_KERNEL_TIER").is_some_and(|v| v == "1")
}

/// How long a rollout may take: in the VM an apply with FRR takes about a minute.
fn limit() -> Duration {
    if emulated() { T * 5 } else { T }
}

fn main() -> Result<()> {
    let no_kernel = std::env::args().any(|a| a == "--no-kernel")
        || std::env::var("NO_KERNEL").is_ok_and(|v| !v.is_empty() && v != "0");
    // The testbed starts at once; the real kube-apiserver + etcd (built from Go modules on first use,
    // ~10 min cold) is what a cluster runs.
    let server = if std::env::args().any(|a| a == "--real-control-plane") {
        ApiServer::Real
    } else {
        ApiServer::Testbed
    };
    if !no_kernel && !is_root() {
        eprintln!(
            "make demo needs root: it creates network namespaces, veth pairs and VXLAN devices, and the \
             agents apply config with netlink.\n  run:  sudo make demo\n  or:   make demo NO_KERNEL=1   \
             (no root: same API server and configurators, simulated agents that never touch the kernel, \
             no data-plane check)"
        );
        std::process::exit(2);
    }
    if !no_kernel {
        // Before anything starts: a missing ping would otherwise read as a dead data plane at the end.
        netwave_e2e::netns::require_ping()?;
    }
    let exe = std::env::current_exe()?;
    let bins = Bins::in_dir(exe.parent().context("exe has a directory")?)?;
    // Real FRR (zebra + bgpd) per node when it is installed: BGP EVPN gives every VXLAN its remote
    // VTEPs. Without it (or with --no-frr) the demo installs the flood entries EVPN would. `make demo
    // KERNEL=full` runs it inside the full-kernel VM, where the samples' VRFs get L3 VNIs too.
    let frr = std::env::args().any(|a| a == "--frr")
        || (!no_kernel
            && !std::env::args().any(|a| a == "--no-frr")
            && netwave_control_plane::frr::installed());
    if frr && no_kernel {
        bail!("--frr needs the kernel (real agents in node namespaces)");
    }
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        tokio::select! {
            r = demo(bins, !no_kernel, server, frr) => r,
            _ = tokio::signal::ctrl_c() => {
                // Dropping the demo future dropped the fleet: processes killed, namespaces deleted.
                println!("\ninterrupted: fleet torn down (processes killed, namespaces deleted)");
                std::process::exit(130);
            }
        }
    })
}

fn step(title: &str) {
    println!("\n\x1b[1m== {title}\x1b[0m");
}

async fn demo(bins: Bins, kernel: bool, server: ApiServer, frr: bool) -> Result<()> {
    let total = Instant::now();
    step("1. a fleet on this machine");
    let t = Instant::now();
    let mut f = Fleet::start(
        bins,
        FleetOptions {
            nodes: NODES,
            kernel,
            server,
            frr,
            // Under emulation (the full-kernel VM) FRR reloads take tens of seconds.
            health_deadline_secs: if emulated() { 30.0 } else { 8.0 },
            apply_timeout: Duration::from_secs(if emulated() { 240 } else { 60 }),
            ..FleetOptions::default()
        },
    )
    .await?;
    let run = f.net.run_id.clone();
    if !kernel {
        println!(
            "NO_KERNEL mode: API server at {}, 2 configurators (maxUnavailable 2), {NODES} Nodes; the \
             agents are simulated in this process: they report on each NodeNetworkConfig like the real \
             agent and fail the health check of a config that blackholes the probe target \
             {PROBE_TARGET}, but change nothing in the kernel",
            f.url
        );
    } else {
        println!(
            "{NODES} node namespaces ({run}-node*) on fabric bridge {run}-fabric, underlay 198.18.0.0/16; \
         API server (testbed) at {}; 2 configurators (leader election, maxUnavailable 2); one \
         netwave-agent per node (ip netns exec), probing {PROBE_TARGET} (ICMP) and the API server",
            f.url
        );
        if f.vrf {
            println!(
                "kernel: VRF devices supported → nodes labelled \
             node-restriction.kubernetes.io/netwave-pool=compute|storage, so the samples' VRFs and \
             their segments are rolled out too"
            );
        } else {
            println!(
                "kernel: no VRF support ({}) → nodes get no node-restriction.kubernetes.io/netwave-pool \
             label: the samples' VRFs and their segments select only pooled nodes, so each node runs the default-VRF segments \
             (vlan103-monitoring, vlan111-pxe) and routing table oob. (An agent asked for a VRF here \
             would report KernelUnsupported.)",
                std::fs::read_to_string("/proc/sys/kernel/osrelease")
                    .unwrap_or_default()
                    .trim()
            );
        }
    }
    if kernel {
        println!(
            "{}",
            if frr {
                "FRR per node (zebra + bgpd, iBGP full mesh over the underlay): the agents configure \
                 it, BGP EVPN distributes the VXLAN endpoints"
            } else {
                "no FRR (not installed, or --no-frr): the demo installs the VXLAN flood entries EVPN \
                 would provide"
            }
        );
    }
    let started = t.elapsed();
    println!("up in {started:.1?}");

    step("2. roll out deploy/samples/");
    let manifests = samples()?;
    let count = |k: fn(&Manifest) -> bool| manifests.iter().filter(|m| k(m)).count();
    println!(
        "applying {} VRFs, {} layer-2 segments, {} routing tables",
        count(|m| matches!(m, Manifest::Input(AnyInput::Vrf(_)))),
        count(|m| matches!(m, Manifest::Input(AnyInput::Layer2(_)))),
        count(|m| matches!(m, Manifest::Input(AnyInput::RoutingTable(_))))
    );
    let t = Instant::now();
    f.apply(&manifests).await?;
    let (rev, phase_good) =
        watch(&f, 0, &[RevisionPhase::Complete, RevisionPhase::Failed], t).await?;
    let good = rev.metadata.name.clone().unwrap_or_default();
    let first_rollout = t.elapsed();
    if phase_good != RevisionPhase::Complete.as_str() {
        bail!(
            "the sample rollout ended {phase_good}:\n{}",
            f.logs_tail(10)
        );
    }
    println!("revision {good} complete on {NODES} nodes in {first_rollout:.1?}");

    step("3. data plane: VXLAN segment vlan103-monitoring across nodes");
    let t = Instant::now();
    let (mut ok, mut pings) = (0, 0);
    if kernel && frr {
        println!(
            "BGP EVPN: every node runs FRR (iBGP full mesh); type-3 routes give each VXLAN its remote \
             VTEPs, nobody installs flood entries"
        );
        if f.vrf {
            let n0 = &f.node_names()[0];
            let vnis = f
                .frr(n0)
                .context("FRR on node-0")?
                .vtysh(&["-c", "show vrf vni"])?;
            println!("{n0}: the VRFs' L3 VNIs in zebra (show vrf vni):\n{vnis}");
        }
    } else if kernel {
        let entries = f.install_flood_entries()?;
        println!(
            "installed {entries} VXLAN flooding entries (bridge fdb append 00:00:00:00:00:00 … dst <peer>): \
         they stand in for EVPN type-3 routes, which a BGP control plane would provide"
        );
    }
    let mut probe = None;
    if kernel {
        let workloads = f.add_workloads()?;
        println!(
            "one workload namespace per node: a veth on bridge l2.{DATA_VLAN}, 10.250.3.(100+i)/24, default \
         route via the anycast gateway {DATA_GATEWAY}"
        );
        for (i, (node, ns, addr)) in workloads.iter().enumerate() {
            let mut line = format!("  {node} ({addr}) → gw {DATA_GATEWAY}: ");
            pings += 1;
            if ping_in(ns, DATA_GATEWAY) {
                ok += 1;
                line.push_str("ok");
            } else {
                line.push_str("FAIL");
            }
            for (j, (peer, _, peer_addr)) in workloads.iter().enumerate() {
                if i == j {
                    continue;
                }
                pings += 1;
                // EVPN learns the remote VTEPs within seconds of the rollout; give it up to 30 s.
                let deadline = Instant::now() + Duration::from_secs(if frr { 30 } else { 0 });
                let mut reached = ping_in(ns, peer_addr) || ping_in(ns, peer_addr);
                while !reached && Instant::now() < deadline {
                    reached = ping_in(ns, peer_addr);
                }
                if reached {
                    ok += 1;
                }
                line.push_str(&format!(
                    "  {}:{}",
                    peer.trim_start_matches("node-"),
                    if reached { "ok" } else { "FAIL" }
                ));
            }
            println!("{line}");
        }
        println!(
            "{ok}/{pings} pings answered (node-to-node over vx.{DATA_VLAN}, and the anycast gateway)"
        );
        if ok != pings {
            bail!("data plane check failed");
        }
        // Traffic through the bad change: UDP at 100/s across VLAN 103, in and out of the node the change
        // breaks; the segment is not what the change is about, so it must lose nothing.
        let flows = [(0, 3), (3, 1), (1, 2)]
            .into_iter()
            .filter(|(a, b)| *a < workloads.len() && *b < workloads.len())
            .map(|(a, b)| {
                Ok(Flow {
                    name: format!("{}→{}", workloads[a].0, workloads[b].0),
                    from: workloads[a].1.clone(),
                    to: workloads[b].1.clone(),
                    to_addr: workloads[b].2.parse()?,
                })
            })
            .collect::<Result<Vec<Flow>>>()?;
        let mut p = Probe::start(flows, 100)?;
        let _ = p.window();
        probe = Some(p);
    } else {
        println!("skipped: NO_KERNEL mode has no data plane");
    }
    let dataplane = t.elapsed();

    step("4. a bad change: breaks one node's probe target");
    let seq = rev.spec.sequence;
    println!(
        "routing table bad-monitoring on {BAD_NODE} only: rule `to {PROBE_TARGET}/32 lookup 300` and a \
         blackhole route for it, so that node's ICMP health probe fails after the apply"
    );
    let t = Instant::now();
    f.create_routing_table(json!({
        "apiVersion": "netwave.dev/v1alpha1",
        "kind": "RoutingTable",
        "metadata": {"name": "bad-monitoring"},
        "spec": {
            "tableId": 300,
            "routes": [{"prefix": format!("{PROBE_TARGET}/32"), "type": "blackhole"}],
            "rules": [{"to": format!("{PROBE_TARGET}/32"), "priority": 300}],
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": BAD_NODE}},
        }
    }))
    .await?;
    let (bad, phase_bad) = watch(
        &f,
        seq,
        &[RevisionPhase::Failed, RevisionPhase::Complete],
        t,
    )
    .await?;
    let bad_name = bad.metadata.name.clone().unwrap_or_default();
    let to_halt = t.elapsed();
    if phase_bad != RevisionPhase::Failed.as_str() {
        bail!("the bad revision was not halted ({phase_bad})");
    }
    let failed = f
        .revisions()
        .await?
        .into_iter()
        .find(|r| r.metadata.name.as_deref() == Some(bad_name.as_str()))
        .and_then(|r| r.status)
        .unwrap_or_default();
    for n in &failed.failed_nodes {
        // The agent's message starts with its reason ("HealthCheckFailed: reachability …").
        if n.message.starts_with(&n.reason) {
            println!("halted: {} {}", n.node, n.message);
        } else {
            println!("halted: {} {}: {}", n.node, n.reason, n.message);
        }
    }
    println!("rolling the touched nodes back to {good}…");
    f.wait_all_on(&good, limit()).await?;
    let rolled_back = t.elapsed();
    let clean = if kernel {
        let clean = !f.kernel_state(BAD_NODE)?.contains("lookup 300");
        println!(
            "every node Provisioned on {good}; {BAD_NODE}'s kernel {} the bad rule",
            if clean { "no longer has" } else { "STILL HAS" }
        );
        clean
    } else {
        println!("every node Provisioned on {good}");
        true
    };
    let mut lost_total = 0;
    if let Some(p) = probe.as_mut() {
        for (flow, s) in p.window() {
            lost_total += s.lost;
            println!(
                "probe {flow} over VLAN {DATA_VLAN} (not what the change is about) during the bad change and \
                 its rollback: {} packets sent, {} lost, longest gap {:.0} ms",
                s.sent,
                s.lost,
                s.longest_gap.as_secs_f64() * 1000.0
            );
        }
    }

    step("5. summary");
    let row = |what: String, d: Duration| println!("  {what:<48} {d:>8.1?}");
    row(
        "fleet up (namespaces, API server, processes)".into(),
        started,
    );
    row(
        format!("first rollout, {NODES} nodes, maxUnavailable 2"),
        first_rollout,
    );
    row(format!("data plane check ({pings} pings)"), dataplane);
    row("bad change → halted after 1 failure".into(), to_halt);
    row(
        "bad change → all nodes back on last good".into(),
        rolled_back,
    );
    drop(probe);
    drop(f);
    let left = namespaces_of(&run);
    row("total".into(), total.elapsed());
    println!(
        "teardown: processes killed, {}",
        if left.is_empty() {
            "no namespaces left".to_string()
        } else {
            format!("LEFT BEHIND: {left:?}")
        }
    );
    if lost_total > 0 {
        println!("the bad change cost {lost_total} packets on a segment it is not about");
    }
    if !clean || !left.is_empty() || lost_total > 0 {
        bail!("demo found a problem (see above)");
    }
    Ok(())
}

/// Shows the rollout of the newest revision (sequence above `after`; inputs created one by one can
/// yield intermediate revisions, superseded by the next) live until it reaches one of `until`; returns
/// it and the phase reached.
async fn watch(
    f: &Fleet,
    after: u64,
    until: &[RevisionPhase],
    t0: Instant,
) -> Result<(NetworkConfigRevision, String)> {
    let tty = std::io::stdout().is_terminal();
    let mut drawn = 0usize;
    let mut last_text = String::new();
    let deadline = Instant::now() + limit();
    loop {
        let revs = f.revisions().await?;
        let Some(r) = revs
            .iter()
            .rfind(|r| netwave_api::effective_sequence(r) > after)
        else {
            if Instant::now() > deadline {
                bail!("no new revision:\n{}", f.logs_tail(10));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let rev = r.metadata.name.as_deref().unwrap_or_default();
        let configs = f.configs().await?;
        // The view `kubectl netwave status -w` shows, from the plugin's own code.
        let view = kubectl_netwave::status::build(r, &revs, configs.values(), false);
        let p = view.phase.clone();
        let reached = RevisionPhase::parse(Some(&p)).is_some_and(|q| until.contains(&q));
        let text = format!(
            "{:>5.1}s  {}",
            t0.elapsed().as_secs_f64(),
            kubectl_netwave::status::render(&view, kubectl_netwave::now(), tty)
        );
        if text != last_text {
            if tty && drawn > 0 {
                print!("\x1b[{drawn}A\x1b[J");
            }
            if tty || reached || drawn == 0 {
                print!("{text}");
                drawn = text.lines().count();
            }
            std::io::stdout().flush()?;
            last_text = text;
        }
        if reached {
            return Ok((r.clone(), p));
        }
        if Instant::now() > deadline {
            bail!("rollout of {rev} did not finish:\n{}", f.logs_tail(10));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
