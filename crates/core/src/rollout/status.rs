//! The desired `NetworkConfigRevisionStatus` of each revision after a step, and the Events that its
//! transitions deserve. Everything here is a function of the evaluated revision, the counts after the plan
//! and `now`; timestamps are only ever taken from `now` at a transition and kept afterwards, so a second
//! step over the same world computes a status equal to the stored one and writes nothing.
//!
//! ```text
//!   build(ctx, i) ─► common: Created / RetryStarted / NodeFailed Events, attempt, pause (Paused)
//!        │
//!        ├─ Fate::Target ─► target   Pending → Progressing → Complete; progress deadline; canaries
//!        ├─ Fate::Failed ─► failed   by validation, or by maxFailures (rollback or nowhere to go)
//!        └─ Fate::Older  ─► older    Complete (the last good one, or earlier) or Superseded
//!                               each sets Validated (one builder), Progressing, Available, Degraded
//!        └─ then Ready, Reconciling, Stalled from the phase and those conditions (`health`, kstatus)
//! ```

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use netwave_api::{FailedNode, NetworkConfigRevisionStatus, ValidationResult};

use super::health;
use super::plan::{Event, EventReason, ObjectRef, WaitingOn};
use super::vocab::ConditionStatus::{self, False, True, Unknown};
use super::vocab::{CONDITION_TYPES, ConditionType, Phase, REASON_PROTOCOL_VIOLATION, reasons};
use super::world::{CanaryStage, Context, Counts, FailCause, Fate, LIST_LIMIT, Rev, TargetView};
use crate::types::Timestamp;

/// The desired status of revision `i` and the Events of its transitions.
pub(super) fn build(ctx: &Context, i: usize) -> (NetworkConfigRevisionStatus, Vec<Event>) {
    let mut d = Draft::new(ctx, &ctx.revs[i]);
    d.common();
    let fate = d.r.fate;
    match fate {
        Fate::Target => target(&mut d, ctx.target.expect("the target has a view")),
        Fate::Failed(cause) => failed(&mut d, cause),
        Fate::Older => older(&mut d),
    }
    // Ready, Reconciling, Stalled: the phase and conditions above in the words generic tools read.
    let v = health::of_revision(Some(&d.s));
    d.s.conditions
        .retain(|c| !health::TYPES.contains(&c.type_.as_str()));
    for c in health::conditions(&v, &d.old.conditions, d.generation, ctx.now) {
        match d.s.conditions.iter_mut().find(|x| x.type_ == c.type_) {
            Some(x) => *x = c,
            None => d.s.conditions.push(c),
        }
    }
    d.s.conditions.sort_by_key(|c| {
        CONDITION_TYPES
            .iter()
            .position(|t| *t == c.type_)
            .unwrap_or(CONDITION_TYPES.len())
    });
    (d.s, d.events)
}

/// When the target's progress deadline passes, if it applies and has not passed yet.
pub(super) fn deadline_at(ctx: &Context) -> Option<Timestamp> {
    let tv = ctx.target?;
    let p = progress(ctx.now, &ctx.revs[tv.idx], tv, ctx.target_complete(tv));
    p.deadline.filter(|_| !p.exceeded)
}

/// Failed nodes whose `message` the revision's status keeps; later ones keep the node, reason, time
/// and flag, and their message stays in the node's own status and the `NodeFailed` Event. A message is
/// up to 1 KiB, the rest of an entry about 150 bytes: a wave of 5,000 failures is then about 0.8 MB, and
/// the status write never outgrows the 1.5 MiB etcd takes (#48: one that does fails for ever, and the
/// revision is never marked `Failed`).
pub const FAILED_DETAIL_LIMIT: usize = 50;

/// `failed` as the status keeps it: the messages of entries past [`FAILED_DETAIL_LIMIT`] left out.
fn kept_failure(i: usize, f: &FailedNode) -> FailedNode {
    if i < FAILED_DETAIL_LIMIT || f.message.is_empty() {
        return f.clone();
    }
    let FailedNode {
        node,
        reason,
        message: _,
        at,
        quarantined,
    } = f;
    FailedNode {
        node: node.clone(),
        reason: reason.clone(),
        message: String::new(),
        at: at.clone(),
        quarantined: *quarantined,
    }
}

