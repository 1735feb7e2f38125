//! `metadata.managedFields` and server-side apply.
//!
//! Field ownership is tracked per entry (manager, operation, subresource) as a set of leaf paths,
//! stored as `FieldsV1`. Path elements are `f:<field>` or, inside associative lists
//! (`x-kubernetes-list-type: map`, and Node `status.conditions`/`status.addresses`),
//! `k:{"<key>":<value>}`. Other lists are atomic (owned as a whole).
//!
//! - Update operations (create, replace, patches) give the writer the fields whose values it
//!   changed and take them from every other entry; removed fields leave every entry.
//! - Apply compares the applied configuration with the other entries: a field another manager owns
//!   whose value the apply would change is a conflict (409 unless `force`, which moves ownership).
//!   Fields this manager applied before and omits now are removed unless another entry owns them;
//!   associative-list elements left without owned fields go with them.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

/// A field path: `f:spec`, `f:conditions`, `k:{"type":"Ready"}`, `f:status`, ...
pub type Path = Vec<String>;
/// A set of owned leaf paths.
pub type FieldSet = BTreeSet<Path>;

/// Associative lists of a resource: field paths (list elements as `*`) and their key fields.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListTypes(pub Vec<(Vec<String>, Vec<String>)>);

impl ListTypes {
    fn keys(&self, path: &[String]) -> Option<&[String]> {
        let fields: Vec<&str> = path
            .iter()
            .map(|p| p.strip_prefix("f:").unwrap_or("*"))
            .collect();
        self.0
            .iter()
            .find(|(p, _)| p.len() == fields.len() && p.iter().zip(&fields).all(|(a, b)| a == b))
            .map(|(_, k)| k.as_slice())
    }

    /// Reads `x-kubernetes-list-type: map` lists from an openAPIV3Schema.
    pub fn from_schema(schema: &Value) -> Self {
        let mut out = Vec::new();
        walk_schema(schema, &mut Vec::new(), &mut out);
        ListTypes(out)
    }
}

fn walk_schema(s: &Value, path: &mut Vec<String>, out: &mut Vec<(Vec<String>, Vec<String>)>) {
    if let Some(props) = s["properties"].as_object() {
        for (k, v) in props {
            path.push(k.clone());
            walk_schema(v, path, out);
            path.pop();
        }
    }
    if s["x-kubernetes-list-type"] == "map"
        && let Some(keys) = s["x-kubernetes-list-map-keys"].as_array()
    {
        out.push((
            path.clone(),
            keys.iter()
                .filter_map(|k| k.as_str().map(String::from))
                .collect(),
        ));
    }
    if s["items"].is_object() {
        path.push("*".into());
        walk_schema(&s["items"], path, out);
        path.pop();
    }
}

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

fn f(name: &str) -> String {
    format!("f:{name}")
}

/// The `k:{...}` element of an associative-list item (None: an item without its keys).
fn element_key(item: &Value, keys: &[String]) -> Option<String> {
    let mut m = Map::new();
    let mut sorted: Vec<&String> = keys.iter().collect();
    sorted.sort();
    for k in sorted {
        m.insert(k.clone(), item.get(k)?.clone());
    }
    Some(format!("k:{}", Value::Object(m)))
}

/// The leaf paths of an object inside `scope` (server-managed metadata excluded).
pub fn leaves(obj: &Value, scope: Scope, lists: &ListTypes) -> FieldSet {
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
                        collect(mv, vec![f(k), f(mk)], &mut out, lists);
                    }
                }
            }
            continue;
        }
        collect(v, vec![f(k)], &mut out, lists);
    }
    out
}

fn collect(v: &Value, path: Path, out: &mut FieldSet, lists: &ListTypes) {
    match v {
        // An empty map or associative list sets nothing: it owns no field (and so never
        // conflicts with the fields others own inside it).
        Value::Object(m) if m.is_empty() => {}
        Value::Array(items) if items.is_empty() && lists.keys(&path).is_some() => {}
        Value::Object(m) => {
            for (k, c) in m {
                let mut p = path.clone();
                p.push(f(k));
                collect(c, p, out, lists);
            }
        }
        Value::Array(items) if !items.is_empty() => match lists.keys(&path) {
            Some(keys) if items.iter().all(|i| element_key(i, keys).is_some()) => {
                for item in items {
                    let mut p = path.clone();
                    p.push(element_key(item, keys).expect("checked above"));
                    collect(item, p, out, lists);
                }
            }
            _ => {
                out.insert(path);
            }
        },
        _ => {
            out.insert(path);
        }
    }
}

