//! The desired `NetworkConfigRevisionStatus` of each revision after a step, and the Events that its
//! transitions deserve. Everything here is a function of the evaluated revision, the counts after the plan
//! and `now`; timestamps are only ever taken from `now` at a transition and kept afterwards, so a second
//! step over the same world computes a status equal to the stored one and writes nothing.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use netwave_api::NetworkConfigRevisionStatus;

use super::plan::{Event, EventReason, ObjectRef, WaitingOn};
use super::step::{CanaryStage, Counts, FailCause, Fate, Rev, TargetView};
use crate::types::Timestamp;

/// `status.phase` of a revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// The target; no node assigned yet.
    Pending,
    /// The target; rolling out.
    Progressing,
    /// Every eligible node was updated at some point. Sticky: the revision is a proven last good one.
    Complete,
    /// Validation failed, or `maxFailures` nodes failed. Sticky until `spec.retry` changes.
    Failed,
    /// A newer revision became the target before this one completed.
    Superseded,
}

impl Phase {
    pub fn parse(s: Option<&str>) -> Option<Phase> {
        match s? {
            "Pending" => Some(Phase::Pending),
            "Progressing" => Some(Phase::Progressing),
            "Complete" => Some(Phase::Complete),
            "Failed" => Some(Phase::Failed),
            "Superseded" => Some(Phase::Superseded),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Progressing => "Progressing",
            Phase::Complete => "Complete",
            Phase::Failed => "Failed",
            Phase::Superseded => "Superseded",
        }
    }
}

/// Condition types, in the order they are kept in status.
pub const CONDITION_TYPES: [&str; 5] = [
    "Validated",
    "Progressing",
    "Available",
    "Degraded",
    "Paused",
];

/// Condition reasons with a meaning beyond display (tests and the configurator's alerts match on them).
pub mod reasons {
    pub const PROGRESS_DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";
    pub const VALIDATION_FAILED: &str = "ValidationFailed";
    pub const MAX_FAILURES_REACHED: &str = "MaxFailuresReached";
    pub const INVALID_POLICY: &str = "InvalidPolicy";
    pub const ROLLOUT_PAUSED: &str = "RolloutPaused";
    pub const ROLLOUT_COMPLETE: &str = "RolloutComplete";
    pub const CANARY_BAKE: &str = "CanaryBake";
    pub const ROLLOUT_PROGRESSING: &str = "RolloutProgressing";
    pub const SUPERSEDED: &str = "Superseded";
}

pub(super) struct Context<'a, 'b> {
    pub now: Timestamp,
    pub revs: &'b [Rev<'a>],
    pub target: Option<&'b TargetView>,
    pub last_good: Option<usize>,
    pub counts: &'b BTreeMap<&'a str, Counts>,
}

struct Progress {
    last_progress_at: Timestamp,
    /// When the deadline passes (None when it does not apply: complete, paused, invalid policy).
    deadline: Option<Timestamp>,
    exceeded: bool,
}

