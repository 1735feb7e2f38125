//! Stage 1: who is there. Nodes joined with their configs (and the specs earlier rounds wrote), and
//! the configs of nodes that left (DESIGN.md §3: a node that leaves is forgotten, never a failure).

use std::collections::BTreeMap;

use super::super::input::{NodeConfigState, NodeState, RolloutInput};
use super::super::world::{
    Intents, NO_RECORD, NO_REPORT, Node, Overlay, Spec, World, in_flight_of,
};
use crate::sym::Sym;
use crate::types::Timestamp;

/// The world as observed: every node with its spec and report, the orphaned configs, and nodes by the
/// revision they name.
pub(super) fn observe_fleet<'a>(
    input: &'a RolloutInput,
    overlay: &'a Overlay,
    now: Timestamp,
) -> World<'a> {
    let mut w = World::new(input, now);
    let node_states = by_name(input.nodes.iter().map(AsRef::as_ref), |n: &NodeState| {
        &n.name
    });
    let configs = by_name(
        input.configs.iter().map(AsRef::as_ref),
        |c: &NodeConfigState| &c.name,
    );

    let mut matched = vec![false; configs.len()];
    let mut ci = 0;
    w.nodes.reserve(node_states.len());
    for state in node_states {
        // A merge join: both lists are sorted by name.
        while ci < configs.len() && configs[ci].name < state.name {
            ci += 1;
        }
        let cfg = (ci < configs.len() && configs[ci].name == state.name).then(|| {
            matched[ci] = true;
            configs[ci]
        });
        let unreadable = !input.unreadable_configs.is_empty()
            && input.unreadable_configs.contains(state.name.as_str());
        w.nodes.push(node_of(state, cfg, overlay, unreadable));
    }
    // Configs of nodes that left (and were not deleted by an earlier round).
    w.orphans = configs
        .iter()
        .zip(&matched)
        .filter(|(c, matched)| !**matched && !matches!(overlay.specs.get(&c.name), Some(None)))
        .map(|(c, _)| c.name.to_string())
        .collect();
    w.by_revision = by_revision(&w.nodes);
    w.intents = Intents::new(w.nodes.len());
    w
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
        assigned: false,
        failed_target: false,
    }
}

/// Sorted by name, one per name (the first). Sorting is stable and adaptive, and inputs that arrive
/// sorted and unique (the configurator's are) are only checked: O(n) comparisons.
fn by_name<'a, T>(items: impl Iterator<Item = &'a T>, name: impl Fn(&T) -> &Sym) -> Vec<&'a T> {
    let mut v: Vec<&T> = items.collect();
    if !v.is_sorted_by(|a, b| name(a) < name(b)) {
        v.sort_by(|a, b| name(a).cmp(name(b)));
        v.dedup_by(|a, b| name(a) == name(b));
    }
    v
}

fn by_revision<'a>(nodes: &[Node<'a>]) -> BTreeMap<&'a Sym, Vec<usize>> {
    let mut by_revision: BTreeMap<&Sym, Vec<usize>> = BTreeMap::new();
    // Neighbours mostly name the same revision: the last one's list is kept at hand.
    let mut last: Option<(&Sym, Vec<usize>)> = None;
    for (i, n) in nodes.iter().enumerate() {
        if let Some(s) = n.spec {
            match &mut last {
                Some((r, list)) if *r == s.revision => list.push(i),
                _ => {
                    if let Some((r, list)) = last.take() {
                        by_revision.entry(r).or_default().extend(list);
                    }
                    let mut list = by_revision.remove(s.revision).unwrap_or_default();
                    list.push(i);
                    last = Some((s.revision, list));
                }
            }
        }
        // Nodes whose agent reports on a revision other than its spec: an `Invalid` report about R is a
        // failure of R even after the spec moved on (the agent will not apply R again at this retry).
        if let Some(obs) = n.status.observed_revision.as_ref()
            && n.spec.is_some_and(|s| s.revision != obs)
        {
            match &mut last {
                Some((r, list)) if *r == obs => list.push(i),
                _ => by_revision.entry(obs).or_default().push(i),
            }
        }
    }
    if let Some((r, list)) = last {
        by_revision.entry(r).or_default().extend(list);
    }
    by_revision
}
