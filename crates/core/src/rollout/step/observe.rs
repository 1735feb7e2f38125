//! Stage 1: who is there. Nodes joined with their configs (and the specs earlier rounds wrote), and
//! the configs of nodes that left (DESIGN.md §3: a node that leaves is forgotten, never a failure).

use std::collections::BTreeMap;

use super::super::input::{NodeConfigState, NodeState, RolloutInput};
use super::super::world::{
    Intents, NO_RECORD, NO_REPORT, Node, Overlay, Spec, World, in_flight_of,
};
use crate::types::Timestamp;

/// The world as observed: every node with its spec and report, the orphaned configs, and nodes by the
/// revision they name.
pub(super) fn observe_fleet<'a>(
    input: &'a RolloutInput,
    overlay: &'a Overlay,
    now: Timestamp,
) -> World<'a> {
    let mut w = World::new(input, now);
    // Sorting is stable and adaptive: inputs that arrive sorted (watch caches usually are) cost O(n).
    let mut node_states: Vec<&NodeState> = input.nodes.iter().map(AsRef::as_ref).collect();
    node_states.sort_by(|a, b| a.name.cmp(&b.name));
    node_states.dedup_by(|a, b| a.name == b.name);
    let mut configs: Vec<&NodeConfigState> = input.configs.iter().map(AsRef::as_ref).collect();
    configs.sort_by(|a, b| a.name.cmp(&b.name));
    configs.dedup_by(|a, b| a.name == b.name);

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
        let unreadable = input.unreadable_configs.contains(&state.name);
        w.nodes.push(node_of(state, cfg, overlay, unreadable));
    }
    // Configs of nodes that left (and were not deleted by an earlier round).
    w.orphans = configs
        .iter()
        .zip(&matched)
        .filter(|(c, matched)| !**matched && !matches!(overlay.specs.get(&c.name), Some(None)))
        .map(|(c, _)| c.name.clone())
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
        revision: s.revision.as_str(),
        retry: s.retry,
        hash: s.config_hash.as_str(),
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

fn by_revision<'a>(nodes: &[Node<'a>]) -> BTreeMap<&'a str, Vec<usize>> {
    let mut by_revision: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, n) in nodes.iter().enumerate() {
        if let Some(s) = n.spec {
            by_revision.entry(s.revision).or_default().push(i);
        }
        // Nodes whose agent reports on a revision other than its spec: an `Invalid` report about R is a
        // failure of R even after the spec moved on (the agent will not apply R again at this retry).
        if let Some(obs) = n.status.observed_revision.as_deref()
            && n.spec.is_some_and(|s| s.revision != obs)
        {
            by_revision.entry(obs).or_default().push(i);
        }
    }
    by_revision
}
