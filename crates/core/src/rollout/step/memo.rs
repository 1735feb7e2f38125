//! What a step works out about the fleet that the next step over the same fleet can take as it is
//! (#28). A live leader steps about 50 times a second at 5,000 nodes, and between two steps three or
//! four node configs change. Sorting and joining the nodes with their configs, reading each node's
//! failure domain label and joining each node with its rendered hashes were two thirds of a step.
//!
//! [`StepMemo`] keeps them from the last step:
//! - the nodes and the configs sorted by name, which config is whose, which have no node;
//! - what the stages read of each node and config at every pass (its spec, whether it is in flight
//!   or updated, what its agent reports on), side by side;
//! - per topology key the revisions name: each node's failure domain, the domain names and the
//!   round-robin order over them;
//! - per rendering in the input: each node's hash.
//!
//! Nothing in it is taken on trust. Before a step uses it, [`StepMemo::refresh`] checks it against the
//! input:
//! - the input lists the same names at the same places (one pointer comparison per name with the
//!   configurator's interned names), else the fleet is sorted and joined afresh;
//! - a node or config that is not the very object seen last time is read again (a domain label that
//!   moved lays the fleet out afresh);
//! - a rendering that is not the very map joined last time is joined afresh.
//!
//! So a step with a memo plans what a step with a new one plans: the simulator checks it after every
//! step, and a property test edits worlds under a kept memo.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::super::input::{AgentReport, NodeConfigState, NodeState, RolloutInput};
use super::super::world::{in_flight_of, updated_of};
use crate::sym::Sym;
use crate::types::Timestamp;

/// What the last step over a fleet worked out about it; see the module docs. `Default` is a memo
/// that knows nothing (every step then works everything out, as [`step`](super::step) does).
#[derive(Clone, Default)]
pub struct StepMemo {
    /// Every node, sorted by name, one per name (the first listed).
    pub(super) nodes: Vec<Arc<NodeState>>,
    /// Per node: Ready and not cordoned.
    pub(super) eligible: Vec<bool>,
    /// Every config, sorted by name, one per name.
    pub(super) configs: Vec<Arc<NodeConfigState>>,
    /// Per config: what the stages read of it.
    pub(super) facts: Vec<ConfigRow>,
    /// Per node: its config, as an index into `configs`.
    pub(super) config_of: Vec<Option<usize>>,
    /// Configs of no node (nodes that left), as indices into `configs`.
    pub(super) orphans: Vec<usize>,
    layouts: Vec<Layout>,
    rendered: Vec<RenderedJoin>,
}

/// What the stages read of a config at every step, worked out once per change of the config and kept
/// side by side: reading each of 5,000 configs where it lies costs cache misses at every pass.
#[derive(Clone)]
pub(super) struct ConfigRow {
    pub revision: Sym,
    pub retry: u32,
    pub hash: Sym,
    pub assigned_at: Option<Timestamp>,
    /// [`in_flight_of`] its spec.
    pub in_flight: bool,
    /// [`updated_of`] its spec's revision.
    pub updated: bool,
    pub quarantined: bool,
    /// The agent's report, copied here: the passes over every node read it (#28).
    pub status: AgentReport,
}

impl ConfigRow {
    fn of(c: &NodeConfigState) -> ConfigRow {
        let (spec, st) = (&c.spec, &c.status);
        ConfigRow {
            revision: spec.revision.clone(),
            retry: spec.retry,
            hash: spec.config_hash.clone(),
            assigned_at: spec.assigned_at,
            in_flight: in_flight_of(&spec.revision, spec.retry, &spec.config_hash, st),
            updated: updated_of(&spec.revision, &spec.config_hash, st, &spec.revision),
            quarantined: c.record.is_quarantined(),
            status: st.clone(),
        }
    }
}

/// The failure domains of the fleet under one topology key.
#[derive(Clone)]
pub(super) struct Layout {
    key: String,
    /// Domain names, sorted (a node without the label is in the domain `""`).
    pub names: Vec<String>,
    /// Per node: index into `names`.
    pub domain: Vec<usize>,
    /// Rollout order: domains round-robin, by node name within a domain.
    pub order: Vec<usize>,
}

/// One rendering joined with the nodes.
#[derive(Clone)]
struct RenderedJoin {
    map: Arc<BTreeMap<Sym, Sym>>,
    /// Per node: its hash in `map`.
    hashes: Vec<Option<Sym>>,
}

/// The domain of the nodes without a topology key.
static UNNAMED: [String; 1] = [String::new()];

