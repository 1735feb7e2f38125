//! Traffic mirroring (MirrorTarget, MirrorSelector): folded into the revision, rendered onto the nodes
//! that have the selector's source and the target's VRF, fleet-validated with errors naming object and
//! field, and turned into dataplane operations that touch nothing else.

mod support_inputs;

use netwave_api::manifest::parse_manifests;
use netwave_api::{
    MirrorDirection, MirrorObjectRef, MirrorSelectorSpec, MirrorTargetSpec, MirrorTargetType,
    NamedMirrorSelector, NamedMirrorTarget, RevisionInputs, TrafficMatch, VrfLoopback,
};
use netwave_core::dataplane::diff::{NetOp, Observed, diff};
use netwave_core::dataplane::{Hook, NodeSettings, desired};
use netwave_core::fleet::{Check, FleetParams, FleetValidation, validate};
use netwave_core::render::{NodeInfo, render, tunnel_device};
use netwave_core::revision::inputs_hash;
use support_inputs::*;

fn fixture() -> RevisionInputs {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/golden/mirror/das-schiff-mirror.yaml"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let mut inputs = RevisionInputs::default();
    for m in parse_manifests(path, &text).unwrap() {
        inputs.add(m).unwrap();
    }
    inputs
}

fn reference(kind: &str, name: &str) -> MirrorObjectRef {
    MirrorObjectRef {
        api_group: None,
        kind: kind.into(),
        name: name.into(),
        namespace: None,
    }
}

fn target(name: &str, vrf: &str, loopback: &str, destination: &str) -> NamedMirrorTarget {
    NamedMirrorTarget {
        name: name.into(),
        spec: MirrorTargetSpec {
            kind: MirrorTargetType::L2gre,
            destination_ip: destination.into(),
            key: Some(7),
            destination_vrf: vrf.into(),
            source_loopback: loopback.into(),
        },
    }
}

fn selector(name: &str, source_kind: &str, source: &str, target: &str) -> NamedMirrorSelector {
    NamedMirrorSelector {
        name: name.into(),
        spec: MirrorSelectorSpec {
            traffic_match: TrafficMatch::default(),
            mirror_target: reference("MirrorTarget", target),
            mirror_source: reference(source_kind, source),
            direction: MirrorDirection::Egress,
        },
    }
}

/// VRF `mirror` (VNI, loopback `lo.mir`) on nodes labelled `mirror=yes`, VRF `plain` without a VNI,
/// segment `vlan1` (VLAN 501) everywhere, a target `col` in `mirror` and `selectors`.
fn fleet(selectors: Vec<NamedMirrorSelector>) -> RevisionInputs {
    let mut mirror = vrf("mirror", Some(2002099));
    mirror.spec.loopbacks = vec![VrfLoopback {
        name: "lo.mir".into(),
        subnet: "10.250.91.0/29".into(),
    }];
    mirror.spec.node_selector = match_labels(&[("mirror", "yes")]);
    let mut i = inputs(
        vec![mirror, vrf("plain", None)],
        vec![l2("vlan1", 501, 4000001)],
        vec![],
    );
    i.mirror_targets = vec![target("col", "mirror", "lo.mir", "10.250.90.100")];
    i.mirror_selectors = selectors;
    i
}

fn nodes() -> Vec<NodeInfo> {
    vec![
        node("n1", &[("mirror", "yes")]),
        node("n2", &[("mirror", "yes")]),
        node("n3", &[]),
    ]
}

fn check(inputs: &RevisionInputs) -> FleetValidation {
    validate(inputs, &nodes(), &FleetParams::default())
}

/// `(check, object, field, message)` of every error.
fn errors(v: &FleetValidation) -> Vec<(Check, String, String, String)> {
    v.errors
        .iter()
        .map(|f| {
            (
                f.check,
                f.objects.iter().map(|o| o.to_string()).collect(),
                f.field.clone().unwrap_or_default(),
                f.message.clone(),
            )
        })
        .collect()
}

