//! Each Node's and NodeNetworkConfig's state as the rollout step reads it, kept between reconciles
//! (#28). The watch stores hand out the same `Arc` for an object until it changes, so a reconcile
//! converts only the objects that changed since the last one: after one agent report, one config —
//! not the fleet. At 2,000 nodes the conversions were half of a reconcile's compute.
//!
//! The cache holds each object it converted, so an address it remembers cannot be reused by another
//! object while the entry lives; entries of objects no longer in the store go at the end of the pass
//! that no longer saw them.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use netwave_api::NodeNetworkConfig;
use netwave_core::render::NodeInfo;
use netwave_core::rollout::{NodeConfigState, NodeState};
use tracing::warn;

use crate::snapshot::live;

/// What the leader keeps of the nodes and their configs between reconciles.
#[derive(Default)]
pub struct Observed {
    nodes: HashMap<usize, Entry<Node, NodeShare>>,
    configs: HashMap<usize, Entry<NodeNetworkConfig, Option<Arc<NodeConfigState>>>>,
    /// Counts passes over each kind: an entry not seen in the current one goes.
    node_pass: u64,
    config_pass: u64,
}

struct Entry<K, V> {
    /// Pins the object, so its address names it while the entry lives.
    _object: Arc<K>,
    value: V,
    pass: u64,
}

/// A node as the step and render read it; `None` for a node being deleted or one that does not read.
type NodeShare = Option<(Arc<NodeState>, u64)>;

/// The live nodes, sorted by name, and a fingerprint of every node's name and labels (a render is
/// reused while it is the same).
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
        self.node_pass += 1;
        let pass = self.node_pass;
        let mut states = Vec::with_capacity(nodes.len());
        for n in nodes {
            let entry = self
                .nodes
                .entry(Arc::as_ptr(n) as usize)
                .or_insert_with(|| Entry {
                    _object: n.clone(),
                    value: node_share(n),
                    pass,
                });
            entry.pass = pass;
            if let Some(share) = &entry.value {
                states.push(share.clone());
            }
        }
        self.nodes.retain(|_, e| e.pass == pass);
        states.sort_unstable_by(|(a, _), (b, _)| a.name.cmp(&b.name));
        let mut h = DefaultHasher::new();
        for (_, node_hash) in &states {
            node_hash.hash(&mut h);
        }
        Nodes {
            states: states.into_iter().map(|(st, _)| st).collect(),
            fingerprint: h.finish(),
        }
    }

    /// The step's view of `configs`: placeholders and configs that do not read are left out.
    pub fn configs(&mut self, configs: &[Arc<NodeNetworkConfig>]) -> Vec<Arc<NodeConfigState>> {
        self.config_pass += 1;
        let pass = self.config_pass;
        let mut out = Vec::with_capacity(configs.len());
        for c in configs {
            let entry = self
                .configs
                .entry(Arc::as_ptr(c) as usize)
                .or_insert_with(|| Entry {
                    _object: c.clone(),
                    value: (!c.spec.is_placeholder())
                        .then(|| NodeConfigState::from_api(c).ok().map(Arc::new))
                        .flatten(),
                    pass,
                });
            entry.pass = pass;
            if let Some(state) = &entry.value {
                out.push(state.clone());
            }
        }
        self.configs.retain(|_, e| e.pass == pass);
        out
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
        assert_eq!((o.nodes.len(), o.configs.len()), (3, 2), "old entries gone");

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
        assert_eq!(o.nodes.len(), 1);
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
