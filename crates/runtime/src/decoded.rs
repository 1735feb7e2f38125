//! Watches that one object the Rust types cannot decode does not break (DESIGN.md §6, "One bad object
//! never blinds the fleet").
//!
//! ```text
//!   list / watch JSON ─► Decoded<K>::deserialize ─┬─ K decodes ──────► Decoded::Object(K)
//!                                                 └─ it does not ───► Decoded::Undecodable { metadata,
//!                                                                       error naming the field path }
//! ```
//!
//! A typed `watcher::<K>` fails the whole list (and every relist) when one item does not decode: an
//! agent that wrote an out-of-range integer into its own NodeNetworkConfig status, or an object stored
//! before a schema bound existed, stopped the configurator from rolling out anything. Watching
//! `Decoded<K>` instead keeps such an object in the cache with its metadata and the decode error, so
//! the shell can report it and decide what skipping it means; everything else decodes as before.

use std::borrow::Cow;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// A watched object: `K`, or what is known of one that does not decode as `K`.
#[derive(Debug)]
pub enum Decoded<K> {
    Object(Arc<K>),
    Undecodable(Arc<Undecodable>),
}

/// An object whose JSON does not decode as its Rust type.
#[derive(Clone, Debug, PartialEq)]
pub struct Undecodable {
    pub metadata: ObjectMeta,
    /// The field path and serde's error, e.g. `status.observedRetry: invalid value: integer
    /// `4294967296`, expected u32`.
    pub error: String,
}

impl<K> Clone for Decoded<K> {
    fn clone(&self) -> Self {
        match self {
            Decoded::Object(k) => Decoded::Object(k.clone()),
            Decoded::Undecodable(u) => Decoded::Undecodable(u.clone()),
        }
    }
}

impl<K> Decoded<K> {
    pub fn object(&self) -> Option<&Arc<K>> {
        match self {
            Decoded::Object(k) => Some(k),
            Decoded::Undecodable(_) => None,
        }
    }

    pub fn undecodable(&self) -> Option<&Arc<Undecodable>> {
        match self {
            Decoded::Object(_) => None,
            Decoded::Undecodable(u) => Some(u),
        }
    }
}

impl<K: Clone> Decoded<K> {
    /// Applies `f` to a decoded object (for `WatchStreamExt::modify`: the object was just decoded, so
    /// nothing else holds it and nothing is copied); an undecodable one loses its managed fields.
    pub fn modify(&mut self, f: impl FnOnce(&mut K)) {
        match self {
            Decoded::Object(k) => f(Arc::make_mut(k)),
            Decoded::Undecodable(u) => Arc::make_mut(u).metadata.managed_fields = None,
        }
    }
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Decoded<K> {
    /// Reads the object's JSON once as text (lists and watch events are parsed by serde_json, which
    /// hands a nested value over as text), then decodes it as `K`. Only when that fails is it read again
    /// for the field path and the metadata. (A watch event must name its `type` before its `object`, as
    /// kube-apiserver and the testbed write them: serde buffers an object that comes first, and a
    /// buffered value is no longer text.)
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(d)?;
        match serde_json::from_str::<K>(raw.get()) {
            Ok(k) => Ok(Decoded::Object(Arc::new(k))),
            Err(_) => {
                #[derive(Deserialize)]
                struct Meta {
                    #[serde(default)]
                    metadata: ObjectMeta,
                }
                // The API server validates metadata itself: an object whose metadata does not decode
                // has no name to report, so that one still fails.
                let Meta { metadata } =
                    serde_json::from_str(raw.get()).map_err(D::Error::custom)?;
                Ok(Decoded::Undecodable(Arc::new(Undecodable {
                    metadata,
                    error: decode_error::<K>(raw.get()),
                })))
            }
        }
    }
}

/// Why `json` does not decode as `K`: the field path, then serde's message without its position in
/// the JSON text (which says nothing to someone reading the object with kubectl).
pub fn decode_error<K: DeserializeOwned>(json: &str) -> String {
    decode_error_at::<K>("", json)
}

