//! The netlink shell against the real kernel, each test in its own throwaway network namespace (root).
//! Covers what this kernel supports: bridges, vxlan, veth, addresses, routes in tables, rules.

mod common;

use anyhow::{Result, ensure};
use common::{in_netns, ip, ip_can};
use netwave_agent::netlink::{Netlink, NetlinkError};
use netwave_api::{Layer2Config, NodeConfig, RouteConfig, RouteType, RuleConfig};
use netwave_core::dataplane::diff::diff;
use netwave_core::dataplane::{Feature, NodeSettings, desired};

fn settings() -> NodeSettings {
    NodeSettings {
        vxlan_local: Some("198.18.0.10".parse().unwrap()),
        protected: vec!["eth0".into()],
        ..NodeSettings::default()
    }
}

fn l2(vlan: u16, vni: u32) -> Layer2Config {
    Layer2Config::segment(vlan, vni)
        .with_mtu(1450)
        .with_anycast(
            "02:00:5e:00:01:01",
            &[format!("198.18.{vlan}.1/24"), format!("fd00:{vlan}::1/64")],
        )
        .with_neigh_suppression(vlan == 20)
}

fn route(
    table: u32,
    prefix: &str,
    via: Option<&str>,
    dev: Option<&str>,
    kind: RouteType,
) -> RouteConfig {
    RouteConfig {
        table,
        prefix: prefix.into(),
        via: via.map(str::to_string),
        dev: dev.map(str::to_string),
        kind,
        metric: None,
    }
}

fn config() -> NodeConfig {
    NodeConfig {
        bgp_peers: Vec::new(),
        mirror_tunnels: Vec::new(),
        mirrors: Vec::new(),
        underlay: None,
        vrfs: vec![],
        layer2s: vec![l2(10, 1010), l2(20, 1020)],
        routes: vec![
            route(
                100,
                "198.19.0.0/16",
                Some("198.18.10.254"),
                None,
                RouteType::Unicast,
            ),
            route(
                100,
                "198.19.1.0/24",
                None,
                Some("l2.20"),
                RouteType::Unicast,
            ),
            // host bits set on purpose: the agent masks them (the kernel would say EINVAL)
            route(100, "198.19.2.9/24", None, None, RouteType::Blackhole),
            RouteConfig {
                metric: Some(50),
                ..route(1000, "0.0.0.0/0", None, None, RouteType::Unreachable)
            },
            route(
                100,
                "fd00:99::/64",
                Some("fd00:10::fe"),
                None,
                RouteType::Unicast,
            ),
            route(100, "fd00:98::/64", None, None, RouteType::Unreachable),
            route(100, "fd00:97::/64", None, None, RouteType::Blackhole),
        ],
        rules: vec![
            RuleConfig {
                priority: 1000,
                table: 100,
                from: Some("198.18.10.0/24".into()),
                to: None,
                iif: None,
                fwmark: None,
                fwmask: None,
            },
            RuleConfig {
                priority: 1001,
                table: 1000,
                from: None,
                to: None,
                iif: Some("l2.20".into()),
                fwmark: None,
                fwmask: None,
            },
        ],
    }
}