fn key_matches(item: &Value, key: &str) -> bool {
    let Ok(Value::Object(want)) = serde_json::from_str::<Value>(key) else {
        return false;
    };
    want.iter().all(|(k, v)| item.get(k) == Some(v))
}

pub fn get_path<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = v;
    for p in path {
        cur = match (p.strip_prefix("f:"), p.strip_prefix("k:")) {
            (Some(name), _) => cur.as_object()?.get(name)?,
            (_, Some(key)) => cur.as_array()?.iter().find(|i| key_matches(i, key))?,
            _ => return None,
        };
    }
    Some(cur)
}

fn get_path_mut<'a>(v: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    let mut cur = v;
    for p in path {
        cur = match (p.strip_prefix("f:"), p.strip_prefix("k:")) {
            (Some(name), _) => cur.as_object_mut()?.get_mut(name)?,
            (_, Some(key)) => cur
                .as_array_mut()?
                .iter_mut()
                .find(|i| key_matches(i, key))?,
            _ => return None,
        };
    }
    Some(cur)
}

fn remove_path(v: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let Some(parent) = get_path_mut(v, parents) else {
        return;
    };
    if let Some(name) = last.strip_prefix("f:") {
        if let Some(m) = parent.as_object_mut() {
            m.remove(name);
        }
    } else if let Some(key) = last.strip_prefix("k:")
        && let Some(a) = parent.as_array_mut()
    {
        a.retain(|i| !key_matches(i, key));
    }
}

/// `[.., k:{"type":"Ready"}, f:type]`: a key field of an associative-list item.
fn is_key_field(p: &[String]) -> bool {
    let [.., item, field] = p else { return false };
    match (item.strip_prefix("k:"), field.strip_prefix("f:")) {
        (Some(key), Some(name)) => {
            serde_json::from_str::<Map<String, Value>>(key).is_ok_and(|m| m.contains_key(name))
        }
        _ => false,
    }
}

fn overlaps(a: &[String], b: &[String]) -> bool {
    let n = a.len().min(b.len());
    a[..n] == b[..n]
}

/// `.status.conditions[type="Ready"].status`, as conflicts name fields.
pub fn dotted(path: &[String]) -> String {
    path.iter()
        .map(|p| match (p.strip_prefix("f:"), p.strip_prefix("k:")) {
            (Some(name), _) => format!(".{name}"),
            (_, Some(key)) => {
                let parts: Vec<String> = serde_json::from_str::<Map<String, Value>>(key)
                    .map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect())
                    .unwrap_or_default();
                format!("[{}]", parts.join(","))
            }
            _ => format!(".{p}"),
        })
        .collect()
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
        if k.starts_with("f:") || k.starts_with("k:") || k.starts_with("v:") || k.starts_with("i:")
        {
            let mut p = path.clone();
            p.push(k.clone());
            fields_from_v1(c, p, out);
        }
    }
}

