//! Render: snapshots of deploy/samples on labelled nodes, naming and table-allocation rules, and
//! determinism properties.

mod support_inputs;
mod support_props;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use netwave_api::{NodeConfig, RevisionInputs};
use netwave_core::render::{
    RenderedNode, TABLE_ALLOC_BASE, TABLE_ALLOC_SIZE, config_hash, render, vrf_tables,
};
use proptest::prelude::*;
use support_inputs::*;

/// One line per kernel object: what an admin checks on a node.
fn summary(config: &NodeConfig) -> String {
    let mut s = String::new();
    for v in &config.vrfs {
        writeln!(
            s,
            "vrf {} dev={} table={} vni={:?} mtu={} bridge={:?} vxlan={:?}",
            v.name, v.device, v.table, v.vni, v.mtu, v.bridge, v.vxlan
        )
        .unwrap();
    }
    for l in &config.layer2s {
        writeln!(
            s,
            "l2 vlan={} vni={} mtu={} bridge={} vxlan={} vrf={:?} mac={:?} gw={} ns={}",
            l.vlan,
            l.vni,
            l.mtu,
            l.bridge,
            l.vxlan,
            l.vrf,
            l.anycast_mac,
            l.anycast_gateways.join(","),
            l.neigh_suppression
        )
        .unwrap();
    }
    for r in &config.routes {
        writeln!(
            s,
            "route table={} {} via={:?} dev={:?} {:?} metric={:?}",
            r.table, r.prefix, r.via, r.dev, r.kind, r.metric
        )
        .unwrap();
    }
    for r in &config.rules {
        writeln!(
            s,
            "rule prio={} table={} from={:?} to={:?} iif={:?}",
            r.priority, r.table, r.from, r.to, r.iif
        )
        .unwrap();
    }
    s
}

fn rendered_samples() -> BTreeMap<String, RenderedNode> {
    render(&sample_inputs(), &sample_nodes()).expect("samples render")
}

