//! `Table` output (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`) for kubectl get.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::resources::{Column, ResourceType};
use crate::store::Object;

/// Evaluates the simple JSONPath subset printer columns use: `.a.b`, `.a[0].b`, `.a['x.y']`.
pub fn json_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = obj;
    let mut rest = path
        .trim()
        .trim_start_matches('{')
        .trim_end_matches('}')
        .trim_start_matches('$');
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            cur = cur.get(&r[..end])?;
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']')?;
            let inner = r[..end].trim_matches(['\'', '"']);
            cur = match inner.parse::<usize>() {
                Ok(i) => cur.get(i)?,
                Err(_) => cur.get(inner)?,
            };
            rest = &r[end + 1..];
        } else {
            return None;
        }
    }
    Some(cur)
}

/// kube's `duration.HumanDuration`.
pub fn human_duration(secs: i64) -> String {
    if secs < 0 {
        return "<invalid>".into();
    }
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86400);
    if secs < 120 {
        format!("{secs}s")
    } else if m < 10 {
        let s = secs % 60;
        if s == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{s}s")
        }
    } else if m < 180 {
        format!("{m}m")
    } else if h < 8 {
        let mm = m % 60;
        if mm == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{mm}m")
        }
    } else if h < 48 {
        format!("{h}h")
    } else if h < 192 {
        let hh = h % 24;
        if hh == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{hh}h")
        }
    } else if d < 365 * 2 {
        format!("{d}d")
    } else {
        format!("{}y", d / 365)
    }
}

fn age(ts: &str) -> Value {
    match ts.parse::<jiff::Timestamp>() {
        Ok(t) => json!(human_duration(
            jiff::Timestamp::now().as_second() - t.as_second()
        )),
        Err(_) => json!("<unknown>"),
    }
}

fn default_columns() -> Vec<Column> {
    vec![Column {
        name: "Age".into(),
        type_: "date".into(),
        format: String::new(),
        description: "CreationTimestamp is a timestamp representing the server time when this object was created.".into(),
        priority: 0,
        json_path: ".metadata.creationTimestamp".into(),
    }]
}

fn column(name: &str, type_: &str, json_path: &str) -> Column {
    Column {
        name: name.into(),
        type_: type_.into(),
        format: String::new(),
        description: String::new(),
        priority: 0,
        json_path: json_path.into(),
    }
}

/// kubectl's node columns: STATUS, ROLES, AGE, VERSION.
fn node_columns() -> Vec<Column> {
    vec![
        column("Status", "string", "#node-status"),
        column("Roles", "string", "#node-roles"),
        column("Age", "date", ".metadata.creationTimestamp"),
        column("Version", "string", ".status.nodeInfo.kubeletVersion"),
    ]
}

fn node_status(o: &Value) -> String {
    let ready = o["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .map(|c| c["status"].as_str().unwrap_or_default().to_string());
    let mut s = match ready.as_deref() {
        Some("True") => "Ready".to_string(),
        Some("False") => "NotReady".to_string(),
        _ => "Unknown".to_string(),
    };
    if o["spec"]["unschedulable"] == true {
        s.push_str(",SchedulingDisabled");
    }
    s
}

fn node_roles(o: &Value) -> String {
    let roles: Vec<&str> = o["metadata"]["labels"]
        .as_object()
        .map(|l| {
            l.keys()
                .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                .collect()
        })
        .unwrap_or_default();
    if roles.is_empty() {
        "<none>".into()
    } else {
        roles.join(",")
    }
}

/// Builds a `Table` of `objs`. `include`: `None`, `Metadata` (default) or `Object`.
pub fn table(
    rt: &ResourceType,
    version: &str,
    objs: &[Arc<Object>],
    include: &str,
    list_meta: Value,
) -> Value {
    let cols = if rt.group.is_empty() && rt.plural == "nodes" {
        node_columns()
    } else {
        rt.columns
            .get(version)
            .filter(|c| !c.is_empty())
            .cloned()
            .unwrap_or_else(default_columns)
    };
    let mut defs = vec![json!({
        "name": "Name", "type": "string", "format": "name", "priority": 0,
        "description": "Name must be unique within a namespace. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names",
    })];
    for c in &cols {
        defs.push(json!({"name": c.name, "type": c.type_, "format": c.format, "description": c.description, "priority": c.priority}));
    }
    let rows: Vec<Value> = objs
        .iter()
        .map(|o| {
            let o = &o.value();
            let mut cells = vec![o["metadata"]["name"].clone()];
            for c in &cols {
                let v = match c.json_path.as_str() {
                    "#node-status" => json!(node_status(o)),
                    "#node-roles" => json!(node_roles(o)),
                    p => json_path(o, p).cloned().unwrap_or(Value::Null),
                };
                cells.push(match (c.type_.as_str(), &v) {
                    ("date", Value::String(s)) => age(s),
                    (_, Value::Array(_) | Value::Object(_)) => json!(v.to_string()),
                    _ => v,
                });
            }
            let object = match include {
                "None" => Value::Null,
                "Object" => o.clone(),
                _ => metadata_view(o),
            };
            json!({"cells": cells, "object": object})
        })
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta, "columnDefinitions": defs, "rows": rows})
}

/// An object as `PartialObjectMetadata` (its metadata only), for `as=PartialObjectMetadata` and the
/// rows of a Table.
pub fn metadata_view(obj: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_durations() {
        let o = json!({"status": {"failedNodes": [{"node": "n1"}]}, "spec": {"a.b": 1}});
        assert_eq!(
            json_path(&o, ".status.failedNodes[0].node"),
            Some(&json!("n1"))
        );
        assert_eq!(json_path(&o, ".spec['a.b']"), Some(&json!(1)));
        assert_eq!(json_path(&o, ".status.missing"), None);
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(150), "2m30s");
        assert_eq!(human_duration(3 * 3600 + 60), "3h1m");
        assert_eq!(human_duration(3 * 86400), "3d");
    }
}
