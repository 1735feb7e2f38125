//! Render + fleet-validation benchmark: 5,000 nodes × 200 VRFs × 1,000 layer-2 segments × 50 routing
//! tables, with selectors over pool, zone, rack, edge and instance-type labels, so nodes get different
//! subsets. Prints the wall time of each phase and the peak memory (VmHWM).
//!
//! `cargo run --release -p netwave-core --example bench_render [-- --nodes N]`
//!
//! Two scenarios run one after the other:
//! - `realistic`: nodes in the same rack with the same role select the same objects (a few hundred
//!   distinct configs);
//! - `worst-case`: 13 segments select nodes by hostname bit patterns, so every node selects a different
//!   set and renders its own config (nothing shared);
//! - `misconfigured`: realistic, with clashing VLANs, VNIs and gateways everywhere (validation speed
//!   when it finds thousands of problems).
//!
//! Peak memory (VmHWM) is for the whole process so far, so each line covers the scenarios before it.
//!
//! Targets (issue 3): render + validate under 2 s and under 1 GiB on the 2-core CI machine.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use netwave_api::{
    Layer2NetworkConfigurationSpec, NamedLayer2, NamedRoutingTable, NamedVrf, PrefixAction,
    PrefixItem, RevisionInputs, Route, RouteType, RoutingTableSpec, Rule,
    VRFRouteConfigurationSpec,
};
use netwave_core::fleet::{FleetParams, validate};
use netwave_core::render::{NodeInfo, render};
use netwave_core::revision::inputs_hash;

const RACK_SIZE: usize = 40;
const POOLS: [&str; 4] = ["compute", "storage", "gpu", "edge"];
const ZONES: [&str; 3] = ["zone-a", "zone-b", "zone-c"];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n_nodes = args
        .iter()
        .position(|a| a == "--nodes")
        .and_then(|i| args.get(i + 1))
        .map(|n| n.parse().expect("--nodes takes a number"))
        .unwrap_or(5000);
    println!(
        "bench_render: {n_nodes} nodes, 200 VRFs, 1000 L2 segments, 50 routing tables ({} CPUs)",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    for scenario in [
        Scenario::Realistic,
        Scenario::WorstCase,
        Scenario::Misconfigured,
    ] {
        run(n_nodes, scenario);
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Scenario {
    Realistic,
    WorstCase,
    /// The realistic fleet with every segment in the default VRF on one gateway subnet, VLANs reused ten
    /// times and VNIs twice: validation must stay fast when it has a lot to say.
    Misconfigured,
}

fn run(n_nodes: usize, scenario: Scenario) {
    let name = match scenario {
        Scenario::Realistic => "realistic",
        Scenario::WorstCase => "worst-case",
        Scenario::Misconfigured => "misconfigured",
    };
    let t = Instant::now();
    let nodes = nodes(n_nodes);
    let mut inputs = inputs(n_nodes, scenario == Scenario::WorstCase);
    if scenario == Scenario::Misconfigured {
        for (j, l) in inputs.layer2s.iter_mut().enumerate() {
            l.spec.id = 100 + (j % 100) as u16;
            l.spec.vni = 1_000_000 + (j % 500) as u32;
            l.spec.vrf = None;
            l.spec.anycast_gateways = vec!["10.0.0.1/24".into()];
        }
    }
    let generate = t.elapsed();

    let t = Instant::now();
    let hash = inputs_hash(&inputs);
    let hashing = t.elapsed();

    let t = Instant::now();
    let validation = validate(&inputs, &nodes, &FleetParams::default());
    let validating = t.elapsed();

    let t = Instant::now();
    let rendered = render(&inputs, &nodes).expect("generated selectors are valid");
    let rendering = t.elapsed();

    let distinct: BTreeSet<&str> = rendered.values().map(|r| r.config_hash.as_str()).collect();
    // What the configurator pays when it writes NodeNetworkConfigs: materialize each config (here all).
    let t = Instant::now();
    let (mut vrfs, mut l2s, mut routes) = (0usize, 0usize, 0usize);
    for r in rendered.values() {
        let config = r.config();
        vrfs += config.vrfs.len();
        l2s += config.layer2s.len();
        routes += config.routes.len();
    }
    let materializing = t.elapsed();
    // What the configurator adds per render for the skew gate: the agent features each config needs.
    let t = Instant::now();
    let needing = (rendered.values())
        .filter(|r| !r.needs().is_empty())
        .count();
    let features = t.elapsed();
    let n = rendered.len().max(1);
    println!("\n[{name}] revision {}…", &hash[..12]);
    println!(
        "  per node on average: {} VRFs, {} L2 segments, {} routes; {} distinct configs",
        vrfs / n,
        l2s / n,
        routes / n,
        distinct.len()
    );
    println!(
        "  validation: {} errors, {} warnings",
        validation.errors.len(),
        validation.warnings.len()
    );
    for e in validation.errors.iter().take(3) {
        println!("    error: {e}");
    }
    println!("  generate inputs   {:>9}", ms(generate));
    println!("  inputs hash       {:>9}", ms(hashing));
    println!("  fleet validation  {:>9}", ms(validating));
    println!("  render + hashes   {:>9}", ms(rendering));
    println!(
        "  validate + render {:>9}  (target < 2000 ms)",
        ms(validating + rendering)
    );
    println!(
        "  materialize all {} configs, one at a time: {} ({:.1} µs per node)",
        rendered.len(),
        ms(materializing),
        materializing.as_secs_f64() * 1e6 / n as f64
    );
    println!(
        "  agent features needed, every config: {} ({:.1} µs per node, {:.2}× render + hashes; {needing} need one)",
        ms(features),
        features.as_secs_f64() * 1e6 / n as f64,
        features.as_secs_f64() / rendering.as_secs_f64().max(1e-9)
    );
    let (hwm, rss) = memory();
    println!("  peak memory (VmHWM) {hwm} MiB, now (VmRSS) {rss} MiB  (target < 1024 MiB)");
    drop(rendered);
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// VmHWM and VmRSS in MiB from /proc/self/status (0 where unavailable).
fn memory() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb / 1024)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

fn rack_of(node: usize) -> usize {
    node / RACK_SIZE
}

fn racks(n_nodes: usize) -> usize {
    n_nodes.div_ceil(RACK_SIZE)
}

fn nodes(n: usize) -> Vec<NodeInfo> {
    (0..n)
        .map(|i| {
            let rack = rack_of(i);
            let mut labels = BTreeMap::new();
            labels.insert("kubernetes.io/hostname".into(), format!("node-{i:05}"));
            labels.insert("kubernetes.io/os".into(), "linux".into());
            labels.insert("netwave.dev/rack".into(), format!("rack-{rack:03}"));
            labels.insert(
                "topology.kubernetes.io/zone".into(),
                ZONES[rack % ZONES.len()].into(),
            );
            // Whole racks belong to one pool; edge racks are the last ones of every 10.
            let pool = match rack % 10 {
                0..=5 => "compute",
                6 | 7 => "storage",
                8 => "gpu",
                _ => "edge",
            };
            labels.insert("netwave.dev/pool".into(), pool.into());
            labels.insert(
                "node.kubernetes.io/instance-type".into(),
                if i % 2 == 0 { "large" } else { "small" }.into(),
            );
            if pool == "edge" && i % 4 == 0 {
                labels.insert("netwave.dev/edge".into(), "true".into());
            }
            NodeInfo {
                name: format!("node-{i:05}"),
                labels,
            }
        })
        .collect()
}

fn req(key: &str, op: &str, values: &[String]) -> LabelSelectorRequirement {
    LabelSelectorRequirement {
        key: key.into(),
        operator: op.into(),
        values: (!values.is_empty()).then(|| values.to_vec()),
    }
}

fn selector(exprs: Vec<LabelSelectorRequirement>) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: None,
        match_expressions: Some(exprs),
    })
}

