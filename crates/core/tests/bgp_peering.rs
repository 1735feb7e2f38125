//! BGPPeering (BGP as a service): folded into the revision, rendered onto the nodes its nodeSelector
//! selects (resolved against its segment), fleet-validated with errors naming the object and field,
//! and rendered to FRR with every field honoured.

mod support_inputs;

use netwave_api::{
    BGPPeeringSpec, BgpPeeringLoopback, BgpPeeringVlan, NamedBgpPeering, PrefixAction, PrefixItem,
    RevisionInputs,
};
use netwave_core::fleet::{Check, FleetParams, FleetValidation, validate};
use netwave_core::frr::{FrrError, Underlay};
use netwave_core::render::{NodeInfo, config_hash, render};
use netwave_core::revision::inputs_hash;
use support_inputs::*;

fn item(cidr: &str, action: PrefixAction) -> PrefixItem {
    PrefixItem {
        cidr: cidr.into(),
        seq: None,
        ge: None,
        le: None,
        action,
    }
}

fn peering(name: &str, segment: &str) -> NamedBgpPeering {
    NamedBgpPeering {
        name: name.into(),
        spec: BGPPeeringSpec {
            peering_vlan: Some(BgpPeeringVlan {
                name: segment.into(),
            }),
            loopback_peer: None,
            remote_asn: 65511,
            enable_bfd: false,
            maximum_prefixes: None,
            hold_time: None,
            keepalive_time: None,
            import: vec![item("10.250.3.0/24", PrefixAction::Permit)],
            export: vec![item("10.250.0.0/16", PrefixAction::Permit)],
            node_selector: None,
        },
    }
}

fn loopback(name: &str, ips: &[&str]) -> NamedBgpPeering {
    let mut p = peering(name, "");
    p.spec.peering_vlan = None;
    p.spec.loopback_peer = Some(BgpPeeringLoopback {
        ip_addresses: ips.iter().map(|s| s.to_string()).collect(),
    });
    p
}

/// VRF `m2m` with a segment `vlan1` (VLAN 501) in it on every node, and `peerings`.
fn fleet_inputs(peerings: Vec<NamedBgpPeering>) -> RevisionInputs {
    let mut seg = with_gateways(
        l2("vlan1", 501, 4000001),
        &["10.250.0.1/24", "fd94:685b:30cf:501::1/64"],
    );
    seg.spec.vrf = Some("m2m".into());
    let mut i = inputs(vec![vrf("m2m", Some(2002026))], vec![seg], vec![]);
    i.bgp_peerings = peerings;
    i
}

fn nodes() -> Vec<NodeInfo> {
    vec![
        node("n1", &[("bgpaas", "yes")]),
        node("n2", &[("bgpaas", "yes")]),
        node("n3", &[]),
    ]
}

fn check(inputs: &RevisionInputs) -> FleetValidation {
    validate(inputs, &nodes(), &FleetParams::default())
}

fn errors(v: &FleetValidation) -> Vec<String> {
    v.errors.iter().map(ToString::to_string).collect()
}

/// The only error, from `rule`; its text.
fn only_error(v: &FleetValidation, rule: Check) -> String {
    let texts = errors(v);
    assert_eq!(v.errors.len(), 1, "want one {rule:?} error: {texts:#?}");
    assert_eq!(v.errors[0].check, rule, "{texts:#?}");
    texts[0].clone()
}

#[test]
fn a_peering_reaches_only_the_nodes_its_selector_selects_resolved_against_its_segment() {
    let mut p = peering("bgpaas-test", "vlan1");
    p.spec.node_selector = match_labels(&[("bgpaas", "yes")]);
    p.spec.hold_time = Some("1m30s".into());
    p.spec.keepalive_time = Some("30s".into());
    let inputs = fleet_inputs(vec![p]);
    assert!(check(&inputs).is_valid(), "{:#?}", errors(&check(&inputs)));
    let rendered = render(&inputs, &nodes()).expect("renders");
    for (node, r) in &rendered {
        let config = r.config();
        assert_eq!(
            r.config_hash,
            config_hash(&config),
            "{node}: the shared-parts hash is the config's"
        );
        if node == "n3" {
            assert!(config.bgp_peers.is_empty(), "n3 is not selected");
            continue;
        }
        let [peer] = &config.bgp_peers[..] else {
            panic!("{node}: want one peer: {:?}", config.bgp_peers)
        };
        assert_eq!(peer.name, "bgpaas-test");
        assert_eq!(peer.vrf.as_deref(), Some("m2m"), "the segment's VRF");
        assert_eq!(
            peer.listen_ranges,
            ["10.250.0.0/24", "fd94:685b:30cf:501::/64"],
            "the segment's gateway subnets"
        );
        assert_eq!((peer.keepalive_time, peer.hold_time), (Some(30), Some(90)));
    }
    assert_ne!(
        rendered["n1"].config_hash, rendered["n3"].config_hash,
        "the peering changes the selected nodes' configs"
    );
}

