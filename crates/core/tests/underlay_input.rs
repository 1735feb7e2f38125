//! Underlays as inputs (#47): folded into the revision, rendered onto the nodes they select (and no
//! other node's config changes), fleet-validated with errors naming the object and field, and rendered
//! into FRR with the node's own VTEP address.

mod support_inputs;

use netwave_api::{
    NamedUnderlay, NodeConfig, UnderlayNeighborSpec, UnderlaySpec, UnderlayTimersSpec,
};
use netwave_core::fleet::{Check, FleetParams, validate};
use netwave_core::frr::{FrrError, Underlay};
use netwave_core::render::{config_hash, render};
use netwave_core::revision::inputs_hash;
use support_inputs::*;

const EDGE: (&str, &str) = ("node-restriction.kubernetes.io/netwave-edge", "true");

fn neighbor(address: &str, remote_as: &str) -> UnderlayNeighborSpec {
    UnderlayNeighborSpec {
        address: Some(address.into()),
        interface: None,
        remote_as: remote_as.into(),
    }
}

fn underlay(name: &str, asn: u32, selector: &[(&str, &str)]) -> NamedUnderlay {
    NamedUnderlay {
        name: name.into(),
        spec: UnderlaySpec {
            asn,
            neighbors: vec![neighbor("198.18.0.254", "internal")],
            timers: Some(UnderlayTimersSpec {
                keepalive: 1,
                hold: 3,
            }),
            node_selector: match_labels(selector),
        },
    }
}

#[test]
fn an_underlay_is_rendered_onto_the_nodes_it_selects_and_no_other_config_changes() {
    let before = render(&sample_inputs(), &sample_nodes()).unwrap();
    let mut inputs = sample_inputs();
    let plain_hash = inputs_hash(&inputs);
    inputs.underlays.push(underlay("edge", 65010, &[EDGE]));
    assert_ne!(inputs_hash(&inputs), plain_hash, "a new revision");
    let after = render(&inputs, &sample_nodes()).unwrap();

    let edge = after["edge-0"].config();
    let u = edge.underlay.as_ref().expect("the edge node's underlay");
    assert_eq!((u.name.as_str(), u.asn), ("edge", 65010));
    assert_eq!(u.neighbors, [neighbor("198.18.0.254", "internal")]);
    assert_eq!(after["edge-0"].needs().names(), ["underlay"]);
    for (name, node) in &after {
        assert_eq!(node.config_hash, config_hash(&node.config()), "{name}");
        if name != "edge-0" {
            assert_eq!(node.config().underlay, None, "{name}");
            assert_eq!(
                node.config_hash, before[name].config_hash,
                "{name} is untouched"
            );
        }
    }
    // The edge node's config is its old one plus the underlay.
    let mut without = edge.clone();
    without.underlay = None;
    assert_eq!(without, before["edge-0"].config());

    // An Underlay without a selector is on every node.
    let mut all = sample_inputs();
    all.underlays.push(underlay("fabric", 65000, &[]));
    all.underlays[0].spec.node_selector = None;
    let everywhere = render(&all, &sample_nodes()).unwrap();
    assert!(everywhere.values().all(|n| n.config().underlay.is_some()));
}

#[test]
fn two_underlays_on_one_node_are_refused_naming_both_and_the_nodes() {
    let mut inputs = sample_inputs();
    inputs.underlays.push(underlay("fabric", 65000, &[]));
    inputs.underlays[0].spec.node_selector = None;
    inputs.underlays.push(underlay("edge", 65010, &[EDGE]));
    let v = validate(&inputs, &sample_nodes(), &FleetParams::default());
    let overlap: Vec<_> = (v.errors.iter())
        .filter(|f| f.check == Check::UnderlayOverlap)
        .collect();
    assert_eq!(overlap.len(), 1, "{:?}", v.errors);
    let names: Vec<&str> = overlap[0].objects.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["edge", "fabric"]);
    assert_eq!(overlap[0].nodes, ["edge-0"]);

    // Disjoint selectors: valid.
    inputs.underlays[0].spec.node_selector = match_labels(&[("rack", "1")]);
    let v = validate(&inputs, &sample_nodes(), &FleetParams::default());
    assert!(
        !v.errors.iter().any(|f| f.check == Check::UnderlayOverlap),
        "{:?}",
        v.errors
    );
}

