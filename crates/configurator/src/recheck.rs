//! Verdicts taken on a fresh read, never on a cache that is behind.
//!
//! A node is failed by a timeout only on a fresh read (DESIGN.md §3 **Failure**: API latency is
//! never a node failure):
//!
//! ```text
//!   plan fails node N by PickupTimeout / ApplyTimeout, and no stored status says so yet
//!     ▼ GET N's NodeNetworkConfig (a quorum read: no resourceVersion)
//!     ├─ same resourceVersion as the snapshot ─────► the cache was current: the failure stands
//!     └─ another one (the watch is behind) ────────► decide again on the snapshot with the fresh
//!                                                    objects in it (once; its answer stands)
//! ```
//!
//! A saturated API server (kube-apiserver at 15,000 nodes on 2 cores, #28) delivers watch events
//! seconds late: a node whose agent's `Provisioning` or verdict is already stored would be failed by
//! its timeout, and enough of them fail the revision. The fresh read costs one GET per
//! node about to fail by a timeout, once (the next plan finds the failure on record). An agent that
//! keeps writing its status so that the cache is always behind does not escape its failure: the
//! decision taken again on its fresh object fails it all the same if it never reported on the attempt.
//!
//! A revision's inputs are judged gone the same way:
//!
//! ```text
//!   integrity check: revision R's inputs missing past the grace (a new verdict)
//!     ▼ GET R's inputs, then R
//!     ├─ inputs 404, R there as cached ───► gone: put back, reported, counted
//!     ├─ inputs there, or R gone ─────────► decide again with the fresh objects (the inputs' watch
//!     │                                     is behind, or R's deletion is on its way)
//!     └─ a read fails ────────────────────► no verdict: nothing decided, asked again in a second
//! ```
//!
//! Each watch backs off on its own after an API server outage (up to 30 s): the revisions' watch may
//! deliver a revision cut after the restart while the inputs' watch still waits to re-list. Judged on
//! the cache, the revision's inputs read as deleted by someone: a `SpecTampered` Event, a put-back and
//! the `NetwaveSpecTampered` alert for nothing. The history limit deletes a revision, then its inputs,
//! and the two watches may deliver the deletions in either order: the same false verdict for an
//! instant. The inputs are read first: a revision and its inputs deleted between the two reads read as
//! both gone, never as a revision without inputs.
//!
//! And a revision is cut (or an older one reactivated) only from inputs the API server confirms:
//!
//! ```text
//!   the plan cuts or reactivates a revision for inputs hash H (the cache's view)
//!     ▼ LIST every input kind (quorum reads: no resourceVersion), fold and hash them
//!     ├─ H ───────────────► the cache was current: cut
//!     ├─ another hash ────► some watch is behind (or an edit just landed): no cut; the watches
//!     │                     catch up, the settle window starts again on what they bring
//!     └─ a read fails ────► no cut, asked again in a second
//! ```
//!
//! Each kind has its own watch, and after an API server restart each relists on its own backoff: one
//! kind's cache can be seconds older than another's. Cut from such a view, a revision brings back an
//! object deleted seconds before (a routing table removed for its bad blackhole, back with the next VNI
//! change), or drops one just created. A cut is rare (once per settled change), so its reads cost
//! nothing a rollout notices.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::StreamExt;
use kube::api::ListParams;
use kube::core::{DynamicObject, TypeMeta};
use kube::{Api, Client, ResourceExt};
use netwave_api::kinds::{AnyInput, ByKind, InputKind, Objects};
use netwave_api::vocab::node_reasons::{APPLY_TIMEOUT, PICKUP_TIMEOUT};
use netwave_api::{NetworkConfigInputs, NetworkConfigRevision, NodeNetworkConfig};
use netwave_core::revision::Tampered;
use netwave_core::rollout::Plan;
use tracing::warn;

use crate::integrity::Findings;
use crate::snapshot::{FreshRevision, Snapshot};

/// Node configs read at once.
const CONCURRENT_READS: usize = 32;

/// The nodes `plan` fails by a timeout that the stored status of that revision does not name yet.
pub fn new_timeouts(s: &Snapshot, plan: &Plan) -> BTreeSet<String> {
    let stored = |revision: &str| -> Option<&NetworkConfigRevision> {
        s.revisions
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(revision))
            .map(AsRef::as_ref)
    };
    let mut out = BTreeSet::new();
    for u in &plan.status_updates {
        let known = stored(&u.revision)
            .and_then(|r| r.status.as_ref())
            .map(|st| &st.failed_nodes);
        for f in &u.status.failed_nodes {
            let timeout = f.reason == PICKUP_TIMEOUT || f.reason == APPLY_TIMEOUT;
            if timeout && !known.is_some_and(|k| k.iter().any(|k| k.node == f.node)) {
                out.insert(f.node.clone());
            }
        }
    }
    out
}

