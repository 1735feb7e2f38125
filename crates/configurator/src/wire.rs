//! A NodeNetworkConfig as the configurator's watch reads it off the wire (#28).
//!
//! Every agent report is a watch event that carries the whole object: its managed fields (every field
//! of the spec, as server-side apply tracks it) and its `spec.config` (the node's rendered config,
//! about 4 KB of JSON with the samples). The cache keeps neither ([`crate::watch`]). Decoding them
//! only to drop them was half of a standby's CPU and most of what a leader spends on its watches in
//! a rollout at 5,000 nodes (perf profiles: managed fields 17 %, the config most of the rest).
//!
//! [`WireNodeConfig`] reads the object with its managed fields skipped and its config kept as text;
//! [`WireNodeConfig::into_typed`] then decodes the config, or leaves it out when the caller already
//! knows the spec (the watch's record of verified specs). Everything else decodes as the typed
//! [`NodeNetworkConfig`] does: the same types, the same field paths in errors.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::Resource;
use netwave_api::{NodeConfig, NodeNetworkConfig, NodeNetworkConfigSpec, NodeNetworkConfigStatus};
use netwave_runtime::decoded::{Decoded, Undecodable, decode_error_at};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// A NodeNetworkConfig with its managed fields left out and its `spec.config` not yet decoded.
#[derive(Clone, Debug, Deserialize)]
pub struct WireNodeConfig {
    #[serde(deserialize_with = "without_managed_fields")]
    metadata: ObjectMeta,
    spec: WireSpec,
    #[serde(default)]
    status: Option<NodeNetworkConfigStatus>,
}

/// [`NodeNetworkConfigSpec`] with its config as JSON text.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireSpec {
    revision: String,
    sequence: u64,
    config_hash: String,
    #[serde(default)]
    retry: u32,
    config: Box<RawValue>,
}

/// [`ObjectMeta`]'s fields but `managedFields`, which is skipped unread.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireMeta {
    annotations: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    self_link: Option<String>,
    uid: Option<String>,
}

fn without_managed_fields<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let m = WireMeta::deserialize(d)?;
    // Every field named: a field k8s-openapi adds to ObjectMeta fails to compile here.
    Ok(ObjectMeta {
        annotations: m.annotations,
        creation_timestamp: m.creation_timestamp,
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        deletion_timestamp: m.deletion_timestamp,
        finalizers: m.finalizers,
        generate_name: m.generate_name,
        generation: m.generation,
        labels: m.labels,
        managed_fields: None,
        name: m.name,
        namespace: m.namespace,
        owner_references: m.owner_references,
        resource_version: m.resource_version,
        self_link: m.self_link,
        uid: m.uid,
    })
}

impl WireNodeConfig {
    pub fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    pub fn config_hash(&self) -> &str {
        &self.spec.config_hash
    }

    pub fn is_placeholder(&self) -> bool {
        self.spec.revision.is_empty()
    }

    /// The typed object. With `skip_config` its `spec.config` is left empty unread (the caller knows
    /// this spec already); otherwise a config that does not decode makes the object undecodable, with
    /// the field path from the object (`spec.config.vrfs[0].vni: ...`), as the typed decode names it.
    pub fn into_typed(self, skip_config: bool) -> Decoded<NodeNetworkConfig> {
        let config = if skip_config {
            NodeConfig::default()
        } else {
            match serde_json::from_str(self.spec.config.get()) {
                Ok(c) => c,
                Err(_) => {
                    return Decoded::Undecodable(Arc::new(Undecodable {
                        error: decode_error_at::<NodeConfig>("spec.config", self.spec.config.get()),
                        metadata: self.metadata,
                    }));
                }
            }
        };
        let WireSpec {
            revision,
            sequence,
            config_hash,
            retry,
            config: _,
        } = self.spec;
        let mut nnc = NodeNetworkConfig::new(
            "",
            NodeNetworkConfigSpec {
                revision,
                sequence,
                config_hash,
                retry,
                config,
            },
        );
        nnc.metadata = self.metadata;
        nnc.status = self.status;
        Decoded::Object(Arc::new(nnc))
    }
}