#[test]
fn das_schiffs_mirror_e2e_manifests_render_with_only_the_api_version_changed() {
    let inputs = fixture();
    assert_eq!(
        (inputs.mirror_targets.len(), inputs.mirror_selectors.len()),
        (2, 6)
    );
    let nodes = vec![node("worker-1", &[]), node("worker-2", &[])];
    let v = validate(&inputs, &nodes, &FleetParams::default());
    assert!(v.errors.is_empty(), "{:#?}", v.errors);
    let rendered = render(&inputs, &nodes).unwrap();
    let config = rendered["worker-1"].config();
    // Both collectors, from the node's own loopback addresses in VRF mirror.
    let mirror = config.vrfs.iter().find(|v| v.name == "mirror").unwrap();
    let lo = |name: &str| {
        let a = &mirror
            .loopbacks
            .iter()
            .find(|l| l.name == name)
            .unwrap()
            .address;
        a.split('/').next().unwrap().to_string()
    };
    let tunnels: Vec<(&str, &str, &str, &str, Option<u32>)> = config
        .mirror_tunnels
        .iter()
        .map(|t| {
            (
                t.name.as_str(),
                t.vrf.as_str(),
                t.local.as_str(),
                t.remote.as_str(),
                t.key,
            )
        })
        .collect();
    assert_eq!(
        tunnels,
        vec![
            (
                "collector-prod",
                "mirror",
                lo("lo.mir").as_str(),
                "10.250.90.100",
                Some(1001)
            ),
            (
                "collector-prod-v6",
                "mirror",
                lo("lo.mir6").as_str(),
                "fd94:685b:30cf:590::100",
                Some(1006)
            ),
        ]
    );
    assert_eq!(
        config.mirror_tunnels[0].device,
        tunnel_device("collector-prod", MirrorTargetType::L3gre)
    );
    let mirrors: Vec<(&str, Option<u16>, Option<&str>)> = config
        .mirrors
        .iter()
        .map(|m| (m.name.as_str(), m.vlan, m.vrf.as_deref()))
        .collect();
    assert_eq!(
        mirrors,
        vec![
            ("mirror-l2-egress", Some(501), None),
            ("mirror-l2-ingress", Some(501), None),
            ("mirror-l2-ingress-v6", Some(501), None),
            ("mirror-vrf-egress", None, Some("m2m")),
            ("mirror-vrf-ingress", None, Some("m2m")),
            ("mirror-vrf-ingress-v6", None, Some("m2m")),
        ]
    );
    // The agent's model takes it: tunnels in VRF mirror, ICMP filters on vlan1's bridge and VXLAN
    // device and on VRF m2m's layer-3 VXLAN device.
    let dp = desired(&config, &NodeSettings::default()).unwrap();
    let gre = &dp.links[&config.mirror_tunnels[0].device];
    assert_eq!(gre.master.as_deref(), Some("mirror"));
    let on: std::collections::BTreeSet<(&str, Hook)> = dp
        .mirrors
        .iter()
        .map(|f| (f.dev.as_str(), f.hook))
        .collect();
    assert_eq!(
        on.into_iter().collect::<Vec<_>>(),
        vec![
            ("l2.501", Hook::Ingress),
            ("l2.501", Hook::Egress),
            ("vx.501", Hook::Ingress),
            ("vx.501", Hook::Egress),
            ("vx.m2m", Hook::Ingress),
            ("vx.m2m", Hook::Egress),
        ]
    );
    assert!(
        dp.mirrors
            .iter()
            .all(|f| f.matcher.protocol == Some(1) && !f.matcher.ipv6)
    );
}

#[test]
fn a_selector_lands_only_where_the_source_and_the_targets_vrf_are() {
    let inputs = fleet(vec![selector(
        "s",
        "Layer2NetworkConfiguration",
        "vlan1",
        "col",
    )]);
    assert!(
        check(&inputs).errors.is_empty(),
        "{:?}",
        errors(&check(&inputs))
    );
    let rendered = render(&inputs, &nodes()).unwrap();
    for (n, want) in [("n1", true), ("n2", true), ("n3", false)] {
        let c = rendered[n].config();
        assert_eq!(!c.mirrors.is_empty(), want, "{n}");
        assert_eq!(!c.mirror_tunnels.is_empty(), want, "{n}");
    }
    // Each node sources the tunnel from its own loopback address.
    let local = |n: &str| rendered[n].config().mirror_tunnels[0].local.clone();
    assert_ne!(local("n1"), local("n2"));
}

#[test]
fn revisions_without_mirrors_keep_their_hashes() {
    let plain = fleet(vec![]);
    let mut no_mirrors = plain.clone();
    no_mirrors.mirror_targets.clear();
    let json = serde_json::to_string(&no_mirrors).unwrap();
    assert!(
        !json.contains("mirrorTargets") && !json.contains("mirrorSelectors"),
        "{json}"
    );
    let rendered = render(&no_mirrors, &nodes()).unwrap();
    let json = serde_json::to_string(&rendered["n1"].config()).unwrap();
    assert!(
        !json.contains("mirrorTunnels") && !json.contains("\"mirrors\""),
        "{json}"
    );
    // A target no selector uses changes the inputs (it is an object) but no node's config.
    assert_ne!(inputs_hash(&plain), inputs_hash(&no_mirrors));
    let with_target = render(&plain, &nodes()).unwrap();
    for n in ["n1", "n2", "n3"] {
        assert_eq!(with_target[n].config_hash, rendered[n].config_hash, "{n}");
    }
}

