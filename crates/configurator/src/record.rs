//! What a leader's plans tell Prometheus: gauges and counters from each plan ([`record`]), and how long
//! nodes took to apply, followed from the changes between plans ([`ApplyTimes`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use netwave_api::vocab::RevisionPhase;
use netwave_core::Timestamp;
use netwave_core::rollout::{self, AssignReason, NodeConfigState, Plan};

use crate::metrics::{Metrics, NodeStateLabels, PhaseLabels, ReasonLabels};
use crate::observed::ConfigChanges;
use crate::snapshot::Snapshot;

/// Records a reconcile's plan in the metrics; `quarantined` is [`Outcome::quarantined`].
pub fn record(metrics: &Metrics, s: &Snapshot, plan: &Plan, quarantined: usize) {
    for a in &plan.assignments {
        metrics
            .assignments
            .get_or_create(&ReasonLabels {
                reason: a.reason.as_str(),
            })
            .inc();
        if a.reason == AssignReason::Rollback {
            metrics.rollbacks.inc();
        }
    }
    metrics.quarantined_nodes.set(quarantined as i64);
    for e in &plan.events {
        match e.reason {
            rollout::EventReason::NodeFailed => metrics.node_failures.inc(),
            rollout::EventReason::RevisionFailed => metrics.revisions_failed.inc(),
            rollout::EventReason::ProtocolViolation => metrics.protocol_violations.inc(),
            _ => 0,
        };
    }
    // A revision completing now: how long its rollout took.
    for u in &plan.status_updates {
        let before = s
            .revisions
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(u.revision.as_str()));
        let was_complete = before
            .and_then(|r| r.status.as_ref())
            .and_then(|st| st.phase.as_deref())
            == Some(RevisionPhase::Complete.as_str());
        if u.status.phase.as_deref() == Some(RevisionPhase::Complete.as_str())
            && !was_complete
            && let (Some(start), Some(end)) = (&u.status.started_at, &u.status.completed_at)
        {
            let secs = end.0.duration_since(start.0).as_secs_f64();
            metrics.rollout_duration.observe(secs.max(0.0));
        }
    }
    // Gauges reflect the statuses as they will be after this plan.
    let mut phases: BTreeMap<&'static str, i64> = RevisionPhase::ALL
        .into_iter()
        .map(|p| (p.as_str(), 0))
        .collect();
    for r in &s.revisions {
        let updated = plan
            .status_updates
            .iter()
            .find(|u| Some(&u.revision) == r.metadata.name.as_ref());
        let phase = updated
            .map(|u| &*u.status)
            .or(r.status.as_ref())
            .and_then(|st| st.phase.as_deref());
        // Unknown phases (from a newer netwave) are not counted rather than becoming a new label value.
        if let Some(known) = RevisionPhase::parse(phase) {
            *phases.entry(known.as_str()).or_default() += 1;
        }
    }
    for (phase, n) in phases {
        metrics
            .revisions
            .get_or_create(&PhaseLabels { phase })
            .set(n);
    }
    let target = plan.report.target.as_deref();
    // Borrowed, not copied: a status lists every failed node, and this runs at every reconcile.
    let none = netwave_api::NetworkConfigRevisionStatus::default();
    let st = target
        .and_then(|t| {
            (plan.status_updates.iter())
                .find(|u| u.revision == t)
                .map(|u| &*u.status)
                .or_else(|| {
                    (s.revisions.iter())
                        .find(|r| r.metadata.name.as_deref() == Some(t))
                        .and_then(|r| r.status.as_ref())
                })
        })
        .unwrap_or(&none);
    for (state, n) in [
        ("updated", st.updated),
        ("in_progress", st.in_progress),
        ("queued", st.queued),
        ("failed", st.failed),
        ("skipped", st.skipped),
        ("waiting_for_agent", st.waiting_for_agent),
    ] {
        metrics
            .nodes
            .get_or_create(&NodeStateLabels { state })
            .set(i64::from(n));
    }
}

