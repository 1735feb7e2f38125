//! Fleet validation: for every rule a failing case (naming the objects and nodes) and a passing case.

mod support_inputs;
mod support_props;

use netwave_api::{NamedLayer2, RevisionInputs};
use netwave_core::fleet::{Check, FleetParams, FleetValidation, UnderlayFamily, validate};
use netwave_core::render::NodeInfo;
use proptest::prelude::*;
use support_inputs::*;

fn nodes() -> Vec<NodeInfo> {
    vec![
        node("n-storage-1", &[("pool", "storage"), ("rack", "r1")]),
        node("n-storage-2", &[("pool", "storage"), ("rack", "r2")]),
        node("n-compute-1", &[("pool", "compute"), ("rack", "r1")]),
        node("n-compute-2", &[("pool", "compute"), ("rack", "r2")]),
    ]
}

fn check(inputs: &RevisionInputs) -> FleetValidation {
    validate(inputs, &nodes(), &FleetParams::default())
}

/// The only error, which must come from `rule`; returns its text.
fn only_error(v: &FleetValidation, rule: Check) -> String {
    let texts: Vec<String> = v.errors.iter().map(|e| e.to_string()).collect();
    assert_eq!(
        v.errors.len(),
        1,
        "want exactly one {rule:?} error, got {texts:#?}"
    );
    assert_eq!(v.errors[0].check, rule, "{texts:#?}");
    texts[0].clone()
}

fn assert_clean(v: &FleetValidation) {
    let texts: Vec<String> = v.errors.iter().map(|e| e.to_string()).collect();
    assert!(v.is_valid(), "unexpected errors: {texts:#?}");
}

fn on(mut l: NamedLayer2, key: &str, value: &str) -> NamedLayer2 {
    l.spec.node_selector = match_labels(&[(key, value)]);
    l
}

#[test]
fn samples_are_valid_without_warnings() {
    let v = validate(&sample_inputs(), &sample_nodes(), &FleetParams::default());
    assert_clean(&v);
    assert!(v.warnings.is_empty(), "{:?}", v.warnings);
}

#[test]
fn object_spec_errors_are_prefixed_with_the_object() {
    let mut inputs = sample_inputs();
    let seg = inputs
        .layer2s
        .iter_mut()
        .find(|l| l.name == "vlan100-frontend")
        .unwrap();
    seg.spec.anycast_gateways[0] = "10.250.0.0/24".into();
    let v = validate(&inputs, &sample_nodes(), &FleetParams::default());
    let text = only_error(&v, Check::ObjectSpec);
    assert!(
        text.starts_with(
            "Layer2NetworkConfiguration/vlan100-frontend spec.anycastGateways[0]: 10.250.0.0/24 is the \
             network address"
        ),
        "{text}"
    );
    assert!(text.ends_with("(nodes: compute-0, storage-0)"), "{text}");
}

#[test]
fn object_spec_ranges_are_checked_even_if_the_schema_was_bypassed() {
    let mut seg = l2("seg", 0, 0);
    seg.spec.mtu = 500;
    let v = check(&inputs(vec![], vec![seg], vec![]));
    let fields: Vec<&str> = v.errors.iter().filter_map(|e| e.field.as_deref()).collect();
    assert_eq!(fields, ["spec.id", "spec.mtu", "spec.vni"]);
    assert!(v.errors.iter().all(|e| e.check == Check::ObjectSpec));
}

#[test]
fn invalid_selector_is_an_error_naming_object_and_field() {
    let mut seg = l2("seg", 10, 10);
    seg.spec.node_selector = match_expressions(vec![expr("pool", "In", &[])]);
    let v = check(&inputs(vec![], vec![seg], vec![]));
    assert_eq!(
        only_error(&v, Check::InvalidSelector),
        "Layer2NetworkConfiguration/seg spec.nodeSelector.matchExpressions[0].values: values must be \
         non-empty for operator In"
    );
    let ok = on(l2("seg", 10, 10), "pool", "storage");
    assert_clean(&check(&inputs(vec![], vec![ok], vec![])));
}

