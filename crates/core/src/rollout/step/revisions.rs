//! Stage 2: the fate of each revision (DESIGN.md §3 **Target**, **Failure**, **maxFailures**).
//!
//! Newest first: a revision `Failed` on record for this attempt stays failed; the first other one is
//! the candidate, failed now by fleet validation errors or by reaching `maxFailures`, else the target;
//! everything older than the target is just older.

use std::cmp::Ordering;
use std::collections::BTreeSet;

use netwave_api::FailedNode;

use super::super::hold;
use super::super::input::{AgentPhase, RevisionState, RolloutInput};
use super::super::vocab::{Phase, REASON_PROTOCOL_VIOLATION};
use super::super::world::{FailCause, Fate, Hold, Node, Rev, World};
use crate::types::Timestamp;

/// Newest (highest sequence) first; the name breaks ties so the order never depends on the input's.
fn newest_first(a: &&RevisionState, b: &&RevisionState) -> Ordering {
    b.sequence.cmp(&a.sequence).then(a.name.cmp(&b.name))
}

/// The revisions whose rendered hashes a step over `input` may need: every revision that could become
/// the target this step (newest first, skipping ones that stay `Failed`) down to and including the
/// newest `Complete` one (the last good revision, where rollbacks go). Render these, fill
/// [`RolloutInput::rendered`], then call [`step`](super::step).
pub fn revisions_to_render(input: &RolloutInput) -> Vec<String> {
    let mut revs: Vec<&RevisionState> = input.revisions.iter().collect();
    revs.sort_by(newest_first);
    let mut out = Vec::new();
    for r in revs {
        let phase = Phase::parse(r.status.phase.as_deref());
        let same_attempt = r.status.observed_retry.is_none_or(|x| x == r.retry);
        if phase == Some(Phase::Failed) && same_attempt {
            continue;
        }
        out.push(r.name.to_string());
        if phase == Some(Phase::Complete) {
            break;
        }
    }
    out
}

/// The last good revision as a step over these revisions finds it: the newest `Complete` one (a
/// `Complete` revision is never failed). What the hold measures against ([`hold`](super::super::hold)).
pub fn last_good(revisions: &[RevisionState]) -> Option<&RevisionState> {
    let mut revs: Vec<&RevisionState> = revisions.iter().collect();
    revs.sort_by(newest_first);
    revs.into_iter()
        .find(|r| Phase::parse(r.status.phase.as_deref()) == Some(Phase::Complete))
}

/// Judges every revision, newest first, and finds the target and the last good revision.
pub(super) fn evaluate_revisions<'a>(w: &mut World<'a>, revisions: &'a [RevisionState]) {
    let mut states: Vec<&RevisionState> = revisions.iter().collect();
    states.sort_by(newest_first);
    states.dedup_by(|a, b| a.name == b.name);
    w.revs.reserve(states.len());
    for state in states {
        let mut rev = Rev::new(state, &w.input.defaults);
        rev.fate = if rev.stays_failed() {
            Fate::Failed(FailCause::Stored)
        } else if w.target.is_some() {
            Fate::Older
        } else {
            candidate_fate(&mut rev, w)
        };
        if rev.fate == Fate::Target {
            w.target = Some(w.revs.len());
        }
        w.revs.push(rev);
    }
    w.last_good = w.revs.iter().position(|r| {
        !matches!(r.fate, Fate::Failed(_)) && r.stored_phase == Some(Phase::Complete)
    });
    if let Some(t) = w.target {
        for f in w.revs[t].failed_nodes.iter() {
            if let Ok(i) = w.nodes.binary_search_by(|n| n.name().as_str().cmp(&f.node)) {
                w.nodes[i].failed_target = true;
            }
        }
    }
    judge_hold(w);
}

/// DESIGN.md §6 **A held change stays held**: the target is measured against the last good revision
/// — whatever made it the target (cut, reactivated, re-armed) — and held unless an admin approved a
/// hold with exactly this basis ([`hold`](super::super::hold)). Not measured without both footprints.
/// A target not destructive on its inputs is measured on what moving the nodes to its rendering takes
/// off them ([`loss`](super::super::loss)): a Node label change that re-renders it is held the same way.
fn judge_hold(w: &mut World) {
    let Some(t) = w.target else {
        return;
    };
    let target = w.revs[t].state;
    let hold = input_hold(w, t).or_else(|| {
        let loss = w.input.move_losses.get(target.name.as_str())?;
        loss.exceeds(w.input.defaults.destructive_threshold)
            .then(|| (loss.to_string(), loss.basis.clone()))
    });
    w.revs[t].hold = hold.map(|(summary, basis)| {
        let recorded = target.hold_basis.as_deref() == Some(basis.as_str());
        Hold {
            summary,
            basis,
            recorded,
            approved: recorded && !target.paused,
        }
    });
}

/// The target's removal against the last good revision, when destructive: (summary, basis).
fn input_hold(w: &World, t: usize) -> Option<(String, String)> {
    let lg = w.last_good.filter(|lg| *lg != t)?;
    let footprints = &w.input.footprints;
    let (lg_name, target) = (w.revs[lg].name(), w.revs[t].state);
    let baseline = footprints.get(lg_name.as_str())?;
    let candidate = footprints.get(target.name.as_str())?;
    let threshold = w.input.defaults.destructive_threshold;
    let removal = hold::destructive(lg_name, baseline, candidate, threshold)?;
    Some((removal.to_string(), hold::basis(target.sequence, lg_name)))
}

