//! The structural rules live in the CRD schema, enforced by the API server on every write. These tests run
//! the generated `openAPIV3Schema` through a JSON Schema validator: the samples pass, and each bad value is
//! rejected at the field path an admin would have to fix.

use netwave_api::manifest::{Manifest, samples};
use serde_json::{Value, json};

fn schema_of(kind: &str) -> jsonschema::Validator {
    let crd = netwave_api::crds()
        .into_iter()
        .map(|(_, crd)| crd)
        .find(|crd| crd.spec.names.kind == kind)
        .unwrap_or_else(|| panic!("no CRD for {kind}"));
    let schema = serde_json::to_value(
        &crd.spec.versions[0]
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema,
    )
    .unwrap();
    jsonschema::validator_for(&schema).expect("the CRD schema is a valid JSON schema")
}

/// JSON-pointer paths of every schema violation in `object`.
fn violations(kind: &str, object: &Value) -> Vec<String> {
    schema_of(kind)
        .iter_errors(object)
        .map(|e| e.instance_path().to_string())
        .collect()
}

fn sample(kind: &str) -> Value {
    samples()
        .unwrap()
        .iter()
        .find(|m| matches!(m, Manifest::Input(o) if o.kind().as_str() == kind))
        .unwrap()
        .to_value()
}

/// `sample(kind)` with `value` at `pointer`; returns the violations.
fn with(kind: &str, pointer: &str, value: Value) -> Vec<String> {
    let mut object = sample(kind);
    *object
        .pointer_mut(pointer)
        .unwrap_or_else(|| panic!("{pointer} not in the sample")) = value;
    violations(kind, &object)
}

#[test]
fn every_sample_passes_its_crd_schema() {
    for m in samples().unwrap() {
        let kind = m.to_value()["kind"].as_str().unwrap().to_string();
        assert_eq!(
            violations(&kind, &m.to_value()),
            Vec::<String>::new(),
            "{}",
            m.name()
        );
    }
}

#[test]
fn vlan_is_1_to_4094() {
    let l2 = "Layer2NetworkConfiguration";
    assert_eq!(with(l2, "/spec/id", json!(0)), ["/spec/id"]);
    assert_eq!(with(l2, "/spec/id", json!(4095)), ["/spec/id"]);
    assert!(with(l2, "/spec/id", json!(1)).is_empty());
    assert!(with(l2, "/spec/id", json!(4094)).is_empty());
}

#[test]
fn vni_is_1_to_16777215() {
    let l2 = "Layer2NetworkConfiguration";
    assert_eq!(with(l2, "/spec/vni", json!(0)), ["/spec/vni"]);
    assert_eq!(with(l2, "/spec/vni", json!(16777216)), ["/spec/vni"]);
    assert!(with(l2, "/spec/vni", json!(16777215)).is_empty());
    assert_eq!(
        with("VRFRouteConfiguration", "/spec/vni", json!(16777216)),
        ["/spec/vni"]
    );
}

#[test]
fn mtu_is_1000_to_9000() {
    let l2 = "Layer2NetworkConfiguration";
    assert_eq!(with(l2, "/spec/mtu", json!(999)), ["/spec/mtu"]);
    assert_eq!(with(l2, "/spec/mtu", json!(9001)), ["/spec/mtu"]);
    assert!(with(l2, "/spec/mtu", json!(1000)).is_empty());
    assert_eq!(
        with("VRFRouteConfiguration", "/spec/mtu", json!(9216)),
        ["/spec/mtu"]
    );
}

#[test]
fn vrf_name_is_1_to_15_safe_characters() {
    let vrf = "VRFRouteConfiguration";
    assert!(with(vrf, "/spec/vrf", json!("a.b_c-D9")).is_empty());
    assert!(with(vrf, "/spec/vrf", json!("exactly15chars_")).is_empty());
    // Too long: both maxLength and pattern reject it.
    assert!(
        with(vrf, "/spec/vrf", json!("sixteen_chars_xx"))
            .iter()
            .all(|p| p == "/spec/vrf")
    );
    assert!(!with(vrf, "/spec/vrf", json!("sixteen_chars_xx")).is_empty());
    assert!(!with(vrf, "/spec/vrf", json!("")).is_empty());
    assert_eq!(with(vrf, "/spec/vrf", json!("vrf/blue")), ["/spec/vrf"]);
    assert_eq!(with(vrf, "/spec/vrf", json!("vrf blue")), ["/spec/vrf"]);
    assert_eq!(
        with(
            "Layer2NetworkConfiguration",
            "/spec/vrf",
            json!("no spaces")
        ),
        ["/spec/vrf"]
    );
}

#[test]
fn mac_has_six_hex_octets() {
    let l2 = "Layer2NetworkConfiguration";
    assert!(with(l2, "/spec/anycastMac", json!("02:AB:cd:00:01:ff")).is_empty());
    for bad in [
        "02:00:5e:00:01",
        "02-00-5e-00-01-01",
        "02:00:5e:00:01:0g",
        "0200.5e00.0101",
    ] {
        assert_eq!(
            with(l2, "/spec/anycastMac", json!(bad)),
            ["/spec/anycastMac"],
            "{bad}"
        );
    }
}

#[test]
fn prefix_action_is_permit_or_deny() {
    let vrf = "VRFRouteConfiguration";
    assert!(with(vrf, "/spec/import/0/action", json!("deny")).is_empty());
    assert_eq!(
        with(vrf, "/spec/import/0/action", json!("allow")),
        ["/spec/import/0/action"]
    );
    assert_eq!(
        with(vrf, "/spec/import/0/action", json!("Permit")),
        ["/spec/import/0/action"]
    );
}

#[test]
fn max_unavailable_is_an_int_or_a_percentage() {
    let ncr = "NetworkConfigRevision";
    let revision = |max: Value| {
        json!({
            "apiVersion": "netwave.dev/v1alpha1",
            "kind": "NetworkConfigRevision",
            "metadata": {"name": "rev-1"},
            "spec": {"hash": "ab", "sequence": 1, "inputs": {}, "rollout": {"maxUnavailable": max}},
        })
    };
    for good in [json!(2), json!("10%"), json!("100%"), json!("1%")] {
        assert!(
            violations(ncr, &revision(good.clone())).is_empty(),
            "{good}"
        );
    }
    // What the API server refuses is what `CountOrPercent` refuses: one rule.
    for bad in [
        json!("ten"),
        json!("10"),
        json!("101%"),
        json!("-5%"),
        json!("0%"),
        json!("05%"),
        json!(0),
    ] {
        let value = serde_json::from_value(bad.clone()).unwrap();
        assert!(
            netwave_api::CountOrPercent::from_api(&value).is_err(),
            "{bad}"
        );
        assert_eq!(
            violations(ncr, &revision(bad.clone())),
            ["/spec/rollout/maxUnavailable"],
            "{bad}"
        );
    }
}

#[test]
fn required_fields_are_required() {
    let mut l2 = sample("Layer2NetworkConfiguration");
    l2["spec"].as_object_mut().unwrap().remove("vni");
    assert_eq!(violations("Layer2NetworkConfiguration", &l2), ["/spec"]);
    let mut vrf = sample("VRFRouteConfiguration");
    vrf["spec"]["import"][0]
        .as_object_mut()
        .unwrap()
        .remove("action");
    assert_eq!(
        violations("VRFRouteConfiguration", &vrf),
        ["/spec/import/0"]
    );
}