#[test]
fn duplicate_vrf_name_is_an_error_wherever_the_objects_are() {
    let mut a = vrf("blue", Some(100));
    a.spec.node_selector = match_labels(&[("pool", "storage")]);
    let mut b = vrf("blue", Some(101));
    b.name = "blue-compute".into();
    b.spec.node_selector = match_labels(&[("pool", "compute")]);
    let v = check(&inputs(vec![a.clone(), b], vec![], vec![]));
    let text = only_error(&v, Check::DuplicateVrfName);
    assert!(
        text.starts_with(
            "VRFRouteConfiguration/blue, VRFRouteConfiguration/blue-compute: VRF name blue is defined by \
             more than one object"
        ),
        "{text}"
    );
    let mut c = vrf("green", Some(101));
    c.spec.node_selector = match_labels(&[("pool", "compute")]);
    assert_clean(&check(&inputs(vec![a, c], vec![], vec![])));
}

#[test]
fn duplicate_vni_across_segments_and_vrfs_is_an_error_even_on_disjoint_nodes() {
    let seg = on(l2("seg", 10, 5000), "pool", "compute");
    let mut v1 = vrf("blue", Some(5000));
    v1.spec.node_selector = match_labels(&[("pool", "storage")]);
    let v = check(&inputs(vec![v1.clone()], vec![seg], vec![]));
    let text = only_error(&v, Check::DuplicateVni);
    assert!(
        text.starts_with(
            "VRFRouteConfiguration/blue, Layer2NetworkConfiguration/seg: VNI 5000 is used by more than \
             one object"
        ),
        "{text}"
    );
    assert_eq!(v.errors[0].nodes.len(), 4);
    let seg = on(l2("seg", 10, 5001), "pool", "compute");
    assert_clean(&check(&inputs(vec![v1], vec![seg], vec![])));
}

#[test]
fn segment_referencing_a_missing_vrf_is_an_error() {
    let mut seg = on(l2("seg", 10, 10), "pool", "storage");
    seg.spec.vrf = Some("nope".into());
    let v = check(&inputs(vec![], vec![seg.clone()], vec![]));
    assert_eq!(
        only_error(&v, Check::MissingVrf),
        "Layer2NetworkConfiguration/seg spec.vrf: VRF nope does not exist (no VRFRouteConfiguration has \
         spec.vrf: nope) (nodes: n-storage-1, n-storage-2)"
    );
    assert_clean(&check(&inputs(
        vec![vrf("nope", Some(99))],
        vec![seg],
        vec![],
    )));
}

#[test]
fn segment_on_a_node_without_its_vrf_is_an_error_naming_those_nodes() {
    let mut blue = vrf("blue", Some(100));
    blue.spec.node_selector = match_labels(&[("pool", "storage")]);
    let mut seg = l2("seg", 10, 10);
    seg.spec.vrf = Some("blue".into());
    let v = check(&inputs(vec![blue.clone()], vec![seg.clone()], vec![]));
    assert_eq!(
        only_error(&v, Check::VrfNotOnNode),
        "VRFRouteConfiguration/blue, Layer2NetworkConfiguration/seg spec.vrf: VRF blue is not on these \
         nodes (its nodeSelector does not select them), but the segment is (nodes: n-compute-1, \
         n-compute-2)"
    );
    let seg = on(seg, "pool", "storage");
    assert_clean(&check(&inputs(vec![blue], vec![seg], vec![])));
}

#[test]
fn duplicate_vlan_is_an_error_only_on_nodes_with_both_segments() {
    let a = on(l2("a", 10, 10), "rack", "r1");
    let b = on(l2("b", 10, 11), "pool", "storage");
    let v = check(&inputs(vec![], vec![a.clone(), b], vec![]));
    assert_eq!(
        only_error(&v, Check::DuplicateVlan),
        "Layer2NetworkConfiguration/a, Layer2NetworkConfiguration/b: VLAN 10 is used by more than one \
         segment on the same node (nodes: n-storage-1)"
    );
    // Rack-local reuse of a VLAN is fine.
    let c = on(l2("c", 10, 11), "rack", "r2");
    assert_clean(&check(&inputs(vec![], vec![a, c], vec![])));
}

