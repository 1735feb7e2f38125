//! Structural-schema enforcement for custom resources, as kube-apiserver does on every write:
//! drop non-nullable nulls, prune unknown fields, apply defaults, then validate (types, required,
//! enum, pattern, min/max, lengths, item counts, int-or-string). Errors carry field paths.
//!
//! A hand-written walker rather than a JSON Schema crate: pruning and defaulting rewrite the
//! object, `x-kubernetes-*` extensions are not JSON Schema, and the real server's error shapes
//! (`spec.vni: Invalid value: ...`) need the path of each failure.

use std::collections::BTreeMap;

use regex::Regex;
use serde_json::{Map, Value};

use crate::cause::Cause;

/// A compiled structural schema node.
#[derive(Debug, Clone, Default)]
pub struct Schema {
    pub type_: Option<String>,
    pub nullable: bool,
    pub int_or_string: bool,
    pub preserve_unknown: bool,
    pub embedded_resource: bool,
    pub properties: BTreeMap<String, Schema>,
    /// `additionalProperties`: `None` = not allowed (pruned), `Some(None)` = any, `Some(Some(s))` = values of `s`.
    pub additional: Option<Option<Box<Schema>>>,
    pub items: Option<Box<Schema>>,
    pub required: Vec<String>,
    pub enum_: Vec<Value>,
    pub pattern: Option<(String, Regex)>,
    pub minimum: Option<f64>,
    pub maximum: Option<f64>,
    pub exclusive_minimum: bool,
    pub exclusive_maximum: bool,
    pub min_length: Option<u64>,
    pub max_length: Option<u64>,
    pub min_items: Option<u64>,
    pub max_items: Option<u64>,
    pub default: Option<Value>,
}

/// Compile error: (field path suffix, message).
pub type CompileError = (String, String);

/// Compiles an `openAPIV3Schema` (errors: bad pattern, bad types).
pub fn compile(v: &Value) -> Result<Schema, CompileError> {
    compile_at(v, "")
}

