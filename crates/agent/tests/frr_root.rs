//! The agent applies FRR config to a real zebra + bgpd (root; FRR 8.4 installed).
//!
//! ```text
//!  test thread: unshare(CLONE_NEWNET) ── lo 198.18.1.1/32 (VTEP), forwarding on
//!     ├─ zebra, bgpd  (children of this test, -F datacenter, every path in a temp dir owned by frr)
//!     └─ Agent { netlink, frr: Frr(settings → that dir) } ── apply(revision) ─► kernel + FRR
//!  checks: `show running-config` == the render, `show evpn vni` follows the segments,
//!          refusals touch neither kernel nor FRR, drift in FRR is repaired
//! ```
//!
//! The daemons are killed by their pids when the test ends (panics included), then the temp dir goes;
//! the kernel frees the namespace when the thread exits. Each test prints how long the FRR part of an
//! apply took beside the netlink part.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use common::frr::{FRR_LIB, FrrDaemons, INSTALL, VTEP, body};
use common::{PeerNs, in_netns, ip};
use netwave_agent::backup::{Applying, StateDir};
use netwave_agent::frr::Frr;
use netwave_agent::health::{self, BgpSummary, HealthConfig, Prober};
use netwave_agent::netlink::Netlink;
use netwave_agent::reconcile::{Agent, Reason, Target};
use netwave_api::{Layer2Config, NodeConfig, RouteConfig, RouteType, VrfConfig};
use netwave_core::dataplane::diff::diff;
use netwave_core::dataplane::{NodeSettings, desired};
use netwave_core::frr::{NeighborSettings, RemoteAsSetting, TimerSettings};

fn hostname() -> Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/hostname")?
        .trim()
        .to_string())
}

fn segment(vlan: u16) -> Layer2Config {
    Layer2Config::segment(vlan, 1000 + u32::from(vlan))
        .with_mtu(1450)
        .with_anycast("02:00:5e:00:01:01", &[format!("198.19.{vlan}.1/24")])
}

fn segments(vlans: &[u16]) -> NodeConfig {
    NodeConfig {
        layer2s: vlans.iter().map(|&v| segment(v)).collect(),
        ..NodeConfig::default()
    }
}

fn target(rev: &str, config: NodeConfig) -> Target {
    Target {
        revision: rev.into(),
        retry: 0,
        config_hash: format!("hash-{rev}"),
        config,
    }
}

fn health() -> HealthConfig {
    HealthConfig {
        interfaces: vec![],
        tcp: vec![],
        icmp: vec![],
        bgp_peers: vec![],
        api_server: false,
        attempt_timeout_seconds: 0.5,
        deadline_seconds: 1.0,
        settle_seconds: 0.0,
        backoff_initial_seconds: 0.05,
        backoff_max_seconds: 0.2,
        taints: vec![],
    }
}

/// A node: namespace set up, FRR running, an agent with FRR on (`frr`) sharing one state dir.
struct Node {
    agent: Agent,
    fr: FrrDaemons,
    _state: tempfile::TempDir,
}

async fn node() -> Result<Node> {
    ip(&["addr", "add", &format!("{VTEP}/32"), "dev", "lo"])?;
    // Forwarding on, as on a node: the render leaves `ip forwarding` out (FRR would show a diff).
    for key in ["net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"] {
        std::fs::write(format!("/proc/sys/{key}"), "1").with_context(|| key.to_string())?;
    }
    let fr = FrrDaemons::start()?;
    let frr = Frr::new(fr.settings(), &hostname()?)?;
    let state = tempfile::tempdir()?;
    let agent = agent(Some(frr), state.path()).await?;
    Ok(Node {
        agent,
        fr,
        _state: state,
    })
}

async fn agent(frr: Option<Frr>, state: &Path) -> Result<Agent> {
    let settings = NodeSettings {
        vxlan_local: Some(VTEP.parse()?),
        ..NodeSettings::default()
    };
    let netlink = Netlink::connect(settings)?;
    Ok(Agent {
        caps: netlink.capabilities().await,
        prober: Prober::new(health(), netlink.clone(), None),
        state: StateDir::open(state)?,
        netlink,
        frr,
        timings: Default::default(),
        drill: None,
    })
}

/// The kernel runs exactly `cfg` (for the managed objects).
async fn runs(agent: &Agent, cfg: &NodeConfig) -> Result<bool> {
    let want = desired(cfg, agent.netlink.settings())?;
    Ok(diff(&want, &agent.netlink.observe().await?.observed)?.is_empty())
}

/// FRR runs exactly the render of `cfg`.
fn frr_runs(n: &Node, cfg: &NodeConfig) -> Result<()> {
    let want = body(&n.agent.frr.as_ref().context("FRR on")?.render(cfg)?);
    let running = n.fr.running()?;
    ensure!(
        running == want,
        "FRR runs something else than the render:\n--- render\n{want}\n--- running\n{running}"
    );
    Ok(())
}

