//! The Kubernetes shell: watches this node's NodeNetworkConfig and Node (field selector on the name;
//! nothing else is cached), runs [`Agent`] applies, repairs drift on a timer, writes NNC status (the only
//! writer), the Node's `NetworkReady` condition and taint removal, Events, metrics and health endpoints.
//!
//! ```text
//!  watch own NNC ──► latest spec ─► reconcile::decide ─► Agent::apply / fast path / skip
//!  watch own Node ─► taints                              │
//!  drift timer ───► Agent::repair_drift                  ▼
//!                                  report::Reporter: status, NetworkReady, taints, Events, each
//!                                  delivered by its own task, retried until the API answers
//! ```
//!
//! Nothing in the loop waits for the API server: while it is unreachable the node still applies, rolls
//! back, repairs drift and stops on SIGTERM (after a short grace for undelivered reports).
//!
//! [`run_with`] takes any `kube::Client`, so tests run the agent against the API testbed in-process.

pub mod args;
pub mod http;
pub mod metrics;
pub mod report;
pub mod status;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use netwave_api::{NodeNetworkConfig, NodeNetworkConfigStatus};
use netwave_runtime::decoded::Decoded;
use tokio::sync::watch as channel;
use tracing::{Instrument, error, info, info_span, warn};

use crate::backup::{BackupError, LastGood, StateDir};
use crate::health::{ApiCheck, HealthConfig, Prober};
use crate::netlink::Netlink;
use crate::reconcile::{self, Agent, Decision, Outcome, Reason, Running, Target, decide};
use args::Args;
use metrics::{ApplyLabels, Metrics};
use report::Reporter as ApiReporter;

/// What blocks `/readyz` while this agent's own rendering is refused ([`gate_upgrade`]).
const UPGRADE: &str = "upgrade";

/// On shutdown, how long undelivered reports may still take.
const REPORT_GRACE: Duration = Duration::from_secs(5);

pub use report::{FIELD_MANAGER, NETWORK_READY};

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
    metrics: Arc<Metrics>,
    reporter: ApiReporter,
    /// The status this agent last reported (fresher than the watch while its delivery is pending; the
    /// agent is the only writer).
    reported: Option<NodeNetworkConfigStatus>,
    /// What is wrong with the last good backup, as last logged (one line per problem, not per tick).
    backup_problem: Option<String>,
    /// The decode error of its NodeNetworkConfig, once reported (one log line and Event per error).
    undecodable: Option<String>,
    /// What the start-up upgrade gate did, for an Event on the NodeNetworkConfig once it is listed.
    upgrade_event: Option<Event>,
    /// `/readyz`: blocked while this agent's rendering is refused ([`gate_upgrade`]).
    ready: http::Readiness,
    /// Reads its own NodeNetworkConfig as the API server has it ([`Shell::unknown_field`]).
    client: Client,
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

    let (agent, taints) = build_agent(&args, &client, &metrics).await?;
    info!(
        node = %args.node_name, %metrics_addr, %health_addr, caps = ?agent.caps,
        frr = ?agent.frr.as_ref().map(|f| f.config_file()),
        "netwave-agent starting"
    );
    log_last_good(&agent, &args);

    // Crash recovery before anything else touches the kernel.
    let interrupted = agent.recover().await?;
    if let Some(o) = &interrupted {
        warn!(revision = %o.revision, message = %o.message, "recovered from an interrupted apply");
        metrics.rollbacks.inc();
    }
    // This agent's own rendering of what the node runs, through the gate, before anything else.
    let upgrade_event = gate_upgrade(&agent, &metrics, &ready).await;

    let selector = format!("metadata.name={}", args.node_name);
    let report = |cause, sets_ready| WatchReadiness {
        ready: ready.clone(),
        sets_ready,
        cause,
        stale_after: args.api_stale_after,
    };
    let nnc_rx = watch_one::<NodeNetworkConfig>(
        Api::all(client.clone()),
        &selector,
        report("NodeNetworkConfig watch", true),
    );
    let node_rx = watch_one::<Node>(
        Api::all(client.clone()),
        &selector,
        report("Node watch", false),
    );

    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some(args.node_name.clone()),
        },
    );
    let reporter = ApiReporter::start(
        client.clone(),
        args.node_name.clone(),
        taints,
        recorder,
        metrics.clone(),
    );
    let shell = Shell {
        node: args.node_name.clone(),
        agent,
        metrics,
        reporter,
        reported: None,
        backup_problem: None,
        undecodable: None,
        upgrade_event,
        ready,
        client,
    };
    let watches = Watches {
        nnc: nnc_rx,
        node: node_rx,
    };
    shell
        .run(watches, args.drift_interval, interrupted, shutdown)
        .await;
    Ok(())
}