fn fields_to_v1(fields: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in fields {
        let mut cur = &mut root;
        for p in path {
            let e = cur.entry(p.clone()).or_insert_with(|| json!({}));
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
    pub lists: &'a ListTypes,
}

/// Records an Update operation from `old` (None on create) to `new`, in `new`'s managedFields.
pub fn record_update(old: Option<&Value>, new: &mut Value, w: &Writer<'_>) {
    let mut list = old.map(entries).unwrap_or_default();
    let new_leaves = leaves(new, Scope::All, w.lists);
    let old_leaves = old
        .map(|o| leaves(o, Scope::All, w.lists))
        .unwrap_or_default();
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
        .intersection(&leaves(new, w.scope, w.lists))
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

/// Merges an applied configuration into the live object: maps recursively, associative lists
/// item by item (by key), everything else replaced; nulls remove.
fn deep_merge(dst: &mut Value, src: &Value, path: &mut Path, lists: &ListTypes) {
    match (dst, src) {
        (Value::Object(d), Value::Object(s)) => {
            for (k, v) in s {
                path.push(f(k));
                if v.is_null() {
                    d.remove(k);
                } else if let Some(existing) = d.get_mut(k)
                    && ((existing.is_object() && v.is_object())
                        || (existing.is_array() && v.is_array()))
                {
                    deep_merge(existing, v, path, lists);
                } else {
                    d.insert(k.clone(), v.clone());
                }
                path.pop();
            }
        }
        (Value::Array(d), Value::Array(s)) => match lists.keys(path).map(<[String]>::to_vec) {
            Some(keys) => {
                for item in s {
                    let Some(k) = element_key(item, &keys) else {
                        continue;
                    };
                    let key = &k[2..];
                    match d.iter_mut().find(|i| key_matches(i, key)) {
                        Some(existing) => {
                            path.push(k.clone());
                            deep_merge(existing, item, path, lists);
                            path.pop();
                        }
                        None => d.push(item.clone()),
                    }
                }
            }
            None => *d = s.clone(),
        },
        (d, s) => *d = s.clone(),
    }
}

/// A strategic merge patch on a built-in: maps merge, nulls delete, lists with a merge key
/// (the associative lists) merge item by item, other lists are replaced.
pub fn strategic_merge(doc: &mut Value, patch: &Value, lists: &ListTypes) {
    deep_merge(doc, patch, &mut Vec::new(), lists);
}

/// Server-side apply of `applied` onto `live` (None: the object does not exist yet).
/// Returns the merged object with its managedFields, or the conflicts.
///
/// `defaulted` is the applied configuration with schema defaults filled in: values are compared
/// in that form, so defaults inside an atomic list do not make a manifest conflict with itself.
pub fn apply(
    live: Option<&Value>,
    applied: Value,
    defaulted: Option<&Value>,
    force: bool,
    w: &Writer<'_>,
) -> Result<Value, Vec<Conflict>> {
    let cmp = defaulted.unwrap_or(&applied);
    let empty = json!({});
    let live_v = live.unwrap_or(&empty);
    let mut list = entries(live_v);
    let applied_fields = leaves(&applied, w.scope, w.lists);
    // Which applied fields this apply changes (a value compared once, not once per other manager).
    let changes: Vec<bool> = (applied_fields.iter())
        .map(|q| get_path(live_v, q) != get_path(cmp, q))
        .collect();
    let is_self = |e: &Entry| e.same_owner(w.manager, "Apply", w.subresource);
    let mut conflicts = Vec::new();
    let mut conflict_paths: Vec<(usize, Path)> = Vec::new();
    for (i, e) in list.iter().enumerate() {
        // Managers are told apart by name, operation and subresource, as kube-apiserver's
        // identifiers do: an apply conflicts with an Update entry of its own name too.
        if is_self(e) {
            continue;
        }
        for (q, _) in applied_fields.iter().zip(&changes).filter(|(_, c)| **c) {
            if e.fields.iter().any(|f| overlaps(f, q)) {
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
    let mut dropped_items: BTreeSet<Path> = BTreeSet::new();
    for p in &previous {
        let still_applied = applied_fields.iter().any(|q| overlaps(p, q));
        let owned_elsewhere = others.iter().any(|o| overlaps(o, p));
        if !still_applied && !owned_elsewhere {
            // Key fields stay until their item goes (below).
            if !is_key_field(p) {
                remove_path(&mut merged, p);
            }
            // The associative-list item this field was in, if any.
            if let Some(pos) = p.iter().rposition(|e| e.starts_with("k:")) {
                dropped_items.insert(p[..=pos].to_vec());
            }
        }
    }
    // Items nobody owns a field of any more go with their last field.
    for item in dropped_items {
        let owned = applied_fields
            .iter()
            .chain(others.iter().copied())
            .any(|o| o.len() > item.len() && o.starts_with(&item));
        if !owned {
            remove_path(&mut merged, &item);
        }
    }
    // Only the scope's part of the applied configuration lands.
    let mut scoped = applied;
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
    deep_merge(&mut merged, &scoped, &mut Vec::new(), w.lists);
    // Values this apply changed leave owners that did not conflict (shared values stay shared).
    for e in list.iter_mut().filter(|e| !is_self(e)) {
        e.fields.retain(|f| {
            !(applied_fields.iter().zip(&changes)).any(|(q, changed)| *changed && overlaps(f, q))
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

    static NO_LISTS: ListTypes = ListTypes(Vec::new());

    fn ap(
        live: Option<&Value>,
        applied: &Value,
        force: bool,
        w: &Writer<'_>,
    ) -> Result<Value, Vec<Conflict>> {
        apply(live, applied.clone(), None, force, w)
    }

    fn w(m: &str) -> Writer<'_> {
        Writer {
            manager: m,
            subresource: "",
            api_version: "v1",
            time: "t",
            scope: Scope::All,
            lists: &NO_LISTS,
        }
    }

    #[test]
    fn apply_removes_fields_the_manager_no_longer_applies() {
        let a = ap(
            None,
            &json!({"metadata": {"name": "x"}, "data": {"a": "1", "b": "2"}}),
            false,
            &w("m"),
        )
        .unwrap();
        let b = ap(
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
        let a = ap(
            None,
            &json!({"data": {"a": "1", "b": "2"}}),
            false,
            &w("m1"),
        )
        .unwrap();
        // m2 applies the same value of b: shared, no conflict.
        let b = ap(Some(&a), &json!({"data": {"b": "2"}}), false, &w("m2")).unwrap();
        // m1 drops b: it stays because m2 owns it.
        let c = ap(Some(&b), &json!({"data": {"a": "1"}}), false, &w("m1")).unwrap();
        assert_eq!(c["data"], json!({"a": "1", "b": "2"}));
        let err = ap(Some(&c), &json!({"data": {"a": "9"}}), false, &w("m2")).unwrap_err();
        assert_eq!(
            err,
            vec![("m1".to_string(), "v1".to_string(), ".data.a".to_string())]
        );
        let d = ap(Some(&c), &json!({"data": {"a": "9"}}), true, &w("m2")).unwrap();
        assert_eq!(d["data"]["a"], "9");
        let owners: Vec<String> = entries(&d)
            .into_iter()
            .filter(|e| {
                e.fields
                    .contains(&vec!["f:data".to_string(), "f:a".to_string()])
            })
            .map(|e| e.manager)
            .collect();
        assert_eq!(owners, vec!["m2".to_string()]);
    }

    #[test]
    fn update_takes_ownership_of_changed_fields() {
        let a = ap(
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
            ap(
                Some(&b),
                &json!({"spec": {"holder": "b"}}),
                false,
                &w("lm-b2")
            )
            .is_ok()
        );
        assert!(ap(Some(&b), &json!({"spec": {"renew": 2}}), false, &w("lm-c")).is_err());
    }

    #[test]
    fn associative_lists_merge_by_key() {
        let lists = ListTypes(vec![(
            vec!["status".into(), "conditions".into()],
            vec!["type".into()],
        )]);
        let wl = |m: &'static str| Writer {
            lists: &lists,
            ..w(m)
        };
        let kubelet = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let live = ap(None, &kubelet, false, &wl("kubelet")).unwrap();
        let agent = json!({"status": {"conditions": [{"type": "NetworkReady", "status": "True"}]}});
        let both = ap(Some(&live), &agent, false, &wl("agent")).unwrap();
        let types: Vec<&str> = both["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, vec!["Ready", "NetworkReady"]);
        // Changing another manager's item conflicts, naming the item.
        let err = ap(
            Some(&both),
            &json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
            false,
            &wl("agent"),
        )
        .unwrap_err();
        assert_eq!(err[0].2, ".status.conditions[type=\"Ready\"].status");
        // The agent stops applying its item: only that item goes.
        let after = ap(Some(&both), &json!({"status": {}}), false, &wl("agent")).unwrap();
        let types: Vec<&str> = after["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, vec!["Ready"]);
    }
}