/// `old` with the failed nodes of this attempt instead of its own: a step copies a revision's failed
/// nodes once, not twice (#28: the copies were 1 % of a leader's CPU). Every field is named, so a new
/// one does not compile until it is copied.
fn copy_with_failures(
    old: &NetworkConfigRevisionStatus,
    failed_nodes: &[FailedNode],
) -> NetworkConfigRevisionStatus {
    let NetworkConfigRevisionStatus {
        phase,
        conditions,
        total,
        updated,
        in_progress,
        queued,
        failed,
        skipped,
        waiting_for_agent,
        failed_nodes: _,
        validation,
        started_at,
        completed_at,
        paused_at,
        paused_by,
        last_progress_at,
        canaries_updated_at,
        observed_retry,
        observed_generation,
        message,
        active_sequence,
        reactivated_at,
        reached,
    } = old;
    NetworkConfigRevisionStatus {
        phase: phase.clone(),
        conditions: conditions.clone(),
        total: *total,
        updated: *updated,
        in_progress: *in_progress,
        queued: *queued,
        failed: *failed,
        skipped: *skipped,
        waiting_for_agent: *waiting_for_agent,
        failed_nodes: (failed_nodes.iter().enumerate())
            .map(|(i, f)| kept_failure(i, f))
            .collect(),
        validation: validation.clone(),
        started_at: started_at.clone(),
        completed_at: completed_at.clone(),
        paused_at: paused_at.clone(),
        paused_by: paused_by.clone(),
        last_progress_at: last_progress_at.clone(),
        canaries_updated_at: canaries_updated_at.clone(),
        observed_retry: *observed_retry,
        observed_generation: *observed_generation,
        message: message.clone(),
        active_sequence: *active_sequence,
        reactivated_at: reactivated_at.clone(),
        reached: reached.clone(),
    }
}

/// One condition's value; [`Draft::set`] writes it under a type.
struct Cond {
    status: ConditionStatus,
    reason: &'static str,
    message: String,
}

fn cond(status: ConditionStatus, reason: &'static str, message: impl Into<String>) -> Cond {
    Cond {
        status,
        reason,
        message: message.into(),
    }
}

/// A revision's status being built from the one on record, and the Events of its transitions.
struct Draft<'c> {
    ctx: &'c Context<'c, 'c>,
    r: &'c Rev<'c>,
    old: &'c NetworkConfigRevisionStatus,
    s: NetworkConfigRevisionStatus,
    events: Vec<Event>,
    /// `now` as the API server stores it (whole seconds), so a stamp reads back equal.
    stamp: Timestamp,
    generation: Option<i64>,
}

impl<'c> Draft<'c> {
    fn new(ctx: &'c Context<'c, 'c>, r: &'c Rev<'c>) -> Draft<'c> {
        let old = &r.state.status;
        Draft {
            ctx,
            r,
            old,
            s: copy_with_failures(old, &r.failed_nodes),
            events: Vec::new(),
            stamp: ctx.now.truncate_to_secs(),
            generation: r.state.generation.or(old.observed_generation),
        }
    }

    fn event(&mut self, reason: EventReason, message: String) {
        self.events.push(Event {
            object: ObjectRef::Revision(self.r.name().to_string()),
            type_: reason.type_(),
            reason,
            message,
        });
    }

    /// Sets condition `type_`; its `lastTransitionTime` moves only when its status changes.
    fn set(&mut self, type_: ConditionType, c: Cond) {
        let status = c.status.as_str();
        let conds = &mut self.s.conditions;
        match conds.iter_mut().find(|x| x.type_ == type_.as_str()) {
            Some(x) => {
                if x.status != status {
                    x.last_transition_time = self.stamp.to_time();
                }
                x.status = status.to_string();
                x.reason = c.reason.to_string();
                x.message = c.message;
                x.observed_generation = self.generation;
            }
            None => conds.push(Condition {
                last_transition_time: self.stamp.to_time(),
                message: c.message,
                observed_generation: self.generation,
                reason: c.reason.to_string(),
                status: status.to_string(),
                type_: type_.as_str().to_string(),
            }),
        }
    }

    /// The reason of condition `type_` on record.
    fn recorded_reason(&self, type_: ConditionType) -> Option<&'c str> {
        self.old
            .conditions
            .iter()
            .find(|c| c.type_ == type_.as_str())
            .map(|c| c.reason.as_str())
    }

