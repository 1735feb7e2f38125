//! Agent dataplane tests that need VRF and VLAN support. Named `kernel_tier_*` so the kernel tier
//! (tests/kernel-tier/run.sh, a Debian kernel under qemu) runs them; on a kernel without the feature they
//! print SKIPPED and pass, except inside the tier (`NETWAVE_KERNEL_TIER=1`), where that is a failure.
//! Assertions read the kernel through the agent's own observe plus `ip` (the real iproute2 in the guest).

mod common;

use anyhow::{Result, bail, ensure};
use common::{in_netns, ip};
use netwave_agent::netlink::Netlink;
use netwave_api::{Layer2Config, NodeConfig, RouteConfig, RouteType, RuleConfig, VrfConfig};
use netwave_core::dataplane::diff::diff;
use netwave_core::dataplane::{Feature, LinkKind, NodeSettings, desired};

/// `Ok(false)`: skip (printed); an error inside the kernel tier.
async fn has(nl: &Netlink, test: &str, needs: &[Feature]) -> Result<bool> {
    let caps = nl.capabilities().await;
    let missing: Vec<&str> = needs
        .iter()
        .filter(|f| !caps[f])
        .map(|f| f.name())
        .collect();
    if missing.is_empty() {
        return Ok(true);
    }
    if std::env::var_os("NETWAVE_KERNEL_TIER").is_some_and(|v| v == "1") {
        bail!("{test}: kernel lacks {missing:?}; the kernel tier must provide it");
    }
    eprintln!(
        "SKIPPED {test}: kernel lacks {missing:?}; it runs in the kernel tier (tests/kernel-tier/run.sh)"
    );
    Ok(false)
}

/// The mirror tests' node: VRF `blue` with the loopback `lo.mir` (this node's 198.18.91.3, the
/// tunnel's source) and segment 10 in it.
fn mirror_base(mut blue: VrfConfig) -> NodeConfig {
    blue.loopbacks = vec![netwave_api::LoopbackConfig {
        name: "lo.mir".into(),
        subnet: "198.18.91.0/29".into(),
        address: "198.18.91.3/32".into(),
    }];
    NodeConfig {
        vrfs: vec![blue],
        layer2s: vec![l2(10, Some("vr.blue"))],
        ..NodeConfig::default()
    }
}

fn l2(vlan: u16, vrf: Option<&str>) -> Layer2Config {
    Layer2Config::segment(vlan, 1000 + u32::from(vlan))
        .with_mtu(1450)
        .with_anycast(
            "02:00:5e:00:01:01",
            &[format!("198.18.{vlan}.1/24"), format!("fd00:{vlan}::1/64")],
        )
        .with_vrf(vrf)
        .with_neigh_suppression(true)
}

fn vrf_config() -> NodeConfig {
    NodeConfig {
        bgp_peers: Vec::new(),
        mirror_tunnels: Vec::new(),
        mirrors: Vec::new(),
        underlay: None,
        vrfs: vec![
            VrfConfig::named("blue")
                .with_table(100)
                .with_l3_vni(5000)
                .with_mtu(1450),
            VrfConfig::named("red")
                .with_table(200)
                .with_l3_vni(6000)
                .with_mtu(1450),
        ],
        layer2s: vec![l2(10, Some("vr.blue")), l2(20, None)],
        routes: vec![
            RouteConfig {
                table: 100,
                prefix: "198.19.0.0/16".into(),
                via: Some("198.18.10.254".into()),
                dev: None,
                kind: RouteType::Unicast,
                metric: None,
            },
            RouteConfig {
                table: 100,
                prefix: "198.19.9.0/24".into(),
                via: None,
                dev: None,
                kind: RouteType::Blackhole,
                metric: Some(10),
            },
        ],
        rules: vec![RuleConfig {
            priority: 1000,
            table: 200,
            from: Some("198.18.20.0/24".into()),
            to: None,
            iif: None,
            fwmark: None,
            fwmask: None,
        }],
    }
}

fn settings() -> NodeSettings {
    NodeSettings {
        vxlan_local: Some("198.18.0.10".parse().unwrap()),
        ..NodeSettings::default()
    }
}

