//! The reconcile loop: when to reconcile, and what one reconcile does around the decision — take a
//! snapshot, [`crate::decide::compute`], confirm on a fresh read what the cache may be behind on
//! ([`crate::recheck`]), report, pace the revision status writes, and hand the intents to the writer.
//!
//! ```text
//!   wake-up (watch, requeue, resync) ─► snapshot ─► decide ─► recheck ─► report ─► pace ─► writer
//! ```

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use netwave_core::Timestamp;
use netwave_core::revision::{self, InputSettle};
use netwave_core::rollout::{self, Plan};
use netwave_core::undecodable::{self, Kind};
use tracing::{Instrument, debug, info, info_span, warn};

use crate::assign_log::AssignLog;
use crate::clock::now;
pub use crate::decide::Settings;
use crate::decide::{Outcome, compute, uid_of_input};
use crate::events::{ShellEvent, equals_failed_note, object_ref};
use crate::liveness::Liveness;
use crate::memory::Memory;
use crate::metrics::Metrics;
use crate::pace::Pace;
use crate::recheck;
use crate::record::{ApplyTimes, record};
pub use crate::snapshot::Snapshot;
use crate::snapshot::fold_objects;
use crate::watch::{Stores, Wakeups};
use crate::writer::{Intent, Outcome as WriteOutcome, Writer};

/// When each revision status write of a plan goes out (`intents` in plan order; `stored`: a
/// revision's status on record; `written`: when each status was last written, kept up to date). A
/// write that only moves counters, and the words and progress stamp that follow them
/// ([`rollout::counters_only`]):
/// - within [`COUNTERS_STATUS_INTERVAL`] of the last write of that status, is held back (the time to
///   write it is returned);
/// - else goes after the node writes: no decision reads it, so the reconcile's assignments need not
///   wait for its round trip (at 15,000 nodes it lists about a hundred failed nodes, 14 KB; #28).
///
/// Any other status write stays where the plan put it, before the assignments that need it on record
/// (a failure before its rollback, `Validated` before the first assignment).
fn schedule_statuses<'s>(
    intents: &mut Vec<Intent>,
    stored: impl Fn(&str) -> Option<&'s netwave_api::NetworkConfigRevisionStatus>,
    written: &mut BTreeMap<String, tokio::time::Instant>,
    now: tokio::time::Instant,
) -> Option<tokio::time::Instant> {
    let mut due = None;
    let mut late = Vec::new();
    let planned = std::mem::take(intents);
    for intent in planned {
        let Intent::RevisionStatus { name, status } = &intent else {
            intents.push(intent);
            continue;
        };
        if !stored(name).is_some_and(|s| rollout::counters_only(s, status)) {
            written.insert(name.clone(), now);
            intents.push(intent);
            continue;
        }
        match written.get(name) {
            Some(&last) if now < last + COUNTERS_STATUS_INTERVAL => {
                let at = last + COUNTERS_STATUS_INTERVAL;
                due = Some(due.map_or(at, |d: tokio::time::Instant| d.min(at)));
            }
            _ => {
                written.insert(name.clone(), now);
                late.push(intent);
            }
        }
    }
    intents.extend(late);
    due
}

/// The reconcile loop: waits for a change or a requeue time, computes, writes when leader.
pub struct Reconciler {
    pub stores: Stores,
    pub writer: Writer,
    pub metrics: Arc<Metrics>,
    pub settings: Settings,
    pub changed: Arc<Wakeups>,
    cache: Memory,
    settle: InputSettle,
    /// Why the last cut was put off ([`Self::confirm_cut`]), as last logged.
    cut_put_off: Option<String>,
    apply_times: ApplyTimes,
    /// The Failed revision the inputs were last reported to equal (one Event per occurrence).
    reported_equals_failed: Option<String>,
    /// When each revision's status was last written (see [`COUNTERS_STATUS_INTERVAL`]).
    status_written: BTreeMap<String, tokio::time::Instant>,
    /// Told when a pass starts and ends (a hung pass makes the replica let go of the Lease).
    liveness: Option<Liveness>,
    /// Objects seen not decoding: the error logged for each, and whether this replica wrote its Event.
    undecodable_seen: BTreeMap<(Kind, String), (String, bool)>,
    /// Inputs (by hash) too large to become a revision: last logged, and last told in an Event.
    too_large_logged: Option<String>,
    too_large_evented: Option<String>,
    /// The last reconcile's snapshot, refreshed by the next one ([`Snapshot::refresh`]).
    snapshot: Option<Snapshot>,
    /// Assignments not logged yet (a line per revision and reason at most every ten seconds).
    assign_log: AssignLog,
    /// How long a leader gathers changes before it reconciles, from what its reconciles cost.
    pace: Pace,
}