    /// What every revision records, whatever its fate: the Events of its creation, of a retry and of
    /// each node failure found this step; the attempt and its failures; whether it is paused.
    fn common(&mut self) {
        let r = self.r;
        if self.old.phase.is_none() {
            let hash = r.state.hash.get(..12).unwrap_or(&r.state.hash);
            let sequence = r.state.sequence;
            let message = format!("revision {} (sequence {sequence}, hash {hash})", r.name());
            self.event(EventReason::RevisionCreated, message);
        }
        if r.rearmed() {
            let message = format!(
                "spec.retry is {}: failures cleared, rolling out again",
                r.state.retry
            );
            self.event(EventReason::RetryStarted, message);
        }
        // A protocol violation has its own Event (the step's), about the node.
        let new = &r.failed_nodes[r.failed_nodes.len() - r.new_failures..];
        for f in new.iter().filter(|f| f.reason != REASON_PROTOCOL_VIOLATION) {
            let message = format!(
                "node {} failed {}: {}: {}{}",
                f.node,
                r.name(),
                f.reason,
                f.message,
                if f.quarantined {
                    " (the node is quarantined: this failure does not count against maxFailures)"
                } else {
                    ""
                }
            );
            self.event(EventReason::NodeFailed, message);
        }
        self.s.observed_generation = self.generation;
        self.s.observed_retry = Some(r.state.retry);
        self.s.failed = self.s.failed_nodes.len() as u32;
        let paused = r.paused();
        self.s.paused_at =
            paused.then(|| self.old.paused_at.clone().unwrap_or(self.stamp.to_time()));
        self.s.paused_by = r
            .state
            .paused
            .then(|| r.state.paused_by.clone().or(self.old.paused_by.clone()))
            .flatten();
        // A revision held earlier and not paused again by anyone since (a target's hold is measured
        // afresh above): say why, and how to go on.
        let recorded = r.state.destructive.as_ref().filter(|_| {
            self.s.paused_by.as_deref().is_none_or(|by| {
                by.split(' ').next() == Some(netwave_api::vocab::managers::CONFIGURATOR)
            })
        });
        let c = match (paused, r.held(), recorded) {
            (true, Some(h), _) => cond(
                True,
                reasons::DESTRUCTIVE_CHANGE,
                format!(
                    "held: it {}; resume it to approve (spec.paused: false), else restore the inputs",
                    h.summary
                ),
            ),
            (true, None, Some(what)) => cond(
                True,
                reasons::DESTRUCTIVE_CHANGE,
                format!(
                    "held: it {what}; resume it to approve (spec.paused: false), else restore the \
                     inputs"
                ),
            ),
            (true, None, None) => {
                let message = paused_message(self.s.paused_by.as_deref());
                cond(True, reasons::PAUSED_BY_SPEC, message)
            }
            (false, _, _) => cond(False, reasons::NOT_PAUSED, ""),
        };
        self.set(ConditionType::Paused, c);
    }

    /// Node counts of a revision that is not the target: out of the whole fleet, how many nodes run it
    /// (`updated`) and are being moved to it (`inProgress`); nothing is queued for it.
    fn set_counts(&mut self, counts: Counts) {
        self.s.total = self.ctx.fleet;
        self.s.updated = counts.updated;
        self.s.in_progress = counts.assigned - counts.updated;
        self.s.queued = 0;
        self.s.skipped = 0;
        self.s.waiting_for_agent = 0;
    }

    fn counts(&self) -> Counts {
        self.ctx
            .counts
            .get(self.r.name())
            .copied()
            .unwrap_or_default()
    }

    fn target_name(&self) -> String {
        self.ctx
            .target
            .map(|t| self.ctx.revs[t.idx].name().to_string())
            .unwrap_or_default()
    }

    fn last_good_name(&self) -> Option<&'c str> {
        self.ctx
            .last_good_after()
            .map(|l| self.ctx.revs[l].name().as_str())
    }
}

/// The `Validated` condition, from fleet validation against the current nodes. `passed` is the
/// verdict, which can be the one on record rather than today's (a revision failed by validation stays
/// failed for its attempt); `warnings` are listed for the target only, the revision being rolled out.
fn validated(passed: bool, v: &ValidationResult, warnings: bool) -> Cond {
    if !passed {
        return cond(False, reasons::VALIDATION_FAILED, v.errors.join("; "));
    }
    let message = if warnings && !v.warnings.is_empty() {
        format!("{} warning(s): {}", v.warnings.len(), v.warnings.join("; "))
    } else {
        "fleet validation found no problems".to_string()
    };
    cond(True, reasons::VALIDATED, message)
}

