//! The Kubernetes shell: watches this node's NodeNetworkConfig and Node (field selector on the name;
//! nothing else is cached), runs [`Agent`] applies, repairs drift on a timer, writes NNC status (the only
//! writer), the Node's `NetworkReady` condition and taint removal, Events, metrics and health endpoints.
//!
//! ```text
//!  watch own NNC ──► latest spec ─► reconcile::decide ─► Agent::apply / fast path / skip
//!  watch own Node ─► taints                              │
//!  drift timer ───► Agent::repair_drift                  ▼
//!                                        status (retried with backoff until the API answers)
//! ```
//!
//! [`run_with`] takes any `kube::Client`, so tests run the agent against the API testbed in-process.

pub mod args;
pub mod http;
pub mod metrics;
pub mod status;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use netwave_api::{NodeNetworkConfig, NodeNetworkConfigStatus};
use serde_json::json;
use tokio::sync::watch as channel;
use tracing::{Instrument, error, info, info_span, warn};

use crate::backup::StateDir;
use crate::health::{ApiCheck, HealthConfig, Prober};
use crate::netlink::Netlink;
use crate::reconcile::{Agent, Decision, Outcome, Target, decide};
use args::Args;
use metrics::{ApplyLabels, Metrics};

pub const FIELD_MANAGER: &str = "netwave-agent";
pub const NETWORK_READY: &str = "NetworkReady";

pub use netwave_runtime::{init_tracing, shutdown_signal};

pub async fn run(args: Args) -> anyhow::Result<()> {
    let client = netwave_runtime::client(args.kubeconfig.as_deref()).await?;
    run_with(args, client, shutdown_signal()).await
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// Everything one loop iteration needs.
struct Shell {
    node: String,
    agent: Agent,
    client: Client,
    metrics: Arc<Metrics>,
    recorder: Recorder,
    taints: Vec<String>,
    /// The status this agent last wrote successfully (fresher than the watch while our own write is in
    /// flight; the agent is the only writer).
    reported: Option<NodeNetworkConfigStatus>,
}

/// Runs the agent until `shutdown` resolves.
pub async fn run_with(
    args: Args,
    client: Client,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::default());
    let ready = http::Readiness::default();
    let (mr, hr) = http::router(metrics.clone(), ready.clone());
    let metrics_addr = http::serve(args.metrics_addr, mr)
        .await
        .with_context(|| format!("binding --metrics-addr {}", args.metrics_addr))?;
    let health_addr = http::serve(args.health_addr, hr)
        .await
        .with_context(|| format!("binding --health-addr {}", args.health_addr))?;

    let health = match &args.health_config {
        Some(p) => HealthConfig::load(p)?,
        None => HealthConfig::default(),
    };
    let netlink = Netlink::connect(args.node_settings())?;
    let caps = netlink.capabilities().await;
    let api_client = client.clone();
    // Uncached: a real round trip to the API server through whatever routes the node has now.
    let api: ApiCheck = Arc::new(move || {
        let c = api_client.clone();
        Box::pin(async move {
            c.apiserver_version()
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        })
    });
    let taints = health.taints.clone();
    let agent = Agent {
        prober: Prober::new(health, netlink.clone(), Some(api)),
        state: StateDir::open(&args.state_dir)?,
        netlink,
        caps,
    };
    info!(node = %args.node_name, %metrics_addr, %health_addr, caps = ?agent.caps, "netwave-agent starting");

    // Crash recovery before anything else touches the kernel.
    let mut interrupted = agent.recover().await?;
    if let Some(o) = &interrupted {
        warn!(revision = %o.revision, message = %o.message, "recovered from an interrupted apply");
        metrics.rollbacks.inc();
    }

    let selector = format!("metadata.name={}", args.node_name);
    let nnc_rx = watch_one::<NodeNetworkConfig>(Api::all(client.clone()), &selector, ready.clone());
    let mut node_rx = watch_one::<Node>(
        Api::all(client.clone()),
        &selector,
        http::Readiness::default(),
    );

    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some(args.node_name.clone()),
        },
    );
    let mut shell = Shell {
        node: args.node_name.clone(),
        agent,
        client,
        metrics,
        recorder,
        taints,
        reported: None,
    };
    let mut drift = tokio::time::interval(args.drift_interval);
    drift.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick fires at once: after a node reboot the running config is back within seconds, not
    // after a full drift interval.
    let mut nnc_rx = nnc_rx;
    tokio::pin!(shutdown);
    loop {
        let nnc = nnc_rx.borrow_and_update().clone();
        if let Some(nnc) = nnc {
            if let Some(o) = interrupted.take() {
                shell.report(&nnc, &o).await;
            }
            shell.handle(&nnc).await;
        }
        tokio::select! {
            r = nnc_rx.changed() => if r.is_err() { break },
            // Someone re-tainted a healthy node (or the Node came back): take our taints off again.
            r = node_rx.changed() => {
                if r.is_err() { break }
                if shell.healthy() { shell.remove_taints().await; }
                continue;
            }
            _ = drift.tick() => {
                let nnc = nnc_rx.borrow().clone();
                shell.repair_drift(nnc.as_ref()).await;
            }
            _ = &mut shutdown => break,
        }
    }
    info!("netwave-agent stopping");
    Ok(())
}