#[test]
fn vrfs_with_the_same_table_on_one_node_collide() {
    let mut a = vrf("blue", None);
    a.spec.table_id = Some(500);
    let mut b = vrf("green", None);
    b.spec.table_id = Some(500);
    b.spec.node_selector = match_labels(&[("pool", "compute")]);
    let v = check(&inputs(vec![a.clone(), b.clone()], vec![], vec![]));
    assert_eq!(
        only_error(&v, Check::TableCollision),
        "VRFRouteConfiguration/blue, VRFRouteConfiguration/green: routing table 500 is claimed by more \
         than one object on the same node; a VRF needs a table of its own (nodes: n-compute-1, \
         n-compute-2)"
    );
    a.spec.node_selector = match_labels(&[("pool", "storage")]);
    assert_clean(&check(&inputs(vec![a, b], vec![], vec![])));
}

#[test]
fn vrf_and_routing_table_with_the_same_table_on_one_node_collide() {
    let mut a = vrf("blue", None);
    a.spec.table_id = Some(500);
    a.spec.node_selector = match_labels(&[("rack", "r2")]);
    let t = rt("t", 500);
    let v = check(&inputs(vec![a.clone()], vec![], vec![t]));
    let text = only_error(&v, Check::TableCollision);
    assert!(
        text.starts_with("VRFRouteConfiguration/blue, RoutingTable/t: routing table 500"),
        "{text}"
    );
    assert!(
        text.ends_with("(nodes: n-compute-2, n-storage-2)"),
        "{text}"
    );
    assert_clean(&check(&inputs(vec![a], vec![], vec![rt("t", 501)])));
}

#[test]
fn allocated_vrf_tables_never_collide_with_explicit_ones() {
    let tables = netwave_core::render::vrf_tables(&inputs(vec![vrf("blue", None)], vec![], vec![]));
    let home = tables["blue"];
    // A routing table takes blue's home slot: blue moves, nothing collides.
    assert_clean(&check(&inputs(
        vec![vrf("blue", None)],
        vec![],
        vec![rt("t", home)],
    )));
}

#[test]
fn routing_tables_sharing_a_table_on_a_node_is_a_warning() {
    let mut a = rt("a", 300);
    a.spec.routes = vec![route("10.1.0.0/16", Some("10.0.0.1"), None)];
    let mut b = rt("b", 300);
    b.spec.routes = vec![route("10.2.0.0/16", Some("10.0.0.1"), None)];
    b.spec.node_selector = match_labels(&[("pool", "storage")]);
    let v = check(&inputs(vec![], vec![], vec![a, b]));
    assert_clean(&v);
    assert_eq!(v.warnings.len(), 1);
    assert_eq!(v.warnings[0].check, Check::SharedRoutingTable);
    assert_eq!(v.warnings[0].nodes, ["n-storage-1", "n-storage-2"]);
}

#[test]
fn device_names_over_15_characters_are_errors() {
    let v = check(&inputs(vec![vrf("abcdefghijklm", Some(7))], vec![], vec![]));
    let text = only_error(&v, Check::DeviceNameTooLong);
    assert!(
        text.starts_with(
            "VRFRouteConfiguration/abcdefghijklm spec.vrf: device names br.abcdefghijklm, \
             vx.abcdefghijklm are longer than 15 characters"
        ),
        "{text}"
    );
    // 12 characters with a VNI, or 15 without one, fit.
    assert_clean(&check(&inputs(
        vec![vrf("abcdefghijkl", Some(7)), vrf("abcdefghijklmno", None)],
        vec![],
        vec![],
    )));
    let mut t = rt("t", 300);
    t.spec.routes = vec![route("10.0.0.0/8", None, Some("averyverylongdev0"))];
    let v = check(&inputs(vec![], vec![], vec![t]));
    assert_eq!(
        only_error(&v, Check::DeviceNameTooLong),
        "RoutingTable/t spec.routes[0].dev: device name averyverylongdev0 is longer than 15 characters \
         (nodes: n-compute-1, n-compute-2, n-storage-1, n-storage-2)"
    );
}

