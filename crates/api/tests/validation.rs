//! Semantic validation: one good and at least one bad input per rule, each bad one naming its field path.

use netwave_api::validate::{FieldError, validate_layer2, validate_routing_table, validate_vrf};
use netwave_api::{
    Layer2NetworkConfigurationSpec, PrefixAction, PrefixItem, Route, RouteType, RoutingTableSpec,
    Rule, VRFRouteConfigurationSpec,
};

fn vrf() -> VRFRouteConfigurationSpec {
    VRFRouteConfigurationSpec {
        vni: Some(2001000),
        route_target: Some("65188:2001".into()),
        ..VRFRouteConfigurationSpec::named("cluster")
    }
}

fn item(cidr: &str, ge: Option<u8>, le: Option<u8>) -> PrefixItem {
    PrefixItem {
        cidr: cidr.into(),
        seq: None,
        ge,
        le,
        action: PrefixAction::Permit,
    }
}

fn l2() -> Layer2NetworkConfigurationSpec {
    Layer2NetworkConfigurationSpec {
        id: 100,
        vni: 1000100,
        mtu: 9000,
        anycast_mac: Some("02:00:5e:00:01:01".into()),
        anycast_gateways: vec!["10.250.0.1/24".into(), "fd00:250::1/64".into()],
        vrf: Some("cluster".into()),
        neigh_suppression: None,
        route_target: None,
        node_selector: None,
    }
}

fn rt() -> RoutingTableSpec {
    RoutingTableSpec {
        table_id: 100,
        routes: vec![],
        rules: vec![],
        node_selector: None,
    }
}

fn route(prefix: &str, via: Option<&str>, dev: Option<&str>, kind: RouteType) -> Route {
    Route {
        prefix: prefix.into(),
        via: via.map(Into::into),
        dev: dev.map(Into::into),
        kind,
        metric: None,
    }
}

fn rule(from: Option<&str>, to: Option<&str>, priority: u32) -> Rule {
    Rule {
        from: from.map(Into::into),
        to: to.map(Into::into),
        iif: None,
        fwmark: None,
        fwmask: None,
        priority,
    }
}

/// Renders problems as `path: message` lines, the way an admin sees them.
fn lines(problems: Vec<FieldError>) -> Vec<String> {
    problems.iter().map(ToString::to_string).collect()
}

#[test]
fn prefix_cidr_must_parse_and_be_a_network_address() {
    let mut spec = vrf();
    spec.import = vec![
        item("10.0.0.0/8", None, None),
        item("10.0.76.0/24", None, None),
        item("10.0.77.0/24", None, None),
        item("10.0.76.81/28", None, None),
    ];
    spec.export = vec![
        item("fd00:1::1/64", None, None),
        item("not-a-cidr", None, None),
    ];
    assert_eq!(
        lines(validate_vrf(&spec)),
        [
            "spec.import[3].cidr: 10.0.76.81/28 is not a network address (want 10.0.76.80/28)",
            "spec.export[0].cidr: fd00:1::1/64 is not a network address (want fd00:1::/64)",
            "spec.export[1].cidr: not-a-cidr is not a network in CIDR notation (e.g. 10.0.0.0/24 or fd00::/64)",
        ]
    );
    spec.import.truncate(3);
    spec.export.clear();
    assert_eq!(lines(validate_vrf(&spec)), Vec::<String>::new());
}

#[test]
fn ge_and_le_stay_within_the_family_and_len_le_ge_le_le() {
    let mut spec = vrf();
    spec.import = vec![
        item("10.0.0.0/16", Some(24), Some(32)),
        item("fd00::/48", Some(64), Some(128)),
        item("10.1.0.0/16", Some(33), None),
        item("10.2.0.0/16", Some(8), None),
        item("10.3.0.0/16", Some(28), Some(24)),
        item("10.4.0.0/16", None, Some(12)),
    ];
    assert_eq!(
        lines(validate_vrf(&spec)),
        [
            "spec.import[2].ge: 33 is longer than an IPv4 prefix can be (32)",
            "spec.import[3].ge: 8 is shorter than the prefix length of 10.2.0.0/16 (16)",
            "spec.import[4].ge: ge 28 is greater than le 24",
            "spec.import[5].le: 12 is shorter than the prefix length of 10.4.0.0/16 (16)",
        ]
    );
}

