//! Stages 8 and 10: what the world looks like after the plan, and the report of it — each revision's
//! desired status and Events (DESIGN.md §3 **Progress deadline**, **Pause**), what the rollout waits
//! on, and when to step again.

use std::collections::BTreeMap;
use std::mem;
use std::sync::Arc;

use super::super::plan::{
    Event, EventReason, HoldRecord, ObjectRef, Plan, Report, StatusUpdate, WaitingOn,
};
use super::super::status;
use super::super::world::{
    CanaryStage, Context, Counts, FailCause, Fate, LIST_LIMIT, TargetView, World,
};
use crate::sym::Sym;
use crate::types::Timestamp;
use netwave_api::features::FeatureSet;

/// Node counts after the plan, per revision and in detail for the target.
pub(super) struct AfterPlan<'a> {
    pub counts: BTreeMap<&'a Sym, Counts>,
    pub target: Option<TargetView>,
    /// The last good revision once the plan is applied (the target if it completes now).
    pub last_good_after: Option<usize>,
}

impl<'a> AfterPlan<'a> {
    fn context<'b>(&'b self, w: &'b World<'a>) -> Context<'a, 'b> {
        Context {
            now: w.now,
            revs: &w.revs,
            target: self.target.as_ref(),
            last_good: w.last_good,
            counts: &self.counts,
            fleet: w.nodes.len() as u32,
        }
    }
}

/// Counts the nodes per revision, and the target's nodes by state, as the next step will see them.
pub(super) fn after_plan<'a>(w: &mut World<'a>) -> AfterPlan<'a> {
    // A few revisions: a short list, the one counted last looked at first (as in `by_revision`).
    let mut tallies: Vec<(&'a Sym, Counts)> = Vec::new();
    let mut last = 0;
    for n in &w.nodes {
        if let Some(s) = n.spec {
            if tallies.get(last).is_none_or(|(r, _)| *r != s.revision) {
                last = match tallies.iter().position(|(r, _)| *r == s.revision) {
                    Some(at) => at,
                    None => {
                        tallies.push((s.revision, Counts::default()));
                        tallies.len() - 1
                    }
                };
            }
            let c = &mut tallies[last].1;
            c.assigned += 1;
            if n.updated_spec {
                c.updated += 1;
            }
        }
    }
    let counts: BTreeMap<&'a Sym, Counts> = tallies.into_iter().collect();
    let mut after = AfterPlan {
        counts,
        target: w.target.map(|t| target_view(w, t)),
        last_good_after: None,
    };
    after.last_good_after = after.context(w).last_good_after();
    after
}

/// The target's nodes after the plan, by state (failed nodes are not counted at all).
#[derive(Default)]
struct Tally {
    updated: u32,
    in_progress: u32,
    queued: u32,
    /// Not eligible: not Ready, cordoned, its config cannot be read (`unreadable` of them) or
    /// quarantined (`quarantined` of them).
    skipped: u32,
    unreadable: u32,
    quarantined: u32,
    /// Skipped because their agent lacks a feature of their config, and the features missing.
    waiting_agent: u32,
    waiting_agent_first: Vec<String>,
    missing_features: FeatureSet,
    started: bool,
    /// The first few nodes applying it, not ready, and with a config that cannot be read.
    applying: Vec<String>,
    unready: Vec<String>,
    unreadable_first: Vec<String>,
    quarantined_first: Vec<String>,
}

fn target_view(w: &mut World, t: usize) -> TargetView {
    let tally = tally_target(w, t);
    if let CanaryStage::Baking { until } = w.canary {
        w.requeue.wake(until);
    }
    let target = &w.revs[t];
    let halted_by_policy = !target.policy_errors.is_empty();
    let invalid = !target.state.validation.errors.is_empty();
    TargetView {
        idx: t,
        total: w.nodes.len() as u32,
        updated: tally.updated,
        in_progress: tally.in_progress,
        queued: tally.queued,
        skipped: tally.skipped,
        waiting_for_agent: tally.waiting_agent,
        started: tally.started,
        halted_by_policy,
        invalid,
        canary_stage: w.canary.clone(),
        canaries_done_now: w.canaries_done_now,
        waiting: target_waits(w, t, tally),
    }
}