/// What is wrong, the edit that makes it so, and the error wanted: check, object, field, message.
type Case = (
    &'static str,
    Box<dyn Fn(&mut RevisionInputs)>,
    Check,
    &'static str,
    &'static str,
    &'static str,
);

#[test]
fn fleet_validation_names_the_mirror_object_and_field() {
    let cases: Vec<Case> = vec![
        (
            "unknown target",
            Box::new(|i| i.mirror_selectors[0].spec.mirror_target.name = "nope".into()),
            Check::MissingMirrorReference,
            "MirrorSelector/s",
            "spec.mirrorTarget.name",
            "MirrorTarget nope does not exist",
        ),
        (
            "unknown source",
            Box::new(|i| i.mirror_selectors[0].spec.mirror_source.name = "vlan9".into()),
            Check::MissingMirrorReference,
            "MirrorSelector/s",
            "spec.mirrorSource.name",
            "Layer2NetworkConfiguration vlan9 does not exist",
        ),
        (
            "source VRF without VNI",
            Box::new(|i| {
                i.mirror_selectors[0].spec.mirror_source =
                    reference("VRFRouteConfiguration", "plain")
            }),
            Check::MirrorSourceUnusable,
            "MirrorSelector/s",
            "spec.mirrorSource.name",
            "VRF plain has no vni",
        ),
        (
            "unknown target VRF",
            Box::new(|i| i.mirror_targets[0].spec.destination_vrf = "gone".into()),
            Check::MirrorTargetVrf,
            "MirrorTarget/col",
            "spec.destinationVrf",
            "VRF gone does not exist",
        ),
        (
            "target VRF without VNI",
            Box::new(|i| {
                i.vrfs[0].spec.vni = None;
            }),
            Check::MirrorTargetVrf,
            "MirrorTarget/col",
            "spec.destinationVrf",
            "has no vni",
        ),
        (
            "loopback not of that VRF",
            Box::new(|i| i.mirror_targets[0].spec.source_loopback = "lo.other".into()),
            Check::MirrorTargetVrf,
            "MirrorTarget/col",
            "spec.sourceLoopback",
            "lo.other is not a loopback of VRF mirror",
        ),
        (
            "family mismatch",
            Box::new(|i| i.mirror_targets[0].spec.destination_ip = "fd00::100".into()),
            Check::MirrorTargetVrf,
            "MirrorTarget/col",
            "spec.destinationIP",
            "fd00::100 is IPv6 but loopback lo.mir (10.250.91.0/29) is IPv4",
        ),
        (
            "bad destination",
            Box::new(|i| i.mirror_targets[0].spec.destination_ip = "10.250.90".into()),
            Check::ObjectSpec,
            "MirrorTarget/col",
            "spec.destinationIP",
            "is not an IP address",
        ),
        (
            "bad prefix",
            Box::new(|i| {
                i.mirror_selectors[0].spec.traffic_match.src_prefix = Some("10.0.0.1/8".into())
            }),
            Check::ObjectSpec,
            "MirrorSelector/s",
            "spec.trafficMatch.srcPrefix",
            "is not a network address",
        ),
        (
            "never matches: two families",
            Box::new(|i| {
                let m = &mut i.mirror_selectors[0].spec.traffic_match;
                m.src_prefix = Some("10.0.0.0/8".into());
                m.dst_prefix = Some("fd00::/64".into());
            }),
            Check::ObjectSpec,
            "MirrorSelector/s",
            "spec.trafficMatch.dstPrefix",
            "no packet has both",
        ),
        (
            "never matches: ports with icmp",
            Box::new(|i| {
                let m = &mut i.mirror_selectors[0].spec.traffic_match;
                m.protocol = Some("ICMP".into());
                m.dst_port = Some(443);
            }),
            Check::ObjectSpec,
            "MirrorSelector/s",
            "spec.trafficMatch.dstPort",
            "an ICMP packet has none",
        ),
        (
            "never matches: icmpv6 on an IPv4 prefix",
            Box::new(|i| {
                let m = &mut i.mirror_selectors[0].spec.traffic_match;
                m.protocol = Some("icmpv6".into());
                m.dst_prefix = Some("10.0.0.0/8".into());
            }),
            Check::ObjectSpec,
            "MirrorSelector/s",
            "spec.trafficMatch.dstPrefix",
            "no packet matches both",
        ),
        (
            "unknown protocol",
            Box::new(|i| i.mirror_selectors[0].spec.traffic_match.protocol = Some("gre".into())),
            Check::ObjectSpec,
            "MirrorSelector/s",
            "spec.trafficMatch.protocol",
            "gre is not a protocol netwave can match",
        ),
        (
            "the same tunnel twice",
            Box::new(|i| {
                let mut twin = i.mirror_targets[0].clone();
                twin.name = "twin".into();
                i.mirror_targets.push(twin);
            }),
            Check::MirrorTargetVrf,
            "MirrorTarget/twin",
            "spec.destinationIP",
            "MirrorTarget col is the same tunnel",
        ),
        (
            "foreign API group",
            Box::new(|i| {
                i.mirror_selectors[0].spec.mirror_target.api_group = Some("example.com".into())
            }),
            Check::ObjectSpec,
            "MirrorSelector/s",
            "spec.mirrorTarget.apiGroup",
            "example.com is not netwave's group",
        ),
    ];
    let good = fleet(vec![selector(
        "s",
        "Layer2NetworkConfiguration",
        "vlan1",
        "col",
    )]);
    assert!(check(&good).errors.is_empty());
    for (what, edit, want_check, object, field, message) in cases {
        let mut i = good.clone();
        edit(&mut i);
        let got = errors(&check(&i));
        assert!(
            got.iter().any(|(c, o, f, m)| *c == want_check
                && o == object
                && f == field
                && m.contains(message)),
            "{what}: want {want_check:?} {object} {field} ~ {message:?}, got {got:#?}"
        );
    }
}