/// The agent's kernel, FRR and probe sides from its flags; also the taints its health config
/// manages. Bad FRR settings or health config stop the agent here.
async fn build_agent(
    args: &Args,
    client: &Client,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<(Agent, Vec<String>)> {
    let health = match &args.health_config {
        Some(p) => HealthConfig::load(p)?,
        None => HealthConfig::default(),
    };
    // Bad FRR settings stop the agent here, naming the field: it would otherwise refuse every BGP config.
    let frr = args
        .frr(&crate::frr::kernel_hostname()?)
        .map_err(anyhow::Error::msg)?;
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
    // The probe gauges follow every probe run as it completes (an apply's retries, the re-check after
    // a rollback), not only the results its verdict is about.
    let gauges = metrics.clone();
    let mut prober = Prober::new(health, netlink.clone(), Some(api))
        .with_observer(Arc::new(move |results| gauges.record_probes(results)));
    if let Some(f) = &frr {
        // `bgp` probes ask this node's FRR instance, uncached, like the apply does.
        let f = f.clone();
        let summary: crate::health::BgpSummary = Arc::new(move || {
            let f = f.clone();
            Box::pin(async move { f.bgp_summary().await.map_err(|e| e.to_string()) })
        });
        prober = prober.with_bgp(summary);
    }
    let agent = Agent {
        prober,
        state: StateDir::open(&args.state_dir)?,
        netlink,
        caps,
        frr,
        timings: Default::default(),
        #[cfg(feature = "rendering-drill")]
        drill: args.rendering_drill.clone(),
        #[cfg(not(feature = "rendering-drill"))]
        drill: None,
    };
    Ok((agent, taints))
}

/// Runs [`Agent::upgrade_gate`] and says what it did: one log line, the metrics, `/readyz` blocked
/// while this agent's rendering is refused (a DaemonSet rolling update stops at this node), and the
/// Event to put on the NodeNetworkConfig once it is listed.
async fn gate_upgrade(agent: &Agent, metrics: &Metrics, ready: &http::Readiness) -> Option<Event> {
    use crate::upgrade::UpgradeCheck;
    let refused = |r: &crate::backup::Refusal, again: bool| {
        let why = format!(
            "agent {} renders the running config differently, and that failed the health gate{}: \
             {}; the node runs what it ran before. Roll the agent back (kubectl rollout undo \
             daemonset/netwave-agent) or fix what the probe names",
            r.agent_version,
            if again { " before this restart" } else { "" },
            r.message
        );
        error!("{why}");
        metrics.upgrade_refused.set(1);
        ready.block(UPGRADE, format!("upgrade refused: {}", r.message));
        Some(warning_event("AgentUpgradeRefused", why))
    };
    match agent.upgrade_gate(status::AGENT_VERSION).await {
        Ok(UpgradeCheck::Same) => None,
        Ok(UpgradeCheck::Passed(o)) => {
            info!(
                operations = o.applied,
                "this agent renders the running config differently: applied under the health gate, which passed"
            );
            metrics.upgrade_applies.inc();
            Some(Event {
                type_: EventType::Normal,
                reason: "AgentUpgradeApplied".into(),
                note: Some(format!(
                    "agent {} renders the running config differently: {} operations applied under the \
                     health gate, which passed",
                    status::AGENT_VERSION,
                    o.applied
                )),
                action: "Upgrade".into(),
                secondary: None,
            })
        }
        Ok(UpgradeCheck::Refused { refusal, .. }) => {
            metrics.rollbacks.inc();
            refused(&refusal, false)
        }
        Ok(UpgradeCheck::StillRefused(r)) => refused(&r, true),
        Err(e) => {
            // A corrupt backup is reported by every apply it refuses; anything else leaves the node
            // as it is, and drift repair retries nothing new (it repairs toward what the node ran).
            error!(error = %e, category = e.category(), "the upgrade gate could not run");
            None
        }
    }
}

fn warning_event(reason: &str, note: String) -> Event {
    Event {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: "Upgrade".into(),
        secondary: None,
    }
}

/// What a restarted agent (a new pod, a node reboot) starts from, said once: with a backup, a node
/// config of the same hash is not applied again (zero kernel writes) and drift from it is repaired.
fn log_last_good(agent: &Agent, args: &Args) {
    match agent.last_good() {
        Ok(Some(lg)) => info!(
            revision = %lg.revision, config_hash = %lg.config_hash, dir = %args.state_dir.display(),
            "found the last good config on disk: the same config is not applied again, only drift from it is repaired"
        ),
        Ok(None) => info!(
            dir = %args.state_dir.display(),
            "no last good config on disk: the first config assigned is applied in full"
        ),
        Err(e) => {
            warn!(error = %e, dir = %args.state_dir.display(), "the last good config on disk cannot be read")
        }
    }
}

/// The agent's two watches: its NodeNetworkConfig and its Node.
struct Watches {
    nnc: channel::Receiver<Option<Decoded<NodeNetworkConfig>>>,
    node: channel::Receiver<Option<Decoded<Node>>>,
}

impl Shell {
    /// The loop: handle the NodeNetworkConfig whenever it changes, repair drift every
    /// `drift_interval`, take the taints off again when the Node changes; until `shutdown`.
    async fn run(
        mut self,
        watches: Watches,
        drift_interval: Duration,
        mut interrupted: Option<Outcome>,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        let Watches {
            nnc: mut nnc_rx,
            node: mut node_rx,
        } = watches;
        let mut drift = tokio::time::interval(drift_interval);
        drift.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick fires at once: after a node reboot the running config is back within seconds, not
        // after a full drift interval.
        tokio::pin!(shutdown);
        loop {
            let nnc = nnc_rx.borrow_and_update().clone();
            match nnc {
                Some(Decoded::Object(nnc)) => {
                    self.decodes();
                    if let Some(o) = interrupted.take() {
                        self.report(&nnc, &o);
                    }
                    if let Some(ev) = self.upgrade_event.take() {
                        self.reporter.event(ev, nnc.object_ref(&()));
                    }
                    self.handle(&nnc).await;
                }
                Some(d @ Decoded::Undecodable(_)) => self.undecodable(&d),
                None => {}
            }
            tokio::select! {
                r = nnc_rx.changed() => if r.is_err() { break },
                // Someone re-tainted a healthy node (or the Node came back): take our taints off again.
                r = node_rx.changed() => {
                    if r.is_err() { break }
                    self.reporter.node_changed();
                    continue;
                }
                _ = drift.tick() => {
                    let regarding = nnc_rx.borrow().as_ref().map(|n| n.object_ref(&()));
                    self.repair_drift(regarding).await;
                }
                _ = &mut shutdown => break,
            }
        }
        info!("netwave-agent stopping");
        self.reporter.shutdown(REPORT_GRACE).await;
    }
}

/// How one of the agent's watches reports to `/readyz`.
#[derive(Clone)]
struct WatchReadiness {
    ready: http::Readiness,
    /// Its first list makes the agent ready.
    sets_ready: bool,
    /// What blocks readiness while it keeps failing (`"NodeNetworkConfig watch"`).
    cause: &'static str,
    /// How long it may keep failing before it blocks readiness (`--api-stale-after`).
    stale_after: Duration,
}

impl WatchReadiness {
    /// A good event after `failing`: readiness is no longer blocked by this watch.
    fn recovered(&self, failing: &mut Option<std::time::Instant>) {
        if failing.take().is_some() && self.ready.blocked_by(self.cause).is_some() {
            info!(watch = self.cause, "the watch works again: ready");
            self.ready.unblock(self.cause);
        }
    }

    /// An error of a run that began at `failing` (now if none): logged once, and readiness blocked once
    /// the run is longer than the bound, with the latest error.
    fn failed(&self, failing: &mut Option<std::time::Instant>, e: &watcher::Error) {
        let since = *failing.get_or_insert_with(|| {
            warn!(watch = self.cause, error = %e, "watch failing (retrying with backoff)");
            std::time::Instant::now()
        });
        if since.elapsed() < self.stale_after {
            return;
        }
        let why = format!(
            "the {} has failed for {}s, so this agent may not see its assignment: {e}",
            self.cause,
            since.elapsed().as_secs()
        );
        if self.ready.blocked_by(self.cause).is_none() {
            error!("{why}; not ready until it works again");
        }
        self.ready.block(self.cause, why);
    }
}

/// A watch on the single object `selector` names; the latest object (or `None` once deleted) is published
/// on the returned channel, also when it does not decode (the loop reports that instead of the watch
/// failing on every relist). Readiness is set after the initial list (if `report.sets_ready`) and
/// blocked while the watch keeps failing. A watch that hangs silently is restarted by the watcher (its
/// idle timeout), then fails or recovers like any other.
fn watch_one<K>(
    api: Api<Decoded<K>>,
    selector: &str,
    report: WatchReadiness,
) -> channel::Receiver<Option<Decoded<K>>>
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
    let stream = watcher(api, netwave_runtime::watch_config().fields(selector)).default_backoff();
    tokio::spawn(
        async move {
            futures::pin_mut!(stream);
            let mut failing = None;
            while let Some(ev) = stream.next().await {
                if ev.is_ok() {
                    report.recovered(&mut failing);
                }
                match ev {
                    Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                        tx.send_replace(Some(o));
                    }
                    Ok(watcher::Event::Delete(_)) => {
                        tx.send_replace(None);
                    }
                    Ok(watcher::Event::InitDone) if report.sets_ready => report.ready.set_ready(),
                    Ok(watcher::Event::InitDone | watcher::Event::Init) => {}
                    Err(e) => report.failed(&mut failing, &e),
                }
            }
        }
        .instrument(info_span!("watch", %kind)),
    );
    rx
}

