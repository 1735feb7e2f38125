//! Stage 1: who is there. Nodes joined with their configs (and the specs earlier rounds wrote), and
//! the configs of nodes that left (DESIGN.md §3: a node that leaves is forgotten, never a failure).

use std::collections::BTreeMap;

use super::super::input::{NodeConfigState, NodeState, RolloutInput};
use super::super::world::{
    Intents, NO_RECORD, NO_REPORT, Node, Overlay, Spec, World, in_flight_of, updated_of,
};
use super::memo::{ConfigRow, StepMemo};
use crate::sym::Sym;
use crate::types::Timestamp;

/// The world as observed: every node with its spec and report, the orphaned configs, and nodes by the
/// revision they name. The nodes and configs come sorted and joined from the memo.
pub(super) fn observe_fleet<'a>(
    input: &'a RolloutInput,
    memo: &'a StepMemo,
    overlay: &'a Overlay,
    now: Timestamp,
) -> World<'a> {
    let mut w = World::new(input, now);
    w.nodes = (memo.nodes.iter().zip(&memo.config_of).zip(&memo.eligible))
        .map(|((state, cfg), &eligible)| {
            let unreadable = !input.unreadable_configs.is_empty()
                && input.unreadable_configs.contains(state.name.as_str());
            let overlaid = (!overlay.specs.is_empty() && overlay.specs.contains_key(&state.name))
                || (!overlay.records.is_empty() && overlay.records.contains_key(&state.name));
            match cfg {
                Some(c) if !unreadable && !overlaid => {
                    on_record(state, &memo.configs[*c], &memo.facts[*c], eligible)
                }
                _ => node_of(state, cfg.map(|c| &*memo.configs[c]), overlay, unreadable),
            }
        })
        .collect();
    // Configs of nodes that left (and were not deleted by an earlier round).
    w.orphans = (memo.orphans.iter())
        .map(|&c| &memo.configs[c].name)
        .filter(|name| !matches!(overlay.specs.get(*name), Some(None)))
        .map(ToString::to_string)
        .collect();
    w.by_revision = by_revision(&w.nodes);
    w.intents = Intents::new(w.nodes.len());
    w
}

/// A node as its config stands (no earlier round wrote about it, and its config can be read): what
/// [`node_of`] works out, from the facts the memo keeps.
fn on_record<'a>(
    state: &'a NodeState,
    cfg: &'a NodeConfigState,
    f: &'a ConfigRow,
    eligible: bool,
) -> Node<'a> {
    Node {
        state,
        has_config: true,
        status: &f.status,
        eligible: eligible && !f.quarantined,
        unreadable: false,
        record: &cfg.record,
        quarantined: f.quarantined,
        suspect: false,
        domain: 0,
        spec: Some(Spec {
            revision: &f.revision,
            retry: f.retry,
            hash: &f.hash,
            assigned_at: f.assigned_at,
        }),
        in_flight: f.in_flight,
        updated_spec: f.updated,
        assigned: false,
        failed_target: false,
    }
}

/// One node: the spec an earlier round wrote wins over the one in the input. A node whose config
/// cannot be read has no known spec or report and is not eligible: nothing is decided about it.
fn node_of<'a>(
    state: &'a NodeState,
    cfg: Option<&'a NodeConfigState>,
    overlay: &'a Overlay,
    unreadable: bool,
) -> Node<'a> {
    let over = if overlay.specs.is_empty() {
        None
    } else {
        overlay.specs.get(&state.name)
    };
    let (spec, status) = match over {
        _ if unreadable => (None, &NO_REPORT),
        Some(None) => (None, &NO_REPORT),
        Some(Some(s)) => (Some(s), cfg.map_or(&NO_REPORT, |c| &c.status)),
        None => (cfg.map(|c| &c.spec), cfg.map_or(&NO_REPORT, |c| &c.status)),
    };
    // A node's record lives on its config: one without a config (or unreadable) has none.
    let record = match (overlay.records.get(&state.name), cfg) {
        _ if unreadable || spec.is_none() => &NO_RECORD,
        (Some(r), _) => r,
        (None, Some(c)) => &c.record,
        (None, None) => &NO_RECORD,
    };
    let quarantined = record.is_quarantined();
    let spec = spec.map(|s| Spec {
        revision: &s.revision,
        retry: s.retry,
        hash: &s.config_hash,
        assigned_at: s.assigned_at,
    });
    Node {
        state,
        has_config: spec.is_some(),
        status,
        eligible: state.eligible() && !unreadable && !quarantined,
        unreadable,
        record,
        quarantined,
        suspect: false,
        domain: 0,
        spec,
        in_flight: spec.is_some_and(|s| in_flight_of(s.revision, s.retry, s.hash, status)),
        updated_spec: spec.is_some_and(|s| updated_of(s.revision, s.hash, status, s.revision)),
        assigned: false,
        failed_target: false,
    }
}

fn by_revision<'a>(nodes: &[Node<'a>]) -> BTreeMap<&'a Sym, Vec<usize>> {
    // A fleet names a few revisions: a short list, the one named last looked at first, costs less than
    // a map lookup per node (mid-rollout, neighbours alternate between two revisions).
    let mut lists: Vec<(&'a Sym, Vec<usize>)> = Vec::new();
    let mut last = 0;
    let mut push = |rev: &'a Sym, i: usize| {
        if lists.get(last).is_none_or(|(r, _)| *r != rev) {
            last = match lists.iter().position(|(r, _)| *r == rev) {
                Some(at) => at,
                None => {
                    lists.push((rev, Vec::new()));
                    lists.len() - 1
                }
            };
        }
        lists[last].1.push(i);
    };
    for (i, n) in nodes.iter().enumerate() {
        if let Some(s) = n.spec {
            push(s.revision, i);
        }
        // Nodes whose agent reports on a revision other than its spec: an `Invalid` report about R is a
        // failure of R even after the spec moved on (the agent will not apply R again at this retry).
        if let Some(obs) = n.status.observed_revision.as_ref()
            && n.spec.is_some_and(|s| s.revision != obs)
        {
            push(obs, i);
        }
    }
    lists.into_iter().collect()
}
