//! FRR rendering rules that the goldens do not spell out: underlay settings refused with the field
//! named, node configs FRR would take differently from what they say refused before FRR sees them,
//! and FRR's own orders and spellings.

use netwave_api::{Layer2Config, NodeConfig, PrefixAction, PrefixItem, VrfConfig};
use netwave_core::frr::model::cmp_interface_names;
use netwave_core::frr::{Community, FrrError, RouteTarget, Underlay, UnderlayError, render};

fn underlay_from(yaml: &str) -> Result<Underlay, String> {
    serde_saphyr::from_str::<Underlay>(yaml).map_err(|e| e.to_string())
}

fn underlay() -> Underlay {
    underlay_from(
        "asn: 65000\nvtepAddress: 198.18.1.1\nneighbors:\n  - address: 198.18.0.2\n    remoteAs: internal\n",
    )
    .expect("valid underlay")
}

fn item(cidr: &str, seq: u32, ge: Option<u8>, le: Option<u8>) -> PrefixItem {
    PrefixItem {
        cidr: cidr.into(),
        seq: Some(seq),
        ge,
        le,
        action: PrefixAction::Permit,
    }
}

fn config(vrfs: Vec<VrfConfig>) -> NodeConfig {
    NodeConfig {
        vrfs,
        ..NodeConfig::default()
    }
}

fn refused(cfg: &NodeConfig) -> String {
    render(cfg, &underlay())
        .expect_err("FRR cannot take this")
        .to_string()
}

#[test]
fn underlay_settings_errors_name_the_field() {
    let base = "asn: 65000\nvtepAddress: 198.18.1.1\n";
    let n = |rest: &str| format!("{base}neighbors:\n{rest}");
    let cases = [
        (
            "asn: 0\nvtepAddress: 198.18.1.1\nneighbors: [{address: 198.18.0.2, remoteAs: internal}]",
            "asn",
        ),
        (
            "asn: 65000\nvtepAddress: fd00::1\nneighbors: [{address: 198.18.0.2, remoteAs: internal}]",
            "vtepAddress: fd00::1 is IPv6",
        ),
        (base, "neighbors: at least one"),
        (
            &n("  - {address: 198.18.0.2, interface: eth0, remoteAs: internal}"),
            "neighbors[0]: set either",
        ),
        (
            &n("  - {address: 'fd00::2', remoteAs: internal}"),
            "neighbors[0].address",
        ),
        (
            &n("  - {address: 198.18.1.1, remoteAs: internal}"),
            "own VTEP",
        ),
        (
            &n("  - {interface: eth0, remoteAs: internl}"),
            "neighbors[0].remoteAs",
        ),
        (
            &n("  - {interface: eth0, remoteAs: 23456}"),
            "neighbors[0].remoteAs: 23456 is AS_TRANS",
        ),
        (
            &n("  - {interface: a-very-long-interface, remoteAs: external}"),
            "neighbors[0].interface",
        ),
        (
            &n("  - {interface: eth0, remoteAs: external}\n  - {interface: eth0, remoteAs: 65001}"),
            "neighbors[1]: neighbour eth0 is already neighbors[0]",
        ),
        (
            &format!(
                "{}timers: {{keepalive: 1, hold: 2}}",
                n("  - {interface: eth0, remoteAs: external}\n")
            ),
            "timers.hold",
        ),
        (
            &format!(
                "{}timers: {{keepalive: 30, hold: 9}}",
                n("  - {interface: eth0, remoteAs: external}\n")
            ),
            "timers.keepalive",
        ),
        (
            &format!(
                "{}hostname: x",
                n("  - {interface: eth0, remoteAs: external}\n")
            ),
            "hostname",
        ),
    ];
    for (yaml, want) in cases {
        let err = underlay_from(yaml).expect_err(yaml);
        assert!(err.contains(want), "{yaml}\n→ {err}\nwant {want:?}");
    }
}

#[test]
fn the_constructor_reports_the_same_errors_as_the_config_file() {
    let settings = netwave_core::frr::UnderlaySettings {
        asn: 65000,
        vtep_address: "198.18.1.1".into(),
        ..Default::default()
    };
    assert_eq!(
        Underlay::new(settings).unwrap_err(),
        UnderlayError {
            field: "neighbors".into(),
            message: "at least one underlay neighbour is needed: EVPN routes (remote VTEPs and \
                      MACs) come from BGP peers"
                .into(),
        }
    );
}

#[test]
fn route_targets_frr_cannot_encode_are_refused() {
    for (rt, ok) in [
        ("65188:2026", Some("65188:2026")),
        ("65188:02026", Some("65188:2026")),
        ("65000:4000000000", Some("65000:4000000000")),
        ("4200000000:100", Some("4200000000:100")),
        ("10.0.0.1:5", Some("10.0.0.1:5")),
        // FRR says "% Malformed Route Target list" and exits 0: these must never reach it.
        ("4200000000:70000", None),
        ("10.0.0.1:70000", None),
        ("65000", None),
    ] {
        assert_eq!(
            RouteTarget::parse(rt)
                .ok()
                .map(|r| r.to_string())
                .as_deref(),
            ok,
            "{rt}"
        );
    }
    let mut v = VrfConfig::named("red").with_device("red").with_vni(5000);
    v.route_target = Some("4200000000:70000".into());
    assert!(refused(&config(vec![v])).contains("VRF red: routeTarget"));
}

