//! Every integer a CRD accepts fits the Rust type that reads it (DESIGN.md §6, "One bad object never
//! blinds the fleet"). A value the schema lets through but serde refuses breaks every list of that kind:
//! an agent that wrote `status.observedRetry: 4294967296` into its own NodeNetworkConfig (an `int64`
//! with no maximum, read as `u32`) made the configurator's next list of NodeNetworkConfigs fail, and
//! nothing was rolled out any more.
//!
//! ```text
//!   schemars schema (format: uint32, minimum: 0)
//!     └─► bounded: minimum/maximum of the Rust type (u32: 0..=4294967295), or tighter ones the field
//!                  already has (VLAN 1..=4094); then the format Kubernetes knows (int32/int64) ─► crds/
//! ```
//!
//! One pass over every generated schema rather than an attribute per field, so a new field cannot forget
//! it; the unit test below fails for any integer in any CRD without bounds inside its Rust type's range.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Map, Value};

/// The values of the Rust integer type schemars names `format` (`i128`/`u128` are never in a CRD).
fn rust_range(format: &str) -> Option<(i128, i128)> {
    Some(match format {
        "int8" => (i8::MIN.into(), i8::MAX.into()),
        "int16" => (i16::MIN.into(), i16::MAX.into()),
        "int32" => (i32::MIN.into(), i32::MAX.into()),
        "int64" => (i64::MIN.into(), i64::MAX.into()),
        "uint8" => (0, u8::MAX.into()),
        "uint16" => (0, u16::MAX.into()),
        "uint32" => (0, u32::MAX.into()),
        "uint64" => (0, u64::MAX.into()),
        _ => return None,
    })
}

/// The values of a field marked `x-kubernetes-int-or-string`: k8s-openapi's `IntOrString::Int` is an
/// `i32`.
const INT_OR_STRING: (i128, i128) = (i32::MIN as i128, i32::MAX as i128);

/// Kubernetes knows the integer formats int32 and int64 only: kube-apiserver warns `unrecognized format
/// "uint32"` (and so on) on every apply of a CRD carrying schemars' names for Rust's unsigned types.
/// They become the signed format wide enough for them; the bounds keep the Rust type's range.
fn kubernetes_format(format: &str) -> Option<&'static str> {
    match format {
        "uint8" | "uint16" | "int8" | "int16" => Some("int32"),
        "uint32" | "uint64" => Some("int64"),
        _ => None,
    }
}

/// The bounds a schema carries for values `lo..=hi`, as the `f64` a JSON schema keeps them. The API
/// server refuses a bound its format cannot hold, and judges that by the shortest decimal that
/// round-trips the `f64` (Go's `FormatFloat(f, 'f', -1, 64)`, the same digits Rust's `{}` prints):
/// `i64::MIN` itself prints as -9223372036854776000, out of int64, so the bounds are the nearest `f64`
/// whose printed value is inside the range. The API server stores integers as int64, so a `u64` field
/// is bounded by that too.
fn as_bounds((lo, hi): (i128, i128)) -> (f64, f64) {
    let (lo, hi) = (lo.max(i64::MIN.into()), hi.min(i64::MAX.into()));
    let mut min = lo as f64;
    while printed(min) < lo {
        min = min.next_up();
    }
    let mut max = hi as f64;
    while printed(max) > hi {
        max = max.next_down();
    }
    (min, max)
}

/// The integer the API server reads from a bound: its shortest round-trip decimal.
fn printed(f: f64) -> i128 {
    format!("{f}")
        .parse()
        .expect("an integral f64 prints as an integer")
}

/// Sets `minimum`/`maximum` to the range, keeping a bound the schema has that is tighter already.
fn bound(m: &mut Map<String, Value>, range: (i128, i128)) {
    let (min, max) = as_bounds(range);
    let have = |m: &Map<String, Value>, k: &str| m.get(k).and_then(Value::as_f64);
    let min = have(m, "minimum").map_or(min, |h| h.max(min));
    let max = have(m, "maximum").map_or(max, |h| h.min(max));
    m.insert("minimum".into(), min.into());
    m.insert("maximum".into(), max.into());
}