/// Applies `t`, which must be Provisioned, and prints the FRR and netlink times.
async fn apply_ok(n: &Node, t: &Target) -> Result<()> {
    let start = Instant::now();
    let out = n.agent.apply(t).await;
    let took = start.elapsed();
    ensure!(out.reason.is_none(), "{}: {}", t.revision, out.message);
    let timings = n.agent.timings.last().context("timings recorded")?;
    let f = timings.frr.context("FRR timings recorded")?;
    eprintln!(
        "{}: FRR apply {:.0} ms (render {:.1} ms, check {:.0} ms, write {:.1} ms, reload {:.0} ms, \
         converged {:.0} ms) | netlink apply {:.1} ms ({} ops) | whole apply {:.0} ms",
        t.revision,
        ms(f.total()),
        ms(f.render),
        ms(f.check),
        ms(f.write),
        ms(f.reload),
        ms(f.converge),
        ms(timings.netlink),
        out.applied,
        ms(took),
    );
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn needs_frr(test: &str) -> bool {
    let ok = Path::new(&format!("{FRR_LIB}/zebra")).is_file()
        && Path::new(&format!("{FRR_LIB}/frr-reload.py")).is_file();
    if !ok && common::is_root() {
        // Root but no FRR: fail rather than pass having checked nothing.
        panic!("{test}: {INSTALL}");
    }
    if !common::is_root() {
        eprintln!("SKIPPED {test}: needs root for network namespaces and FRR's daemons");
    }
    common::is_root()
}

#[test]
fn layer2_segments_are_applied_and_frr_follows_each_revision() {
    let test = "layer2_segments_are_applied_and_frr_follows_each_revision";
    if !needs_frr(test) {
        return;
    }
    in_netns(test, || async {
        let n = node().await?;
        let r1 = segments(&[10, 20]);
        apply_ok(&n, &target("r1", r1.clone())).await?;
        ensure!(runs(&n.agent, &r1).await?, "kernel does not run r1");
        frr_runs(&n, &r1)?;
        ensure!(
            n.fr.evpn_vnis()? == [1010, 1020],
            "zebra's EVPN VNIs: {:?}",
            n.fr.evpn_vnis()?
        );
        // The file FRR starts from after a restart is the render, and the reload did not overwrite it.
        let frr = n.agent.frr.as_ref().context("FRR on")?;
        ensure!(std::fs::read_to_string(frr.config_file())? == frr.render(&r1)?);

        let r2 = segments(&[10, 20, 30]);
        apply_ok(&n, &target("r2", r2.clone())).await?;
        ensure!(runs(&n.agent, &r2).await?, "kernel does not run r2");
        frr_runs(&n, &r2)?;
        ensure!(
            n.fr.evpn_vnis()? == [1010, 1020, 1030],
            "{:?}",
            n.fr.evpn_vnis()?
        );

        // Re-applying the same config writes nothing to the kernel and leaves FRR converged.
        let w = n.agent.netlink.writes();
        apply_ok(&n, &target("r3", r2.clone())).await?;
        ensure!(
            n.agent.netlink.writes() == w,
            "re-apply wrote to the kernel"
        );
        ensure!(frr.diff().await?.is_none());
        Ok(())
    });
}

/// A node's forwarding is its own: with IPv6 forwarding off (as on many Kubernetes nodes, and in a pod
/// whose /proc/sys is read-only the agent could not change it anyway), an apply converges and leaves it
/// off; FRR's `no ipv6 forwarding` is rendered, never "deleted" by a reload.
#[test]
fn the_nodes_forwarding_is_left_as_it_is_and_frr_converges() {
    let test = "the_nodes_forwarding_is_left_as_it_is_and_frr_converges";
    if !needs_frr(test) {
        return;
    }
    in_netns(test, || async {
        let n = node().await?;
        std::fs::write("/proc/sys/net/ipv6/conf/all/forwarding", "0")?;
        let r1 = segments(&[10]);
        apply_ok(&n, &target("r1", r1.clone())).await?;
        frr_runs(&n, &r1)?;
        let frr = n.agent.frr.as_ref().context("FRR on")?;
        ensure!(
            frr.render(&r1)?.contains("no ipv6 forwarding\n"),
            "the render shows the kernel's forwarding"
        );
        ensure!(frr.diff().await?.is_none(), "FRR converged");
        let v6 = std::fs::read_to_string("/proc/sys/net/ipv6/conf/all/forwarding")?;
        ensure!(v6.trim() == "0", "IPv6 forwarding was turned on: {v6}");
        // Turned on by the node's admin later: the next render follows, and nothing turns it off.
        std::fs::write("/proc/sys/net/ipv6/conf/all/forwarding", "1")?;
        apply_ok(&n, &target("r2", segments(&[10, 20]))).await?;
        let v6 = std::fs::read_to_string("/proc/sys/net/ipv6/conf/all/forwarding")?;
        ensure!(v6.trim() == "1", "IPv6 forwarding was turned off: {v6}");
        ensure!(frr.diff().await?.is_none(), "FRR converged");
        Ok(())
    });
}

#[test]
fn a_config_frr_rejects_touches_neither_kernel_nor_frr() {
    let test = "a_config_frr_rejects_touches_neither_kernel_nor_frr";
    if !needs_frr(test) {
        return;
    }
    in_netns(test, || async {
        let n = node().await?;
        let r1 = segments(&[10]);
        apply_ok(&n, &target("r1", r1.clone())).await?;
        let before = n.fr.running()?;

        // The same node with an underlay FRR refuses: a host name FRR's `hostname` will not take (the
        // kernel's name is whatever the node was given; only FRR's check knows its rules).
        let bad_frr = Frr::new(n.fr.settings(), "-node")?;
        let bad = agent(Some(bad_frr), n.agent.state.path()).await?;
        let w = bad.netlink.writes();
        let out = bad.apply(&target("r2", segments(&[10, 20]))).await;
        ensure!(out.reason == Some(Reason::FrrRejected), "{out:?}");
        ensure!(
            out.message.starts_with("FrrRejected: ") && out.message.contains("Please specify"),
            "{}",
            out.message
        );
        ensure!(!out.rolled_back, "nothing to roll back: {out:?}");
        ensure!(bad.netlink.writes() == w, "wrote to the kernel");
        ensure!(runs(&bad, &r1).await?, "kernel changed");
        ensure!(n.fr.running()? == before, "FRR changed");
        ensure!(bad.state.applying()?.is_none());
        ensure!(bad.last_good()?.context("last good")?.revision == "r1");

        // FRR's tools that do not answer in time are killed: not a verdict on the config, nothing
        // changed either.
        let mut slow = n.fr.settings();
        slow.command_timeout_seconds = 0.001;
        let slow = agent(Some(Frr::new(slow, &hostname()?)?), n.agent.state.path()).await?;
        let out = slow.apply(&target("r3", segments(&[10, 20]))).await;
        ensure!(out.reason == Some(Reason::FrrUnavailable), "{out:?}");
        ensure!(out.message.contains("did not finish"), "{}", out.message);
        ensure!(runs(&slow, &r1).await?, "kernel changed");
        ensure!(n.fr.running()? == before, "FRR changed");
        Ok(())
    });
}

/// #51: on a node's first start (no last good config) the drift check gives a fresh FRR its underlay;
/// that is no drift, so it is reported apart (logged as a set-up, no `DriftCorrected` Event, not
/// counted). Once a config was applied, the same difference is drift.
#[test]
fn a_fresh_frr_gets_its_underlay_on_the_first_start_and_that_is_no_drift() {
    let test = "a_fresh_frr_gets_its_underlay_on_the_first_start_and_that_is_no_drift";
    if !needs_frr(test) {
        return;
    }
    in_netns(test, || async {
        let mut n = node().await?;
        let first = n.agent.repair_drift().await?;
        ensure!(first.frr.is_none(), "reported as drift: {first:?}");
        ensure!(
            first
                .frr_baseline
                .as_deref()
                .is_some_and(|d| d.contains("router bgp 65000")),
            "{first:?}"
        );
        ensure!(n.agent.repair_drift().await?.is_empty(), "set up again");

        // With a config applied, an FRR that lost it (bgpd restarted empty) has drifted.
        apply_ok(&n, &target("r1", segments(&[10]))).await?;
        n.fr.stop_daemon("bgpd");
        n.fr.start_daemon("bgpd")?;
        let later = n.agent.repair_drift().await?;
        ensure!(
            later.frr.is_some() && later.frr_baseline.is_none(),
            "{later:?}"
        );
        Ok(())
    });
}

#[test]
fn frr_failing_mid_apply_restores_the_kernel_and_drift_repair_restores_frr() {
    let test = "frr_failing_mid_apply_restores_the_kernel_and_drift_repair_restores_frr";
    if !needs_frr(test) {
        return;
    }
    in_netns(test, || async {
        let mut n = node().await?;
        let r1 = segments(&[10]);
        apply_ok(&n, &target("r1", r1.clone())).await?;

        // bgpd dies: the check (no daemon needed) passes, the reload cannot apply `router bgp`.
        n.fr.stop_daemon("bgpd");
        let r2 = segments(&[10, 20]);
        let out = n.agent.apply(&target("r2", r2)).await;
        ensure!(out.reason == Some(Reason::FrrReloadFailed), "{out:?}");
        ensure!(
            out.message.starts_with("FrrReloadFailed: "),
            "{}",
            out.message
        );
        ensure!(out.rolled_back && out.applied > 0, "{out:?}");
        ensure!(runs(&n.agent, &r1).await?, "kernel is not back on r1");
        ensure!(
            n.agent.last_good()?.context("last good")?.revision == "r1",
            "last good moved"
        );
        ensure!(n.agent.state.applying()?.is_none(), "marker left behind");
        eprintln!("{}", out.message);

        // bgpd is back (empty, as after a crash): the drift timer puts the last good config back.
        n.fr.start_daemon("bgpd")?;
        let repaired = n.agent.repair_drift().await?;
        ensure!(
            repaired
                .frr
                .as_deref()
                .is_some_and(|d| d.contains("router bgp 65000")),
            "{repaired:?}"
        );
        frr_runs(&n, &r1)?;
        ensure!(n.agent.repair_drift().await?.is_empty(), "repair again");
        Ok(())
    });
}

#[test]
fn frr_edited_behind_the_agents_back_is_repaired_and_restored_after_a_crash() {
    let test = "frr_edited_behind_the_agents_back_is_repaired_and_restored_after_a_crash";
    if !needs_frr(test) {
        return;
    }
    in_netns(test, || async {
        let n = node().await?;
        let r1 = segments(&[10, 20]);
        apply_ok(&n, &target("r1", r1.clone())).await?;
        ensure!(
            n.agent.repair_drift().await?.is_empty(),
            "drift right after an apply"
        );

        // Someone edits FRR by hand.
        n.fr.vtysh(&[
            "-c",
            "configure terminal",
            "-c",
            "ip prefix-list by-hand seq 5 permit 198.18.0.0/15",
            "-c",
            "router bgp 65000",
            "-c",
            "coalesce-time 100",
        ])?;
        ensure!(n.fr.running()?.contains("by-hand"));
        let start = Instant::now();
        let repaired = n.agent.repair_drift().await?;
        let took = start.elapsed();
        let diff = repaired.frr.context("FRR drift not seen")?;
        ensure!(
            diff.contains("by-hand") && diff.contains("coalesce-time 100"),
            "{diff}"
        );
        ensure!(
            repaired.netlink.applied.is_empty(),
            "kernel had not drifted"
        );
        frr_runs(&n, &r1)?;
        eprintln!("FRR drift repaired in {:.0} ms: {diff}", ms(took));
        ensure!(n.agent.repair_drift().await?.is_empty(), "repair again");

        // The agent dies half-way through r2 (kernel and FRR both partly changed); a new agent
        // process restores both at start.
        let r2 = segments(&[10, 20, 30]);
        n.agent.state.mark_applying(&Applying {
            revision: "r2".into(),
            retry: 0,
            config_hash: "hash-r2".into(),
            interruptions: 0,
            creating: Vec::new(),
            upgrade: false,
        })?;
        n.agent
            .netlink
            .reconcile(&desired(&r2, n.agent.netlink.settings())?)
            .await?;
        n.fr.vtysh(&[
            "-c",
            "configure terminal",
            "-c",
            "router bgp 65000",
            "-c",
            "coalesce-time 100",
        ])?;
        let fresh = agent(n.agent.frr.clone(), n.agent.state.path()).await?;
        ensure!(
            fresh.recover().await?.is_none(),
            "a first interruption is retried"
        );
        ensure!(runs(&fresh, &r1).await?, "kernel not restored");
        frr_runs(&n, &r1)?;
        Ok(())
    });
}

#[test]
fn frr_off_refuses_bgp_content_before_any_change() {
    let test = "frr_off_refuses_bgp_content_before_any_change";
    in_netns(test, || async {
        let state = tempfile::tempdir()?;
        let a = agent(None, state.path()).await?;
        let mut cfg = segments(&[10]);
        cfg.vrfs.push(
            VrfConfig::named("red")
                .with_vni(2000)
                .with_route_target("65000:2000"),
        );
        let w = a.netlink.writes();
        let out = a.apply(&target("r1", cfg)).await;
        ensure!(out.reason == Some(Reason::FrrUnavailable), "{out:?}");
        ensure!(
            out.message.contains("VRF red: vni, routeTarget"),
            "{}",
            out.message
        );
        ensure!(a.netlink.writes() == w, "wrote before refusing");
        ensure!(
            !ip(&["-o", "link", "show"])?.contains("l2.10"),
            "half applied"
        );
        ensure!(a.state.applying()?.is_none());
        // Layer-2 segments alone need no FRR.
        let out = a.apply(&target("r2", segments(&[10]))).await;
        ensure!(out.reason.is_none(), "{}", out.message);
        Ok(())
    });
}

/// Waits until `frr`'s session to `peer` is (or, with `up == false`, is not) Established.
async fn wait_session(frr: &Frr, peer: &str, up: bool, within: Duration) -> Result<Duration> {
    let start = Instant::now();
    let what = format!("the session to {peer} {}", if up { "up" } else { "down" });
    netwave_control_plane::poll::until(&what, within, async || {
        let summary = frr.bgp_summary().await?;
        Ok(if health::bgp_session(&summary, peer).is_ok() == up {
            Ok(start.elapsed())
        } else {
            Err(summary.to_string())
        })
    })
    .await
}

/// A blackhole route in `table` (254: main).
fn blackhole(table: u32, prefix: &str) -> RouteConfig {
    RouteConfig {
        table,
        prefix: prefix.into(),
        via: None,
        dev: None,
        kind: RouteType::Blackhole,
        metric: None,
    }
}

/// Node A (this namespace, FRR applied by the agent) ══ veth ══ node B (a peer namespace with its own
/// FRR, configured by hand): iBGP over 198.18.8.0/24, keepalive 1 s, hold 3 s. `b_kernel` runs in B's
/// namespace before its FRR starts (zebra reads what it made at start: 100,000 routes added while it
/// runs overflow its netlink socket and some are never seen), `b_config` are more lines for B's
/// `router bgp`. A's agent gates on the session (settle 4 s: a broken session stays
/// Established until its hold time runs out).
struct Pair {
    peer: PeerNs,
    b: FrrDaemons,
    fr: FrrDaemons,
    frr: Frr,
    a: Agent,
    _state: tempfile::TempDir,
}

async fn pair(
    b_kernel: impl FnOnce() -> Result<()> + Send + 'static,
    b_config: &'static [&'static str],
) -> Result<Pair> {
    let peer = PeerNs::wired("198.18.8.1/24", "198.18.8.2/24")?;
    ip(&["addr", "add", &format!("{VTEP}/32"), "dev", "lo"])?;
    for key in ["net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"] {
        std::fs::write(format!("/proc/sys/{key}"), "1").with_context(|| key.to_string())?;
    }
    let b = peer.run(|| {
        b_kernel()?;
        // Forked from this thread: B's daemons live in B's namespace.
        let b = FrrDaemons::start()?;
        let mut args = vec![
            "-c",
            "configure terminal",
            "-c",
            "router bgp 65000",
            "-c",
            "bgp router-id 198.18.8.2",
            "-c",
            "timers bgp 1 3",
            "-c",
            "neighbor 198.18.8.1 remote-as internal",
        ];
        args.extend(b_config.iter().flat_map(|l| ["-c", l]));
        b.vtysh(&args)?;
        Ok(b)
    })?;

    let fr = FrrDaemons::start()?;
    let mut settings = fr.settings();
    settings.underlay.neighbors = vec![NeighborSettings {
        address: Some("198.18.8.2".into()),
        interface: None,
        remote_as: RemoteAsSetting::Keyword("internal".into()),
    }];
    settings.underlay.timers = Some(TimerSettings {
        keepalive: 1,
        hold: 3,
    });
    let frr = Frr::new(settings, &hostname()?)?;
    let state = tempfile::tempdir()?;
    let mut a = agent(Some(frr.clone()), state.path()).await?;
    let probe_frr = frr.clone();
    let summary: BgpSummary = std::sync::Arc::new(move || {
        let f = probe_frr.clone();
        Box::pin(async move { f.bgp_summary().await.map_err(|e| e.to_string()) })
    });
    let cfg = HealthConfig {
        bgp_peers: vec!["198.18.8.2".into()],
        api_server: false,
        attempt_timeout_seconds: 2.0,
        deadline_seconds: 15.0,
        // A broken session stays Established until its hold time (3 s) runs out.
        settle_seconds: 4.0,
        backoff_initial_seconds: 0.2,
        backoff_max_seconds: 1.0,
        ..HealthConfig::default()
    };
    a.prober = Prober::new(cfg, a.netlink.clone(), None).with_bgp(summary);
    Ok(Pair {
        peer,
        b,
        fr,
        frr,
        a,
        _state: state,
    })
}