impl StepMemo {
    /// Brings the memo up to `input`: keeps what still holds, works out the rest (module docs).
    pub(super) fn refresh(&mut self, input: &RolloutInput) {
        let nodes_kept = same_names(&self.nodes, &input.nodes, |n| &n.name);
        let configs_kept = same_names(&self.configs, &input.configs, |c| &c.name);
        // Nodes whose object is not the one the layouts were read from.
        let mut changed = Vec::new();
        if nodes_kept {
            for (i, (kept, now)) in self.nodes.iter_mut().zip(input.nodes.iter()).enumerate() {
                if !Arc::ptr_eq(kept, now) {
                    *kept = Arc::clone(now);
                    self.eligible[i] = now.eligible();
                    changed.push(i);
                }
            }
        } else {
            self.nodes = by_name(&input.nodes, |n| &n.name);
            self.eligible = self.nodes.iter().map(|n| n.eligible()).collect();
            self.layouts.clear();
            self.rendered.clear();
        }
        if configs_kept {
            for (i, (kept, now)) in self
                .configs
                .iter_mut()
                .zip(input.configs.iter())
                .enumerate()
            {
                if !Arc::ptr_eq(kept, now) {
                    *kept = Arc::clone(now);
                    self.facts[i] = ConfigRow::of(now);
                }
            }
        } else {
            self.merge_configs(&input.configs);
        }
        if !(nodes_kept && configs_kept) {
            self.join();
        }
        self.refresh_layouts(input, &changed);
        self.refresh_rendered(input);
    }

    /// Configs came or went (a first rollout creates them as it goes): a merge by name of the input's
    /// list with the memo's keeps every config that is the very object seen last time, with its
    /// facts, and works out the facts of the others.
    fn merge_configs(&mut self, input: &[Arc<NodeConfigState>]) {
        let sorted;
        let input = if input.is_sorted_by(|a, b| a.name < b.name) {
            input
        } else {
            sorted = by_name(input, |c| &c.name);
            &sorted[..]
        };
        let configs = std::mem::take(&mut self.configs);
        let mut kept = configs
            .into_iter()
            .zip(std::mem::take(&mut self.facts))
            .peekable();
        (self.configs, self.facts) = (input.iter())
            .map(|c| {
                // Most configs are the very object seen last time, next in line: taken without
                // comparing names (a first rollout adds a few configs to 5,000 at every step).
                if let Some(same) = kept.next_if(|(k, _)| Arc::ptr_eq(k, c)) {
                    return same;
                }
                while kept.next_if(|(k, _)| k.name < c.name).is_some() {}
                kept.next_if(|(k, _)| Arc::ptr_eq(k, c))
                    .unwrap_or_else(|| (Arc::clone(c), ConfigRow::of(c)))
            })
            .unzip();
    }

    /// A merge join of the nodes with their configs (both sorted by name).
    fn join(&mut self) {
        let mut matched = vec![false; self.configs.len()];
        let mut ci = 0;
        self.config_of = self
            .nodes
            .iter()
            .map(|n| {
                // Names of one interner are equal only as the same copy: most nodes have the next
                // config, found without comparing texts.
                while ci < self.configs.len()
                    && !self.configs[ci].name.same(&n.name)
                    && self.configs[ci].name < n.name
                {
                    ci += 1;
                }
                (ci < self.configs.len() && self.configs[ci].name == n.name).then(|| {
                    matched[ci] = true;
                    ci
                })
            })
            .collect();
        self.orphans = (0..self.configs.len()).filter(|&c| !matched[c]).collect();
    }

    /// Keeps the layouts of the topology keys the revisions still name whose nodes kept their labels,
    /// and lays out the fleet under every other key they name.
    fn refresh_layouts(&mut self, input: &RolloutInput, changed: &[usize]) {
        let keys: BTreeSet<&str> = (input.revisions.iter())
            .filter_map(|r| r.policy.topology_key.as_deref())
            .filter(|k| !k.is_empty())
            .collect();
        let nodes = &self.nodes;
        self.layouts.retain(|l| {
            keys.contains(l.key.as_str())
                && changed
                    .iter()
                    .all(|&i| label(&nodes[i], &l.key) == l.names[l.domain[i]])
        });
        for key in keys {
            if !self.layouts.iter().any(|l| l.key == key) {
                self.layouts.push(Layout::of(nodes, key));
            }
        }
    }

    /// Keeps the joins of the renderings the input still holds (the very same maps), and joins the
    /// others.
    fn refresh_rendered(&mut self, input: &RolloutInput) {
        let maps: Vec<&Arc<BTreeMap<Sym, Sym>>> = input.rendered.maps().collect();
        self.rendered
            .retain(|r| maps.iter().any(|m| Arc::ptr_eq(m, &r.map)));
        for map in maps {
            if !self.rendered.iter().any(|r| Arc::ptr_eq(map, &r.map)) {
                let hashes = join_by_name(self.nodes.iter().map(|n| &n.name), map);
                self.rendered.push(RenderedJoin {
                    map: Arc::clone(map),
                    hashes,
                });
            }
        }
    }