/// [`decode_error`] for an object found at `at` (a field path such as `spec.config`) in the object it
/// belongs to: the path it names is the whole path from there.
pub fn decode_error_at<K: DeserializeOwned>(at: &str, json: &str) -> String {
    let mut de = serde_json::Deserializer::from_str(json);
    match serde_path_to_error::deserialize::<_, K>(&mut de) {
        Ok(_) => String::new(),
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.into_inner();
            let text = inner.to_string();
            let position = format!(" at line {} column {}", inner.line(), inner.column());
            let message = text.strip_suffix(&position).unwrap_or(&text);
            let path = match (at, path.as_str()) {
                (at, ".") => at.to_string(),
                ("", path) => path.to_string(),
                (at, path) => format!("{at}.{path}"),
            };
            if path.is_empty() {
                message.to_string()
            } else {
                format!("{path}: {message}")
            }
        }
    }
}

impl<K: Resource<DynamicType = ()> + Clone> Resource for Decoded<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }
    fn api_version(dt: &()) -> Cow<'_, str> {
        K::api_version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        match self {
            Decoded::Object(k) => k.meta(),
            Decoded::Undecodable(u) => &u.metadata,
        }
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Decoded::Object(k) => Arc::make_mut(k).meta_mut(),
            Decoded::Undecodable(u) => &mut Arc::make_mut(u).metadata,
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::core::{ObjectList, WatchEvent};

    use super::Decoded;

    /// A stand-in for a CRD type with a `u32` field in its status.
    #[derive(Clone, Debug, serde::Deserialize)]
    struct Thing {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        #[serde(default)]
        status: Option<ThingStatus>,
    }
    #[derive(Clone, Debug, serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct ThingStatus {
        observed_retry: Option<u32>,
    }

    fn item(name: &str, retry: u64) -> String {
        format!(
            r#"{{"metadata":{{"name":"{name}","uid":"u-{name}"}},"status":{{"observedRetry":{retry}}}}}"#
        )
    }

    /// The rule: one item that does not decode leaves the rest of a list, and the list itself, intact;
    /// it is kept with its name and the field path of the error.
    #[test]
    fn one_undecodable_item_does_not_fail_the_list() {
        let list = format!(
            r#"{{"apiVersion":"v1","kind":"List","metadata":{{"resourceVersion":"7"}},"items":[{},{},{}]}}"#,
            item("a", 1),
            item("bad", 4294967296),
            item("c", 3)
        );
        assert!(
            serde_json::from_str::<ObjectList<Thing>>(&list).is_err(),
            "a typed list fails on the bad item (what blinded the configurator)"
        );
        let decoded: ObjectList<Decoded<Thing>> = serde_json::from_str(&list).unwrap();
        let good: Vec<_> = decoded
            .items
            .iter()
            .filter_map(|d| d.object())
            .map(|t| {
                let retry = t.status.as_ref().and_then(|s| s.observed_retry);
                (t.metadata.name.clone().unwrap(), retry)
            })
            .collect();
        assert_eq!(good, [("a".into(), Some(1)), ("c".into(), Some(3))]);
        let bad = decoded.items[1]
            .undecodable()
            .expect("kept, as undecodable");
        assert_eq!(bad.metadata.name.as_deref(), Some("bad"));
        assert_eq!(bad.metadata.uid.as_deref(), Some("u-bad"));
        assert_eq!(
            bad.error,
            "status.observedRetry: invalid value: integer `4294967296`, expected u32"
        );
    }

    #[test]
    fn a_watch_event_with_an_undecodable_object_is_delivered() {
        let ev = format!(r#"{{"type":"MODIFIED","object":{}}}"#, item("bad", 1 << 40));
        match serde_json::from_str::<WatchEvent<Decoded<Thing>>>(&ev).unwrap() {
            WatchEvent::Modified(Decoded::Undecodable(u)) => {
                assert_eq!(u.metadata.name.as_deref(), Some("bad"));
                assert!(u.error.starts_with("status.observedRetry: "), "{}", u.error);
            }
            other => panic!("{other:?}"),
        }
        let ok = format!(r#"{{"type":"ADDED","object":{}}}"#, item("a", 1));
        let ev = serde_json::from_str::<WatchEvent<Decoded<Thing>>>(&ok).unwrap();
        assert!(matches!(ev, WatchEvent::Added(Decoded::Object(_))));
    }

    /// Built-in kinds decode through the wrapper as well (the agent and configurator watch them the
    /// same way).
    #[test]
    fn a_decodable_object_is_the_object() {
        let cm =
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"},"data":{"k":"v"}}"#;
        let d: Decoded<ConfigMap> = serde_json::from_str(cm).unwrap();
        assert_eq!(d.object().unwrap().data.as_ref().unwrap()["k"], "v");
    }
}