fn compile_at(v: &Value, path: &str) -> Result<Schema, CompileError> {
    let mut s = Schema {
        type_: v["type"].as_str().map(String::from),
        nullable: v["nullable"].as_bool().unwrap_or(false),
        int_or_string: v["x-kubernetes-int-or-string"].as_bool().unwrap_or(false),
        preserve_unknown: v["x-kubernetes-preserve-unknown-fields"]
            .as_bool()
            .unwrap_or(false),
        embedded_resource: v["x-kubernetes-embedded-resource"]
            .as_bool()
            .unwrap_or(false),
        required: v["required"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default(),
        enum_: v["enum"].as_array().cloned().unwrap_or_default(),
        minimum: v["minimum"].as_f64(),
        maximum: v["maximum"].as_f64(),
        exclusive_minimum: v["exclusiveMinimum"].as_bool().unwrap_or(false),
        exclusive_maximum: v["exclusiveMaximum"].as_bool().unwrap_or(false),
        min_length: v["minLength"].as_u64(),
        max_length: v["maxLength"].as_u64(),
        min_items: v["minItems"].as_u64(),
        max_items: v["maxItems"].as_u64(),
        default: v.get("default").cloned(),
        ..Schema::default()
    };
    if let Some(t) = &s.type_
        && !matches!(
            t.as_str(),
            "object" | "array" | "string" | "integer" | "number" | "boolean"
        )
    {
        return Err((
            format!("{path}.type"),
            format!("Unsupported value: \"{t}\""),
        ));
    }
    if let Some(p) = v["pattern"].as_str() {
        let re = Regex::new(p).map_err(|e| {
            (
                format!("{path}.pattern"),
                format!("Invalid value: \"{p}\": {e}"),
            )
        })?;
        s.pattern = Some((p.to_string(), re));
    }
    if let Some(props) = v["properties"].as_object() {
        for (k, pv) in props {
            s.properties.insert(
                k.clone(),
                compile_at(pv, &format!("{path}.properties[{k}]"))?,
            );
        }
    }
    match v.get("additionalProperties") {
        Some(Value::Bool(true)) => s.additional = Some(None),
        Some(a @ Value::Object(_)) => {
            s.additional = Some(Some(Box::new(compile_at(
                a,
                &format!("{path}.additionalProperties"),
            )?)))
        }
        _ => {}
    }
    if let Some(items) = v.get("items").filter(|i| i.is_object()) {
        s.items = Some(Box::new(compile_at(items, &format!("{path}.items"))?));
    }
    Ok(s)
}

/// What a write failed on: field errors (422) or, in strict mode, unknown fields (400).
#[derive(Debug, Default)]
pub struct Outcome {
    pub errors: Vec<Cause>,
    /// Paths of unknown fields that were pruned.
    pub pruned: Vec<String>,
}

/// Prunes, defaults and validates `obj` (a whole object; `apiVersion`, `kind` and `metadata`
/// are left to the caller) in place.
pub fn enforce(root: &Schema, obj: &mut Value) -> Outcome {
    let mut out = Outcome::default();
    let Some(map) = obj.as_object_mut() else {
        out.errors
            .push(invalid("", &Value::Null, "must be of type object"));
        return out;
    };
    let mut dropped: Vec<String> = Vec::new();
    for (k, v) in map.iter_mut() {
        if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        match root.properties.get(k) {
            Some(s) => {
                if !walk(s, v, Path::Key(&Path::Root, k), &mut out) {
                    dropped.push(k.clone());
                }
            }
            None if root.preserve_unknown => {}
            None => {
                out.pruned.push(k.clone());
                dropped.push(k.clone());
            }
        }
    }
    drop_keys(map, &dropped);
    for (k, s) in &root.properties {
        if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        if !map.contains_key(k)
            && let Some(d) = &s.default
        {
            map.insert(k.clone(), d.clone());
        }
    }
    for r in &root.required {
        if !map.contains_key(r) {
            out.errors.push(required(r));
        }
    }
    out
}

/// Where a value sits in the object being walked, made text only for an error or a pruned field:
/// formatting every field's path on every write was most of the walk's cost.
#[derive(Clone, Copy)]
enum Path<'a> {
    Root,
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl std::fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Path::Root => Ok(()),
            Path::Key(Path::Root, k) => f.write_str(k),
            Path::Key(p, k) => write!(f, "{p}.{k}"),
            Path::Index(p, i) => write!(f, "{p}[{i}]"),
        }
    }
}

/// Removes the walk's dropped fields, keeping the others in their order.
fn drop_keys(map: &mut Map<String, Value>, dropped: &[String]) {
    if !dropped.is_empty() {
        map.retain(|k, _| !dropped.contains(k));
    }
}

fn show(v: &Value) -> String {
    match v {
        Value::Object(_) => "\"object\"".into(),
        Value::Array(_) => "\"array\"".into(),
        other => other.to_string(),
    }
}

fn invalid(path: impl std::fmt::Display, v: &Value, detail: &str) -> Cause {
    Cause {
        reason: "FieldValueInvalid".into(),
        message: format!("Invalid value: {}: {detail}", show(v)),
        field: path.to_string(),
    }
}