#[test]
fn inputs_without_peerings_hash_as_before_peerings_existed() {
    // A revision cut before BGPPeering existed must keep its hash (and so its name): the empty list
    // is left out of the canonical serialization.
    let without = fleet_inputs(vec![]);
    let json = serde_json::to_string(&netwave_core::revision::canonical_inputs(&without))
        .expect("serializes");
    assert!(!json.contains("bgpPeerings"), "{json}");
    let with = fleet_inputs(vec![peering("bgpaas-test", "vlan1")]);
    assert_ne!(inputs_hash(&without), inputs_hash(&with));
}

#[test]
fn a_peering_on_an_unknown_segment_is_refused_naming_the_field() {
    let v = check(&fleet_inputs(vec![peering("bgpaas-test", "vlan9")]));
    assert_eq!(
        only_error(&v, Check::MissingPeeringSegment),
        "BGPPeering/bgpaas-test spec.peeringVlan.name: segment vlan9 does not exist (no \
         Layer2NetworkConfiguration is named vlan9) (nodes: n1, n2, n3)"
    );
}

#[test]
fn a_peering_segment_must_be_in_a_vrf() {
    let mut inputs = fleet_inputs(vec![peering("bgpaas-test", "vlan1")]);
    inputs.layer2s[0].spec.vrf = None;
    let v = check(&inputs);
    assert_eq!(
        only_error(&v, Check::PeeringSegmentUnusable),
        "BGPPeering/bgpaas-test spec.peeringVlan.name: segment \
         vlan1 is in no VRF (its spec.vrf is empty): a peering segment's sessions live in the \
         segment's VRF (nodes: n1, n2, n3)"
    );
}

#[test]
fn a_peering_segment_must_be_on_every_node_of_the_peering() {
    let mut inputs = fleet_inputs(vec![peering("bgpaas-test", "vlan1")]);
    inputs.layer2s[0].spec.node_selector = match_labels(&[("bgpaas", "yes")]);
    inputs.vrfs[0].spec.node_selector = match_labels(&[("bgpaas", "yes")]);
    let v = check(&inputs);
    assert_eq!(
        only_error(&v, Check::PeeringSegmentNotOnNode),
        "BGPPeering/bgpaas-test spec.peeringVlan.name: segment \
         vlan1 is not on these nodes (its nodeSelector does not select them), but the peering is \
         (nodes: n3)"
    );
}

#[test]
fn timers_are_checked_against_frrs_ranges() {
    let cases: [(Option<&str>, Option<&str>, &str); 5] = [
        (
            Some("9s"),
            Some("9s"),
            "spec.keepaliveTime: 9 s is not below holdTime (9 s): the session would expire between keepalives",
        ),
        (
            Some("2s"),
            Some("1s"),
            "spec.holdTime: 2 s: a hold time is 0 (no hold timer) or 3 s to 65535 s",
        ),
        (
            Some("90s"),
            None,
            "spec.keepaliveTime: required with holdTime: FRR sets the two together",
        ),
        (
            Some("90"),
            Some("30s"),
            "spec.holdTime: \"90\" is not a duration (e.g. 90s, 1m30s)",
        ),
        (
            Some("1500ms"),
            Some("1s"),
            "spec.holdTime: 1500ms is not a whole number of seconds (BGP timers are in seconds)",
        ),
    ];
    for (hold, keepalive, want) in cases {
        let mut p = peering("bgpaas-test", "vlan1");
        p.spec.hold_time = hold.map(Into::into);
        p.spec.keepalive_time = keepalive.map(Into::into);
        let text = only_error(&check(&fleet_inputs(vec![p])), Check::ObjectSpec);
        assert!(
            text.starts_with(&format!("BGPPeering/bgpaas-test {want}")),
            "{hold:?}/{keepalive:?}: {text}"
        );
    }
    let mut p = peering("bgpaas-test", "vlan1");
    (p.spec.hold_time, p.spec.keepalive_time) = (Some("0".into()), Some("0s".into()));
    assert!(check(&fleet_inputs(vec![p])).is_valid(), "0/0: no timers");
}