#[test]
fn vrf_named_like_a_segment_device_collides_on_shared_nodes() {
    // VRF "111" makes vx.111, the VXLAN device of VLAN 111.
    let mut numeric = vrf("111", Some(7));
    numeric.spec.node_selector = match_labels(&[("pool", "storage")]);
    let seg = l2("seg", 111, 111);
    let v = check(&inputs(vec![numeric.clone()], vec![seg], vec![]));
    assert_eq!(
        only_error(&v, Check::DeviceNameCollision),
        "VRFRouteConfiguration/111, Layer2NetworkConfiguration/seg: device vx.111 would be the L3 VNI \
         VXLAN device of VRF 111 and the VXLAN device of VLAN 111 on the same node (nodes: n-storage-1, \
         n-storage-2)"
    );
    // VRF "l2.5" is the name of VLAN 5's bridge.
    let seg5 = l2("seg5", 5, 5);
    let v = check(&inputs(vec![vrf("l2.5", None)], vec![seg5.clone()], vec![]));
    assert!(only_error(&v, Check::DeviceNameCollision).contains("device l2.5 would be"));
    // On different nodes they do not meet.
    let seg = on(l2("seg", 111, 111), "pool", "compute");
    assert_clean(&check(&inputs(vec![numeric], vec![seg], vec![])));
}

#[test]
fn route_via_a_netwave_device_missing_on_a_node_is_an_error() {
    let pxe = on(l2("pxe", 111, 111), "pool", "storage");
    let mut t = rt("oob", 100);
    t.spec.routes = vec![
        route("10.201.0.0/16", None, Some("l2.111")),
        // Not a netwave device: the node's own business.
        route("10.202.0.0/16", None, Some("eth0")),
    ];
    let v = check(&inputs(vec![], vec![pxe], vec![t.clone()]));
    assert_eq!(
        only_error(&v, Check::DeviceNotOnNode),
        "Layer2NetworkConfiguration/pxe, RoutingTable/oob spec.routes[0].dev: device l2.111 (bridge of \
         VLAN 111) is not on these nodes, but the RoutingTable is (nodes: n-compute-1, n-compute-2)"
    );
    t.spec.node_selector = match_labels(&[("pool", "storage")]);
    let pxe = on(l2("pxe", 111, 111), "pool", "storage");
    assert_clean(&check(&inputs(vec![], vec![pxe], vec![t])));
}

#[test]
fn mtu_must_leave_room_for_vxlan_overhead_on_the_underlay() {
    let seg = l2("seg", 10, 10); // MTU 9000
    let small = FleetParams {
        underlay_mtu: 9000,
        underlay_family: UnderlayFamily::Ipv4,
        ..FleetParams::default()
    };
    let v = validate(&inputs(vec![], vec![seg.clone()], vec![]), &nodes(), &small);
    let text = only_error(&v, Check::MtuExceedsUnderlay);
    assert!(
        text.starts_with(
            "Layer2NetworkConfiguration/seg spec.mtu: MTU 9000 plus 50 bytes of VXLAN-over-IPv4 overhead \
             exceeds the underlay MTU 9000 (at most 8950 fits)"
        ),
        "{text}"
    );
    // 9050 carries 9000 over IPv4 but not over IPv6.
    let v4 = FleetParams {
        underlay_mtu: 9050,
        underlay_family: UnderlayFamily::Ipv4,
        ..FleetParams::default()
    };
    let v6 = FleetParams {
        underlay_family: UnderlayFamily::Ipv6,
        ..v4
    };
    let i = inputs(vec![vrf("blue", Some(7))], vec![seg], vec![]);
    assert_clean(&validate(&i, &nodes(), &v4));
    let v = validate(&i, &nodes(), &v6);
    assert_eq!(v.errors.len(), 2, "the VRF's L3 VNI (default MTU 9000) too");
    assert!(
        v.errors
            .iter()
            .all(|e| e.check == Check::MtuExceedsUnderlay)
    );
    // A VRF without a VNI has no VXLAN device to check.
    assert_clean(&validate(
        &inputs(vec![vrf("plain", None)], vec![], vec![]),
        &nodes(),
        &small,
    ));
}

