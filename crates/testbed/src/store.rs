//! The in-memory state: objects per resource, the global resourceVersion and a bounded event
//! history that watches read from. No I/O and no HTTP here.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Value, json};

use crate::resources::{Registry, ResourceType};

/// A stored object: its JSON text (what GET, LIST and WATCH send, without re-serializing) and the
/// few fields selectors and garbage collection need. Keeping text rather than `serde_json::Value`
/// trees costs several times less memory per object.
#[derive(Debug, Clone)]
pub struct Object {
    pub json: Bytes,
    pub name: String,
    pub namespace: Option<String>,
    pub api_version: String,
    pub uid: String,
    pub labels: Vec<(String, String)>,
    /// uids of the ownerReferences.
    pub owners: Vec<String>,
}

impl Object {
    pub fn from_value(v: &Value) -> Object {
        let meta = &v["metadata"];
        let s = |x: &Value| x.as_str().unwrap_or_default().to_string();
        Object {
            json: Bytes::from(serde_json::to_vec(v).expect("JSON values serialize")),
            name: s(&meta["name"]),
            namespace: meta["namespace"].as_str().map(String::from),
            api_version: s(&v["apiVersion"]),
            uid: s(&meta["uid"]),
            labels: meta["labels"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                        .collect()
                })
                .unwrap_or_default(),
            owners: meta["ownerReferences"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|r| r["uid"].as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    /// The object as a JSON tree (parsed on demand).
    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.json).expect("stored objects are valid JSON")
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Kind of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, kept in the history for watches.
#[derive(Debug, Clone)]
pub struct Event {
    pub rv: u64,
    /// `group/plural` of the object.
    pub resource: Arc<str>,
    pub kind: EventType,
    pub object: Arc<Object>,
    /// The object before a modification (selector transitions need it).
    pub prev: Option<Arc<Object>>,
}

/// `ns/name` or `name`.
pub fn object_key(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    }
}

/// The whole state behind one lock.
#[derive(Debug)]
pub struct Store {
    pub registry: Registry,
    objects: HashMap<String, BTreeMap<String, Arc<Object>>>,
    rv: u64,
    history: VecDeque<Event>,
    /// Watches from a resourceVersion below this get 410 Gone.
    compacted: u64,
    history_limit: usize,
    uid_seed: u64,
}

impl Store {
    pub fn new(history_limit: usize) -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            | 1;
        Store {
            registry: Registry::with_builtins(),
            objects: HashMap::new(),
            rv: 1,
            history: VecDeque::new(),
            compacted: 1,
            history_limit: history_limit.max(1),
            uid_seed: seed,
        }
    }

    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    pub fn compacted(&self) -> u64 {
        self.compacted
    }