#[test]
fn asn_addresses_and_prefixes_are_checked_naming_the_field() {
    let mut p = loopback("lo-peer", &["10.250.4.10", "10.250.4.11", "not-an-ip"]);
    p.spec.remote_asn = 0;
    p.spec.import = vec![
        item("10.250.4.1/24", PrefixAction::Permit),
        PrefixItem {
            le: Some(32),
            ..item("10.250.0.0/16", PrefixAction::Permit)
        },
        item("10.250.7.0/24", PrefixAction::Deny),
    ];
    let v = check(&fleet_inputs(vec![p]));
    let texts = errors(&v);
    for want in [
        "BGPPeering/lo-peer spec.remoteASN: 0 is not an AS number",
        "BGPPeering/lo-peer spec.loopbackPeer.ips[1]: a second IPv4 address: spec.loopbackPeer.ips[0] \
         is the peering's IPv4 address (one per family)",
        "BGPPeering/lo-peer spec.loopbackPeer.ips[2]: not-an-ip is not an IP address",
        "BGPPeering/lo-peer spec.import[0].cidr: 10.250.4.1/24 is not a network address (want \
         10.250.4.0/24)",
        "BGPPeering/lo-peer spec.import[2]: never matches: spec.import[1] (10.250.0.0/16, seq 2) comes \
         first",
    ] {
        assert!(
            texts.iter().any(|t| t.starts_with(want)),
            "want {want:?} in {texts:#?}"
        );
    }
}

#[test]
fn two_peerings_listening_on_one_segment_overlap() {
    let mut other = peering("other", "vlan1");
    other.spec.node_selector = match_labels(&[("bgpaas", "yes")]);
    let v = check(&fleet_inputs(vec![peering("bgpaas-test", "vlan1"), other]));
    let texts = errors(&v);
    assert!(
        v.errors.iter().all(|e| e.check == Check::PeeringOverlap) && !texts.is_empty(),
        "{texts:#?}"
    );
    assert!(
        texts.contains(
            &"BGPPeering/bgpaas-test, BGPPeering/other: listen range 10.250.0.0/24 and listen range \
              10.250.0.0/24 overlap in VRF m2m on the same node: FRR would give a session to only one \
              of the two peerings (nodes: n1, n2)"
                .to_string()
        ),
        "{texts:#?}"
    );
    // Apart, on different nodes, they are fine.
    let mut a = peering("a", "vlan1");
    a.spec.node_selector = match_labels(&[("bgpaas", "yes")]);
    let mut b = peering("b", "vlan1");
    b.spec.node_selector = match_expressions(vec![expr("bgpaas", "DoesNotExist", &[])]);
    assert!(check(&fleet_inputs(vec![a, b])).is_valid());
}

#[test]
fn the_peerings_verdict_and_node_count_are_its_own() {
    let mut bad = peering("bad", "vlan9");
    bad.spec.node_selector = match_labels(&[("bgpaas", "yes")]);
    let inputs = fleet_inputs(vec![bad, loopback("good", &["10.250.4.10"])]);
    let verdicts =
        netwave_core::rollout::input_verdicts(&inputs, &nodes(), &FleetParams::default());
    let kind = netwave_core::render::InputKind::BgpPeering;
    let bad = verdicts.get(kind, "bad").expect("verdict");
    assert_eq!(bad.selected_nodes, 2);
    assert!(
        bad.errors[0].contains("segment vlan9 does not exist"),
        "{:?}",
        bad.errors
    );
    let good = verdicts.get(kind, "good").expect("verdict");
    assert_eq!(good.selected_nodes, 3);
    assert!(good.errors.is_empty(), "{:?}", good.errors);
}

fn underlay() -> Underlay {
    serde_saphyr::from_str(
        "asn: 65000\nvtepAddress: 198.18.1.1\nneighbors:\n  - address: 198.18.0.2\n    remoteAs: internal\n",
    )
    .expect("valid underlay")
}

fn frr_text(inputs: &RevisionInputs) -> String {
    let rendered = render(inputs, &nodes()).expect("renders");
    netwave_core::frr::render(&rendered["n1"].config(), &underlay())
        .expect("FRR renders")
        .to_text()
}