#[test]
fn a_selector_whose_source_never_meets_the_targets_vrf_is_a_warning() {
    let mut i = fleet(vec![selector(
        "s",
        "Layer2NetworkConfiguration",
        "vlan1",
        "col",
    )]);
    i.layer2s[0].spec.node_selector = match_labels(&[("rack", "b")]);
    let v = check(&i);
    assert!(v.errors.is_empty(), "{:?}", errors(&v));
    assert!(
        v.warnings
            .iter()
            .any(|w| w.check == Check::SelectsNoNode && w.to_string().contains("mirrors nowhere")),
        "{:#?}",
        v.warnings
    );
}

/// The dataplane of node `n1` for `inputs`.
fn dataplane(inputs: &RevisionInputs) -> netwave_core::dataplane::Dataplane {
    let config = render(inputs, &nodes()).unwrap()["n1"].config();
    desired(&config, &NodeSettings::default()).unwrap()
}

#[test]
fn adding_a_mirror_creates_its_tunnel_qdiscs_and_filters_and_nothing_else() {
    let before = dataplane(&fleet(vec![]));
    let mut sel = selector("s", "Layer2NetworkConfiguration", "vlan1", "col");
    sel.spec.traffic_match.protocol = Some("tcp".into());
    sel.spec.traffic_match.dst_port = Some(443);
    let after = dataplane(&fleet(vec![sel]));
    let observed = Observed {
        managed: before.clone(),
        ..Observed::default()
    };
    let ops: Vec<String> = diff(&after, &observed)
        .unwrap()
        .iter()
        .map(|o| o.to_string())
        .collect();
    let gre = tunnel_device("col", MirrorTargetType::L2gre);
    let local = after.links[&gre].kind.to_string();
    assert_eq!(
        ops,
        vec![
            format!("link add {gre} type {local}"),
            format!("link set {gre} alias netwave:managed master mirror up"),
            "qdisc add dev l2.501 clsact".to_string(),
            "qdisc add dev vx.501 clsact".to_string(),
            format!(
                "filter add dev l2.501 ingress pref 32768 flower ip ip_proto 6 dst_port 443 action mirred egress mirror dev {gre}"
            ),
            format!(
                "filter add dev l2.501 ingress pref 32769 flower ipv6 ip_proto 6 dst_port 443 action mirred egress mirror dev {gre}"
            ),
            format!(
                "filter add dev vx.501 egress pref 32768 flower ip ip_proto 6 dst_port 443 action mirred egress mirror dev {gre}"
            ),
            format!(
                "filter add dev vx.501 egress pref 32769 flower ipv6 ip_proto 6 dst_port 443 action mirred egress mirror dev {gre}"
            ),
        ]
    );
    assert!(
        local.starts_with("gretap dev mirror local 10.250.91."),
        "{local}"
    );
    assert!(local.ends_with("remote 10.250.90.100 key 7"), "{local}");
    // Applied, a re-apply changes nothing.
    let applied = Observed {
        managed: after.clone(),
        ..Observed::default()
    };
    assert_eq!(diff(&after, &applied).unwrap(), vec![]);
    // Removed, the filters, qdiscs and the tunnel go, and nothing else.
    let ops: Vec<String> = diff(&before, &applied)
        .unwrap()
        .iter()
        .map(|o| o.to_string())
        .collect();
    assert_eq!(
        ops,
        vec![
            "qdisc del dev l2.501 clsact".to_string(),
            "qdisc del dev vx.501 clsact".to_string(),
            format!("link del {gre}"),
        ]
    );
}