fn walk(v: &mut Value) {
    match v {
        Value::Object(m) => {
            let integer = m.get("type").and_then(Value::as_str) == Some("integer");
            let format = m.get("format").and_then(Value::as_str).map(str::to_string);
            if let Some(range) = format.as_deref().filter(|_| integer).and_then(rust_range) {
                bound(m, range);
            }
            if m.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
                bound(m, INT_OR_STRING);
            }
            if let Some(k8s) = format.as_deref().and_then(kubernetes_format) {
                m.insert("format".into(), k8s.into());
            }
            m.values_mut().for_each(walk);
        }
        Value::Array(a) => a.iter_mut().for_each(walk),
        _ => {}
    }
}

/// The CRD with every integer bounded by its Rust type and in the formats Kubernetes knows.
pub(crate) fn bounded(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    each_schema(crd, walk)
}

/// `crd` with `f` applied to the schema of each of its versions (a pass over every field such as
/// [`bounded`] and `datetimes::strict`).
pub(crate) fn each_schema(
    crd: CustomResourceDefinition,
    f: fn(&mut Value),
) -> CustomResourceDefinition {
    let mut v = serde_json::to_value(crd).expect("a CRD always serializes");
    for version in v["spec"]["versions"].as_array_mut().into_iter().flatten() {
        f(&mut version["schema"]["openAPIV3Schema"]);
    }
    serde_json::from_value(v).expect("a schema pass keeps the CRD a CRD")
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::{INT_OR_STRING, printed, rust_range};

    /// Every integer schema (and int-or-string) under `v`, by JSON pointer.
    fn integers(v: &Value, at: String, out: &mut Vec<(String, Value)>) {
        match v {
            Value::Object(m) => {
                let integer = m.get("type").and_then(Value::as_str) == Some("integer")
                    || m.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
                if integer {
                    out.push((at.clone(), v.clone()));
                }
                for (k, c) in m {
                    integers(c, format!("{at}/{k}"), out);
                }
            }
            Value::Array(a) => {
                for (i, c) in a.iter().enumerate() {
                    integers(c, format!("{at}/{i}"), out);
                }
            }
            _ => {}
        }
    }

    /// The Rust type's range of the field at `pointer`, from the schema schemars generated for it.
    fn range_of(generated: &Value, pointer: &str) -> Result<(i128, i128), String> {
        let field = generated
            .pointer(pointer)
            .ok_or_else(|| "not in the generated schema".to_string())?;
        if field.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
            return Ok(INT_OR_STRING);
        }
        let format = field.get("format").and_then(Value::as_str);
        format
            .and_then(rust_range)
            .ok_or_else(|| format!("no Rust integer format: {format:?}"))
    }

    /// The rule of DESIGN.md §6: the API server accepts no integer the reader cannot decode. Every
    /// integer of every CRD (spec and status, nested and optional ones) has a minimum and a maximum
    /// inside the range of its Rust type (tighter domain bounds are kept), and the Kubernetes format
    /// wide enough for it.
    #[test]
    fn every_integer_in_every_crd_is_bounded_by_the_rust_type_that_reads_it() {
        let mut wrong = Vec::new();
        let mut checked = 0;
        for ((file, generated), (_, crd)) in crate::generated().into_iter().zip(crate::crds()) {
            let generated = serde_json::to_value(generated).unwrap();
            let crd = serde_json::to_value(crd).unwrap();
            let mut found = Vec::new();
            for (i, version) in crd["spec"]["versions"]
                .as_array()
                .unwrap()
                .iter()
                .enumerate()
            {
                let at = format!("/spec/versions/{i}/schema/openAPIV3Schema");
                integers(&version["schema"]["openAPIV3Schema"], at, &mut found);
            }
            for (pointer, field) in found {
                checked += 1;
                let range = match range_of(&generated, &pointer) {
                    Ok(r) => r,
                    Err(e) => {
                        wrong.push(format!("{file} {pointer}: {e}"));
                        continue;
                    }
                };
                // As the API server reads a bound: the integer its shortest decimal says.
                let min = field.get("minimum").and_then(Value::as_f64).map(printed);
                let max = field.get("maximum").and_then(Value::as_f64).map(printed);
                let (lo, hi) = (range.0.max(i64::MIN.into()), range.1.min(i64::MAX.into()));
                match (min, max) {
                    (Some(min), Some(max)) if min >= lo && max <= hi && min <= max => {}
                    _ => wrong.push(format!(
                        "{file} {pointer}: minimum {min:?} maximum {max:?}, the Rust type reads \
                         {}..={}",
                        range.0, range.1
                    )),
                }
                let format = field.get("format").and_then(Value::as_str);
                let wide_enough = match format {
                    Some("int32") => range.0 >= i32::MIN.into() && range.1 <= i32::MAX.into(),
                    Some("int64") => true,
                    None => field.get("type").is_none(),
                    Some(_) => false,
                };
                if !wide_enough {
                    wrong.push(format!(
                        "{file} {pointer}: format {format:?} for {}..={}",
                        range.0, range.1
                    ));
                }
            }
        }
        assert!(checked > 50, "only {checked} integers found");
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// The fields of the issue, exactly at their Rust type's range or a tighter domain range.
    #[test]
    fn the_integers_that_blinded_the_fleet_are_bounded() {
        let crds: Vec<(String, Value)> = crate::crds()
            .into_iter()
            .map(|(f, c)| (f, serde_json::to_value(c).unwrap()))
            .collect();
        let schema = |file: &str| {
            crds.iter().find(|(f, _)| *f == file).unwrap().1["spec"]["versions"][0]["schema"]
                ["openAPIV3Schema"]
                .clone()
        };
        let bounds = |v: &Value| (v["minimum"].as_f64(), v["maximum"].as_f64());
        let u32_max = Some(f64::from(u32::MAX));
        let nnc = schema("nodenetworkconfigs.yaml");
        let status = &nnc["properties"]["status"]["properties"];
        assert_eq!(bounds(&status["observedRetry"]), (Some(0.0), u32_max));
        let ncr = schema("networkconfigrevisions.yaml");
        let spec = &ncr["properties"]["spec"]["properties"];
        assert_eq!(bounds(&spec["retry"]), (Some(0.0), u32_max));
        assert_eq!(
            bounds(&spec["rollout"]["properties"]["maxFailures"]),
            (Some(1.0), u32_max)
        );
        assert_eq!(
            bounds(&spec["rollout"]["properties"]["maxUnavailable"]),
            (Some(1.0), Some(f64::from(i32::MAX)))
        );
        let rt = schema("routingtables.yaml");
        let route = &rt["properties"]["spec"]["properties"]["routes"]["items"]["properties"];
        assert_eq!(bounds(&route["metric"]), (Some(0.0), u32_max));
        let l2 = schema("layer2networkconfigurations.yaml");
        let id = &l2["properties"]["spec"]["properties"]["id"];
        assert_eq!(bounds(id), (Some(1.0), Some(4094.0)), "VLAN keeps 1..4094");
        // i64 (metav1.Condition.observedGeneration): neither end of i64 prints as an int64 (the API
        // server refuses such a bound), the nearest f64 inside does.
        let generation = &ncr["properties"]["status"]["properties"]["conditions"]["items"]["properties"]
            ["observedGeneration"];
        let (min, max) = bounds(generation);
        assert_eq!(
            (printed(min.unwrap()), printed(max.unwrap())),
            (-9223372036854775000, 9223372036854775000)
        );
    }
}
