//! Reading kubectl-style YAML manifests (several `---`-separated documents) into typed netwave objects,
//! with errors that name the document and the field. Used by tests, the demo and tools.

use std::fmt;

use kube::Resource;
use serde_json::Value;

use crate::kinds::{AnyInput, Input, InputKind};
use crate::strict::typed;
use crate::{NetworkConfigRevision, NodeNetworkConfig, RevisionInputs};

/// One netwave object read from a manifest.
// An input and a node config are about the same size (a few hundred bytes each); a manifest holds
// a handful of objects, read once: boxing one of them would save nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Manifest {
    /// An admin input (any kind of [`InputKind`]).
    Input(AnyInput),
    Revision(Box<NetworkConfigRevision>),
    NodeConfig(NodeNetworkConfig),
}

impl Manifest {
    pub fn name(&self) -> &str {
        let meta = match self {
            Manifest::Input(o) => o.meta(),
            Manifest::Revision(o) => o.meta(),
            Manifest::NodeConfig(o) => o.meta(),
        };
        meta.name.as_deref().unwrap_or_default()
    }

    /// The object as JSON, as it would be sent to the API server.
    pub fn to_value(&self) -> Value {
        match self {
            Manifest::Input(o) => o.to_value(),
            Manifest::Revision(o) => {
                serde_json::to_value(o).expect("netwave types always serialize")
            }
            Manifest::NodeConfig(o) => {
                serde_json::to_value(o).expect("netwave types always serialize")
            }
        }
    }

    /// The input object, when this is one of kind `K`.
    pub fn input<K: Input>(&self) -> Option<&K> {
        match self {
            Manifest::Input(o) => K::from_any(o),
            _ => None,
        }
    }
}

impl RevisionInputs {
    /// Adds an input object under its name, as the configurator folds it. Any other object is not an
    /// input: the error names it.
    pub fn add(&mut self, m: Manifest) -> Result<(), String> {
        match m {
            Manifest::Input(o) => {
                o.add_to(self);
                Ok(())
            }
            other => Err(format!(
                "{} is not an input object (one of {})",
                other.name(),
                InputKind::ALL
                    .iter()
                    .map(|k| k.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
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
/// documents are skipped; inputs get the defaults their CRD gives ([`crate::defaults`]). Fields the types do not know are errors (a misspelt field must not vanish
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
        let typed_err = |m| err(&location, m);
        let manifest = match kind.as_str() {
            "NetworkConfigRevision" => {
                Manifest::Revision(Box::new(typed(&doc).map_err(typed_err)?))
            }
            "NodeNetworkConfig" => Manifest::NodeConfig(typed(&doc).map_err(typed_err)?),
            other => match InputKind::from_kind(other) {
                Some(k) => {
                    // As the API server would store it.
                    let mut doc = doc;
                    crate::defaults::apply(other, &mut doc);
                    Manifest::Input(AnyInput::from_value(k, &doc).map_err(typed_err)?)
                }
                None => return Err(err(&location, format!("unknown kind {other:?}"))),
            },
        };
        if manifest.name().is_empty() {
            return Err(err(&location, "metadata.name is missing".into()));
        }
        out.push(manifest);
    }
    Ok(out)
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