#[test]
fn overlapping_anycast_gateways_in_one_vrf_on_a_node_are_errors() {
    let a = with_gateways(l2("a", 10, 10), &["10.0.0.1/24", "fd00:1::1/64"]);
    let b = on(
        with_gateways(l2("b", 11, 11), &["10.0.0.129/25"]),
        "rack",
        "r1",
    );
    let v = check(&inputs(vec![], vec![a.clone(), b.clone()], vec![]));
    assert_eq!(
        only_error(&v, Check::AnycastGatewayOverlap),
        "Layer2NetworkConfiguration/a, Layer2NetworkConfiguration/b: anycast gateways 10.0.0.1/24 and \
         10.0.0.129/25 overlap in VRF default, and both segments are on the same node (nodes: \
         n-compute-1, n-storage-1)"
    );
    // The same address in another VRF is fine.
    let mut b2 = b.clone();
    b2.spec.vrf = Some("blue".into());
    let v = check(&inputs(
        vec![vrf("blue", Some(7))],
        vec![a.clone(), b2],
        vec![],
    ));
    assert_clean(&v);
    // As are segments on different nodes.
    let a_r2 = on(a, "rack", "r2");
    assert_clean(&check(&inputs(vec![], vec![a_r2, b], vec![])));
}

#[test]
fn same_gateway_address_in_two_segments_is_an_overlap() {
    let a = with_gateways(l2("a", 10, 10), &["fd00:5::1/64"]);
    let b = with_gateways(l2("b", 11, 11), &["fd00:5::1/64"]);
    let v = check(&inputs(vec![], vec![a, b], vec![]));
    only_error(&v, Check::AnycastGatewayOverlap);
}

#[test]
fn different_routes_for_one_key_in_two_routing_tables_conflict() {
    let mut a = rt("a", 300);
    a.spec.routes = vec![route("10.9.0.0/16", Some("10.0.0.1"), None)];
    let mut b = rt("b", 300);
    b.spec.routes = vec![route("10.9.0.0/16", Some("10.0.0.2"), None)];
    b.spec.node_selector = match_labels(&[("rack", "r1")]);
    let v = check(&inputs(vec![], vec![], vec![a.clone(), b.clone()]));
    assert_eq!(
        only_error(&v, Check::RouteConflict),
        "RoutingTable/a, RoutingTable/b: route 10.9.0.0/16 table 300 metric 0 is defined differently \
         by more than one RoutingTable on the same node (a route without a metric has metric 0 for IPv4, \
         1024 for IPv6) (nodes: n-compute-1, n-storage-1)"
    );
    // The same route twice merges.
    b.spec.routes = a.spec.routes.clone();
    assert_clean(&check(&inputs(vec![], vec![], vec![a, b])));
}

/// The cases: routes the kernel holds as one (no metric = 0 for IPv4, 1024 for IPv6) and an
/// IPv4 route via an IPv6 next hop. The API's per-object checks let them through; fleet validation runs
/// the agent's own model on them and refuses the revision with the field path and the nodes, so no node
/// is touched; the agent refuses the same rendered config (one definition: `core::dataplane`).
#[test]
fn routes_the_agent_would_refuse_fail_fleet_validation_with_their_field_path() {
    let cases: [(&str, Vec<netwave_api::Route>, &str); 3] = [
        (
            "IPv6: no metric is metric 1024",
            vec![
                route("fd00::/64", None, Some("a")),
                netwave_api::Route {
                    metric: Some(1024),
                    ..route("fd00::/64", None, Some("b"))
                },
            ],
            "spec.routes[1]: the same kernel route as spec.routes[0] (fd00::/64 table 300 metric 1024)",
        ),
        (
            "IPv4: no metric is metric 0",
            vec![
                route("10.0.0.0/8", Some("10.1.0.1"), None),
                netwave_api::Route {
                    metric: Some(0),
                    ..route("10.0.0.0/8", Some("10.1.0.2"), None)
                },
            ],
            "spec.routes[1]: the same kernel route as spec.routes[0] (10.0.0.0/8 table 300 metric 0)",
        ),
        (
            "RFC 5549",
            vec![route("10.0.0.0/8", Some("fd00::1"), None)],
            "spec.routes[0].via: \"fd00::1\" is not valid: the next hop's address family differs from \
             the prefix 10.0.0.0/8 (an IPv4 route via an IPv6 next hop, RFC 5549, is not supported)",
        ),
    ];
    for (what, routes, want) in cases {
        let mut t = rt("t", 300);
        t.spec.routes = routes;
        assert!(
            netwave_api::validate::validate_routing_table(&t.spec).is_empty(),
            "{what}: the API's per-object check has no opinion on a route's meaning"
        );
        let ins = inputs(vec![], vec![], vec![t]);
        let v = check(&ins);
        let errors: Vec<String> = v.errors.iter().map(|f| f.to_string()).collect();
        assert_eq!(errors.len(), 1, "{what}: {errors:?}");
        assert!(
            errors[0].starts_with(&format!("RoutingTable/t {want}")),
            "{what}: {}",
            errors[0]
        );
        assert!(
            errors[0].contains("(nodes: "),
            "{what}: names the nodes: {}",
            errors[0]
        );
        // The agent, given what render makes of it, refuses it the same way.
        let rendered = netwave_core::render::render(&ins, &nodes()).unwrap();
        let refused = rendered
            .values()
            .any(|n| netwave_core::dataplane::desired(&n.config(), &Default::default()).is_err());
        assert!(refused, "{what}: the agent's model refuses it too");
    }
}

