//! The transition function: one step is a fixed sequence of stages over one
//! [`World`](super::world::World), each named after the rule of DESIGN.md §3 it implements (the module
//! docs of [`crate::rollout`] say why each rule is what it is).
//!
//! ```text
//!   RolloutInput (+ specs written by earlier rounds)
//!     │
//!     ▼ observe_fleet           nodes ⋈ configs, orphaned configs            (a node that leaves)
//!     ▼ evaluate_revisions      fate of each: Failed / Target / Older;       (Target, Failure,
//!     │                         target, last good, failures found now         maxFailures, Hold,
//!     │                         (quarantined ones flagged), the target's hold  Quarantine)
//!     ▼ streaks_and_suspects    streaks cleared, who goes last               (Quarantine)
//!     ▼ order_and_budgets       domains, round-robin order, in flight,       (Order, Budget)
//!     │                         rendered hashes
//!     ▼ rollback_intents        ┐                                            (maxFailures, Fail fwd)
//!     ▼ new_node_intents        ├ intents, most urgent first, one per node   (New nodes)
//!     ▼ target_rollout_intents  ┘                                            (Order, Pause)
//!     ▼ admit_under_budget      free moves, then budgeted ones → assignments (Budget, Fast path)
//!     ▼ after_plan              counts and the target's view after the plan
//!     ▼ history_deletions       revisions beyond the limit nobody references (History)
//!     ▼ report                  statuses + Events, waits, requeue → Plan     (Progress deadline)
//! ```
//!
//! Every stage reads what the earlier ones wrote into the world and adds its own part; none goes
//! back. [`step`] runs the sequence again over its own output until nothing changes (see there).
//!
//! Before the stages, a [`StepMemo`] is brought up to the input ([`memo`]): `observe_fleet` takes
//! the nodes and configs sorted and joined from it, `order_and_budgets` the failure domains, the
//! rollout order and the rendered hashes per node. A caller that keeps the memo between steps has
//! that work done only for what changed.

mod admit;
mod history;
mod intents;
mod memo;
mod observe;
mod order;
mod quarantine;
mod report;
mod revisions;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use netwave_api::NetworkConfigRevisionStatus;

use super::input::{RevisionState, RolloutInput};
use super::plan::{AssignReason, Plan};
use super::world::Overlay;
use crate::sym::Sym;
use crate::types::Timestamp;

pub use memo::StepMemo;
pub use revisions::{last_good, revisions_to_render};

/// Most rounds [`step`] folds together; a cascade is at most a rollback followed by a move onward.
const MAX_ROUNDS: usize = 4;

/// Computes the next plan. Pure: the same input and `now` give the same plan, whatever order the input
/// lists things in.
///
/// Idempotent by construction: one round of decisions can enable another at the same instant (a node
/// rolled back to the last good revision that never started the failed one is at rest and may take the
/// target right away; a revision completing makes the old last good one deletable). `step` applies each
/// round to a private copy of the input and decides again until nothing changes, folding the rounds into
/// one plan: the last write per object wins, in the order objects first appeared, and every round's
/// Events are kept. Stepping again over the applied plan therefore plans nothing.
///
/// Most steps need one round: a round that only moves nodes onward (under the budget it spent
/// itself) and updates counters leaves nothing for another to decide ([`may_cascade`]), and the step
/// stops there; [`step_every_round`] always decides again, and the simulator checks after every step
/// that both give the same plan.
///
/// A caller that steps over one fleet again and again keeps a [`StepMemo`] and calls
/// [`StepMemo::step`]: the same plan, without working out again what did not change.
pub fn step(input: &RolloutInput, now: Timestamp) -> Plan {
    StepMemo::default().step(input, now)
}

/// [`step`] deciding again after every round that wrote something, even when nothing it wrote can
/// change a decision: the reference the shortcut is checked against.
pub fn step_every_round(input: &RolloutInput, now: Timestamp) -> Plan {
    let mut memo = StepMemo::default();
    memo.refresh(input);
    rounds(input, &memo, now, false)
}

impl StepMemo {
    /// [`step`], with what this memo kept from the steps before (checked against `input` first).
    pub fn step(&mut self, input: &RolloutInput, now: Timestamp) -> Plan {
        self.refresh(input);
        rounds(input, self, now, true)
    }
}

fn rounds(input: &RolloutInput, memo: &StepMemo, now: Timestamp, shortcut: bool) -> Plan {
    let mut overlay = Overlay::default();
    let mut plan = step_once(input, memo, &input.revisions, &overlay, now);
    if plan.write_count() == 0 || (shortcut && !may_cascade(&plan, &input.revisions)) {
        return plan;
    }
    // Only revision statuses and node specs change between rounds; nodes and agent reports do not.
    let mut revisions = input.revisions.clone();
    let mut round = plan.clone();
    for _ in 1..MAX_ROUNDS {
        apply_writes(&mut revisions, &mut overlay, &round);
        round = step_once(input, memo, &revisions, &overlay, now);
        if round.is_empty() {
            break;
        }
        merge(&mut plan, round.clone());
    }
    plan.report = round.report;
    plan
}

