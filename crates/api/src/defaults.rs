//! Values the API server fills in when an input omits a field: the `default` of the field's schema in
//! the input kind's CRD (added by [`crate::cel::with_rules`]), and the same values filled into
//! manifests read from files ([`apply`]), so `kubectl netwave plan -f` folds what the API server
//! would store.
//!
//! Only on the input kinds' own CRDs: a default inside a revision's snapshot would change, on read,
//! what an older revision was cut from.

use serde_json::Value;

/// (kind, path of property names under `spec`, value).
pub(crate) fn defaults() -> Vec<(&'static str, &'static [&'static str], Value)> {
    vec![(
        "BGPPeering",
        &["maximumPrefixes"],
        crate::inputs::DEFAULT_MAXIMUM_PREFIXES.into(),
    )]
}

/// Fills the defaults of `kind` into `doc` (an object with its `spec`) where a field is missing or
/// null, as the API server does on create and on read.
pub fn apply(kind: &str, doc: &mut Value) {
    for (k, path, value) in defaults() {
        let Some((field, parents)) = path.split_last() else {
            continue;
        };
        if k != kind {
            continue;
        }
        let mut at = doc.get_mut("spec");
        for p in parents {
            at = at.and_then(|v| v.get_mut(*p));
        }
        if let Some(Value::Object(parent)) = at {
            let slot = parent.entry(*field).or_insert(Value::Null);
            if slot.is_null() {
                *slot = value;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn a_missing_or_null_field_gets_its_default_and_a_set_one_is_kept() {
        for spec in [json!({}), json!({"maximumPrefixes": null})] {
            let mut doc = json!({ "spec": spec });
            super::apply("BGPPeering", &mut doc);
            assert_eq!(doc["spec"]["maximumPrefixes"], 10_000);
        }
        let mut doc = json!({"spec": {"maximumPrefixes": 7}});
        super::apply("BGPPeering", &mut doc);
        assert_eq!(doc["spec"]["maximumPrefixes"], 7);
        let mut doc = json!({"spec": {}});
        super::apply("RoutingTable", &mut doc);
        assert_eq!(doc, json!({"spec": {}}), "other kinds have no default here");
    }
}