/// Counts the target's nodes, and wakes the step when a pickup or apply deadline of this attempt runs
/// out.
fn tally_target(w: &mut World, t: usize) -> Tally {
    let target = &w.revs[t];
    let name = target.name();
    let mut tally = Tally {
        started: target.same_attempt && target.state.status.started_at.is_some(),
        ..Tally::default()
    };
    for &i in &w.order {
        let n = &w.nodes[i];
        if n.failed_target {
            continue;
        }
        match n.spec {
            Some(s) if s.revision == name => {
                tally.started = true;
                if n.updated(name) {
                    tally.updated += 1;
                    continue;
                }
                tally.in_progress += 1;
                if tally.applying.len() < LIST_LIMIT {
                    tally.applying.push(n.name().to_string());
                }
                if s.retry == target.state.retry
                    && let Some((_, deadline)) = n.deadline(&target.policy)
                {
                    w.requeue.wake(deadline.at());
                }
            }
            _ if n.unreadable => {
                tally.skipped += 1;
                tally.unreadable += 1;
                if tally.unreadable_first.len() < LIST_LIMIT {
                    tally.unreadable_first.push(n.name().to_string());
                }
            }
            _ if n.quarantined => {
                tally.skipped += 1;
                tally.quarantined += 1;
                if tally.quarantined_first.len() < LIST_LIMIT {
                    tally.quarantined_first.push(n.name().to_string());
                }
            }
            _ if !n.eligible => {
                tally.skipped += 1;
                if tally.unready.len() < LIST_LIMIT {
                    tally.unready.push(n.name().to_string());
                }
            }
            _ => {
                let lacks = w.lacks(t, i);
                if lacks.is_empty() {
                    tally.queued += 1;
                    continue;
                }
                tally.skipped += 1;
                tally.waiting_agent += 1;
                tally.missing_features = tally.missing_features.union(lacks);
                if tally.waiting_agent_first.len() < LIST_LIMIT {
                    tally.waiting_agent_first.push(n.name().to_string());
                }
            }
        }
    }
    tally
}

/// What the target's rollout waits on, most fundamental first.
fn target_waits(w: &mut World, t: usize, tally: Tally) -> Vec<WaitingOn> {
    let target = &w.revs[t];
    let mut waits = Vec::new();
    if let Some(h) = target.held() {
        waits.push(WaitingOn::Held {
            removal: h.summary.clone(),
        });
    } else if target.state.paused {
        let since = target
            .state
            .status
            .paused_at
            .as_ref()
            .map_or(w.now.truncate_to_secs(), Timestamp::from_time);
        waits.push(WaitingOn::Paused { since });
    }
    if !target.policy_errors.is_empty() {
        waits.push(WaitingOn::InvalidPolicy {
            errors: target.policy_errors.clone(),
        });
    }
    if !target.state.validation.errors.is_empty() {
        waits.push(WaitingOn::ValidationErrors {
            errors: target.state.validation.errors.clone(),
        });
    }
    waits.append(&mut w.waiting);
    let b = &w.budgets;
    if tally.queued > 0 && w.refused.budget {
        waits.push(WaitingOn::Budget {
            in_flight: b.in_flight,
            budget: b.total,
        });
    }
    if tally.queued > 0 {
        waits.extend(w.refused.domains.iter().map(|&d| WaitingOn::DomainBudget {
            domain: b.domain_names[d].to_string(),
            in_flight: b.domain_in_flight[d],
            budget: b.domain_budget[d].unwrap_or(0),
        }));
    }
    if tally.in_progress > 0 {
        waits.push(WaitingOn::NodesInFlight {
            count: tally.in_progress,
            first: tally.applying,
        });
    }
    let not_ready = tally.skipped - tally.unreadable - tally.quarantined - tally.waiting_agent;
    if not_ready > 0 {
        waits.push(WaitingOn::NotReady {
            count: not_ready,
            first: tally.unready,
        });
    }
    if tally.waiting_agent > 0 {
        waits.push(WaitingOn::AgentLacksFeatures {
            count: tally.waiting_agent,
            first: tally.waiting_agent_first,
            missing: tally.missing_features.to_string(),
        });
    }
    if tally.quarantined > 0 {
        waits.push(WaitingOn::Quarantined {
            count: tally.quarantined,
            first: tally.quarantined_first,
        });
    }
    if tally.unreadable > 0 {
        waits.push(WaitingOn::UnreadableConfigs {
            count: tally.unreadable,
            first: tally.unreadable_first,
        });
    }
    waits
}