/// Whether another round could decide something this `round` did not: only if it wrote what a
/// decision reads. Not so for moves onto the target in rollout order, canaries included (the round
/// admitted every move its budget allowed, and a moved node is not updated before its agent
/// reports), nor for revision statuses whose counters, messages and `lastProgressAt` alone change.
/// Anything else is decided again: a rollback (the node may take the target next), a new node (it
/// joins in flight without spending the budget, so the next round reads the budget otherwise: the
/// simulator found status texts that differ), a fast path, a retry or a new render, a phase, a
/// failure, a hold, a record, a deletion, an Event.
fn may_cascade(round: &Plan, revisions: &[RevisionState]) -> bool {
    let moves_onward = round
        .assignments
        .iter()
        .all(|a| matches!(a.reason, AssignReason::Rollout | AssignReason::Canary));
    let counters = round.status_updates.iter().all(|u| {
        revisions
            .iter()
            .find(|r| r.name == u.revision)
            .is_some_and(|r| counters_only(&r.status, &u.status))
    });
    !(moves_onward
        && counters
        && round.holds.is_empty()
        && round.records.is_empty()
        && round.delete_configs.is_empty()
        && round.delete_revisions.is_empty()
        && round.events.is_empty())
}

/// `new` differs from `stored` in counters, messages and `lastProgressAt` only: nothing a decision
/// reads (the configurator may also hold such a status write back for a while).
pub fn counters_only(
    stored: &NetworkConfigRevisionStatus,
    new: &NetworkConfigRevisionStatus,
) -> bool {
    // Compared field by field, not by comparing stripped copies: the configurator asks for every
    // status write of every reconcile, and the copies (failed nodes, validation) were 2 % of its CPU
    // at 5,000 nodes (#28). Every field is named, so a new one does not compile until it is judged.
    let NetworkConfigRevisionStatus {
        phase,
        conditions,
        total: _,
        updated: _,
        in_progress: _,
        queued: _,
        failed,
        skipped: _,
        waiting_for_agent: _,
        failed_nodes,
        validation,
        started_at,
        completed_at,
        paused_at,
        paused_by,
        last_progress_at: _,
        canaries_updated_at,
        observed_retry,
        observed_generation,
        message: _,
        active_sequence,
        reactivated_at,
        reached: _,
    } = stored;
    let same_condition = |a: &Condition, b: &Condition| {
        let Condition {
            last_transition_time,
            message: _,
            observed_generation,
            reason,
            status,
            type_,
        } = a;
        *last_transition_time == b.last_transition_time
            && *observed_generation == b.observed_generation
            && *reason == b.reason
            && *status == b.status
            && *type_ == b.type_
    };
    *phase == new.phase
        && *failed == new.failed
        && *started_at == new.started_at
        && *completed_at == new.completed_at
        && *paused_at == new.paused_at
        && *paused_by == new.paused_by
        && *canaries_updated_at == new.canaries_updated_at
        && *observed_retry == new.observed_retry
        && *observed_generation == new.observed_generation
        && *active_sequence == new.active_sequence
        && *reactivated_at == new.reactivated_at
        && conditions.len() == new.conditions.len()
        && conditions
            .iter()
            .zip(&new.conditions)
            .all(|(a, b)| same_condition(a, b))
        && *failed_nodes == new.failed_nodes
        && *validation == new.validation
}

/// Applies a plan's writes to revisions and the spec overlay, as the API server would.
fn apply_writes(revisions: &mut Vec<RevisionState>, overlay: &mut Overlay, plan: &Plan) {
    for r in &plan.records {
        overlay.records.insert(Sym::from(&r.node), r.record.clone());
    }
    for h in &plan.holds {
        if let Some(r) = revisions.iter_mut().find(|r| r.name == h.revision) {
            h.apply(r);
        }
    }
    for u in &plan.status_updates {
        if let Some(r) = revisions.iter_mut().find(|r| r.name == u.revision) {
            r.status = NetworkConfigRevisionStatus::clone(&u.status);
        }
    }
    for a in &plan.assignments {
        overlay.specs.insert(a.node.clone(), Some(a.spec()));
    }
    for n in &plan.delete_configs {
        overlay.specs.insert(Sym::from(n), None);
    }
    revisions.retain(|r| !plan.delete_revisions.iter().any(|d| r.name == *d));
}