/// Observes, once per (node, revision), how long the node took from assignment to `Provisioned`, and once
/// per wave — the nodes assigned one revision at the same moment — how long until all of them were. The
/// first reconcile of a process only remembers what is already done, so a new leader does not report the
/// history it inherited. After that it reads only the node configs that changed (#28).
#[derive(Default)]
pub struct ApplyTimes {
    started: bool,
    /// Node → the revision it was last seen updated to.
    seen: HashMap<String, String>,
    /// Node → the wave it counts in, and whether it is updated.
    member: HashMap<String, (Wave, bool)>,
    /// Wave → (nodes, updated nodes).
    waves: HashMap<Wave, (usize, usize)>,
    waves_done: HashSet<Wave>,
}

/// A wave: a revision and the moment its nodes were assigned it.
type Wave = (String, i64);

impl ApplyTimes {
    /// From a reconcile's node configs: all of them the first time (`Outcome::configs`), then only
    /// those that changed since the last reconcile (`Outcome::changes`).
    pub fn observe(
        &mut self,
        configs: &[Arc<NodeConfigState>],
        changes: &ConfigChanges,
        now: Timestamp,
        metrics: &Metrics,
    ) {
        let first = !self.started;
        self.started = true;
        let elapsed = |at: Timestamp| now.0.saturating_sub(at.0).max(0) as f64 / 1000.0;
        let (changed, removed): (&[Arc<NodeConfigState>], &[String]) = if first {
            (configs, &[])
        } else {
            (&changes.changed, &changes.removed)
        };
        let mut touched: BTreeSet<Wave> = BTreeSet::new();
        // A config that went is no longer counted in its wave; what it was last seen updated to is
        // kept, so one that comes back as it was is not observed twice.
        for name in removed {
            self.leave(name, &mut touched);
        }
        for state in changed {
            let revision = state.spec.revision.as_str();
            let updated = rollout::is_updated(state, &state.spec.revision);
            self.leave(&state.name, &mut touched);
            if let Some(at) = state.spec.assigned_at {
                let wave = (revision.to_string(), at.0);
                let w = self.waves.entry(wave.clone()).or_default();
                w.0 += 1;
                w.1 += usize::from(updated);
                touched.insert(wave.clone());
                self.member.insert(state.name.to_string(), (wave, updated));
            }
            if !updated {
                self.seen.remove(state.name.as_str());
                continue;
            }
            if self.seen.get(state.name.as_str()).map(String::as_str) == Some(revision) {
                continue;
            }
            if !first && let Some(at) = state.spec.assigned_at {
                metrics.node_apply_duration.observe(elapsed(at));
            }
            self.seen
                .insert(state.name.to_string(), revision.to_string());
        }
        for wave in touched {
            let (nodes, updated) = self.waves.get(&wave).copied().unwrap_or_default();
            if nodes == 0 {
                self.waves.remove(&wave);
            }
            if nodes > 0 && nodes == updated {
                let at = wave.1;
                if self.waves_done.insert(wave) && !first {
                    metrics.wave_duration.observe(elapsed(Timestamp(at)));
                }
            } else {
                self.waves_done.remove(&wave);
            }
        }
    }

    /// `node` no longer counts in the wave it was in.
    fn leave(&mut self, node: &str, touched: &mut BTreeSet<Wave>) {
        if let Some((wave, updated)) = self.member.remove(node) {
            if let Some(w) = self.waves.get_mut(&wave) {
                w.0 -= 1;
                w.1 -= usize::from(updated);
            }
            touched.insert(wave);
        }
    }
}

#[cfg(test)]
mod apply_times_tests {
    use super::*;
    use netwave_core::rollout::{AgentPhase, AgentReport, AssignedSpec};

    /// The metrics as a full pass over every config observed them before #28 (the reference).
    #[derive(Default)]
    struct FullPass {
        seen: Option<BTreeMap<String, String>>,
        waves_done: BTreeSet<(String, i64)>,
    }