/// A revision status write that only moves counters (and the words and progress stamp that follow
/// them) goes out at most this often per revision. Every agent report changes the counters: writing
/// them each time cost 0.4-0.6 status patches per node in a rollout (#14); now it is about one per
/// second. Anything else — a phase, a condition, a failure on record, which must be written before
/// the rollbacks that follow it — is written at once.
const COUNTERS_STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// A standby writes nothing: it reconciles at most this often after a change (and at once when it
/// becomes the leader), instead of after every agent report like the leader (which cost the standby
/// as much CPU as the leader, #14). A standby that has not listed the node configs (it does when a
/// takeover is near, `crate::watch`) skips its reconciles; one that has keeps them and plans on
/// them, without writing.
const STANDBY_INTERVAL: Duration = Duration::from_secs(2);

impl Reconciler {
    pub fn new(
        stores: Stores,
        writer: Writer,
        metrics: Arc<Metrics>,
        settings: Settings,
        changed: Arc<Wakeups>,
    ) -> Self {
        let pace = Pace::new(settings.coalesce, settings.reaction_target);
        Self {
            stores,
            writer,
            metrics,
            settings,
            changed,
            cache: Memory::default(),
            settle: InputSettle::default(),
            cut_put_off: None,
            apply_times: ApplyTimes::default(),
            reported_equals_failed: None,
            status_written: BTreeMap::new(),
            liveness: None,
            undecodable_seen: BTreeMap::new(),
            too_large_logged: None,
            too_large_evented: None,
            snapshot: None,
            assign_log: AssignLog::default(),
            pace,
        }
    }

    /// Inputs too large to become a revision: one log line per replica and one Event (on the largest
    /// object) from the leader per occurrence, not one of each per reconcile.
    fn report_too_large(&mut self, s: &Snapshot, outcome: &mut Outcome) {
        let hash = outcome.too_large.as_ref().map(|(h, _)| h.as_str());
        let problem = outcome.too_large.as_ref().map(|(_, p)| p);
        if revision::equals_failed_notice(self.too_large_logged.as_deref(), hash).is_some()
            && let Some(p) = problem
        {
            warn!(inputs = ?hash, bytes = p.bytes, limit = p.limit, "{p}");
        }
        self.too_large_logged = hash.map(str::to_string);
        if !self.writer.is_leader() {
            return;
        }
        if revision::equals_failed_notice(self.too_large_evented.as_deref(), hash).is_some()
            && let Some(p) = problem
            && let Some(largest) = p.largest()
        {
            let regarding = object_ref(
                largest.kind.as_str(),
                &largest.name,
                uid_of_input(s, largest),
            );
            (outcome.intents).push(ShellEvent::InputsTooLarge.intent(regarding, p.to_string()));
        }
        self.too_large_evented = hash.map(str::to_string);
    }

