//! Prometheus metrics of the configurator (DESIGN.md §5). Label values come from small fixed sets
//! (phases, node states, reasons, error categories); never object names or error strings.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Every value [`crate::writer::category`] returns: the `category` label values of
/// `netwave_api_errors_total`, which exist from the start with 0 (a writer unit test pins the two
/// together). Here, not in the writer: the writer counts through these metrics, not the other way.
pub const CATEGORIES: [&str; 7] = [
    "conflict",
    "throttled",
    "not_found",
    "invalid",
    "server",
    "client",
    "transport",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeStateLabels {
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiErrorLabels {
    pub verb: Verb,
    pub category: &'static str,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Verb {
    create,
    patch,
    delete,
    /// The quorum read of the inputs that confirms a cut (`crate::recheck::read_inputs`).
    list,
}

impl Verb {
    pub const ALL: [Verb; 4] = [Verb::create, Verb::patch, Verb::delete, Verb::list];
}

/// `kind` label values of `netwave_tampered_specs`.
pub const TAMPERED_KINDS: [&str; 2] = ["NetworkConfigRevision", "NodeNetworkConfig"];

pub struct Metrics {
    pub registry: Registry,
    /// Revisions by phase (a gauge per phase, set on every reconcile).
    pub revisions: Family<PhaseLabels, Gauge>,
    /// Nodes of the target revision by rollout state.
    pub nodes: Family<NodeStateLabels, Gauge>,
    pub assignments: Family<ReasonLabels, Counter>,
    pub node_failures: Counter,
    /// Verdicts from agents on revisions their node was not given (ignored, never counted).
    pub protocol_violations: Counter,
    pub rollbacks: Counter,
    pub revisions_failed: Counter,
    /// Time from assigning a revision to a node until its agent reported Provisioned.
    pub node_apply_duration: Histogram,
    /// Time from assigning a wave (the nodes given one revision at the same moment) until all of them
    /// reported Provisioned.
    pub wave_duration: Histogram,
    /// Time from a revision becoming target until it completed.
    pub rollout_duration: Histogram,
    pub reconcile_duration: Histogram,
    /// The part of a reconcile before its writes: snapshot, plan and metrics (CPU only).
    pub reconcile_compute_duration: Histogram,
    pub api_errors: Family<ApiErrorLabels, Counter>,
    /// Writes a replica skipped because it was not (or no longer) the leader.
    pub writes_dropped: Counter,
    /// Plans decided again because the cache was behind on a node about to fail by a timeout
    /// (`crate::recheck`): each one is a node failure API latency would have caused.
    pub timeout_rechecks_behind: Counter,
    /// Revision cuts put off because a quorum read of the inputs disagreed with the cache
    /// (`crate::recheck`): each one is a revision that a lagging watch would have cut from a stale view.
    pub cut_rechecks_behind: Counter,
    pub leader: Gauge,
    /// 1 while changed inputs settle before a revision is cut from them (`--input-settle`).
    pub inputs_pending: Gauge,
    /// Objects whose spec is not what the configurator wrote (edited by hand), by kind.
    pub tampered_specs: Family<KindLabels, Gauge>,
    /// Objects that do not decode as netwave's types, by kind (reported and skipped).
    pub undecodable_objects: Family<KindLabels, Gauge>,
    /// Nodes quarantined (`spec.rollout.quarantine`): kept on their last good config until released.
    pub quarantined_nodes: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("netwave");
        let m = Metrics {
            revisions: Family::default(),
            nodes: Family::default(),
            assignments: Family::default(),
            node_failures: Counter::default(),
            protocol_violations: Counter::default(),
            rollbacks: Counter::default(),
            revisions_failed: Counter::default(),
            node_apply_duration: Histogram::new(exponential_buckets(0.25, 2.0, 12)),
            wave_duration: Histogram::new(exponential_buckets(0.25, 2.0, 14)),
            rollout_duration: Histogram::new(exponential_buckets(1.0, 2.0, 16)),
            reconcile_duration: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            reconcile_compute_duration: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            api_errors: Family::default(),
            writes_dropped: Counter::default(),
            timeout_rechecks_behind: Counter::default(),
            cut_rechecks_behind: Counter::default(),
            leader: Gauge::default(),
            inputs_pending: Gauge::default(),
            tampered_specs: Family::default(),
            undecodable_objects: Family::default(),
            quarantined_nodes: Gauge::default(),
            registry: Registry::default(),
        };
        m.register_rollout(&mut registry);
        m.register_reconcile(&mut registry);
        m.zero_series();
        Metrics { registry, ..m }
    }
}

impl Metrics {
    /// The rollout's metrics: revisions, nodes, assignments, failures and durations.
    fn register_rollout(&self, registry: &mut Registry) {
        let m = self;
        registry.register("revisions", "Revisions by phase", m.revisions.clone());
        registry.register(
            "rollout_nodes",
            "Nodes of the target revision by rollout state",
            m.nodes.clone(),
        );
        registry.register(
            "assignments",
            "Revision assignments to nodes by reason",
            m.assignments.clone(),
        );
        registry.register(
            "node_failures",
            "Nodes that failed a revision",
            m.node_failures.clone(),
        );
        registry.register(
            "protocol_violations",
            "Verdicts an agent reported on a revision its node was not given (ignored, never counted)",
            m.protocol_violations.clone(),
        );
        registry.register(
            "rollbacks",
            "Nodes sent back to the last good revision",
            m.rollbacks.clone(),
        );
        registry.register(
            "revision_failures",
            "Revisions that went Failed",
            m.revisions_failed.clone(),
        );
        registry.register(
            "node_apply_duration_seconds",
            "Time from assignment to Provisioned per node",
            m.node_apply_duration.clone(),
        );
        registry.register(
            "wave_duration_seconds",
            "Time from assigning a wave of nodes to all of them Provisioned",
            m.wave_duration.clone(),
        );
        registry.register(
            "rollout_duration_seconds",
            "Time from a revision becoming target to Complete",
            m.rollout_duration.clone(),
        );
    }

    /// The reconcile's own metrics: durations, API errors, leadership, inputs and odd objects.
    fn register_reconcile(&self, registry: &mut Registry) {
        let m = self;
        registry.register(
            "reconcile_duration_seconds",
            "Time of one reconcile (snapshot, plan, writes)",
            m.reconcile_duration.clone(),
        );
        registry.register(
            "reconcile_compute_duration_seconds",
            "Time of one reconcile before its writes (snapshot, plan, metrics): the rest of \
             reconcile_duration_seconds is the API writes",
            m.reconcile_compute_duration.clone(),
        );
        registry.register(
            "api_errors",
            "Kubernetes API errors by verb and category: the writes, and the read that confirms a cut",
            m.api_errors.clone(),
        );
        registry.register(
            "writes_dropped",
            "Writes skipped because this replica is not the leader",
            m.writes_dropped.clone(),
        );
        registry.register(
            "timeout_rechecks_behind",
            "Plans decided again on a fresh read because the cache was behind on a node about to fail by a timeout",
            m.timeout_rechecks_behind.clone(),
        );
        registry.register(
            "cut_rechecks_behind",
            "Revision cuts put off because a quorum read of the inputs disagreed with the cache",
            m.cut_rechecks_behind.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader lease",
            m.leader.clone(),
        );
        registry.register(
            "inputs_pending",
            "1 while changed inputs settle before a revision is cut from them",
            m.inputs_pending.clone(),
        );
        registry.register(
            "tampered_specs",
            "Objects whose spec was edited by hand (not what the configurator wrote), by kind",
            m.tampered_specs.clone(),
        );
        registry.register(
            "undecodable_objects",
            "Objects that do not decode as netwave's types, by kind: reported (Event Undecodable) and \
             skipped",
            m.undecodable_objects.clone(),
        );
        registry.register(
            "quarantined_nodes",
            "Nodes quarantined for failing revisions other nodes provisioned (spec.rollout.quarantine): \
             they get no new revision until an admin releases them",
            m.quarantined_nodes.clone(),
        );
    }

    fn zero_series(&self) {
        let m = self;
        // Every phase and state exists from the start with 0, so alerts and dashboards see zeros
        // instead of missing series.
        for phase in netwave_api::vocab::RevisionPhase::ALL {
            let _ = m.revisions.get_or_create(&PhaseLabels {
                phase: phase.as_str(),
            });
        }
        for state in [
            "updated",
            "in_progress",
            "queued",
            "failed",
            "skipped",
            "waiting_for_agent",
        ] {
            let _ = m.nodes.get_or_create(&NodeStateLabels { state });
        }
        for kind in TAMPERED_KINDS {
            let _ = m.tampered_specs.get_or_create(&KindLabels { kind });
        }
        for kind in netwave_core::undecodable::Kind::all() {
            let _ = m.undecodable_objects.get_or_create(&KindLabels {
                kind: kind.as_str(),
            });
        }
        // Write errors too: a counter that appears at its first increment is invisible to rate() and
        // increase() until a second scrape (and for ever if the replica goes away first), so an outage's
        // errors could leave the dashboard's panel and NetwaveApiErrors empty.
        for verb in Verb::ALL {
            for category in CATEGORIES {
                let _ = m
                    .api_errors
                    .get_or_create(&ApiErrorLabels { verb, category });
            }
        }
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_prefixed_and_typed() {
        let m = Metrics::default();
        m.assignments
            .get_or_create(&ReasonLabels { reason: "rollout" })
            .inc();
        m.api_errors
            .get_or_create(&ApiErrorLabels {
                verb: Verb::patch,
                category: "server",
            })
            .inc();
        let text = m.encode();
        assert!(
            text.contains("# TYPE netwave_assignments counter"),
            "{text}"
        );
        assert!(
            text.contains("netwave_assignments_total{reason=\"rollout\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("netwave_api_errors_total{verb=\"patch\",category=\"server\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE netwave_node_apply_duration_seconds histogram"),
            "{text}"
        );
    }

    /// Found on a real cluster (tests/tests/real_node_monitoring.rs): an API server outage's write
    /// errors appeared as a new series on the leader, which was gone before a second scrape, and the
    /// dashboard's "Configurator API write errors" panel stayed empty.
    #[test]
    fn api_write_errors_start_at_zero_for_every_verb_and_category() {
        let text = Metrics::default().encode();
        for verb in ["create", "patch", "delete", "list"] {
            for category in CATEGORIES {
                let line = format!(
                    "netwave_api_errors_total{{verb=\"{verb}\",category=\"{category}\"}} 0"
                );
                assert!(text.contains(&line), "{line} missing:\n{text}");
            }
        }
    }
}
