//! Every date-time a CRD accepts parses as the Rust type that reads it (#48), as [`crate::integers`]
//! does for integers. kube-apiserver checks `format: date-time` with Go's parser, which takes
//! offsets the Rust side (k8s-openapi's `Time`, a jiff timestamp) refuses: an agent that wrote
//! `lastTransitionTime: 2026-01-01T00:00:00+99:00` into its own NodeNetworkConfig made it undecodable,
//! and its node dropped out of every rollout.
//!
//! One pass over every generated schema adds [`PATTERN`] to each `format: date-time` string: RFC 3339
//! as Kubernetes writes it (`T`, seconds, up to nine fraction digits, `Z` or an offset of at most
//! ±23:59). The API server refuses the rest; the pattern never admits a string jiff cannot read.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

/// The date-times every CRD accepts (RE2 syntax, which the API server uses for `pattern`).
pub const PATTERN: &str = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$";

fn walk(v: &mut Value) {
    match v {
        Value::Object(m) => {
            if m.get("format").and_then(Value::as_str) == Some("date-time") {
                m.insert("pattern".into(), PATTERN.into());
            }
            m.values_mut().for_each(walk);
        }
        Value::Array(a) => a.iter_mut().for_each(walk),
        _ => {}
    }
}

/// The CRD with every date-time held to [`PATTERN`].
pub(crate) fn strict(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    crate::integers::each_schema(crd, walk)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::Value;

    use super::PATTERN;

    fn date_times(v: &Value, at: String, out: &mut Vec<(String, Value)>) {
        match v {
            Value::Object(m) => {
                if m.get("format").and_then(Value::as_str) == Some("date-time") {
                    out.push((at.clone(), v.clone()));
                }
                for (k, c) in m {
                    date_times(c, format!("{at}/{k}"), out);
                }
            }
            Value::Array(a) => {
                for (i, c) in a.iter().enumerate() {
                    date_times(c, format!("{at}/{i}"), out);
                }
            }
            _ => {}
        }
    }

    #[test]
    fn every_date_time_in_every_crd_has_the_pattern() {
        let mut found = Vec::new();
        for (file, crd) in crate::crds() {
            date_times(&serde_json::to_value(crd).unwrap(), file, &mut found);
        }
        // Conditions on every kind, and the rollout's own times.
        assert!(found.len() >= 16, "{}", found.len());
        let missing: Vec<&String> = (found.iter())
            .filter(|(_, f)| f.get("pattern").and_then(Value::as_str) != Some(PATTERN))
            .map(|(at, _)| at)
            .collect();
        assert!(
            missing.is_empty(),
            "date-times without the pattern: {missing:#?}"
        );
    }

    /// What the pattern admits parses as `Time`; the offsets jiff refuses are not admitted.
    #[test]
    fn the_pattern_admits_only_times_the_rust_type_reads() {
        let schema = serde_json::json!({"type": "string", "pattern": PATTERN});
        let pattern = jsonschema::validator_for(&schema).unwrap();
        let admitted = [
            "2026-01-01T00:00:00Z",
            "2026-11-28T13:47:40.123456789Z",
            "2026-11-28T13:47:40+14:00",
            "2026-11-28T13:47:40-09:30",
            "2026-11-28T13:47:40.5+23:59",
        ];
        for t in admitted {
            assert!(pattern.is_valid(&Value::from(t)), "{t} is admitted");
            assert!(
                serde_json::from_value::<Time>(Value::from(t)).is_ok(),
                "{t} is admitted and must parse"
            );
        }
        let refused = [
            "2026-01-01T00:00:00+99:00",
            "2026-01-01T00:00:00+26:00",
            "2026-01-01T00:00:00+0530",
            "2026-01-01 00:00:00Z",
            "2026-01-01T00:00Z",
            "2026-01-01T00:00:00.1234567890Z",
            "2026-01-01T00:00:00",
        ];
        for t in refused {
            assert!(!pattern.is_valid(&Value::from(t)), "{t} is refused");
        }
    }
}