impl Shell {
    /// The last good backup. A corrupt one is logged once when found (and once when repaired): it
    /// stops every apply until an admin moves it aside.
    fn backup(&mut self) -> Result<Option<LastGood>, BackupError> {
        let backup = self.agent.last_good();
        let problem = backup.as_ref().err().map(ToString::to_string);
        if problem != self.backup_problem {
            match (&problem, &self.backup_problem) {
                (Some(p), _) => error!(
                    "{p}: every apply is refused until it is repaired (move the file aside: the node \
                     then has no last good config and applies its assigned revision afresh)"
                ),
                (None, Some(was)) => {
                    info!("the last good backup was repaired ({was}); applies resume")
                }
                (None, None) => {}
            }
            self.backup_problem = problem;
        }
        backup
    }

    async fn handle(&mut self, nnc: &NodeNetworkConfig) {
        let status = self.reported.clone().or_else(|| nnc.status.clone());
        let backup = self.backup();
        let running = match &backup {
            Ok(lg) => Running::Known(lg.as_ref().map(|l| l.config_hash.as_str())),
            Err(_) => Running::BackupCorrupt,
        };
        let span = info_span!("reconcile", node = %self.node, revision = %nnc.spec.revision);
        let decision = decide(&nnc.spec, status.as_ref(), running);
        let target = Target::from(&nnc.spec);
        // Judged Invalid before a restart, and the verdict never reached the API server: report it
        // instead of applying the bad config again.
        if decision == Decision::Apply
            && let Some(o) = self.agent.rejected_outcome(&target)
        {
            warn!(revision = %o.revision, message = %o.message, "reporting an Invalid verdict from before the restart");
            self.report(nnc, &o);
            self.reporter.network_ready(false);
            return;
        }
        // Decisions that report nothing still say which agent runs here (after an upgrade, or on a
        // placeholder): the configurator's skew gate reads it.
        if matches!(
            decision,
            Decision::UpToDate
                | Decision::SkipInvalid
                | Decision::StillTampered
                | Decision::Unassigned
                | Decision::StillBackupCorrupt
        ) && !status.as_ref().is_some_and(status::announces_this_agent)
        {
            let prev = status.as_ref().filter(|_| decision != Decision::Unassigned);
            let st = status::judged(status::announcing(prev, &self.agent.caps), nnc, &now());
            self.reported = Some(st.clone());
            self.reporter.status(&nnc.name_any(), st);
        }
        async {
            match decision {
                // Also after a restart: the Node's condition (and taints) match what runs.
                Decision::UpToDate => self.reporter.network_ready(true),
                Decision::SkipInvalid => self.reporter.network_ready(false),
                // The running config is untouched, so the node's readiness is too.
                Decision::StillTampered | Decision::Unassigned | Decision::StillBackupCorrupt => {}
                // Refused before anything: the running config, and the node's readiness, stay.
                Decision::BackupCorrupt => {
                    if let Err(e) = &backup {
                        let outcome = reconcile::backup_corrupt(&target, e);
                        self.report(nnc, &outcome);
                    }
                }
                Decision::Tampered { actual } => {
                    let outcome = self.refuse_mismatch(nnc, &target, &actual).await;
                    warn!(message = %outcome.message, "refusing a node config that does not match its hash");
                    self.report(nnc, &outcome);
                }
                Decision::FastPath => {
                    let outcome = match self.agent.record_fast_path(&target) {
                        Ok(()) => Outcome::provisioned(
                            &target.revision,
                            target.retry,
                            &target.config_hash,
                            "same config hash as the running config: nothing to apply".into(),
                        ),
                        Err(e) => {
                            error!(error = %e, "recording fast-path revision");
                            return;
                        }
                    };
                    self.report(nnc, &outcome);
                    self.reporter.network_ready(true);
                }
                Decision::Apply => {
                    let prev = status.clone();
                    let at = now();
                    let st = status::provisioning(&target, prev.as_ref(), &self.agent.caps, at.clone());
                    let st = status::judged(st, nnc, &at);
                    self.reported = Some(st.clone());
                    self.reporter.status(&nnc.name_any(), st);
                    let start = std::time::Instant::now();
                    let before = self.agent.netlink.writes();
                    let mut outcome = self.agent.apply(&target).await;
                    // The rendering of this agent already failed the node's probes at start: a
                    // failure now may be the agent's, not the revision's. Said where the admin looks.
                    if outcome.reason.is_some()
                        && let Some(why) = self.ready.blocked_by(UPGRADE)
                    {
                        outcome.message = format!(
                            "{}; note: agent {} is not ready, its own rendering of the running \
                             config failed the health gate at start ({why}), so this failure may be \
                             the agent's, not the revision's",
                            outcome.message,
                            status::AGENT_VERSION
                        );
                    }
                    self.metrics
                        .apply_duration
                        .observe(start.elapsed().as_secs_f64());
                    if let Some(f) = self.agent.timings.last().and_then(|t| t.frr) {
                        self.metrics
                            .frr_apply_duration
                            .observe(f.total().as_secs_f64());
                    }
                    self.metrics
                        .netlink_writes
                        .inc_by(self.agent.netlink.writes() - before);
                    if outcome.rolled_back {
                        self.metrics.rollbacks.inc();
                    }
                    info!(phase = outcome.phase(), message = %outcome.message, "apply finished");
                    self.report(nnc, &outcome);
                    self.reporter.network_ready(outcome.reason.is_none());
                    self.upgrade_settled();
                }
            }
        }
        .instrument(span)
        .await
    }

