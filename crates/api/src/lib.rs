//! netwave's Kubernetes resources, group `netwave.dev`, version `v1alpha1`, all cluster-scoped.
//!
//! ```text
//!  admins edit                      configurator writes                agent writes
//!  VRFRouteConfiguration ┐
//!  Layer2NetworkConfig.  ├─ fold ─► NetworkConfigRevision ─ render ─► NodeNetworkConfig.spec
//!  RoutingTable          │          (content hash,                    NodeNetworkConfig.status
//!  BGPPeering            │           rollout status)
//!  MirrorTarget          │
//!  MirrorSelector        ┘
//!                                   + NetworkConfigInputs, same name
//!                                    (the immutable snapshot)
//! ```
//!
//! This crate holds the types, the CRDs generated from them ([`crds`]) and the per-object semantic
//! validation a schema cannot express ([`validate`]). Fleet-wide rules live in `netwave-core`.

// kube-derive's repeated `printcolumn(type_ = …)` attributes look duplicated to clippy; they are not.
#![allow(clippy::duplicated_attributes)]

pub mod bounds;
pub mod cel;
pub mod datetimes;
pub mod defaults;
pub mod features;
pub mod input_status;
pub mod inputs;
mod integers;
pub mod kinds;
pub mod manifest;
pub mod rollout;
pub mod strict;
#[cfg(feature = "testing")]
pub mod testing;
pub mod validate;
pub mod vocab;

pub use inputs::*;
pub use kinds::{AnyInput, ByKind, Input, InputKind};
pub use rollout::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// API group of every netwave resource.
pub const GROUP: &str = "netwave.dev";
/// API version of every netwave resource.
pub const VERSION: &str = "v1alpha1";

/// Every netwave CRD with the file name it is committed under in `crds/`.
pub fn crds() -> Vec<(String, CustomResourceDefinition)> {
    generated()
        .into_iter()
        .map(|(file, crd)| {
            let crd = datetimes::strict(integers::bounded(crd));
            (file, cel::with_rules(crd))
        })
        .collect()
}

/// The CRDs as kube-derive and schemars generate them from the types, before [`crds`] adds integer
/// bounds, date-time patterns and CEL rules: every input kind's (`<plural>.yaml`), then the rollout's.
fn generated() -> Vec<(String, CustomResourceDefinition)> {
    struct Inputs(Vec<(String, CustomResourceDefinition)>);
    impl kinds::Visit for Inputs {
        fn visit<K: Input>(&mut self) {
            self.0.push((format!("{}.yaml", K::plural(&())), K::crd()));
        }
    }
    let mut inputs = Inputs(Vec::new());
    kinds::each_kind(&mut inputs);
    let rollout = [
        ("networkconfigrevisions.yaml", NetworkConfigRevision::crd()),
        ("networkconfiginputs.yaml", NetworkConfigInputs::crd()),
        ("nodenetworkconfigs.yaml", NodeNetworkConfig::crd()),
    ];
    (inputs.0.into_iter())
        .chain(rollout.map(|(file, crd)| (file.to_string(), crd)))
        .collect()
}

/// The YAML committed for a CRD: a generated-file header, then the object.
/// The file name of [`crds_kustomization`] in `crds/`.
pub const CRDS_KUSTOMIZATION: &str = "Kustomization";

/// `crds/Kustomization`: the CRDs as a kustomize resource directory, so the install (`deploy/`) includes
/// them and `kubectl apply -k crds/` installs them alone. Named `Kustomization` (a name kustomize reads)
/// rather than `kustomization.yaml` so that `kubectl apply -f crds/`, which reads every `.yaml` file,
/// finds only CRDs and exits 0.
pub fn crds_kustomization() -> String {
    let mut out = String::from(
        "# Generated from crates/api by `make crds`. Do not edit.\n\
         apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n",
    );
    for (file, _) in crds() {
        out.push_str(&format!("  - {file}\n"));
    }
    out
}

pub fn crd_yaml(crd: &CustomResourceDefinition) -> String {
    let body = serde_saphyr::to_string(crd).expect("a CRD always serializes to YAML");
    format!("# Generated from crates/api by `make crds`. Do not edit.\n{body}")
}
