//! What one reconcile reads: the stores' objects at one moment, those that do not decode set apart.
//! [`crate::decide`] decides from it and [`crate::integrity`] checks it; neither is needed to read it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use netwave_api::kinds::{ByKind, Input, Make, Objects, Visit, each_kind};
use netwave_api::{
    Named, NetworkConfigInputs, NetworkConfigRevision, NodeNetworkConfig, RevisionInputs,
};
use netwave_core::revision;
use netwave_core::undecodable::{self, Holds, Kind, Undecodable};
use netwave_runtime::decoded::Decoded;

use crate::watch::{InputStores, Stores};

/// Everything a reconcile reads, taken from the stores at one moment.
#[derive(Clone, Default)]
pub struct Snapshot {
    /// The admin inputs that decode, kind by kind.
    pub inputs: ByKind<Objects>,
    pub nodes: Vec<Arc<Node>>,
    pub node_configs: Vec<Arc<NodeNetworkConfig>>,
    pub revisions: Vec<Arc<NetworkConfigRevision>>,
    /// The revisions' inputs, each under its revision's name.
    pub revision_inputs: Vec<Arc<NetworkConfigInputs>>,
    /// Live objects of the kinds above that do not decode (not in those lists), with their uid.
    pub undecodable: Vec<(Undecodable, Option<String>)>,
    /// Tells this snapshot apart from every other one of this process (0: built by hand).
    pub id: u64,
    /// What changed since the snapshot this one was refreshed from (`None`: taken whole).
    pub(crate) changed: Option<Changed>,
    /// `nodes` and `node_configs` are sorted by name.
    pub(crate) sorted: bool,
    /// Node configs that do not decode, by name (kept between refreshes).
    pub(crate) bad_configs: BTreeMap<String, (Undecodable, Option<String>)>,
}

/// A revision and its inputs as the API server has them now, read
/// to confirm a verdict the cache may be behind on (`crate::recheck`) (`None`: there is none).
#[derive(Clone, Debug)]
pub struct FreshRevision {
    pub name: String,
    pub revision: Option<Arc<NetworkConfigRevision>>,
    pub inputs: Option<Arc<NetworkConfigInputs>>,
}

/// The nodes and node configs that changed since snapshot `since`, by name.
#[derive(Clone, Debug, Default)]
pub struct Changed {
    pub since: u64,
    pub nodes: BTreeSet<String>,
    pub node_configs: BTreeSet<String>,
}

fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl Snapshot {
    /// Everything in the stores, the nodes and node configs sorted by name.
    pub fn take(stores: &Stores) -> Self {
        // What changed before now is in this snapshot.
        drop((stores.node_changes.take(), stores.config_changes.take()));
        let mut nodes = stores.nodes.state();
        nodes.sort_unstable_by(|a, b| name_of(a).cmp(name_of(b)));
        let mut bad_configs = BTreeMap::new();
        let mut node_configs = Vec::new();
        for o in stores.node_configs.state() {
            if let Some((name, entry)) = config_entry(&o) {
                match entry {
                    Ok(c) => node_configs.push(c),
                    Err(bad) => drop(bad_configs.insert(name, bad)),
                }
            }
        }
        node_configs.sort_unstable_by(|a, b| name_of(a).cmp(name_of(b)));
        let mut s = Snapshot {
            nodes,
            node_configs,
            bad_configs,
            id: next_id(),
            sorted: true,
            ..Snapshot::default()
        };
        s.take_small(stores);
        s
    }

    /// This snapshot brought up to the stores: the kinds with few objects taken whole, the nodes and
    /// node configs only where their watches saw a change since the last take ([`Changed`]). Costs
    /// what changed, not the fleet (#28).
    pub fn refresh(mut self, stores: &Stores) -> Self {
        let (nodes, configs) = (stores.node_changes.take(), stores.config_changes.take());
        if nodes.relisted || configs.relisted || !self.sorted {
            return Snapshot::take(stores);
        }
        for name in &nodes.names {
            let now = stores.nodes.get(&ObjectRef::new(name));
            put(&mut self.nodes, name, now);
        }
        for name in &configs.names {
            let now = stores
                .node_configs
                .get(&ObjectRef::new(name))
                .and_then(|o| config_entry(&o));
            self.bad_configs.remove(name);
            let now = match now {
                Some((_, Ok(c))) => Some(c),
                Some((name, Err(bad))) => {
                    self.bad_configs.insert(name, bad);
                    None
                }
                None => None,
            };
            put(&mut self.node_configs, name, now);
        }
        self.changed = Some(Changed {
            since: self.id,
            nodes: nodes.names,
            node_configs: configs.names,
        });
        self.id = next_id();
        self.take_small(stores);
        self
    }

    /// Marks this snapshot as a new one in which only the named nodes and node configs changed
    /// since it was last read (sorting its lists). For what drives [`crate::decide::compute`]
    /// without watches, as [`Snapshot::refresh`] does with them.
    pub fn changed_by_hand(&mut self, nodes: BTreeSet<String>, node_configs: BTreeSet<String>) {
        self.nodes.sort_by(|a, b| name_of(a).cmp(name_of(b)));
        self.node_configs.sort_by(|a, b| name_of(a).cmp(name_of(b)));
        self.sorted = true;
        self.changed = Some(Changed {
            since: self.id,
            nodes,
            node_configs,
        });
        self.id = next_id();
    }

    /// This snapshot with the node configs read fresh in place of the cache's (`None`: gone), as a new
    /// snapshot in which those changed; `None` if every one is the version the snapshot holds already.
    pub fn with_fresh_configs(
        &self,
        fresh: Vec<(String, Option<Arc<NodeNetworkConfig>>)>,
    ) -> Option<Snapshot> {
        let version = |c: Option<&Arc<NodeNetworkConfig>>| {
            c.map(|c| (c.metadata.uid.clone(), c.metadata.resource_version.clone()))
        };
        let newer: Vec<_> = fresh
            .into_iter()
            // One the cache holds as undecodable stays so for this reconcile (its Event says why).
            .filter(|(name, _)| !self.bad_configs.contains_key(name))
            .filter(|(name, c)| version(self.node_config(name)) != version(c.as_ref()))
            .collect();
        if newer.is_empty() {
            return None;
        }
        let mut s = self.clone();
        if !s.sorted {
            s.node_configs.sort_by(|a, b| name_of(a).cmp(name_of(b)));
        }
        let mut names = BTreeSet::new();
        for (name, c) in newer {
            put(&mut s.node_configs, &name, c);
            names.insert(name);
        }
        s.changed_by_hand(BTreeSet::new(), names);
        Some(s)
    }

    /// This snapshot with the revisions and inputs read fresh in place of the cache's (`None`: gone), as
    /// a new snapshot; `None` if each is the version the snapshot holds already.
    pub fn with_fresh_revisions(&self, fresh: &[FreshRevision]) -> Option<Snapshot> {
        fn version<K: Resource>(o: Option<&K>) -> Option<(Option<&str>, Option<&str>)> {
            o.map(|o| {
                (
                    o.meta().uid.as_deref(),
                    o.meta().resource_version.as_deref(),
                )
            })
        }
        let cached_revision = |name: &str| {
            self.revisions
                .iter()
                .find(|r| r.metadata.name.as_deref() == Some(name))
        };
        let newer: Vec<&FreshRevision> = fresh
            .iter()
            .filter(|f| {
                version(cached_revision(&f.name).map(AsRef::as_ref))
                    != version(f.revision.as_deref())
                    || version(self.inputs_object(&f.name)) != version(f.inputs.as_deref())
            })
            .collect();
        if newer.is_empty() {
            return None;
        }
        let mut s = self.clone();
        for f in newer {
            let named = |m: &ObjectMeta| m.name.as_deref() == Some(f.name.as_str());
            s.revisions.retain(|r| !named(&r.metadata));
            s.revisions.extend(f.revision.clone());
            s.revision_inputs.retain(|i| !named(&i.metadata));
            s.revision_inputs.extend(f.inputs.clone());
        }
        s.changed_by_hand(BTreeSet::new(), BTreeSet::new());
        Some(s)
    }

    /// What changed since snapshot `seen`, when this one knows (it was refreshed from that one);
    /// `None`: whoever read `seen` must read this one whole.
    /// Snapshots built by hand all have id 0, so nothing is ever known to have changed since one.
    pub fn changed_since(&self, seen: Option<u64>) -> Option<&Changed> {
        self.changed
            .as_ref()
            .filter(|c| self.sorted && c.since != 0 && Some(c.since) == seen)
    }

    /// The kinds with few objects, taken whole, and the objects that do not decode.
    fn take_small(&mut self, stores: &Stores) {
        struct Inputs<'a> {
            stores: &'a ByKind<InputStores>,
            bad: &'a mut Vec<(Undecodable, Option<String>)>,
        }
        impl Make<Objects> for Inputs<'_> {
            fn make<K: Input>(&mut self) -> Vec<Arc<K>> {
                let kind = Kind::Input(K::KIND);
                decoded(self.stores.get::<K>().state(), kind, self.bad)
            }
        }
        let mut bad = Vec::new();
        self.inputs = ByKind::make(&mut Inputs {
            stores: &stores.inputs,
            bad: &mut bad,
        });
        bad.extend(self.bad_configs.values().cloned());
        self.revisions = decoded(stores.revisions.state(), Kind::Revision, &mut bad);
        self.revision_inputs = decoded(
            stores.revision_inputs.state(),
            Kind::RevisionInputs,
            &mut bad,
        );
        self.undecodable = bad;
    }

    /// The node config named `name`. By lookup where the list is known sorted, else by a search.
    pub fn node_config(&self, name: &str) -> Option<&Arc<NodeNetworkConfig>> {
        if self.sorted {
            find_sorted(&self.node_configs, name)
        } else {
            self.node_configs
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(name))
        }
    }

    /// What the objects that do not decode hold back.
    pub fn holds(&self) -> Holds {
        let bad: Vec<Undecodable> = self.undecodable.iter().map(|(u, _)| u.clone()).collect();
        undecodable::holds(&bad)
    }

    /// The inputs object of the revision `name`, if it is there.
    pub fn inputs_object(&self, name: &str) -> Option<&NetworkConfigInputs> {
        self.revision_inputs
            .iter()
            .find(|i| i.metadata.name.as_deref() == Some(name) && live(i.as_ref()))
            .map(AsRef::as_ref)
    }

    /// The inputs of the revision `name`, if they are there.
    pub fn inputs_of(&self, name: &str) -> Option<&RevisionInputs> {
        self.inputs_object(name).map(|i| &i.spec)
    }
}