    /// Status, metrics and an Event for `o` (delivered in the background).
    fn report(&mut self, nnc: &NodeNetworkConfig, o: &Outcome) {
        self.metrics
            .applies
            .get_or_create(&ApplyLabels {
                phase: o.phase(),
                reason: o.reason.map(|r| r.as_str()).unwrap_or(""),
            })
            .inc();
        let prev = self.reported.clone().or_else(|| nnc.status.clone());
        let at = now();
        let st = status::answering(
            status::from_outcome(o, prev.as_ref(), &self.agent.caps, at.clone()),
            nnc,
            &at,
        );
        self.reported = Some(st.clone());
        self.reporter.status(&nnc.name_any(), st);
        if let Some(reason) = o.reason {
            let ev = Event {
                type_: EventType::Warning,
                reason: reason.as_str().into(),
                note: Some(o.message.chars().take(1000).collect()),
                action: if o.rolled_back { "Rollback" } else { "Apply" }.into(),
                secondary: None,
            };
            self.reporter.event(ev, nnc.object_ref(&()));
        }
    }

    /// Its own NodeNetworkConfig does not decode: nothing new is applied (the node keeps running what
    /// it runs, and drift is still repaired); one log line and one Event per error, and the gauge.
    fn undecodable(&mut self, nnc: &Decoded<NodeNetworkConfig>) {
        let Some(u) = nnc.undecodable() else {
            return;
        };
        self.metrics.undecodable_config.set(1);
        if self.undecodable.as_deref() == Some(u.error.as_str()) {
            return;
        }
        self.undecodable = Some(u.error.clone());
        let running = self.agent.last_good().ok().flatten().map(|l| l.revision);
        let note = crate::reconcile::undecodable_note(&u.error, running.as_deref());
        warn!(error = %u.error, "{note}");
        let ev = Event {
            type_: EventType::Warning,
            reason: netwave_core::undecodable::REASON.into(),
            note: Some(note.chars().take(1000).collect()),
            action: "Decode".into(),
            secondary: None,
        };
        self.reporter.event(ev, nnc.object_ref(&()));
    }