#[test]
fn a_second_selector_leaves_the_first_ones_filters_where_they_are() {
    let one = dataplane(&fleet(vec![selector(
        "a",
        "Layer2NetworkConfiguration",
        "vlan1",
        "col",
    )]));
    let mut b = selector("b", "Layer2NetworkConfiguration", "vlan1", "col");
    b.spec.direction = MirrorDirection::Ingress;
    b.spec.traffic_match.protocol = Some("udp".into());
    let two = dataplane(&fleet(vec![
        selector("a", "Layer2NetworkConfiguration", "vlan1", "col"),
        b,
    ]));
    let ops = diff(
        &two,
        &Observed {
            managed: one.clone(),
            ..Observed::default()
        },
    )
    .unwrap();
    assert!(
        ops.iter().all(|o| matches!(o, NetOp::AddFilter(_))),
        "{ops:#?}"
    );
    assert_eq!(
        ops.len(),
        4,
        "udp on IPv4 and IPv6 on two devices: {ops:#?}"
    );
    // And taking `a` away removes only its filters.
    let b_only = dataplane(&fleet(vec![{
        let mut b = selector("b", "Layer2NetworkConfiguration", "vlan1", "col");
        b.spec.direction = MirrorDirection::Ingress;
        b.spec.traffic_match.protocol = Some("udp".into());
        b
    }]));
    let ops = diff(
        &b_only,
        &Observed {
            managed: two.clone(),
            ..Observed::default()
        },
    )
    .unwrap();
    assert!(
        ops.iter()
            .all(|o| matches!(o, NetOp::DelFilter(f) if f.matcher.protocol.is_none())),
        "{ops:#?}"
    );
    assert_eq!(ops.len(), 4, "{ops:#?}");
}

#[test]
fn the_mirror_health_gate_fails_a_missing_filter_or_a_tunnel_without_its_source() {
    use netwave_core::dataplane::mirror_health;
    let inputs = fleet(vec![selector(
        "s",
        "Layer2NetworkConfiguration",
        "vlan1",
        "col",
    )]);
    let config = render(&inputs, &nodes()).unwrap()["n1"].config();
    let settings = NodeSettings::default();
    let want = desired(&config, &settings).unwrap();
    let gre = tunnel_device("col", MirrorTargetType::L2gre);
    let up: std::collections::BTreeSet<String> = [gre.clone()].into();
    let problems = |observed: &netwave_core::dataplane::Dataplane,
                    up: &std::collections::BTreeSet<String>|
     -> Vec<(String, String)> {
        mirror_health(&config, &settings, observed, up)
            .into_iter()
            .filter_map(|c| c.problem.map(|p| (c.name, p)))
            .collect()
    };
    assert_eq!(problems(&want, &up), vec![], "applied as desired");
    // A filter taken away (by hand, or an apply that did not place it): the selector fails.
    let mut missing = want.clone();
    let f = missing
        .mirrors
        .iter()
        .find(|f| f.dev == "vx.501")
        .unwrap()
        .clone();
    missing.mirrors.remove(&f);
    let got = problems(&missing, &up);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, "mirror s");
    assert!(
        got[0]
            .1
            .starts_with("filter not in place: vx.501 egress ip"),
        "{got:?}"
    );
    // The tunnel down, or its VRF without the source address.
    let got = problems(&want, &std::collections::BTreeSet::new());
    assert_eq!(
        got,
        vec![(
            format!("mirror-tunnel col ({gre})"),
            format!("tunnel {gre} is not up")
        )]
    );
    let mut no_source = want.clone();
    no_source.links.get_mut("mirror").unwrap().addresses.clear();
    let got = problems(&no_source, &up);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0]
            .1
            .starts_with("VRF mirror does not have the tunnel's source address 10.250.91."),
        "{got:?}"
    );
}
