//! Reading kubectl-style YAML manifests (several `---`-separated documents) into typed netwave objects,
//! with errors that name the document and the field. Used by tests, the demo and tools.

use std::fmt;

use kube::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::{
    BGPPeering, Layer2NetworkConfiguration, MirrorSelector, MirrorTarget, NamedBgpPeering,
    NamedLayer2, NamedMirrorSelector, NamedMirrorTarget, NamedRoutingTable, NamedVrf,
    NetworkConfigRevision, NodeNetworkConfig, RevisionInputs, RoutingTable, VRFRouteConfiguration,
};

/// One netwave object read from a manifest.
#[derive(Clone, Debug, PartialEq)]
pub enum Manifest {
    Vrf(VRFRouteConfiguration),
    Layer2(Layer2NetworkConfiguration),
    RoutingTable(RoutingTable),
    BgpPeering(BGPPeering),
    MirrorTarget(MirrorTarget),
    MirrorSelector(MirrorSelector),
    Revision(Box<NetworkConfigRevision>),
    NodeConfig(NodeNetworkConfig),
}

impl Manifest {
    pub fn name(&self) -> &str {
        let meta = match self {
            Manifest::Vrf(o) => o.meta(),
            Manifest::Layer2(o) => o.meta(),
            Manifest::RoutingTable(o) => o.meta(),
            Manifest::BgpPeering(o) => o.meta(),
            Manifest::MirrorTarget(o) => o.meta(),
            Manifest::MirrorSelector(o) => o.meta(),
            Manifest::Revision(o) => o.meta(),
            Manifest::NodeConfig(o) => o.meta(),
        };
        meta.name.as_deref().unwrap_or_default()
    }

    /// The object as JSON, as it would be sent to the API server.
    pub fn to_value(&self) -> Value {
        let v = match self {
            Manifest::Vrf(o) => serde_json::to_value(o),
            Manifest::Layer2(o) => serde_json::to_value(o),
            Manifest::RoutingTable(o) => serde_json::to_value(o),
            Manifest::BgpPeering(o) => serde_json::to_value(o),
            Manifest::MirrorTarget(o) => serde_json::to_value(o),
            Manifest::MirrorSelector(o) => serde_json::to_value(o),
            Manifest::Revision(o) => serde_json::to_value(o),
            Manifest::NodeConfig(o) => serde_json::to_value(o),
        };
        v.expect("netwave types always serialize")
    }
}

impl RevisionInputs {
    /// Adds an input object (a VRF, a layer-2 segment, a routing table, a BGP peering, a mirror target or selector) under its name, as the
    /// configurator folds it. Any other object is not an input: the error names it.
    pub fn add(&mut self, m: Manifest) -> Result<(), String> {
        let name = m.name().to_string();
        match m {
            Manifest::Vrf(o) => self.vrfs.push(NamedVrf { name, spec: o.spec }),
            Manifest::Layer2(o) => self.layer2s.push(NamedLayer2 { name, spec: o.spec }),
            Manifest::RoutingTable(o) => self
                .routing_tables
                .push(NamedRoutingTable { name, spec: o.spec }),
            Manifest::BgpPeering(o) => self
                .bgp_peerings
                .push(NamedBgpPeering { name, spec: o.spec }),
            Manifest::MirrorTarget(o) => self
                .mirror_targets
                .push(NamedMirrorTarget { name, spec: o.spec }),
            Manifest::MirrorSelector(o) => self
                .mirror_selectors
                .push(NamedMirrorSelector { name, spec: o.spec }),
            Manifest::Revision(_) | Manifest::NodeConfig(_) => {
                return Err(format!(
                    "{name} is not an input object (VRF, layer-2 segment, routing table, BGP peering, mirror target or selector)"
                ));
            }
        }
        Ok(())
    }
}

/// What is wrong with a manifest, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestError {
    /// `<source> document <n>` (1-based), plus `kind/name` once known.
    pub location: String,
    pub message: String,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.location, self.message)
    }
}

impl std::error::Error for ManifestError {}