fn progress(ctx: &Context, i: usize, tv: &TargetView, complete: bool) -> Progress {
    let r = &ctx.revs[i];
    let old = &r.state.status;
    let stamp = ctx.now.truncate_to_secs();
    let became_target = !matches!(
        r.stored_phase,
        Some(Phase::Pending | Phase::Progressing | Phase::Complete)
    ) || !r.same_attempt;
    let resumed = old.paused_at.is_some() && !r.state.paused;
    let progressed = tv.updated > old.updated;
    let last_progress_at = match &old.last_progress_at {
        Some(t) if !(became_target || resumed || progressed) => Timestamp::from_time(t),
        _ => stamp,
    };
    // No deadline when nothing could move: complete, halted, or every remaining node skipped or failed.
    let nothing_to_do = tv.queued == 0 && tv.in_progress == 0;
    if complete || nothing_to_do || r.state.paused || tv.halted_by_policy || tv.invalid {
        return Progress {
            last_progress_at,
            deadline: None,
            exceeded: false,
        };
    }
    // Waiting out a canary bake is not a lack of progress.
    let bake_end = match tv.canary_stage {
        CanaryStage::Baking { until } => Some(until),
        _ => canaries_at(ctx, i, tv).and_then(|at| {
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
        exceeded: ctx.now >= at,
    }
}

fn canaries_at(ctx: &Context, i: usize, tv: &TargetView) -> Option<Timestamp> {
    let r = &ctx.revs[i];
    if tv.canaries_done_now {
        return Some(ctx.now.truncate_to_secs());
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

/// When the target's progress deadline passes, if it applies and has not passed yet.
pub(super) fn deadline_at(ctx: &Context, i: usize) -> Option<Timestamp> {
    let tv = ctx.target?;
    let complete = target_complete(ctx, i, tv);
    let p = progress(ctx, i, tv, complete);
    p.deadline.filter(|_| !p.exceeded)
}

/// The last good revision once this plan is applied: the target itself if it completes now.
pub(super) fn last_good_after(ctx: &Context) -> Option<usize> {
    match ctx.target {
        Some(tv) if target_complete(ctx, tv.idx, tv) => Some(tv.idx),
        _ => ctx.last_good,
    }
}

fn target_complete(ctx: &Context, i: usize, tv: &TargetView) -> bool {
    ctx.revs[i].stored_phase == Some(Phase::Complete) || all_done(tv)
}

fn all_done(tv: &TargetView) -> bool {
    tv.updated >= 1 && tv.in_progress == 0 && tv.queued == 0
}

fn set_condition(
    conds: &mut Vec<Condition>,
    now: Timestamp,
    generation: Option<i64>,
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
) {
    match conds.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = now.to_time();
            }
            c.status = status.to_string();
            c.reason = reason.to_string();
            c.message = message;
            c.observed_generation = generation;
        }
        None => conds.push(Condition {
            last_transition_time: now.to_time(),
            message,
            observed_generation: generation,
            reason: reason.to_string(),
            status: status.to_string(),
            type_: type_.to_string(),
        }),
    }
}

fn sort_conditions(conds: &mut [Condition]) {
    conds.sort_by_key(|c| {
        CONDITION_TYPES
            .iter()
            .position(|t| *t == c.type_)
            .unwrap_or(CONDITION_TYPES.len())
    });
}

fn condition_reason<'s>(s: &'s NetworkConfigRevisionStatus, type_: &str) -> Option<&'s str> {
    s.conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.reason.as_str())
}

fn list_failed(r: &Rev) -> String {
    let mut parts: Vec<String> = r
        .failed_nodes
        .iter()
        .take(5)
        .map(|f| format!("{} ({})", f.node, f.reason))
        .collect();
    if r.failed_nodes.len() > 5 {
        parts.push(format!("and {} more", r.failed_nodes.len() - 5));
    }
    parts.join(", ")
}

fn event(r: &Rev, reason: EventReason, message: String) -> Event {
    Event {
        object: ObjectRef::Revision(r.name().to_string()),
        type_: reason.type_(),
        reason,
        message,
    }
}