fn name_of<K: Resource>(o: &Arc<K>) -> &str {
    o.meta().name.as_deref().unwrap_or_default()
}

/// The object named `name` in a list sorted by name.
pub fn find_sorted<'a, K: Resource>(list: &'a [Arc<K>], name: &str) -> Option<&'a Arc<K>> {
    list.binary_search_by(|o| name_of(o).cmp(name))
        .ok()
        .map(|i| &list[i])
}

/// Puts `now` (or nothing) in the place of `name` in a list sorted by name.
fn put<K: Resource>(list: &mut Vec<Arc<K>>, name: &str, now: Option<Arc<K>>) {
    let at = list.binary_search_by(|o| name_of(o).cmp(name));
    match (at, now) {
        (Ok(i), Some(o)) => list[i] = o,
        (Ok(i), None) => drop(list.remove(i)),
        (Err(i), Some(o)) => list.insert(i, o),
        (Err(_), None) => {}
    }
}

/// A stored node config by name: the object, or what to report of it when it does not decode
/// (`None`: unnamed, or undecodable and being deleted).
type ConfigEntry = (
    String,
    Result<Arc<NodeNetworkConfig>, (Undecodable, Option<String>)>,
);

fn config_entry(o: &Decoded<NodeNetworkConfig>) -> Option<ConfigEntry> {
    match o {
        Decoded::Object(k) => Some((k.metadata.name.clone()?, Ok(k.clone()))),
        Decoded::Undecodable(u) if u.metadata.deletion_timestamp.is_none() => {
            let name = u.metadata.name.clone().unwrap_or_default();
            let bad = Undecodable {
                kind: Kind::NodeConfig,
                name: name.clone(),
                error: u.error.clone(),
            };
            Some((name, Err((bad, u.metadata.uid.clone()))))
        }
        Decoded::Undecodable(_) => None,
    }
}

