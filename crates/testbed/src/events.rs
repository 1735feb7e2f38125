//! core/v1 Event and events.k8s.io/v1 Event are one resource stored in core form, as in
//! kube-apiserver: kube-runtime's `Recorder` writes events.k8s.io/v1, `kubectl describe` reads
//! core/v1, and both see the same objects.

use serde_json::{Map, Value};

/// (events.k8s.io/v1 field, core/v1 field)
const FIELDS: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("related", "related"),
    ("note", "message"),
    ("reason", "reason"),
    ("type", "type"),
    ("action", "action"),
    ("reportingController", "reportingComponent"),
    ("reportingInstance", "reportingInstance"),
    ("eventTime", "eventTime"),
    ("series", "series"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

fn convert(v: &Value, api_version: &str, from_core: bool) -> Value {
    let Some(src) = v.as_object() else {
        return v.clone();
    };
    let mut out = Map::new();
    for (k, val) in src {
        let mapped = FIELDS.iter().find_map(|(e, c)| {
            if from_core {
                (*c == k).then_some(*e)
            } else {
                (*e == k).then_some(*c)
            }
        });
        match (k.as_str(), mapped) {
            ("apiVersion", _) => {
                out.insert(k.clone(), Value::String(api_version.into()));
            }
            ("kind" | "metadata", _) => {
                out.insert(k.clone(), val.clone());
            }
            (_, Some(m)) => {
                out.insert(m.to_string(), val.clone());
            }
            // Fields without a counterpart are dropped, as the real conversion does.
            (_, None) => {}
        }
    }
    Value::Object(out)
}

/// events.k8s.io/v1 → core/v1.
pub fn to_core(v: &Value) -> Value {
    convert(v, "v1", false)
}

/// core/v1 → events.k8s.io/v1.
pub fn from_core(v: &Value) -> Value {
    convert(v, "events.k8s.io/v1", true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trip() {
        let e = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "x.1"},
            "regarding": {"kind": "Node", "name": "n1"}, "note": "hello", "reason": "Applied", "type": "Normal",
            "reportingController": "netwave", "series": {"count": 2}});
        let c = to_core(&e);
        assert_eq!(c["apiVersion"], "v1");
        assert_eq!(c["involvedObject"]["name"], "n1");
        assert_eq!(c["message"], "hello");
        assert_eq!(c["reportingComponent"], "netwave");
        assert_eq!(from_core(&c), e);
    }
}
