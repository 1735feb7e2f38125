//! `metadata.managedFields` and server-side apply.
//!
//! Field ownership is tracked per entry (manager, operation, subresource) as a set of leaf paths,
//! stored as `FieldsV1`. Simplification against the real server (documented in the crate root):
//! every list is atomic (owned as a whole), as lists without `x-kubernetes-list-type` are in CRDs.
//!
//! - Update operations (create, replace, patches) give the writer the fields whose values it
//!   changed and take them from every other entry; removed fields leave every entry.
//! - Apply compares the applied configuration with the other entries: a field another entry owns
//!   whose value the apply would change is a conflict (409 unless `force`, which moves ownership).
//!   Fields this manager applied before and omits now are removed unless another entry owns them.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

type Path = Vec<String>;
/// A set of owned leaf paths.
pub type FieldSet = BTreeSet<Path>;

/// What part of an object a write addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The main endpoint of a type without status subresource: everything.
    All,
    /// The main endpoint of a type with a status subresource: everything but `status`.
    Main,
    /// The `/status` subresource: only `status`.
    Status,
}

const SERVER_METADATA: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
    "generateName",
];

/// The leaf paths of an object inside `scope` (server-managed metadata excluded).
pub fn leaves(obj: &Value, scope: Scope) -> FieldSet {
    let mut out = FieldSet::new();
    let Some(map) = obj.as_object() else {
        return out;
    };
    for (k, v) in map {
        let take = match (k.as_str(), scope) {
            ("apiVersion" | "kind", _) => false,
            ("status", Scope::Main) => false,
            ("status", Scope::Status) => true,
            (_, Scope::Status) => false,
            _ => true,
        };
        if !take {
            continue;
        }
        if k == "metadata" {
            if let Some(m) = v.as_object() {
                for (mk, mv) in m {
                    if !SERVER_METADATA.contains(&mk.as_str()) {
                        collect(mv, vec![k.clone(), mk.clone()], &mut out);
                    }
                }
            }
            continue;
        }
        collect(v, vec![k.clone()], &mut out);
    }
    out
}

fn collect(v: &Value, path: Path, out: &mut FieldSet) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, c) in m {
                let mut p = path.clone();
                p.push(k.clone());
                collect(c, p, out);
            }
        }
        _ => {
            out.insert(path);
        }
    }
}

pub fn get_path<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = v;
    for p in path {
        cur = cur.as_object()?.get(p)?;
    }
    Some(cur)
}

fn remove_path(v: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = v;
    for p in parents {
        match cur.as_object_mut().and_then(|m| m.get_mut(p)) {
            Some(n) => cur = n,
            None => return,
        }
    }
    if let Some(m) = cur.as_object_mut() {
        m.remove(last);
    }
}

fn overlaps(a: &[String], b: &[String]) -> bool {
    let n = a.len().min(b.len());
    a[..n] == b[..n]
}

/// `.spec.holderIdentity` as conflicts name fields.
pub fn dotted(path: &[String]) -> String {
    path.iter().map(|p| format!(".{p}")).collect()
}

/// One `managedFields` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub manager: String,
    /// `Apply` or `Update`.
    pub operation: String,
    pub api_version: String,
    pub time: String,
    pub subresource: String,
    pub fields: FieldSet,
}

impl Entry {
    fn same_owner(&self, manager: &str, operation: &str, subresource: &str) -> bool {
        self.manager == manager && self.operation == operation && self.subresource == subresource
    }
}

fn fields_from_v1(v: &Value, path: Path, out: &mut FieldSet) {
    let Some(m) = v.as_object() else { return };
    if m.is_empty() && !path.is_empty() {
        out.insert(path);
        return;
    }
    for (k, c) in m {
        if let Some(name) = k.strip_prefix("f:") {
            let mut p = path.clone();
            p.push(name.to_string());
            fields_from_v1(c, p, out);
        }
    }
}

fn fields_to_v1(fields: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in fields {
        let mut cur = &mut root;
        for p in path {
            let e = cur.entry(format!("f:{p}")).or_insert_with(|| json!({}));
            cur = e.as_object_mut().expect("fieldsV1 nodes are objects");
        }
    }
    Value::Object(root)
}

/// Reads `metadata.managedFields`.
pub fn entries(obj: &Value) -> Vec<Entry> {
    let Some(list) = obj["metadata"]["managedFields"].as_array() else {
        return Vec::new();
    };
    list.iter()
        .map(|e| {
            let mut fields = FieldSet::new();
            fields_from_v1(&e["fieldsV1"], Vec::new(), &mut fields);
            Entry {
                manager: e["manager"].as_str().unwrap_or_default().to_string(),
                operation: e["operation"].as_str().unwrap_or("Update").to_string(),
                api_version: e["apiVersion"].as_str().unwrap_or_default().to_string(),
                time: e["time"].as_str().unwrap_or_default().to_string(),
                subresource: e["subresource"].as_str().unwrap_or_default().to_string(),
                fields,
            }
        })
        .collect()
}

