//! Stage 3: rollout order and budgets (DESIGN.md §3 **Order**, **Budget**).
//!
//! The policy that governs both is the target's, else the newest revision's (a fleet with only failed
//! revisions still rolls back under a budget), else the defaults.

use std::collections::{BTreeMap, HashMap};

use super::super::policy::Policy;
use super::super::world::{Budgets, Hashes, Node, World};
use crate::sym::Sym;

/// Sorts nodes into failure domains, fixes the rollout order, counts what is in flight against the
/// budgets, and looks up the rendered hashes the assignments may use.
pub(super) fn order_and_budgets(w: &mut World) {
    let defaults = w.input.defaults.policy();
    let governing = w
        .target
        .or(if w.revs.is_empty() { None } else { Some(0) })
        .map_or(&defaults, |i| &w.revs[i].policy);
    let domain_names = assign_domains(&mut w.nodes, governing.topology_key.as_deref());
    w.order = round_robin(&w.nodes, domain_names.len());
    // Quarantine on: a node that failed the latest revisions goes after every other node, so a revision
    // meets a healthy node first (and halts there if it is bad) and the suspect's failure has evidence.
    if governing.quarantine_after.is_some() {
        let (mut order, last): (Vec<usize>, Vec<usize>) =
            w.order.iter().partition(|&&i| !w.nodes[i].suspect);
        order.extend(last);
        w.order = order;
    }
    w.budgets = budgets(&w.nodes, governing, domain_names);

    // Rendered hashes of the target and the last good revision per node (the only ones assigned).
    let names = || w.nodes.iter().map(|n| n.name());
    let rendered = |rev: Option<usize>| {
        rev.and_then(|r| w.input.rendered.revision(w.revs[r].name()).map(|m| &**m))
    };
    w.hashes = Hashes {
        target: w.target,
        last_good: w.last_good,
        of_target: join_by_name(names(), rendered(w.target)),
        of_last_good: join_by_name(names(), rendered(w.last_good)),
    };
}

/// Sets each node's failure domain (its `topologyKey` label; no label is the domain `""`) and returns
/// the domain names, sorted. One label lookup per node; the few distinct names are found by hash and
/// sorted once (sorting the fleet's names was most of this stage at 5,000 nodes, #28).
fn assign_domains<'a>(nodes: &mut [Node<'a>], topology_key: Option<&str>) -> Vec<&'a str> {
    let Some(key) = topology_key else {
        return vec![""];
    };
    let mut seen: HashMap<&'a str, usize> = HashMap::new();
    for n in nodes.iter_mut() {
        let name = n.state.labels.get(key).map_or("", String::as_str);
        let next = seen.len();
        n.domain = *seen.entry(name).or_insert(next);
    }
    let mut names: Vec<(&'a str, usize)> = seen.into_iter().collect();
    names.sort_unstable();
    // Seen order → sorted order.
    let mut rank = vec![0; names.len()];
    for (sorted, &(_, first_seen)) in names.iter().enumerate() {
        rank[first_seen] = sorted;
    }
    for n in nodes.iter_mut() {
        n.domain = rank[n.domain];
    }
    names.into_iter().map(|(name, _)| name).collect()
}

/// Round-robin over domains (sorted by name), by node name within a domain.
fn round_robin(nodes: &[Node], domains: usize) -> Vec<usize> {
    let mut per_domain: Vec<Vec<usize>> = vec![Vec::new(); domains];
    for (i, n) in nodes.iter().enumerate() {
        per_domain[n.domain].push(i);
    }
    let longest = per_domain.iter().map(Vec::len).max().unwrap_or(0);
    let mut order: Vec<usize> = Vec::with_capacity(nodes.len());
    for round in 0..longest {
        for d in &per_domain {
            if let Some(&i) = d.get(round) {
                order.push(i);
            }
        }
    }
    order
}

/// `maxUnavailable` of the eligible nodes (and per domain of the domain's eligible nodes), and what is
/// in flight now: every in-flight node counts, eligible or not (a node we cannot see may be one we
/// broke).
fn budgets<'a>(nodes: &[Node], policy: &Policy, domain_names: Vec<&'a str>) -> Budgets<'a> {
    let domains = domain_names.len();
    let mut domain_eligible = vec![0usize; domains];
    let mut domain_in_flight = vec![0u32; domains];
    let mut eligible = 0;
    let mut in_flight = 0u32;
    for n in nodes {
        if n.eligible {
            eligible += 1;
            domain_eligible[n.domain] += 1;
        }
        if n.in_flight {
            in_flight += 1;
            domain_in_flight[n.domain] += 1;
        }
    }
    Budgets {
        total: policy.max_unavailable.of(eligible),
        in_flight,
        domain_names,
        domain_budget: domain_eligible
            .iter()
            .map(|&e| policy.max_unavailable_per_domain.map(|b| b.of(e)))
            .collect(),
        domain_in_flight,
    }
}

/// Joins a map keyed by node name with the nodes (both sorted by name): O(n), no per-node lookups.
fn join_by_name<'a, V>(
    names: impl Iterator<Item = &'a Sym>,
    map: Option<&'a BTreeMap<Sym, V>>,
) -> Vec<Option<&'a V>> {
    let mut it = map.map(|m| m.iter().peekable());
    names
        .map(|name| {
            let it = it.as_mut()?;
            while it.peek().is_some_and(|(k, _)| *k < name) {
                it.next();
            }
            match it.peek() {
                Some((k, v)) if *k == name => Some(*v),
                _ => None,
            }
        })
        .collect()
}