/// `Degraded`: whether nodes failed this attempt.
fn degraded(r: &Rev) -> Cond {
    if r.failed_nodes.is_empty() {
        return cond(False, reasons::NO_FAILURES, "");
    }
    let message = format!(
        "{} node(s) failed: {}",
        r.failed_nodes.len(),
        list_failed(r)
    );
    cond(True, reasons::NODES_FAILED, message)
}

/// The target: rolling out, or complete.
fn target(d: &mut Draft, tv: &TargetView) {
    let r = d.r;
    let phase = target_timeline(d, tv);
    d.s.phase = Some(phase.as_str().to_string());
    d.s.validation = r.state.validation.clone();
    d.s.total = tv.total;
    d.s.updated = tv.updated;
    // Kept as it is once the revision is no longer the target: what its rollout reached.
    d.s.reached = Some(netwave_api::Reached {
        updated: tv.updated,
        total: tv.total,
    });
    d.s.in_progress = tv.in_progress;
    d.s.queued = tv.queued;
    d.s.skipped = tv.skipped;
    d.s.waiting_for_agent = tv.waiting_for_agent;
    // An Event when nodes start waiting for their agent (not on every count change).
    if tv.waiting_for_agent > 0
        && d.old.waiting_for_agent == 0
        && let Some(w) = (tv.waiting)
            .iter()
            .find(|w| matches!(w, WaitingOn::AgentLacksFeatures { .. }))
    {
        d.event(EventReason::WaitingForAgent, w.to_string());
    }
    let p = progress(d.ctx.now, r, tv, phase == Phase::Complete);
    d.s.last_progress_at = Some(p.last_progress_at.to_time());

    let errors = &r.state.validation.errors;
    d.set(
        ConditionType::Validated,
        validated(errors.is_empty(), &r.state.validation, true),
    );
    let progressing = target_progressing(r, tv, phase, &p);
    // An Event when the rollout stops for a reason someone must act on, once.
    if d.recorded_reason(ConditionType::Progressing) != Some(progressing.reason) {
        if progressing.reason == reasons::PROGRESS_DEADLINE_EXCEEDED {
            d.event(
                EventReason::ProgressDeadlineExceeded,
                progressing.message.clone(),
            );
        } else if progressing.reason == reasons::INVALID_POLICY {
            d.event(EventReason::InvalidPolicy, progressing.message.clone());
        }
    }
    d.set(ConditionType::Progressing, progressing);
    let updated = format!("{} of {} node(s) updated", tv.updated, tv.total);
    let available = if tv.all_done() {
        cond(True, reasons::ALL_NODES_UPDATED, updated)
    } else {
        cond(False, reasons::ROLLOUT_INCOMPLETE, updated)
    };
    d.set(ConditionType::Available, available);
    d.set(ConditionType::Degraded, degraded(r));
    let words: Vec<String> = tv.waiting.iter().map(WaitingOn::to_string).collect();
    d.s.message = Some(if !words.is_empty() {
        words.join("; ")
    } else if phase == Phase::Complete {
        format!("all {} eligible node(s) updated", tv.updated)
    } else {
        format!("{} of {} node(s) updated", tv.updated, tv.total)
    });
}