#[test]
fn kernel_tier_vrfs_with_l3_vni_and_segments_in_vrfs() {
    in_netns(
        "kernel_tier_vrfs_with_l3_vni_and_segments_in_vrfs",
        || async {
            let nl = Netlink::connect(settings())?;
            if !has(
                &nl,
                "kernel_tier_vrfs_with_l3_vni_and_segments_in_vrfs",
                &[Feature::Vrf],
            )
            .await?
            {
                return Ok(());
            }
            let cfg = vrf_config();
            let want = desired(&cfg, nl.settings())?;
            nl.reconcile(&want).await?;
            let snap = nl.observe().await?;
            let links = &snap.observed.managed.links;
            ensure!(links["vr.blue"].kind == LinkKind::Vrf { table: 100 });
            ensure!(links["br.blue"].master.as_deref() == Some("vr.blue"));
            ensure!(links["vx.blue"].master.as_deref() == Some("br.blue"));
            ensure!(links["l2.10"].master.as_deref() == Some("vr.blue"));
            ensure!(links["l2.20"].master.is_none());
            // Routes in the VRF table, and the segment's connected route moved there by the kernel.
            let t100 = ip(&["route", "show", "vrf", "vr.blue"])?;
            ensure!(t100.contains("198.19.0.0/16 via 198.18.10.254"), "{t100}");
            ensure!(t100.contains("blackhole 198.19.9.0/24"), "{t100}");
            ensure!(t100.contains("198.18.10.0/24 dev l2.10"), "{t100}");
            ensure!(nl.reconcile(&want).await?.writes == 0, "re-apply wrote");

            // Move the segment from blue to red: one enslave; IPv6 addresses dropped by the VRF cycle are
            // re-added by the converging second pass.
            // Its gateway route follows it into red's table (a blue route via a red gateway would be
            // unreachable, and the kernel drops routes through a device that leaves the VRF).
            let mut moved = cfg.clone();
            moved.layer2s[0].vrf = Some("vr.red".into());
            moved.routes[0].table = 200;
            let want2 = desired(&moved, nl.settings())?;
            let r = nl.reconcile(&want2).await?;
            let ops: Vec<String> = r.applied.iter().map(ToString::to_string).collect();
            ensure!(
                ops.iter().any(|o| o == "link set l2.10 master vr.red")
                    && ops
                        .iter()
                        .any(|o| o == "route add 198.19.0.0/16 via 198.18.10.254 table 200"),
                "{ops:?}"
            );
            ensure!(
                ip(&["route", "show", "vrf", "vr.red"])?
                    .contains("198.19.0.0/16 via 198.18.10.254")
            );
            ensure!(diff(&want2, &nl.observe().await?.observed)?.is_empty());
            ensure!(ip(&["route", "show", "vrf", "vr.red"])?.contains("198.18.10.0/24 dev l2.10"));
            ensure!(ip(&["-6", "addr", "show", "l2.10"])?.contains("fd00:10::1/64"));

            // A VRF's table cannot change in place: recreated, members re-enslaved.
            let mut retabled = moved.clone();
            retabled.vrfs[1].table = 201;
            retabled.routes[0].table = 201;
            let want3 = desired(&retabled, nl.settings())?;
            nl.reconcile(&want3).await?;
            let snap = nl.observe().await?;
            ensure!(snap.observed.managed.links["vr.red"].kind == LinkKind::Vrf { table: 201 });
            ensure!(snap.observed.managed.links["l2.10"].master.as_deref() == Some("vr.red"));
            ensure!(nl.reconcile(&want3).await?.writes == 0);

            nl.reconcile(&desired(&NodeConfig::default(), nl.settings())?)
                .await?;
            ensure!(nl.observe().await?.observed.managed.links.is_empty());
            Ok(())
        },
    );
}