#[test]
fn apply_from_empty_then_reapply_writes_nothing() {
    in_netns("apply_from_empty_then_reapply_writes_nothing", || async {
        let nl = Netlink::connect(settings())?;
        let want = desired(&config(), nl.settings())?;
        let first = nl.reconcile(&want).await?;
        ensure!(first.writes > 0 && !first.applied.is_empty());

        let link = ip(&["-d", "link", "show", "vx.20"])?;
        for needle in [
            "vxlan id 1020",
            "local 198.18.0.10",
            "dstport 4789",
            "nolearning",
            "master l2.20",
            "neigh_suppress on",
            "alias netwave:managed",
            "mtu 1450",
        ] {
            ensure!(link.contains(needle), "vx.20 lacks {needle:?}:\n{link}");
        }
        ensure!(ip(&["-d", "link", "show", "vx.10"])?.contains("neigh_suppress off"));
        let br = ip(&["link", "show", "l2.10"])?;
        ensure!(
            br.contains("02:00:5e:00:01:01") && br.contains("state UP") || br.contains(",UP"),
            "{br}"
        );
        let addrs = ip(&["addr", "show", "l2.10"])?;
        ensure!(
            addrs.contains("198.18.10.1/24") && addrs.contains("fd00:10::1/64"),
            "{addrs}"
        );
        let routes = ip(&["route", "show", "table", "100", "proto", "242"])?;
        for needle in [
            "198.19.0.0/16 via 198.18.10.254",
            "198.19.1.0/24 dev l2.20",
            "blackhole 198.19.2.0/24",
        ] {
            ensure!(
                routes.contains(needle),
                "table 100 lacks {needle:?}:\n{routes}"
            );
        }
        ensure!(ip(&["route", "show", "table", "1000"])?.contains("unreachable default"));
        let v6 = ip(&["-6", "route", "show", "table", "100"])?;
        ensure!(
            v6.contains("unreachable fd00:98::/64") && v6.contains("blackhole fd00:97::/64"),
            "{v6}"
        );
        ensure!(
            ip(&["-6", "route", "show", "table", "100"])?.contains("fd00:99::/64 via fd00:10::fe")
        );
        let rules = ip(&["rule", "show"])?;
        ensure!(
            rules.contains("1000:\tfrom 198.18.10.0/24 lookup 100 proto 242"),
            "{rules}"
        );
        ensure!(
            rules.contains("1001:\tfrom all iif l2.20 lookup 1000 proto 242"),
            "{rules}"
        );
        // The rule has an action: lookups through it work (a rule without one fails with EINVAL).
        let got = ip(&["route", "get", "198.19.0.1", "from", "198.18.10.1"])?;
        ensure!(got.contains("via 198.18.10.254"), "{got}");

        // Verify and idempotence: the kernel matches, a second apply writes nothing.
        let snap = nl.observe().await?;
        ensure!(diff(&want, &snap.observed)?.is_empty());
        let before = nl.writes();
        let again = nl.reconcile(&want).await?;
        ensure!(again.applied.is_empty(), "re-apply did {:?}", again.applied);
        ensure!(nl.writes() == before && again.writes == 0);

        // Back to empty removes everything the agent made.
        let empty = desired(&NodeConfig::default(), nl.settings())?;
        nl.reconcile(&empty).await?;
        let links = ip(&["-o", "link", "show"])?;
        ensure!(!links.contains("l2.") && !links.contains("vx."), "{links}");
        ensure!(
            ip(&["route", "show", "table", "all", "proto", "242"])?
                .trim()
                .is_empty()
        );
        ensure!(!ip(&["rule", "show"])?.contains("proto 242"));
        Ok(())
    });
}

#[test]
fn drift_is_repaired_and_reported() {
    in_netns("drift_is_repaired_and_reported", || async {
        let nl = Netlink::connect(settings())?;
        let want = desired(&config(), nl.settings())?;
        nl.reconcile(&want).await?;
        // Someone changes things behind the agent's back.
        ip(&["link", "set", "l2.10", "mtu", "1400"])?;
        ip(&["addr", "del", "198.18.20.1/24", "dev", "l2.20"])?;
        ip(&["route", "del", "198.19.0.0/16", "table", "100"])?;
        ip(&["link", "del", "vx.20"])?;
        ip(&["link", "set", "vx.10", "down"])?;
        ip(&["rule", "del", "priority", "1000"])?;

        let fix = nl.reconcile(&want).await?;
        let applied: Vec<String> = fix.applied.iter().map(ToString::to_string).collect();
        for needle in [
            "link set l2.10 mtu 1450",
            "addr add 198.18.20.1/24 dev l2.20",
            "route add 198.19.0.0/16 via 198.18.10.254 table 100",
            "link add vx.20 mtu 1450 type vxlan id 1020 local 198.18.0.10 dstport 4789 nolearning",
            "link set vx.20 type bridge_slave neigh_suppress on",
            "link set vx.10 up",
            "rule add -4 priority 1000 from 198.18.10.0/24 lookup 100",
        ] {
            ensure!(
                applied.iter().any(|a| a == needle),
                "{needle:?} not in {applied:#?}"
            );
        }
        ensure!(diff(&want, &nl.observe().await?.observed)?.is_empty());
        ensure!(nl.reconcile(&want).await?.writes == 0);
        Ok(())
    });
}

