//! Each Node's and NodeNetworkConfig's state as the rollout step reads it, kept between reconciles
//! (#28). The watch stores hand out the same `Arc` for an object until it changes, so a reconcile
//! converts only the objects that changed since the last one: after one agent report, one config —
//! not the fleet. At 2,000 nodes the conversions were half of a reconcile's compute.
//!
//! The cache holds each object it converted, so an address it remembers cannot be reused by another
//! object while the entry lives; entries of objects no longer in the store go at the end of the pass
//! that no longer saw them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::Resource;
use netwave_api::NodeNetworkConfig;
use netwave_api::features::FeatureSet;
use netwave_core::render::NodeInfo;
use netwave_core::rollout::quarantine::{self, NodeRecord};
use netwave_core::rollout::{NodeConfigState, NodeState};
use netwave_core::{Interner, Sym, Timestamp};
use tracing::warn;

use crate::snapshot::{Snapshot, find_sorted, live};

/// What the leader keeps of the nodes and their configs between reconciles.
#[derive(Default)]
pub struct Observed {
    nodes: Kept<Node, NodeShare>,
    configs: Kept<NodeNetworkConfig, ConfigFacts>,
    /// The last answers: given again while no object changed; the configs' kept up to date in place.
    last_nodes: Option<Nodes>,
    last_configs: Arc<Vec<Arc<NodeConfigState>>>,
    /// Kept up to date as objects come and go, so no pass over the fleet needs them:
    /// live nodes without a config that holds an assignment (they get placeholders);
    bare: BTreeSet<String>,
    /// names that have such a config;
    assigned: BTreeSet<String>,
    /// placeholder configs by name;
    placeholders: BTreeMap<String, Arc<NodeNetworkConfig>>,
    /// live configs whose stored record says quarantined;
    quarantined: usize,
    /// live configs whose `Quarantined` condition differs from what their stored record asks for;
    condition_fixes: BTreeSet<String>,
    /// node configs' states that came or changed, and names that went, since [`Observed::changes`].
    changes: ConfigChanges,
    /// names whose node or config came, went or changed since [`Observed::placeholder_work`];
    touched: BTreeSet<String>,
    /// what placeholders must say, as [`Observed::placeholder_work`] was last asked;
    placeholder_words: Option<[Option<String>; 2]>,
    /// and the placeholder writes that leaves, kept up to date from `touched`.
    placeholder_work: Work,
    /// One copy of each name and hash the step compares ([`Sym`]).
    strings: Interner,
}

/// What one node config tells the reconcile, read once per change of the object.
pub struct ConfigFacts {
    /// The step's view (`None` for a placeholder or a config that does not read).
    state: Option<Arc<NodeConfigState>>,
    object: Arc<NodeNetworkConfig>,
    live: bool,
    /// The configurator's record in its annotations (failure streak, quarantine).
    record: NodeRecord,
    /// Its `Quarantined` condition is not what `record` asks for.
    condition_fix: bool,
}

/// The placeholder writes the fleet needs, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Work {
    /// Placeholders whose node is gone (and that are not being deleted already).
    pub orphans: BTreeSet<String>,
    /// Bare nodes whose placeholder does not say what it should (or that have none), with whether
    /// each is eligible (which says what it should say).
    pub unqueued: BTreeMap<String, bool>,
}

/// Node configs whose step state came or changed, and names whose state went.
#[derive(Default)]
pub struct ConfigChanges {
    pub changed: Vec<Arc<NodeConfigState>>,
    pub removed: Vec<String>,
}

/// The objects of one kind as last seen, and what each converted to, by name (so the answers come out
/// sorted without a sort).
struct Kept<K, V> {
    by_object: HashMap<usize, Seen<K>>,
    by_name: BTreeMap<String, (usize, V)>,
    /// Counts passes: an object not seen in the current one goes.
    pass: u64,
    /// The snapshot last taken in ([`Snapshot::id`]).
    seen: Option<u64>,
}

impl<K, V> Default for Kept<K, V> {
    fn default() -> Self {
        Kept {
            by_object: HashMap::new(),
            by_name: BTreeMap::new(),
            pass: 0,
            seen: None,
        }
    }
}

struct Seen<K> {
    /// Pins the object, so its address names it while the entry lives.
    object: Arc<K>,
    pass: u64,
}