/// A route target FRR cannot encode (an ASN above 65535 with a number above 65535) is accepted by the
/// API's syntax check and used to be dropped by FRR with exit code 0; fleet validation renders FRR's
/// configuration for every distinct node config and refuses it before any node gets it.
#[test]
fn a_vrf_frr_cannot_express_fails_fleet_validation() {
    let mut v = vrf("blue", Some(7));
    v.spec.route_target = Some("4200000000:70000".into());
    let ins = inputs(vec![v], vec![], vec![]);
    assert!(
        check(&ins).errors.is_empty(),
        "the input checks see nothing wrong"
    );
    let found = netwave_core::fleet::render_and_validate(&ins, &nodes(), &FleetParams::default());
    let errors: Vec<String> = found
        .validation
        .errors
        .iter()
        .map(|f| f.to_string())
        .collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with("the rendered node config is one no agent can apply: VRF ")
            && errors[0].contains("routeTarget")
            && errors[0].contains("(nodes: "),
        "{}",
        errors[0]
    );
}

#[test]
fn one_rule_priority_in_two_routing_tables_conflicts() {
    let mut a = rt("a", 300);
    a.spec.rules = vec![rule("10.1.0.0/16", 1000)];
    let mut b = rt("b", 301);
    b.spec.rules = vec![rule("10.2.0.0/16", 1000)];
    let v = check(&inputs(vec![], vec![], vec![a.clone(), b.clone()]));
    assert!(
        only_error(&v, Check::RulePriorityConflict)
            .starts_with("RoutingTable/a, RoutingTable/b: rule priority 1000")
    );
    b.spec.rules = vec![rule("10.2.0.0/16", 1001)];
    assert_clean(&check(&inputs(vec![], vec![], vec![a, b])));
}

#[test]
fn a_rule_mark_the_kernel_would_match_otherwise_is_an_error_naming_object_and_rule() {
    let marked = |mark, mask, priority| netwave_api::Rule {
        fwmark: mark,
        fwmask: mask,
        ..rule("10.1.0.0/16", priority)
    };
    let mut t = rt("marks", 300);
    t.spec.rules = vec![
        marked(Some(0x10), None, 1000),
        marked(Some(0x10), Some(0xf0), 1001),
        marked(Some(0), Some(0xff), 1002),
    ];
    assert_clean(&check(&inputs(vec![], vec![], vec![t.clone()])));
    let cases = [
        (
            marked(None, Some(0xff), 1003),
            "RoutingTable/marks spec.rules[3].fwmask: a mask needs `fwmark`",
        ),
        (
            marked(Some(0x11), Some(0xf0), 1003),
            "RoutingTable/marks spec.rules[3].fwmark: mark 0x11 has bits outside mask 0xf0 (0x1): \
             only the masked bits of a packet's mark are compared, so the rule could never match",
        ),
        (
            marked(Some(0), None, 1003),
            "RoutingTable/marks spec.rules[3].fwmark: the kernel neither compares nor reports a zero \
             mark without a mask; to match packets whose mark is 0, set `fwmask`",
        ),
        (
            marked(Some(0x10), Some(0), 1003),
            "RoutingTable/marks spec.rules[3].fwmask: a mask of 0 compares no bit of the mark",
        ),
    ];
    for (bad, want) in cases {
        let mut t = t.clone();
        t.spec.rules.push(bad);
        let text = only_error(&check(&inputs(vec![], vec![], vec![t])), Check::ObjectSpec);
        assert!(text.starts_with(want), "{text}");
    }
}

