//! Server-side apply of a status that still lands under an older CRD.
//!
//! A structural schema prunes unknown fields from a merge patch, but a server-side apply that names a
//! field the CRD does not declare fails as a whole ("failed to create typed patch object …:
//! .status.agentFeatures: field not declared in schema", HTTP 500). During a downgrade the older CRDs
//! are installed while this release's agents and configurators still write (the cluster-version
//! operator's rollback failure): [`apply_status`] leaves such fields out and applies the rest, so
//! every status stays writable.

use std::fmt::Debug;

use kube::Api;
use kube::api::{Patch, PatchParams};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// What the API server says about a field its schema lacks.
const UNDECLARED: &str = ": field not declared in schema";

/// Applies `patch` (a whole object: apiVersion, kind, status) to `name`'s status subresource. Fields
/// the CRD does not declare are removed and the apply made again (at most a few times); the paths
/// removed come back with the object, so the caller can say so once. `along` pairs a field with one
/// that must go with it: `(a, b)` removes `b` too when `a` is undeclared, for a field whose meaning
/// changed in the same CRD release (the node config's `conditions`, atomic and the configurator's
/// before `observedGeneration` came with its map of per-writer entries: applied under the older CRD,
/// the agent's forced apply would take the whole list over).
pub async fn apply_status<K>(
    api: &Api<K>,
    name: &str,
    params: &PatchParams,
    mut patch: Value,
    along: &[(&str, &str)],
) -> Result<(K, Vec<String>), kube::Error>
where
    K: Clone + DeserializeOwned + Debug,
{
    let mut dropped = Vec::new();
    for _ in 0..4 {
        match api.patch_status(name, params, &Patch::Apply(&patch)).await {
            Ok(obj) => return Ok((obj, dropped)),
            Err(kube::Error::Api(ae)) => {
                let mut undeclared = undeclared_fields(&ae.message);
                let with: Vec<String> = (along.iter())
                    .filter(|(a, _)| undeclared.iter().any(|u| u == a))
                    .map(|(_, b)| b.to_string())
                    .collect();
                undeclared.extend(with);
                let removed: Vec<String> = undeclared
                    .into_iter()
                    .filter(|p| remove_path(&mut patch, p))
                    .collect();
                if removed.is_empty() {
                    return Err(kube::Error::Api(ae));
                }
                dropped.extend(removed);
            }
            Err(e) => return Err(e),
        }
    }
    api.patch_status(name, params, &Patch::Apply(&patch))
        .await
        .map(|obj| (obj, dropped))
}

/// The field paths (`.status.agentFeatures`) an API server error names as not declared.
pub fn undeclared_fields(message: &str) -> Vec<String> {
    let mut parts: Vec<&str> = message.split(UNDECLARED).collect();
    parts.pop();
    parts
        .into_iter()
        .filter_map(|before| before.rsplit([' ', '\n', '\t']).next())
        .filter(|p| p.starts_with('.'))
        .map(str::to_string)
        .collect()
}

/// Removes the field at `path` (`.status.a.b`; plain keys only) from `v`; false if it is not there or
/// the path goes through a list.
fn remove_path(v: &mut Value, path: &str) -> bool {
    let keys: Vec<&str> = path.trim_start_matches('.').split('.').collect();
    if keys
        .iter()
        .any(|k| k.is_empty() || k.contains(['[', ']', '=']))
    {
        return false;
    }
    let Some((last, parents)) = keys.split_last() else {
        return false;
    };
    let mut cur = v;
    for k in parents {
        match cur.get_mut(*k) {
            Some(next) => cur = next,
            None => return false,
        }
    }
    cur.as_object_mut()
        .is_some_and(|o| o.remove(*last).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The message kube-apiserver v1.37 returned to a 0.2.0 agent under the 0.1.0 CRD (tests/skew.rs).
    const SEEN: &str = "failed to create typed patch object (/; netwave.dev/v1alpha1, \
                        Kind=NodeNetworkConfig): .status.agentFeatures: field not declared in schema";

    #[test]
    fn the_fields_an_older_schema_lacks_are_found_and_only_they_are_removed() {
        assert_eq!(undeclared_fields(SEEN), [".status.agentFeatures"]);
        let two = "failed to create typed patch object (…): errors:\n  .status.a: field not declared \
                   in schema\n  .status.b.c: field not declared in schema";
        assert_eq!(undeclared_fields(two), [".status.a", ".status.b.c"]);
        assert!(undeclared_fields("etcdserver: request is too large").is_empty());

        let mut patch = json!({"kind": "NodeNetworkConfig",
                               "status": {"phase": "Provisioned", "agentFeatures": ["ruleFwmark"]}});
        assert!(remove_path(&mut patch, ".status.agentFeatures"));
        assert_eq!(
            patch,
            json!({"kind": "NodeNetworkConfig", "status": {"phase": "Provisioned"}})
        );
        assert!(!remove_path(&mut patch, ".status.agentFeatures"), "gone");
        assert!(!remove_path(&mut patch, ".status.probes[name=\"x\"].ok"));
    }
}