    /// The refusal of a spec whose config does not hash to its configHash. A newer configurator that
    /// wrote fields this agent does not know makes one too (the agent's decode drops them): read from
    /// the object as the API server has it (one GET), such a field is named, with this agent's
    /// version, as `UnknownField`; otherwise the spec was edited, `ConfigTampered`. Nothing is applied
    /// either way, not even the part this agent understands.
    async fn refuse_mismatch(
        &self,
        nnc: &NodeNetworkConfig,
        target: &Target,
        actual: &str,
    ) -> Outcome {
        let last_good = self.agent.last_good().ok().flatten();
        let keeps = last_good
            .as_ref()
            .map_or("its current config", |l| l.revision.as_str())
            .to_string();
        let running = (
            last_good.as_ref().map(|l| l.config_hash.clone()),
            last_good.map(|l| l.revision),
        );
        let (reason, message) = match self.unknown_field(&nnc.name_any()).await {
            Some(field) => (
                Reason::UnknownField,
                format!(
                    "UnknownField: {field} is not a field agent {} knows (a newer configurator \
                     wrote it): nothing applied, the node keeps running {keeps}; upgrade this \
                     node's agent",
                    status::AGENT_VERSION
                ),
            ),
            None => (
                Reason::ConfigTampered,
                format!(
                    "ConfigTampered: spec.config does not hash to spec.configHash {} (it hashes to \
                     {actual}): the spec was edited by hand; nothing applied, the node keeps \
                     running {keeps}",
                    target.config_hash
                ),
            ),
        };
        Outcome::invalid(&target.revision, target.retry, reason, message, running)
    }