/// The target's phase, its start, completion and canary times, and the Events of those transitions
/// and of pausing and resuming.
fn target_timeline(d: &mut Draft, tv: &TargetView) -> Phase {
    let r = d.r;
    let stamp = d.stamp;
    let complete_before = r.stored_phase == Some(Phase::Complete);
    if !r.same_attempt && !complete_before {
        d.s.started_at = None;
        d.s.completed_at = None;
        d.s.canaries_updated_at = None;
    }
    if tv.started && d.s.started_at.is_none() {
        d.s.started_at = Some(stamp.to_time());
        let message = format!("rolling {} out to {} node(s)", r.name(), tv.total);
        d.event(EventReason::RolloutStarted, message);
    }
    let phase = if complete_before || tv.all_done() {
        Phase::Complete
    } else if d.s.started_at.is_some() {
        Phase::Progressing
    } else {
        Phase::Pending
    };
    if phase == Phase::Complete && d.s.completed_at.is_none() {
        d.s.completed_at = Some(stamp.to_time());
    }
    if phase == Phase::Complete && !complete_before {
        let message = format!("{} node(s) updated to {}", tv.updated, r.name());
        d.event(EventReason::RolloutComplete, message);
    }
    if tv.canaries_done_now {
        d.s.canaries_updated_at = Some(stamp.to_time());
        let bake = r.policy.canary.as_ref().map_or(0, |c| c.bake_seconds);
        let until = stamp.plus_secs(bake as u64).to_time().0;
        let message = format!("every canary runs {}; baking until {until}", r.name());
        d.event(EventReason::CanariesUpdated, message);
    }
    // A hold says so in its own Event (`DestructiveChange`).
    if r.paused() && d.old.paused_at.is_none() && r.held().is_none() {
        let message = format!(
            "{}; nodes in flight finish",
            paused_message(r.state.paused_by.as_deref())
        );
        d.event(EventReason::RolloutPaused, message);
    }
    if !r.paused() && d.old.paused_at.is_some() {
        d.event(
            EventReason::RolloutResumed,
            "spec.paused cleared".to_string(),
        );
    }
    phase
}

/// The target's `Progressing` condition: why it moves or what stops it, most final first.
fn target_progressing(r: &Rev, tv: &TargetView, phase: Phase, p: &Progress) -> Cond {
    let idle = tv.in_progress == 0 && tv.queued == 0;
    if phase == Phase::Complete && idle {
        let message = format!("{} node(s) updated", tv.updated);
        cond(False, reasons::ROLLOUT_COMPLETE, message)
    } else if tv.invalid {
        let message = "fleet validation fails now: no further node gets it";
        cond(False, reasons::VALIDATION_FAILED, message)
    } else if tv.halted_by_policy {
        cond(False, reasons::INVALID_POLICY, r.policy_errors.join("; "))
    } else if r.held().is_some() {
        let message = "held as a destructive change until an admin resumes it";
        cond(Unknown, reasons::DESTRUCTIVE_CHANGE, message)
    } else if r.state.paused {
        cond(Unknown, reasons::ROLLOUT_PAUSED, "spec.paused is set")
    } else if p.exceeded {
        let message = format!(
            "no node updated for {}s (last progress {})",
            r.policy.progress_deadline_seconds,
            p.last_progress_at.to_time().0
        );
        cond(False, reasons::PROGRESS_DEADLINE_EXCEEDED, message)
    } else if let CanaryStage::Baking { until } = tv.canary_stage {
        let message = format!("canaries updated; baking until {}", until.to_time().0);
        cond(True, reasons::CANARY_BAKE, message)
    } else {
        let message = format!("{} of {} node(s) updated", tv.updated, tv.total);
        cond(True, reasons::ROLLOUT_PROGRESSING, message)
    }
}

/// A failed revision: by validation (no node touched) or by `maxFailures` (its nodes go back to the
/// last good revision, if there is one).
fn failed(d: &mut Draft, cause: FailCause) {
    let r = d.r;
    // The cause of a failure on record is in its Progressing reason.
    let by_validation = match cause {
        FailCause::Stored => {
            d.recorded_reason(ConditionType::Progressing) == Some(reasons::VALIDATION_FAILED)
        }
        FailCause::Validation => true,
        FailCause::MaxFailures => false,
    };
    let newly = d.old.phase.as_deref() != Some(Phase::Failed.as_str()) || r.rearmed();
    d.s.phase = Some(Phase::Failed.as_str().to_string());
    d.s.validation = r.state.validation.clone();
    let counts = d.counts();
    d.set_counts(counts);
    if by_validation {
        failed_validation(d, newly);
    } else {
        failed_nodes(d, counts, newly);
    }
    let message = format!("{} node(s) still run it", counts.updated);
    d.set(
        ConditionType::Available,
        cond(False, reasons::REVISION_FAILED, message),
    );
}