#[test]
fn an_underlay_frr_would_refuse_is_refused_naming_the_field() {
    // (what, how the spec is broken, the field the error names)
    type Case = (&'static str, Box<dyn Fn(&mut UnderlaySpec)>, &'static str);
    let cases: Vec<Case> = vec![
        ("AS_TRANS", Box::new(|s| s.asn = 23456), "spec.asn"),
        (
            "an IPv6 numbered neighbour",
            Box::new(|s| s.neighbors[0] = neighbor("fd00::1", "internal")),
            "spec.neighbors[0].address",
        ),
        (
            "a neighbour with both address and interface",
            Box::new(|s| s.neighbors[0].interface = Some("eth1".into())),
            "spec.neighbors[0]",
        ),
        (
            "an interface that is an address",
            Box::new(|s| {
                s.neighbors[0] = UnderlayNeighborSpec {
                    address: None,
                    interface: Some("10.0.0.1".into()),
                    remote_as: "external".into(),
                }
            }),
            "spec.neighbors[0].interface",
        ),
        (
            "an unknown remoteAs",
            Box::new(|s| s.neighbors[0].remote_as = "ibgp".into()),
            "spec.neighbors[0].remoteAs",
        ),
        (
            "the same neighbour twice",
            Box::new(|s| s.neighbors.push(neighbor("198.18.0.254", "external"))),
            "spec.neighbors[1]",
        ),
        (
            "a hold time under 3 s",
            Box::new(|s| {
                s.timers = Some(UnderlayTimersSpec {
                    keepalive: 1,
                    hold: 2,
                })
            }),
            "spec.timers.hold",
        ),
    ];
    for (what, break_it, field) in cases {
        let mut inputs = sample_inputs();
        let mut u = underlay("edge", 65010, &[EDGE]);
        break_it(&mut u.spec);
        inputs.underlays.push(u);
        let v = validate(&inputs, &sample_nodes(), &FleetParams::default());
        let found = (v.errors.iter())
            .find(|f| f.check == Check::ObjectSpec && f.objects.iter().any(|o| o.name == "edge"))
            .unwrap_or_else(|| panic!("{what}: not refused: {:?}", v.errors));
        assert_eq!(found.field.as_deref(), Some(field), "{what}: {found:?}");
        assert_eq!(found.nodes, ["edge-0"], "{what}");
    }
}

fn bootstrap() -> Underlay {
    serde_saphyr::from_str::<Underlay>(
        "asn: 65000\nvtepAddress: 198.18.1.1\nneighbors:\n  - address: 198.18.0.2\n    remoteAs: internal\n",
    )
    .expect("valid underlay")
}

#[test]
fn frr_takes_the_inputs_underlay_with_the_nodes_own_vtep() {
    let plain = netwave_core::frr::render(&NodeConfig::default(), &bootstrap())
        .unwrap()
        .to_text();
    assert!(plain.contains("router bgp 65000"), "{plain}");
    assert!(
        plain.contains("neighbor 198.18.0.2 remote-as internal"),
        "{plain}"
    );

    let mut config = NodeConfig::default();
    let u = underlay("edge", 65010, &[]);
    config.underlay = Some(netwave_api::UnderlayConfig {
        name: u.name,
        asn: u.spec.asn,
        neighbors: u.spec.neighbors,
        timers: u.spec.timers,
    });
    let text = netwave_core::frr::render(&config, &bootstrap())
        .unwrap()
        .to_text();
    assert!(text.contains("router bgp 65010"), "{text}");
    assert!(
        text.contains("neighbor 198.18.0.254 remote-as internal"),
        "{text}"
    );
    assert!(text.contains("timers bgp 1 3"), "{text}");
    assert!(
        !text.contains("198.18.0.2 "),
        "the bootstrap neighbour is gone: {text}"
    );
    assert!(
        text.contains("bgp router-id 198.18.1.1"),
        "the node's own router id: {text}"
    );
    assert!(
        text.contains("198.18.1.1/32"),
        "the node's own VTEP is advertised: {text}"
    );

    // A neighbour that is this node's own VTEP: only the node can tell, and it refuses the config.
    config.underlay.as_mut().unwrap().neighbors = vec![neighbor("198.18.1.1", "internal")];
    let err = netwave_core::frr::render(&config, &bootstrap()).unwrap_err();
    assert!(
        matches!(&err, FrrError::Underlay { underlay, field, .. }
            if underlay == "edge" && field == "neighbors[0].address"),
        "{err}"
    );
}

#[test]
fn only_an_underlay_change_is_gated_on_the_new_neighbours_sessions() {
    use netwave_core::frr::underlay_sessions;
    let u = underlay("edge", 65010, &[]);
    let input = netwave_api::UnderlayConfig {
        name: u.name,
        asn: u.spec.asn,
        neighbors: u.spec.neighbors,
        timers: u.spec.timers,
    };
    let with = NodeConfig {
        underlay: Some(input.clone()),
        ..NodeConfig::default()
    };
    // Unchanged: no gate of its own.
    assert_eq!(underlay_sessions(&with, Some(&input), &bootstrap()), None);
    assert_eq!(
        underlay_sessions(&NodeConfig::default(), None, &bootstrap()),
        None
    );
    // New: its neighbours, within the hold time but at least 10 s.
    assert_eq!(
        underlay_sessions(&with, None, &bootstrap()),
        Some((vec!["198.18.0.254".to_string()], 10))
    );
    // Back to the bootstrap: the bootstrap's neighbours, FRR's default hold time (9 s) raised to 10 s.
    assert_eq!(
        underlay_sessions(&NodeConfig::default(), Some(&input), &bootstrap()),
        Some((vec!["198.18.0.2".to_string()], 10))
    );
    let mut slow = input.clone();
    slow.timers = Some(UnderlayTimersSpec {
        keepalive: 10,
        hold: 30,
    });
    let slow_config = NodeConfig {
        underlay: Some(slow),
        ..NodeConfig::default()
    };
    assert_eq!(
        underlay_sessions(&slow_config, Some(&input), &bootstrap()).map(|(_, s)| s),
        Some(30)
    );
}