    /// Objects that do not decode: one log line per object and error in every replica, one Event on
    /// the object from the leader, and the gauge by kind. Not one of each per reconcile.
    fn report_undecodable(&mut self, s: &Snapshot, intents: &mut Vec<Intent>) {
        let leader = self.writer.is_leader();
        let mut seen = BTreeMap::new();
        for (u, uid) in &s.undecodable {
            let key = (u.kind, u.name.clone());
            let mut evented = match self.undecodable_seen.remove(&key) {
                Some((error, evented)) if error == u.error => evented,
                _ => {
                    warn!(kind = %u.kind, name = %u.name, error = %u.error, "{}", undecodable::note(u));
                    false
                }
            };
            if leader && !evented {
                let regarding = object_ref(u.kind.as_str(), &u.name, uid.clone());
                intents.push(ShellEvent::Undecodable.intent(regarding, undecodable::note(u)));
                evented = true;
            }
            seen.insert(key, (u.error.clone(), evented));
        }
        for (kind, name) in self.undecodable_seen.keys() {
            info!(%kind, %name, "decodes again (or is gone)");
        }
        self.undecodable_seen = seen;
        for kind in Kind::all() {
            let n = s.undecodable.iter().filter(|(u, _)| u.kind == kind).count();
            self.metrics
                .undecodable_objects
                .get_or_create(&crate::metrics::KindLabels {
                    kind: kind.as_str(),
                })
                .set(n as i64);
        }
    }

    /// Reports each pass to `liveness`.
    pub fn with_liveness(mut self, liveness: Liveness) -> Self {
        self.liveness = Some(liveness);
        self
    }

    /// Holds back revision status writes that only move counters within [`COUNTERS_STATUS_INTERVAL`]
    /// of the last write of that status, and sends the other counter moves after the node writes
    /// ([`schedule_statuses`]); returns when to write what was held back.
    fn defer_counter_statuses(
        &mut self,
        snapshot: &Snapshot,
        intents: &mut Vec<Intent>,
    ) -> Option<tokio::time::Instant> {
        let stored = |name: &str| {
            (snapshot.revisions.iter())
                .find(|r| r.metadata.name.as_deref() == Some(name))
                .and_then(|r| r.status.as_ref())
        };
        let now = tokio::time::Instant::now();
        let due = schedule_statuses(intents, stored, &mut self.status_written, now);
        self.status_written.retain(|name, _| {
            snapshot
                .revisions
                .iter()
                .any(|r| r.metadata.name.as_deref() == Some(name))
        });
        due
    }

