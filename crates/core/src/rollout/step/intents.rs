//! Stages 4–6: the moves wanted this step, most urgent first. Each node gets at most one intent; the
//! budget decides later which happen ([`admit`](super::admit)).
//!
//! 1. rollbacks to the last good revision (DESIGN.md §3 **maxFailures**, **Fail forward**);
//! 2. new nodes (**New nodes**);
//! 3. the target, in rollout order, gated by canaries and their bake (**Order**, **Pause**).

use std::collections::BTreeSet;

use super::super::plan::{AssignReason, WaitingOn};
use super::super::policy::{CanaryNodes, CanaryPolicy};
use super::super::vocab::Phase;
use super::super::world::{CanaryStage, Fate, Node, Rev, World};
use crate::sym::Sym;
use crate::types::Timestamp;

/// Every node on a failed revision, and every node that failed the target, goes back to the last good
/// revision. Without one, nothing is assigned: the nodes keep what their agents restored.
pub(super) fn rollback_intents(w: &mut World) {
    let Some(lg) = w.last_good else { return };
    let failed_revs: BTreeSet<&Sym> = w
        .revs
        .iter()
        .filter(|r| matches!(r.fate, Fate::Failed(_)))
        .map(|r| r.name())
        .collect();
    let lg_name = w.revs[lg].name();
    let target_name = w.target.map(|t| w.revs[t].name());
    for &i in &w.order {
        let n = &w.nodes[i];
        let Some(spec) = n.spec else { continue };
        let off_failed = failed_revs.contains(spec.revision);
        let failed_here =
            Some(spec.revision) == target_name && spec.revision != lg_name && n.failed_target;
        // An agent that cannot apply the last good config keeps what it restored itself.
        if (off_failed || failed_here) && w.lacks(lg, i).is_empty() {
            w.intents.push(i, lg, AssignReason::Rollback);
        }
    }
}

/// New nodes (no config) get the last good revision until the target has an updated node (and is not
/// halted), then the target. Without a last good revision they are ordinary rollout candidates.
pub(super) fn new_node_intents(w: &mut World) {
    let (Some(t), Some(lg)) = (w.target, w.last_good) else {
        return;
    };
    let target = &w.revs[t];
    let updated = w.by_revision.get(target.name()).map_or(0, |v| {
        v.iter()
            .filter(|&&i| w.nodes[i].updated(target.name()))
            .count()
    });
    let rev = if !target.halted() && updated > 0 {
        t
    } else {
        lg
    };
    // A node that never ran a revision gets none with validation errors.
    if !w.revs[rev].state.validation.errors.is_empty() {
        return;
    }
    for &i in &w.order {
        let n = &w.nodes[i];
        if n.has_config || !n.eligible || w.intents.has(i) {
            continue;
        }
        // An agent that lacks a feature of the target's config starts on the last good revision.
        let rev = match rev {
            r if w.lacks(r, i).is_empty() => r,
            r if r != lg && w.lacks(lg, i).is_empty() => lg,
            _ => continue,
        };
        w.intents.push(i, rev, AssignReason::NewNode);
    }
}

/// The target for every eligible node that does not run it yet, in rollout order: only the canaries
/// until they are updated, nobody during the bake, nobody while the target is halted.
pub(super) fn target_rollout_intents(w: &mut World) {
    let Some(t) = w.target else { return };
    (w.canary, w.canaries_done_now) = canary_stage(w, t);
    let target = &w.revs[t];
    if target.halted() {
        return;
    }
    let mut gated = false;
    for &i in &w.order {
        let n = &w.nodes[i];
        if w.intents.has(i) || !n.eligible || n.failed_target {
            continue;
        }
        if n.spec.is_none() && w.last_good.is_some() {
            continue; // new nodes were handled before
        }
        // A move to the last good revision (rollback, new node) finishes before the node moves on to
        // the target — unless it cannot finish any more: its agent did not answer by that revision's
        // pickup or apply deadline (a node whose first rollout timed out stays on it, in flight, for
        // good). Waiting on such a node would keep every later target from completing; taking the
        // target costs no budget (it is in flight already) and its timeout there is a failure on record.
        if let (Some(s), Some(lg)) = (n.spec, w.last_good)
            && s.revision == w.revs[lg].name()
            && lg != t
            && n.in_flight
        {
            match n.deadline(&w.revs[lg].policy).map(|(_, d)| d.at()) {
                Some(over) if w.now >= over => {}
                over => {
                    if let Some(over) = over {
                        w.requeue.wake(over);
                    }
                    continue;
                }
            }
        }
        let Some(reason) = target_move(n, target, w.hashes.get(t, i)) else {
            continue;
        };
        // Its agent would drop what it does not know and report Provisioned: it waits for its agent
        // (counted in the report).
        if !w.lacks(t, i).is_empty() {
            continue;
        }
        let reason = match &w.canary {
            CanaryStage::Canaries { nodes, .. } if !nodes.contains(&i) => {
                gated = true;
                continue;
            }
            CanaryStage::Canaries { .. } if reason == AssignReason::Rollout => AssignReason::Canary,
            CanaryStage::Baking { .. } => {
                gated = true;
                continue;
            }
            _ => reason,
        };
        w.intents.push(i, t, reason);
    }
    match &w.canary {
        CanaryStage::Canaries { pending, .. } => {
            w.waiting.push(WaitingOn::Canaries { pending: *pending })
        }
        CanaryStage::Baking { until } if gated => {
            w.waiting.push(WaitingOn::CanaryBake { until: *until })
        }
        _ => {}
    }
}