    /// The first field of `spec.config` of NodeNetworkConfig `name`, as the API server has it, that
    /// this agent's types do not have (`None` also when it cannot be read).
    async fn unknown_field(&self, name: &str) -> Option<String> {
        let resource = kube::api::ApiResource::erase::<NodeNetworkConfig>(&());
        let api: Api<kube::api::DynamicObject> = Api::all_with(self.client.clone(), &resource);
        let object = match api.get(name).await {
            Ok(o) => o,
            Err(e) => {
                warn!(error = %e, "reading the node config for fields this agent does not know");
                return None;
            }
        };
        let config = object.data.get("spec")?.get("config")?;
        let error = netwave_api::strict::typed::<netwave_api::NodeConfig>(config).err()?;
        error
            .strip_prefix("unknown field ")
            .map(|path| format!("spec.config.{path}"))
    }

    /// A refused upgrade is over once this agent's rendering of a config passed the gate (an apply
    /// that succeeded holds nothing any more): ready again.
    fn upgrade_settled(&mut self) {
        if self.ready.blocked_by(UPGRADE).is_some() && matches!(self.agent.state.held(), Ok(None)) {
            info!("this agent's rendering passed the health gate: the refused upgrade is over");
            self.metrics.upgrade_refused.set(0);
            self.ready.unblock(UPGRADE);
        }
    }