const OOB: &str = "\
route table=100 10.200.0.0/16 via=Some(\"10.250.11.254\") dev=None Unicast metric=None
route table=100 10.201.0.0/16 via=None dev=Some(\"l2.111\") Unicast metric=Some(100)
route table=100 192.0.2.0/24 via=None dev=None Blackhole metric=None
route table=100 fd00:200::/48 via=Some(\"fd00:250:b::fe\") dev=None Unicast metric=None
route table=100 fd00:dead::/48 via=None dev=None Unreachable metric=None
";

#[test]
fn samples_on_plain_node_get_default_vrf_segments_and_oob_table() {
    // A node without a pool label gets no VRF: only the default-VRF segments and the oob table.
    let out = rendered_samples();
    let want = format!(
        "\
l2 vlan=103 vni=1000103 mtu=9000 bridge=l2.103 vxlan=vx.103 vrf=None mac=Some(\"02:00:5e:00:01:04\") gw=10.250.3.1/24,fd00:250:3::1/64 ns=false
l2 vlan=111 vni=1000111 mtu=1500 bridge=l2.111 vxlan=vx.111 vrf=None mac=Some(\"02:00:5e:00:01:0c\") gw=10.250.11.1/24,fd00:250:b::1/64 ns=false
{OOB}rule prio=1000 table=100 from=Some(\"10.250.11.0/24\") to=None iif=None
rule prio=1001 table=100 from=None to=Some(\"10.200.0.0/16\") iif=None
rule prio=1002 table=100 from=Some(\"fd00:250:b::/64\") to=None iif=None
"
    );
    assert_eq!(summary(&out["plain-0"].config()), want);
}

#[test]
fn samples_on_compute_node_get_cluster_vrf_and_its_segments() {
    let out = rendered_samples();
    let s = summary(&out["compute-0"].config());
    let want_head = "\
vrf cluster dev=cluster table=17451566 vni=Some(2001000) mtu=9000 bridge=Some(\"br.cluster\") vxlan=Some(\"vx.cluster\")
vrf storage dev=storage table=2002 vni=Some(2002000) mtu=9000 bridge=Some(\"br.storage\") vxlan=Some(\"vx.storage\")
l2 vlan=100 vni=1000100 mtu=9000 bridge=l2.100 vxlan=vx.100 vrf=Some(\"cluster\") mac=Some(\"02:00:5e:00:01:01\") gw=10.250.0.1/24,fd00:250::1/64 ns=false
l2 vlan=101 vni=1000101 mtu=9000 bridge=l2.101 vxlan=vx.101 vrf=Some(\"cluster\") mac=Some(\"02:00:5e:00:01:02\") gw=10.250.1.1/24,fd00:250:1::1/64 ns=false
l2 vlan=102 vni=1000102 mtu=9000 bridge=l2.102 vxlan=vx.102 vrf=Some(\"cluster\") mac=Some(\"02:00:5e:00:01:03\") gw=10.250.2.1/24,fd00:250:2::1/64 ns=false
l2 vlan=103 vni=1000103 mtu=9000 bridge=l2.103 vxlan=vx.103 vrf=None mac=Some(\"02:00:5e:00:01:04\") gw=10.250.3.1/24,fd00:250:3::1/64 ns=false
l2 vlan=104 vni=1000104 mtu=9000 bridge=l2.104 vxlan=vx.104 vrf=Some(\"cluster\") mac=Some(\"02:00:5e:00:01:05\") gw=10.250.4.1/24,fd00:250:4::1/64 ns=false
";
    assert!(s.starts_with(want_head), "{s}");
}

#[test]
fn samples_on_storage_node_add_storage_and_backup_vrfs_and_their_segments() {
    let out = rendered_samples();
    let s = summary(&out["storage-0"].config());
    let vrfs: Vec<&str> = s.lines().filter(|l| l.starts_with("vrf ")).collect();
    assert_eq!(
        vrfs,
        [
            "vrf backup dev=backup table=10850680 vni=Some(2004000) mtu=9000 bridge=Some(\"br.backup\") vxlan=Some(\"vx.backup\")",
            "vrf cluster dev=cluster table=17451566 vni=Some(2001000) mtu=9000 bridge=Some(\"br.cluster\") vxlan=Some(\"vx.cluster\")",
            "vrf storage dev=storage table=2002 vni=Some(2002000) mtu=9000 bridge=Some(\"br.storage\") vxlan=Some(\"vx.storage\")",
        ]
    );
    let l2: Vec<String> = s
        .lines()
        .filter(|l| l.starts_with("l2 "))
        .map(|l| l.split(" mac=").next().unwrap().to_string())
        .collect();
    assert_eq!(
        l2,
        [
            "l2 vlan=100 vni=1000100 mtu=9000 bridge=l2.100 vxlan=vx.100 vrf=Some(\"cluster\")",
            "l2 vlan=101 vni=1000101 mtu=9000 bridge=l2.101 vxlan=vx.101 vrf=Some(\"cluster\")",
            "l2 vlan=102 vni=1000102 mtu=9000 bridge=l2.102 vxlan=vx.102 vrf=Some(\"cluster\")",
            "l2 vlan=103 vni=1000103 mtu=9000 bridge=l2.103 vxlan=vx.103 vrf=None",
            "l2 vlan=104 vni=1000104 mtu=9000 bridge=l2.104 vxlan=vx.104 vrf=Some(\"cluster\")",
            "l2 vlan=105 vni=1000105 mtu=9000 bridge=l2.105 vxlan=vx.105 vrf=Some(\"storage\")",
            "l2 vlan=106 vni=1000106 mtu=9000 bridge=l2.106 vxlan=vx.106 vrf=Some(\"storage\")",
            "l2 vlan=107 vni=1000107 mtu=9000 bridge=l2.107 vxlan=vx.107 vrf=Some(\"storage\")",
            "l2 vlan=110 vni=1000110 mtu=9000 bridge=l2.110 vxlan=vx.110 vrf=Some(\"backup\")",
            "l2 vlan=111 vni=1000111 mtu=1500 bridge=l2.111 vxlan=vx.111 vrf=None",
        ]
    );
    assert!(s.contains("ns=true"), "ceph segments suppress neighbours");
    // No edge routing table on a storage node.
    assert!(!s.contains("route table=200 "));
}

#[test]
fn samples_on_compute_node_get_storage_but_not_backup() {
    let out = rendered_samples();
    let c = &out["compute-0"].config();
    let vrfs: Vec<&str> = c.vrfs.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(vrfs, ["cluster", "storage"]);
    let vlans: Vec<u16> = c.layer2s.iter().map(|l| l.vlan).collect();
    assert_eq!(vlans, [100, 101, 102, 103, 104, 105, 106, 107, 111]);
}

#[test]
fn samples_on_edge_node_get_internet_vrf_and_edge_uplink_table() {
    let out = rendered_samples();
    let s = summary(&out["edge-0"].config());
    // Not in a pool: no cluster VRF.
    let want_vrfs = [
        "vrf internet dev=internet table=13759510 vni=Some(2003000) mtu=1500 bridge=Some(\"br.internet\") vxlan=Some(\"vx.internet\")",
    ];
    assert_eq!(
        s.lines()
            .filter(|l| l.starts_with("vrf "))
            .collect::<Vec<_>>(),
        want_vrfs
    );
    let vlans: Vec<u16> = out["edge-0"]
        .config()
        .layer2s
        .iter()
        .map(|l| l.vlan)
        .collect();
    assert_eq!(vlans, [103, 108, 109, 111]);
    let routes: String = s
        .lines()
        .filter(|l| l.starts_with("route "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        routes,
        format!(
            "{OOB}route table=200 0.0.0.0/0 via=Some(\"203.0.113.1\") dev=None Unicast metric=Some(10)
route table=200 0.0.0.0/0 via=Some(\"203.0.113.2\") dev=None Unicast metric=Some(20)
"
        )
    );
    let rules: Vec<u32> = out["edge-0"]
        .config()
        .rules
        .iter()
        .map(|r| r.priority)
        .collect();
    assert_eq!(rules, [1000, 1001, 1002, 2000]);
}

#[test]
fn prefix_lists_get_effective_sequence_numbers_in_evaluation_order() {
    let out = rendered_samples();
    let cluster = &out["compute-0"].config().vrfs[0];
    let import: Vec<(u32, &str)> = cluster
        .import
        .iter()
        .map(|i| (i.seq.unwrap(), i.cidr.as_str()))
        .collect();
    // 10.102.255.0/24 (seq 5) before 10.102.0.0/16 (seq 10); fd00:102::/48 takes its position, 3.
    assert_eq!(
        import,
        [
            (3, "fd00:102::/48"),
            (5, "10.102.255.0/24"),
            (10, "10.102.0.0/16")
        ]
    );
}

#[test]
fn every_node_is_rendered_even_when_nothing_selects_it() {
    let mut inputs = sample_inputs();
    for v in &mut inputs.vrfs {
        v.spec.node_selector = match_labels(&[("role", "net")]);
    }
    for l in &mut inputs.layer2s {
        l.spec.node_selector = match_labels(&[("role", "net")]);
    }
    for r in &mut inputs.routing_tables {
        r.spec.node_selector = match_labels(&[("role", "net")]);
    }
    let out = render(&inputs, &[node("idle", &[])]).unwrap();
    assert_eq!(out["idle"].config(), NodeConfig::default());
    assert_eq!(out["idle"].config_hash, config_hash(&NodeConfig::default()));
}

#[test]
fn nodes_with_the_same_objects_share_one_config() {
    let nodes = vec![
        node(
            "a",
            &[
                ("node-restriction.kubernetes.io/netwave-pool", "storage"),
                ("rack", "1"),
            ],
        ),
        node(
            "b",
            &[
                ("node-restriction.kubernetes.io/netwave-pool", "storage"),
                ("rack", "2"),
            ],
        ),
    ];
    let out = render(&sample_inputs(), &nodes).unwrap();
    assert_eq!(out["a"].config_hash, out["b"].config_hash);
    assert_eq!(out["a"].config(), out["b"].config());
}

#[test]
fn config_hash_is_sha256_of_the_json() {
    let out = rendered_samples();
    let r = &out["edge-0"];
    use sha2::Digest;
    let want = hex::encode(sha2::Sha256::digest(
        serde_json::to_vec(&r.config()).unwrap(),
    ));
    assert_eq!(r.config_hash, want);
    assert_eq!(config_hash(&r.config()), want);
    // And it survives the trip through the API server and the agent's backup file.
    let back: NodeConfig =
        serde_json::from_str(&serde_json::to_string(&r.config()).unwrap()).unwrap();
    assert_eq!(config_hash(&back), want);
}

#[test]
fn invalid_selector_is_a_render_error_naming_object_and_field() {
    let mut inputs = sample_inputs();
    inputs.layer2s[0].spec.node_selector = match_expressions(vec![expr("pool", "In", &[])]);
    let name = inputs.layer2s[0].name.clone();
    let err = render(&inputs, &sample_nodes()).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "Layer2NetworkConfiguration/{name} spec.nodeSelector.matchExpressions[0].values: values \
             must be non-empty for operator In"
        )
    );
}

#[test]
fn vrf_with_tableid_keeps_it_and_others_are_allocated_in_range() {
    let tables = vrf_tables(&sample_inputs());
    assert_eq!(tables["storage"], 2002);
    for name in ["cluster", "internet", "backup"] {
        let t = tables[name];
        assert!(
            (TABLE_ALLOC_BASE..TABLE_ALLOC_BASE + TABLE_ALLOC_SIZE).contains(&t),
            "{name}: {t}"
        );
    }
}

#[test]
fn allocated_table_is_stable_when_other_vrfs_come_and_go() {
    let base = inputs(
        vec![vrf("blue", None), vrf("green", None), vrf("red", None)],
        vec![],
        vec![],
    );
    let before = vrf_tables(&base);
    let mut more = base.clone();
    for i in 0..200 {
        more.vrfs.push(vrf(&format!("tenant-{i}"), Some(5000 + i)));
    }
    more.vrfs.remove(1); // green goes away
    let after = vrf_tables(&more);
    assert_eq!(after["blue"], before["blue"]);
    assert_eq!(after["red"], before["red"]);
}

#[test]
fn allocated_table_moves_off_an_explicit_table_id() {
    let base = inputs(vec![vrf("blue", None)], vec![], vec![]);
    let home = vrf_tables(&base)["blue"];
    // A RoutingTable (or another VRF) claims blue's home slot explicitly: blue moves to the next id.
    let taken = inputs(vec![vrf("blue", None)], vec![], vec![rt("claims", home)]);
    let moved = vrf_tables(&taken)["blue"];
    assert_eq!(
        moved,
        TABLE_ALLOC_BASE + (home - TABLE_ALLOC_BASE + 1) % TABLE_ALLOC_SIZE
    );
}

#[test]
fn contested_home_slot_goes_to_the_first_vrf_name_whatever_the_input_order() {
    // Two objects for the same VRF name share a home slot (a validation error, but render stays
    // deterministic): the first object name keeps it.
    let a = vrf("same", None);
    let mut b = vrf("same", None);
    b.name = "same-2".into();
    let t1 = vrf_tables(&inputs(vec![a.clone(), b.clone()], vec![], vec![]));
    let t2 = vrf_tables(&inputs(vec![b, a], vec![], vec![]));
    assert_eq!(t1, t2);
    assert_eq!(t1["same-2"], t1["same"] + 1);
}

#[test]
fn vrf_without_vni_has_no_l3_vni_devices() {
    let out = render(
        &inputs(vec![vrf("mgmt", None)], vec![], vec![]),
        &[node("n", &[])],
    )
    .unwrap();
    let v = &out["n"].config().vrfs[0];
    assert_eq!(
        (v.bridge.as_deref(), v.vxlan.as_deref(), v.mtu),
        (None, None, 9000)
    );
}

#[test]
fn addresses_and_macs_are_canonical() {
    let mut seg = with_gateways(l2("seg", 300, 300), &["fd00:0:0::1/64", "10.0.0.1/24"]);
    seg.spec.anycast_mac = Some("02:AB:CD:00:00:01".into());
    let mut table = rt("t", 300);
    table.spec.routes = vec![route("fd00:0::/48", Some("fd00:0:0::fe"), None)];
    let out = render(&inputs(vec![], vec![seg], vec![table]), &[node("n", &[])]).unwrap();
    let c = &out["n"].config();
    assert_eq!(c.layer2s[0].anycast_gateways, ["10.0.0.1/24", "fd00::1/64"]);
    assert_eq!(
        c.layer2s[0].anycast_mac.as_deref(),
        Some("02:ab:cd:00:00:01")
    );
    assert_eq!(c.routes[0].prefix, "fd00::/48");
    assert_eq!(c.routes[0].via.as_deref(), Some("fd00::fe"));
}

#[test]
fn identical_routes_from_two_tables_merge() {
    let mut a = rt("a", 300);
    a.spec.routes = vec![route("10.9.0.0/16", Some("10.0.0.1"), None)];
    let mut b = rt("b", 300);
    b.spec.routes = a.spec.routes.clone();
    let out = render(&inputs(vec![], vec![], vec![a, b]), &[node("n", &[])]).unwrap();
    assert_eq!(out["n"].config().routes.len(), 1);
}

#[test]
fn a_full_mark_mask_is_no_mask_so_one_kernel_rule_has_one_hash() {
    let marked = |mark, mask, priority| netwave_api::Rule {
        fwmark: Some(mark),
        fwmask: mask,
        ..rule("10.0.0.0/8", priority)
    };
    let table = |rules| {
        let mut t = rt("t", 300);
        t.spec.rules = rules;
        render(&inputs(vec![], vec![], vec![t]), &[node("n", &[])]).unwrap()["n"].clone()
    };
    let written = table(vec![marked(0x10, None, 1000), marked(0, Some(0xff), 1001)]);
    let full = table(vec![
        marked(0x10, Some(u32::MAX), 1000),
        marked(0, Some(0xff), 1001),
    ]);
    let marks: Vec<_> = (full.config().rules.iter())
        .map(|r| (r.fwmark, r.fwmask))
        .collect();
    assert_eq!(marks, [(Some(0x10), None), (Some(0), Some(0xff))]);
    assert_eq!(full.config_hash, written.config_hash);
    // A zero mark keeps its full mask: without one the kernel would not compare the mark at all.
    let zero = table(vec![marked(0, Some(u32::MAX), 1000)]);
    assert_eq!(zero.config().rules[0].fwmask, Some(u32::MAX));
    // A rule without a mark is written as before (so its configHash is too).
    let plain = table(vec![rule("10.0.0.0/8", 1000)]);
    let json = serde_json::to_string(&plain.config()).unwrap();
    assert!(
        !json.contains("fwmark") && !json.contains("fwmask"),
        "{json}"
    );
}

/// The skew gate (#46) asks every rendered node which agent features its config needs; the renderer
/// answers from its parts without building the config. Only the nodes a marked rule reaches need
/// `ruleFwmark`, and the answer is the one the built config gives.
#[test]
fn a_node_needs_the_features_of_the_parts_it_gets_and_no_others() {
    use netwave_api::features::{FEATURES, FeatureSet};
    let mut marked = rt("marked", 300);
    marked.spec.rules = vec![netwave_api::Rule {
        fwmark: Some(0x10),
        ..rule("10.0.0.0/8", 1000)
    }];
    marked.spec.node_selector = match_labels(&[("pool", "edge")]);
    let mut plain = rt("plain", 301);
    plain.spec.rules = vec![rule("10.1.0.0/16", 1001)];
    let mut with = sample_inputs();
    with.routing_tables.extend([marked, plain]);
    let nodes = [
        node("edge-0", &[("pool", "edge")]),
        node("compute-0", &[("pool", "compute")]),
    ];
    let out = render(&with, &nodes).unwrap();
    let needs: BTreeMap<&str, Vec<String>> = (out.iter())
        .map(|(n, r)| (n.as_str(), r.needs().names()))
        .collect();
    assert_eq!(needs["edge-0"], ["ruleFwmark"]);
    assert!(needs["compute-0"].is_empty(), "{needs:?}");
    for (n, r) in &out {
        assert_eq!(r.needs(), FeatureSet::needed_by(&r.config()), "{n}");
    }
    // Every field a feature covers lies in a list the renderer asks about.
    for f in FEATURES {
        for p in f.fields {
            assert!(
                (netwave_core::render::FEATURE_LISTS.iter())
                    .any(|l| p.strip_prefix(l).is_some_and(|r| r.starts_with("[].")))
                    || netwave_core::render::FEATURE_OBJECTS.contains(p),
                "feature {}: {p} is in no list of render::FEATURE_LISTS nor in render::FEATURE_OBJECTS; RenderedNode::needs \
                 would miss it",
                f.name
            );
        }
    }
}

// ---- properties ----

proptest! {
    #![proptest_config(support_props::config(64, "proptest-regressions/render.txt"))]

    #[test]
    fn render_is_independent_of_input_and_node_order((inputs, nodes) in arb_fleet(), seed in any::<u64>()) {
        let a = render(&inputs, &nodes).unwrap();
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
        let b = render(&shuffled_inputs, &shuffled(&nodes, seed ^ 3)).unwrap();
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(a.len(), nodes.len());
        for r in a.values() {
            prop_assert_eq!(&r.config_hash, &config_hash(&r.config()));
        }
    }

    #[test]
    fn equal_configs_have_equal_hashes_and_different_ones_differ((inputs, nodes) in arb_fleet()) {
        let out = render(&inputs, &nodes).unwrap();
        let rs: Vec<&RenderedNode> = out.values().collect();
        for x in &rs {
            for y in &rs {
                prop_assert_eq!(x.config() == y.config(), x.config_hash == y.config_hash);
            }
        }
    }
}