#[test]
fn kernel_tier_vlan_sub_interfaces_on_a_trunk() {
    in_netns("kernel_tier_vlan_sub_interfaces_on_a_trunk", || async {
        ip(&[
            "link", "add", "trunk0", "type", "veth", "peer", "name", "trunk1",
        ])?;
        ip(&["link", "set", "trunk0", "up"])?;
        let s = NodeSettings {
            vlan_trunk: Some("trunk0".into()),
            ..settings()
        };
        let nl = Netlink::connect(s)?;
        if !has(
            &nl,
            "kernel_tier_vlan_sub_interfaces_on_a_trunk",
            &[Feature::Vlan],
        )
        .await?
        {
            return Ok(());
        }
        let cfg = NodeConfig {
            layer2s: vec![l2(10, None), l2(20, None)],
            ..NodeConfig::default()
        };
        let want = desired(&cfg, nl.settings())?;
        nl.reconcile(&want).await?;
        let d = ip(&["-d", "link", "show", "vlan.10"])?;
        ensure!(
            d.contains("vlan protocol 802.1Q id 10") && d.contains("master l2.10"),
            "{d}"
        );
        ensure!(d.contains("vlan.10@trunk0"), "{d}");
        ensure!(nl.reconcile(&want).await?.writes == 0);

        let mut less = cfg.clone();
        less.layer2s.truncate(1);
        nl.reconcile(&desired(&less, nl.settings())?).await?;
        let links = ip(&["-o", "link", "show"])?;
        ensure!(
            !links.contains("vlan.20") && links.contains("vlan.10") && links.contains("trunk0"),
            "{links}"
        );
        Ok(())
    });
}

#[test]
fn kernel_tier_capabilities_are_all_detected() {
    in_netns("kernel_tier_capabilities_are_all_detected", || async {
        let nl = Netlink::connect(settings())?;
        if !has(
            &nl,
            "kernel_tier_capabilities_are_all_detected",
            &Feature::ALL,
        )
        .await?
        {
            return Ok(());
        }
        ensure!(!ip(&["-o", "link", "show"])?.contains("nwprobe"));
        Ok(())
    });
}

#[test]
fn kernel_tier_sbr_vrf_rules_and_loopback_addresses() {
    let test = "kernel_tier_sbr_vrf_rules_and_loopback_addresses";
    in_netns(test, || async {
        let nl = Netlink::connect(settings())?;
        if !has(&nl, test, &[Feature::Vrf]).await? {
            return Ok(());
        }
        // das-schiff's sbrPrefixes (a local VRF and policy rules to its table) and loopbacks (this
        // node's addresses on the VRF device), as render puts them in a node config.
        let mut blue = VrfConfig::named("blue")
            .with_table(100)
            .with_l3_vni(5000)
            .with_mtu(1450);
        blue.sbr = Some(netwave_api::SbrConfig {
            device: "s-vr.blue".into(),
            table: 101,
            priority: 100,
            prefixes: vec!["198.18.10.0/24".into(), "fd00:10::/64".into()],
        });
        blue.loopbacks = vec![
            netwave_api::LoopbackConfig {
                name: "lo.mir".into(),
                subnet: "198.18.91.0/29".into(),
                address: "198.18.91.3/32".into(),
            },
            netwave_api::LoopbackConfig {
                name: "lo.mir6".into(),
                subnet: "fd94::/125".into(),
                address: "fd94::5/128".into(),
            },
        ];
        let cfg = NodeConfig {
            vrfs: vec![blue],
            ..NodeConfig::default()
        };
        let want = desired(&cfg, nl.settings())?;
        nl.reconcile(&want).await?;
        let links = nl.observe().await?.observed.managed.links;
        ensure!(links["s-vr.blue"].kind == LinkKind::Vrf { table: 101 });
        let rules4 = ip(&["-4", "rule", "show"])?;
        ensure!(
            rules4.contains("100:\tfrom 198.18.10.0/24 lookup 101"),
            "{rules4}"
        );
        let rules6 = ip(&["-6", "rule", "show"])?;
        ensure!(
            rules6.contains("100:\tfrom fd00:10::/64 lookup 101"),
            "{rules6}"
        );
        let addrs = ip(&["addr", "show", "dev", "vr.blue"])?;
        ensure!(
            addrs.contains("198.18.91.3/32") && addrs.contains("fd94::5/128"),
            "{addrs}"
        );
        // The loopback is a route of the VRF's table (what FRR's redistribute connected announces).
        let routes = ip(&["route", "show", "table", "100", "type", "local"])?;
        ensure!(routes.contains("198.18.91.3"), "{routes}");
        ensure!(nl.reconcile(&want).await?.writes == 0, "re-apply wrote");
        // Removed with the VRF.
        nl.reconcile(&desired(&NodeConfig::default(), nl.settings())?)
            .await?;
        ensure!(!ip(&["rule", "show"])?.contains("lookup 101"));
        ensure!(nl.observe().await?.observed.managed.links.is_empty());
        Ok(())
    });
}