/// Why node `n` should be (re)assigned the target, if it should: it runs something else, its spec
/// holds a stale rendering (`want` is the current one), an older attempt, or no assignment time.
fn target_move(n: &Node, target: &Rev, want: Option<&Sym>) -> Option<AssignReason> {
    let name = target.name();
    match n.spec {
        Some(s) if s.revision == name => {
            if want.is_some_and(|h| h != s.hash) {
                Some(AssignReason::Rerender)
            } else if n.updated(name) {
                None
            } else if s.retry != target.state.retry {
                Some(AssignReason::Retry)
            } else if s.assigned_at.is_none() {
                Some(AssignReason::Restamp)
            } else {
                None
            }
        }
        _ => Some(AssignReason::Rollout),
    }
}

/// Where the target's canaries stand, and whether they all became updated this step. The bake clock
/// starts when the last canary is updated and is kept in `status.canariesUpdatedAt` (this attempt).
fn canary_stage(w: &World, t: usize) -> (CanaryStage, bool) {
    let target = &w.revs[t];
    let Some(canary) = &target.policy.canary else {
        return (CanaryStage::Off, false);
    };
    if target.stored_phase == Some(Phase::Complete) {
        return (CanaryStage::Off, false);
    }
    let stored_at = target
        .state
        .status
        .canaries_updated_at
        .as_ref()
        .filter(|_| target.same_attempt)
        .map(Timestamp::from_time);
    let (at, done_now) = match stored_at {
        Some(at) => (at, false),
        None => {
            let nodes = pick_canaries(w, target, canary);
            let pending = nodes
                .iter()
                .filter(|&&i| !w.nodes[i].updated(target.name()))
                .count() as u32;
            if pending > 0 {
                return (CanaryStage::Canaries { nodes, pending }, false);
            }
            (w.now.truncate_to_secs(), true)
        }
    };
    let until = at.plus_secs(canary.bake_seconds as u64);
    let stage = if w.now < until {
        CanaryStage::Baking { until }
    } else {
        CanaryStage::Done
    };
    (stage, done_now)
}

/// The canaries: the eligible nodes the selector matches, or the first `count` eligible ones in
/// rollout order. Nodes that failed the target are never canaries.
fn pick_canaries(w: &World, target: &Rev, canary: &CanaryPolicy) -> BTreeSet<usize> {
    let ok = |i: &usize| w.nodes[*i].eligible && !w.nodes[*i].failed_target;
    match &canary.nodes {
        CanaryNodes::Selector(sel) => w
            .order
            .iter()
            .copied()
            .filter(|i| ok(i) && sel.matches(&w.nodes[*i].state.labels))
            .collect(),
        // Nodes already given the target are the canaries chosen by an earlier step: they come first,
        // so a node that joins and sorts early does not take over.
        CanaryNodes::Count(k) => {
            let on_target = |i: &usize| {
                w.nodes[*i]
                    .spec
                    .is_some_and(|s| s.revision == target.name())
            };
            let order = || w.order.iter().copied();
            order()
                .filter(|i| ok(i) && on_target(i))
                .chain(order().filter(|i| ok(i) && !on_target(i)))
                .take(*k as usize)
                .collect()
        }
    }
}