/// The named node configs as the API server has them now (`None`: there is none), slimmed as the
/// watch slims them. A read that fails or does not decode is left out: the cache's view stands.
pub async fn read_fresh(
    client: Client,
    names: BTreeSet<String>,
) -> Vec<(String, Option<Arc<NodeNetworkConfig>>)> {
    let api: Api<NodeNetworkConfig> = Api::all(client);
    let read = |name: String| {
        let api = api.clone();
        async move {
            match api.get_opt(&name).await {
                Ok(found) => Some((
                    name,
                    found.map(|mut nnc| {
                        crate::watch::slim_fresh_node_config(&mut nnc);
                        Arc::new(nnc)
                    }),
                )),
                Err(e) => {
                    warn!(
                        node = %name, error = %e,
                        "could not read a node config again before failing it by a timeout; the \
                         cache's view stands"
                    );
                    None
                }
            }
        }
    };
    futures::stream::iter(names.into_iter().map(read))
        .buffer_unordered(CONCURRENT_READS)
        .filter_map(std::future::ready)
        .collect()
        .await
}

/// The revisions whose inputs `found` newly judges gone: to be confirmed on a fresh read.
pub fn new_inputs_gone(found: &Findings) -> BTreeSet<String> {
    found
        .unreported_revisions
        .iter()
        .filter(|n| matches!(found.revisions.get(*n), Some(Tampered::InputsGone { .. })))
        .cloned()
        .collect()
}

/// Reads the named revisions' inputs, then the revisions (in that order: see the module's doc), as
/// the watches would deliver them. Any read that fails fails the whole answer.
pub async fn read_revisions(
    client: Client,
    names: &BTreeSet<String>,
) -> Result<Vec<FreshRevision>, kube::Error> {
    let revisions: Api<NetworkConfigRevision> = Api::all(client.clone());
    let inputs: Api<NetworkConfigInputs> = Api::all(client);
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let fresh_inputs = inputs.get_opt(name).await?.map(|mut i| {
            i.metadata.managed_fields = None;
            Arc::new(i)
        });
        let revision = revisions.get_opt(name).await?.map(Arc::new);
        out.push(FreshRevision {
            name: name.clone(),
            revision,
            inputs: fresh_inputs,
        });
    }
    Ok(out)
}

/// Why [`read_inputs`] could not confirm the inputs.
#[derive(Debug)]
pub struct ReadFailed {
    pub message: String,
    /// The failed request's `netwave_api_errors_total` category, when a request failed.
    pub category: Option<&'static str>,
}

/// Every input kind as the API server has it now (a quorum LIST per kind: no resourceVersion), to
/// confirm the view a revision is cut from. An object that does not decode fails the read (a cut
/// waits for such an object anyway).
pub async fn read_inputs(client: &Client) -> Result<ByKind<Objects>, ReadFailed> {
    let mut fresh = ByKind::<Objects>::default();
    let undecodable = |message: String| ReadFailed {
        message,
        category: None,
    };
    for &kind in InputKind::ALL {
        let resource = kind.api_resource();
        let api = Api::<DynamicObject>::all_with(client.clone(), &resource);
        let list = (api.list(&ListParams::default()).await).map_err(|e| ReadFailed {
            message: format!("listing {kind}: {e}"),
            category: Some(crate::writer::category(&e)),
        })?;
        // What is being deleted is folded into nothing (`snapshot::live`).
        let live = list.items.into_iter();
        for mut o in live.filter(|o| o.metadata.deletion_timestamp.is_none()) {
            o.types.get_or_insert_with(|| TypeMeta {
                api_version: resource.api_version.clone(),
                kind: resource.kind.clone(),
            });
            let name = o.name_any();
            let value =
                serde_json::to_value(o).map_err(|e| undecodable(format!("{kind} {name}: {e}")))?;
            let any = AnyInput::from_api(kind, value)
                .map_err(|e| undecodable(format!("{kind} {name}: {e}")))?;
            fresh.push(any);
        }
    }
    Ok(fresh)
}

/// The kinds whose live objects (by name and resourceVersion) differ between `cached` and `fresh`,
/// with how many objects differ: what the message names.
pub fn lagging_kinds(cached: &ByKind<Objects>, fresh: &ByKind<Objects>) -> BTreeMap<String, usize> {
    let versions = |table: &ByKind<Objects>| -> BTreeSet<(String, String, String)> {
        (table.views().into_iter())
            .filter(|v| v.meta.deletion_timestamp.is_none())
            .map(|v| {
                let name = v.meta.name.clone().unwrap_or_default();
                let rv = v.meta.resource_version.clone().unwrap_or_default();
                (v.kind.to_string(), name, rv)
            })
            .collect()
    };
    let (cached, fresh) = (versions(cached), versions(fresh));
    let differ: BTreeSet<(&String, &String)> = (cached.symmetric_difference(&fresh))
        .map(|(kind, name, _)| (kind, name))
        .collect();
    let mut kinds = BTreeMap::new();
    for (kind, _) in differ {
        *kinds.entry(kind.clone()).or_insert(0) += 1;
    }
    kinds
}
