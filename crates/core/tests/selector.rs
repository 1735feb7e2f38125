//! Kubernetes label selector semantics, table-driven.

mod support_inputs;

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use netwave_core::selector::{Selector, SelectorProblem};
use support_inputs::{expr, match_expressions, match_labels};

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn matches(sel: &Option<LabelSelector>, pairs: &[(&str, &str)]) -> bool {
    Selector::parse(sel.as_ref())
        .expect("valid selector")
        .matches(&labels(pairs))
}

#[test]
fn omitted_selector_selects_every_node() {
    assert!(matches(&None, &[]));
    assert!(matches(&None, &[("a", "b")]));
}

#[test]
fn empty_selector_selects_every_node() {
    assert!(matches(&Some(LabelSelector::default()), &[]));
    assert!(matches(&match_expressions(vec![]), &[("x", "y")]));
}

#[test]
fn match_labels_need_every_pair_equal() {
    let sel = match_labels(&[("pool", "storage"), ("zone", "a")]);
    let cases: &[(&[(&str, &str)], bool)] = &[
        (&[("pool", "storage"), ("zone", "a")], true),
        (&[("pool", "storage"), ("zone", "a"), ("extra", "1")], true),
        (&[("pool", "storage")], false),
        (&[("pool", "compute"), ("zone", "a")], false),
        (&[], false),
    ];
    for (node, want) in cases {
        assert_eq!(matches(&sel, node), *want, "{node:?}");
    }
}

#[test]
fn operators_follow_kubernetes() {
    type Case<'a> = (&'a str, &'a [&'a str], &'a [(&'a str, &'a str)], bool);
    let cases: &[Case] = &[
        ("In", &["a", "b"], &[("k", "a")], true),
        ("In", &["a", "b"], &[("k", "c")], false),
        ("In", &["a"], &[], false),
        // NotIn matches nodes without the key at all.
        ("NotIn", &["a"], &[], true),
        ("NotIn", &["a"], &[("k", "b")], true),
        ("NotIn", &["a"], &[("k", "a")], false),
        ("Exists", &[], &[("k", "")], true),
        ("Exists", &[], &[("other", "x")], false),
        ("DoesNotExist", &[], &[], true),
        ("DoesNotExist", &[], &[("k", "x")], false),
    ];
    for (op, values, node, want) in cases {
        let sel = match_expressions(vec![expr("k", op, values)]);
        assert_eq!(matches(&sel, node), *want, "{op} {values:?} on {node:?}");
    }
}

#[test]
fn labels_and_expressions_are_anded() {
    let mut sel = match_labels(&[("pool", "storage")]).unwrap();
    sel.match_expressions = Some(vec![expr("zone", "NotIn", &["c"])]);
    let sel = Some(sel);
    assert!(matches(&sel, &[("pool", "storage"), ("zone", "a")]));
    assert!(!matches(&sel, &[("pool", "storage"), ("zone", "c")]));
    assert!(!matches(&sel, &[("pool", "compute"), ("zone", "a")]));
}

#[test]
fn invalid_selectors_are_errors_naming_the_field() {
    let cases: Vec<(Option<LabelSelector>, &str, &str)> = vec![
        (
            match_expressions(vec![expr("k", "In", &[])]),
            "matchExpressions[0].values",
            "values must be non-empty for operator In",
        ),
        (
            match_expressions(vec![expr("ok", "Exists", &[]), expr("k", "NotIn", &[])]),
            "matchExpressions[1].values",
            "values must be non-empty for operator NotIn",
        ),
        (
            match_expressions(vec![expr("k", "Exists", &["a"])]),
            "matchExpressions[0].values",
            "values must be empty for operator Exists",
        ),
        (
            match_expressions(vec![expr("k", "in", &["a"])]),
            "matchExpressions[0].operator",
            "\"in\" is not a valid label selector operator",
        ),
        (
            match_expressions(vec![expr("k", "Gt", &["1"])]),
            "matchExpressions[0].operator",
            "\"Gt\" is not a valid label selector operator",
        ),
        (
            match_expressions(vec![expr("bad key", "Exists", &[])]),
            "matchExpressions[0].key",
            "\"bad key\" is not a valid label key",
        ),
        (
            match_expressions(vec![expr("Netwave.dev/pool", "Exists", &[])]),
            "matchExpressions[0].key",
            "prefix must be a lowercase DNS-1123 subdomain",
        ),
        (
            match_labels(&[("pool", "-storage")]),
            "matchLabels[\"pool\"]",
            "\"-storage\" is not a valid label value",
        ),
    ];
    for (sel, path, message) in cases {
        let errors = Selector::parse(sel.as_ref()).expect_err(path);
        assert_eq!(errors[0].path, path);
        assert!(
            errors[0].to_string().contains(message),
            "{} does not contain {message}",
            errors[0]
        );
    }
}

#[test]
fn every_problem_is_reported() {
    let sel = match_expressions(vec![expr("k", "In", &[]), expr("j", "Nope", &[])]);
    let errors = Selector::parse(sel.as_ref()).unwrap_err();
    assert_eq!(errors.len(), 2);
    assert!(matches!(
        errors[0].problem,
        SelectorProblem::MissingValues(_)
    ));
    assert!(matches!(
        errors[1].problem,
        SelectorProblem::UnknownOperator(_)
    ));
}

#[test]
fn valid_keys_and_values_are_accepted() {
    let sel = match_labels(&[
        ("netwave.dev/pool", "storage"),
        ("topology.kubernetes.io/zone", "eu-1a"),
        ("kubernetes.io/hostname", "node_1.example"),
        ("empty", ""),
    ]);
    assert!(Selector::parse(sel.as_ref()).is_ok());
}

#[test]
fn equivalent_selectors_compile_equal() {
    let a = match_expressions(vec![expr("a", "In", &["x", "y"]), expr("b", "Exists", &[])]);
    let b = match_expressions(vec![
        expr("b", "Exists", &[]),
        expr("a", "In", &["y", "x", "x"]),
    ]);
    assert_eq!(
        Selector::parse(a.as_ref()).unwrap(),
        Selector::parse(b.as_ref()).unwrap()
    );
}