#[test]
fn object_that_selects_no_node_is_a_warning() {
    let seg = on(l2("seg", 10, 10), "pool", "gpu");
    let v = check(&inputs(vec![], vec![seg], vec![]));
    assert_clean(&v);
    assert_eq!(
        v.warnings.iter().map(|w| w.to_string()).collect::<Vec<_>>(),
        [
            "Layer2NetworkConfiguration/seg spec.nodeSelector: selects no node, so it is rolled out nowhere"
        ]
    );
    let v = validate(
        &inputs(vec![], vec![l2("seg", 10, 10)], vec![]),
        &[],
        &FleetParams::default(),
    );
    assert_eq!(v.warnings.len(), 1);
    assert_eq!(v.warnings[0].check, Check::NoNodes);
}

#[test]
fn long_node_lists_are_summarised_in_text_but_complete_in_the_finding() {
    let many: Vec<NodeInfo> = (0..40)
        .map(|i| node(&format!("node-{i:02}"), &[]))
        .collect();
    let mut seg = l2("seg", 10, 10);
    seg.spec.vrf = Some("nope".into());
    let v = validate(
        &inputs(vec![], vec![seg], vec![]),
        &many,
        &FleetParams::default(),
    );
    assert_eq!(v.errors[0].nodes.len(), 40);
    assert!(
        v.errors[0]
            .to_string()
            .ends_with("(nodes: node-00, node-01, node-02, node-03, node-04 and 35 more)")
    );
}

#[test]
fn status_keeps_at_most_fifty_findings_per_list() {
    let segs: Vec<_> = (0..60u16)
        .map(|i| {
            let mut s = l2(&format!("seg{i:02}"), 10 + i, 10 + u32::from(i));
            s.spec.mtu = 9999;
            s
        })
        .collect();
    let v = check(&inputs(vec![], segs, vec![]));
    let status = v.to_status();
    assert_eq!(status.errors.len(), 51);
    assert_eq!(
        status.errors.last().unwrap(),
        &format!("and {} more errors", v.errors.len() - 50)
    );
}

#[test]
fn validation_is_independent_of_input_and_node_order() {
    let mut i = sample_inputs();
    // Make it interesting: a few problems.
    i.layer2s[0].spec.id = 101;
    i.layer2s[5].spec.vrf = Some("missing".into());
    let a = validate(&i, &sample_nodes(), &FleetParams::default());
    i.layer2s.reverse();
    i.vrfs.reverse();
    let mut ns = sample_nodes();
    ns.reverse();
    let b = validate(&i, &ns, &FleetParams::default());
    assert_eq!(a, b);
    assert!(!a.is_valid());
}

#[test]
fn rack_local_segments_may_reuse_one_gateway_subnet() {
    // Every rack has its own segment with the same gateway: they never meet on a node.
    let segs: Vec<NamedLayer2> = ["r1", "r2"]
        .iter()
        .enumerate()
        .map(|(i, rack)| {
            on(
                with_gateways(
                    l2(&format!("seg-{rack}"), 10 + i as u16, 10 + i as u32),
                    &["10.0.0.1/24"],
                ),
                "rack",
                rack,
            )
        })
        .collect();
    assert_clean(&check(&inputs(vec![], segs.clone(), vec![])));
    // Unless one segment spreads into the other's rack.
    let mut segs = segs;
    segs[1].spec.node_selector = match_expressions(vec![expr("rack", "In", &["r1", "r2"])]);
    let v = check(&inputs(vec![], segs, vec![]));
    only_error(&v, Check::AnycastGatewayOverlap);
    assert_eq!(v.errors[0].nodes, ["n-compute-1", "n-storage-1"]);
}

#[test]
fn many_overlapping_segments_on_one_node_each_show_up() {
    let segs: Vec<NamedLayer2> = (0..30u16)
        .map(|i| {
            with_gateways(
                l2(&format!("s{i:02}"), 10 + i, 10 + u32::from(i)),
                &["10.0.0.1/24"],
            )
        })
        .collect();
    let v = check(&inputs(vec![], segs, vec![]));
    assert!(
        v.errors
            .iter()
            .all(|e| e.check == Check::AnycastGatewayOverlap)
    );
    // Linear, not 30*29/2 pairs, and every segment is named.
    assert!(v.errors.len() < 30, "{}", v.errors.len());
    let named: std::collections::BTreeSet<&str> = v
        .errors
        .iter()
        .flat_map(|e| e.objects.iter().map(|o| o.name.as_str()))
        .collect();
    assert_eq!(named.len(), 30);
}

