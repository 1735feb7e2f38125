//! Builders shared by the render, fleet and revision tests.
#![allow(dead_code)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use netwave_api::manifest::samples;
use netwave_api::{
    Layer2NetworkConfigurationSpec, NamedLayer2, NamedRoutingTable, NamedVrf, RevisionInputs,
    Route, RouteType, RoutingTableSpec, Rule, VRFRouteConfigurationSpec,
};
use netwave_core::render::NodeInfo;
use proptest::prelude::*;

/// The objects of deploy/samples as revision inputs (parsed once per test binary).
pub fn sample_inputs() -> RevisionInputs {
    static SAMPLES: std::sync::OnceLock<RevisionInputs> = std::sync::OnceLock::new();
    SAMPLES.get_or_init(parse_samples).clone()
}

fn parse_samples() -> RevisionInputs {
    let mut inputs = RevisionInputs::default();
    for m in samples().expect("samples parse") {
        if let Err(e) = inputs.add(m) {
            panic!("unexpected sample: {e}")
        }
    }
    inputs
}

/// A compute node, a storage node, an edge node and an unlabelled one.
pub fn sample_nodes() -> Vec<NodeInfo> {
    vec![
        node(
            "compute-0",
            &[("node-restriction.kubernetes.io/netwave-pool", "compute")],
        ),
        node(
            "storage-0",
            &[("node-restriction.kubernetes.io/netwave-pool", "storage")],
        ),
        node(
            "edge-0",
            &[("node-restriction.kubernetes.io/netwave-edge", "true")],
        ),
        node("plain-0", &[]),
    ]
}

pub fn node(name: &str, labels: &[(&str, &str)]) -> NodeInfo {
    NodeInfo::new(name, labels.iter().copied())
}

pub fn match_labels(labels: &[(&str, &str)]) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        ),
        match_expressions: None,
    })
}

pub fn expr(key: &str, operator: &str, values: &[&str]) -> LabelSelectorRequirement {
    LabelSelectorRequirement {
        key: key.into(),
        operator: operator.into(),
        values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
    }
}

pub fn match_expressions(exprs: Vec<LabelSelectorRequirement>) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: None,
        match_expressions: Some(exprs),
    })
}

pub fn vrf(name: &str, vni: Option<u32>) -> NamedVrf {
    NamedVrf {
        name: name.into(),
        spec: VRFRouteConfigurationSpec {
            vni,
            ..VRFRouteConfigurationSpec::named(name)
        },
    }
}

pub fn l2(name: &str, vlan: u16, vni: u32) -> NamedLayer2 {
    NamedLayer2 {
        name: name.into(),
        spec: Layer2NetworkConfigurationSpec {
            id: vlan,
            vni,
            mtu: 9000,
            anycast_mac: None,
            anycast_gateways: vec![],
            vrf: None,
            neigh_suppression: None,
            route_target: None,
            node_selector: None,
        },
    }
}

pub fn with_gateways(mut l: NamedLayer2, gateways: &[&str]) -> NamedLayer2 {
    l.spec.anycast_mac = Some("02:00:5e:00:01:01".into());
    l.spec.anycast_gateways = gateways.iter().map(|g| g.to_string()).collect();
    l
}

pub fn rt(name: &str, table: u32) -> NamedRoutingTable {
    NamedRoutingTable {
        name: name.into(),
        spec: RoutingTableSpec {
            table_id: table,
            routes: vec![],
            rules: vec![],
            node_selector: None,
        },
    }
}

pub fn route(prefix: &str, via: Option<&str>, dev: Option<&str>) -> Route {
    Route {
        prefix: prefix.into(),
        via: via.map(Into::into),
        dev: dev.map(Into::into),
        kind: RouteType::Unicast,
        metric: None,
    }
}

pub fn rule(from: &str, priority: u32) -> Rule {
    Rule {
        from: Some(from.into()),
        to: None,
        iif: None,
        fwmark: None,
        fwmask: None,
        priority,
    }
}

pub fn inputs(
    vrfs: Vec<NamedVrf>,
    l2s: Vec<NamedLayer2>,
    rts: Vec<NamedRoutingTable>,
) -> RevisionInputs {
    RevisionInputs {
        bgp_peerings: Vec::new(),
        mirror_targets: Vec::new(),
        mirror_selectors: Vec::new(),
        underlays: Vec::new(),
        render_version: None,
        vrfs,
        layer2s: l2s,
        routing_tables: rts,
    }
}

/// A fleet built from small random choices: objects with selectors over a few labels.
pub fn arb_fleet() -> impl Strategy<Value = (RevisionInputs, Vec<NodeInfo>)> {
    let pools = ["compute", "storage", "edge"];
    let obj_sel = prop::option::of(0usize..3);
    let vrfs = prop::collection::vec((obj_sel.clone(), prop::option::of(100u32..116)), 0..8);
    let l2s = prop::collection::vec((obj_sel.clone(), 1u16..40, 0usize..8, any::<bool>()), 0..20);
    let rts = prop::collection::vec((obj_sel, 100u32..110, 0u8..4), 0..6);
    let nodes = prop::collection::vec((0usize..3, 0u8..4), 0..25);
    (vrfs, l2s, rts, nodes).prop_map(move |(vrfs, l2s, rts, nodes)| {
        let sel = |s: Option<usize>| s.and_then(|p| match_labels(&[("pool", pools[p])]));
        let mut inputs = RevisionInputs::default();
        for (i, (s, table)) in vrfs.iter().enumerate() {
            let mut v = vrf(&format!("vrf{i}"), Some(100_000 + i as u32));
            v.spec.table_id = *table;
            v.spec.node_selector = sel(*s);
            v.spec.communities = vec!["65000:2".into(), "65000:1".into()];
            inputs.vrfs.push(v);
        }
        for (i, (s, vlan, vrf_ix, gw)) in l2s.iter().enumerate() {
            let mut l = l2(&format!("seg{i}"), *vlan, 200_000 + i as u32);
            l.spec.node_selector = sel(*s);
            if *vrf_ix < vrfs.len() {
                l.spec.vrf = Some(format!("vrf{vrf_ix}"));
            }
            if *gw {
                l = with_gateways(l, &[&format!("fd00:{i}::1/64"), &format!("10.{i}.0.1/24")]);
            }
            inputs.layer2s.push(l);
        }
        for (i, (s, table, n)) in rts.iter().enumerate() {
            let mut t = rt(&format!("rt{i}"), *table);
            t.spec.node_selector = sel(*s);
            for r in 0..*n {
                t.spec
                    .routes
                    .push(route(&format!("10.{r}.0.0/16"), Some("10.255.0.1"), None));
                t.spec
                    .rules
                    .push(rule(&format!("10.{r}.0.0/16"), 1000 + u32::from(r)));
            }
            inputs.routing_tables.push(t);
        }
        let nodes = nodes
            .iter()
            .enumerate()
            .map(|(i, (p, rack))| {
                node(
                    &format!("node-{i:02}"),
                    &[("pool", pools[*p]), ("rack", &rack.to_string())],
                )
            })
            .collect();
        (inputs, nodes)
    })
}

pub fn shuffled<T: Clone>(v: &[T], seed: u64) -> Vec<T> {
    // Deterministic Fisher-Yates driven by a tiny LCG: the order only has to differ, not be random.
    let mut out = v.to_vec();
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    for i in (1..out.len()).rev() {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        out.swap(i, (x >> 33) as usize % (i + 1));
    }
    out
}
