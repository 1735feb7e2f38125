//! Stage 3: rollout order and budgets (DESIGN.md §3 **Order**, **Budget**).
//!
//! The policy that governs both is the target's, else the newest revision's (a fleet with only failed
//! revisions still rolls back under a budget), else the defaults.

use super::super::policy::Policy;
use super::super::world::{Budgets, Hashes, Node, World};
use super::memo::StepMemo;

/// Sorts nodes into failure domains, fixes the rollout order, counts what is in flight against the
/// budgets, and looks up the rendered hashes the assignments may use. The domains, the order and the
/// hashes come from the memo ([`super::memo`]).
pub(super) fn order_and_budgets<'a>(w: &mut World<'a>, memo: &'a StepMemo) {
    let defaults = w.input.defaults.policy();
    let governing = w
        .target
        .or(if w.revs.is_empty() { None } else { Some(0) })
        .map_or(&defaults, |i| &w.revs[i].policy);
    let (domain_names, domains, order) = memo.layout(governing.topology_key.as_deref());
    if let Some(domains) = domains {
        for (n, &d) in w.nodes.iter_mut().zip(domains) {
            n.domain = d;
        }
    }
    w.order = order;
    // Quarantine on: a node that failed the latest revisions goes after every other node, so a revision
    // meets a healthy node first (and halts there if it is bad) and the suspect's failure has evidence.
    if governing.quarantine_after.is_some() {
        let (mut order, last): (Vec<usize>, Vec<usize>) =
            w.order.iter().partition(|&&i| !w.nodes[i].suspect);
        order.extend(last);
        w.order = order;
    }
    let domain_names = domain_names.iter().map(String::as_str).collect();
    w.budgets = budgets(&w.nodes, governing, domain_names);

    // Rendered hashes of the target and the last good revision per node (the only ones assigned).
    let rendered = |rev: Option<usize>| {
        rev.and_then(|r| w.input.rendered.revision(w.revs[r].name()))
            .map(|m| memo.hashes(m))
    };
    w.hashes = Hashes {
        target: w.target,
        last_good: w.last_good,
        of_target: rendered(w.target),
        of_last_good: rendered(w.last_good),
    };
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
