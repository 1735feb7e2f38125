//! What moving nodes to a rendering takes off them (#48 item 3): the hold measured on the configs the
//! nodes run, not only on the inputs.
//!
//! [`super::hold`] compares two revisions' footprints, both computed from the Node labels of now. A
//! change of the labels themselves is invisible to it: dropping a pool label from every node re-renders
//! the same revision for every node with nothing on it, and a revision cut at the same time looks no
//! more destructive than its inputs. So the step also measures each move it may make onto the target,
//! config against config:
//!
//! ```text
//!   per node the target moves (spec config ≠ target rendering):
//!     items of the config it runs − items of the rendering = what it loses
//!   lost / items the whole fleet runs > threshold (or everything) ─► the target is held
//! ```
//!
//! An *item* is one thing a node runs, by identity ([`config_items`]): a VRF with its VNI, a layer-2
//! segment with its VLAN and VNI, a routing table (its routes and rules together, as the input hold
//! counts a RoutingTable as one object), a BGP session, a mirror and its tunnel. A VRF whose VNI
//! changes loses the old item and gains a new one: an identity change counts as removing what it
//! replaces. So does a table whose every route becomes a blackhole or unreachable: it delivers
//! nothing any more (`table/5 (drops all)` is not `table/5`).
//!
//! The hold is the same as an input hold (`spec.paused` and the annotations, approved by resuming the
//! revision), with the rendering's digest as its basis: an approval covers this rendering, through
//! every wave of it; another label change makes another rendering, measured again.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use netwave_api::{NodeConfig, RouteType};
use sha2::{Digest, Sha256};

use crate::sym::Sym;

/// Nodes a [`MoveLoss`] names before "and N more".
const NAMED_NODES: usize = 3;
/// Items named per node.
const NAMED_ITEMS: usize = 4;

/// What the nodes would lose if moved to one revision's rendering ([`MoveLoss::measure`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MoveLoss {
    /// Identifies the rendering the nodes would be moved to: the hold's basis.
    pub basis: String,
    /// Nodes that would lose at least one item.
    pub nodes: usize,
    /// Items those nodes would lose.
    pub lost: u64,
    /// Items the whole fleet runs now.
    pub items: u64,
    /// The first nodes that lose something, with the first items each loses.
    pub examples: Vec<(String, Vec<String>)>,
}

/// One node's move: the items it runs and the items the rendering gives it.
pub struct Move<'a> {
    pub node: &'a str,
    pub runs: &'a BTreeSet<String>,
    pub gets: &'a BTreeSet<String>,
}

impl MoveLoss {
    /// `items`: how many items the fleet runs; `moves`: the nodes whose config would change, sorted by
    /// name; `basis`: names the rendering.
    pub fn measure<'a>(
        basis: String,
        items: u64,
        moves: impl IntoIterator<Item = Move<'a>>,
    ) -> MoveLoss {
        let mut loss = MoveLoss {
            basis,
            items,
            ..MoveLoss::default()
        };
        for m in moves {
            let mut lost: Vec<&String> = m.runs.difference(m.gets).collect();
            // Tenant networks first: what an admin reads the hold for.
            lost.sort_by_key(|item| (rank(item), *item));
            if lost.is_empty() {
                continue;
            }
            loss.nodes += 1;
            loss.lost += lost.len() as u64;
            if loss.examples.len() < NAMED_NODES {
                let named = lost.iter().take(NAMED_ITEMS).map(|s| s.to_string());
                let mut named: Vec<String> = named.collect();
                if lost.len() > NAMED_ITEMS {
                    named.push(format!("and {} more", lost.len() - NAMED_ITEMS));
                }
                loss.examples.push((m.node.to_string(), named));
            }
        }
        loss
    }

    /// The rule of [`super::hold::Removal::exceeds`]: everything the fleet runs, or more than
    /// `threshold_percent` of it.
    pub fn exceeds(&self, threshold_percent: u32) -> bool {
        super::hold::exceeds(self.lost, self.items, threshold_percent)
    }
}

/// `takes 10 of the 10 items the nodes run off 4 node(s) (its rendering for them changed: Node labels
/// or its inputs): node-a loses vrf/blue vni 100, l2/vlan 10 vni 1010; …`.
impl fmt::Display for MoveLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "takes {} of the {} items the nodes run off {} node(s) (its rendering for them \
             changed: their Node labels or its inputs)",
            self.lost, self.items, self.nodes
        )?;
        let named: Vec<String> = (self.examples.iter())
            .map(|(node, items)| format!("{node} loses {}", items.join(", ")))
            .collect();
        if !named.is_empty() {
            write!(f, ": {}", named.join("; "))?;
        }
        if self.nodes > self.examples.len() {
            write!(f, "; and {} more node(s)", self.nodes - self.examples.len())?;
        }
        Ok(())
    }
}