#[test]
fn a_revision_that_breaks_the_bgp_session_is_rolled_back_and_the_session_returns() {
    let test = "a_revision_that_breaks_the_bgp_session_is_rolled_back_and_the_session_returns";
    if !needs_frr(test) {
        return;
    }
    in_netns(test, || async {
        let Pair {
            peer: _peer,
            b,
            fr,
            frr,
            a,
            _state,
        } = pair(|| Ok(()), &[]).await?;

        // r1: the first FRR config. The session was not up before (FRR had no BGP at all), so its
        // probe does not gate: Provisioned even though the session is still connecting.
        let r1 = segments(&[10]);
        let out = a.apply(&target("r1", r1.clone())).await;
        ensure!(out.reason.is_none(), "r1: {}", out.message);
        let p = out.probes.iter().find(|p| p.name == "bgp 198.18.8.2");
        ensure!(p.is_some_and(|p| !p.gating), "{:?}", out.probes);
        let up = wait_session(&frr, "198.18.8.2", true, Duration::from_secs(30)).await?;
        eprintln!("session Established {:.1} s after r1", up.as_secs_f64());

        // r2 also blackholes B's address in the main table: B stops hearing A's keepalives, drops
        // the session after its 3 s hold time, and A cannot reconnect. Its gating probe fails.
        let mut r2 = r1.clone();
        r2.routes.push(blackhole(254, "198.18.8.2/32"));
        let start = Instant::now();
        let out = a.apply(&target("r2", r2)).await;
        let took = start.elapsed();
        ensure!(out.reason == Some(Reason::HealthCheckFailed), "{out:?}");
        ensure!(
            out.message.starts_with("HealthCheckFailed: bgp 198.18.8.2"),
            "{}",
            out.message
        );
        ensure!(out.message.contains("not Established"), "{}", out.message);
        ensure!(out.rolled_back, "{out:?}");
        ensure!(runs(&a, &r1).await?, "kernel not back on r1");
        ensure!(
            !ip(&["route", "show", "table", "main"])?.contains("blackhole"),
            "the blackhole route survived the rollback"
        );
        let back = wait_session(&frr, "198.18.8.2", true, Duration::from_secs(30)).await?;
        eprintln!(
            "r2 refused after {:.1} s (session down, rolled back); session Established again {:.1} s \
             later",
            took.as_secs_f64(),
            back.as_secs_f64()
        );
        drop(b);
        drop(fr);
        Ok(())
    });
}

