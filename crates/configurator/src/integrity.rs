//! Specs that are not what the configurator wrote (DESIGN §2: a revision's spec is immutable and
//! content-addressed; a node's spec is the configurator's alone).
//!
//! ```text
//!  NetworkConfigRevision ─ core::revision::verify(name, spec.hash, spec.inputs) ─┐
//!  NodeNetworkConfig ───── core::render::config_hash(spec.config) == configHash ─┴─► Findings
//! ```
//!
//! The CRD's CEL rule refuses edits of a revision's `spec.hash` and `spec.inputs` where the API server
//! enforces it; nothing refuses an edit of a NodeNetworkConfig's spec. What the reconcile does with the
//! findings (put back, never render, report) is in `reconcile::compute`.
//!
//! Hashing every spec on every reconcile would cost a fleet-sized sha256 per reconcile, so verdicts are
//! kept per object and recomputed only when its `metadata.generation` (bumped on every spec change) or
//! uid changes.

use std::collections::{BTreeMap, BTreeSet};

use kube::Resource;
use netwave_core::render;
use netwave_core::revision::{self, Tampered};

use crate::reconcile::Snapshot;

/// What identifies one version of an object's spec: uid, generation, and the resourceVersion where the
/// server keeps no generation.
type SpecVersion = (Option<String>, Option<i64>, Option<String>);

fn spec_version<K: Resource>(o: &K) -> SpecVersion {
    let m = o.meta();
    let rv = if m.generation.is_none() {
        m.resource_version.clone()
    } else {
        None
    };
    (m.uid.clone(), m.generation, rv)
}

struct Verdict<T> {
    version: SpecVersion,
    verdict: T,
    /// An Event was emitted for this version of the spec.
    reported: bool,
}

/// Verdicts per object name, kept between reconciles.
#[derive(Default)]
pub struct IntegrityCache {
    revisions: BTreeMap<String, Verdict<Option<Tampered>>>,
    /// `true`: `spec.config` does not hash to `spec.configHash`.
    node_configs: BTreeMap<String, Verdict<bool>>,
}

/// Tampered specs in one snapshot.
#[derive(Debug, Default, PartialEq)]
pub struct Findings {
    pub revisions: BTreeMap<String, Tampered>,
    /// NodeNetworkConfigs whose `spec.config` does not hash to their `spec.configHash`.
    pub node_configs: BTreeSet<String>,
    /// Of `revisions`, the ones not reported yet for their current spec (an Event is due).
    pub unreported_revisions: BTreeSet<String>,
    /// Of `node_configs`, the ones not reported yet for their current spec.
    pub unreported_node_configs: BTreeSet<String>,
}

/// The verdict on `name`'s current spec, computed only when the spec changed since the last check, and
/// whether the caller has not reported it yet (it is marked reported now).
fn check_one<'a, T>(
    cache: &'a mut BTreeMap<String, Verdict<T>>,
    name: &str,
    version: SpecVersion,
    compute: impl FnOnce() -> T,
) -> (&'a T, bool) {
    if cache.get(name).is_none_or(|e| e.version != version) {
        let fresh = Verdict {
            version,
            verdict: compute(),
            reported: false,
        };
        cache.insert(name.to_string(), fresh);
    }
    let e = cache
        .get_mut(name)
        .expect("present: inserted above if missing");
    let due = !std::mem::replace(&mut e.reported, true);
    (&e.verdict, due)
}

impl IntegrityCache {
    /// Checks every revision and node config in `s`, rehashing only specs that changed. What it returns
    /// as unreported counts as reported from now on: the caller emits the Events.
    pub fn check(&mut self, s: &Snapshot) -> Findings {
        let mut out = Findings::default();
        let mut seen = BTreeSet::new();
        for r in &s.revisions {
            let Some(name) = r.metadata.name.as_deref() else {
                continue;
            };
            seen.insert(name);
            let (verdict, due) =
                check_one(&mut self.revisions, name, spec_version(r.as_ref()), || {
                    revision::verify(name, &r.spec.hash, &r.spec.inputs).err()
                });
            if let Some(t) = verdict {
                out.revisions.insert(name.to_string(), t.clone());
                if due {
                    out.unreported_revisions.insert(name.to_string());
                }
            }
        }
        self.revisions.retain(|n, _| seen.contains(n.as_str()));
        let mut seen = BTreeSet::new();
        for c in &s.node_configs {
            let Some(name) = c.metadata.name.as_deref() else {
                continue;
            };
            seen.insert(name);
            let (tampered, due) = check_one(
                &mut self.node_configs,
                name,
                spec_version(c.as_ref()),
                // A placeholder holds no config to guard (and no agent applies one); a config the
                // cache verified on arrival was dropped from it (`watch::slim_node_config`).
                || {
                    let verified = c
                        .metadata
                        .annotations
                        .as_ref()
                        .is_some_and(|a| a.contains_key(crate::watch::CONFIG_VERIFIED));
                    !c.spec.is_placeholder()
                        && !verified
                        && render::config_hash(&c.spec.config) != c.spec.config_hash
                },
            );
            if *tampered {
                out.node_configs.insert(name.to_string());
                if due {
                    out.unreported_node_configs.insert(name.to_string());
                }
            }
        }
        self.node_configs.retain(|n, _| seen.contains(n.as_str()));
        out
    }
}
