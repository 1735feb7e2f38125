//! Stage 7: admit the intents under the budget (DESIGN.md §3 **Budget**, **Fast path**).
//!
//! Two passes over the intents, in urgency order: first every move that adds no in-flight node
//! (superseding a node already in flight, a fast path to the config the node runs, a rollback of a node
//! at rest), then the ones that do, while `maxUnavailable` and `maxUnavailablePerDomain` have room.
//! Free moves first, so a full budget never holds back a move that costs nothing.
//!
//! A joining node (no config yet) given the last good revision is free too: nothing of ours runs there
//! to disrupt, and the revision is proven on the fleet, so it does not wait behind a stuck rollout. It
//! is in flight until its agent reports (so the target's rollout waits for it), but it never took a
//! slot from the budget. So moving it on while it is still in flight there is no free supersede: the
//! move takes a slot like any other (else a rollout could have more nodes in flight than
//! `maxUnavailable`, as the simulator found: a node joining on the last good revision and one in flight
//! on an older target, both moved to a new target under a budget of one; [`holds_slot`]).

use std::mem;

use super::super::plan::{AssignReason, Assignment};
use super::super::vocab::Phase;
use super::super::world::{Intent, Node, Refused, Spec, World, in_flight_of, updated_of};
use crate::sym::Sym;

/// Turns intents into assignments, then records what holds back the rest.
pub(super) fn admit_under_budget(w: &mut World) {
    let intents = mem::take(&mut w.intents.list);
    for free_pass in [true, false] {
        for intent in &intents {
            let n = &w.nodes[intent.node];
            if n.assigned {
                continue;
            }
            let rev = &w.revs[intent.rev];
            let Some(hash) = w.hashes.get(intent.rev, intent.node) else {
                if free_pass {
                    let missing = w.missing.entry(intent.rev).or_default();
                    missing.push(n.name().to_string());
                }
                continue;
            };
            let will = in_flight_of(rev.name(), rev.state.retry, hash, n.status);
            let joining = intent.reason == AssignReason::NewNode
                && Some(intent.rev) == w.last_good
                && !n.has_config;
            let spends = will && !holds_slot(w, n) && !joining;
            if free_pass == spends {
                continue;
            }
            if spends
                && (!n.may_spend(intent.reason)
                    || w.budgets.full()
                    || w.budgets.domain_full(n.domain))
            {
                continue;
            }
            assign(w, intent, hash, will);
        }
    }
    w.refused = refusals(w, &intents);
    w.intents.list = intents;
}

/// In flight on a slot of the budget: not on the first config of a node that joined for free (its
/// agent never reported a config good, and the revision it runs is a proven one: complete, or
/// completed once and made the target again since), which holds none.
fn holds_slot(w: &World, n: &Node) -> bool {
    n.in_flight
        && !(n.status.last_good_revision.is_none()
            && n.spec.is_some_and(|s| {
                (w.revs.iter()).any(|r| {
                    let st = &r.state.status;
                    r.name() == s.revision
                        && (r.stored_phase == Some(Phase::Complete)
                            || st.completed_at.is_some()
                            || st.reactivated_at.is_some())
                })
            }))
}

/// Writes the move into the world (so later intents see the node assigned and the budget spent) and
/// into the plan.
fn assign<'a>(w: &mut World<'a>, intent: &Intent, hash: &'a Sym, will: bool) {
    let rev = &w.revs[intent.rev];
    let n = &mut w.nodes[intent.node];
    // A move that keeps the config the node runs is a fast path, whatever made us want it.
    let reason = match intent.reason {
        AssignReason::Canary | AssignReason::Rollout | AssignReason::NewNode
            if !will && n.spec.is_some_and(|s| s.revision != rev.name()) =>
        {
            AssignReason::FastPath
        }
        r => r,
    };
    if will != n.in_flight {
        w.budgets.set(n.domain, will);
    }
    n.in_flight = will;
    n.assigned = true;
    n.spec = Some(Spec {
        revision: rev.name(),
        retry: rev.state.retry,
        hash,
        assigned_at: Some(w.now),
    });
    n.updated_spec = updated_of(rev.name(), hash, n.status, rev.name());
    w.assignments.push(Assignment {
        node: n.name().clone(),
        create: !n.has_config,
        revision: rev.name().clone(),
        sequence: rev.state.sequence,
        config_hash: hash.clone(),
        retry: rev.state.retry,
        assigned_at: w.now,
        reason,
    });
}

/// What holds back the moves that did not happen, judged on the counts after the plan (what the next
/// step will see), so a repeated step reports the same and writes nothing.
fn refusals(w: &World, intents: &[Intent]) -> Refused {
    let mut refused = Refused::default();
    for intent in intents {
        let n = &w.nodes[intent.node];
        let rev = &w.revs[intent.rev];
        if n.assigned || !n.may_spend(intent.reason) {
            continue;
        }
        let Some(hash) = w.hashes.get(intent.rev, intent.node) else {
            continue;
        };
        if !in_flight_of(rev.name(), rev.state.retry, hash, n.status) || holds_slot(w, n) {
            continue;
        }
        if w.budgets.full() {
            refused.budget = true;
        } else if w.budgets.domain_full(n.domain) {
            refused.domains.insert(n.domain);
        }
    }
    refused
}
