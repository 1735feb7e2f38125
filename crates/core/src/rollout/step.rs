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
    strip(stored) == strip(new)
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
            r.status = u.status.clone();
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