#[test]
fn no_duplicate_prefix_item_within_a_list() {
    let mut spec = vrf();
    spec.export = vec![
        item("10.0.0.0/16", None, Some(24)),
        item("10.0.0.0/16", None, Some(28)),
        PrefixItem {
            seq: Some(7),
            ..item("10.0.0.0/16", None, Some(24))
        },
    ];
    assert_eq!(
        lines(validate_vrf(&spec)),
        ["spec.export[2]: duplicates spec.export[0] (same cidr, action, ge and le)"]
    );
    // The same item with the other action, or in the other list, is not a duplicate.
    spec.export[2].action = PrefixAction::Deny;
    spec.import = vec![item("10.0.0.0/16", None, Some(24))];
    assert!(validate_vrf(&spec).is_empty());
}

#[test]
fn no_duplicate_effective_seq_within_a_list() {
    let mut spec = vrf();
    // Item 0 has no seq, so its effective seq is its position: 1. Item 2 claims 1 explicitly.
    spec.import = vec![
        item("10.0.0.0/16", None, None),
        PrefixItem {
            seq: Some(20),
            ..item("10.1.0.0/16", None, None)
        },
        PrefixItem {
            seq: Some(1),
            ..item("10.2.0.0/16", None, None)
        },
    ];
    assert_eq!(
        lines(validate_vrf(&spec)),
        ["spec.import[2].seq: sequence 1 is already used by spec.import[0]"]
    );
    spec.import[2].seq = Some(30);
    assert!(validate_vrf(&spec).is_empty());
}

#[test]
fn vrf_aggregates_tables_route_targets_and_communities() {
    let mut spec = vrf();
    spec.aggregate = vec![
        "10.102.0.0/16".into(),
        "10.102.0.1/16".into(),
        "10.102.0.0/16".into(),
    ];
    spec.table_id = Some(254);
    spec.route_target = Some("65188".into());
    spec.communities = vec![
        "65188:100".into(),
        "65000:1:2".into(),
        "no-export".into(),
        "70000:1".into(),
    ];
    assert_eq!(
        lines(validate_vrf(&spec)),
        [
            "spec.aggregate[1]: 10.102.0.1/16 is not a network address (want 10.102.0.0/16)",
            "spec.aggregate[2]: duplicates spec.aggregate[0]",
            "spec.tableId: table 254 is reserved for the kernel's unspec/default/main/local tables",
            "spec.routeTarget: 65188 is not a route target (want <asn>:<number> or <ipv4>:<number>)",
            "spec.communities[3]: 70000:1 is not a BGP community (want <asn>:<value>, <asn>:<a>:<b> or a well-known name)",
        ]
    );
    spec.aggregate.truncate(1);
    spec.table_id = Some(2001);
    spec.route_target = Some("10.0.0.1:2001".into());
    spec.communities.truncate(3);
    assert!(validate_vrf(&spec).is_empty());
}

#[test]
fn anycast_gateways_are_host_addresses_inside_their_prefix() {
    let mut spec = l2();
    assert!(validate_layer2(&spec).is_empty());
    spec.anycast_gateways = vec![
        "10.250.0.0/24".into(),
        "10.250.0.255/24".into(),
        "fd00:250::/64".into(),
        "10.250.0.1".into(),
        "10.250.1.1/24".into(),
        "10.250.1.1/25".into(),
        "10.250.2.0/31".into(),
        "10.250.3.7/32".into(),
    ];
    assert_eq!(
        lines(validate_layer2(&spec)),
        [
            "spec.anycastGateways[0]: 10.250.0.0/24 is the network address of 10.250.0.0/24, not a host address",
            "spec.anycastGateways[1]: 10.250.0.255/24 is the broadcast address of 10.250.0.0/24, not a host address",
            "spec.anycastGateways[2]: fd00:250::/64 is the network address of fd00:250::/64, not a host address",
            "spec.anycastGateways[3]: 10.250.0.1 is not an address with prefix length (e.g. 10.250.0.1/24)",
            "spec.anycastGateways[5]: 10.250.1.1 is already spec.anycastGateways[4]",
        ]
    );
}