/// `ip -s link show dev`: the RX and TX packet counters.
fn packets(dev: &str) -> Result<(u64, u64)> {
    let out = ip(&["-s", "-j", "link", "show", "dev", dev])?;
    let v: serde_json::Value = serde_json::from_str(&out)?;
    let stats = &v[0]["stats64"];
    let n = |dir: &str| stats[dir]["packets"].as_u64().unwrap_or(0);
    Ok((n("rx"), n("tx")))
}

/// A MirrorSelector on a segment, as render puts it in a node config: the tunnel to the collector in
/// VRF blue (from the node's loopback 198.18.91.3, key 7), filters on the segment's bridge and VXLAN
/// device. Pings from a workload port through the bridge are copied through the tunnel to a collector
/// reached over a port of the VRF, counted there; a re-apply writes nothing; removing the selector
/// removes the filters, qdiscs and tunnel and nothing else.
#[test]
fn kernel_tier_a_mirror_copies_a_segments_packets_through_its_gre_tunnel() {
    let test = "kernel_tier_a_mirror_copies_a_segments_packets_through_its_gre_tunnel";
    in_netns(test, move || async move {
        let nl = Netlink::connect(settings())?;
        if !has(&nl, test, &[Feature::Vrf, Feature::Gre]).await? {
            return Ok(());
        }
        let base = mirror_base(VrfConfig::named("blue").with_table(100).with_l3_vni(5000));
        let tunnel = "gtap-col";
        let mut cfg = base.clone();
        cfg.mirror_tunnels = vec![netwave_api::MirrorTunnelConfig {
            name: "col".into(),
            device: tunnel.into(),
            kind: netwave_api::MirrorTargetType::L2gre,
            vrf: "blue".into(),
            local: "198.18.91.3".into(),
            remote: "198.18.90.100".into(),
            key: Some(7),
        }];
        cfg.mirrors = vec![netwave_api::MirrorConfig {
            name: "sel".into(),
            vlan: Some(10),
            vrf: None,
            direction: netwave_api::MirrorDirection::Egress,
            tunnel: tunnel.into(),
            traffic_match: netwave_api::TrafficMatch {
                protocol: Some("icmp".into()),
                ..Default::default()
            },
        }];
        let want = desired(&cfg, nl.settings())?;
        let applied = nl.reconcile(&want).await?;
        ensure!(applied.writes > 0);
        // The collector: a port of VRF blue whose peer (in the main table) owns the collector address.
        ip(&[
            "link", "add", "col0", "type", "veth", "peer", "name", "col1",
        ])?;
        ip(&["link", "set", "col0", "master", "vr.blue", "up"])?;
        ip(&["addr", "add", "198.18.90.1/24", "dev", "col0"])?;
        ip(&["link", "set", "col1", "up"])?;
        ip(&["addr", "add", "198.18.90.100/24", "dev", "col1"])?;
        // The collector's MAC, so no copy waits for (or is dropped behind) ARP. `replace`, not `add`:
        // the tunnel may already have sent (its IPv6 autoconfiguration, once col0 is up) and left an
        // incomplete entry for the collector, and `add` then fails with "File exists".
        let col1: serde_json::Value = serde_json::from_str(&ip(&["-j", "link", "show", "col1"])?)?;
        let mac = col1[0]["address"].as_str().unwrap_or_default().to_string();
        ip(&[
            "neigh",
            "replace",
            "198.18.90.100",
            "lladdr",
            &mac,
            "dev",
            "col0",
        ])?;
        // A workload port on the segment's bridge; its peer pings the anycast gateway.
        ip(&["link", "add", "wl0", "type", "veth", "peer", "name", "wl1"])?;
        ip(&["link", "set", "wl0", "master", "l2.10", "up"])?;
        ip(&["link", "set", "wl1", "up"])?;
        ip(&["addr", "add", "198.18.10.5/24", "dev", "wl1"])?;
        // The gateway's MAC (the segment's anycast MAC), so no ARP is needed before the pings.
        ip(&[
            "neigh",
            "replace",
            "198.18.10.1",
            "lladdr",
            "02:00:5e:00:01:01",
            "dev",
            "wl1",
        ])?;

        let snap = nl.observe().await?;
        let m = &snap.observed.managed;
        ensure!(m.links["l2.10"].clsact && m.links["vx.10"].clsact, "{m:#?}");
        ensure!(m.mirrors == want.mirrors, "observed {:#?}", m.mirrors);
        let d = ip(&["-d", "link", "show", tunnel])?;
        ensure!(
            d.contains("gretap remote 198.18.90.100 local 198.18.91.3")
                && d.contains("master vr.blue"),
            "{d}"
        );
        ensure!(nl.reconcile(&want).await?.writes == 0, "re-apply wrote");

        let collector = Collector::open()?;
        let (rx0, _) = packets("col1")?;
        let (_, tx0) = packets(tunnel)?;
        // The echo requests are what is mirrored (from the workload: the bridge's ingress); whether
        // the VRF answers a port in the main table does not matter here.
        let ping = std::process::Command::new("ping")
            .args(["-c", "5", "-W", "1", "-I", "wl1", "198.18.10.1"])
            .output()?;
        eprintln!("{test}: {}", String::from_utf8_lossy(&ping.stdout).trim());
        let (rx1, _) = packets("col1")?;
        let (_, tx1) = packets(tunnel)?;
        let copies = collector.echo_requests(7)?;
        eprintln!(
            "{test}: 5 pings, {copies} ICMP echo requests with GRE key 7 at the collector ({} packets \
             counted out of {tunnel}, {} into the collector's port)",
            tx1 - tx0,
            rx1 - rx0
        );
        ensure!(copies == 5, "the collector got {copies} copies of 5 pings");

        // Removing the selector: filters, qdiscs and tunnel go; nothing else is touched.
        let r = nl.reconcile(&desired(&base, nl.settings())?).await?;
        let ops: Vec<String> = r.applied.iter().map(ToString::to_string).collect();
        ensure!(
            ops == [
                "qdisc del dev l2.10 clsact".to_string(),
                "qdisc del dev vx.10 clsact".to_string(),
                format!("link del {tunnel}"),
            ],
            "{ops:?}"
        );
        let snap = nl.observe().await?;
        ensure!(snap.observed.managed.mirrors.is_empty());
        ensure!(!snap.observed.managed.links.contains_key(tunnel));
        std::process::Command::new("ping")
            .args(["-c", "3", "-W", "1", "-I", "wl1", "198.18.10.1"])
            .output()?;
        let after = collector.echo_requests(7)?;
        ensure!(after == 0, "copies after removal: {after}");
        Ok(())
    });
}