/// An underlay input (#47) with one iBGP neighbour, keepalive 1 s, hold 3 s.
fn with_underlay(mut config: NodeConfig, neighbor: &str) -> NodeConfig {
    config.underlay = Some(netwave_api::UnderlayConfig {
        name: "fabric".into(),
        asn: 65000,
        neighbors: vec![netwave_api::UnderlayNeighborSpec {
            address: Some(neighbor.into()),
            interface: None,
            remote_as: "internal".into(),
        }],
        timers: Some(netwave_api::UnderlayTimersSpec {
            keepalive: 1,
            hold: 3,
        }),
    });
    config
}

/// The underlay through the gate (#47): an underlay that moves the node's fabric session to a
/// neighbour that never answers fails the node once the session is not Established within 10 s, and
/// the agent rolls back to the last good config, whose underlay brings the old session back. No
/// `bgpPeers` in the health settings: the gate comes from the underlay change itself.
#[test]
fn an_underlay_change_to_a_neighbour_that_never_answers_is_rolled_back() {
    let test = "an_underlay_change_to_a_neighbour_that_never_answers_is_rolled_back";
    if !needs_frr(test) {
        return;
    }
    in_netns(test, || async {
        let Pair {
            peer: _peer,
            b,
            fr,
            frr,
            mut a,
            _state,
        } = pair(|| Ok(()), &[]).await?;
        let cfg = HealthConfig {
            bgp_peers: Vec::new(),
            ..a.prober.cfg.clone()
        };
        a.prober = Prober::new(cfg, a.netlink.clone(), None);

        // r1: the underlay input names B, as the bootstrap did: B's session must come up.
        let r1 = with_underlay(segments(&[10]), "198.18.8.2");
        let out = a.apply(&target("r1", r1.clone())).await;
        ensure!(out.reason.is_none(), "r1: {}", out.message);
        let p = out
            .probes
            .iter()
            .find(|p| p.name == "bgp-underlay 198.18.8.2");
        ensure!(
            p.is_some_and(|p| p.gating && p.result == health::PASSED),
            "{:?}",
            out.probes
        );
        let r1_frr = body(&frr.render(&r1)?);
        ensure!(fr.running()? == r1_frr, "FRR runs r1's render");

        // r2: a neighbour nobody answers at.
        let r2 = with_underlay(segments(&[10]), "198.18.8.3");
        let start = Instant::now();
        let out = a.apply(&target("r2", r2)).await;
        let took = start.elapsed();
        ensure!(out.reason == Some(Reason::HealthCheckFailed), "{out:?}");
        ensure!(
            out.message
                .starts_with("HealthCheckFailed: bgp-underlay 198.18.8.3"),
            "{}",
            out.message
        );
        ensure!(out.rolled_back, "{out:?}");
        let running = fr.running()?;
        ensure!(
            running == r1_frr && !running.contains("198.18.8.3"),
            "FRR is back on r1's underlay:\n{running}"
        );
        let back = wait_session(&frr, "198.18.8.2", true, Duration::from_secs(30)).await?;
        eprintln!(
            "r2 refused after {:.1} s (no session to 198.18.8.3), rolled back; the session to \
             198.18.8.2 Established again {:.1} s later",
            took.as_secs_f64(),
            back.as_secs_f64()
        );
        drop(b);
        drop(fr);
        Ok(())
    });
}