#[test]
fn anycast_mac_is_unicast_and_required_with_gateways() {
    let mut spec = l2();
    spec.anycast_mac = Some("01:00:5e:00:00:01".into());
    assert_eq!(
        lines(validate_layer2(&spec)),
        [
            "spec.anycastMac: 01:00:5e:00:00:01 is a multicast address; a gateway needs a unicast MAC"
        ]
    );
    spec.anycast_mac = Some("00:00:00:00:00:00".into());
    assert_eq!(
        lines(validate_layer2(&spec)),
        ["spec.anycastMac: 00:00:00:00:00:00 is the all-zero address"]
    );
    spec.anycast_mac = None;
    assert_eq!(
        lines(validate_layer2(&spec)),
        [
            "spec.anycastMac: required when anycastGateways are set: every node must answer with the same MAC"
        ]
    );
    spec.anycast_gateways.clear();
    assert!(validate_layer2(&spec).is_empty());
}

#[test]
fn route_prefixes_are_network_addresses() {
    let mut spec = rt();
    spec.routes = vec![
        route(
            "10.200.0.0/16",
            Some("10.250.11.254"),
            None,
            RouteType::Unicast,
        ),
        route("fd00:dead::/48", None, None, RouteType::Unreachable),
        route("10.9.0.1/16", Some("10.0.0.1"), None, RouteType::Unicast),
        route("not-a-prefix", None, Some("eth0"), RouteType::Unicast),
    ];
    // What a route means (next hop or device by type, families, the kernel's identity) is checked by
    // fleet validation with the agent's model: crates/core/tests/fleet.rs.
    assert_eq!(
        lines(validate_routing_table(&spec)),
        [
            "spec.routes[2].prefix: 10.9.0.1/16 is not a network address (want 10.9.0.0/16)",
            "spec.routes[3].prefix: not-a-prefix is not a network in CIDR notation (e.g. 10.0.0.0/24 \
             or fd00::/64)",
        ]
    );
}

#[test]
fn rules_use_networks_free_priorities_and_one_family() {
    let mut spec = rt();
    spec.rules = vec![
        rule(Some("10.250.11.0/24"), None, 1000),
        rule(None, Some("fd00:200::/48"), 1001),
    ];
    assert!(validate_routing_table(&spec).is_empty());
    spec.table_id = 0;
    spec.rules = vec![
        rule(Some("10.250.11.1/24"), None, 1000),
        rule(None, Some("10.0.0.0/8"), 1000),
        rule(Some("10.0.0.0/8"), Some("fd00::/8"), 32766),
    ];
    assert_eq!(
        lines(validate_routing_table(&spec)),
        [
            "spec.tableId: table 0 is reserved for the kernel's unspec/default/main/local tables",
            "spec.rules[0].from: 10.250.11.1/24 is not a network address (want 10.250.11.0/24)",
            "spec.rules[1].priority: priority 1000 is already used by spec.rules[0]",
            "spec.rules[2].priority: priority 32766 belongs to the kernel's main/default rule",
            "spec.rules[2]: `from` and `to` are of different address families",
        ]
    );
}

fn marked(mark: Option<u32>, mask: Option<u32>, priority: u32) -> Rule {
    Rule {
        fwmark: mark,
        fwmask: mask,
        ..rule(None, None, priority)
    }
}

#[test]
fn a_rule_mark_and_mask_must_match_what_they_say() {
    let mut spec = rt();
    spec.rules = vec![
        marked(Some(0x10), None, 1000),
        marked(Some(0x10), Some(0xf0), 1001),
        marked(Some(0), Some(0xff), 1002),
        marked(Some(0x10), Some(u32::MAX), 1003),
    ];
    assert!(validate_routing_table(&spec).is_empty());
    spec.rules = vec![
        marked(None, Some(0xff), 1000),
        marked(Some(0x10), Some(0x0f), 1001),
        marked(Some(0), None, 1002),
        marked(Some(0x10), Some(0), 1003),
    ];
    assert_eq!(
        lines(validate_routing_table(&spec)),
        [
            "spec.rules[0].fwmask: a mask needs `fwmark`: it says which bits of the mark are compared \
             (to match packets whose masked mark is 0, write `fwmark: 0`)",
            "spec.rules[1].fwmark: mark 0x10 has bits outside mask 0xf (0x10): only the masked bits of a \
             packet's mark are compared, so the rule could never match",
            "spec.rules[2].fwmark: the kernel neither compares nor reports a zero mark without a mask; \
             to match packets whose mark is 0, set `fwmask` (all bits: 4294967295)",
            "spec.rules[3].fwmask: a mask of 0 compares no bit of the mark, so the rule would match \
             every packet",
        ]
    );
}