/// The collector's end: a raw IPv4 socket for GRE (protocol 47) in the test's namespace, where the
/// collector address is local.
struct Collector(socket2::Socket);

impl Collector {
    fn open() -> Result<Collector> {
        use socket2::{Domain, Protocol, Socket, Type};
        let s = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::from(47)))?;
        s.set_read_timeout(Some(std::time::Duration::from_millis(300)))?;
        Ok(Collector(s))
    }

    /// Drains what arrived: the Ethernet-over-GRE packets with `key` carrying an ICMP echo request.
    fn echo_requests(&self, key: u32) -> Result<usize> {
        use std::io::Read;
        let mut n = 0;
        let mut buf = [0u8; 2048];
        loop {
            let len = match (&self.0).read(&mut buf) {
                Ok(len) => len,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(n);
                }
                Err(e) => return Err(e.into()),
            };
            let p = &buf[..len];
            let ihl = usize::from(p[0] & 0x0f) * 4;
            let gre = &p[ihl..];
            // Flags with the key bit, protocol 0x6558 (transparent Ethernet bridging), the key.
            if gre.len() < 8 || gre[0] & 0x20 == 0 || gre[2..4] != [0x65, 0x58] {
                continue;
            }
            if u32::from_be_bytes([gre[4], gre[5], gre[6], gre[7]]) != key {
                continue;
            }
            let frame = &gre[8..];
            // Ethernet type IPv4, IP protocol ICMP, ICMP type 8 (echo request).
            if frame.len() >= 14 + 21 && frame[12..14] == [0x08, 0x00] {
                let ip = &frame[14..];
                let ihl = usize::from(ip[0] & 0x0f) * 4;
                if ip[9] == 1 && ip.get(ihl) == Some(&8) {
                    n += 1;
                }
            }
        }
    }
}