    /// A random-looking RFC 4122 v4 uid.
    pub fn new_uid(&mut self) -> String {
        let mut next = || {
            // xorshift64*
            let mut x = self.uid_seed;
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            self.uid_seed = x;
            x.wrapping_mul(0x2545F4914F6CDD1D)
        };
        let (a, b) = (next(), next());
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            (a >> 32) as u32,
            (a >> 16) as u16,
            a as u16 & 0x0fff,
            ((b >> 48) as u16 & 0x3fff) | 0x8000,
            b & 0xffff_ffff_ffff
        )
    }

    /// Short random suffix for `generateName`.
    pub fn random_suffix(&mut self) -> String {
        let uid = self.new_uid();
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        uid.bytes()
            .filter(|b| b.is_ascii_hexdigit())
            .take(5)
            .map(|b| ALPHABET[b as usize % ALPHABET.len()] as char)
            .collect()
    }

    pub fn get(&self, rt: &ResourceType, key: &str) -> Option<Arc<Object>> {
        self.objects
            .get(&rt.storage_key())
            .and_then(|m| m.get(key))
            .cloned()
    }

    /// Objects of a resource in key order, optionally in one namespace, starting after `after`.
    pub fn range<'a>(
        &'a self,
        rt: &ResourceType,
        namespace: Option<&'a str>,
        after: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a String, &'a Arc<Object>)> + 'a {
        let map = self.objects.get(&rt.storage_key());
        let prefix = namespace.map(|ns| format!("{ns}/"));
        map.into_iter().flat_map(move |m| {
            let start = match (after, &prefix) {
                (Some(a), _) => std::ops::Bound::Excluded(a.to_string()),
                (None, Some(p)) => std::ops::Bound::Included(p.clone()),
                (None, None) => std::ops::Bound::Unbounded,
            };
            let prefix = prefix.clone();
            m.range((start, std::ops::Bound::Unbounded))
                .take_while(move |(k, _)| match &prefix {
                    Some(p) => k.starts_with(p.as_str()),
                    None => true,
                })
        })
    }

    pub fn count(&self, rt: &ResourceType) -> usize {
        self.objects.get(&rt.storage_key()).map_or(0, |m| m.len())
    }

    fn bump(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn record(&mut self, ev: Event) {
        self.history.push_back(ev);
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted = old.rv;
            }
        }
    }

    /// Stores `obj` under `key` with a fresh resourceVersion; records ADDED or MODIFIED.
    pub fn put(&mut self, rt: &ResourceType, key: &str, mut obj: Value) -> Arc<Object> {
        let rv = self.bump();
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let obj = Arc::new(Object::from_value(&obj));
        let prev = self
            .objects
            .entry(rt.storage_key())
            .or_default()
            .insert(key.to_string(), obj.clone());
        let kind = if prev.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.record(Event {
            rv,
            resource: rt.storage_key().into(),
            kind,
            object: obj.clone(),
            prev,
        });
        obj
    }

    /// Removes an object; records DELETED carrying the final state at a fresh resourceVersion.
    pub fn remove(&mut self, rt: &ResourceType, key: &str) -> Option<Arc<Object>> {
        let old = self.objects.get_mut(&rt.storage_key())?.remove(key)?;
        let rv = self.bump();
        let mut last = old.value();
        last["metadata"]["resourceVersion"] = json!(rv.to_string());
        let last = Arc::new(Object::from_value(&last));
        self.record(Event {
            rv,
            resource: rt.storage_key().into(),
            kind: EventType::Deleted,
            object: last.clone(),
            prev: Some(old),
        });
        Some(last)
    }

    /// Drops every object of a resource (its CRD went away).
    pub fn drop_resource(&mut self, rt: &ResourceType) {
        let keys: Vec<String> = self
            .objects
            .get(&rt.storage_key())
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        for k in keys {
            self.remove(rt, &k);
        }
        self.objects.remove(&rt.storage_key());
    }

    /// Events after `rv` (at most `max`), or Err(compacted) when `rv` is older than the history.
    /// A resourceVersion from the future (a client of an earlier server instance) is treated like
    /// a compacted one, so that clients relist instead of waiting for versions that never come.
    pub fn events_after(&self, rv: u64, max: usize) -> Result<Vec<Event>, u64> {
        if rv < self.compacted || rv > self.rv {
            return Err(self.compacted);
        }
        let start = self.history.partition_point(|e| e.rv <= rv);
        Ok(self.history.iter().skip(start).take(max).cloned().collect())
    }

    /// Forgets the whole history: every watch or continue from an older resourceVersion gets 410.
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.rv;
    }

    /// Every object of every resource (for garbage collection and namespace deletion).
    pub fn all_objects(&self) -> Vec<(String, String, Arc<Object>)> {
        let mut out = Vec::new();
        for (rk, m) in &self.objects {
            for (k, v) in m {
                out.push((rk.clone(), k.clone(), v.clone()));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm_type(st: &Store) -> Arc<ResourceType> {
        st.registry.get("/configmaps").unwrap()
    }

    #[test]
    fn versions_are_global_and_history_is_bounded() {
        let mut st = Store::new(3);
        let rt = cm_type(&st);
        let start = st.resource_version();
        for i in 0..5 {
            st.put(
                &rt,
                &format!("default/c{i}"),
                json!({"metadata": {"name": format!("c{i}"), "namespace": "default"}}),
            );
        }
        assert_eq!(st.resource_version(), start + 5);
        // Only the last 3 events are kept: resuming from before them is refused.
        assert!(st.events_after(start, 10).is_err());
        let evs = st.events_after(start + 2, 10).unwrap();
        assert_eq!(
            evs.iter().map(|e| e.rv).collect::<Vec<_>>(),
            vec![start + 3, start + 4, start + 5]
        );
        assert!(
            st.events_after(start + 99, 10).is_err(),
            "a version from the future"
        );
        let removed = st.remove(&rt, "default/c0").unwrap();
        assert_eq!(
            removed.value()["metadata"]["resourceVersion"],
            json!((start + 6).to_string())
        );
        let last = st.events_after(start + 5, 10).unwrap();
        assert_eq!(last[0].kind, EventType::Deleted);
        st.compact();
        assert!(st.events_after(start + 5, 10).is_err());
        assert!(
            st.events_after(st.resource_version(), 10)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn ranges_stay_inside_a_namespace_and_resume_after_a_key() {
        let mut st = Store::new(100);
        let rt = cm_type(&st);
        for key in ["a/x", "a/y", "b/x", "ab/z"] {
            let (ns, name) = key.split_once('/').unwrap();
            st.put(
                &rt,
                key,
                json!({"metadata": {"name": name, "namespace": ns}}),
            );
        }
        let keys = |ns: Option<&str>, after: Option<&str>| -> Vec<String> {
            st.range(&rt, ns, after).map(|(k, _)| k.clone()).collect()
        };
        assert_eq!(keys(Some("a"), None), vec!["a/x", "a/y"]);
        assert_eq!(keys(Some("a"), Some("a/x")), vec!["a/y"]);
        assert_eq!(keys(None, Some("a/y")), vec!["ab/z", "b/x"]);
        let uids: std::collections::HashSet<String> = (0..100).map(|_| st.new_uid()).collect();
        assert_eq!(uids.len(), 100);
    }
}