fn seq(mut i: PrefixItem, seq: u32, action: PrefixAction) -> PrefixItem {
    i.seq = Some(seq);
    i.action = action;
    i
}

#[test]
fn an_item_an_earlier_one_covers_never_matches() {
    use netwave_api::validate::shadowed_items;
    // What the samples once had: a permit of the /16 at position 1 (seq 1) before a deny of a /24
    // inside it at seq 5: the deny never decides anything.
    let list = [
        item("10.102.0.0/16", None, Some(32)),
        seq(
            item("10.102.255.0/24", None, Some(32)),
            5,
            PrefixAction::Deny,
        ),
    ];
    assert_eq!(shadowed_items(&list), [(1, 0)]);
    // The deny first (seq 5 < 10): both can match.
    let list = [
        seq(
            item("10.102.0.0/16", None, Some(32)),
            10,
            PrefixAction::Permit,
        ),
        seq(
            item("10.102.255.0/24", None, Some(32)),
            5,
            PrefixAction::Deny,
        ),
    ];
    assert_eq!(shadowed_items(&list), []);
    // Lengths matter: an exact /16 covers no /24; `le 24` does not cover `le 32`; `ge 24` covers
    // `ge 25`; the other family never.
    for (earlier, later, covered) in [
        (
            item("10.0.0.0/16", None, None),
            item("10.0.1.0/24", None, None),
            false,
        ),
        (
            item("10.0.0.0/16", None, Some(24)),
            item("10.0.1.0/24", None, Some(32)),
            false,
        ),
        (
            item("10.0.0.0/16", None, Some(24)),
            item("10.0.1.0/24", None, None),
            true,
        ),
        (
            item("10.0.0.0/16", Some(24), None),
            item("10.0.1.0/24", Some(25), None),
            true,
        ),
        (
            item("0.0.0.0/0", None, Some(32)),
            item("fd00::/8", None, Some(128)),
            false,
        ),
        (
            item("10.0.0.0/16", None, Some(32)),
            item("10.1.0.0/24", None, None),
            false,
        ),
    ] {
        let got = shadowed_items(&[earlier.clone(), later.clone()]);
        assert_eq!(
            !got.is_empty(),
            covered,
            "{} ge {:?} le {:?} before {} ge {:?} le {:?}: {got:?}",
            earlier.cidr,
            earlier.ge,
            earlier.le,
            later.cidr,
            later.ge,
            later.le
        );
    }
}

#[test]
fn bgp_timers_read_kubernetes_durations_in_whole_seconds() {
    use netwave_api::validate::parse_duration_seconds;
    for (text, secs) in [
        ("90s", 90),
        ("1m30s", 90),
        ("1.5m", 90),
        ("0", 0),
        ("0s", 0),
        ("3000ms", 3),
        ("1h", 3600),
    ] {
        assert_eq!(parse_duration_seconds(text, 65535), Ok(secs), "{text}");
    }
    for (text, want) in [
        ("90", "\"90\" is not a duration (e.g. 90s, 1m30s)"),
        ("1500ms", "1500ms is not a whole number of seconds"),
        ("-3s", "\"-3s\" is negative"),
        ("19h", "19h is 68400 s, longer than 65535 s"),
        ("", "\"\" is not a duration"),
        ("s", "\"s\" is not a duration"),
    ] {
        let err = parse_duration_seconds(text, 65535).expect_err(text);
        assert!(err.starts_with(want), "{text}: {err}");
    }
}