fn marked(priority: u32, table: u32, fwmark: u32, fwmask: Option<u32>) -> RuleConfig {
    RuleConfig {
        priority,
        table,
        from: None,
        to: None,
        iif: None,
        fwmark: Some(fwmark),
        fwmask,
    }
}

#[test]
fn rules_with_a_firewall_mark_read_back_as_written() {
    in_netns(
        "rules_with_a_firewall_mark_read_back_as_written",
        || async {
            let nl = Netlink::connect(settings())?;
            let mut cfg = config();
            cfg.rules.extend([
                // The kernel stores a full mask and reports it.
                marked(2000, 100, 0x10, None),
                marked(2001, 100, 0x20, Some(0xf0)),
                // The kernel reports the mask alone: a zero mark is not reported.
                marked(2002, 1000, 0, Some(0xff)),
                marked(2003, 1000, 0, Some(u32::MAX)),
            ]);
            let want = desired(&cfg, nl.settings())?;
            ensure!(nl.reconcile(&want).await?.writes > 0);
            let rules = ip(&["rule", "show"])?;
            for needle in [
                "2000:\tfrom all fwmark 0x10 lookup 100 proto 242",
                "2001:\tfrom all fwmark 0x20/0xf0 lookup 100 proto 242",
                "2002:\tfrom all fwmark 0/0xff lookup 1000 proto 242",
                "2003:\tfrom all fwmark 0 lookup 1000 proto 242",
            ] {
                ensure!(rules.contains(needle), "no {needle:?}:\n{rules}");
            }
            // The mark decides: 0x10 and 0x2f reach table 100 (its route), a low byte of 0 table 1000
            // (its unreachable route: "No route to host"), and a mark no rule takes the main table,
            // where nothing leads there ("Network is unreachable").
            for (mark, want) in [
                ("0x10", "via 198.18.10.254"),
                ("0x2f", "via 198.18.10.254"),
                ("0x100", "No route to host"),
                ("0x1", "Network is unreachable"),
            ] {
                let got = match ip(&["route", "get", "198.19.0.1", "mark", mark]) {
                    Ok(out) => out,
                    Err(e) => e.to_string(),
                };
                ensure!(got.contains(want), "mark {mark}: {got}");
            }

            // Read back exactly as written: a zero mark from its mask alone, a full mask on a non-zero
            // mark as none.
            let snap = nl.observe().await?;
            let rules = |rules: &std::collections::BTreeSet<netwave_core::dataplane::Rule>| {
                rules.iter().map(ToString::to_string).collect::<Vec<_>>()
            };
            ensure!(
                snap.observed.managed.rules == want.rules,
                "observed {:#?}\nwant {:#?}",
                rules(&snap.observed.managed.rules),
                rules(&want.rules)
            );
            ensure!(diff(&want, &snap.observed)?.is_empty());
            let before = nl.writes();
            let again = nl.reconcile(&want).await?;
            ensure!(again.applied.is_empty(), "re-apply did {:?}", again.applied);
            ensure!(nl.writes() == before && again.writes == 0);

            // A changed mask replaces the rule: the old one is found (by its mark and mask) and deleted.
            cfg.rules[3].fwmask = Some(0x30);
            let want = desired(&cfg, nl.settings())?;
            nl.reconcile(&want).await?;
            let rules = ip(&["rule", "show", "priority", "2001"])?;
            ensure!(
                rules.trim() == "2001:\tfrom all fwmark 0x20/0x30 lookup 100 proto 242",
                "{rules}"
            );
            ensure!(diff(&want, &nl.observe().await?.observed)?.is_empty());

            let empty = desired(&NodeConfig::default(), nl.settings())?;
            nl.reconcile(&empty).await?;
            ensure!(!ip(&["rule", "show"])?.contains("proto 242"));
            Ok(())
        },
    );
}