/// A watch on the single object `selector` names; the latest object (or `None` once deleted) is published
/// on the returned channel. `ready` is set after the initial list.
fn watch_one<K>(api: Api<K>, selector: &str, ready: http::Readiness) -> channel::Receiver<Option<K>>
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (tx, rx) = channel::channel(None);
    let kind = K::kind(&()).to_string();
    let stream = watcher(api, watcher::Config::default().fields(selector)).default_backoff();
    tokio::spawn(
        async move {
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                        tx.send_replace(Some(o));
                    }
                    Ok(watcher::Event::Delete(_)) => {
                        tx.send_replace(None);
                    }
                    Ok(watcher::Event::InitDone) => ready.set_ready(),
                    Ok(watcher::Event::Init) => {}
                    Err(e) => warn!(error = %e, "watch error (retrying with backoff)"),
                }
            }
        }
        .instrument(info_span!("watch", %kind)),
    );
    rx
}

impl Shell {
    fn running_hash(&self) -> Option<String> {
        self.agent.last_good().ok().flatten().map(|l| l.config_hash)
    }

    async fn handle(&mut self, nnc: &NodeNetworkConfig) {
        let status = self.reported.clone().or_else(|| nnc.status.clone());
        let running = self.running_hash();
        let span = info_span!("reconcile", node = %self.node, revision = %nnc.spec.revision);
        let decision = decide(&nnc.spec, status.as_ref(), running.as_deref());
        let target = Target::from(&nnc.spec);
        async {
            match decision {
                Decision::UpToDate | Decision::SkipInvalid => {}
                Decision::FastPath => {
                    let outcome = match self.agent.record_fast_path(&target) {
                        Ok(()) => Outcome {
                            revision: target.revision.clone(),
                            retry: target.retry,
                            reason: None,
                            message: "same config hash as the running config: nothing to apply"
                                .into(),
                            running_hash: Some(target.config_hash.clone()),
                            last_good_revision: Some(target.revision.clone()),
                            probes: vec![],
                            applied: 0,
                            writes: 0,
                            rolled_back: false,
                        },
                        Err(e) => {
                            error!(error = %e, "recording fast-path revision");
                            return;
                        }
                    };
                    self.report(nnc, &outcome).await;
                    self.node_ready(true).await;
                }
                Decision::Apply => {
                    let prev = status.clone();
                    let st = status::provisioning(&target, prev.as_ref(), &self.agent.caps, now());
                    self.write_status(&nnc.name_any(), &st).await;
                    let start = std::time::Instant::now();
                    let before = self.agent.netlink.writes();
                    let outcome = self.agent.apply(&target).await;
                    self.metrics
                        .apply_duration
                        .observe(start.elapsed().as_secs_f64());
                    self.metrics
                        .netlink_writes
                        .inc_by(self.agent.netlink.writes() - before);
                    self.metrics.record_probes(&outcome.probes);
                    if outcome.rolled_back {
                        self.metrics.rollbacks.inc();
                    }
                    info!(phase = outcome.phase(), message = %outcome.message, "apply finished");
                    self.report(nnc, &outcome).await;
                    self.node_ready(outcome.reason.is_none()).await;
                }
            }
        }
        .instrument(span)
        .await
    }

    /// Status (retried until written), metrics and an Event for `o`.
    async fn report(&mut self, nnc: &NodeNetworkConfig, o: &Outcome) {
        self.metrics
            .applies
            .get_or_create(&ApplyLabels {
                phase: o.phase(),
                reason: o.reason.map(|r| r.as_str()).unwrap_or(""),
            })
            .inc();
        let prev = self.reported.clone().or_else(|| nnc.status.clone());
        let st = status::from_outcome(o, prev.as_ref(), &self.agent.caps, now());
        self.write_status(&nnc.name_any(), &st).await;
        if let Some(reason) = o.reason {
            let ev = Event {
                type_: EventType::Warning,
                reason: reason.as_str().into(),
                note: Some(o.message.chars().take(1000).collect()),
                action: if o.rolled_back { "Rollback" } else { "Apply" }.into(),
                secondary: None,
            };
            if let Err(e) = self.recorder.publish(&ev, &nnc.object_ref(&())).await {
                warn!(error = %e, "publishing event");
            }
        }
    }