fn failed_validation(d: &mut Draft, newly: bool) {
    let r = d.r;
    let errors = r.state.validation.errors.join("; ");
    if newly {
        d.event(EventReason::ValidationFailed, errors.clone());
    }
    d.set(
        ConditionType::Validated,
        validated(false, &r.state.validation, false),
    );
    let message = "fleet validation failed: no node is touched";
    d.set(
        ConditionType::Progressing,
        cond(False, reasons::VALIDATION_FAILED, message),
    );
    d.set(
        ConditionType::Degraded,
        cond(False, reasons::NO_FAILURES, ""),
    );
    d.s.message = Some(format!("validation failed: {errors}"));
}

fn failed_nodes(d: &mut Draft, counts: Counts, newly: bool) {
    let r = d.r;
    let failed = format!(
        "{} node(s) failed (maxFailures {}): {}",
        r.failed_nodes.len(),
        r.policy.max_failures,
        list_failed(r)
    );
    let no_last_good = || {
        WaitingOn::NoLastGood {
            failed: r.name().to_string(),
        }
        .to_string()
    };
    let last_good = d.last_good_name();
    let rollback = match last_good {
        Some(lg) if counts.assigned > 0 => {
            format!("rolling back {} node(s) to {lg}", counts.assigned)
        }
        Some(lg) => format!("every touched node is back on {lg}"),
        None if counts.assigned > 0 => no_last_good(),
        None => "no node is assigned it".to_string(),
    };
    if newly {
        d.event(EventReason::RevisionFailed, failed.clone());
        match last_good {
            Some(lg) => {
                let message = format!("rolling {} node(s) back to {lg}", counts.assigned);
                d.event(EventReason::RollbackStarted, message);
            }
            None => d.event(EventReason::NoLastGoodRevision, no_last_good()),
        }
    }
    // Validation passed before this revision rolled out: keep what is on record.
    if d.recorded_reason(ConditionType::Validated).is_none() {
        d.set(
            ConditionType::Validated,
            validated(true, &r.state.validation, false),
        );
    }
    d.set(
        ConditionType::Progressing,
        cond(False, reasons::MAX_FAILURES_REACHED, failed.clone()),
    );
    d.set(
        ConditionType::Degraded,
        cond(True, reasons::NODES_FAILED, failed.clone()),
    );
    d.s.message = Some(format!("{failed}; {rollback}"));
}

/// A revision older than the target: the last good one stays `Complete` (rollbacks and new nodes get
/// it); anything else is `Superseded`, also one that completed before a newer one did (its
/// `completedAt` says so), so only one older revision ever reads `Complete`.
fn older(d: &mut Draft) {
    let r = d.r;
    let target_name = d.target_name();
    let complete = r.stored_phase == Some(Phase::Complete) && d.last_good_name() == Some(r.name());
    let phase = if complete {
        Phase::Complete
    } else {
        Phase::Superseded
    };
    if phase == Phase::Superseded && r.stored_phase != Some(Phase::Superseded) {
        let message = format!("{target_name} is the target now");
        d.event(EventReason::RevisionSuperseded, message);
    }
    if !r.same_attempt && !complete {
        d.s.canaries_updated_at = None;
    }
    d.s.phase = Some(phase.as_str().to_string());
    let counts = d.counts();
    d.set_counts(counts);
    if complete {
        // The last good revision is what new nodes and rollbacks get: keep its validation against the
        // current fleet on record.
        let errors = &r.state.validation.errors;
        d.set(
            ConditionType::Validated,
            validated(errors.is_empty(), &r.state.validation, false),
        );
        d.s.validation = r.state.validation.clone();
    }
    let progressing = if complete {
        let message = format!("last good revision; {target_name} is the target");
        cond(False, reasons::ROLLOUT_COMPLETE, message)
    } else if d.s.completed_at.is_some() {
        let message = format!(
            "completed earlier; superseded by {target_name}{}",
            d.last_good_name()
                .map(|lg| format!(" ({lg} is the last good revision)"))
                .unwrap_or_default()
        );
        cond(False, reasons::SUPERSEDED, message)
    } else {
        let message = format!("superseded by {target_name}");
        cond(False, reasons::SUPERSEDED, message)
    };
    d.s.message = Some(progressing.message.clone());
    d.set(ConditionType::Progressing, progressing);
}

struct Progress {
    last_progress_at: Timestamp,
    /// When the deadline passes (None when it does not apply: complete, paused, invalid policy).
    deadline: Option<Timestamp>,
    exceeded: bool,
}

