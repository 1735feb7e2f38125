//! A node is failed by a timeout on a fresh read, never on a cache that is behind (DESIGN.md §3
//! **Failure**: API latency is never a node failure).
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

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::StreamExt;
use kube::{Api, Client};
use netwave_api::vocab::node_reasons::{APPLY_TIMEOUT, PICKUP_TIMEOUT};
use netwave_api::{NetworkConfigRevision, NodeNetworkConfig};
use netwave_core::rollout::Plan;
use tracing::warn;

use crate::snapshot::Snapshot;

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
