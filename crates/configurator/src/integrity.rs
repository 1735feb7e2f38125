//! Specs that are not what the configurator wrote (DESIGN §2: a revision's spec is immutable and
//! content-addressed; a node's spec is the configurator's alone).
//!
//! ```text
//!  NetworkConfigRevision ─┬ core::revision::verify(name, spec.hash, inputs) ──────┐
//!  NetworkConfigInputs ───┘ (same name; gone for longer than INPUTS_GRACE: gone) ─┤
//!  NodeNetworkConfig ───── core::render::config_hash(spec.config) == configHash ───┴─► Findings
//! ```
//!
//! The CRDs' CEL rules refuse edits of a revision's `spec.hash` and of its inputs where the API server
//! enforces them; nothing refuses a deletion of the inputs or an edit of a NodeNetworkConfig's spec.
//! Inputs missing from the cache are judged gone only once a fresh read confirms it
//! (`crate::recheck`): after an outage, the inputs' watch may come back later than the revisions'.
//! What the reconcile does with the findings (put back, never render, report) is in
//! `decide::compute`.
//!
//! Hashing every spec on every reconcile would cost a fleet-sized sha256 per reconcile, so verdicts are
//! kept per object and recomputed only when its `metadata.generation` (bumped on every spec change) or
//! uid changes. Node configs are hashed once as they arrive instead (`watch::slim_node_config`), and
//! one that passes is marked in this process's cache only: the mark is removed from whatever the API
//! delivers, so no write to the API can switch the check off.
//!
//! What the checksums protect against, and what not. They are no signature: `configHash` is a sha256
//! of `spec.config` anyone can recompute, and a revision's name and hash are computed from its inputs
//! the same way. They catch a spec changed without its hash: a hand edit (`kubectl edit`, a merge
//! patch of one field), a tool or an older configurator writing part of an object, an object restored
//! from a stale backup. An edit that also rewrites the hash is not seen here: for a node on the target
//! revision the rollout sees a hash other than its render's and assigns the render again (`Rerender`),
//! but its agent may apply the edited config first. What keeps anyone else from writing a node's spec
//! is RBAC: only the configurator's service account (and cluster admins) may; the agent's may write
//! its own node config's status and nothing else (deploy/base).

use std::collections::{BTreeMap, BTreeSet};

use kube::Resource;
use netwave_core::revision::{self, Tampered};
use netwave_core::{Timestamp, render};

use crate::snapshot::Snapshot;

/// How long a revision may be seen without its inputs before they count as gone: the configurator
/// writes the inputs right after the revision, and the two watches may deliver them in either order.
pub const INPUTS_GRACE_MS: i64 = 10_000;

/// What identifies one version of an object's spec: uid, generation, and the resourceVersion where the
/// server keeps no generation.
type SpecVersion = (Option<String>, Option<i64>, Option<String>);

/// A revision's spec version and its inputs' (`None`: gone).
type RevisionVersion = (SpecVersion, Option<SpecVersion>);

fn spec_version<K: Resource>(o: &K) -> SpecVersion {
    let m = o.meta();
    let rv = if m.generation.is_none() {
        m.resource_version.clone()
    } else {
        None
    };
    (m.uid.clone(), m.generation, rv)
}

struct Verdict<T, V = SpecVersion> {
    version: V,
    verdict: T,
    /// An Event was emitted for this version of the spec.
    reported: bool,
}

/// Verdicts per object name, kept between reconciles.
#[derive(Default)]
pub struct IntegrityCache {
    /// Keyed by the revision's spec version and its inputs' (`None`: gone).
    revisions: BTreeMap<String, Verdict<Option<Tampered>, RevisionVersion>>,
    /// `true`: `spec.config` does not hash to `spec.configHash`. Only configs that hold something
    /// to guard: neither placeholders nor verified on arrival.
    node_configs: BTreeMap<String, Verdict<bool>>,
    /// The snapshot whose node configs were checked last ([`Snapshot::id`]).
    configs_seen: Option<u64>,
}

/// Tampered specs in one snapshot.
#[derive(Debug, Default, PartialEq)]
pub struct Findings {
    pub revisions: BTreeMap<String, Tampered>,
    /// Revisions younger than [`INPUTS_GRACE_MS`] whose inputs have not arrived yet: neither tampered
    /// nor renderable until they do.
    pub awaiting_inputs: BTreeSet<String>,
    /// NodeNetworkConfigs whose `spec.config` does not hash to their `spec.configHash`.
    pub node_configs: BTreeSet<String>,
    /// Of `revisions`, the ones not reported yet for their current spec (an Event is due).
    pub unreported_revisions: BTreeSet<String>,
    /// Of `node_configs`, the ones not reported yet for their current spec.
    pub unreported_node_configs: BTreeSet<String>,
}