    /// The domain names, each node's domain (`None`: all in the one domain) and the rollout order
    /// under `key`.
    pub(super) fn layout(&self, key: Option<&str>) -> (&[String], Option<&[usize]>, Vec<usize>) {
        let Some(key) = key else {
            return (&UNNAMED, None, (0..self.nodes.len()).collect());
        };
        let l = (self.layouts.iter())
            .find(|l| l.key == key)
            .expect("refresh lays out every topology key the revisions name");
        (&l.names, Some(&l.domain), l.order.clone())
    }

    /// Each node's hash in `map` (one of the input's renderings).
    pub(super) fn hashes(&self, map: &Arc<BTreeMap<Sym, Sym>>) -> &[Option<Sym>] {
        let r = (self.rendered.iter())
            .find(|r| Arc::ptr_eq(&r.map, map))
            .expect("refresh joins every rendering of the input");
        &r.hashes
    }
}

impl Layout {
    /// Each node's failure domain (its `key` label) and the round-robin order. One label lookup per
    /// node; the few distinct names are found by hash and sorted once.
    fn of(nodes: &[Arc<NodeState>], key: &str) -> Layout {
        let mut seen: HashMap<&str, usize> = HashMap::new();
        let mut domain: Vec<usize> = nodes
            .iter()
            .map(|n| {
                let next = seen.len();
                *seen.entry(label(n, key)).or_insert(next)
            })
            .collect();
        let mut names: Vec<(&str, usize)> = seen.into_iter().collect();
        names.sort_unstable();
        // Seen order → sorted order.
        let mut rank = vec![0; names.len()];
        for (sorted, &(_, first_seen)) in names.iter().enumerate() {
            rank[first_seen] = sorted;
        }
        for d in &mut domain {
            *d = rank[*d];
        }
        Layout {
            key: key.to_string(),
            order: round_robin(&domain, names.len()),
            names: names.into_iter().map(|(n, _)| n.to_string()).collect(),
            domain,
        }
    }
}

/// A node's failure domain under `key`: its label, `""` without one.
fn label<'a>(node: &'a NodeState, key: &str) -> &'a str {
    node.labels.get(key).map_or("", String::as_str)
}

/// Round-robin over domains (sorted by name), by node name within a domain.
fn round_robin(domain: &[usize], domains: usize) -> Vec<usize> {
    let mut per_domain: Vec<Vec<usize>> = vec![Vec::new(); domains];
    for (i, &d) in domain.iter().enumerate() {
        per_domain[d].push(i);
    }
    let longest = per_domain.iter().map(Vec::len).max().unwrap_or(0);
    let mut order: Vec<usize> = Vec::with_capacity(domain.len());
    for round in 0..longest {
        for d in &per_domain {
            if let Some(&i) = d.get(round) {
                order.push(i);
            }
        }
    }
    order
}

/// `kept` and `now` list the same names in the same order.
fn same_names<T>(kept: &[Arc<T>], now: &[Arc<T>], name: impl Fn(&T) -> &Sym) -> bool {
    kept.len() == now.len() && kept.iter().zip(now).all(|(k, n)| name(k) == name(n))
}

/// Sorted by name, one per name (the first). Sorting is stable and adaptive, and inputs that arrive
/// sorted and unique (the configurator's are) are only checked: O(n) comparisons.
fn by_name<T>(items: &[Arc<T>], name: impl Fn(&T) -> &Sym) -> Vec<Arc<T>> {
    let mut v = items.to_vec();
    if !v.is_sorted_by(|a, b| name(a) < name(b)) {
        v.sort_by(|a, b| name(a).cmp(name(b)));
        v.dedup_by(|a, b| name(a) == name(b));
    }
    v
}

/// Joins a map keyed by node name with the nodes (both sorted by name): O(n), no per-node lookups.
fn join_by_name<'a>(
    names: impl Iterator<Item = &'a Sym>,
    map: &BTreeMap<Sym, Sym>,
) -> Vec<Option<Sym>> {
    let mut it = map.iter().peekable();
    names
        .map(|name| {
            while it.peek().is_some_and(|(k, _)| *k < name) {
                it.next();
            }
            match it.peek() {
                Some((k, v)) if *k == name => Some((*v).clone()),
                _ => None,
            }
        })
        .collect()
}