impl<K: Resource, V> Kept<K, V> {
    /// Takes in the store's objects: only those named in `changed` when it is given (`objects` is
    /// then sorted by name), else every one. See [`Kept::pass`].
    fn update(
        &mut self,
        objects: &[Arc<K>],
        changed: Option<&BTreeSet<String>>,
        convert: impl FnMut(&Arc<K>) -> V,
        changed_value: impl FnMut(&str, Option<&V>, Option<&V>),
    ) -> bool {
        match changed {
            Some(names) => self.pass_names(objects, names, convert, changed_value),
            None => self.pass(objects, convert, changed_value),
        }
    }

    /// [`Kept::pass`] over the objects named in `names` only, looked up in `objects` (sorted by
    /// name): what changed since the last pass, as the watches saw it.
    fn pass_names(
        &mut self,
        objects: &[Arc<K>],
        names: &BTreeSet<String>,
        mut convert: impl FnMut(&Arc<K>) -> V,
        mut changed_value: impl FnMut(&str, Option<&V>, Option<&V>),
    ) -> bool {
        let mut changed = false;
        for name in names {
            let now = find_sorted(objects, name);
            let now_key = now.map(|o| Arc::as_ptr(o) as usize);
            let old_key = self.by_name.get(name.as_str()).map(|(k, _)| *k);
            if now_key == old_key {
                continue;
            }
            changed = true;
            if let Some(k) = old_key {
                self.by_object.remove(&k);
            }
            let old = match (now, now_key) {
                (Some(o), Some(key)) => {
                    let seen = Seen {
                        object: o.clone(),
                        pass: self.pass,
                    };
                    self.by_object.insert(key, seen);
                    let value = convert(o);
                    self.by_name.insert(name.clone(), (key, value))
                }
                _ => self.by_name.remove(name.as_str()),
            };
            changed_value(
                name,
                old.as_ref().map(|(_, v)| v),
                self.by_name.get(name.as_str()).map(|(_, v)| v),
            );
        }
        changed
    }

    /// Takes in the store's objects, converting those not seen before; whether anything changed.
    /// `changed` hears of every value that came, went or was replaced, under its object's name.
    fn pass(
        &mut self,
        objects: &[Arc<K>],
        mut convert: impl FnMut(&Arc<K>) -> V,
        mut changed_value: impl FnMut(&str, Option<&V>, Option<&V>),
    ) -> bool {
        self.pass += 1;
        let pass = self.pass;
        let mut changed = false;
        for o in objects {
            let key = Arc::as_ptr(o) as usize;
            if let Some(seen) = self.by_object.get_mut(&key) {
                seen.pass = pass;
                continue;
            }
            changed = true;
            self.by_object.insert(
                key,
                Seen {
                    object: o.clone(),
                    pass,
                },
            );
            let name = o.meta().name.clone().unwrap_or_default();
            let value = convert(o);
            let old = self.by_name.insert(name.clone(), (key, value));
            changed_value(
                &name,
                old.as_ref().map(|(_, v)| v),
                self.by_name.get(&name).map(|(_, v)| v),
            );
        }
        let before = self.by_object.len();
        let by_name = &mut self.by_name;
        self.by_object.retain(|key, seen| {
            let keep = seen.pass == pass;
            if !keep {
                let name = seen.object.meta().name.as_deref().unwrap_or_default();
                // Unless a newer object of the same name took its place in this pass.
                if by_name.get(name).is_some_and(|(k, _)| k == key)
                    && let Some((_, old)) = by_name.remove(name)
                {
                    changed_value(name, Some(&old), None);
                }
            }
            keep
        });
        changed || self.by_object.len() != before
    }
}

/// A node as the step and render read it; `None` for a node being deleted or one that does not read.
type NodeShare = Option<(Arc<NodeState>, u64)>;

/// The live nodes, sorted by name, and a fingerprint of every node's name and labels (a render is
/// reused while it is the same).
#[derive(Clone)]
pub struct Nodes {
    /// Shared with each step's input (a reconcile hands the list over; it copies nothing).
    pub states: Arc<Vec<Arc<NodeState>>>,
    pub fingerprint: u64,
}

