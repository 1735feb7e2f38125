//! das-schiff-network-operator's remaining fields, applied with its meaning: a VRF's `sbrPrefixes`
//! (a local VRF `s-<vrf>` plus policy rules), its `loopbacks` (per-node addresses from a subnet, in the
//! NodeNetworkConfig) and a layer-2 segment's `routeTarget` (its VNI's EVPN route target in FRR).
//! The FRR text of all three is in the das-schiff golden, which `frr_accepts` loads into real FRR.

mod support_inputs;

use std::collections::{BTreeMap, BTreeSet};

use ipnet::IpNet;
use netwave_api::validate::{validate_layer2, validate_vrf};
use netwave_api::{NodeConfig, RevisionInputs, VrfLoopback};
use netwave_core::dataplane::{self, Family, LinkKind, NodeSettings, Rule};
use netwave_core::fleet::{Check, FleetParams, validate};
use netwave_core::render::{NodeInfo, SBR_RULE_PRIORITY, config_hash, render};
use support_inputs::{inputs, l2, match_labels, node, vrf};

fn nodes(n: usize) -> Vec<NodeInfo> {
    (0..n)
        .map(|i| node(&format!("worker-{i}"), &[("pool", "mirror")]))
        .collect()
}

fn mirror_inputs(subnet_v4: &str) -> RevisionInputs {
    let mut m = vrf("mirror", Some(2002091));
    m.spec.loopbacks = vec![
        VrfLoopback {
            name: "lo.mir".into(),
            subnet: subnet_v4.into(),
        },
        VrfLoopback {
            name: "lo.mir6".into(),
            subnet: "fd94:685b:30cf:591::/125".into(),
        },
    ];
    m.spec.node_selector = match_labels(&[("pool", "mirror")]);
    inputs(vec![m], vec![], vec![])
}

/// node → (loopback name → address) of the `mirror` VRF.
fn addresses(
    inputs: &RevisionInputs,
    nodes: &[NodeInfo],
) -> BTreeMap<String, Vec<(String, String)>> {
    render(inputs, nodes)
        .expect("renders")
        .into_iter()
        .map(|(n, r)| {
            let config = r.config();
            assert_eq!(
                r.config_hash,
                config_hash(&config),
                "{n}: hash of its own config"
            );
            let v = config
                .vrfs
                .iter()
                .find(|v| v.name == "mirror")
                .expect("mirror VRF");
            let lbs = v
                .loopbacks
                .iter()
                .map(|l| (l.name.clone(), l.address.clone()))
                .collect();
            (n, lbs)
        })
        .collect()
}

#[test]
fn every_node_gets_its_own_loopback_addresses_in_its_node_config() {
    let got = addresses(&mirror_inputs("10.250.91.0/29"), &nodes(6));
    assert_eq!(got.len(), 6);
    let mut seen = BTreeSet::new();
    let v4: IpNet = "10.250.91.0/29".parse().unwrap();
    let v6: IpNet = "fd94:685b:30cf:591::/125".parse().unwrap();
    for (n, lbs) in &got {
        assert_eq!(lbs.len(), 2, "{n}: {lbs:?}");
        for (name, addr) in lbs {
            let a: IpNet = addr.parse().unwrap();
            assert_eq!(
                a.prefix_len(),
                a.max_prefix_len(),
                "{n} {name}: a host prefix"
            );
            let pool = if name == "lo.mir" { v4 } else { v6 };
            assert!(pool.contains(&a.addr()), "{n} {name}: {a} outside {pool}");
            assert_ne!(a.addr(), pool.network(), "{n}: the network address");
            if name == "lo.mir" {
                assert_ne!(a.addr(), pool.broadcast(), "{n}: the broadcast address");
            }
            assert!(seen.insert(a), "{n}: {a} given twice");
        }
    }
    // Six nodes fill the /29's six host addresses.
    assert_eq!(seen.len(), 12);
    // The agent puts them on the VRF device, the VRF's own loopback.
    let rendered = render(&mirror_inputs("10.250.91.0/29"), &nodes(6)).expect("renders");
    let config = rendered["worker-3"].config();
    let dp = dataplane::desired(&config, &NodeSettings::default()).expect("model");
    let on_device: Vec<String> = dp.links["mirror"]
        .addresses
        .iter()
        .map(ToString::to_string)
        .collect();
    let mut want: Vec<String> = got["worker-3"].iter().map(|(_, a)| a.clone()).collect();
    want.sort();
    let mut on_device_sorted = on_device.clone();
    on_device_sorted.sort();
    assert_eq!(on_device_sorted, want);
}