/// The basis of a hold on a rendering: names the config every node gets from it (`hashes`: node →
/// configHash), so an approval covers this rendering and no other.
pub fn rendering_basis(hashes: &BTreeMap<Sym, Sym>) -> String {
    let mut h = Sha256::new();
    for (node, hash) in hashes {
        h.update(node.as_str().as_bytes());
        h.update([0]);
        h.update(hash.as_str().as_bytes());
        h.update([0]);
    }
    let digest: String = h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("rendering {digest}")
}

/// The order items are named in: VRFs, segments, tables, sessions, mirrors.
fn rank(item: &str) -> usize {
    const KINDS: [&str; 6] = ["vrf/", "l2/", "table/", "bgp/", "mirror-target/", "mirror/"];
    KINDS
        .iter()
        .position(|k| item.starts_with(k))
        .unwrap_or(KINDS.len())
}

/// What a node runs with `config`, item by item, by identity (an item whose identity changes is a
/// removal and an addition).
pub fn config_items(config: &NodeConfig) -> BTreeSet<String> {
    let mut items = BTreeSet::new();
    for v in &config.vrfs {
        let vni = v.vni.map_or(String::new(), |n| format!(" vni {n}"));
        items.insert(format!("vrf/{}{vni}", v.name));
    }
    for l in &config.layer2s {
        items.insert(format!("l2/vlan {} vni {}", l.vlan, l.vni));
    }
    // A routing table is one item, as a RoutingTable is one object to the input hold: a route added,
    // removed or sent elsewhere is an edit, not a loss. What it delivers is part of its identity: a
    // table whose every route became a blackhole or unreachable serves nothing any more, so it loses
    // the table it replaces, like a VNI change.
    let mut tables: BTreeMap<u32, bool> = BTreeMap::new();
    for r in &config.routes {
        *tables.entry(r.table).or_default() |= r.kind == RouteType::Unicast;
    }
    for r in &config.rules {
        tables.entry(r.table).or_default();
    }
    for (table, delivers) in tables {
        let drops = config.routes.iter().any(|r| r.table == table) && !delivers;
        items.insert(if drops {
            format!("table/{table} (drops all)")
        } else {
            format!("table/{table}")
        });
    }
    for p in &config.bgp_peers {
        items.insert(format!("bgp/{}", p.name));
    }
    for t in &config.mirror_tunnels {
        items.insert(format!("mirror-target/{}", t.name));
    }
    for m in &config.mirrors {
        items.insert(format!("mirror/{}", m.name));
    }
    items
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_move_loses_what_the_rendering_lacks_and_an_identity_change_counts() {
        let runs = set(&["vrf/blue vni 100", "l2/vlan 10 vni 1010", "table/5"]);
        let gets = set(&["vrf/blue vni 101", "l2/vlan 10 vni 1010"]);
        let empty = BTreeSet::new();
        let moves = [
            Move {
                node: "a",
                runs: &runs,
                gets: &gets,
            },
            Move {
                node: "b",
                runs: &runs,
                gets: &runs,
            },
            Move {
                node: "c",
                runs: &runs,
                gets: &empty,
            },
        ];
        let loss = MoveLoss::measure("r".into(), 9, moves);
        assert_eq!((loss.nodes, loss.lost, loss.items), (2, 5, 9));
        assert!(loss.exceeds(50), "5 of 9");
        assert!(!loss.exceeds(60));
        let text = loss.to_string();
        assert!(
            text.contains(
                "a loses vrf/blue vni 100, table/5; c loses vrf/blue vni 100, l2/vlan 10"
            ),
            "{text}"
        );
        let nothing = MoveLoss::measure("r".into(), 0, []);
        assert!(
            !nothing.exceeds(0),
            "a fleet that runs nothing loses nothing"
        );
        let all = MoveLoss {
            lost: 3,
            items: 3,
            ..MoveLoss::default()
        };
        assert!(all.exceeds(100), "everything is always held");
    }

    #[test]
    fn a_table_whose_every_route_drops_loses_the_table_but_an_edit_does_not() {
        let route = |prefix: &str, kind| netwave_api::RouteConfig {
            table: 5,
            prefix: prefix.into(),
            via: Some("198.18.0.1".into()),
            dev: None,
            kind,
            metric: None,
        };
        let config = |routes| NodeConfig {
            routes,
            ..NodeConfig::default()
        };
        let serving = config(vec![
            route("198.18.8.0/24", RouteType::Unicast),
            route("198.18.9.0/24", RouteType::Unicast),
        ]);
        let edited = config(vec![
            route("198.18.8.0/24", RouteType::Blackhole),
            route("198.18.10.0/24", RouteType::Unicast),
        ]);
        let dropped = config(vec![
            route("198.18.8.0/24", RouteType::Blackhole),
            route("198.18.9.0/24", RouteType::Unreachable),
        ]);
        let (before, after) = (config_items(&serving), config_items(&edited));
        assert_eq!(before, set(&["table/5"]));
        assert_eq!(
            before, after,
            "a table that still delivers is the same item"
        );
        let drops = config_items(&dropped);
        let lost: Vec<_> = before.difference(&drops).collect();
        assert_eq!(lost, ["table/5"], "every route made a blackhole");
        assert_eq!(drops, set(&["table/5 (drops all)"]));
    }
}
