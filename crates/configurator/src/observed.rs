//! Each Node's and NodeNetworkConfig's state as the rollout step reads it, kept between reconciles
//! (#28). The watch stores hand out the same `Arc` for an object until it changes, so a reconcile
//! converts only the objects that changed since the last one: after one agent report, one config —
//! not the fleet. At 2,000 nodes the conversions were half of a reconcile's compute.
//!
//! The cache holds each object it converted, so an address it remembers cannot be reused by another
//! object while the entry lives; entries of objects no longer in the store go at the end of the pass
//! that no longer saw them.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::Resource;
use netwave_api::NodeNetworkConfig;
use netwave_core::render::NodeInfo;
use netwave_core::rollout::{NodeConfigState, NodeState};
use tracing::warn;

use crate::snapshot::live;

/// What the leader keeps of the nodes and their configs between reconciles.
#[derive(Default)]
pub struct Observed {
    nodes: Kept<Node, NodeShare>,
    configs: Kept<NodeNetworkConfig, Option<Arc<NodeConfigState>>>,
    /// The last answers, given again while no object changed.
    last_nodes: Option<Nodes>,
    last_configs: Vec<Arc<NodeConfigState>>,
}

/// The objects of one kind as last seen, and what each converted to, by name (so the answers come out
/// sorted without a sort).
struct Kept<K, V> {
    by_object: HashMap<usize, Seen<K>>,
    by_name: BTreeMap<String, (usize, V)>,
    /// Counts passes: an object not seen in the current one goes.
    pass: u64,
}

impl<K, V> Default for Kept<K, V> {
    fn default() -> Self {
        Kept {
            by_object: HashMap::new(),
            by_name: BTreeMap::new(),
            pass: 0,
        }
    }
}

struct Seen<K> {
    /// Pins the object, so its address names it while the entry lives.
    object: Arc<K>,
    pass: u64,
}

impl<K: Resource, V> Kept<K, V> {
    /// Takes in the store's objects, converting those not seen before; whether anything changed.
    fn pass(&mut self, objects: &[Arc<K>], convert: impl Fn(&K) -> V) -> bool {
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
            self.by_name.insert(name, (key, convert(o)));
        }
        let before = self.by_object.len();
        let by_name = &mut self.by_name;
        self.by_object.retain(|key, seen| {
            let keep = seen.pass == pass;
            if !keep {
                let name = seen.object.meta().name.as_deref().unwrap_or_default();
                // Unless a newer object of the same name took its place in this pass.
                if by_name.get(name).is_some_and(|(k, _)| k == key) {
                    by_name.remove(name);
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
    pub states: Vec<Arc<NodeState>>,
    pub fingerprint: u64,
}

impl Nodes {
    /// The nodes as render reads them. Built only when a render or a validation is not cached.
    pub fn infos(&self) -> Vec<NodeInfo> {
        self.states
            .iter()
            .map(|st| NodeInfo {
                name: st.name.clone(),
                labels: st.labels.clone(),
            })
            .collect()
    }
}

impl Observed {
    /// The live nodes of `nodes`. A node that does not read is skipped, with one warning when it is
    /// first seen (not one per reconcile).
    pub fn nodes(&mut self, nodes: &[Arc<Node>]) -> Nodes {
        let changed = self.nodes.pass(nodes, node_share);
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
            states,
            fingerprint: h.finish(),
        };
        self.last_nodes = Some(out.clone());
        out
    }

    /// The step's view of `configs`, sorted by name: placeholders and configs that do not read are
    /// left out.
    pub fn configs(&mut self, configs: &[Arc<NodeNetworkConfig>]) -> Vec<Arc<NodeConfigState>> {
        let changed = self.configs.pass(configs, |c| {
            (!c.spec.is_placeholder())
                .then(|| NodeConfigState::from_api(c).ok().map(Arc::new))
                .flatten()
        });
        if changed {
            self.last_configs = (self.configs.by_name.values())
                .filter_map(|(_, v)| v.clone())
                .collect();
        }
        self.last_configs.clone()
    }
}

/// A node's state and its share of the fleet fingerprint, if it is live and reads.
fn node_share(n: &Node) -> NodeShare {
    if !live(n) {
        return None;
    }
    match NodeState::from_api(n) {
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
        let first = o.nodes(&nodes);
        let first_configs = o.configs(&configs);
        let names: Vec<&str> = first.states.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"], "sorted by name");

        // One node relabelled, one config changed (new objects, as the watch delivers them).
        nodes[2] = node("c", "z3");
        configs[1] = config("b", "r2");
        let second = o.nodes(&nodes);
        let second_configs = o.configs(&configs);
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
        let third = o.nodes(&nodes);
        assert_eq!(third.fingerprint, second.fingerprint);
        assert!(
            third
                .states
                .iter()
                .zip(&second.states)
                .all(|(a, b)| Arc::ptr_eq(a, b))
        );
    }

    #[test]
    fn the_fingerprint_does_not_depend_on_store_order_and_nodes_that_leave_are_forgotten() {
        let mut o = Observed::default();
        let ab = o.nodes(&[node("a", "z1"), node("b", "z2")]).fingerprint;
        let ba = o.nodes(&[node("b", "z2"), node("a", "z1")]).fingerprint;
        assert_eq!(ab, ba);
        let a = o.nodes(&[node("a", "z1")]);
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
        let nodes = o.nodes(&[node("a", "z1"), Arc::new(leaving)]);
        assert_eq!(nodes.states.len(), 1);
        let placeholder = Arc::new(NodeNetworkConfig::new(
            "p",
            NodeNetworkConfigSpec::placeholder(),
        ));
        assert!(o.configs(&[placeholder, config("a", "r1")]).len() == 1);
    }
}