#[test]
fn a_nodes_loopback_address_survives_other_revisions_and_other_nodes_coming() {
    let base = mirror_inputs("10.250.91.0/24");
    let before = addresses(&base, &nodes(5));
    // Another revision: other fields change, the VRF's nodes and subnets do not.
    let mut next = base.clone();
    next.vrfs[0].spec.route_target = Some("65188:2091".into());
    next.layer2s.push(l2("vlan501", 501, 4000002));
    assert_eq!(addresses(&next, &nodes(5)), before);
    // Input order does not matter either.
    let mut reversed = nodes(5);
    reversed.reverse();
    assert_eq!(addresses(&base, &reversed), before);
    // A sixth node joining takes a free address; in a /24 nobody else moves.
    let after = addresses(&base, &nodes(6));
    for (n, lbs) in &before {
        assert_eq!(&after[n], lbs, "{n} moved when worker-5 joined");
    }
}

#[test]
fn fleet_validation_refuses_a_loopback_pool_smaller_than_the_vrfs_nodes() {
    let v = validate(
        &mirror_inputs("10.250.91.0/29"),
        &nodes(7),
        &FleetParams::default(),
    );
    let e = v
        .errors
        .iter()
        .find(|f| f.check == Check::LoopbackPoolTooSmall)
        .unwrap_or_else(|| panic!("no pool error: {:?}", v.errors));
    assert_eq!(e.field.as_deref(), Some("spec.loopbacks[0].subnet"));
    assert_eq!(e.objects[0].to_string(), "VRFRouteConfiguration/mirror");
    assert!(
        e.message.contains("6 node address(es)") && e.message.contains("7 nodes"),
        "{e}"
    );
    // Six nodes fit.
    let ok = validate(
        &mirror_inputs("10.250.91.0/29"),
        &nodes(6),
        &FleetParams::default(),
    );
    assert!(ok.is_valid(), "{:?}", ok.errors);
}

#[test]
fn fleet_validation_refuses_overlapping_loopbacks_of_vrfs_that_meet_on_a_node() {
    let mut inputs = mirror_inputs("10.250.91.0/29");
    let mut other = vrf("tap", Some(2002092));
    other.spec.loopbacks = vec![VrfLoopback {
        name: "lo.tap".into(),
        subnet: "10.250.91.0/28".into(),
    }];
    inputs.vrfs.push(other.clone());
    let v = validate(&inputs, &nodes(3), &FleetParams::default());
    let e = v
        .errors
        .iter()
        .find(|f| f.check == Check::LoopbackOverlap)
        .unwrap_or_else(|| panic!("no overlap error: {:?}", v.errors));
    assert_eq!(e.objects.len(), 2, "{e}");
    assert!(
        e.field.as_deref().unwrap().starts_with("spec.loopbacks["),
        "{e}"
    );
    assert_eq!(e.nodes.len(), 3, "{e}");
    // Apart (different nodes), the same pools are fine.
    inputs.vrfs[1].spec.node_selector = match_labels(&[("pool", "tap")]);
    let v = validate(&inputs, &nodes(3), &FleetParams::default());
    assert!(v.is_valid(), "{:?}", v.errors);
    // Within one VRF, overlapping pools are the object's own error.
    other.spec.loopbacks.push(VrfLoopback {
        name: "lo.tap2".into(),
        subnet: "10.250.91.8/29".into(),
    });
    let errors = validate_vrf(&other.spec);
    assert!(
        errors
            .iter()
            .any(|e| e.path == "spec.loopbacks[1].subnet" && e.message.contains("overlaps")),
        "{errors:?}"
    );
}