    /// Runs until `shutdown` resolves; the write in progress finishes first.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut leadership = self.writer.gate();
        let mut wake = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                first = self.changed.wait() => {
                    // Coalesce bursts (a watch relist delivers many events at once, a rollout
                    // hundreds of reports a second), counting from the first change not taken.
                    tokio::time::sleep_until(first + self.pace.wait()).await;
                    // A standby waits out its interval, or until it leads.
                    if !self.writer.is_leader() {
                        let until = tokio::time::Instant::now() + STANDBY_INTERVAL;
                        leadership.leads_by(until).await;
                    }
                }
                _ = tokio::time::sleep_until(wake) => {}
            }
            let pass = self.liveness.as_ref().map(Liveness::pass);
            let retry = self.reconcile_once().await;
            drop(pass);
            wake = tokio::time::Instant::now() + retry.unwrap_or(self.settings.resync);
            // Writes by this reconcile come back through the watches and notify `changed`; the core
            // returns an empty plan for them, so that converges instead of looping.
        }
    }

    /// `compute` again on `fresher`, in place of the `first` outcome, which is dropped: what it
    /// reported as new is due again.
    fn decide_again(
        &mut self,
        fresher: Snapshot,
        first: &Outcome,
        now: Timestamp,
    ) -> (Snapshot, Outcome) {
        self.cache.integrity.not_reported(&first.tampered);
        let outcome = compute(
            &fresher,
            &self.settings,
            &mut self.cache,
            &mut self.settle,
            now,
        );
        (fresher, outcome)
    }

    /// Revisions whose inputs the cache misses past the grace are judged gone only on a fresh read
    /// ([`recheck`]). Every replica asks: a standby's count of tampered specs feeds the alert too.
    async fn recheck_inputs_gone(
        &mut self,
        snapshot: Snapshot,
        outcome: Outcome,
        now: Timestamp,
    ) -> (Snapshot, Outcome) {
        let names = recheck::new_inputs_gone(&outcome.tampered);
        if names.is_empty() {
            return (snapshot, outcome);
        }
        match recheck::read_revisions(self.writer.client().clone(), &names).await {
            Ok(fresh) => {
                let Some(fresher) = snapshot.with_fresh_revisions(&fresh) else {
                    // Gone on the API server as in the cache: the verdict stands.
                    return (snapshot, outcome);
                };
                debug!(
                    revisions = ?names,
                    "inputs missing from the cache are not gone on the API server (their watch is \
                     behind, or the revision's deletion is on its way): deciding on a fresh read"
                );
                self.decide_again(fresher, &outcome, now)
            }
            Err(e) => {
                warn!(
                    revisions = ?names, error = %e,
                    "could not read revisions' inputs again to confirm they are gone; nothing is \
                     decided until they can be"
                );
                self.cache.integrity.not_reported(&outcome.tampered);
                let mut tampered = outcome.tampered;
                tampered.revisions.retain(|n, _| !names.contains(n));
                tampered.unreported_revisions.clear();
                tampered.unreported_node_configs.clear();
                let outcome = Outcome {
                    requeue_at: Some(Timestamp(now.0 + 1000)),
                    ..Outcome::only(Vec::new(), tampered)
                };
                (snapshot, outcome)
            }
        }
    }

    /// The plan again on fresh objects, when it fails nodes by a timeout and the cache turns out to
    /// be behind on any of them ([`crate::recheck`]); else the plan as it is. Only a leader reads:
    /// a standby's plans are never written.
    async fn recheck_timeouts(
        &mut self,
        snapshot: Snapshot,
        outcome: Outcome,
        now: Timestamp,
    ) -> (Snapshot, Outcome) {
        let names = match &outcome.plan {
            Some(plan) if self.writer.is_leader() => recheck::new_timeouts(&snapshot, plan),
            _ => return (snapshot, outcome),
        };
        if names.is_empty() {
            return (snapshot, outcome);
        }
        let fresh = recheck::read_fresh(self.writer.client().clone(), names.clone()).await;
        let Some(fresher) = snapshot.with_fresh_configs(fresh) else {
            return (snapshot, outcome);
        };
        self.metrics.timeout_rechecks_behind.inc();
        info!(
            nodes = names.len(),
            "the cache was behind on nodes about to fail by a timeout: deciding again on a fresh read"
        );
        self.decide_again(fresher, &outcome, now)
    }

    /// One reconcile; returns how long until the next time-based wake-up. Stages: the snapshot →
    /// [`Self::decide`] (compute, then what the cache may be behind on, read fresh) → [`Self::observe`]
    /// (metrics) → [`Self::report`] (the shell's Events) → the status pacing → the writes → when next.
    pub async fn reconcile_once(&mut self) -> Option<Duration> {
        let span = info_span!("reconcile");
        let started = std::time::Instant::now();
        // Changes from here on are for the next reconcile's window (those before the snapshot below
        // are in it as well: that reconcile then plans nothing).
        self.changed.take();
        let snapshot = span.in_scope(|| self.snapshot())?;
        let now = now();
        let (snapshot, mut outcome) = self.decide(snapshot, now).instrument(span.clone()).await;
        span.in_scope(|| {
            self.observe(&snapshot, &outcome, now);
            self.report(&snapshot, &mut outcome);
        });
        let deferred = if self.writer.is_leader() {
            self.defer_counter_statuses(&snapshot, &mut outcome.intents)
        } else {
            None
        };
        self.metrics
            .reconcile_compute_duration
            .observe(started.elapsed().as_secs_f64());
        let intents = std::mem::take(&mut outcome.intents);
        let written = self
            .write(intents, outcome.plan.as_ref())
            .instrument(span)
            .await;
        let took = started.elapsed();
        self.metrics.reconcile_duration.observe(took.as_secs_f64());
        if self.writer.is_leader() {
            self.pace.observe(took);
        }
        self.snapshot = Some(snapshot);
        self.next_wake(&outcome, &written, deferred, now)
    }

    /// The stores now: the last snapshot brought up to date (the nodes and node configs read again
    /// only where their watches saw a change), or `None` while the node configs are not listed.
    fn snapshot(&mut self) -> Option<Snapshot> {
        if !self.stores.node_configs_ready() {
            // A standby keeps no node configs (`crate::watch`); a new leader's list of them is on
            // its way, and its end wakes this loop. Nothing can be planned without them.
            self.metrics.leader.set(i64::from(self.writer.is_leader()));
            self.snapshot = None;
            return None;
        }
        Some(match self.snapshot.take() {
            Some(last) => last.refresh(&self.stores),
            None => Snapshot::take(&self.stores),
        })
    }

    /// [`compute`] on `snapshot`, then again on a fresh read where the cache may be behind.
    async fn decide(&mut self, snapshot: Snapshot, now: Timestamp) -> (Snapshot, Outcome) {
        let outcome = compute(
            &snapshot,
            &self.settings,
            &mut self.cache,
            &mut self.settle,
            now,
        );
        let (snapshot, outcome) = self.recheck_inputs_gone(snapshot, outcome, now).await;
        let (snapshot, outcome) = self.recheck_timeouts(snapshot, outcome, now).await;
        self.confirm_cut(snapshot, outcome, now).await
    }

    /// A revision is cut or reactivated only from inputs a quorum read confirms ([`recheck`]): when
    /// the API server has other inputs than the cache, nothing is written and the loop asks again in
    /// a second, once the watches have caught up. Said once per problem.
    async fn confirm_cut(
        &mut self,
        snapshot: Snapshot,
        outcome: Outcome,
        now: Timestamp,
    ) -> (Snapshot, Outcome) {
        let cuts = outcome.intents.iter().any(|i| {
            matches!(
                i,
                Intent::CreateRevision { .. } | Intent::ReactivateRevision { .. }
            )
        });
        if !cuts || !self.writer.is_leader() {
            return (snapshot, outcome);
        }
        let (_, cached) = self.cache.folded.of(&snapshot);
        let problem = match recheck::read_inputs(self.writer.client()).await {
            Ok(fresh) if revision::inputs_hash(&fold_objects(&fresh)) == cached => {
                self.cut_put_off = None;
                return (snapshot, outcome);
            }
            Ok(fresh) => {
                self.metrics.cut_rechecks_behind.inc();
                let kinds = recheck::lagging_kinds(&snapshot.inputs, &fresh);
                let kinds: Vec<String> = (kinds.iter())
                    .map(|(kind, n)| format!("{kind} ({n} object(s))"))
                    .collect();
                format!(
                    "the API server has other inputs than this configurator's cache ({}): no \
                     revision is cut until the watches catch up",
                    kinds.join(", ")
                )
            }
            Err(e) => {
                if let Some(category) = e.category {
                    let labels = crate::metrics::ApiErrorLabels {
                        verb: crate::metrics::Verb::list,
                        category,
                    };
                    self.metrics.api_errors.get_or_create(&labels).inc();
                }
                format!(
                    "could not read the inputs to confirm a cut ({}): no revision is cut",
                    e.message
                )
            }
        };
        if self.cut_put_off.as_ref() != Some(&problem) {
            warn!("{problem}");
            self.cut_put_off = Some(problem);
        }
        let outcome = Outcome {
            requeue_at: Some(Timestamp(now.0 + 1000)),
            ..Outcome::only(Vec::new(), outcome.tampered)
        };
        (snapshot, outcome)
    }

    /// What the outcome tells the metrics (a leader's plan; every replica's gauges).
    fn observe(&mut self, snapshot: &Snapshot, outcome: &Outcome, now: Timestamp) {
        if !self.writer.is_leader() {
            // Changes a standby passes over are not followed: a leader again starts afresh.
            self.apply_times = ApplyTimes::default();
        }
        if let Some(plan) = &outcome.plan
            && self.writer.is_leader()
        {
            record(&self.metrics, snapshot, plan, outcome.quarantined);
            self.apply_times
                .observe(&outcome.configs, &outcome.changes, now, &self.metrics);
            for w in &plan.report.waiting {
                debug!(waiting = %w);
            }
        }
        self.metrics.leader.set(i64::from(self.writer.is_leader()));
        self.metrics
            .inputs_pending
            .set(i64::from(outcome.inputs_pending));
        let [rev_kind, nnc_kind] = crate::metrics::TAMPERED_KINDS;
        for (kind, n) in [
            (rev_kind, outcome.tampered.revisions.len()),
            (nnc_kind, outcome.tampered.node_configs.len()),
        ] {
            self.metrics
                .tampered_specs
                .get_or_create(&crate::metrics::KindLabels { kind })
                .set(n as i64);
        }
    }

    /// The shell's own findings as Events (each once per occurrence): undecodable objects, inputs too
    /// large for a revision, inputs equal to a Failed revision.
    fn report(&mut self, snapshot: &Snapshot, outcome: &mut Outcome) {
        self.report_undecodable(snapshot, &mut outcome.intents);
        self.report_too_large(snapshot, outcome);
        if !self.writer.is_leader() {
            return;
        }
        if let Some(name) = revision::equals_failed_notice(
            self.reported_equals_failed.as_deref(),
            outcome.equals_failed.as_deref(),
        ) {
            let failed =
                (snapshot.revisions.iter()).find(|r| r.metadata.name.as_deref() == Some(name));
            let uid = failed.and_then(|r| r.metadata.uid.clone());
            outcome
                .intents
                .push(ShellEvent::InputsEqualFailedRevision.intent(
                    object_ref("NetworkConfigRevision", name, uid),
                    equals_failed_note(name, failed.map(AsRef::as_ref)),
                ));
        }
        self.reported_equals_failed = outcome.equals_failed.clone();
    }

    /// Sends `intents` (a standby's writer drops them) and logs the assignments it sent.
    async fn write(&mut self, intents: Vec<Intent>, plan: Option<&Plan>) -> WriteOutcome {
        let n = intents.len();
        let written = if n > 0 {
            self.writer.execute(intents, &self.metrics).await
        } else {
            Default::default()
        };
        let sent: HashSet<&str> = written.assigned.iter().map(String::as_str).collect();
        let logged = std::time::Instant::now();
        for line in self.assign_log.record(plan, &sent, logged) {
            info!(revision = %line.revision, reason = %line.reason, count = line.count, "{}", line.message);
        }
        if n > 0 {
            debug!(
                intents = n,
                written = written.written,
                failed = written.failed,
                dropped = written.dropped,
                "reconciled"
            );
        }
        written
    }

    /// How long until the next time-based wake-up: the outcome's requeue, a write to retry or held
    /// back, or the assignment log's next summary, whichever comes first.
    fn next_wake(
        &self,
        outcome: &Outcome,
        written: &WriteOutcome,
        deferred: Option<tokio::time::Instant>,
        now: Timestamp,
    ) -> Option<Duration> {
        let time_based = outcome
            .requeue_at
            .map(|t| Duration::from_millis(t.0.saturating_sub(now.0).max(0) as u64));
        let summary = (self.assign_log.next_due())
            .map(|t| t.saturating_duration_since(std::time::Instant::now()));
        let retry = [written.retry_at, deferred]
            .into_iter()
            .flatten()
            .min()
            .map(|t| t.saturating_duration_since(tokio::time::Instant::now()));
        let retry = [retry, summary].into_iter().flatten().min();
        [time_based, retry].into_iter().flatten().min()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use netwave_api::vocab::{
        ConditionStatus, NodeReason, RevisionCondition, RevisionPhase, revision_reasons,
    };
    use netwave_api::{FailedNode, NetworkConfigRevisionStatus};

    use netwave_core::rollout::counters_only;

    fn progressing(updated: u32) -> NetworkConfigRevisionStatus {
        NetworkConfigRevisionStatus {
            phase: Some(RevisionPhase::Progressing.as_str().into()),
            conditions: vec![Condition {
                type_: RevisionCondition::Progressing.as_str().into(),
                status: ConditionStatus::True.as_str().into(),
                reason: revision_reasons::ROLLOUT_PROGRESSING.into(),
                message: format!("{updated} of 10 node(s) updated"),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ),
                observed_generation: Some(1),
            }],
            total: 10,
            updated,
            in_progress: 10 - updated,
            message: Some(format!("{updated} of 10 node(s) updated")),
            ..Default::default()
        }
    }

    /// Only a change of counters (and the words that follow them) may wait for the next status write;
    /// a phase or a failure on record never waits (a rollback must find the failure written first).
    #[test]
    fn only_counter_moves_may_be_held_back() {
        let stored = progressing(3);
        assert!(counters_only(&stored, &progressing(4)));
        let mut complete = progressing(10);
        complete.phase = Some(RevisionPhase::Complete.as_str().into());
        assert!(!counters_only(&stored, &complete));
        let mut failed = progressing(4);
        failed.failed_nodes.push(FailedNode {
            node: "node-1".into(),
            reason: NodeReason::ApplyFailed.as_str().into(),
            ..Default::default()
        });
        failed.failed = 1;
        assert!(!counters_only(&stored, &failed));
        let mut condition = progressing(4);
        condition.conditions[0].status = ConditionStatus::False.as_str().into();
        assert!(!counters_only(&stored, &condition));
    }

    /// A plan's counter moves go out after its node writes (and at most once a second); a failure on
    /// record stays before them, where the rollback that follows needs it.
    #[test]
    fn counter_moves_go_after_the_node_writes_and_a_failure_before_them() {
        use std::collections::BTreeMap;
        use std::sync::Arc;
        use std::time::Duration;

        use crate::writer::Intent;

        let status = |name: &str, st: NetworkConfigRevisionStatus| Intent::RevisionStatus {
            name: name.into(),
            status: Arc::new(st),
        };
        let assign = |node: &str| Intent::ApplyNodeConfig {
            node: node.into(),
            spec: Box::new(netwave_api::NodeNetworkConfigSpec {
                revision: "rev-a".into(),
                sequence: 1,
                config_hash: "hash".into(),
                retry: 0,
                config: netwave_api::NodeConfig::default(),
            }),
            assigned_at: None,
            clear_queued: false,
            based_on: None,
            pending: None,
        };
        let failing = |updated: u32| {
            let mut st = progressing(updated);
            st.failed_nodes.push(FailedNode {
                node: "node-9".into(),
                reason: NodeReason::ApplyFailed.as_str().into(),
                ..Default::default()
            });
            st.failed = 1;
            st
        };
        let on_record = progressing(3);
        let keys = |intents: &[Intent]| intents.iter().map(Intent::key).collect::<Vec<_>>();
        let t0 = tokio::time::Instant::now();
        let mut written = BTreeMap::new();

        let mut intents = vec![
            status("rev-a", progressing(4)),
            status("rev-b", failing(4)),
            assign("node-1"),
            assign("node-2"),
        ];
        let due = super::schedule_statuses(&mut intents, |_| Some(&on_record), &mut written, t0);
        assert_eq!(
            keys(&intents),
            [
                "ncr-status/rev-b",
                "nnc/node-1",
                "nnc/node-2",
                "ncr-status/rev-a"
            ]
        );
        assert_eq!(due, None);

        // Half a second later the counters of rev-a wait for their second; a failure never waits.
        let mut intents = vec![
            status("rev-a", progressing(5)),
            status("rev-b", failing(5)),
            assign("node-3"),
        ];
        let later = t0 + Duration::from_millis(500);
        let due = super::schedule_statuses(&mut intents, |_| Some(&on_record), &mut written, later);
        assert_eq!(keys(&intents), ["ncr-status/rev-b", "nnc/node-3"]);
        assert_eq!(due, Some(t0 + Duration::from_secs(1)));

        // A revision with no status on record: its status stays where the plan put it.
        let mut intents = vec![assign("node-4"), status("rev-c", progressing(0))];
        let due = super::schedule_statuses(&mut intents, |_| None, &mut written, later);
        assert_eq!(keys(&intents), ["nnc/node-4", "ncr-status/rev-c"]);
        assert_eq!(due, None);
    }
}