    /// Its NodeNetworkConfig decodes (again).
    fn decodes(&mut self) {
        if self.undecodable.take().is_some() {
            self.metrics.undecodable_config.set(0);
            info!("the NodeNetworkConfig decodes again");
        }
    }

    async fn repair_drift(
        &mut self,
        regarding: Option<k8s_openapi::api::core::v1::ObjectReference>,
    ) {
        // A corrupt backup is no config to repair toward (logged once, reported by `handle`). Just
        // repaired (moved aside), there is no backup, and repairing toward no config would remove every
        // object the node runs: the assigned config is applied first (`handle`, right after this).
        let was_corrupt = self.backup_problem.is_some();
        match self.backup() {
            Err(_) => return,
            Ok(None) if was_corrupt => return,
            Ok(_) => {}
        }
        let before = self.agent.netlink.writes();
        match self.agent.repair_drift().await {
            Ok(r) if r.is_empty() => {}
            Ok(r) => {
                if let Some(diff) = &r.frr_baseline {
                    info!(frr = %diff, "FRR set up with the underlay: no config applied on this node yet");
                }
                let mut ops: Vec<String> =
                    r.netlink.applied.iter().map(ToString::to_string).collect();
                if let Some(diff) = &r.frr {
                    ops.push(format!("FRR re-applied: {diff}"));
                }
                if ops.is_empty() {
                    return self.count_writes(before).await;
                }
                warn!(ops = ?ops, "repaired drift from the running config");
                self.metrics.drift_corrections.inc_by(ops.len() as u64);
                if let Some(regarding) = regarding {
                    let ev = Event {
                        type_: EventType::Warning,
                        reason: "DriftCorrected".into(),
                        note: Some(ops.join("; ").chars().take(1000).collect()),
                        action: "Reconcile".into(),
                        secondary: None,
                    };
                    self.reporter.event(ev, regarding);
                }
            }
            Err(e) => error!(error = %e, category = e.category(), "drift repair failed"),
        }
        self.count_writes(before).await;
    }

    /// After a drift check: the netlink writes it made (since `before`) and the objects managed now.
    async fn count_writes(&mut self, before: u64) {
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
