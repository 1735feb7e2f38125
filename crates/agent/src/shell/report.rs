//! Delivery of everything the agent tells the API server: NodeNetworkConfig status, the Node's
//! `NetworkReady` condition and taint removal, Events. Each kind has its own task and the newest value
//! wins, so the main loop (applies, rollbacks, drift repair, shutdown) never waits for the API server.
//! An outage — even one caused by a config the agent then rolled back — delays the reports, never the
//! node's own repair; once the server answers, the latest status arrives.
//!
//! ```text
//!  main loop ─ status(st) ──► watch (latest) ──► status task: SSA status, retried with backoff
//!            ─ network_ready ► watch (latest) ──► node task: NetworkReady condition, then taints
//!            ─ node_changed ─┘
//!            ─ event(ev) ───► bounded queue ───► event task: publish, best effort
//! ```

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, Recorder};
use kube::{Client, ResourceExt};
use netwave_api::{NodeNetworkConfig, NodeNetworkConfigStatus};
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::metrics::Metrics;
use netwave_api::vocab::{ConditionStatus, NodePhase};

/// The field manager of everything the agent writes.
pub const FIELD_MANAGER: &str = netwave_api::vocab::managers::AGENT;
pub use netwave_api::vocab::node_conditions::NETWORK_READY;

/// One API request may take this long before it counts as failed (a black-holed server otherwise holds a
/// request for minutes).
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
const BACKOFF_START: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Events waiting to be published; beyond this the newest are dropped (with a warning).
const EVENT_QUEUE: usize = 64;

/// What the node task should make true on the Node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct NodeWish {
    /// `NetworkReady` (and, when true, our taints removed). `None`: nothing decided yet.
    healthy: Option<bool>,
    /// Bumped when the Node changed (someone may have re-added a taint).
    node_changes: u64,
}

pub struct Reporter {
    status: watch::Sender<Option<(String, NodeNetworkConfigStatus)>>,
    node: watch::Sender<NodeWish>,
    events: mpsc::Sender<(Event, ObjectReference)>,
    tasks: Vec<JoinHandle<()>>,
}

impl Reporter {
    pub fn start(
        client: Client,
        node: String,
        taints: Vec<String>,
        recorder: Recorder,
        metrics: Arc<Metrics>,
    ) -> Reporter {
        let (status, status_rx) = watch::channel(None);
        let (node_tx, node_rx) = watch::channel(NodeWish::default());
        let (events, events_rx) = mpsc::channel(EVENT_QUEUE);
        let tasks = vec![
            tokio::spawn(deliver_status(client.clone(), status_rx, metrics)),
            tokio::spawn(deliver_node(client, node, taints, node_rx)),
            tokio::spawn(deliver_events(recorder, events_rx)),
        ];
        Reporter {
            status,
            node: node_tx,
            events,
            tasks,
        }
    }

    /// Reports `st` on the NodeNetworkConfig `nnc`, replacing any status not yet written.
    pub fn status(&self, nnc: &str, st: NodeNetworkConfigStatus) {
        self.status.send_replace(Some((nnc.to_string(), st)));
    }

    /// Sets the Node's `NetworkReady` condition; healthy also removes the configured taints.
    pub fn network_ready(&self, healthy: bool) {
        self.node.send_if_modified(|w| {
            let changed = w.healthy != Some(healthy);
            w.healthy = Some(healthy);
            changed
        });
    }

    /// The Node changed: re-check the taints.
    pub fn node_changed(&self) {
        self.node.send_modify(|w| w.node_changes += 1);
    }

    pub fn event(&self, ev: Event, regarding: ObjectReference) {
        if let Err(e) = self.events.try_send((ev, regarding)) {
            warn!(reason = %e.into_inner().0.reason, "event queue full (API server slow or down): event dropped");
        }
    }

    /// Delivers what is still pending, for at most `grace`; whatever is left then is dropped.
    pub async fn shutdown(self, grace: Duration) {
        let Reporter {
            status,
            node,
            events,
            tasks,
        } = self;
        drop((status, node, events));
        let deadline = tokio::time::Instant::now() + grace;
        for mut t in tasks {
            if tokio::time::timeout_at(deadline, &mut t).await.is_err() {
                warn!(
                    ?grace,
                    "reports not delivered before shutdown (API server unreachable)"
                );
                t.abort();
            }
        }
    }
}

/// Waits for a backoff delay, or for a newer value (returned). After the sender is gone, only waits.
async fn backoff<T: Clone>(rx: &mut watch::Receiver<T>, delay: &mut Duration) -> Option<T> {
    let d = *delay;
    *delay = (*delay * 2).min(BACKOFF_MAX);
    tokio::select! {
        _ = tokio::time::sleep(d) => None,
        r = rx.changed() => match r {
            Ok(()) => {
                *delay = BACKOFF_START;
                Some(rx.borrow_and_update().clone())
            }
            Err(_) => {
                tokio::time::sleep(d).await;
                None
            }
        },
    }
}