/// The verdict on `name`'s current spec, computed only when the spec changed since the last check, and
/// whether the caller has not reported it yet (it is marked reported now).
fn check_one<'a, T, V: PartialEq>(
    cache: &'a mut BTreeMap<String, Verdict<T, V>>,
    name: &str,
    version: V,
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
    /// Checks every revision (with its inputs) and node config in `s`, rehashing only specs that
    /// changed. What it returns as unreported counts as reported from now on: the caller emits the
    /// Events.
    pub fn check(&mut self, s: &Snapshot, now: Timestamp) -> Findings {
        let mut out = Findings::default();
        let mut seen = BTreeSet::new();
        for r in &s.revisions {
            let Some(name) = r.metadata.name.as_deref() else {
                continue;
            };
            seen.insert(name);
            let inputs = s.inputs_object(name);
            if inputs.is_none() && !inputs_overdue(r.as_ref(), now) {
                out.awaiting_inputs.insert(name.to_string());
                continue;
            }
            let version = (spec_version(r.as_ref()), inputs.map(spec_version));
            let (verdict, due) = check_one(&mut self.revisions, name, version, || match inputs {
                Some(i) => revision::verify(name, &r.spec.hash, &i.spec).err(),
                None => Some(Tampered::InputsGone {
                    name: name.to_string(),
                }),
            });
            if let Some(t) = verdict {
                out.revisions.insert(name.to_string(), t.clone());
                if due {
                    out.unreported_revisions.insert(name.to_string());
                }
            }
        }
        self.revisions.retain(|n, _| seen.contains(n.as_str()));
        match s.changed_since(self.configs_seen.replace(s.id)) {
            Some(changed) => {
                for name in &changed.node_configs {
                    if !s.node_config(name).is_some_and(|c| self.check_config(c)) {
                        self.node_configs.remove(name.as_str());
                    }
                }
            }
            None => {
                let mut guarded = BTreeSet::new();
                for c in &s.node_configs {
                    if self.check_config(c) {
                        guarded.insert(c.metadata.name.as_deref().unwrap_or_default());
                    }
                }
                self.node_configs
                    .retain(|n, _| guarded.contains(n.as_str()));
            }
        }
        for (name, v) in &mut self.node_configs {
            if v.verdict {
                out.node_configs.insert(name.clone());
                if !std::mem::replace(&mut v.reported, true) {
                    out.unreported_node_configs.insert(name.clone());
                }
            }
        }
        out
    }

    /// Makes what `found` reported as new due again: the outcome it came with is dropped (decided
    /// again on a fresh read, or not at all), and so are its Events.
    pub fn not_reported(&mut self, found: &Findings) {
        for name in &found.unreported_revisions {
            if let Some(v) = self.revisions.get_mut(name) {
                v.reported = false;
            }
        }
        for name in &found.unreported_node_configs {
            if let Some(v) = self.node_configs.get_mut(name) {
                v.reported = false;
            }
        }
    }

    /// Judges one node config, again only if its spec changed since; whether it holds something to
    /// guard (else it has no verdict).
    fn check_config(&mut self, c: &netwave_api::NodeNetworkConfig) -> bool {
        let Some(name) = c.metadata.name.as_deref() else {
            return false;
        };
        // A placeholder holds no config to guard (and no agent applies one); a config the cache
        // verified on arrival was dropped from it (`watch::slim_node_config`). Nearly every node
        // config is one of these: nothing is kept for them (at 5,000 nodes, keeping a verdict per
        // config was a tenth of a reconcile's compute), and one put back loses its old verdict.
        let verified = c
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(crate::watch::CONFIG_VERIFIED));
        if c.spec.is_placeholder() || verified {
            return false;
        }
        let version = spec_version(c);
        if self
            .node_configs
            .get(name)
            .is_none_or(|v| v.version != version)
        {
            let fresh = Verdict {
                version,
                verdict: render::config_hash(&c.spec.config) != c.spec.config_hash,
                reported: false,
            };
            self.node_configs.insert(name.to_string(), fresh);
        }
        true
    }
}

/// Whether a revision has been without its inputs for longer than [`INPUTS_GRACE_MS`] (counted from
/// its creation; one without a creation time is judged at once).
fn inputs_overdue(r: &netwave_api::NetworkConfigRevision, now: Timestamp) -> bool {
    r.metadata
        .creation_timestamp
        .as_ref()
        .is_none_or(|t| now.0 - t.0.as_millisecond() > INPUTS_GRACE_MS)
}