/// The requirements of VRF `i`'s selector (empty = every node).
fn vrf_requirements(i: usize, n_racks: usize) -> Vec<LabelSelectorRequirement> {
    match i {
        0..10 => vec![],
        10..60 => vec![req(
            "netwave.dev/pool",
            "In",
            &[POOLS[i % 4].to_string(), POOLS[(i + 1) % 4].to_string()],
        )],
        60..120 => vec![req(
            "topology.kubernetes.io/zone",
            "In",
            &[ZONES[i % 3].to_string()],
        )],
        120..180 => {
            let first = (i * 7) % n_racks.max(1);
            let racks: Vec<String> = (0..5)
                .map(|k| format!("rack-{:03}", (first + k) % n_racks.max(1)))
                .collect();
            vec![req("netwave.dev/rack", "In", &racks)]
        }
        _ => vec![req("netwave.dev/edge", "Exists", &[])],
    }
}

fn prefix(cidr: String, le: Option<u8>, action: PrefixAction) -> PrefixItem {
    PrefixItem {
        cidr,
        seq: None,
        ge: None,
        le,
        action,
    }
}

fn inputs(n_nodes: usize, worst_case: bool) -> RevisionInputs {
    let n_racks = racks(n_nodes);
    let vrfs = (0..200)
        .map(|i| {
            let exprs = vrf_requirements(i, n_racks);
            NamedVrf {
                name: format!("tenant-{i:03}"),
                spec: VRFRouteConfigurationSpec {
                    vrf: format!("t{i:03}"),
                    vni: Some(3_000_000 + i as u32),
                    route_target: Some(format!("65000:{}", 3000 + i)),
                    table_id: (i % 2 == 0).then_some(5000 + i as u32),
                    import: vec![
                        prefix(
                            format!("10.{}.0.0/16", 100 + i % 100),
                            Some(32),
                            PrefixAction::Permit,
                        ),
                        prefix(format!("fd10:{i:x}::/48"), Some(128), PrefixAction::Permit),
                        prefix("0.0.0.0/0".into(), None, PrefixAction::Deny),
                    ],
                    export: vec![
                        prefix(
                            format!("172.{}.0.0/16", 16 + i % 16),
                            Some(28),
                            PrefixAction::Permit,
                        ),
                        prefix("0.0.0.0/0".into(), None, PrefixAction::Deny),
                    ],
                    aggregate: vec![format!("10.{}.0.0/16", 100 + i % 100)],
                    seq: 10 + i as u32,
                    communities: vec![format!("65000:{i}"), "no-export".into()],
                    mtu: Some(9000),
                    node_selector: if exprs.is_empty() {
                        None
                    } else {
                        selector(exprs)
                    },
                    sbr_prefixes: vec![],
                    loopbacks: vec![],
                },
            }
        })
        .collect();
    let layer2s = (0..1000)
        .map(|j| {
            // Most segments live inside their VRF's footprint, some only on large instances; every tenth
            // is a rack-local segment in the default VRF.
            let (mut vrf, mut exprs) = if j % 10 == 9 {
                let rack = j % n_racks.max(1);
                (
                    None,
                    vec![req("netwave.dev/rack", "In", &[format!("rack-{rack:03}")])],
                )
            } else {
                let v = j % 200;
                let mut e = vrf_requirements(v, n_racks);
                if j % 3 == 0 {
                    e.push(req(
                        "node.kubernetes.io/instance-type",
                        "NotIn",
                        &["small".to_string()],
                    ));
                }
                (Some(format!("t{v:03}")), e)
            };
            if worst_case && j < 13 {
                // Segment j is on every node whose index has bit j clear: 13 such segments give every
                // one of up to 8,192 nodes its own set of objects, so nothing is shared.
                let excluded: Vec<String> = (0..n_nodes)
                    .filter(|n| n & (1 << j) != 0)
                    .map(|n| format!("node-{n:05}"))
                    .collect();
                vrf = None;
                exprs = vec![req("kubernetes.io/hostname", "NotIn", &excluded)];
            }
            NamedLayer2 {
                name: format!("segment-{j:04}"),
                spec: Layer2NetworkConfigurationSpec {
                    id: 100 + j as u16,
                    vni: 1_000_000 + j as u32,
                    mtu: 9000,
                    anycast_mac: Some(format!("02:00:5e:00:{:02x}:{:02x}", j / 256, j % 256)),
                    anycast_gateways: vec![
                        format!("10.{}.{}.1/24", j / 256, j % 256),
                        format!("fd00:{j:x}::1/64"),
                    ],
                    vrf,
                    neigh_suppression: Some(j % 2 == 0),
                    route_target: None,
                    node_selector: if exprs.is_empty() {
                        None
                    } else {
                        selector(exprs)
                    },
                },
            }
        })
        .collect();
    let routing_tables = (0..50)
        .map(|k| {
            let exprs = match k % 5 {
                0 => vec![],
                1 => vec![req("netwave.dev/pool", "In", &[POOLS[k % 4].to_string()])],
                2 => vec![req(
                    "topology.kubernetes.io/zone",
                    "NotIn",
                    &[ZONES[k % 3].to_string()],
                )],
                3 => vec![req("netwave.dev/edge", "Exists", &[])],
                _ => vec![req(
                    "netwave.dev/rack",
                    "In",
                    &(0..10)
                        .map(|r| format!("rack-{:03}", (k + r * 3) % n_racks.max(1)))
                        .collect::<Vec<_>>(),
                )],
            };
            NamedRoutingTable {
                name: format!("policy-{k:02}"),
                spec: RoutingTableSpec {
                    table_id: 100 + k as u32,
                    routes: (0..10)
                        .map(|r| Route {
                            prefix: format!("192.168.{r}.0/24"),
                            via: Some(format!("10.255.{k}.1")),
                            dev: None,
                            kind: if r == 9 {
                                RouteType::Blackhole
                            } else {
                                RouteType::Unicast
                            },
                            metric: Some(100),
                        })
                        .map(|mut r| {
                            if r.kind == RouteType::Blackhole {
                                r.via = None;
                            }
                            r
                        })
                        .collect(),
                    rules: vec![
                        Rule {
                            from: Some(format!("10.{k}.0.0/16")),
                            to: None,
                            iif: None,
                            fwmark: None,
                            fwmask: None,
                            priority: 1000 + 2 * k as u32,
                        },
                        Rule {
                            from: None,
                            to: Some(format!("192.168.{k}.0/24")),
                            iif: None,
                            fwmark: None,
                            fwmask: None,
                            priority: 1001 + 2 * k as u32,
                        },
                    ],
                    node_selector: if exprs.is_empty() {
                        None
                    } else {
                        selector(exprs)
                    },
                },
            }
        })
        .collect();
    RevisionInputs {
        bgp_peerings: Vec::new(),
        mirror_targets: Vec::new(),
        mirror_selectors: Vec::new(),
        underlays: Vec::new(),
        render_version: None,
        vrfs,
        layer2s,
        routing_tables,
    }
}