impl Resource for WireNodeConfig {
    type DynamicType = ();
    type Scope = <NodeNetworkConfig as Resource>::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        NodeNetworkConfig::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        NodeNetworkConfig::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        NodeNetworkConfig::version(dt)
    }
    fn api_version(dt: &()) -> Cow<'_, str> {
        NodeNetworkConfig::api_version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        NodeNetworkConfig::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use netwave_api::{NodeConfig, NodeNetworkConfig};
    use netwave_runtime::decoded::Decoded;
    use serde_json::{Value, json};

    use super::WireNodeConfig;

    /// A node config as the API server sends it, with managed fields and a status.
    fn object(vni: Value, observed_retry: Value) -> String {
        json!({
            "apiVersion": "netwave.dev/v1alpha1",
            "kind": "NodeNetworkConfig",
            "metadata": {
                "name": "node-1", "uid": "u1", "generation": 3, "resourceVersion": "42",
                "creationTimestamp": "2026-11-27T00:00:00Z",
                "labels": {"a": "b"},
                "annotations": {"netwave.dev/assigned-at": "2026-11-27T00:00:01Z"},
                "finalizers": ["x"],
                "managedFields": [{
                    "manager": "netwave-configurator", "operation": "Apply",
                    "apiVersion": "netwave.dev/v1alpha1", "time": "2026-11-27T00:00:01Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"f:config": {"f:vrfs": {}}, "f:revision": {}}}
                }]
            },
            "spec": {
                "revision": "rev-1", "sequence": 7, "configHash": "abc", "retry": 2,
                "config": {"vrfs": [
                    {"name": "blue", "device": "vr-blue", "table": 100, "vni": vni, "mtu": 9000}
                ]}
            },
            "status": {"observedRevision": "rev-1", "observedRetry": observed_retry,
                       "phase": "Provisioned"}
        })
        .to_string()
    }

    fn typed(text: &str) -> Decoded<NodeNetworkConfig> {
        serde_json::from_str(text).expect("decodes, or is kept as undecodable")
    }

    fn wire(text: &str) -> Decoded<WireNodeConfig> {
        serde_json::from_str(text).expect("decodes, or is kept as undecodable")
    }

    /// The object the cache gets is the typed decode, but the managed fields it drops anyway; with
    /// the config skipped, the same but an empty config.
    #[test]
    fn a_wire_config_is_the_typed_object_without_its_managed_fields() {
        let text = object(json!(100), json!(2));
        let mut expected = (*typed(&text).object().expect("decodes").clone()).clone();
        assert!(
            expected.metadata.managed_fields.is_some(),
            "the fixture has some"
        );
        expected.metadata.managed_fields = None;
        let w = wire(&text).object().expect("decodes").as_ref().clone();
        let read = |w: WireNodeConfig, skip| w.into_typed(skip).object().expect("decodes").clone();
        assert_eq!(*read(w.clone(), false), expected);

        let skipped = read(w, true).as_ref().clone();
        assert_eq!(skipped.spec.config, NodeConfig::default());
        expected.spec.config = NodeConfig::default();
        assert_eq!(skipped, expected);
    }

    /// A bad config or a bad status is undecodable with the error the typed decode gives: the field
    /// path from the object.
    #[test]
    fn an_undecodable_config_names_the_same_field_path() {
        let bad_config = object(json!(1u64 << 40), json!(2));
        let want = typed(&bad_config)
            .undecodable()
            .expect("undecodable")
            .error
            .clone();
        assert_eq!(
            want,
            "spec.config.vrfs[0].vni: invalid value: integer `1099511627776`, expected u32"
        );
        let w = wire(&bad_config)
            .object()
            .expect("the config is text")
            .as_ref()
            .clone();
        let got = w.clone().into_typed(false);
        let got = got.undecodable().expect("the config does not decode");
        assert_eq!(got.error, want);
        assert_eq!(got.metadata.name.as_deref(), Some("node-1"));
        assert!(got.metadata.managed_fields.is_none());
        // Skipped, a config is not read at all (the caller knows this very spec).
        assert!(w.into_typed(true).object().is_some());

        let bad_status = object(json!(100), json!(-1));
        let want = typed(&bad_status)
            .undecodable()
            .expect("undecodable")
            .error
            .clone();
        assert!(want.starts_with("status.observedRetry: "), "{want}");
        let got = wire(&bad_status);
        assert_eq!(got.undecodable().expect("undecodable").error, want);
    }
}