/// Writes `metadata.managedFields` (entries with no fields are dropped).
pub fn set_entries(obj: &mut Value, list: &[Entry]) {
    let v: Vec<Value> = list
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut m = json!({
                "manager": e.manager,
                "operation": e.operation,
                "apiVersion": e.api_version,
                "time": e.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": fields_to_v1(&e.fields),
            });
            if !e.subresource.is_empty() {
                m["subresource"] = json!(e.subresource);
            }
            m
        })
        .collect();
    if obj.is_object() && !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    if let Some(meta) = obj.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        if v.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), Value::Array(v));
        }
    }
}

/// Who writes and how.
#[derive(Debug, Clone)]
pub struct Writer<'a> {
    pub manager: &'a str,
    pub subresource: &'a str,
    pub api_version: &'a str,
    pub time: &'a str,
    pub scope: Scope,
}

/// Records an Update operation from `old` (None on create) to `new`, in `new`'s managedFields.
pub fn record_update(old: Option<&Value>, new: &mut Value, w: &Writer<'_>) {
    let mut list = old.map(entries).unwrap_or_default();
    let new_leaves = leaves(new, Scope::All);
    let old_leaves = old.map(|o| leaves(o, Scope::All)).unwrap_or_default();
    let changed: FieldSet = new_leaves
        .iter()
        .filter(|p| old.and_then(|o| get_path(o, p)) != get_path(new, p))
        .cloned()
        .collect();
    let removed: Vec<&Path> = old_leaves
        .iter()
        .filter(|p| get_path(new, p).is_none())
        .collect();
    for e in &mut list {
        e.fields.retain(|f| {
            !changed.iter().any(|c| overlaps(c, f)) && !removed.iter().any(|r| overlaps(r, f))
        });
    }
    let scoped: FieldSet = changed
        .intersection(&leaves(new, w.scope))
        .cloned()
        .collect();
    if !scoped.is_empty() {
        match list
            .iter_mut()
            .find(|e| e.same_owner(w.manager, "Update", w.subresource))
        {
            Some(e) => {
                e.fields.extend(scoped);
                e.time = w.time.to_string();
                e.api_version = w.api_version.to_string();
            }
            None => list.push(Entry {
                manager: w.manager.to_string(),
                operation: "Update".into(),
                api_version: w.api_version.to_string(),
                time: w.time.to_string(),
                subresource: w.subresource.to_string(),
                fields: scoped,
            }),
        }
    }
    set_entries(new, &list);
}

/// A field another manager owns that an apply would change: (manager, apiVersion, `.field`).
pub type Conflict = (String, String, String);

fn deep_merge(dst: &mut Value, src: &Value) {
    match (dst, src) {
        (Value::Object(d), Value::Object(s)) => {
            for (k, v) in s {
                if v.is_null() {
                    d.remove(k);
                } else if let Some(existing) = d.get_mut(k)
                    && existing.is_object()
                    && v.is_object()
                {
                    deep_merge(existing, v);
                } else {
                    d.insert(k.clone(), v.clone());
                }
            }
        }
        (d, s) => *d = s.clone(),
    }
}