impl Nodes {
    /// The nodes as render reads them. Built only when a render or a validation is not cached.
    pub fn infos(&self) -> Vec<NodeInfo> {
        self.states
            .iter()
            .map(|st| NodeInfo {
                name: st.name.to_string(),
                labels: st.labels.clone(),
            })
            .collect()
    }
}

impl Observed {
    /// The interner the nodes' and configs' names and hashes come from: what else the step compares
    /// with them (rendered hashes, revision names) is interned here too.
    pub fn strings(&mut self) -> &mut Interner {
        &mut self.strings
    }

    /// The live nodes of the snapshot. A node that does not read is skipped, with one warning when
    /// it is first seen (not one per reconcile). Reads only the nodes that changed since the snapshot
    /// it read last, where the snapshot knows them.
    pub fn nodes(&mut self, s: &Snapshot) -> Nodes {
        let changed = s.changed_since(self.nodes.seen.replace(s.id));
        self.nodes_in(&s.nodes, changed.map(|c| &c.nodes))
    }

    /// [`Observed::nodes`] of `nodes`: those named in `changed` only, if given.
    fn nodes_in(&mut self, nodes: &[Arc<Node>], changed: Option<&BTreeSet<String>>) -> Nodes {
        let (bare, assigned, strings) = (&mut self.bare, &self.assigned, &mut self.strings);
        let touched = &mut self.touched;
        let changed = self.nodes.update(
            nodes,
            changed,
            |n| node_share(n, strings),
            |name, old, new| {
                touched.insert(name.to_string());
                match (
                    old.is_some_and(Option::is_some),
                    new.is_some_and(Option::is_some),
                ) {
                    (false, true) if !assigned.contains(name) => {
                        bare.insert(name.to_string());
                    }
                    (true, false) => drop(bare.remove(name)),
                    _ => {}
                }
            },
        );
        if let Some(last) = self.last_nodes.as_ref().filter(|_| !changed) {
            return last.clone();
        }
        let mut h = DefaultHasher::new();
        let mut states = Vec::with_capacity(self.nodes.by_name.len());
        for (state, node_hash) in self.nodes.by_name.values().filter_map(|(_, v)| v.as_ref()) {
            node_hash.hash(&mut h);
            states.push(state.clone());
        }
        let out = Nodes {
            states: Arc::new(states),
            fingerprint: h.finish(),
        };
        self.last_nodes = Some(out.clone());
        out
    }

    /// The step's view of the snapshot's node configs, sorted by name: placeholders and configs that
    /// do not read are left out. Call after [`Observed::nodes`] of the same snapshot. Reads only the
    /// configs that changed since the snapshot it read last, where the snapshot knows them.
    pub fn configs(&mut self, s: &Snapshot) -> Arc<Vec<Arc<NodeConfigState>>> {
        let changed = s.changed_since(self.configs.seen.replace(s.id));
        self.configs_in(&s.node_configs, changed.map(|c| &c.node_configs))
    }

    /// [`Observed::configs`] of `configs`: those named in `changed` only, if given.
    fn configs_in(
        &mut self,
        configs: &[Arc<NodeNetworkConfig>],
        changed: Option<&BTreeSet<String>>,
    ) -> Arc<Vec<Arc<NodeConfigState>>> {
        let Observed {
            nodes,
            configs: kept,
            bare,
            assigned,
            placeholders,
            quarantined,
            condition_fixes,
            changes,
            strings,
            last_configs,
            touched,
            ..
        } = self;
        // The last step's input is gone by now: the list is changed in place, not copied.
        let last_configs = Arc::make_mut(last_configs);
        kept.update(
            configs,
            changed,
            |c| config_facts(c, strings),
            |name, old, new| {
                touched.insert(name.to_string());
                if let Some(old) = old {
                    if old.object.spec.is_placeholder() {
                        placeholders.remove(name);
                    } else {
                        assigned.remove(name);
                    }
                    *quarantined -= usize::from(old.live && old.record.is_quarantined());
                    condition_fixes.remove(name);
                }
                match new {
                    Some(new) if new.object.spec.is_placeholder() => {
                        placeholders.insert(name.to_string(), new.object.clone());
                    }
                    Some(_) => drop(assigned.insert(name.to_string())),
                    None => {}
                }
                if let Some(new) = new {
                    *quarantined += usize::from(new.live && new.record.is_quarantined());
                    if new.condition_fix {
                        condition_fixes.insert(name.to_string());
                    }
                }
                let node_live = nodes
                    .by_name
                    .get(name)
                    .is_some_and(|(_, share)| share.is_some());
                if assigned.contains(name) || !node_live {
                    bare.remove(name);
                } else {
                    bare.insert(name.to_string());
                }
                let at = last_configs.binary_search_by(|c| c.name.as_str().cmp(name));
                match (new.and_then(|n| n.state.clone()), at) {
                    (Some(state), Ok(i)) => {
                        last_configs[i] = state.clone();
                        changes.changed.push(state);
                    }
                    (Some(state), Err(i)) => {
                        last_configs.insert(i, state.clone());
                        changes.changed.push(state);
                    }
                    (None, Ok(i)) => {
                        last_configs.remove(i);
                        changes.removed.push(name.to_string());
                    }
                    (None, Err(_)) => {}
                }
            },
        );
        self.last_configs.clone()
    }