/// The plan: each surviving revision's status where it changes (with the Events of its transitions),
/// the assignments and deletions, and the report.
pub(super) fn report(mut w: World, mut after: AfterPlan, delete_revisions: Vec<String>) -> Plan {
    let node_events = mem::take(&mut w.node_events);
    let ctx = after.context(&w);
    let mut status_updates = Vec::new();
    let (holds, mut events) = hold_records(&w);
    events.extend(node_events);
    for (i, rev) in ctx.revs.iter().enumerate() {
        if delete_revisions.iter().any(|d| d == rev.name()) {
            continue;
        }
        let (new_status, mut evs) = status::build(&ctx, i);
        if new_status != rev.state.status {
            status_updates.push(StatusUpdate {
                revision: rev.name().to_string(),
                status: Arc::new(new_status),
            });
            events.append(&mut evs);
        }
    }
    // The target is never deleted (history keeps it), so its deadline always counts.
    let deadline = status::deadline_at(&ctx);
    if let Some(at) = deadline {
        w.requeue.wake(at);
    }
    let target_waiting = after.target.take().map(|t| t.waiting);
    let missing = mem::take(&mut w.missing);
    let waiting = report_waiting(&w, &after.counts, target_waiting, missing);
    Plan {
        records: mem::take(&mut w.records),
        holds,
        status_updates,
        assignments: mem::take(&mut w.assignments),
        delete_configs: mem::take(&mut w.orphans),
        delete_revisions,
        events,
        report: Report {
            target: w.target.map(|t| w.revs[t].name().to_string()),
            last_good: after.last_good_after.map(|i| w.revs[i].name().to_string()),
            in_flight: w.budgets.in_flight,
            budget: w.budgets.total,
            waiting,
            requeue_at: w.requeue.at,
        },
    }
}

/// The target's hold when it is not on record yet, and its Event (once: the next step finds it
/// recorded).
fn hold_records(w: &World) -> (Vec<HoldRecord>, Vec<Event>) {
    let Some(t) = w.target else {
        return (Vec::new(), Vec::new());
    };
    let r = &w.revs[t];
    let Some(h) = r.hold.as_ref().filter(|h| !h.recorded) else {
        return (Vec::new(), Vec::new());
    };
    let record = HoldRecord {
        revision: r.name().to_string(),
        summary: h.summary.clone(),
        basis: h.basis.clone(),
    };
    let event = Event {
        object: ObjectRef::Revision(r.name().to_string()),
        type_: EventReason::DestructiveChange.type_(),
        reason: EventReason::DestructiveChange,
        message: record.event_note(r.state.sequence),
    };
    (vec![record], vec![event])
}

/// What the whole rollout waits on: the target's waits, no target at all, no last good revision to
/// roll back to, rendered configs the shell did not supply.
fn report_waiting(
    w: &World,
    counts: &BTreeMap<&Sym, Counts>,
    target_waiting: Option<Vec<WaitingOn>>,
    missing: BTreeMap<usize, Vec<String>>,
) -> Vec<WaitingOn> {
    let mut waiting = target_waiting.unwrap_or_default();
    if w.target.is_none() {
        waiting.push(WaitingOn::NoTarget);
    }
    if w.last_good.is_none()
        && let Some(f) = w.revs.iter().find(|r| {
            matches!(
                r.fate,
                Fate::Failed(FailCause::MaxFailures | FailCause::Stored)
            )
        })
        && counts.get(f.name()).is_some_and(|c| c.assigned > 0)
    {
        waiting.push(WaitingOn::NoLastGood {
            failed: f.name().to_string(),
        });
    }
    for (r, names) in missing {
        let revision = w.revs[r].name().to_string();
        let count = names.len() as u32;
        let first = names.into_iter().take(LIST_LIMIT).collect();
        waiting.push(match w.revs[r].state.other_render_version {
            Some(version) => WaitingOn::OtherRenderVersion {
                revision,
                version,
                count,
                first,
            },
            None => WaitingOn::MissingRender {
                revision,
                count,
                first,
            },
        });
    }
    waiting
}