/// The objects of one kind that decode; the live ones that do not go to `bad`.
fn decoded<K>(
    objects: Vec<Arc<Decoded<K>>>,
    kind: Kind,
    bad: &mut Vec<(Undecodable, Option<String>)>,
) -> Vec<Arc<K>> {
    let mut out = Vec::with_capacity(objects.len());
    for o in objects {
        match o.as_ref() {
            Decoded::Object(k) => out.push(k.clone()),
            Decoded::Undecodable(u) if u.metadata.deletion_timestamp.is_none() => bad.push((
                Undecodable {
                    kind,
                    name: u.metadata.name.clone().unwrap_or_default(),
                    error: u.error.clone(),
                },
                u.metadata.uid.clone(),
            )),
            Decoded::Undecodable(_) => {}
        }
    }
    out
}

/// The admin inputs folded into one snapshot, canonically sorted, cut for this build's render version
/// (`render::RENDER_VERSION`).
pub fn fold_inputs(s: &Snapshot) -> RevisionInputs {
    fold_objects(&s.inputs)
}

/// [`fold_inputs`] of these objects.
pub fn fold_objects(inputs: &ByKind<Objects>) -> RevisionInputs {
    struct Fold<'a>(&'a ByKind<Objects>, RevisionInputs);
    impl Visit for Fold<'_> {
        fn visit<K: Input>(&mut self) {
            let live = self.0.get::<K>().iter().filter(|o| live(o.as_ref()));
            *K::named_mut(&mut self.1) = live
                .map(|o| Named::new(o.meta().name.clone().unwrap_or_default(), o.spec().clone()))
                .collect();
        }
    }
    let mut fold = Fold(inputs, RevisionInputs::default());
    each_kind(&mut fold);
    netwave_core::render::stamp_render_version(&mut fold.1, netwave_core::render::RENDER_VERSION);
    revision::canonical_inputs(&fold.1)
}