/// The fate of the newest revision not `Failed` on record: the target, unless fleet validation or
/// `maxFailures` fails it now. Records the failures found this step, judged for quarantine first: a
/// quarantined node's failure does not count.
fn candidate_fate(rev: &mut Rev, w: &mut World) -> Fate {
    // A completed revision is the proven last good one: it is never failed afterwards (a node that
    // fails it later is recorded and marks it Degraded), or one bad node would roll back the fleet.
    let complete = rev.stored_phase == Some(Phase::Complete);
    if !complete && !rev.state.validation.errors.is_empty() {
        return Fate::Failed(FailCause::Validation);
    }
    let assigned = w.by_revision.get(rev.name()).map_or(&[][..], Vec::as_slice);
    let found = detect_failures(&w.nodes, assigned, rev, w.now);
    rev.new_failures = found.len();
    if !found.is_empty() {
        rev.failed_nodes.to_mut().extend(found);
    }
    super::quarantine::judge_failures(rev, &w.nodes, w.now, &mut w.records, &mut w.node_events);
    let counted = rev.failed_nodes.iter().filter(|f| !f.quarantined).count();
    if !complete && counted >= rev.policy.max_failures as usize {
        Fate::Failed(FailCause::MaxFailures)
    } else {
        Fate::Target
    }
}

/// Failures of `rev` not on record yet: its agent reported `Invalid` for this attempt of the config
/// its spec holds (revision, retry and, when reported, config hash), or it is not updated and past its
/// [`deadline`](super::super::deadline): its agent did not start this attempt within
/// `pickupTimeoutSeconds` of the assignment, or did not finish it within `applyTimeoutSeconds` of
/// starting.
///
/// A verdict counts only for what the node was given (#48). An `Invalid` for this attempt of `rev`
/// from a node whose spec names another revision is a protocol violation ([`violation`]): recorded,
/// never counted, and the node is not given `rev` (a lying agent could otherwise veto every revision
/// by reporting on it before it is assigned). A report on an older config of the node (a hash or
/// retry its spec no longer holds) is just stale: the agent has not picked up its new spec yet.
fn detect_failures(
    nodes: &[Node],
    assigned: &[usize],
    rev: &Rev,
    now: Timestamp,
) -> Vec<FailedNode> {
    let name = rev.name();
    let retry = rev.state.retry;
    let known: BTreeSet<&str> = rev.failed_nodes.iter().map(|f| f.node.as_str()).collect();
    let mut out = Vec::new();
    for &i in assigned {
        let n = &nodes[i];
        let (Some(spec), st) = (n.spec, n.status) else {
            continue;
        };
        // Most nodes run what they were given: their agent reports it provisioned, which is no
        // failure of any revision (and the report is not read again: #28).
        if n.updated_spec {
            continue;
        }
        let name_str = n.name().as_str();
        if known.contains(name_str) || out.iter().any(|f: &FailedNode| f.node == name_str) {
            continue;
        }
        // A spec the agent refused as tampered says nothing about the revision: the configurator puts
        // the spec back, and the apply timeout still catches a node that never gets it.
        let tampered = st.reason.as_deref() == Some(netwave_api::REASON_CONFIG_TAMPERED);
        let verdict = st.phase == Some(AgentPhase::Invalid)
            && !tampered
            && st.observed_revision.as_ref() == Some(name)
            && st.observed_retry == Some(retry);
        let given = spec.revision == name && spec.retry == retry;
        if verdict
            && given
            && st
                .observed_config_hash
                .as_ref()
                .is_none_or(|h| h == spec.hash)
        {
            out.push(FailedNode {
                node: n.name().to_string(),
                reason: st
                    .reason
                    .clone()
                    .unwrap_or_else(|| AgentPhase::Invalid.as_str().to_string()),
                message: st.message.clone().unwrap_or_default(),
                at: Some(now.to_time()),
                quarantined: false,
            });
        } else if verdict && spec.revision != name {
            out.push(violation(
                n.name().as_str(),
                name,
                retry,
                spec.revision,
                now,
            ));
        } else if given
            && !n.updated(name)
            && let Some((attempt, deadline)) = n.deadline(&rev.policy)
            && now >= deadline.at()
        {
            let (reason, message) = deadline.failure(&attempt);
            out.push(FailedNode {
                node: n.name().to_string(),
                reason: reason.to_string(),
                message,
                at: Some(now.to_time()),
                quarantined: false,
            });
        }
    }
    out
}

/// The record of `node`'s agent reporting `Invalid` for `revision` (this `retry`) while its spec
/// names `runs`: flagged so it never counts against `maxFailures`, and the node is not given
/// `revision` (as any node on its failed list).
fn violation(node: &str, revision: &str, retry: u32, runs: &str, now: Timestamp) -> FailedNode {
    FailedNode {
        node: node.to_string(),
        reason: REASON_PROTOCOL_VIOLATION.to_string(),
        message: format!(
            "its agent reported Invalid for {revision} (retry {retry}), which it was not given (its \
             spec names {runs}): the verdict is ignored, and the node keeps what it runs and is not \
             given {revision}"
        ),
        at: Some(now.to_time()),
        quarantined: true,
    }
}