    /// Writes NNC status with server-side apply, retrying with backoff until the API server takes it: if
    /// the API was unreachable (even because of a config we rolled back), we report once it is back.
    async fn write_status(&mut self, name: &str, st: &NodeNetworkConfigStatus) {
        let api: Api<NodeNetworkConfig> = Api::all(self.client.clone());
        let patch = json!({
            "apiVersion": "netwave.dev/v1alpha1",
            "kind": "NodeNetworkConfig",
            "status": st,
        });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let mut delay = Duration::from_millis(200);
        loop {
            match api.patch_status(name, &params, &Patch::Apply(&patch)).await {
                Ok(_) => {
                    self.reported = Some(st.clone());
                    return;
                }
                // Our NNC is gone: nothing to report to.
                Err(kube::Error::Api(ae)) if ae.code == 404 => return,
                Err(e) => {
                    self.metrics.status_write_errors.inc();
                    warn!(error = %e, retry_in = ?delay, "writing status failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(30));
                }
            }
        }
    }

    /// `NetworkReady` condition on our Node, and removal of the configured taints once healthy. Best
    /// effort: failures are logged and retried on the next apply.
    async fn node_ready(&self, healthy: bool) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let cond = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "status": { "conditions": [{
                "type": NETWORK_READY,
                "status": if healthy { "True" } else { "False" },
                "reason": if healthy { "Provisioned" } else { "Invalid" },
                "message": "reported by netwave-agent",
                "lastHeartbeatTime": now(),
                "lastTransitionTime": now(),
            }]}
        });
        if let Err(e) = nodes
            .patch_status(
                &self.node,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&cond),
            )
            .await
        {
            warn!(error = %e, "setting the NetworkReady condition");
        }
        if healthy {
            self.remove_taints().await;
        }
    }

    /// Removes the configured taints from our Node (read fresh: the conditional replace needs the current
    /// resourceVersion).
    async fn remove_taints(&self) {
        if self.taints.is_empty() {
            return;
        }
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = match nodes.get(&self.node).await {
            Ok(n) => n,
            Err(e) => {
                warn!(error = %e, "reading own Node");
                return;
            }
        };
        let taints = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        let keep: Vec<_> = taints
            .iter()
            .filter(|t| !self.taints.contains(&t.key))
            .collect();
        if keep.len() == taints.len() {
            return;
        }
        // resourceVersion makes the replace conditional: a concurrent taint change is not lost.
        let patch = json!({
            "metadata": { "resourceVersion": node.resource_version() },
            "spec": { "taints": keep },
        });
        match nodes
            .patch(&self.node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => info!(removed = ?self.taints, "removed taints: node network is healthy"),
            Err(e) => warn!(error = %e, "removing taints"),
        }
    }

    fn healthy(&self) -> bool {
        self.reported.as_ref().and_then(|s| s.phase.as_deref())
            == Some(crate::reconcile::PROVISIONED)
    }

    async fn repair_drift(&mut self, nnc: Option<&NodeNetworkConfig>) {
        let before = self.agent.netlink.writes();
        match self.agent.repair_drift().await {
            Ok(r) if r.applied.is_empty() => {}
            Ok(r) => {
                let ops: Vec<String> = r.applied.iter().map(ToString::to_string).collect();
                warn!(ops = ?ops, "repaired drift from the running config");
                self.metrics
                    .drift_corrections
                    .inc_by(r.applied.len() as u64);
                if let Some(nnc) = nnc {
                    let ev = Event {
                        type_: EventType::Warning,
                        reason: "DriftCorrected".into(),
                        note: Some(ops.join("; ").chars().take(1000).collect()),
                        action: "Reconcile".into(),
                        secondary: None,
                    };
                    if let Err(e) = self.recorder.publish(&ev, &nnc.object_ref(&())).await {
                        warn!(error = %e, "publishing event");
                    }
                }
            }
            Err(e) => error!(error = %e, "drift repair failed"),
        }
        self.metrics
            .netlink_writes
            .inc_by(self.agent.netlink.writes() - before);
        if let Ok(snap) = self.agent.netlink.observe().await {
            self.metrics
                .managed_objects
                .set(snap.observed.managed.object_count() as i64);
        }
    }
}