/// Server-side apply of `applied` onto `live` (None: the object does not exist yet).
/// Returns the merged object with its managedFields, or the conflicts.
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    force: bool,
    w: &Writer<'_>,
) -> Result<Value, Vec<Conflict>> {
    let empty = json!({});
    let live_v = live.unwrap_or(&empty);
    let mut list = entries(live_v);
    let applied_fields = leaves(applied, w.scope);
    let is_self = |e: &Entry| e.same_owner(w.manager, "Apply", w.subresource);
    let mut conflicts = Vec::new();
    let mut conflict_paths: Vec<(usize, Path)> = Vec::new();
    for (i, e) in list.iter().enumerate() {
        // Entries of the same manager never conflict with it (kube-lease-manager renews its own
        // applied lease with patches under the same manager name).
        if is_self(e) || e.manager == w.manager {
            continue;
        }
        for q in &applied_fields {
            if e.fields.iter().any(|f| overlaps(f, q))
                && get_path(live_v, q) != get_path(applied, q)
            {
                conflicts.push((e.manager.clone(), e.api_version.clone(), dotted(q)));
                conflict_paths.push((i, q.clone()));
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflicts);
    }
    for (i, q) in &conflict_paths {
        list[*i].fields.retain(|f| !overlaps(f, q));
    }
    let mut merged = live_v.clone();
    let previous: FieldSet = list
        .iter()
        .find(|e| is_self(e))
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    let others: Vec<&Path> = list
        .iter()
        .filter(|e| !is_self(e))
        .flat_map(|e| e.fields.iter())
        .collect();
    for p in &previous {
        let still_applied = applied_fields.iter().any(|q| overlaps(p, q));
        let owned_elsewhere = others.iter().any(|o| overlaps(o, p));
        if !still_applied && !owned_elsewhere {
            remove_path(&mut merged, p);
        }
    }
    // Only the scope's part of the applied configuration lands.
    let mut scoped = applied.clone();
    if let Some(m) = scoped.as_object_mut() {
        match w.scope {
            Scope::Main => {
                m.remove("status");
            }
            Scope::Status => m.retain(|k, _| k == "status" || k == "apiVersion" || k == "kind"),
            Scope::All => {}
        }
        if let Some(meta) = m.get_mut("metadata").and_then(|x| x.as_object_mut()) {
            meta.retain(|k, _| {
                !SERVER_METADATA.contains(&k.as_str()) || k == "name" || k == "namespace"
            });
        }
    }
    deep_merge(&mut merged, &scoped);
    // Values this apply changed leave Update owners that did not conflict (shared values stay shared).
    let before = live_v;
    for e in list.iter_mut().filter(|e| !is_self(e)) {
        e.fields.retain(|f| {
            !applied_fields
                .iter()
                .any(|q| overlaps(f, q) && get_path(before, q) != get_path(&merged, q))
        });
    }
    match list.iter_mut().find(|e| is_self(e)) {
        Some(e) => {
            e.fields = applied_fields;
            e.time = w.time.to_string();
            e.api_version = w.api_version.to_string();
        }
        None => list.push(Entry {
            manager: w.manager.to_string(),
            operation: "Apply".into(),
            api_version: w.api_version.to_string(),
            time: w.time.to_string(),
            subresource: w.subresource.to_string(),
            fields: applied_fields,
        }),
    }
    set_entries(&mut merged, &list);
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(m: &str) -> Writer<'_> {
        Writer {
            manager: m,
            subresource: "",
            api_version: "v1",
            time: "t",
            scope: Scope::All,
        }
    }

    #[test]
    fn apply_removes_fields_the_manager_no_longer_applies() {
        let a = apply(
            None,
            &json!({"metadata": {"name": "x"}, "data": {"a": "1", "b": "2"}}),
            false,
            &w("m"),
        )
        .unwrap();
        let b = apply(
            Some(&a),
            &json!({"metadata": {"name": "x"}, "data": {"a": "1"}}),
            false,
            &w("m"),
        )
        .unwrap();
        assert_eq!(b["data"], json!({"a": "1"}));
    }

    #[test]
    fn apply_keeps_fields_owned_by_someone_else_and_conflicts_on_change() {
        let a = apply(
            None,
            &json!({"data": {"a": "1", "b": "2"}}),
            false,
            &w("m1"),
        )
        .unwrap();
        // m2 applies the same value of b: shared, no conflict.
        let b = apply(Some(&a), &json!({"data": {"b": "2"}}), false, &w("m2")).unwrap();
        // m1 drops b: it stays because m2 owns it.
        let c = apply(Some(&b), &json!({"data": {"a": "1"}}), false, &w("m1")).unwrap();
        assert_eq!(c["data"], json!({"a": "1", "b": "2"}));
        let err = apply(Some(&c), &json!({"data": {"a": "9"}}), false, &w("m2")).unwrap_err();
        assert_eq!(
            err,
            vec![("m1".to_string(), "v1".to_string(), ".data.a".to_string())]
        );
        let d = apply(Some(&c), &json!({"data": {"a": "9"}}), true, &w("m2")).unwrap();
        assert_eq!(d["data"]["a"], "9");
        let owners: Vec<String> = entries(&d)
            .into_iter()
            .filter(|e| {
                e.fields
                    .contains(&vec!["data".to_string(), "a".to_string()])
            })
            .map(|e| e.manager)
            .collect();
        assert_eq!(owners, vec!["m2".to_string()]);
    }

    #[test]
    fn update_takes_ownership_of_changed_fields() {
        let a = apply(
            None,
            &json!({"spec": {"holder": "a", "renew": 1}}),
            false,
            &w("lm-a"),
        )
        .unwrap();
        let mut b = a.clone();
        b["spec"]["holder"] = Value::Null;
        b["spec"].as_object_mut().unwrap().remove("holder");
        record_update(Some(&a), &mut b, &w("lm-b"));
        // holder was removed: nobody owns it, so another manager can apply it without conflict.
        assert!(
            apply(
                Some(&b),
                &json!({"spec": {"holder": "b"}}),
                false,
                &w("lm-b2")
            )
            .is_ok()
        );
        assert!(apply(Some(&b), &json!({"spec": {"renew": 2}}), false, &w("lm-c")).is_err());
    }
}