/// The desired status of revision `i` and the Events of its transitions.
pub(super) fn build(ctx: &Context, i: usize) -> (NetworkConfigRevisionStatus, Vec<Event>) {
    let r = &ctx.revs[i];
    let old = &r.state.status;
    let now = ctx.now;
    let stamp = now.truncate_to_secs();
    let generation = r.state.generation.or(old.observed_generation);
    let mut s = old.clone();
    let mut events = Vec::new();

    if old.phase.is_none() {
        events.push(event(
            r,
            EventReason::RevisionCreated,
            format!(
                "revision {} (sequence {}, hash {})",
                r.name(),
                r.state.sequence,
                r.state.hash.get(..12).unwrap_or(&r.state.hash)
            ),
        ));
    }
    if r.rearmed() {
        events.push(event(
            r,
            EventReason::RetryStarted,
            format!(
                "spec.retry is {}: failures cleared, rolling out again",
                r.state.retry
            ),
        ));
    }
    for f in &r.failed_nodes[r.failed_nodes.len() - r.new_failures..] {
        events.push(event(
            r,
            EventReason::NodeFailed,
            format!(
                "node {} failed {}: {}: {}",
                f.node,
                r.name(),
                f.reason,
                f.message
            ),
        ));
    }

    s.observed_generation = generation;
    s.observed_retry = Some(r.state.retry);
    s.failed_nodes = r.failed_nodes.clone();
    s.failed = s.failed_nodes.len() as u32;
    s.paused_at = if r.state.paused {
        old.paused_at.clone().or(Some(stamp.to_time()))
    } else {
        None
    };
    s.paused_by = if r.state.paused {
        r.state.paused_by.clone().or(old.paused_by.clone())
    } else {
        None
    };
    let (paused_status, paused_reason, paused_msg) = if r.state.paused {
        (
            "True",
            "PausedBySpec",
            paused_message(s.paused_by.as_deref()),
        )
    } else {
        ("False", "NotPaused", String::new())
    };
    set_condition(
        &mut s.conditions,
        stamp,
        generation,
        "Paused",
        paused_status,
        paused_reason,
        paused_msg,
    );
    let target_name = ctx
        .target
        .map(|t| ctx.revs[t.idx].name().to_string())
        .unwrap_or_default();
    let lg_name = last_good_after(ctx).map(|l| ctx.revs[l].name().to_string());
    let counts = ctx.counts.get(r.name()).copied().unwrap_or_default();

    match r.fate {
        Fate::Target => {
            let tv = ctx.target.expect("the target has a view");
            let complete_before = r.stored_phase == Some(Phase::Complete);
            if !r.same_attempt && !complete_before {
                s.started_at = None;
                s.completed_at = None;
                s.canaries_updated_at = None;
            }
            if tv.started && s.started_at.is_none() {
                s.started_at = Some(stamp.to_time());
                events.push(event(
                    r,
                    EventReason::RolloutStarted,
                    format!("rolling {} out to {} node(s)", r.name(), tv.total),
                ));
            }
            let done = all_done(tv);
            let phase = if complete_before || done {
                Phase::Complete
            } else if s.started_at.is_some() {
                Phase::Progressing
            } else {
                Phase::Pending
            };
            if phase == Phase::Complete && s.completed_at.is_none() {
                s.completed_at = Some(stamp.to_time());
            }
            if phase == Phase::Complete && !complete_before {
                events.push(event(
                    r,
                    EventReason::RolloutComplete,
                    format!("{} node(s) updated to {}", tv.updated, r.name()),
                ));
            }
            if tv.canaries_done_now {
                s.canaries_updated_at = Some(stamp.to_time());
                let bake = r.policy.canary.as_ref().map_or(0, |c| c.bake_seconds);
                events.push(event(
                    r,
                    EventReason::CanariesUpdated,
                    format!(
                        "every canary runs {}; baking until {}",
                        r.name(),
                        stamp.plus_secs(bake as u64).to_time().0
                    ),
                ));
            }
            if r.state.paused && old.paused_at.is_none() {
                events.push(event(
                    r,
                    EventReason::RolloutPaused,
                    format!(
                        "{}; nodes in flight finish",
                        paused_message(r.state.paused_by.as_deref())
                    ),
                ));
            }
            if !r.state.paused && old.paused_at.is_some() {
                events.push(event(
                    r,
                    EventReason::RolloutResumed,
                    "spec.paused cleared".to_string(),
                ));
            }
            s.phase = Some(phase.as_str().to_string());
            s.validation = r.state.validation.clone();
            s.total = tv.total;
            s.updated = tv.updated;
            s.in_progress = tv.in_progress;
            s.queued = tv.queued;
            s.skipped = tv.skipped;
            let p = progress(ctx, i, tv, phase == Phase::Complete);
            s.last_progress_at = Some(p.last_progress_at.to_time());

            let warnings = &r.state.validation.warnings;
            let validated_msg = if warnings.is_empty() {
                "fleet validation found no problems".to_string()
            } else {
                format!("{} warning(s): {}", warnings.len(), warnings.join("; "))
            };
            let errors = &r.state.validation.errors;
            let (st, reason, msg) = if errors.is_empty() {
                ("True", "Validated", validated_msg)
            } else {
                ("False", reasons::VALIDATION_FAILED, errors.join("; "))
            };
            set_condition(
                &mut s.conditions,
                stamp,
                generation,
                "Validated",
                st,
                reason,
                msg,
            );
            let idle = tv.in_progress == 0 && tv.queued == 0;
            let (st, reason, msg) = if phase == Phase::Complete && idle {
                (
                    "False",
                    reasons::ROLLOUT_COMPLETE,
                    format!("{} node(s) updated", tv.updated),
                )
            } else if tv.invalid {
                (
                    "False",
                    reasons::VALIDATION_FAILED,
                    "fleet validation fails now: no further node gets it".to_string(),
                )
            } else if tv.halted_by_policy {
                ("False", reasons::INVALID_POLICY, r.policy_errors.join("; "))
            } else if r.state.paused {
                (
                    "Unknown",
                    reasons::ROLLOUT_PAUSED,
                    "spec.paused is set".to_string(),
                )
            } else if p.exceeded {
                (
                    "False",
                    reasons::PROGRESS_DEADLINE_EXCEEDED,
                    format!(
                        "no node updated for {}s (last progress {})",
                        r.policy.progress_deadline_seconds,
                        p.last_progress_at.to_time().0
                    ),
                )
            } else if let CanaryStage::Baking { until } = tv.canary_stage {
                (
                    "True",
                    reasons::CANARY_BAKE,
                    format!("canaries updated; baking until {}", until.to_time().0),
                )
            } else {
                (
                    "True",
                    reasons::ROLLOUT_PROGRESSING,
                    format!("{} of {} node(s) updated", tv.updated, tv.total),
                )
            };
            let old_reason = condition_reason(old, "Progressing");
            if old_reason != Some(reason) {
                if reason == reasons::PROGRESS_DEADLINE_EXCEEDED {
                    events.push(event(r, EventReason::ProgressDeadlineExceeded, msg.clone()));
                } else if reason == reasons::INVALID_POLICY {
                    events.push(event(r, EventReason::InvalidPolicy, msg.clone()));
                }
            }
            set_condition(
                &mut s.conditions,
                stamp,
                generation,
                "Progressing",
                st,
                reason,
                msg,
            );
            let (st, reason) = if done {
                ("True", "AllNodesUpdated")
            } else {
                ("False", "RolloutIncomplete")
            };
            set_condition(
                &mut s.conditions,
                stamp,
                generation,
                "Available",
                st,
                reason,
                format!("{} of {} node(s) updated", tv.updated, tv.total),
            );
            let (st, reason, msg) = if r.failed_nodes.is_empty() {
                ("False", "NoFailures", String::new())
            } else {
                (
                    "True",
                    "NodesFailed",
                    format!(
                        "{} node(s) failed: {}",
                        r.failed_nodes.len(),
                        list_failed(r)
                    ),
                )
            };
            set_condition(
                &mut s.conditions,
                stamp,
                generation,
                "Degraded",
                st,
                reason,
                msg,
            );
            let words: Vec<String> = tv.waiting.iter().map(WaitingOn::to_string).collect();
            s.message = Some(if words.is_empty() {
                if phase == Phase::Complete {
                    format!("all {} eligible node(s) updated", tv.updated)
                } else {
                    format!("{} of {} node(s) updated", tv.updated, tv.total)
                }
            } else {
                words.join("; ")
            });
        }
        Fate::Failed(cause) => {
            let cause = match cause {
                FailCause::Stored
                    if condition_reason(old, "Progressing") == Some(reasons::VALIDATION_FAILED) =>
                {
                    FailCause::Validation
                }
                FailCause::Stored => FailCause::MaxFailures,
                c => c,
            };
            let newly = old.phase.as_deref() != Some(Phase::Failed.as_str()) || r.rearmed();
            s.phase = Some(Phase::Failed.as_str().to_string());
            s.validation = r.state.validation.clone();
            s.total = counts.assigned;
            s.updated = counts.updated;
            s.in_progress = counts.assigned - counts.updated;
            s.queued = 0;
            s.skipped = 0;
            let (validated, progressing, degraded, message) = match cause {
                FailCause::Validation => {
                    let errors = r.state.validation.errors.join("; ");
                    if newly {
                        events.push(event(r, EventReason::ValidationFailed, errors.clone()));
                    }
                    (
                        Some(("False", reasons::VALIDATION_FAILED, errors.clone())),
                        (
                            "False",
                            reasons::VALIDATION_FAILED,
                            "fleet validation failed: no node is touched".to_string(),
                        ),
                        ("False", "NoFailures", String::new()),
                        format!("validation failed: {errors}"),
                    )
                }
                _ => {
                    let failed = format!(
                        "{} node(s) failed (maxFailures {}): {}",
                        r.failed_nodes.len(),
                        r.policy.max_failures,
                        list_failed(r)
                    );
                    let rollback = match &lg_name {
                        Some(lg) if counts.assigned > 0 => {
                            format!("rolling back {} node(s) to {lg}", counts.assigned)
                        }
                        Some(lg) => format!("every touched node is back on {lg}"),
                        None if counts.assigned > 0 => WaitingOn::NoLastGood {
                            failed: r.name().to_string(),
                        }
                        .to_string(),
                        None => "no node is assigned it".to_string(),
                    };
                    if newly {
                        events.push(event(r, EventReason::RevisionFailed, failed.clone()));
                        match &lg_name {
                            Some(lg) => events.push(event(
                                r,
                                EventReason::RollbackStarted,
                                format!("rolling {} node(s) back to {lg}", counts.assigned),
                            )),
                            None => events.push(event(
                                r,
                                EventReason::NoLastGoodRevision,
                                WaitingOn::NoLastGood {
                                    failed: r.name().to_string(),
                                }
                                .to_string(),
                            )),
                        }
                    }
                    // Validation passed before this revision rolled out: keep what is on record.
                    let validated = condition_reason(old, "Validated").is_none().then(|| {
                        (
                            "True",
                            "Validated",
                            "fleet validation found no problems".to_string(),
                        )
                    });
                    (
                        validated,
                        ("False", reasons::MAX_FAILURES_REACHED, failed.clone()),
                        ("True", "NodesFailed", failed.clone()),
                        format!("{failed}; {rollback}"),
                    )
                }
            };
            if let Some((st, reason, msg)) = validated {
                set_condition(
                    &mut s.conditions,
                    stamp,
                    generation,
                    "Validated",
                    st,
                    reason,
                    msg,
                );
            }
            set_condition(
                &mut s.conditions,
                stamp,
                generation,
                "Progressing",
                progressing.0,
                progressing.1,
                progressing.2,
            );
            set_condition(
                &mut s.conditions,
                stamp,
                generation,
                "Available",
                "False",
                "RevisionFailed",
                format!("{} node(s) still run it", counts.updated),
            );
            set_condition(
                &mut s.conditions,
                stamp,
                generation,
                "Degraded",
                degraded.0,
                degraded.1,
                degraded.2,
            );
            s.message = Some(message);
        }
        Fate::Older => {
            let complete = r.stored_phase == Some(Phase::Complete);
            let phase = if complete {
                Phase::Complete
            } else {
                Phase::Superseded
            };
            if phase == Phase::Superseded && r.stored_phase != Some(Phase::Superseded) {
                events.push(event(
                    r,
                    EventReason::RevisionSuperseded,
                    format!("{target_name} is the target now"),
                ));
            }
            if !r.same_attempt && !complete {
                s.canaries_updated_at = None;
            }
            s.phase = Some(phase.as_str().to_string());
            s.total = counts.assigned;
            s.updated = counts.updated;
            s.in_progress = counts.assigned - counts.updated;
            s.queued = 0;
            s.skipped = 0;
            if complete {
                // The last good revision is what new nodes and rollbacks get: keep its validation
                // against the current fleet on record.
                let errors = &r.state.validation.errors;
                let (st, reason, msg) = if errors.is_empty() {
                    (
                        "True",
                        "Validated",
                        "fleet validation found no problems".to_string(),
                    )
                } else {
                    ("False", reasons::VALIDATION_FAILED, errors.join("; "))
                };
                set_condition(
                    &mut s.conditions,
                    stamp,
                    generation,
                    "Validated",
                    st,
                    reason,
                    msg,
                );
                s.validation = r.state.validation.clone();
            }
            let (reason, msg) = if complete {
                (
                    reasons::ROLLOUT_COMPLETE,
                    if lg_name.as_deref() == Some(r.name()) {
                        format!("last good revision; {target_name} is the target")
                    } else {
                        format!("completed earlier; {target_name} is the target")
                    },
                )
            } else {
                (reasons::SUPERSEDED, format!("superseded by {target_name}"))
            };
            set_condition(
                &mut s.conditions,
                stamp,
                generation,
                "Progressing",
                "False",
                reason,
                msg.clone(),
            );
            s.message = Some(msg);
        }
    }
    sort_conditions(&mut s.conditions);
    (s, events)
}

/// `spec.paused set by kubectl-patch at …: no new assignments`.
fn paused_message(by: Option<&str>) -> String {
    match by {
        Some(who) => format!("spec.paused set by {who}: no new assignments"),
        None => "spec.paused is set: no new assignments".to_string(),
    }
}