#[test]
fn unmanaged_objects_are_never_touched() {
    in_netns("unmanaged_objects_are_never_touched", || async {
        // A management-like veth with an address and routes, a foreign bridge, a foreign route in a
        // table the agent also uses, a foreign rule.
        ip(&[
            "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p",
        ])?;
        ip(&["addr", "add", "198.18.0.10/24", "dev", "eth0"])?;
        ip(&["link", "set", "eth0", "up"])?;
        ip(&["link", "set", "eth0p", "up"])?;
        ip(&["route", "add", "default", "via", "198.18.0.1"])?;
        ip(&["link", "add", "br-other", "type", "bridge"])?;
        ip(&[
            "route",
            "add",
            "198.19.50.0/24",
            "via",
            "198.18.0.1",
            "table",
            "100",
        ])?;
        ip(&[
            "rule",
            "add",
            "priority",
            "500",
            "from",
            "198.18.0.0/24",
            "lookup",
            "100",
        ])?;
        let snapshot = || -> Result<String> {
            Ok(format!(
                "{}{}{}{}{}",
                ip(&["-d", "link", "show", "eth0"])?,
                ip(&["-d", "link", "show", "br-other"])?,
                ip(&["addr", "show", "eth0"])?,
                ip(&["route", "show", "table", "main"])?
                    + &ip(&["route", "show", "table", "100", "proto", "boot"])?,
                ip(&["rule", "show", "priority", "500"])?,
            ))
        };
        let before = snapshot()?;

        let nl = Netlink::connect(settings())?;
        nl.reconcile(&desired(&config(), nl.settings())?).await?;
        nl.reconcile(&desired(&NodeConfig::default(), nl.settings())?)
            .await?;
        ensure!(snapshot()? == before, "foreign state changed");

        // A foreign device with a name the config wants is refused before any write.
        let mut cfg = config();
        cfg.layer2s[0].bridge = "br-other".into();
        let w = nl.writes();
        let err = nl
            .reconcile(&desired(&cfg, nl.settings())?)
            .await
            .unwrap_err();
        ensure!(matches!(err, NetlinkError::Conflict(_)), "{err}");
        ensure!(nl.writes() == w, "wrote before refusing");
        // Even a foreign link that carries our alias but is protected stays foreign.
        ip(&["link", "set", "eth0", "alias", "netwave:managed"])?;
        let snap = nl.observe().await?;
        ensure!(snap.observed.foreign_links.contains("eth0"));
        ensure!(!snap.observed.managed.links.contains_key("eth0"));
        Ok(())
    });
}

