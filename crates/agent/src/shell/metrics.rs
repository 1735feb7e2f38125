//! Agent metrics (DESIGN.md §5): apply duration and results, probe status and duration, rollbacks,
//! drift corrections, managed objects, netlink writes. Labels come from fixed sets (results, reasons,
//! probe kinds) or the node's own health config (probe names), never from API objects or error strings.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApplyLabels {
    /// `Provisioned` or `Invalid`.
    pub phase: &'static str,
    /// Empty for `Provisioned`.
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabels {
    pub probe: String,
}

pub struct Metrics {
    pub registry: Registry,
    pub apply_duration: Histogram,
    /// The FRR part of an apply: render, check, write, reload, converged.
    pub frr_apply_duration: Histogram,
    pub applies: Family<ApplyLabels, Counter>,
    /// 1 while the probe passes, 0 while it fails.
    pub probe_up: Family<ProbeLabels, Gauge>,
    pub probe_duration: Family<ProbeLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub rollbacks: Counter,
    pub drift_corrections: Counter,
    pub managed_objects: Gauge,
    pub netlink_writes: Counter,
    pub status_write_errors: Counter,
    pub status_pending: Gauge,
    /// 1 while the node's own NodeNetworkConfig does not decode.
    pub undecodable_config: Gauge,
    /// 1 while this agent's rendering of the running config failed the health gate (an agent upgrade
    /// stopped at this node: `crate::upgrade`).
    pub upgrade_refused: Gauge,
    /// This agent's renderings of the running config that passed the health gate at start.
    pub upgrade_applies: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("netwave_agent");
        let apply_duration = Histogram::new(exponential_buckets(0.01, 2.0, 14));
        registry.register(
            "apply_duration_seconds",
            "Time to apply a config: netlink, settle and health probes",
            apply_duration.clone(),
        );
        let frr_apply_duration = Histogram::new(exponential_buckets(0.01, 2.0, 14));
        registry.register(
            "frr_apply_duration_seconds",
            "Time to apply the FRR part of a config: render, check, write, reload, converged",
            frr_apply_duration.clone(),
        );
        let applies = Family::<ApplyLabels, Counter>::default();
        registry.register(
            "applies",
            "Applies by resulting phase and reason",
            applies.clone(),
        );
        let probe_up = Family::<ProbeLabels, Gauge>::default();
        registry.register(
            "probe_up",
            "Whether a health probe passed on its last run",
            probe_up.clone(),
        );
        let probe_duration =
            Family::<ProbeLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "probe_duration_seconds",
            "Duration of a health probe's last run",
            probe_duration.clone(),
        );
        let rollbacks = Counter::default();
        registry.register(
            "rollbacks",
            "Restores of the last good config",
            rollbacks.clone(),
        );
        let drift_corrections = Counter::default();
        registry.register(
            "drift_corrections",
            "Kernel operations (and FRR re-applies) that repaired drift from the running config",
            drift_corrections.clone(),
        );
        let managed_objects = Gauge::default();
        registry.register(
            "managed_objects",
            "Links, addresses, routes and rules the agent manages",
            managed_objects.clone(),
        );
        let netlink_writes = Counter::default();
        registry.register(
            "netlink_writes",
            "Netlink write requests sent",
            netlink_writes.clone(),
        );
        let status_write_errors = Counter::default();
        registry.register(
            "status_write_errors",
            "Failed NodeNetworkConfig status writes (retried)",
            status_write_errors.clone(),
        );
        let status_pending = Gauge::default();
        registry.register(
            "status_pending",
            "1 while a status change waits to be written (API server unreachable or refusing)",
            status_pending.clone(),
        );
        let undecodable_config = Gauge::default();
        registry.register(
            "undecodable_config",
            "1 while this node's NodeNetworkConfig does not decode (nothing new is applied)",
            undecodable_config.clone(),
        );
        let upgrade_refused = Gauge::default();
        registry.register(
            "upgrade_refused",
            "1 while this agent's rendering of the running config failed the health gate: the node \
             runs what it ran before, and the agent is not ready (its upgrade stops here)",
            upgrade_refused.clone(),
        );
        let upgrade_applies = Counter::default();
        registry.register(
            "upgrade_applies",
            "Renderings of the running config by a new agent that passed the health gate at start",
            upgrade_applies.clone(),
        );
        Metrics {
            registry,
            undecodable_config,
            upgrade_refused,
            upgrade_applies,
            apply_duration,
            frr_apply_duration,
            applies,
            probe_up,
            probe_duration,
            rollbacks,
            drift_corrections,
            managed_objects,
            netlink_writes,
            status_write_errors,
            status_pending,
        }
    }
}

impl Metrics {
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("encoding to a String cannot fail");
        out
    }

    pub fn record_probes(&self, probes: &[netwave_api::ProbeResult]) {
        for p in probes {
            let l = ProbeLabels {
                probe: p.name.clone(),
            };
            self.probe_up
                .get_or_create(&l)
                .set(i64::from(p.result == crate::health::PASSED));
            if let Some(d) = p.duration_seconds {
                self.probe_duration.get_or_create(&l).set(d);
            }
        }
    }
}