    /// The node configs' states that came or changed, and the names that went, since the last call.
    pub fn changes(&mut self) -> ConfigChanges {
        std::mem::take(&mut self.changes)
    }

    /// Live nodes without a config holding an assignment, by name, with whether each is eligible:
    /// the reference [`Observed::placeholder_work`] is checked against.
    #[cfg(test)]
    pub fn bare_nodes(&self) -> impl Iterator<Item = (&str, bool)> {
        // Both in name order: a merge, not a lookup per node.
        let mut nodes = self.nodes.by_name.iter().peekable();
        self.bare.iter().filter_map(move |n| {
            while nodes.next_if(|(k, _)| *k < n).is_some() {}
            let (_, (_, share)) = nodes.next_if(|(k, _)| *k == n)?;
            Some((n.as_str(), share.as_ref()?.0.eligible()))
        })
    }

    /// What the agents of nodes without an assignment declare they can apply, from their
    /// placeholders' status (`RolloutInput::unassigned_agents`); agents that declare nothing are
    /// left out.
    pub fn unassigned_agents(&mut self) -> BTreeMap<Sym, FeatureSet> {
        let Observed {
            placeholders,
            strings,
            ..
        } = self;
        (placeholders.iter())
            .filter_map(|(node, c)| {
                let features = FeatureSet::of_agent(c.status.as_ref());
                (!features.is_empty()).then(|| (strings.intern(node), features))
            })
            .collect()
    }

    /// Placeholder configs, by name (the reference [`Observed::placeholder_work`] is checked against).
    #[cfg(test)]
    pub fn placeholders(&self) -> &BTreeMap<String, Arc<NodeNetworkConfig>> {
        &self.placeholders
    }

    /// The placeholder writes the fleet needs when a placeholder should say `words[eligible]`
    /// (`None`: nothing). Worked out for the names that changed since the last call only, unless
    /// `words` changed: a first rollout of 5,000 nodes asked each reconcile about every node
    /// without an assignment, and that was a quarter of the leader's CPU. Also gives the
    /// placeholders, by name.
    pub fn placeholder_work(
        &mut self,
        words: &[Option<String>; 2],
    ) -> (&Work, &BTreeMap<String, Arc<NodeNetworkConfig>>) {
        let names = if self.placeholder_words.as_ref() == Some(words) {
            std::mem::take(&mut self.touched)
        } else {
            self.touched.clear();
            self.placeholder_words = Some(words.clone());
            self.placeholder_work = Work::default();
            (self.bare.iter().chain(self.placeholders.keys()))
                .cloned()
                .collect()
        };
        let work = &mut self.placeholder_work;
        for name in names {
            let placeholder = self.placeholders.get(&name);
            let share = self.nodes.by_name.get(&name).and_then(|(_, s)| s.as_ref());
            let orphan = share.is_none()
                && placeholder.is_some_and(|c| c.metadata.deletion_timestamp.is_none());
            let unqueued = share.map(|(st, _)| st.eligible()).filter(|&eligible| {
                self.bare.contains(&name)
                    && words[usize::from(eligible)]
                        .as_deref()
                        .is_some_and(|w| placeholder.and_then(|c| c.queued_message()) != Some(w))
            });
            match unqueued {
                Some(eligible) => drop(work.unqueued.insert(name.clone(), eligible)),
                None => drop(work.unqueued.remove(&name)),
            }
            if orphan {
                work.orphans.insert(name);
            } else {
                work.orphans.remove(&name);
            }
        }
        (&self.placeholder_work, &self.placeholders)
    }

