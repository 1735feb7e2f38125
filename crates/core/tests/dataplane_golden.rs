//! Golden operation lists: config change in, exact ordered netlink operations out, no kernel needed.

use netwave_api::{Layer2Config, NodeConfig, RouteConfig, RouteType, RuleConfig, VrfConfig};
use netwave_core::dataplane::diff::{DiffError, Observed, diff};
use netwave_core::dataplane::{Dataplane, ModelError, NodeSettings, desired};

fn settings() -> NodeSettings {
    NodeSettings {
        vxlan_local: Some("198.18.0.10".parse().unwrap()),
        ..NodeSettings::default()
    }
}

fn l2(vlan: u16, vni: u32, vrf: Option<&str>) -> Layer2Config {
    Layer2Config::segment(vlan, vni)
        .with_anycast("02:00:5e:00:01:01", &[format!("10.{vlan}.0.1/24")])
        .with_vrf(vrf)
        .with_neigh_suppression(true)
}

fn route(table: u32, prefix: &str, via: Option<&str>, kind: RouteType) -> RouteConfig {
    RouteConfig {
        table,
        prefix: prefix.into(),
        via: via.map(str::to_string),
        dev: None,
        kind,
        metric: None,
    }
}

fn base() -> NodeConfig {
    NodeConfig {
        bgp_peers: Vec::new(),
        mirror_tunnels: Vec::new(),
        mirrors: Vec::new(),
        underlay: None,
        vrfs: vec![VrfConfig::named("blue").with_table(100).with_l3_vni(5000)],
        layer2s: vec![l2(10, 1010, Some("vr.blue")), l2(20, 1020, None)],
        routes: vec![
            route(100, "10.99.0.0/16", Some("10.10.0.254"), RouteType::Unicast),
            route(100, "192.0.2.0/24", None, RouteType::Blackhole),
        ],
        rules: vec![RuleConfig {
            priority: 1000,
            table: 100,
            from: Some("10.10.0.0/24".into()),
            to: None,
            iif: None,
            fwmark: None,
            fwmask: None,
        }],
    }
}

fn dp(cfg: &NodeConfig) -> Dataplane {
    desired(cfg, &settings()).expect("valid config")
}