/// A node config with one BGPPeering: a listen range on 198.18.9.0/24 in the default VRF for AS
/// `remote_asn`, hold 3 s, accepting 198.18.53.0/24 and longer, sending nothing.
fn with_peering(mut config: NodeConfig, remote_asn: u32) -> NodeConfig {
    use netwave_api::{BgpPeerConfig, PrefixAction, PrefixItem};
    config.bgp_peers = vec![BgpPeerConfig {
        name: "bgpaas".into(),
        vrf: None,
        listen_ranges: vec!["198.18.9.0/24".into()],
        addresses: vec![],
        remote_asn,
        bfd: false,
        maximum_prefixes: Some(10),
        hold_time: Some(3),
        keepalive_time: Some(1),
        import: vec![PrefixItem {
            cidr: "198.18.53.0/24".into(),
            seq: Some(1),
            ge: None,
            le: Some(32),
            action: PrefixAction::Permit,
        }],
        export: vec![],
    }];
    config
}

/// BGP as a service (#29): a workload (its own FRR in a namespace of its own, AS 65511, announcing
/// 198.18.53.1/32 and 198.18.54.1/32) peers with the node over a listen range the agent renders from
/// the node's BGPPeering. The health gate waits for the session: r1 is Provisioned once it is
/// Established (its time is the probe's duration), and the node takes the allowed prefix only. r2
/// names another AS: FRR refuses the workload, no session within the 3 s hold time fails the node with
/// the peering named, and the agent rolls back to r1, whose session comes back.
#[test]
fn a_bgp_peering_that_does_not_come_up_within_its_hold_time_is_rolled_back() {
    let test = "a_bgp_peering_that_does_not_come_up_within_its_hold_time_is_rolled_back";
    if !needs_frr(test) {
        return;
    }
    in_netns(test, || async {
        let peer = PeerNs::wired("198.18.9.1/24", "198.18.9.2/24")?;
        // node() puts the VTEP on lo and turns forwarding on.
        let workload = peer.run(|| {
            ip(&["addr", "add", "198.18.53.1/32", "dev", "lo"])?;
            ip(&["addr", "add", "198.18.54.1/32", "dev", "lo"])?;
            let w = FrrDaemons::start()?;
            w.vtysh(&[
                "-c",
                "configure terminal",
                "-c",
                "router bgp 65511",
                "-c",
                "bgp router-id 198.18.9.2",
                "-c",
                "no bgp default ipv4-unicast",
                "-c",
                "neighbor 198.18.9.1 remote-as 65000",
                "-c",
                // A workload that retries every second: the node listens only once r1 is applied.
                "neighbor 198.18.9.1 timers connect 1",
                "-c",
                "address-family ipv4 unicast",
                "-c",
                "network 198.18.53.1/32",
                "-c",
                "network 198.18.54.1/32",
                "-c",
                "neighbor 198.18.9.1 activate",
            ])?;
            Ok(w)
        })?;
        let n = node().await?;
        let r1 = with_peering(segments(&[10]), 65511);
        let start = Instant::now();
        let out = n.agent.apply(&target("r1", r1.clone())).await;
        ensure!(out.reason.is_none(), "r1: {}", out.message);
        let probe = out
            .probes
            .iter()
            .find(|p| p.name == "bgp-peering bgpaas nw-peer-bgpaas-v4")
            .with_context(|| format!("{:?}", out.probes))?;
        ensure!(probe.gating && probe.result == health::PASSED, "{probe:?}");
        eprintln!(
            "r1: BGPPeering session Established {:.2} s after the apply (whole apply {:.2} s)",
            probe.duration_seconds.unwrap_or_default(),
            start.elapsed().as_secs_f64()
        );
        frr_runs(&n, &r1)?;
        // The workload's updates follow the session: wait for the allowed one.
        let mut routes = String::new();
        for _ in 0..50 {
            routes = n.fr.vtysh(&["-c", "show ip bgp json"])?;
            if routes.contains("198.18.53.1/32") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        ensure!(
            routes.contains("198.18.53.1/32") && !routes.contains("198.18.54.1/32"),
            "the import list takes 198.18.53.1/32 only: {routes}"
        );

        let r2 = with_peering(segments(&[10]), 65599);
        let start = Instant::now();
        let out = n.agent.apply(&target("r2", r2)).await;
        let took = start.elapsed();
        ensure!(out.reason == Some(Reason::HealthCheckFailed), "{out:?}");
        ensure!(
            out.message.starts_with(
                "HealthCheckFailed: bgp-peering bgpaas nw-peer-bgpaas-v4: not Established within its \
                 hold time (3 s) of the apply: no workload has connected"
            ),
            "{}",
            out.message
        );
        ensure!(out.rolled_back, "{out:?}");
        frr_runs(&n, &r1)?;
        let back = Instant::now();
        loop {
            let neighbors = n
                .agent
                .frr
                .as_ref()
                .context("FRR on")?
                .bgp_neighbors("default")
                .await?;
            let id = netwave_core::frr::WorkloadId::Group("nw-peer-bgpaas-v4".into());
            if health::peering_session(&neighbors, &id).is_ok() {
                break;
            }
            ensure!(
                back.elapsed() < Duration::from_secs(20),
                "the session did not come back after the rollback: {neighbors}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        eprintln!(
            "r2 (wrong AS) refused after {:.1} s and rolled back; the session Established again {:.2} s \
             later",
            took.as_secs_f64(),
            back.elapsed().as_secs_f64()
        );
        drop(workload);
        Ok(())
    });
}

/// `ip -batch` lines: `count` blackhole routes, /32s then /31s then /30s of 198.18.16.0 – 198.18.255.255
/// (clear of the link, the VTEP and the segments), at most 107,520.
fn peer_table(count: usize) -> String {
    let mut out = String::new();
    let (start, end) = (
        u32::from(std::net::Ipv4Addr::new(198, 18, 16, 0)),
        u32::from(std::net::Ipv4Addr::new(198, 19, 0, 0)),
    );
    let mut n = 0;
    for len in [32u32, 31, 30] {
        let mut a = start;
        while a < end && n < count {
            let ip = std::net::Ipv4Addr::from(a);
            out.push_str(&format!("route add blackhole {ip}/{len}\n"));
            a += 1 << (32 - len);
            n += 1;
        }
    }
    out
}

/// BGP routes in this namespace's kernel (IPv4, every table).
fn bgp_routes() -> Result<usize> {
    Ok(
        ip(&["-4", "route", "show", "table", "all", "proto", "bgp"])?
            .lines()
            .count(),
    )
}

/// An edge node learns a large table from its peer (#49): with 100,000 BGP routes in its kernel the
/// agent applies a revision, repairs drift and rolls a bad revision back as on any node, the kernel
/// sends its observations only the agent's routes, and the agent (this whole test process) and FRR stay
/// within their containers' memory limits (128 MiB, 256 MiB).
#[test]
fn with_a_large_table_from_a_peer_the_agent_applies_repairs_drift_and_rolls_back() {
    const ROUTES: usize = 100_000;
    let test = "with_a_large_table_from_a_peer_the_agent_applies_repairs_drift_and_rolls_back";
    if !needs_frr(test) {
        return;
    }
    in_netns(test, || async {
        let Pair {
            peer: _peer,
            b: _b,
            fr,
            frr,
            a,
            _state,
        } = pair(
            || common::ip_batch(&peer_table(ROUTES)),
            &["address-family ipv4 unicast", "redistribute kernel"],
        )
        .await?;
        let learn = async |what: &str| -> Result<()> {
            let start = Instant::now();
            netwave_control_plane::poll::until(what, Duration::from_secs(180), async || {
                let n = bgp_routes()?;
                Ok(if n >= ROUTES {
                    Ok(())
                } else {
                    Err(format!("{n} BGP routes"))
                })
            })
            .await?;
            eprintln!("{what} in {:.1} s", start.elapsed().as_secs_f64());
            Ok(())
        };

        let r1 = segments(&[10]);
        let out = a.apply(&target("r1", r1.clone())).await;
        ensure!(out.reason.is_none(), "r1: {}", out.message);
        wait_session(&frr, "198.18.8.2", true, Duration::from_secs(30)).await?;
        learn("the peer's 100,000 routes in the kernel").await?;

        // r2: a table of the agent's own beside the learnt ones.
        let mut r2 = r1.clone();
        r2.routes = (0..20)
            .map(|i| blackhole(100, &format!("198.19.200.{i}/32")))
            .collect();
        let sent = a.netlink.route_messages();
        let out = a.apply(&target("r2", r2.clone())).await;
        ensure!(out.reason.is_none(), "r2: {}", out.message);
        ensure!(runs(&a, &r2).await?, "the kernel runs r2");
        let sent = a.netlink.route_messages() - sent;
        ensure!(
            sent < 200,
            "the kernel sent {sent} route messages for an apply and a check among {ROUTES} routes"
        );

        // Drift: one of the agent's routes deleted by hand is put back, and only that.
        ip(&[
            "route",
            "del",
            "blackhole",
            "198.19.200.7/32",
            "table",
            "100",
        ])?;
        let repaired = a.repair_drift().await?;
        ensure!(!repaired.is_empty(), "the deleted route is drift");
        ensure!(runs(&a, &r2).await?, "drift repaired");
        ensure!(a.repair_drift().await?.is_empty(), "nothing left to repair");

        // r3 blackholes the peer's address: the session drops, the probe fails, r2 comes back and
        // with it the session and the table.
        let mut r3 = r2.clone();
        r3.routes.push(blackhole(254, "198.18.8.2/32"));
        let out = a.apply(&target("r3", r3)).await;
        ensure!(out.reason == Some(Reason::HealthCheckFailed), "{out:?}");
        ensure!(out.rolled_back, "{out:?}");
        ensure!(runs(&a, &r2).await?, "kernel back on r2");
        wait_session(&frr, "198.18.8.2", true, Duration::from_secs(60)).await?;
        learn("the table back after the rollback").await?;

        let agent_peak = netwave_control_plane::host::status_kib(std::process::id(), "VmHWM:")?;
        let frr_rss: u64 = (fr.pids().iter())
            .map(|(_, pid)| netwave_control_plane::host::status_kib(*pid, "VmRSS:"))
            .sum::<Result<u64>>()?;
        eprintln!(
            "peak RSS of this test process (the agent and the test): {:.1} MiB; zebra + bgpd: {:.1} MiB",
            agent_peak as f64 / 1024.0,
            frr_rss as f64 / 1024.0
        );
        ensure!(agent_peak < 128 * 1024, "over the agent's limit");
        ensure!(frr_rss < 256 * 1024, "over the FRR container's limit");
        Ok(())
    });
}