fn progress(now: Timestamp, r: &Rev, tv: &TargetView, complete: bool) -> Progress {
    let old = &r.state.status;
    let stamp = now.truncate_to_secs();
    let became_target = !matches!(
        r.stored_phase,
        Some(Phase::Pending | Phase::Progressing | Phase::Complete)
    ) || !r.same_attempt;
    let resumed = old.paused_at.is_some() && !r.paused();
    let progressed = tv.updated > old.updated;
    let last_progress_at = match &old.last_progress_at {
        Some(t) if !(became_target || resumed || progressed) => Timestamp::from_time(t),
        _ => stamp,
    };
    // No deadline when nothing could move: complete, halted, or every remaining node skipped or failed.
    let nothing_to_do = tv.queued == 0 && tv.in_progress == 0;
    if complete || nothing_to_do || r.paused() || tv.halted_by_policy || tv.invalid {
        return Progress {
            last_progress_at,
            deadline: None,
            exceeded: false,
        };
    }
    // Waiting out a canary bake is not a lack of progress.
    let bake_end = match tv.canary_stage {
        CanaryStage::Baking { until } => Some(until),
        _ => canaries_at(now, r, tv).and_then(|at| {
            r.policy
                .canary
                .as_ref()
                .map(|c| at.plus_secs(c.bake_seconds as u64))
        }),
    };
    let reference = bake_end.map_or(last_progress_at, |b| b.max(last_progress_at));
    let at = reference.plus_secs(r.policy.progress_deadline_seconds as u64);
    Progress {
        last_progress_at,
        deadline: Some(at),
        exceeded: now >= at,
    }
}

fn canaries_at(now: Timestamp, r: &Rev, tv: &TargetView) -> Option<Timestamp> {
    if tv.canaries_done_now {
        return Some(now.truncate_to_secs());
    }
    if !r.same_attempt {
        return None;
    }
    r.state
        .status
        .canaries_updated_at
        .as_ref()
        .map(Timestamp::from_time)
}

fn list_failed(r: &Rev) -> String {
    let mut parts: Vec<String> = r
        .failed_nodes
        .iter()
        .take(LIST_LIMIT)
        .map(|f| {
            let violation = f.reason == REASON_PROTOCOL_VIOLATION;
            let quarantined = if f.quarantined && !violation {
                ", quarantined"
            } else {
                ""
            };
            format!("{} ({}{quarantined})", f.node, f.reason)
        })
        .collect();
    if r.failed_nodes.len() > LIST_LIMIT {
        parts.push(format!("and {} more", r.failed_nodes.len() - LIST_LIMIT));
    }
    parts.join(", ")
}

/// `spec.paused set by kubectl-patch at …: no new assignments`.
fn paused_message(by: Option<&str>) -> String {
    match by {
        Some(who) => format!("spec.paused set by {who}: no new assignments"),
        None => "spec.paused is set: no new assignments".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    /// A bad revision failing a whole wave of a large fleet at once (5,000 nodes, each with a 1 KiB
    /// message and a long name) still fits one object: every node and reason is kept, the first
    /// messages too, and the status stays far below etcd's 1.5 MiB.
    #[test]
    fn a_wave_of_failures_never_outgrows_one_object() {
        let failures: Vec<FailedNode> = (0..5000)
            .map(|i| FailedNode {
                node: format!("rack-{:03}-server-{i:05}.example.internal", i / 40),
                reason: "HealthCheckFailed".into(),
                message: "m".repeat(1024),
                at: Some(Time(k8s_openapi::jiff::Timestamp::now())),
                quarantined: false,
            })
            .collect();
        let status = copy_with_failures(&NetworkConfigRevisionStatus::default(), &failures);
        let bytes = serde_json::to_vec(&status).unwrap().len();
        assert!(bytes < 1_000_000, "{bytes} bytes");
        assert_eq!(status.failed_nodes.len(), 5000);
        let (detailed, brief) = status.failed_nodes.split_at(FAILED_DETAIL_LIMIT);
        assert!(detailed.iter().all(|f| f.message.len() == 1024));
        assert!(brief.iter().all(|f| f.message.is_empty()));
        let names = |l: &[FailedNode]| l.iter().map(|f| f.node.clone()).collect::<Vec<_>>();
        assert_eq!(names(&status.failed_nodes), names(&failures));
        eprintln!("5,000 failures: {bytes} bytes of status");
    }
}
