//! Builders shared by the render, fleet and revision tests.
#![allow(dead_code)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use netwave_api::manifest::{Manifest, samples};
use netwave_api::{
    Layer2NetworkConfigurationSpec, NamedLayer2, NamedRoutingTable, NamedVrf, RevisionInputs,
    Route, RouteType, RoutingTableSpec, Rule, VRFRouteConfigurationSpec,
};
use netwave_core::render::NodeInfo;

/// The objects of deploy/samples as revision inputs (parsed once per test binary).
pub fn sample_inputs() -> RevisionInputs {
    static SAMPLES: std::sync::OnceLock<RevisionInputs> = std::sync::OnceLock::new();
    SAMPLES.get_or_init(parse_samples).clone()
}

fn parse_samples() -> RevisionInputs {
    let mut inputs = RevisionInputs::default();
    for m in samples().expect("samples parse") {
        let name = m.name().to_string();
        match m {
            Manifest::Vrf(o) => inputs.vrfs.push(NamedVrf { name, spec: o.spec }),
            Manifest::Layer2(o) => inputs.layer2s.push(NamedLayer2 { name, spec: o.spec }),
            Manifest::RoutingTable(o) => inputs
                .routing_tables
                .push(NamedRoutingTable { name, spec: o.spec }),
            other => panic!("unexpected sample {}", other.name()),
        }
    }
    inputs
}

/// A compute node, a storage node, an edge node and an unlabelled one.
pub fn sample_nodes() -> Vec<NodeInfo> {
    vec![
        node("compute-0", &[("netwave.dev/pool", "compute")]),
        node("storage-0", &[("netwave.dev/pool", "storage")]),
        node("edge-0", &[("netwave.dev/edge", "true")]),
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
            vrf: name.into(),
            vni,
            route_target: None,
            table_id: None,
            import: vec![],
            export: vec![],
            aggregate: vec![],
            seq: 10,
            communities: vec![],
            mtu: None,
            node_selector: None,
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
        priority,
    }
}

pub fn inputs(
    vrfs: Vec<NamedVrf>,
    l2s: Vec<NamedLayer2>,
    rts: Vec<NamedRoutingTable>,
) -> RevisionInputs {
    RevisionInputs {
        vrfs,
        layer2s: l2s,
        routing_tables: rts,
    }
}
