//! `deploy/samples/` is what the demo and the tests roll out: it must parse, survive YAML → Rust → YAML
//! unchanged, pass semantic validation and pass the CRD schema the API server enforces.

use netwave_api::AnyInput;
use netwave_api::manifest::{Manifest, SAMPLES, parse_manifests, samples};
use netwave_api::validate::{validate_layer2, validate_routing_table, validate_vrf};
use serde_json::Value;

#[test]
fn samples_parse_into_the_types() {
    let all = samples().expect("samples parse");
    let count = |f: fn(&Manifest) -> bool| all.iter().filter(|m| f(m)).count();
    assert!(count(|m| matches!(m, Manifest::Input(AnyInput::Vrf(_)))) >= 3);
    assert!(count(|m| matches!(m, Manifest::Input(AnyInput::Layer2(_)))) >= 12);
    assert!(count(|m| matches!(m, Manifest::Input(AnyInput::RoutingTable(_)))) >= 1);
    let l2_with_gateways = all
        .iter()
        .filter(|m| matches!(m, Manifest::Input(AnyInput::Layer2(l2)) if !l2.spec.anycast_gateways.is_empty()))
        .count();
    assert!(l2_with_gateways >= 12);
    let with_selector = all
        .iter()
        .filter(|m| match m {
            Manifest::Input(AnyInput::Vrf(o)) => o.spec.node_selector.is_some(),
            Manifest::Input(AnyInput::Layer2(o)) => o.spec.node_selector.is_some(),
            Manifest::Input(AnyInput::RoutingTable(o)) => o.spec.node_selector.is_some(),
            _ => false,
        })
        .count();
    assert!(with_selector >= 3);
}

#[test]
fn samples_round_trip_yaml_rust_yaml() {
    for (file, yaml) in SAMPLES {
        let originals: Vec<Value> = serde_saphyr::from_multiple(yaml).unwrap();
        let typed = parse_manifests(file, yaml).unwrap();
        assert_eq!(originals.len(), typed.len(), "{file}");
        for (original, object) in originals.iter().zip(&typed) {
            // Rust → YAML text → back to a generic tree: nothing the admin wrote may change or vanish.
            let text = serde_saphyr::to_string(&object.to_value()).unwrap();
            let reread: Value = serde_saphyr::from_str(&text).unwrap();
            assert_subset(original, &reread, &format!("{file} {}", object.name()));
            // And the typed value survives the trip exactly.
            let again = parse_manifests(file, &text).unwrap();
            assert_eq!(again, vec![object.clone()], "{file} {}", object.name());
        }
    }
}

/// Every field of `want` is in `have` with an equal value (`have` may add defaults such as `import: []`).
fn assert_subset(want: &Value, have: &Value, at: &str) {
    match (want, have) {
        (Value::Object(w), Value::Object(h)) => {
            for (k, v) in w {
                let hv = h.get(k).unwrap_or_else(|| panic!("{at}: {k} vanished"));
                assert_subset(v, hv, &format!("{at}.{k}"));
            }
        }
        (Value::Array(w), Value::Array(h)) => {
            assert_eq!(w.len(), h.len(), "{at}");
            for (i, (wv, hv)) in w.iter().zip(h).enumerate() {
                assert_subset(wv, hv, &format!("{at}[{i}]"));
            }
        }
        (Value::Number(w), Value::Number(h)) => assert_eq!(w.as_f64(), h.as_f64(), "{at}"),
        _ => assert_eq!(want, have, "{at}"),
    }
}

#[test]
fn samples_pass_semantic_validation() {
    for m in samples().unwrap() {
        let problems = match &m {
            Manifest::Input(AnyInput::Vrf(o)) => validate_vrf(&o.spec),
            Manifest::Input(AnyInput::Layer2(o)) => validate_layer2(&o.spec),
            Manifest::Input(AnyInput::RoutingTable(o)) => validate_routing_table(&o.spec),
            _ => vec![],
        };
        assert!(problems.is_empty(), "{}: {problems:?}", m.name());
    }
}

#[test]
fn misspelt_field_is_an_error_naming_it() {
    let yaml = "apiVersion: netwave.dev/v1alpha1\nkind: Layer2NetworkConfiguration\nmetadata:\n  name: x\n\
                spec:\n  id: 10\n  vni: 10\n  mtu: 1500\n  ancastGateways: [10.0.0.1/24]\n";
    let err = parse_manifests("x.yaml", yaml).unwrap_err();
    assert_eq!(
        err.location,
        "x.yaml document 1 (Layer2NetworkConfiguration/x)"
    );
    assert_eq!(err.message, "unknown field spec.ancastGateways");
}

#[test]
fn wrong_api_version_and_unknown_kind_are_errors() {
    let yaml = "apiVersion: network.schiff.telekom.de/v1alpha1\nkind: VRFRouteConfiguration\n\
                metadata: {name: a}\nspec: {vrf: a, seq: 1}\n";
    let err = parse_manifests("a.yaml", yaml).unwrap_err();
    assert!(
        err.to_string()
            .contains("apiVersion is \"network.schiff.telekom.de/v1alpha1\""),
        "{err}"
    );
    let yaml = "apiVersion: netwave.dev/v1alpha1\nkind: Frobnicator\nmetadata: {name: a}\n";
    let err = parse_manifests("a.yaml", yaml).unwrap_err();
    assert!(
        err.to_string().contains("unknown kind \"Frobnicator\""),
        "{err}"
    );
}

/// Node labels decide which tenant networks a node gets, so the samples select nodes only by labels
/// under `node-restriction.kubernetes.io/`: the NodeRestriction admission plugin keeps a kubelet from
/// setting those on its own Node (most other labels it may set), and netwave's admission policy keeps
/// the agent from changing any label.
#[test]
fn the_samples_select_nodes_only_by_labels_a_node_cannot_set_on_itself() {
    let restricted = |key: &str| {
        key.split_once('/').is_some_and(|(prefix, _)| {
            prefix == "node-restriction.kubernetes.io"
                || prefix.ends_with(".node-restriction.kubernetes.io")
        })
    };
    let mut keys = Vec::new();
    for m in samples().unwrap() {
        let selector = match &m {
            Manifest::Input(AnyInput::Vrf(o)) => o.spec.node_selector.clone(),
            Manifest::Input(AnyInput::Layer2(o)) => o.spec.node_selector.clone(),
            Manifest::Input(AnyInput::RoutingTable(o)) => o.spec.node_selector.clone(),
            _ => None,
        };
        let Some(s) = selector else { continue };
        for k in s.match_labels.unwrap_or_default().into_keys() {
            keys.push((m.name().to_string(), k));
        }
        for e in s.match_expressions.unwrap_or_default() {
            keys.push((m.name().to_string(), e.key));
        }
    }
    assert!(keys.len() >= 3, "{keys:?}");
    let open: Vec<_> = keys.iter().filter(|(_, k)| !restricted(k)).collect();
    assert!(
        open.is_empty(),
        "selected by labels a node can set on itself: {open:?}"
    );
}
