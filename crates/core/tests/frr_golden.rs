//! Golden FRR texts: the samples in deploy/samples (one file per distinct node config) and
//! das-schiff-shaped manifests, rendered with the underlay fixtures in tests/golden/frr. A change in
//! the text fails with a diff; `UPDATE_GOLDEN=1 cargo test -p netwave-core --test frr_golden` rewrites
//! the files (review them, then `frr_accepts` proves real FRR takes them verbatim).

mod support_inputs;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use netwave_api::manifest::parse_manifests;
use netwave_api::{NodeConfig, RevisionInputs};
use netwave_core::frr::{FrrConfig, Underlay, render};
use netwave_core::render::NodeInfo;
use similar::TextDiff;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/frr")
}

fn underlay(file: &str) -> Underlay {
    let text = std::fs::read_to_string(golden_dir().join(file)).expect("underlay fixture");
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn das_schiff_inputs() -> RevisionInputs {
    fixture_inputs("das-schiff.yaml")
}

fn fixture_inputs(file: &str) -> RevisionInputs {
    let yaml = std::fs::read_to_string(golden_dir().join(file)).expect("fixture");
    let mut inputs = RevisionInputs::default();
    for m in parse_manifests(file, &yaml).expect("fixture parses") {
        if let Err(e) = inputs.add(m) {
            panic!("unexpected manifest: {e}")
        }
    }
    inputs
}

/// Distinct node configs of a render, each named after the first node (by name) that has it.
fn distinct_configs(
    prefix: &str,
    inputs: &RevisionInputs,
    nodes: &[NodeInfo],
) -> Vec<(String, NodeConfig)> {
    let rendered = netwave_core::render::render(inputs, nodes).expect("inputs render");
    let mut out: Vec<(String, NodeConfig)> = Vec::new();
    for (node, r) in &rendered {
        let config = r.config();
        if !out.iter().any(|(_, c)| c == &config) {
            out.push((format!("{prefix}-{node}"), config));
        }
    }
    out
}

/// Every golden case: (file stem, node config, underlay).
fn cases() -> Vec<(String, NodeConfig, Underlay)> {
    let mut out = Vec::new();
    let samples = distinct_configs(
        "samples",
        &support_inputs::sample_inputs(),
        &support_inputs::sample_nodes(),
    );
    for (name, config) in samples {
        out.push((name, config, underlay("underlay-ibgp.yaml")));
    }
    let das = distinct_configs(
        "das-schiff",
        &das_schiff_inputs(),
        &[support_inputs::node("worker-0", &[])],
    );
    for (name, config) in das {
        out.push((name, config, underlay("underlay-unnumbered.yaml")));
    }
    // Their BGP-as-a-service peering on every node, and the loopback one only on selected nodes.
    let bgpaas = distinct_configs(
        "das-schiff-bgpaas",
        &fixture_inputs("das-schiff-bgpaas.yaml"),
        &[
            support_inputs::node("worker-0", &[]),
            support_inputs::node(
                "worker-1",
                &[("node-restriction.kubernetes.io/netwave-bgpaas", "true")],
            ),
        ],
    );
    for (name, config) in bgpaas {
        out.push((name, config, underlay("underlay-ibgp.yaml")));
    }
    out
}

fn rendered(config: &NodeConfig, underlay: &Underlay) -> FrrConfig {
    render(config, underlay).unwrap_or_else(|e| panic!("render: {e}"))
}

#[test]
fn goldens_match_the_rendered_text() {
    let update = std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1");
    let mut failures = Vec::new();
    let mut expected_files = Vec::new();
    for (name, config, underlay) in cases() {
        let file = format!("{name}.conf");
        let path = golden_dir().join(&file);
        let text = rendered(&config, &underlay).to_text();
        expected_files.push(file.clone());
        if update {
            std::fs::write(&path, &text).expect("write golden");
            continue;
        }
        let golden = std::fs::read_to_string(&path).unwrap_or_default();
        if golden != text {
            let diff = TextDiff::from_lines(&golden, &text)
                .unified_diff()
                .header(&format!("{file} (golden)"), "rendered")
                .to_string();
            failures.push(diff);
        }
    }
    // A golden without a case would still be "accepted by FRR" while testing nothing we render.
    for entry in std::fs::read_dir(golden_dir()).expect("golden dir") {
        let file = entry
            .expect("dir entry")
            .file_name()
            .into_string()
            .expect("utf-8");
        if file.ends_with(".conf") && !expected_files.contains(&file) {
            if update {
                std::fs::remove_file(golden_dir().join(&file)).expect("remove stale golden");
            } else {
                failures.push(format!("{file}: no test case renders it (stale golden)"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "FRR goldens differ (UPDATE_GOLDEN=1 rewrites them):\n{}",
        failures.join("\n")
    );
}

#[test]
fn the_samples_give_several_distinct_configs_and_das_schiff_one() {
    let names: Vec<String> = cases().into_iter().map(|(n, _, _)| n).collect();
    let samples = names.iter().filter(|n| n.starts_with("samples-")).count();
    // compute, storage, edge and an unlabelled node select different objects.
    assert_eq!(samples, 4, "{names:?}");
    assert!(names.contains(&"das-schiff-worker-0".to_string()));
}

#[test]
fn rendering_ignores_input_order() {
    for (name, config, underlay) in cases() {
        let mut shuffled = config.clone();
        shuffled.vrfs.reverse();
        shuffled.layer2s.reverse();
        for v in &mut shuffled.vrfs {
            v.import.reverse();
            v.export.reverse();
            v.aggregate.reverse();
            v.communities.reverse();
        }
        assert_eq!(
            rendered(&config, &underlay).to_text(),
            rendered(&shuffled, &underlay).to_text(),
            "{name}"
        );
    }
}

#[test]
fn every_vrf_field_with_bgp_meaning_reaches_the_text() {
    // A field that renders nothing would be accepted and ignored: each must change the text.
    let (_, config, underlay) = cases()
        .into_iter()
        .find(|(n, _, _)| n == "das-schiff-worker-0")
        .expect("das-schiff case");
    let base = rendered(&config, &underlay).to_text();
    type Edit = fn(&mut netwave_api::VrfConfig);
    let edits: BTreeMap<&str, Edit> = BTreeMap::from([
        ("vni", (|v| v.vni = v.vni.map(|n| n + 100)) as Edit),
        ("routeTarget", |v| {
            v.route_target = Some("65188:9999".into())
        }),
        ("import", |v| v.import.truncate(1)),
        ("export", |v| v.export.truncate(1)),
        ("aggregate", |v| v.aggregate.truncate(1)),
        ("communities", |v| v.communities = vec!["65188:4242".into()]),
        ("sbrPrefixes", |v| {
            v.sbr = Some(netwave_api::SbrConfig {
                device: "s-egress".into(),
                table: 4242,
                priority: 100,
                prefixes: vec!["10.251.30.0/24".into()],
            })
        }),
    ]);
    for (field, edit) in edits {
        let mut changed = config.clone();
        let vrf = changed
            .vrfs
            .iter_mut()
            .find(|v| v.name == "egress")
            .expect("egress VRF");
        edit(vrf);
        assert_ne!(
            rendered(&changed, &underlay).to_text(),
            base,
            "changing {field} left the FRR text unchanged"
        );
    }
}

#[test]
fn a_layer2_route_target_reaches_the_text_unless_it_is_frrs_automatic_one() {
    let (_, config, underlay) = cases()
        .into_iter()
        .find(|(n, _, _)| n == "das-schiff-worker-0")
        .expect("das-schiff case");
    let base = rendered(&config, &underlay).to_text();
    let mut changed = config.clone();
    let seg = changed
        .layer2s
        .iter_mut()
        .find(|l| l.vlan == 502)
        .expect("vlan502");
    seg.route_target = Some("65188:502".into());
    let text = rendered(&changed, &underlay).to_text();
    assert!(
        text.contains("  vni 4000003\n   route-target import 65188:502\n   route-target export 65188:502\n  exit-vni\n"),
        "{text}"
    );
    // ASN 4200065169 mod 65536 = 59537: FRR's own route target for the VNI renders nothing.
    let seg = changed
        .layer2s
        .iter_mut()
        .find(|l| l.vlan == 502)
        .expect("vlan502");
    seg.route_target = Some("59537:4000003".into());
    assert_eq!(rendered(&changed, &underlay).to_text(), base);
}

#[test]
fn the_hostname_is_the_only_difference_with_the_kernel_name() {
    for (name, config, underlay) in cases() {
        let plain = rendered(&config, &underlay).to_text();
        let named = rendered(&config, &underlay.clone().with_hostname("node-7")).to_text();
        assert_eq!(
            named,
            plain.replacen(
                "frr defaults datacenter\n",
                "frr defaults datacenter\nhostname node-7\n",
                1
            ),
            "{name}"
        );
    }
}