// ---- properties ----

proptest! {
    #![proptest_config(support_props::config(64, "proptest-regressions/fleet.txt"))]

    #[test]
    fn validation_is_deterministic_whatever_the_order((inputs, nodes) in arb_fleet(), seed in any::<u64>()) {
        let a = validate(&inputs, &nodes, &FleetParams::default());
        let shuffled_inputs = RevisionInputs {
            bgp_peerings: Vec::new(),
            mirror_targets: Vec::new(),
            mirror_selectors: Vec::new(),
            underlays: Vec::new(),
            render_version: None,
            vrfs: shuffled(&inputs.vrfs, seed),
            layer2s: shuffled(&inputs.layer2s, seed ^ 1),
            routing_tables: shuffled(&inputs.routing_tables, seed ^ 2),
        };
        let b = validate(&shuffled_inputs, &shuffled(&nodes, seed ^ 3), &FleetParams::default());
        prop_assert_eq!(a, b);
    }

    /// Cross-check against render: a node has two segments with one VLAN, or a VRF table also used by
    /// another VRF or a RoutingTable, exactly when validation names that node for it.
    #[test]
    fn per_node_clashes_match_the_rendered_configs((inputs, nodes) in arb_fleet()) {
        let v = validate(&inputs, &nodes, &FleetParams::default());
        let rendered = netwave_core::render::render(&inputs, &nodes).unwrap();
        let named = |check: Check| -> std::collections::BTreeSet<String> {
            v.errors.iter().filter(|e| e.check == check).flat_map(|e| e.nodes.clone()).collect()
        };
        let (vlan_nodes, table_nodes) = (named(Check::DuplicateVlan), named(Check::TableCollision));
        for (node, r) in &rendered {
            let c = r.config();
            let mut vlans: Vec<u16> = c.layer2s.iter().map(|l| l.vlan).collect();
            vlans.sort_unstable();
            let dup_vlan = vlans.windows(2).any(|w| w[0] == w[1]);
            prop_assert_eq!(dup_vlan, vlan_nodes.contains(node), "VLANs on {}: {:?}", node, vlans);
            let vrf_tables: Vec<u32> = c.vrfs.iter().map(|v| v.table).collect();
            let rt_tables: std::collections::BTreeSet<u32> = inputs
                .routing_tables
                .iter()
                .filter(|t| c.routes.iter().any(|r| r.table == t.spec.table_id)
                    || c.rules.iter().any(|r| r.table == t.spec.table_id))
                .map(|t| t.spec.table_id)
                .collect();
            let mut sorted = vrf_tables.clone();
            sorted.sort_unstable();
            let clash = sorted.windows(2).any(|w| w[0] == w[1])
                || vrf_tables.iter().any(|t| rt_tables.contains(t));
            // A RoutingTable without routes or rules leaves no trace in the config; only flag what we can see.
            if clash {
                prop_assert!(table_nodes.contains(node), "tables on {}: {:?} / {:?}", node, vrf_tables, rt_tables);
            }
        }
    }
}

#[test]
fn a_vrf_prefix_item_an_earlier_one_covers_is_a_warning() {
    let mut inputs = sample_inputs();
    let cluster = inputs
        .vrfs
        .iter_mut()
        .find(|v| v.spec.vrf == "cluster")
        .unwrap();
    // The permit of the /16 at its position (seq 1) decides before the deny of the /24 at seq 5.
    cluster.spec.import[0].seq = None;
    let v = validate(&inputs, &sample_nodes(), &FleetParams::default());
    assert_clean(&v);
    let w: Vec<String> = v.warnings.iter().map(|w| w.to_string()).collect();
    assert_eq!(w.len(), 1, "{w:#?}");
    assert_eq!(v.warnings[0].check, Check::ShadowedPrefixItem);
    assert!(
        w[0].contains("spec.import[1]")
            && w[0].contains("never matches: import[0] (permit 10.102.0.0/16 with seq 1)"),
        "{}",
        w[0]
    );
}