/// Parses every document of `yaml`. `source` (e.g. a file name) prefixes error locations. Empty
/// documents are skipped. Fields the types do not know are errors (a misspelt field must not vanish
/// silently), as with `kubectl apply`'s strict field validation.
pub fn parse_manifests(source: &str, yaml: &str) -> Result<Vec<Manifest>, ManifestError> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).map_err(|e| ManifestError {
        location: source.to_string(),
        message: format!("not valid YAML: {e}"),
    })?;
    let mut out = Vec::new();
    for (i, doc) in docs.into_iter().enumerate() {
        if doc.is_null() {
            continue;
        }
        let mut location = format!("{source} document {}", i + 1);
        let err = |location: &str, message: String| ManifestError {
            location: location.into(),
            message,
        };
        let kind = doc
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let api_version = doc
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if let Some(name) = doc.pointer("/metadata/name").and_then(Value::as_str) {
            location = format!("{location} ({kind}/{name})");
        }
        let want = format!("{}/{}", crate::GROUP, crate::VERSION);
        if api_version != want {
            return Err(err(
                &location,
                format!("apiVersion is {api_version:?}, want {want:?}"),
            ));
        }
        let manifest = match kind.as_str() {
            "VRFRouteConfiguration" => Manifest::Vrf(typed(&doc).map_err(|m| err(&location, m))?),
            "Layer2NetworkConfiguration" => {
                Manifest::Layer2(typed(&doc).map_err(|m| err(&location, m))?)
            }
            "RoutingTable" => Manifest::RoutingTable(typed(&doc).map_err(|m| err(&location, m))?),
            "BGPPeering" => Manifest::BgpPeering(typed(&doc).map_err(|m| err(&location, m))?),
            "MirrorTarget" => Manifest::MirrorTarget(typed(&doc).map_err(|m| err(&location, m))?),
            "MirrorSelector" => {
                Manifest::MirrorSelector(typed(&doc).map_err(|m| err(&location, m))?)
            }
            "NetworkConfigRevision" => {
                Manifest::Revision(Box::new(typed(&doc).map_err(|m| err(&location, m))?))
            }
            "NodeNetworkConfig" => {
                Manifest::NodeConfig(typed(&doc).map_err(|m| err(&location, m))?)
            }
            other => return Err(err(&location, format!("unknown kind {other:?}"))),
        };
        if manifest.name().is_empty() {
            return Err(err(&location, "metadata.name is missing".into()));
        }
        out.push(manifest);
    }
    Ok(out)
}

/// Deserializes `doc` and rejects fields the type does not have.
fn typed<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<T, String> {
    let object: T = serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&object).map_err(|e| e.to_string())?;
    if let Some(path) = unknown_field(doc, &back, String::new()) {
        return Err(format!("unknown field {path}"));
    }
    Ok(object)
}

/// The first field path present (and not null) in `input` but absent from `known`.
fn unknown_field(input: &Value, known: &Value, path: String) -> Option<String> {
    match (input, known) {
        (Value::Object(i), Value::Object(k)) => i.iter().find_map(|(key, value)| {
            let p = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            match k.get(key) {
                None if !value.is_null() => Some(p),
                None => None,
                Some(kv) => unknown_field(value, kv, p),
            }
        }),
        (Value::Array(i), Value::Array(k)) => i
            .iter()
            .zip(k)
            .enumerate()
            .find_map(|(n, (iv, kv))| unknown_field(iv, kv, format!("{path}[{n}]"))),
        _ => None,
    }
}

/// The sample manifests shipped in `deploy/samples/`, embedded: the default set the demo rolls out.
pub const SAMPLES: [(&str, &str); 3] = [
    (
        "deploy/samples/vrfs.yaml",
        include_str!("../../../deploy/samples/vrfs.yaml"),
    ),
    (
        "deploy/samples/layer2.yaml",
        include_str!("../../../deploy/samples/layer2.yaml"),
    ),
    (
        "deploy/samples/routing-tables.yaml",
        include_str!("../../../deploy/samples/routing-tables.yaml"),
    ),
];

/// Every object in [`SAMPLES`].
pub fn samples() -> Result<Vec<Manifest>, ManifestError> {
    let mut out = Vec::new();
    for (file, yaml) in SAMPLES {
        out.extend(parse_manifests(file, yaml)?);
    }
    Ok(out)
}
