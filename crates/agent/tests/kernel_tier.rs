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
        let mut blue = VrfConfig::named("blue").with_table(100).with_l3_vni(5000);
        blue.loopbacks = vec![netwave_api::LoopbackConfig {
            name: "lo.mir".into(),
            subnet: "198.18.91.0/29".into(),
            address: "198.18.91.3/32".into(),
        }];
        let base = NodeConfig {
            vrfs: vec![blue],
            layer2s: vec![l2(10, Some("vr.blue"))],
            ..NodeConfig::default()
        };
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
        // A workload port on the segment's bridge; its peer pings the anycast gateway.
        ip(&["link", "add", "wl0", "type", "veth", "peer", "name", "wl1"])?;
        ip(&["link", "set", "wl0", "master", "l2.10", "up"])?;
        ip(&["link", "set", "wl1", "up"])?;
        ip(&["addr", "add", "198.18.10.5/24", "dev", "wl1"])?;
        // The gateway's MAC (the segment's anycast MAC), so no ARP is needed before the pings.
        ip(&[
            "neigh",
            "add",
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
        eprintln!(
            "{test}: 5 pings, {} copies sent through {tunnel}, {} packets at the collector",
            tx1 - tx0,
            rx1 - rx0
        );
        ensure!(tx1 - tx0 >= 5, "tunnel sent {} copies", tx1 - tx0);
        ensure!(rx1 - rx0 >= 5, "collector got {}", rx1 - rx0);

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
        let (rx2, _) = packets("col1")?;
        std::process::Command::new("ping")
            .args(["-c", "3", "-W", "1", "-I", "wl1", "198.18.10.1"])
            .output()?;
        let (rx3, _) = packets("col1")?;
        ensure!(rx3 == rx2, "copies after removal: {}", rx3 - rx2);
        Ok(())
    });
}