    impl FullPass {
        fn observe(&mut self, configs: &[Arc<NodeConfigState>], now: Timestamp, m: &Metrics) {
            let first = self.seen.is_none();
            let seen = self.seen.get_or_insert_with(BTreeMap::new);
            let mut waves: BTreeMap<(&str, i64), (usize, usize)> = BTreeMap::new();
            let elapsed = |at: Timestamp| now.0.saturating_sub(at.0).max(0) as f64 / 1000.0;
            for state in configs {
                let revision = state.spec.revision.as_str();
                let updated = rollout::is_updated(state, &state.spec.revision);
                if let Some(at) = state.spec.assigned_at {
                    let w = waves.entry((revision, at.0)).or_default();
                    w.0 += 1;
                    w.1 += usize::from(updated);
                }
                if !updated {
                    seen.remove(state.name.as_str());
                    continue;
                }
                if seen.get(state.name.as_str()).map(String::as_str) == Some(revision) {
                    continue;
                }
                if !first && let Some(at) = state.spec.assigned_at {
                    m.node_apply_duration.observe(elapsed(at));
                }
                seen.insert(state.name.to_string(), revision.to_string());
            }
            let done: BTreeSet<(String, i64)> = waves
                .into_iter()
                .filter(|(_, (n, updated))| n == updated)
                .map(|((rev, at), _)| (rev.to_string(), at))
                .collect();
            if !first {
                for (_, at) in done.difference(&self.waves_done) {
                    m.wave_duration.observe(elapsed(Timestamp(*at)));
                }
            }
            self.waves_done = done;
        }
    }

    fn histograms(m: &Metrics) -> Vec<String> {
        m.encode()
            .lines()
            .filter(|l| l.starts_with("netwave_node_apply") || l.starts_with("netwave_wave"))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn apply_times_from_changes_observe_what_a_full_pass_over_every_config_observed() {
        for seed in 1..=200u64 {
            let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut below = |n: u64| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x % n
            };
            let (incremental, reference) = (Metrics::default(), Metrics::default());
            let (mut new, mut old) = (ApplyTimes::default(), FullPass::default());
            let mut store: BTreeMap<String, Arc<NodeConfigState>> = BTreeMap::new();
            for step in 0..80i64 {
                let now = Timestamp(1_000_000 + step * 500);
                let mut changes = ConfigChanges::default();
                for _ in 0..=below(4) {
                    let name = format!("n{}", below(10));
                    if below(6) == 0 {
                        if store.remove(&name).is_some() {
                            changes.removed.retain(|n| n != &name);
                            changes.changed.retain(|c| c.name != name);
                            changes.removed.push(name);
                        }
                        continue;
                    }
                    let revision = format!("r{}", below(2));
                    let assigned = Timestamp(1_000_000 + below(4) as i64 * 1_000);
                    let provisioned = below(2) == 0;
                    let state = Arc::new(NodeConfigState {
                        name: (&name).into(),
                        spec: AssignedSpec {
                            revision: (&revision).into(),
                            config_hash: format!("h-{revision}").into(),
                            assigned_at: (below(5) != 0).then_some(assigned),
                            ..AssignedSpec::default()
                        },
                        status: AgentReport {
                            phase: provisioned.then_some(AgentPhase::Provisioned),
                            observed_revision: Some((&revision).into()),
                            observed_retry: Some(0),
                            config_hash: Some(format!("h-{revision}").into()),
                            ..AgentReport::default()
                        },
                        record: Default::default(),
                    });
                    store.insert(name.clone(), state.clone());
                    changes.removed.retain(|n| n != &name);
                    changes.changed.retain(|c| c.name != name);
                    changes.changed.push(state);
                }
                let configs: Vec<Arc<NodeConfigState>> = store.values().cloned().collect();
                new.observe(&configs, &changes, now, &incremental);
                old.observe(&configs, now, &reference);
                assert_eq!(
                    histograms(&incremental),
                    histograms(&reference),
                    "seed {seed}, step {step}"
                );
            }
        }
    }
}