/// Folds a later round into a plan: last write per object wins, first-appearance order is kept.
fn merge(plan: &mut Plan, next: Plan) {
    for r in next.records {
        match plan.records.iter_mut().find(|p| p.node == r.node) {
            Some(p) => *p = r,
            None => plan.records.push(r),
        }
    }
    for h in next.holds {
        match plan.holds.iter_mut().find(|p| p.revision == h.revision) {
            Some(p) => *p = h,
            None => plan.holds.push(h),
        }
    }
    for u in next.status_updates {
        match plan
            .status_updates
            .iter_mut()
            .find(|p| p.revision == u.revision)
        {
            Some(p) => *p = u,
            None => plan.status_updates.push(u),
        }
    }
    for a in next.assignments {
        match plan.assignments.iter_mut().find(|p| p.node == a.node) {
            Some(p) => {
                let create = p.create;
                *p = a;
                p.create = create;
            }
            None => plan.assignments.push(a),
        }
    }
    // A revision deleted in a later round has no status update worth writing.
    plan.status_updates
        .retain(|u| !next.delete_revisions.contains(&u.revision));
    plan.holds
        .retain(|h| !next.delete_revisions.contains(&h.revision));
    plan.delete_configs.extend(next.delete_configs);
    plan.delete_revisions.extend(next.delete_revisions);
    plan.events.extend(next.events);
}

/// One round: the stages in order (see the module docs).
fn step_once(
    input: &RolloutInput,
    memo: &StepMemo,
    revisions: &[RevisionState],
    overlay: &Overlay,
    now: Timestamp,
) -> Plan {
    let mut w = observe::observe_fleet(input, memo, overlay, now);
    revisions::evaluate_revisions(&mut w, revisions);
    quarantine::streaks_and_suspects(&mut w);
    order::order_and_budgets(&mut w, memo);
    intents::rollback_intents(&mut w);
    intents::new_node_intents(&mut w);
    intents::target_rollout_intents(&mut w);
    admit::admit_under_budget(&mut w);
    let after = report::after_plan(&mut w);
    let deletions = history::history_deletions(&w, after.last_good_after);
    report::report(w, after, deletions)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use netwave_api::{FailedNode, NetworkConfigRevisionStatus};

    use super::counters_only;
    use crate::types::Timestamp;

    /// What `counters_only` means, as the copy-and-strip it replaced wrote it.
    fn stripped_equal(a: &NetworkConfigRevisionStatus, b: &NetworkConfigRevisionStatus) -> bool {
        let strip = |s: &NetworkConfigRevisionStatus| {
            let mut s = s.clone();
            (s.total, s.updated, s.in_progress, s.queued, s.skipped) = (0, 0, 0, 0, 0);
            s.message = None;
            s.last_progress_at = None;
            for c in &mut s.conditions {
                c.message.clear();
            }
            s
        };
        strip(a) == strip(b)
    }

    #[test]
    fn counters_only_ignores_counters_and_words_and_nothing_else() {
        fn at(secs: u64) -> Option<Time> {
            Some(Timestamp(1_800_000_000_000).plus_secs(secs).to_time())
        }
        let stored = NetworkConfigRevisionStatus {
            phase: Some("Progressing".into()),
            conditions: vec![Condition {
                type_: "Progressing".into(),
                status: "True".into(),
                reason: "Rolling".into(),
                message: "1 of 3".into(),
                last_transition_time: at(1).expect("a time"),
                observed_generation: Some(1),
            }],
            total: 3,
            updated: 1,
            started_at: at(1),
            ..Default::default()
        };
        type Edit = fn(&mut NetworkConfigRevisionStatus);
        let edits: Vec<(&str, Edit, bool)> = vec![
            ("total", |s| s.total = 4, true),
            ("updated", |s| s.updated = 2, true),
            ("in progress", |s| s.in_progress = 1, true),
            ("queued", |s| s.queued = 1, true),
            ("skipped", |s| s.skipped = 1, true),
            ("message", |s| s.message = Some("2 of 3".into()), true),
            ("last progress", |s| s.last_progress_at = at(9), true),
            (
                "condition message",
                |s| s.conditions[0].message = "2 of 3".into(),
                true,
            ),
            ("phase", |s| s.phase = Some("Complete".into()), false),
            ("failed", |s| s.failed = 1, false),
            (
                "condition reason",
                |s| s.conditions[0].reason = "Held".into(),
                false,
            ),
            (
                "condition status",
                |s| s.conditions[0].status = "False".into(),
                false,
            ),
            ("condition gone", |s| s.conditions.clear(), false),
            (
                "failed nodes",
                |s| s.failed_nodes.push(FailedNode::default()),
                false,
            ),
            ("completed", |s| s.completed_at = at(5), false),
            ("paused by", |s| s.paused_by = Some("admin".into()), false),
            ("canaries", |s| s.canaries_updated_at = at(3), false),
            ("retry", |s| s.observed_retry = Some(1), false),
            ("generation", |s| s.observed_generation = Some(2), false),
            ("sequence", |s| s.active_sequence = Some(7), false),
            ("reactivated", |s| s.reactivated_at = at(4), false),
        ];
        for (what, edit, only) in edits {
            let mut new = stored.clone();
            edit(&mut new);
            assert_eq!(counters_only(&stored, &new), only, "{what}");
            assert_eq!(stripped_equal(&stored, &new), only, "{what} (reference)");
        }
        assert!(counters_only(&stored, &stored));
    }
}