/// Not being deleted, and named.
pub(crate) fn live<K: Resource>(o: &K) -> bool {
    o.meta().deletion_timestamp.is_none() && o.meta().name.is_some()
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector::{self, store::Writer};
    use kube::runtime::watcher::Event;
    use netwave_api::NodeNetworkConfigSpec;
    use netwave_runtime::decoded::Undecodable as Bad;

    use super::*;
    use crate::watch::Journal;

    fn node(name: &str, zone: &str) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.metadata.labels = Some([("zone".to_string(), zone.to_string())].into());
        n
    }

    fn config(name: &str, revision: &str) -> Decoded<NodeNetworkConfig> {
        let spec = NodeNetworkConfigSpec {
            revision: revision.into(),
            ..NodeNetworkConfigSpec::placeholder()
        };
        Decoded::Object(Arc::new(NodeNetworkConfig::new(name, spec)))
    }

    fn bad_config(name: &str) -> Decoded<NodeNetworkConfig> {
        Decoded::Undecodable(Arc::new(Bad {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            error: "spec.retry: invalid type".into(),
        }))
    }

    /// The stores as the watches fill them, and the two journals they keep.
    struct Watches {
        stores: Stores,
        nodes: Writer<Node>,
        configs: Writer<Decoded<NodeNetworkConfig>>,
    }

    impl Watches {
        fn new() -> Self {
            fn empty<K>() -> reflector::Store<K>
            where
                K: Resource<DynamicType = ()> + Clone + 'static,
            {
                let (r, mut w) = reflector::store();
                w.apply_watcher_event(&Event::InitDone);
                r
            }
            struct Empty;
            impl Make<InputStores> for Empty {
                fn make<K: Input>(&mut self) -> reflector::Store<Decoded<K>> {
                    empty()
                }
            }
            let (nodes_r, nodes) = reflector::store();
            let (configs_r, configs) = reflector::store();
            let stores = Stores {
                inputs: ByKind::make(&mut Empty),
                nodes: nodes_r,
                node_configs: configs_r,
                node_configs_watch: crate::watch::LeaderWatch::started(),
                revisions: empty(),
                revision_inputs: empty(),
                node_changes: Journal::default(),
                config_changes: Journal::default(),
            };
            Watches {
                stores,
                nodes,
                configs,
            }
        }

        fn node(&mut self, e: Event<Node>) {
            self.nodes.apply_watcher_event(&e);
            self.stores.node_changes.note(&e);
        }

        fn config(&mut self, e: Event<Decoded<NodeNetworkConfig>>) {
            self.configs.apply_watcher_event(&e);
            self.stores.config_changes.note(&e);
        }

        fn list(&mut self, nodes: Vec<Node>, configs: Vec<Decoded<NodeNetworkConfig>>) {
            self.node(Event::Init);
            for n in nodes {
                self.node(Event::InitApply(n));
            }
            self.node(Event::InitDone);
            self.config(Event::Init);
            for c in configs {
                self.config(Event::InitApply(c));
            }
            self.config(Event::InitDone);
        }
    }

    fn names<K: Resource>(list: &[Arc<K>]) -> Vec<String> {
        list.iter()
            .map(|o| o.meta().name.clone().unwrap_or_default())
            .collect()
    }

    fn same(a: &Snapshot, b: &Snapshot) {
        assert_eq!(names(&a.nodes), names(&b.nodes));
        assert!(a.nodes.iter().zip(&b.nodes).all(|(x, y)| Arc::ptr_eq(x, y)));
        assert_eq!(names(&a.node_configs), names(&b.node_configs));
        assert!((a.node_configs.iter().zip(&b.node_configs)).all(|(x, y)| Arc::ptr_eq(x, y)));
        assert_eq!(a.undecodable, b.undecodable);
    }

    fn versioned<K: Resource>(mut o: K, uid: &str, rv: &str) -> Arc<K> {
        o.meta_mut().uid = Some(uid.into());
        o.meta_mut().resource_version = Some(rv.into());
        Arc::new(o)
    }

    fn revision(name: &str, rv: &str) -> Arc<NetworkConfigRevision> {
        let spec = serde_json::from_value(serde_json::json!({"hash": "h", "sequence": 1}))
            .expect("a revision spec");
        versioned(NetworkConfigRevision::new(name, spec), name, rv)
    }

    fn inputs(name: &str, rv: &str) -> Arc<NetworkConfigInputs> {
        versioned(
            NetworkConfigInputs::new(name, RevisionInputs::default()),
            name,
            rv,
        )
    }

    /// What the API server answers replaces what the cache holds of a revision and its inputs: inputs
    /// the cache missed are added, a revision gone is removed; the same versions give no new snapshot.
    #[test]
    fn fresh_revisions_replace_the_cached_ones_only_where_they_differ() {
        let s = Snapshot {
            revisions: vec![revision("r1", "1"), revision("r2", "5")],
            revision_inputs: vec![inputs("r1", "2")],
            ..Snapshot::default()
        };
        let fresh = |name: &str, r: Option<&str>, i: Option<&str>| FreshRevision {
            name: name.into(),
            revision: r.map(|rv| revision(name, rv)),
            inputs: i.map(|rv| inputs(name, rv)),
        };
        assert!(
            s.with_fresh_revisions(&[fresh("r1", Some("1"), Some("2"))])
                .is_none()
        );
        // The inputs' watch is behind: r2's inputs are there.
        let behind = s
            .with_fresh_revisions(&[fresh("r2", Some("5"), Some("6"))])
            .expect("a fresher snapshot");
        assert_eq!(names(&behind.revisions), ["r1", "r2"]);
        assert!(behind.inputs_object("r2").is_some());
        assert_ne!(behind.id, s.id);
        // r2 was deleted, then its inputs; the inputs' deletion arrived first.
        let deleted = s
            .with_fresh_revisions(&[fresh("r2", None, None)])
            .expect("a fresher snapshot");
        assert_eq!(names(&deleted.revisions), ["r1"]);
        assert!(deleted.inputs_object("r1").is_some());
    }

    /// A reconcile reads again only the nodes and node configs the watches saw change, and what it
    /// holds then is what reading the stores whole gives; after a relist it reads them whole.
    #[test]
    fn a_refreshed_snapshot_reads_what_changed_and_equals_one_taken_whole() {
        let mut w = Watches::new();
        w.list(
            vec![node("b", "z1"), node("a", "z1"), node("c", "z2")],
            vec![config("b", "r1"), config("a", "r1"), bad_config("d")],
        );
        let first = Snapshot::take(&w.stores);
        assert_eq!(names(&first.nodes), ["a", "b", "c"], "sorted by name");
        assert_eq!(names(&first.node_configs), ["a", "b"]);
        assert!(first.changed_since(None).is_none(), "taken whole");
        let id = first.id;

        // One node relabelled, one gone, one config changed, one that did not decode now does, one
        // that did now does not.
        w.node(Event::Apply(node("c", "z3")));
        w.node(Event::Delete(node("b", "z1")));
        w.config(Event::Apply(config("a", "r2")));
        w.config(Event::Apply(config("d", "r2")));
        w.config(Event::Apply(bad_config("b")));
        let second = first.refresh(&w.stores);
        let changed = second
            .changed_since(Some(id))
            .expect("refreshed from the first");
        assert_eq!(Vec::from_iter(changed.nodes.clone()), ["b", "c"]);
        assert_eq!(
            Vec::from_iter(changed.node_configs.clone()),
            ["a", "b", "d"]
        );
        assert!(
            second.changed_since(Some(id + 1_000)).is_none(),
            "not from that one"
        );
        let mut by_hand = Snapshot::default();
        by_hand.changed_by_hand(BTreeSet::new(), BTreeSet::new());
        assert!(
            by_hand.changed_since(Some(0)).is_none(),
            "snapshots built by hand all have id 0: none is a base to read changes from"
        );
        same(&second, &Snapshot::take(&w.stores));
        assert_eq!(names(&second.node_configs), ["a", "d"]);
        assert_eq!(
            second.node_config("d").map(|c| c.spec.revision.as_str()),
            Some("r2")
        );
        let bad: Vec<&str> = second
            .undecodable
            .iter()
            .map(|(u, _)| u.name.as_str())
            .collect();
        assert_eq!(bad, ["b"]);

        // Nothing changed: nothing read.
        let id = second.id;
        let third = second.refresh(&w.stores);
        let changed = third.changed_since(Some(id)).expect("refreshed");
        assert!(changed.nodes.is_empty() && changed.node_configs.is_empty());

        // A relist (the watch lost its place): read whole.
        w.list(vec![node("e", "z1")], vec![config("e", "r1")]);
        let id = third.id;
        let fourth = third.refresh(&w.stores);
        assert!(
            fourth.changed_since(Some(id)).is_none(),
            "a relist is read whole"
        );
        same(&fourth, &Snapshot::take(&w.stores));
        assert_eq!(names(&fourth.nodes), ["e"]);
    }
}