fn required(path: impl std::fmt::Display) -> Cause {
    Cause {
        reason: "FieldValueRequired".into(),
        message: "Required value".into(),
        field: path.to_string(),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn is_integer(v: &Value) -> bool {
    match v {
        Value::Number(n) => {
            n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        _ => false,
    }
}

/// Walks one value; returns false when the value must be dropped (a non-nullable null).
fn walk(s: &Schema, v: &mut Value, path: Path<'_>, out: &mut Outcome) -> bool {
    if v.is_null() {
        if s.nullable {
            return true;
        }
        if let Some(d) = &s.default {
            *v = d.clone();
        } else {
            return false;
        }
    }
    if !type_ok(s, v) {
        let expected = if s.int_or_string {
            "integer or string".to_string()
        } else {
            s.type_.clone().unwrap_or_default()
        };
        out.errors.push(invalid(
            path,
            v,
            &format!(
                "{path} in body must be of type {expected}: \"{}\"",
                type_name(v)
            ),
        ));
        return true;
    }
    if !s.enum_.is_empty() && !s.enum_.contains(v) {
        let supported: Vec<String> = s.enum_.iter().map(|e| e.to_string()).collect();
        out.errors.push(Cause {
            reason: "FieldValueNotSupported".into(),
            message: format!(
                "Unsupported value: {}: supported values: {}",
                show(v),
                supported.join(", ")
            ),
            field: path.to_string(),
        });
    }
    match v {
        Value::Object(map) => walk_object(s, map, path, out),
        Value::Array(items) => walk_array(s, items, path, out),
        Value::String(_) => check_string(s, v, path, out),
        Value::Number(_) => check_number(s, v, path, out),
        _ => {}
    }
    true
}

/// Whether the value has the schema's type (any, where the schema names none).
fn type_ok(s: &Schema, v: &Value) -> bool {
    if s.int_or_string {
        is_integer(v) || v.is_string()
    } else {
        match s.type_.as_deref() {
            None => true,
            Some("object") => v.is_object(),
            Some("array") => v.is_array(),
            Some("string") => v.is_string(),
            Some("integer") => is_integer(v),
            Some("number") => v.is_number(),
            Some("boolean") => v.is_boolean(),
            Some(_) => true,
        }
    }
}

/// An array's item count bounds, then each item walked (a null item that may not be null is an
/// error and kept as it is).
fn walk_array(s: &Schema, items: &mut [Value], path: Path<'_>, out: &mut Outcome) {
    if let Some(min) = s.min_items
        && (items.len() as u64) < min
    {
        out.errors.push(invalid(
            path,
            &Value::Array(Vec::new()),
            &format!("{path} in body should have at least {min} items"),
        ));
    }
    if let Some(max) = s.max_items
        && (items.len() as u64) > max
    {
        out.errors.push(Cause {
            reason: "FieldValueTooMany".into(),
            message: format!("Too many: {}: must have at most {max} items", items.len()),
            field: path.to_string(),
        });
    }
    let Some(is) = &s.items else { return };
    for (i, item) in items.iter_mut().enumerate() {
        let p = Path::Index(&path, i);
        if item.is_null() && !is.nullable && is.default.is_none() {
            out.errors.push(invalid(
                p,
                item,
                &format!(
                    "{p} in body must be of type {}: \"null\"",
                    is.type_.clone().unwrap_or_default()
                ),
            ));
            continue;
        }
        walk(is, item, p, out);
    }
}

/// A string's length bounds and pattern.
fn check_string(s: &Schema, v: &Value, path: Path<'_>, out: &mut Outcome) {
    let Value::String(st) = v else { return };
    let len = st.chars().count() as u64;
    if let Some(max) = s.max_length
        && len > max
    {
        out.errors.push(Cause {
            reason: "FieldValueTooLong".into(),
            message: format!("Too long: may not be more than {max} bytes"),
            field: path.to_string(),
        });
    }
    if let Some(min) = s.min_length
        && len < min
    {
        out.errors.push(invalid(
            path,
            v,
            &format!("{path} in body should be at least {min} chars long"),
        ));
    }
    if let Some((p, re)) = &s.pattern
        && !re.is_match(st)
    {
        out.errors.push(invalid(
            path,
            v,
            &format!("{path} in body should match '{p}'"),
        ));
    }
}

/// A number's minimum and maximum (each exclusive or not).
fn check_number(s: &Schema, v: &Value, path: Path<'_>, out: &mut Outcome) {
    let Value::Number(n) = v else { return };
    let f = n.as_f64().unwrap_or(0.0);
    if let Some(min) = s.minimum {
        let bad = if s.exclusive_minimum {
            f <= min
        } else {
            f < min
        };
        if bad {
            let op = if s.exclusive_minimum {
                "greater than"
            } else {
                "greater than or equal to"
            };
            out.errors.push(invalid(
                path,
                v,
                &format!("{path} in body should be {op} {}", fmt_num(min)),
            ));
        }
    }
    if let Some(max) = s.maximum {
        let bad = if s.exclusive_maximum {
            f >= max
        } else {
            f > max
        };
        if bad {
            let op = if s.exclusive_maximum {
                "less than"
            } else {
                "less than or equal to"
            };
            out.errors.push(invalid(
                path,
                v,
                &format!("{path} in body should be {op} {}", fmt_num(max)),
            ));
        }
    }
}

fn fmt_num(f: f64) -> String {
    if f.fract() == 0.0 {
        format!("{}", f as i64)
    } else {
        f.to_string()
    }
}

fn walk_object(s: &Schema, map: &mut Map<String, Value>, path: Path<'_>, out: &mut Outcome) {
    let mut dropped: Vec<String> = Vec::new();
    for (k, v) in map.iter_mut() {
        // Embedded resources keep apiVersion/kind/metadata.
        if s.embedded_resource && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        let child = match (s.properties.get(k), &s.additional) {
            (Some(c), _) => Some(c),
            (None, Some(Some(a))) => Some(a.as_ref()),
            (None, Some(None)) => continue,
            (None, None) if s.preserve_unknown => continue,
            (None, None) if s.type_.is_none() && s.properties.is_empty() => continue,
            (None, None) => None,
        };
        let p = Path::Key(&path, k);
        match child {
            Some(c) => {
                if !walk(c, v, p, out) {
                    dropped.push(k.clone());
                }
            }
            None => {
                out.pruned.push(p.to_string());
                dropped.push(k.clone());
            }
        }
    }
    drop_keys(map, &dropped);
    for (k, c) in &s.properties {
        if !map.contains_key(k)
            && let Some(d) = &c.default
        {
            map.insert(k.clone(), d.clone());
        }
    }
    for r in &s.required {
        if !map.contains_key(r) {
            out.errors.push(required(Path::Key(&path, r)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Schema {
        compile(&json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["vni"],
                    "properties": {
                        "vni": {"type": "integer", "minimum": 1, "maximum": 16777215},
                        "name": {"type": "string", "maxLength": 5, "pattern": "^[a-z]+$"},
                        "mode": {"type": "string", "enum": ["a", "b"]},
                        "port": {"x-kubernetes-int-or-string": true},
                        "tags": {"type": "array", "maxItems": 2, "items": {"type": "string"}, "default": []},
                        "opt": {"type": "string", "nullable": true},
                        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}}
                    }
                }
            }
        }))
        .unwrap()
    }

    #[test]
    fn prunes_unknown_defaults_and_keeps_preserved() {
        let mut o = json!({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "a"}, "junk": 1,
            "spec": {"vni": 5, "extra": true, "free": {"any": {"thing": 1}}, "port": "http", "opt": null, "mode": null}});
        let out = enforce(&schema(), &mut o);
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        assert_eq!(
            out.pruned,
            vec!["junk".to_string(), "spec.extra".to_string()]
        );
        assert_eq!(o["spec"]["tags"], json!([]));
        assert_eq!(o["spec"]["free"]["any"]["thing"], 1);
        assert!(
            o["spec"].get("mode").is_none(),
            "non-nullable null is dropped"
        );
        assert!(o["spec"]["opt"].is_null() && o["spec"].get("opt").is_some());
    }

    #[test]
    fn reports_each_violation_with_its_path() {
        let mut o = json!({"spec": {"vni": 0, "name": "TOOLONG", "mode": "c", "port": 1.5, "tags": ["a","b","c"], "labels": {"k": 1}}});
        let out = enforce(&schema(), &mut o);
        let mut fields: Vec<&str> = out.errors.iter().map(|c| c.field.as_str()).collect();
        fields.sort();
        assert_eq!(
            fields,
            vec![
                "spec.labels.k",
                "spec.mode",
                "spec.name",
                "spec.name",
                "spec.port",
                "spec.tags",
                "spec.vni"
            ]
        );
        let mut missing = json!({"spec": {}});
        let out = enforce(&schema(), &mut missing);
        assert_eq!(out.errors[0].field, "spec.vni");
        assert_eq!(out.errors[0].message, "Required value");
    }
}