fn sbr_config() -> NodeConfig {
    let mut v = vrf("ingress", Some(2002031));
    v.spec.sbr_prefixes = vec![
        "fd95:685b:30cf:501::/64".into(),
        "10.251.0.0/24".into(),
        "10.251.1.0/24".into(),
    ];
    let rendered = render(&inputs(vec![v], vec![], vec![]), &nodes(1)).expect("renders");
    rendered["worker-0"].config()
}

#[test]
fn sbr_prefixes_become_a_local_vrf_and_one_policy_rule_per_source() {
    let config = sbr_config();
    let sbr = config.vrfs[0].sbr.clone().expect("sbr rendered");
    assert_eq!(sbr.device, "s-ingress");
    assert_ne!(sbr.table, config.vrfs[0].table);
    assert_eq!(sbr.priority, SBR_RULE_PRIORITY);
    let dp = dataplane::desired(&config, &NodeSettings::default()).expect("model");
    assert_eq!(
        dp.links["s-ingress"].kind,
        LinkKind::Vrf { table: sbr.table }
    );
    let rules: Vec<&Rule> = dp.rules.iter().collect();
    let expect = |family, from: &str| Rule {
        family,
        priority: SBR_RULE_PRIORITY,
        table: sbr.table,
        from: Some(from.parse().unwrap()),
        to: None,
        iif: None,
        fwmark: None,
        fwmask: None,
    };
    assert_eq!(
        rules,
        [
            &expect(Family::V4, "10.251.0.0/24"),
            &expect(Family::V4, "10.251.1.0/24"),
            &expect(Family::V6, "fd95:685b:30cf:501::/64"),
        ]
    );
    // FRR is needed for it: the local VRF's routes are leaked by BGP.
    assert_eq!(
        netwave_core::frr::bgp_content(&config),
        ["VRF ingress: vni, sbrPrefixes"]
    );
}

#[test]
fn a_source_steered_into_two_vrfs_on_a_node_is_refused() {
    let mut a = vrf("red", None);
    a.spec.sbr_prefixes = vec!["10.9.0.0/16".into()];
    let mut b = vrf("blue", None);
    b.spec.sbr_prefixes = vec!["10.9.0.0/16".into()];
    let v = validate(
        &inputs(vec![a, b], vec![], vec![]),
        &nodes(2),
        &FleetParams::default(),
    );
    let e = v
        .errors
        .iter()
        .find(|f| f.check == Check::SbrPrefixConflict)
        .unwrap_or_else(|| panic!("{:?}", v.errors));
    assert_eq!(e.field.as_deref(), Some("spec.sbrPrefixes[0]"));
    assert_eq!(e.objects.len(), 2);
    // A name too long for `s-<vrf>` is refused with the field.
    let mut long = vrf("fifteen-chars-x", None);
    long.spec.sbr_prefixes = vec!["10.9.0.0/16".into()];
    let v = validate(
        &inputs(vec![long], vec![], vec![]),
        &nodes(1),
        &FleetParams::default(),
    );
    assert!(
        v.errors.iter().any(|f| f.check == Check::DeviceNameTooLong
            && f.field.as_deref() == Some("spec.sbrPrefixes")),
        "{:?}",
        v.errors
    );
}

#[test]
fn a_layer2_route_target_is_validated_and_needs_frr() {
    let mut seg = l2("vlan501", 501, 4000002);
    seg.spec.route_target = Some("65188".into());
    let errors = validate_layer2(&seg.spec);
    assert_eq!(errors[0].path, "spec.routeTarget", "{errors:?}");
    seg.spec.route_target = Some("65188:501".into());
    assert!(validate_layer2(&seg.spec).is_empty());
    let rendered = render(&inputs(vec![], vec![seg], vec![]), &nodes(1)).expect("renders");
    let config = rendered["worker-0"].config();
    assert_eq!(config.layer2s[0].route_target.as_deref(), Some("65188:501"));
    assert_eq!(
        netwave_core::frr::bgp_content(&config),
        ["layer-2 VLAN 501: routeTarget"]
    );
}