    /// Live configs whose stored record says quarantined.
    pub fn quarantined(&self) -> usize {
        self.quarantined
    }

    /// A live config's object and stored record.
    pub fn config(&self, node: &str) -> Option<(&Arc<NodeNetworkConfig>, &NodeRecord)> {
        let (_, f) = self.configs.by_name.get(node)?;
        f.live.then_some((&f.object, &f.record))
    }

    /// Live configs whose `Quarantined` condition is not what their stored record asks for.
    pub fn condition_fixes(&self) -> &BTreeSet<String> {
        &self.condition_fixes
    }
}

/// A node config's facts, read once per change of the object.
fn config_facts(c: &Arc<NodeNetworkConfig>, strings: &mut Interner) -> ConfigFacts {
    let record = NodeRecord::from_annotations(c.metadata.annotations.as_ref());
    let name = c.metadata.name.as_deref().unwrap_or_default();
    let current = c
        .status
        .as_ref()
        .map_or(&[][..], |st| st.conditions.as_slice());
    let want = quarantine::condition(name, &record, current, Timestamp(0));
    let have = current
        .iter()
        .find(|c| c.type_ == netwave_api::QUARANTINED_CONDITION);
    let live = live(c.as_ref());
    ConfigFacts {
        state: (!c.spec.is_placeholder())
            .then(|| NodeConfigState::interned(c, strings).ok().map(Arc::new))
            .flatten(),
        object: c.clone(),
        live,
        // `now` only stamps a condition that differs anyway (it is new, or was not True), so whether
        // a fix is needed does not depend on it.
        condition_fix: live && want.as_ref() != have,
        record,
    }
}