/// The agent's health gate of mirrors: a revision whose tunnel is sourced from an address its VRF does
/// not have (the loopback allocation moved, say) fails the node with the tunnel named, and the node
/// goes back to its last good revision, tunnel and filters gone; a good one is Provisioned with one
/// passed, gating result per tunnel and selector.
#[test]
fn kernel_tier_a_mirror_not_in_place_fails_the_node_and_is_rolled_back() {
    let test = "kernel_tier_a_mirror_not_in_place_fails_the_node_and_is_rolled_back";
    in_netns(test, move || async move {
        use netwave_agent::backup::StateDir;
        use netwave_agent::health::{HealthConfig, Prober};
        use netwave_agent::reconcile::{Agent, Reason, Target};
        let netlink = Netlink::connect(settings())?;
        if !has(&netlink, test, &[Feature::Vrf, Feature::Gre]).await? {
            return Ok(());
        }
        let dir = tempfile::tempdir()?;
        let agent = Agent {
            caps: netlink.capabilities().await,
            prober: Prober::new(
                HealthConfig {
                    api_server: false,
                    deadline_seconds: 1.0,
                    ..HealthConfig::default()
                },
                netlink.clone(),
                None,
            ),
            state: StateDir::open(dir.path())?,
            netlink,
            frr: None,
            timings: Default::default(),
            drill: None,
        };
        let target = |rev: &str, config: NodeConfig| Target {
            revision: rev.into(),
            retry: 0,
            config_hash: format!("hash-{rev}"),
            config,
        };
        // No L3 VNI: without FRR the agent refuses BGP content; the tunnel needs none on the node.
        let base = mirror_base(VrfConfig::named("blue").with_table(100));
        let mirrored = |local: &str| {
            let mut c = base.clone();
            c.mirror_tunnels = vec![netwave_api::MirrorTunnelConfig {
                name: "col".into(),
                device: "gre-col".into(),
                kind: netwave_api::MirrorTargetType::L3gre,
                vrf: "blue".into(),
                local: local.into(),
                remote: "198.18.90.100".into(),
                key: None,
            }];
            c.mirrors = vec![netwave_api::MirrorConfig {
                name: "sel".into(),
                vlan: Some(10),
                vrf: None,
                direction: netwave_api::MirrorDirection::Ingress,
                tunnel: "gre-col".into(),
                traffic_match: Default::default(),
            }];
            c
        };
        let r1 = agent.apply(&target("r1", base.clone())).await;
        ensure!(r1.reason.is_none(), "r1: {}", r1.message);

        let r2 = agent.apply(&target("r2", mirrored("198.18.91.9"))).await;
        ensure!(r2.reason == Some(Reason::HealthCheckFailed), "{r2:?}");
        ensure!(
            r2.message.starts_with(
                "HealthCheckFailed: mirror-tunnel col (gre-col): VRF vr.blue does not have the \
                 tunnel's source address 198.18.91.9"
            ),
            "{}",
            r2.message
        );
        ensure!(r2.rolled_back && r2.last_good_revision.as_deref() == Some("r1"));
        let snap = agent.netlink.observe().await?;
        ensure!(!snap.observed.managed.links.contains_key("gre-col"));
        ensure!(snap.observed.managed.mirrors.is_empty());

        let r3 = agent.apply(&target("r3", mirrored("198.18.91.3"))).await;
        ensure!(r3.reason.is_none(), "r3: {}", r3.message);
        let gates: Vec<(&str, &str, bool)> = r3
            .probes
            .iter()
            .map(|p| (p.name.as_str(), p.result.as_str(), p.gating))
            .collect();
        ensure!(
            gates
                == [
                    ("mirror-tunnel col (gre-col)", "Passed", true),
                    ("mirror sel", "Passed", true)
                ],
            "{gates:?}"
        );
        Ok(())
    });
}