/// Ops to go from config `from` (as if the kernel had it exactly) to config `to`.
fn ops(from: &NodeConfig, to: &NodeConfig) -> Vec<String> {
    let observed = Observed {
        managed: dp(from),
        foreign_links: ["eth0".to_string(), "lo".to_string()].into(),
    };
    diff(&dp(to), &observed)
        .expect("no conflict")
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn create_from_empty() {
    let got = ops(&NodeConfig::default(), &base());
    let want = [
        "link add vr.blue type vrf table 100",
        "link add br.blue mtu 9000 type bridge",
        "link add l2.10 mtu 9000 address 02:00:5e:00:01:01 type bridge",
        "link add l2.20 mtu 9000 address 02:00:5e:00:01:01 type bridge",
        "link add vx.10 mtu 9000 type vxlan id 1010 local 198.18.0.10 dstport 4789 nolearning",
        "link add vx.20 mtu 9000 type vxlan id 1020 local 198.18.0.10 dstport 4789 nolearning",
        "link add vx.blue mtu 9000 type vxlan id 5000 local 198.18.0.10 dstport 4789 nolearning",
        "link set vr.blue alias netwave:managed up",
        "link set br.blue alias netwave:managed master vr.blue up",
        "link set l2.10 alias netwave:managed master vr.blue up",
        "link set l2.20 alias netwave:managed up",
        "link set vx.10 alias netwave:managed master l2.10 up",
        "link set vx.20 alias netwave:managed master l2.20 up",
        "link set vx.blue alias netwave:managed master br.blue up",
        "link set vx.10 type bridge_slave neigh_suppress on",
        "link set vx.20 type bridge_slave neigh_suppress on",
        "addr add 10.10.0.1/24 dev l2.10",
        "addr add 10.20.0.1/24 dev l2.20",
        "route add 10.99.0.0/16 via 10.10.0.254 table 100",
        "route add blackhole 192.0.2.0/24 table 100",
        "rule add -4 priority 1000 from 10.10.0.0/24 lookup 100",
    ];
    assert_eq!(got, want);
}

#[test]
fn same_config_is_a_no_op() {
    assert_eq!(ops(&base(), &base()), Vec::<String>::new());
}

#[test]
fn remove_everything_deletes_ports_before_bridges_before_vrfs() {
    let got = ops(&base(), &NodeConfig::default());
    let want = [
        "rule del -4 priority 1000 from 10.10.0.0/24 lookup 100",
        "route del 10.99.0.0/16 via 10.10.0.254 table 100",
        "route del blackhole 192.0.2.0/24 table 100",
        "link del vx.10",
        "link del vx.20",
        "link del vx.blue",
        "link del br.blue",
        "link del l2.10",
        "link del l2.20",
        "link del vr.blue",
    ];
    assert_eq!(got, want);
}

#[test]
fn mtu_change_sets_bridge_before_its_port() {
    let mut to = base();
    to.layer2s[1].mtu = 1500;
    assert_eq!(
        ops(&base(), &to),
        ["link set l2.20 mtu 1500", "link set vx.20 mtu 1500"]
    );
}

#[test]
fn vni_change_recreates_the_vxlan_device() {
    let mut to = base();
    to.layer2s[0].vni = 2010;
    assert_eq!(
        ops(&base(), &to),
        [
            "link del vx.10",
            "link add vx.10 mtu 9000 type vxlan id 2010 local 198.18.0.10 dstport 4789 nolearning",
            "link set vx.10 alias netwave:managed master l2.10 up",
            "link set vx.10 type bridge_slave neigh_suppress on",
        ]
    );
}

#[test]
fn remove_an_l2_deletes_its_devices_only() {
    let mut to = base();
    to.layer2s.remove(1);
    assert_eq!(ops(&base(), &to), ["link del vx.20", "link del l2.20"]);
}

#[test]
fn move_a_bridge_between_vrfs() {
    let mut from = base();
    from.vrfs
        .push(VrfConfig::named("red").with_table(200).with_l3_vni(6000));
    let mut to = from.clone();
    to.layer2s[0].vrf = Some("vr.red".into());
    assert_eq!(ops(&from, &to), ["link set l2.10 master vr.red"]);
    // Into the default VRF.
    to.layer2s[0].vrf = None;
    assert_eq!(ops(&from, &to), ["link set l2.10 nomaster"]);
}

#[test]
fn vrf_table_change_recreates_the_vrf_and_reenslaves_its_members() {
    let mut to = base();
    to.vrfs[0].table = 101;
    assert_eq!(
        ops(&base(), &to),
        [
            "link del vr.blue",
            "link add vr.blue type vrf table 101",
            "link set vr.blue alias netwave:managed up",
            "link set br.blue master vr.blue",
            "link set l2.10 master vr.blue",
        ]
    );
}

#[test]
fn gateway_and_mac_changes() {
    let mut to = base();
    to.layer2s[1].anycast_gateways = vec!["10.20.0.1/24".into(), "fd00:20::1/64".into()];
    to.layer2s[0].anycast_gateways = vec!["10.10.1.1/24".into()];
    to.layer2s[0].anycast_mac = Some("02:00:5e:00:01:02".into());
    to.layer2s[0].neigh_suppression = false;
    assert_eq!(
        ops(&base(), &to),
        [
            "addr del 10.10.0.1/24 dev l2.10",
            "link set l2.10 address 02:00:5e:00:01:02",
            "link set vx.10 type bridge_slave neigh_suppress off",
            "addr add 10.10.1.1/24 dev l2.10",
            "addr add fd00:20::1/64 dev l2.20",
        ]
    );
}

#[test]
fn route_changes() {
    let mut to = base();
    // changed next hop → replace; removed → del; new (with metric, host bits masked) → add.
    to.routes[0].via = Some("10.10.0.253".into());
    to.routes.remove(1);
    to.routes.push(RouteConfig {
        metric: Some(20),
        ..route(100, "203.0.113.7/24", None, RouteType::Unreachable)
    });
    to.routes.push(RouteConfig {
        dev: Some("l2.20".into()),
        ..route(200, "fd00:99::/64", None, RouteType::Unicast)
    });
    assert_eq!(
        ops(&base(), &to),
        [
            "route del blackhole 192.0.2.0/24 table 100",
            "route replace 10.99.0.0/16 via 10.10.0.253 table 100",
            "route add unreachable 203.0.113.0/24 table 100 metric 20",
            "route add fd00:99::/64 dev l2.20 table 200 metric 1024",
        ]
    );
}

#[test]
fn rule_changes() {
    let mut to = base();
    to.rules[0].priority = 1001;
    to.rules.push(RuleConfig {
        priority: 900,
        table: 100,
        from: None,
        to: None,
        iif: Some("l2.20".into()),
        fwmark: None,
        fwmask: None,
    });
    assert_eq!(
        ops(&base(), &to),
        [
            "rule del -4 priority 1000 from 10.10.0.0/24 lookup 100",
            "rule add -4 priority 900 iif l2.20 lookup 100",
            "rule add -4 priority 1001 from 10.10.0.0/24 lookup 100",
            "rule add -6 priority 900 iif l2.20 lookup 100",
        ]
    );
}

#[test]
fn a_rule_with_a_mark_is_its_own_rule() {
    let mut to = base();
    to.rules[0].fwmark = Some(0x10);
    to.rules.push(RuleConfig {
        priority: 900,
        table: 100,
        from: None,
        to: None,
        iif: None,
        fwmark: Some(0),
        fwmask: Some(0xff),
    });
    assert_eq!(
        ops(&base(), &to),
        [
            "rule del -4 priority 1000 from 10.10.0.0/24 lookup 100",
            "rule add -4 priority 900 fwmark 0x0/0xff lookup 100",
            "rule add -4 priority 1000 from 10.10.0.0/24 fwmark 0x10 lookup 100",
            "rule add -6 priority 900 fwmark 0x0/0xff lookup 100",
        ]
    );
    // A full mask on a non-zero mark is the kernel's default: the same rule, nothing to do.
    let mut full = to.clone();
    full.rules[0].fwmask = Some(u32::MAX);
    assert_eq!(dp(&full), dp(&to));
}

#[test]
fn a_rule_mark_the_kernel_would_match_otherwise_is_refused() {
    for (mark, mask, field) in [
        (None, Some(0xff), "rules[0].fwmask"),
        (Some(0x11), Some(0xf0), "rules[0].fwmark"),
        (Some(0), None, "rules[0].fwmark"),
        (Some(0x10), Some(0), "rules[0].fwmask"),
    ] {
        let mut cfg = base();
        cfg.rules[0].fwmark = mark;
        cfg.rules[0].fwmask = mask;
        assert!(
            matches!(
                desired(&cfg, &settings()),
                Err(ModelError::InvalidValue { field: f, .. }) if f == field
            ),
            "{mark:?}/{mask:?}"
        );
    }
}

#[test]
fn vlan_trunk_adds_a_sub_interface_per_segment() {
    let s = NodeSettings {
        vlan_trunk: Some("eth1".into()),
        ..settings()
    };
    let mut cfg = base();
    cfg.vrfs.clear();
    cfg.layer2s.truncate(1);
    cfg.layer2s[0].vrf = None;
    let dp = desired(&cfg, &s).unwrap();
    let got: Vec<String> = diff(&dp, &Observed::default())
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .filter(|s| s.contains("vlan.10"))
        .collect();
    assert_eq!(
        got,
        [
            "link add vlan.10 mtu 9000 type vlan link eth1 id 10",
            "link set vlan.10 alias netwave:managed master l2.10 up",
        ]
    );
}

#[test]
fn a_foreign_device_with_a_desired_name_is_never_taken_over() {
    let observed = Observed {
        managed: Dataplane::default(),
        foreign_links: ["l2.20".to_string()].into(),
    };
    assert_eq!(
        diff(&dp(&base()), &observed),
        Err(DiffError::ForeignLink {
            name: "l2.20".into()
        })
    );
}

#[test]
fn bad_configs_are_rejected_naming_the_field() {
    let mut cfg = base();
    cfg.routes.push(route(
        254,
        "0.0.0.0/0",
        Some("10.0.0.1"),
        RouteType::Unicast,
    ));
    assert_eq!(
        desired(&cfg, &settings()),
        Err(ModelError::MainDefaultRoute {
            field: "routes[2]".into()
        })
    );
    let mut cfg = base();
    cfg.layer2s[1].bridge = "l2.10".into();
    assert!(matches!(
        desired(&cfg, &settings()),
        Err(ModelError::DuplicateDevice { name, .. }) if name == "l2.10"
    ));
    let mut cfg = base();
    cfg.layer2s[0].anycast_mac = Some("02:00:5e:00:01".into());
    let err = desired(&cfg, &settings()).unwrap_err().to_string();
    assert!(err.contains("layer2s[0].anycastMac"), "{err}");
    let s = NodeSettings {
        protected: vec!["l2.20".into()],
        ..settings()
    };
    assert!(matches!(
        desired(&base(), &s),
        Err(ModelError::DeviceName { name, .. }) if name == "l2.20"
    ));
}