#[test]
fn every_peering_field_reaches_the_frr_text() {
    let mut p = peering("bgpaas-test", "vlan1");
    p.spec.enable_bfd = true;
    p.spec.maximum_prefixes = Some(100);
    p.spec.hold_time = Some("90s".into());
    p.spec.keepalive_time = Some("30s".into());
    let text = frr_text(&fleet_inputs(vec![
        p,
        loopback("lo-peer", &["10.250.4.10"]),
    ]));
    for want in [
        // peeringVlan: a listen range per gateway subnet, in the segment's VRF.
        "router bgp 65000 vrf m2m\n bgp router-id 198.18.1.1\n no bgp default ipv4-unicast\n neighbor \
         nw-peer-bgpaas-test-v4 peer-group\n neighbor nw-peer-bgpaas-test-v4 remote-as 65511\n neighbor \
         nw-peer-bgpaas-test-v4 bfd\n neighbor nw-peer-bgpaas-test-v4 timers 30 90\n",
        " bgp listen range 10.250.0.0/24 peer-group nw-peer-bgpaas-test-v4\n bgp listen range \
         fd94:685b:30cf:501::/64 peer-group nw-peer-bgpaas-test-v6\n",
        "  neighbor nw-peer-bgpaas-test-v4 activate\n  neighbor nw-peer-bgpaas-test-v4 maximum-prefix \
         100\n  neighbor nw-peer-bgpaas-test-v4 route-map nw-peer-bgpaas-test-in-v4 in\n  neighbor \
         nw-peer-bgpaas-test-v4 route-map nw-peer-bgpaas-test-out-v4 out\n",
        "ip prefix-list nw-peer-bgpaas-test-in-v4 seq 1 permit 10.250.3.0/24\n",
        "ip prefix-list nw-peer-bgpaas-test-out-v4 seq 1 permit 10.250.0.0/16\n",
        // No IPv6 item: nothing of IPv6 is accepted or sent.
        "route-map nw-peer-bgpaas-test-in-v6 deny 10\nexit\n",
        "route-map nw-peer-bgpaas-test-out-v6 deny 10\nexit\n",
        // loopbackPeer: a multihop neighbour in the default instance.
        " neighbor 10.250.4.10 remote-as 65511\n neighbor 10.250.4.10 ttl-security hops 2\n",
    ] {
        assert!(text.contains(want), "want {want:?} in:\n{text}");
    }
    assert!(
        !text.contains("10.250.4.10 bfd"),
        "BFD only where asked:\n{text}"
    );
}

#[test]
fn enable_bfd_is_honoured_not_dropped() {
    // das-schiff-network-operator accepts enableBFD and renders nothing for it.
    let mut p = loopback("lo-peer", &["10.250.4.10"]);
    let off = frr_text(&fleet_inputs(vec![p.clone()]));
    p.spec.enable_bfd = true;
    let on = frr_text(&fleet_inputs(vec![p]));
    assert!(!off.contains(" bfd\n"), "{off}");
    assert!(on.contains(" neighbor 10.250.4.10 bfd\n"), "{on}");
}

#[test]
fn a_peer_in_a_vrf_the_node_lacks_is_refused_before_frr_sees_it() {
    let inputs = fleet_inputs(vec![peering("bgpaas-test", "vlan1")]);
    let mut config = render(&inputs, &nodes()).expect("renders")["n1"].config();
    config.vrfs.clear();
    assert_eq!(
        netwave_core::frr::render(&config, &underlay()).unwrap_err(),
        FrrError::Peering {
            peering: "bgpaas-test".into(),
            field: "vrf".into(),
            message: "VRF m2m is not on this node".into(),
        }
    );
}

#[test]
fn each_session_must_come_up_within_its_hold_time() {
    use netwave_core::frr::{PeeringSession, WorkloadId, peering_sessions};
    let mut p = peering("bgpaas-test", "vlan1");
    p.spec.hold_time = Some("90s".into());
    p.spec.keepalive_time = Some("30s".into());
    let mut lo = loopback("lo-peer", &["10.250.4.10"]);
    lo.spec.hold_time = Some("18h".into());
    lo.spec.keepalive_time = Some("1h".into());
    let inputs = fleet_inputs(vec![p, loopback("plain", &["10.250.5.10"])]);
    let config = render(&inputs, &nodes()).expect("renders")["n1"].config();
    let session = |peering: &str, vrf: &str, session: WorkloadId, within_seconds| PeeringSession {
        peering: peering.into(),
        vrf: vrf.into(),
        session,
        within_seconds,
    };
    assert_eq!(
        peering_sessions(&config),
        [
            session(
                "bgpaas-test",
                "m2m",
                WorkloadId::Group("nw-peer-bgpaas-test-v4".into()),
                90
            ),
            session(
                "bgpaas-test",
                "m2m",
                WorkloadId::Group("nw-peer-bgpaas-test-v6".into()),
                90
            ),
            // No hold time of its own: the datacenter profile's 9 s.
            session(
                "plain",
                "default",
                WorkloadId::Address("10.250.5.10".parse().unwrap()),
                9
            ),
        ]
    );
    // An hour-long hold time does not make a node wait an hour for its verdict.
    let mut config = render(&fleet_inputs(vec![lo]), &nodes()).expect("renders")["n1"].config();
    config.bgp_peers[0].hold_time = Some(65000);
    config.bgp_peers[0].keepalive_time = Some(3600);
    assert_eq!(
        peering_sessions(&config)[0].within_seconds,
        netwave_core::frr::MAX_PEERING_WAIT
    );
}