/// A node's state and its share of the fleet fingerprint, if it is live and reads.
fn node_share(n: &Node, strings: &mut Interner) -> NodeShare {
    if !live(n) {
        return None;
    }
    match NodeState::interned(n, strings) {
        Ok(st) => {
            let mut h = DefaultHasher::new();
            (&st.name, &st.labels).hash(&mut h);
            Some((Arc::new(st), h.finish()))
        }
        Err(e) => {
            warn!(error = %e, "skipping node");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
    use kube::api::ObjectMeta;
    use netwave_api::NodeNetworkConfigSpec;

    fn node(name: &str, zone: &str) -> Arc<Node> {
        Arc::new(Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some([("zone".to_string(), zone.to_string())].into()),
                ..ObjectMeta::default()
            },
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    ..NodeCondition::default()
                }]),
                ..NodeStatus::default()
            }),
            ..Node::default()
        })
    }

    fn config(name: &str, revision: &str) -> Arc<NodeNetworkConfig> {
        let spec = NodeNetworkConfigSpec {
            revision: revision.into(),
            config_hash: format!("hash-{revision}"),
            ..NodeNetworkConfigSpec::placeholder()
        };
        Arc::new(NodeNetworkConfig::new(name, spec))
    }

    #[test]
    fn a_pass_converts_only_the_objects_that_changed() {
        let mut o = Observed::default();
        let mut nodes = vec![node("b", "z1"), node("a", "z1"), node("c", "z2")];
        let mut configs = vec![config("a", "r1"), config("b", "r1")];
        let first = o.nodes_in(&nodes, None);
        let first_configs = o.configs_in(&configs, None);
        let names: Vec<&str> = first.states.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"], "sorted by name");

        // One node relabelled, one config changed (new objects, as the watch delivers them).
        nodes[2] = node("c", "z3");
        configs[1] = config("b", "r2");
        let second = o.nodes_in(&nodes, None);
        let second_configs = o.configs_in(&configs, None);
        assert!(Arc::ptr_eq(&first.states[0], &second.states[0]), "a kept");
        assert!(Arc::ptr_eq(&first.states[1], &second.states[1]), "b kept");
        assert!(
            !Arc::ptr_eq(&first.states[2], &second.states[2]),
            "c read again"
        );
        assert_eq!(second.states[2].labels["zone"], "z3");
        assert!(Arc::ptr_eq(&first_configs[0], &second_configs[0]));
        assert_eq!(second_configs[1].spec.revision, "r2");
        assert_ne!(first.fingerprint, second.fingerprint, "labels changed");
        assert_eq!(
            (o.nodes.by_object.len(), o.configs.by_object.len()),
            (3, 2),
            "old entries gone"
        );
        assert_eq!((o.nodes.by_name.len(), o.configs.by_name.len()), (3, 2));

        // Nothing changed: the same states and fingerprint.
        let third = o.nodes_in(&nodes, None);
        assert_eq!(third.fingerprint, second.fingerprint);
        assert!(
            third
                .states
                .iter()
                .zip(second.states.iter())
                .all(|(a, b)| Arc::ptr_eq(a, b))
        );
    }

    #[test]
    fn the_fingerprint_does_not_depend_on_store_order_and_nodes_that_leave_are_forgotten() {
        let mut o = Observed::default();
        let ab = o
            .nodes_in(&[node("a", "z1"), node("b", "z2")], None)
            .fingerprint;
        let ba = o
            .nodes_in(&[node("b", "z2"), node("a", "z1")], None)
            .fingerprint;
        assert_eq!(ab, ba);
        let a = o.nodes_in(&[node("a", "z1")], None);
        assert_ne!(a.fingerprint, ab);
        assert_eq!((o.nodes.by_object.len(), o.nodes.by_name.len()), (1, 1));
    }

    #[test]
    fn placeholders_and_nodes_being_deleted_are_left_out() {
        let mut o = Observed::default();
        let mut leaving = (*node("gone", "z1")).clone();
        leaving.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        let nodes = o.nodes_in(&[node("a", "z1"), Arc::new(leaving)], None);
        assert_eq!(nodes.states.len(), 1);
        let placeholder = Arc::new(NodeNetworkConfig::new(
            "p",
            NodeNetworkConfigSpec::placeholder(),
        ));
        assert!(o.configs_in(&[placeholder, config("a", "r1")], None).len() == 1);
    }

    /// A tiny deterministic generator (xorshift), so a failing seed replays.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// A random edit of the store: nodes come, go, are relabelled or turn not Ready; configs are
    /// placeholders or assignments, get reports, quarantine records and conditions, are deleted.
    fn edit(rng: &mut Rng, nodes: &mut Vec<Arc<Node>>, configs: &mut Vec<Arc<NodeNetworkConfig>>) {
        let name = format!("n{}", rng.below(12));
        match rng.below(8) {
            0 => nodes.retain(|n| n.metadata.name.as_deref() != Some(&name)),
            1 | 2 => {
                nodes.retain(|n| n.metadata.name.as_deref() != Some(&name));
                let mut n = (*node(&name, &format!("z{}", rng.below(3)))).clone();
                if rng.below(4) == 0 {
                    n.status = None;
                }
                if rng.below(6) == 0 {
                    n.metadata.deletion_timestamp =
                        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                        ));
                }
                nodes.push(Arc::new(n));
            }
            3 => configs.retain(|c| c.metadata.name.as_deref() != Some(&name)),
            _ => {
                configs.retain(|c| c.metadata.name.as_deref() != Some(&name));
                let mut c = if rng.below(3) == 0 {
                    let mut c = NodeNetworkConfig::new(&name, NodeNetworkConfigSpec::placeholder());
                    // Saying what one set of words asks for, or another, or nothing.
                    let said = ["queued", "not ready", "queued for another", ""];
                    c.metadata.annotations = Some(
                        [(
                            netwave_api::QUEUED_ANNOTATION.to_string(),
                            said[rng.below(4) as usize].to_string(),
                        )]
                        .into(),
                    );
                    c
                } else {
                    (*config(&name, &format!("r{}", rng.below(2)))).clone()
                };
                if rng.below(3) == 0 {
                    c.metadata.annotations.get_or_insert_default().insert(
                        netwave_api::QUARANTINED_ANNOTATION.to_string(),
                        "after 3 failures".to_string(),
                    );
                }
                let mut st = netwave_api::NodeNetworkConfigStatus::default();
                if rng.below(2) == 0 {
                    st.phase = Some("Provisioned".into());
                    st.observed_revision = Some(c.spec.revision.clone());
                    st.config_hash = Some(c.spec.config_hash.clone());
                }
                if rng.below(3) == 0 {
                    let record = NodeRecord::from_annotations(c.metadata.annotations.as_ref());
                    let stale = NodeRecord {
                        quarantined: Some("long ago".into()),
                        ..NodeRecord::default()
                    };
                    let r = if rng.below(2) == 0 { &record } else { &stale };
                    st.conditions
                        .extend(quarantine::condition(&name, r, &[], Timestamp(1_000)));
                }
                c.status = Some(st);
                if rng.below(8) == 0 {
                    c.metadata.deletion_timestamp =
                        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                        ));
                }
                configs.push(Arc::new(c));
            }
        }
    }

    fn by_name<K: Resource>(list: &[Arc<K>]) -> Vec<Arc<K>> {
        let mut v = list.to_vec();
        v.sort_by(|a, b| a.meta().name.cmp(&b.meta().name));
        v
    }

    /// The names whose object came, went or was replaced between two sorted lists, and now and then
    /// one that did not change (a watch event can name an object the reconcile already read).
    fn changed_names<K: Resource>(
        rng: &mut Rng,
        before: &[Arc<K>],
        now: &[Arc<K>],
    ) -> BTreeSet<String> {
        let index = |l: &[Arc<K>]| -> BTreeMap<String, usize> {
            l.iter()
                .map(|o| {
                    (
                        o.meta().name.clone().unwrap_or_default(),
                        Arc::as_ptr(o) as usize,
                    )
                })
                .collect()
        };
        let (b, n) = (index(before), index(now));
        let mut names: BTreeSet<String> = b
            .keys()
            .chain(n.keys())
            .filter(|k| b.get(*k) != n.get(*k))
            .cloned()
            .collect();
        if let Some(k) = n.keys().nth(rng.below(n.len().max(1) as u64) as usize) {
            names.insert(k.clone());
        }
        names
    }

    /// What placeholders say in [`what_is_kept_between_passes_equals_a_fresh_reading_of_the_store_after_every_edit`].
    const WORDS: [[Option<&str>; 2]; 3] = [
        [Some("not ready"), Some("queued")],
        [Some("not ready"), Some("queued for another")],
        [None, None],
    ];

    /// [`Observed::placeholder_work`] by a walk over every node without an assignment and every
    /// placeholder.
    fn placeholder_work_from_scratch(o: &Observed, words: &[Option<String>; 2]) -> Work {
        let live: BTreeSet<&str> = (o.nodes.by_name.iter())
            .filter(|(_, (_, share))| share.is_some())
            .map(|(name, _)| name.as_str())
            .collect();
        let orphans = (o.placeholders().iter())
            .filter(|(name, c)| {
                !live.contains(name.as_str()) && c.metadata.deletion_timestamp.is_none()
            })
            .map(|(name, _)| name.clone())
            .collect();
        let unqueued = o
            .bare_nodes()
            .filter(|&(node, eligible)| {
                words[usize::from(eligible)].as_deref().is_some_and(|w| {
                    o.placeholders().get(node).and_then(|c| c.queued_message()) != Some(w)
                })
            })
            .map(|(node, eligible)| (node.to_string(), eligible))
            .collect();
        Work { orphans, unqueued }
    }

    #[test]
    fn what_is_kept_between_passes_equals_a_fresh_reading_of_the_store_after_every_edit() {
        for seed in 1..=300u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let mut o = Observed::default();
            let mut delta = Observed::default();
            let (mut last_nodes, mut last_configs) = (Vec::new(), Vec::new());
            let (mut nodes, mut configs) = (Vec::new(), Vec::new());
            for step in 0..60 {
                for _ in 0..=rng.below(3) {
                    edit(&mut rng, &mut nodes, &mut configs);
                }
                // The store hands objects out in no particular order.
                if rng.below(2) == 0 {
                    nodes.reverse();
                    let k = configs.len().min(1);
                    configs.rotate_left(k);
                }
                let got_nodes = o.nodes_in(&nodes, None);
                let got_configs = o.configs_in(&configs, None);
                let ctx = format!("seed {seed}, step {step}");

                let mut fresh = Observed::default();
                let want_nodes = fresh.nodes_in(&nodes, None);
                let want_configs = fresh.configs_in(&configs, None);
                assert_eq!(got_nodes.states, want_nodes.states, "{ctx}");
                assert_eq!(got_nodes.fingerprint, want_nodes.fingerprint, "{ctx}");
                assert_eq!(got_configs, want_configs, "{ctx}");

                // Fed only the names the watches would name (those whose object came, went or
                // was replaced, and a few that did not change), from lists sorted by name.
                let (sorted_nodes, sorted_configs) = (by_name(&nodes), by_name(&configs));
                let (changed_nodes, changed_configs) = (
                    changed_names(&mut rng, &last_nodes, &sorted_nodes),
                    changed_names(&mut rng, &last_configs, &sorted_configs),
                );
                let delta_nodes = delta.nodes_in(&sorted_nodes, Some(&changed_nodes));
                let delta_configs = delta.configs_in(&sorted_configs, Some(&changed_configs));
                assert_eq!(delta_nodes.states, want_nodes.states, "{ctx}: by names");
                assert_eq!(delta_nodes.fingerprint, want_nodes.fingerprint, "{ctx}");
                assert_eq!(delta_configs, want_configs, "{ctx}: by names");
                assert_eq!(
                    delta.bare_nodes().collect::<Vec<_>>(),
                    o.bare_nodes().collect::<Vec<_>>(),
                    "{ctx}: by names"
                );
                assert_eq!(delta.placeholders(), o.placeholders(), "{ctx}: by names");
                // The words change now and then (a new target), mostly not.
                let words = WORDS[usize::from(rng.below(6) == 0) + usize::from(step % 20 >= 10)]
                    .map(|w| w.map(str::to_string));
                let want_work = placeholder_work_from_scratch(&o, &words);
                assert_eq!(o.placeholder_work(&words).0, &want_work, "{ctx}");
                assert_eq!(delta.placeholder_work(&words).0, &want_work, "{ctx}");
                assert_eq!(delta.quarantined(), o.quarantined(), "{ctx}: by names");
                assert_eq!(
                    delta.condition_fixes(),
                    o.condition_fixes(),
                    "{ctx}: by names"
                );
                (last_nodes, last_configs) = (sorted_nodes, sorted_configs);

                // The aggregates against their definitions, read off the store directly.
                let live_nodes: BTreeSet<String> = want_nodes
                    .states
                    .iter()
                    .map(|s| s.name.to_string())
                    .collect();
                let assigned: BTreeSet<String> = configs
                    .iter()
                    .filter(|c| !c.spec.is_placeholder())
                    .filter_map(|c| c.metadata.name.clone())
                    .collect();
                let bare: Vec<&str> = o.bare_nodes().map(|(n, _)| n).collect();
                let want_bare: Vec<&str> = live_nodes
                    .difference(&assigned)
                    .map(String::as_str)
                    .collect();
                assert_eq!(bare, want_bare, "{ctx}");
                let placeholders: BTreeSet<&str> =
                    o.placeholders().keys().map(String::as_str).collect();
                let want_placeholders: BTreeSet<&str> = configs
                    .iter()
                    .filter(|c| c.spec.is_placeholder())
                    .filter_map(|c| c.metadata.name.as_deref())
                    .collect();
                assert_eq!(placeholders, want_placeholders, "{ctx}");
                let live_configs = configs.iter().filter(|c| live(c.as_ref()));
                let want_quarantined = live_configs
                    .clone()
                    .filter(|c| {
                        NodeRecord::from_annotations(c.metadata.annotations.as_ref())
                            .is_quarantined()
                    })
                    .count();
                assert_eq!(o.quarantined(), want_quarantined, "{ctx}");
                let want_fixes: BTreeSet<String> = live_configs
                    .filter(|c| {
                        let name = c.metadata.name.as_deref().unwrap_or_default();
                        let record = NodeRecord::from_annotations(c.metadata.annotations.as_ref());
                        let current = c.status.as_ref().map_or(&[][..], |s| &s.conditions[..]);
                        let want = quarantine::condition(name, &record, current, Timestamp(5_000));
                        let have = current
                            .iter()
                            .find(|c| c.type_ == netwave_api::QUARANTINED_CONDITION);
                        want.as_ref() != have
                    })
                    .filter_map(|c| c.metadata.name.clone())
                    .collect();
                assert_eq!(o.condition_fixes(), &want_fixes, "{ctx}");
            }
        }
    }
}