async fn deliver_status(
    client: Client,
    mut rx: watch::Receiver<Option<(String, NodeNetworkConfigStatus)>>,
    metrics: Arc<Metrics>,
) {
    let api: Api<NodeNetworkConfig> = Api::all(client);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut told_older_crd = false;
    loop {
        // Closed and nothing new: shutdown with everything delivered.
        if rx.changed().await.is_err() {
            return;
        }
        let mut pending = rx.borrow_and_update().clone();
        let mut delay = BACKOFF_START;
        while let Some((name, st)) = pending.clone() {
            // Within the CRD's bounds (#48): a long message of its own is cut, never refused whole.
            let patch = json!({
                "apiVersion": "netwave.dev/v1alpha1",
                "kind": "NodeNetworkConfig",
                "status": st.clone().bounded(),
            });
            let attempt = tokio::time::timeout(
                ATTEMPT_TIMEOUT,
                netwave_runtime::apply::apply_status(
                    &api,
                    &name,
                    &params,
                    patch,
                    &netwave_api::NNC_STATUS_TOGETHER,
                ),
            )
            .await;
            let error = match attempt {
                Ok(Ok((_, dropped))) => {
                    if !dropped.is_empty() && !told_older_crd {
                        told_older_crd = true;
                        warn!(fields = ?dropped, "the NodeNetworkConfig CRD is older than this agent: its status leaves these fields out (the configurator then treats this agent as one of that release)");
                    }
                    None
                }
                // Our NNC is gone: nothing to report to.
                Ok(Err(kube::Error::Api(ae))) if ae.code == 404 => None,
                Ok(Err(e)) => Some(e.to_string()),
                Err(_) => Some(format!("no answer within {ATTEMPT_TIMEOUT:?}")),
            };
            let Some(error) = error else {
                metrics.status_pending.set(0);
                break;
            };
            metrics.status_pending.set(1);
            metrics.status_write_errors.inc();
            warn!(%error, retry_in = ?delay, phase = ?st.phase, "writing status failed; retrying");
            if let Some(newer) = backoff(&mut rx, &mut delay).await {
                pending = newer;
            }
        }
    }
}

async fn deliver_node(
    client: Client,
    node: String,
    taints: Vec<String>,
    mut rx: watch::Receiver<NodeWish>,
) {
    let nodes: Api<Node> = Api::all(client);
    // The condition value this process last wrote: written again only when it changes.
    let mut written: Option<bool> = None;
    loop {
        if rx.changed().await.is_err() {
            return;
        }
        let mut wish = rx.borrow_and_update().clone();
        let mut delay = BACKOFF_START;
        while let Some(healthy) = wish.healthy {
            let mut ok = true;
            if written != Some(healthy) {
                match set_condition(&nodes, &node, healthy).await {
                    Ok(()) => written = Some(healthy),
                    Err(e) => {
                        warn!(error = %e, "setting the NetworkReady condition");
                        ok = false;
                    }
                }
            }
            if healthy && let Err(e) = remove_taints(&nodes, &node, &taints).await {
                warn!(error = %e, "removing taints");
                ok = false;
            }
            if ok {
                break;
            }
            if let Some(newer) = backoff(&mut rx, &mut delay).await {
                wish = newer;
            }
        }
    }
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

async fn set_condition(nodes: &Api<Node>, node: &str, healthy: bool) -> anyhow::Result<()> {
    let cond = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "status": { "conditions": [{
            "type": NETWORK_READY,
            "status": ConditionStatus::of(healthy).as_str(),
            "reason": if healthy { NodePhase::Provisioned } else { NodePhase::Invalid }.as_str(),
            "message": "reported by netwave-agent",
            "lastHeartbeatTime": now(),
            "lastTransitionTime": now(),
        }]}
    });
    let params = PatchParams::apply(FIELD_MANAGER).force();
    tokio::time::timeout(
        ATTEMPT_TIMEOUT,
        nodes.patch_status(node, &params, &Patch::Apply(&cond)),
    )
    .await??;
    Ok(())
}

/// Removes the configured taints from our Node (read fresh: the conditional update needs the current
/// resourceVersion, so a concurrent taint change is not lost).
async fn remove_taints(nodes: &Api<Node>, node: &str, remove: &[String]) -> anyhow::Result<()> {
    if remove.is_empty() {
        return Ok(());
    }
    let n = tokio::time::timeout(ATTEMPT_TIMEOUT, nodes.get(node)).await??;
    let taints = n
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let keep: Vec<_> = taints.iter().filter(|t| !remove.contains(&t.key)).collect();
    if keep.len() == taints.len() {
        return Ok(());
    }
    let patch = json!({
        "metadata": { "resourceVersion": n.resource_version() },
        "spec": { "taints": keep },
    });
    tokio::time::timeout(
        ATTEMPT_TIMEOUT,
        nodes.patch(node, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await??;
    info!(removed = ?remove, "removed taints: node network is healthy");
    Ok(())
}

async fn deliver_events(recorder: Recorder, mut rx: mpsc::Receiver<(Event, ObjectReference)>) {
    while let Some((ev, regarding)) = rx.recv().await {
        match tokio::time::timeout(ATTEMPT_TIMEOUT, recorder.publish(&ev, &regarding)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, reason = %ev.reason, "publishing event"),
            Err(_) => warn!(reason = %ev.reason, "publishing event: no answer in time"),
        }
    }
}