#[test]
fn a_route_target_without_a_vni_is_refused_not_ignored() {
    let mut v = VrfConfig::named("red").with_device("red").with_vni(5000);
    v.vni = None;
    v.route_target = Some("65000:1".into());
    let err = refused(&config(vec![v]));
    assert!(err.contains("routeTarget") && err.contains("VNI"), "{err}");
}

#[test]
fn communities_get_frr_spelling_and_order() {
    // FRR takes `local-AS` only (the API documents `local-as`) and prints communities sorted by value.
    let mut v = VrfConfig::named("red").with_device("red").with_vni(5000);
    v.export = vec![item("10.0.0.0/8", 1, None, Some(32))];
    v.communities = vec![
        "no-export".into(),
        "local-as".into(),
        "65000:10".into(),
        "65000:1:2".into(),
        "65535:65281".into(),
    ];
    let text = render(&config(vec![v]), &underlay()).unwrap().to_text();
    assert!(
        text.contains(" set community 65000:10 no-export local-AS additive\n"),
        "{text}"
    );
    assert!(text.contains(" set large-community 65000:1:2 additive\n"));
    assert_eq!(Community::parse("0:0").unwrap().to_string(), "internet");
    let mut bad = VrfConfig::named("red").with_device("red").with_vni(5000);
    bad.communities = vec!["65536:1".into()];
    assert!(refused(&config(vec![bad])).contains("communities[0]"));
}

#[test]
fn prefix_items_frr_would_take_differently_are_refused() {
    let cases: [(Vec<PrefixItem>, &str); 5] = [
        (vec![item("10.0.0.1/8", 1, None, None)], "import[0].cidr"),
        (vec![item("10.0.0.0/8", 1, Some(33), None)], "import[0].ge"),
        (vec![item("10.0.0.0/24", 1, None, Some(16))], "import[0].le"),
        (
            vec![item("10.0.0.0/8", 1, Some(24), Some(16))],
            "import[0].ge",
        ),
        // FRR would silently replace the first entry with the second.
        (
            vec![
                item("10.0.0.0/8", 7, None, None),
                item("10.1.0.0/16", 7, None, None),
            ],
            "import[1].seq",
        ),
    ];
    for (items, want) in cases {
        let mut v = VrfConfig::named("red").with_device("red").with_vni(5000);
        v.import = items;
        let err = refused(&config(vec![v]));
        assert!(err.contains(want), "{err}\nwant {want}");
    }
    // The same sequence number in the two families is two prefix lists: fine.
    let mut v = VrfConfig::named("red").with_device("red").with_vni(5000);
    v.import = vec![
        item("10.0.0.0/8", 7, None, None),
        item("fd00::/8", 7, None, None),
    ];
    assert!(render(&config(vec![v]), &underlay()).is_ok());
}

#[test]
fn vnis_and_names_frr_cannot_hold_are_refused() {
    let l2 = Layer2Config::segment;
    let mut cfg = config(vec![
        VrfConfig::named("red").with_device("red").with_vni(5000),
    ]);
    cfg.layer2s = vec![l2(10, 5000)];
    let err = render(&cfg, &underlay()).unwrap_err();
    assert!(matches!(err, FrrError::Vni { vni: 5000, .. }), "{err}");
    assert_eq!(err.category(), "vni");

    assert!(
        refused(&config(vec![
            VrfConfig::named("default")
                .with_device("default")
                .with_vni(5000)
        ]))
        .contains("FRR's name for the default VRF")
    );
    let mut twin = VrfConfig::named("red").with_device("red").with_vni(5000);
    twin.vni = Some(5001);
    assert!(
        refused(&config(vec![
            VrfConfig::named("red").with_device("red").with_vni(5000),
            twin
        ]))
        .contains("VRF red: device")
    );
}

#[test]
fn a_vrf_without_bgp_content_gets_no_frr_config() {
    let mut v = VrfConfig::named("local")
        .with_device("local")
        .with_vni(5000);
    v.vni = None;
    let text = render(&config(vec![v]), &underlay()).unwrap().to_text();
    assert!(!text.contains("local"), "{text}");
}

#[test]
fn the_underlay_only_ever_hears_about_the_vtep() {
    let text = render(&config(vec![]), &underlay()).unwrap().to_text();
    assert!(text.contains("  neighbor 198.18.0.2 route-map nw-underlay-out out\n"));
    assert!(text.contains("ip prefix-list nw-vtep-v4 seq 10 permit 198.18.1.1/32\n"));
    assert!(
        !text.contains("redistribute"),
        "nothing to leak, nothing redistributed:\n{text}"
    );
}

#[test]
fn interface_names_sort_as_frr_sorts_them() {
    let mut names = vec![
        "eth10", "eth2", "eth-x", "eth2.100", "eth1", "swp1s0", "eth002", "bond0",
    ];
    names.sort_by(|a, b| cmp_interface_names(a, b));
    // Measured: FRR printed eth-x, eth2, eth2.100, eth10 for those four.
    assert_eq!(
        names,
        [
            "bond0", "eth-x", "eth1", "eth002", "eth2", "eth2.100", "eth10", "swp1s0"
        ]
    );
}