#[test]
fn capabilities_match_what_the_kernel_accepts() {
    in_netns("capabilities_match_what_the_kernel_accepts", || async {
        let nl = Netlink::connect(settings())?;
        let caps = nl.capabilities().await;
        let vrf = ip_can(&["link", "add", "t0", "type", "vrf", "table", "10"]);
        let bridge = ip_can(&["link", "add", "t0", "type", "bridge"]);
        let vxlan = ip_can(&[
            "link", "add", "t0", "type", "vxlan", "id", "5", "dstport", "0",
        ]);
        let vlan_filtering =
            ip_can(&["link", "add", "t0", "type", "bridge", "vlan_filtering", "1"]);
        ip(&["link", "add", "t1", "type", "bridge"])?;
        let vlan = ip_can(&["link", "add", "t0", "link", "t1", "type", "vlan", "id", "5"]);
        ip(&["link", "del", "t1"])?;
        ensure!(caps[&Feature::Vrf] == vrf, "vrf: {caps:?}");
        ensure!(
            caps[&Feature::Bridge] == bridge && bridge,
            "bridge: {caps:?}"
        );
        ensure!(caps[&Feature::Vxlan] == vxlan && vxlan, "vxlan: {caps:?}");
        ensure!(
            caps[&Feature::BridgeVlanFiltering] == vlan_filtering,
            "{caps:?}"
        );
        ensure!(caps[&Feature::Vlan] == vlan, "vlan: {caps:?}");
        // The probes leave nothing behind.
        ensure!(!ip(&["-o", "link", "show"])?.contains("nwprobe"));
        Ok(())
    });
}

/// Lines for `ip -batch`: `count` blackhole routes of protocol bgp, IPv4 /32s from 198.18.128.0/17 and
/// IPv6 /64s from fd00:f000::/32, alternating between the main table and table 100 (the agent's).
pub fn foreign_routes(count: u32) -> String {
    let mut out = String::new();
    for i in 0..count {
        let table = if i % 2 == 0 { "main" } else { "100" };
        let line = if i % 3 == 0 && i / 3 < 32_768 {
            let n = i / 3;
            format!("198.18.{}.{}/32", 128 + n / 256, n % 256)
        } else {
            format!("fd00:f000:{:x}:{:x}::/64", i >> 16, i & 0xffff)
        };
        out.push_str(&format!(
            "route add blackhole {line} table {table} proto bgp\n"
        ));
    }
    out
}

/// An edge node learns a large table by BGP (#49): among 100,000 foreign routes, some in the agent's
/// own table, the agent reads exactly its own, the kernel sends it nothing else, a no-op reconcile
/// writes nothing, and no foreign route is touched.
#[test]
fn the_agent_reads_only_its_own_routes_among_100000_foreign_ones() {
    in_netns(
        "the_agent_reads_only_its_own_routes_among_100000_foreign_ones",
        || async {
            let nl = Netlink::connect(settings())?;
            let want = desired(&config(), nl.settings())?;
            nl.reconcile(&want).await?;
            common::ip_batch(&foreign_routes(100_000))?;
            let count = |args: &[&str]| -> Result<usize> { Ok(ip(args)?.lines().count()) };
            let bgp = count(&["-4", "route", "show", "table", "all", "proto", "bgp"])?
                + count(&["-6", "route", "show", "table", "all", "proto", "bgp"])?;
            ensure!(bgp == 100_000, "{bgp} foreign routes in the kernel");

            ensure!(
                nl.kernel_filters_routes(),
                "this kernel has strict dump checking"
            );
            let (messages, writes) = (nl.route_messages(), nl.writes());
            let snap = nl.observe().await?;
            let sent = nl.route_messages() - messages;
            let seen: Vec<_> = snap.observed.managed.routes.keys().collect();
            ensure!(
                seen == want.routes.keys().collect::<Vec<_>>()
                    && diff(&want, &snap.observed)?.is_empty(),
                "the agent sees exactly its own routes: {seen:?}"
            );
            ensure!(
                sent == want.routes.len() as u64,
                "the kernel sent {sent} route messages for {} routes of the agent",
                want.routes.len()
            );
            let again = nl.reconcile(&want).await?;
            ensure!(again.applied.is_empty() && nl.writes() == writes);
            let after = count(&["-4", "route", "show", "table", "all", "proto", "bgp"])?
                + count(&["-6", "route", "show", "table", "all", "proto", "bgp"])?;
            ensure!(after == 100_000, "foreign routes left alone: {after}");
            Ok(())
        },
    );
}
