//! Render: all inputs + the nodes (name, labels) → one fully resolved [`NodeConfig`] and its `configHash`
//! per node. Pure and deterministic: the same inputs and nodes in any order give byte-identical output.
//!
//! ```text
//!  RevisionInputs ─┬─ canonical order, compile + dedupe selectors, allocate VRF tables
//!  nodes (labels) ─┴─ evaluate each distinct selector once per node
//!                     └─► group nodes selecting the same objects ─► render + hash once per group
//!                                                                 ─► BTreeMap<node, RenderedNode>
//! ```
//!
//! Nodes that select the same objects get the *same* `Arc<NodeConfig>`: in a real fleet thousands of nodes
//! share a few hundred distinct configs, so rendering and hashing per group (not per node) keeps 5,000
//! nodes well under a second and the memory flat.
//!
//! **Device names** (all ≤ 15 bytes when the VRF name is ≤ 12; longer ones are a validation error):
//! | object | device | name |
//! | --- | --- | --- |
//! | VRF `v` | VRF device | `v` |
//! | VRF `v` with a VNI | L3 VNI bridge / VXLAN | `br.v` / `vx.v` |
//! | L2 with VLAN `n` | bridge / VXLAN | `l2.n` / `vx.n` |
//!
//! VRF names are free-form, so a VRF named `l2.111`, `br.x` or `111` can clash with a generated name;
//! fleet validation reports such clashes on every node where both objects are (`DeviceNameCollision`).
//!
//! **VRF table ids.** `spec.tableId` when set. Otherwise the *home slot*
//! `TABLE_ALLOC_BASE + (first 8 bytes of sha256(spec.vrf), big-endian) mod TABLE_ALLOC_SIZE`, i.e. an id in
//! 10,000,000..=19,999,999 that depends only on the VRF's own name. If the slot is taken (by an explicit
//! `tableId` of any VRF or RoutingTable, a reserved table, or a VRF earlier in (name, object) order) the
//! next free id is used, wrapping inside the range. So a VRF's table changes only when another object
//! takes its slot; with 200 VRFs in 10 million slots the chance of any clash is about 0.2 %.
//!
//! **Canonical lists.** VRFs by name, layer-2s by VLAN, routes and rules by all their fields (identical
//! duplicates from different RoutingTables merge); import/export items get their effective `seq` and are
//! sorted by it; aggregates, communities and gateways are sorted and deduplicated; addresses are
//! printed in their canonical form (`fd00:250:0::1/64` → `fd00:250::1/64`) and MACs in lowercase.

pub(crate) mod index;

use std::collections::BTreeMap;
use std::fmt;
use std::io::Write as _;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use netwave_api::validate::{parse_host_address, parse_network};
use netwave_api::{
    Layer2Config, NamedLayer2, NamedRoutingTable, NamedVrf, NodeConfig, PrefixItem, RevisionInputs,
    RouteConfig, RuleConfig, VrfConfig,
};
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::selector::SelectorError;
use index::Index;

/// MTU of a VRF's layer-3 VXLAN devices when `spec.mtu` is omitted.
pub const DEFAULT_VRF_MTU: u32 = 9000;
/// First table id of the range VRFs without `tableId` are allocated from.
pub const TABLE_ALLOC_BASE: u32 = 10_000_000;
/// Size of that range.
pub const TABLE_ALLOC_SIZE: u32 = 10_000_000;

/// A node as render and validation see it.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct NodeInfo {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

impl NodeInfo {
    pub fn new<K: Into<String>, V: Into<String>>(
        name: impl Into<String>,
        labels: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        NodeInfo {
            name: name.into(),
            labels: labels
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        }
    }
}

/// One node's desired config and its [`config_hash`]. Nodes with equal configs share the `Arc`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderedNode {
    pub config: Arc<NodeConfig>,
    pub config_hash: String,
}

/// Kind of an input object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum InputKind {
    Vrf,
    Layer2,
    RoutingTable,
}

impl InputKind {
    /// The Kubernetes kind.
    pub fn as_str(self) -> &'static str {
        match self {
            InputKind::Vrf => "VRFRouteConfiguration",
            InputKind::Layer2 => "Layer2NetworkConfiguration",
            InputKind::RoutingTable => "RoutingTable",
        }
    }
}

/// An input object, displayed `Kind/name`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InputRef {
    pub kind: InputKind,
    pub name: String,
}

impl InputRef {
    pub fn new(kind: InputKind, name: impl Into<String>) -> Self {
        InputRef {
            kind,
            name: name.into(),
        }
    }
}

impl fmt::Display for InputRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.kind.as_str(), self.name)
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RenderError {
    /// An object's `nodeSelector` is invalid, so which nodes get it is unknown. Fleet validation reports
    /// the same problem as an error, so a validated revision never hits this.
    #[error("{object} spec.nodeSelector.{source}")]
    InvalidSelector {
        object: InputRef,
        #[source]
        source: SelectorError,
    },
}

/// Renders every node's config. Every node in `nodes` is in the result (an empty config when nothing
/// selects it). Nodes with the same name are taken once (the first in (name, labels) order).
///
/// Inconsistent inputs (duplicate VLANs, table clashes, …) are rendered as written: deciding whether
/// they may be rolled out is [`crate::fleet::validate`]'s job.
pub fn render(
    inputs: &RevisionInputs,
    nodes: &[NodeInfo],
) -> Result<BTreeMap<String, RenderedNode>, RenderError> {
    let index = Index::build(inputs, nodes);
    if let Some((object, errors)) = index.selector_errors.first() {
        return Err(RenderError::InvalidSelector {
            object: object.clone(),
            source: errors[0].clone(),
        });
    }
    let vrfs: Vec<VrfConfig> = index
        .vrfs
        .iter()
        .zip(&index.vrf_tables)
        .map(|(v, &table)| vrf_config(v, table))
        .collect();
    let l2s: Vec<Layer2Config> = index.l2s.iter().map(|l| layer2_config(l)).collect();
    let rts: Vec<(Vec<RouteConfig>, Vec<RuleConfig>)> =
        index.rts.iter().map(|r| table_config(r)).collect();
    // Emit VRFs by name and layer-2s by VLAN without sorting per group (stable: ties keep object order).
    let mut vrf_order: Vec<usize> = (0..vrfs.len()).collect();
    vrf_order.sort_by(|&a, &b| vrfs[a].name.cmp(&vrfs[b].name));
    let mut l2_order: Vec<usize> = (0..l2s.len()).collect();
    l2_order.sort_by_key(|&i| l2s[i].vlan);

    let mut out = BTreeMap::new();
    for group in &index.groups {
        let mut config = NodeConfig::default();
        for &i in &vrf_order {
            if group.has(index.vrf_sel[i]) {
                config.vrfs.push(vrfs[i].clone());
            }
        }
        for &i in &l2_order {
            if group.has(index.l2_sel[i]) {
                config.layer2s.push(l2s[i].clone());
            }
        }
        for (i, (routes, rules)) in rts.iter().enumerate() {
            if group.has(index.rt_sel[i]) {
                config.routes.extend_from_slice(routes);
                config.rules.extend_from_slice(rules);
            }
        }
        config.routes.sort();
        config.routes.dedup();
        config.rules.sort();
        config.rules.dedup();
        let config_hash = config_hash(&config);
        let config = Arc::new(config);
        for &n in &group.nodes {
            out.insert(
                index.nodes[n as usize].name.clone(),
                RenderedNode {
                    config: Arc::clone(&config),
                    config_hash: config_hash.clone(),
                },
            );
        }
    }
    Ok(out)
}

/// Hex sha256 of the JSON serialization of `config` (struct fields in declaration order, lists in the
/// order given — [`render`] emits them canonically). Equal hashes mean equal kernel state; the agent
/// and the configurator both call this.
pub fn config_hash(config: &NodeConfig) -> String {
    let mut hasher = Sha256::new();
    {
        // serde_json writes many tiny pieces; batch them before they reach the hasher.
        let mut w = std::io::BufWriter::with_capacity(16 * 1024, &mut hasher);
        serde_json::to_writer(&mut w, config).expect("a NodeConfig always serializes to JSON");
        w.flush().expect("writing into a hasher cannot fail");
    }
    hex::encode(hasher.finalize())
}

/// The table id of every VRF object (by object name): its `tableId` or the allocated one (see the module
/// docs). If two objects share a name, the first in canonical order is reported.
pub fn vrf_tables(inputs: &RevisionInputs) -> BTreeMap<String, u32> {
    let vrfs = crate::revision::canonical_refs(&inputs.vrfs, |o| &o.name);
    let rts = crate::revision::canonical_refs(&inputs.routing_tables, |o| &o.name);
    let tables = index::allocate_tables(&vrfs, &rts);
    let mut out = BTreeMap::new();
    for (v, t) in vrfs.iter().zip(tables) {
        out.entry(v.name.clone()).or_insert(t);
    }
    out
}

/// Bridge of a VRF's layer-3 VNI.
pub fn vrf_bridge_name(vrf: &str) -> String {
    format!("br.{vrf}")
}
/// VXLAN device of a VRF's layer-3 VNI.
pub fn vrf_vxlan_name(vrf: &str) -> String {
    format!("vx.{vrf}")
}
/// Bridge of a layer-2 segment.
pub fn layer2_bridge_name(vlan: u16) -> String {
    format!("l2.{vlan}")
}
/// VXLAN device of a layer-2 segment.
pub fn layer2_vxlan_name(vlan: u16) -> String {
    format!("vx.{vlan}")
}

fn canonical_network(s: &str) -> String {
    parse_network(s).map_or_else(|_| s.to_string(), |n| n.to_string())
}

fn canonical_ip(s: &str) -> String {
    s.parse::<IpAddr>()
        .map_or_else(|_| s.to_string(), |a| a.to_string())
}

fn canonical_prefix_list(items: &[PrefixItem]) -> Vec<PrefixItem> {
    let mut out: Vec<PrefixItem> = items
        .iter()
        .enumerate()
        .map(|(i, item)| PrefixItem {
            cidr: canonical_network(&item.cidr),
            // Positions are 1-based list indices; a list longer than u32::MAX cannot be stored.
            seq: Some(u32::try_from(item.effective_seq(i)).unwrap_or(u32::MAX)),
            ..item.clone()
        })
        .collect();
    // Evaluation order is by sequence number; the rest only breaks ties (a validation error) stably.
    out.sort_by(|a, b| a.seq.cmp(&b.seq).then_with(|| a.cmp(b)));
    out
}

fn sorted_set(items: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut v: Vec<String> = items.into_iter().collect();
    v.sort();
    v.dedup();
    v
}

/// Canonical text of each network, sorted IPv4 before IPv6 and by address, deduplicated. Unparsable
/// entries (a validation error) go last, as written.
fn sorted_networks(items: &[String], parse: fn(&str) -> Result<IpNet, String>) -> Vec<String> {
    let mut nets: Vec<(Option<IpNet>, String)> = items
        .iter()
        .map(|g| match parse(g) {
            Ok(n) => (Some(n), n.to_string()),
            Err(_) => (None, g.clone()),
        })
        .collect();
    nets.sort_by(|a, b| (a.0.is_none(), a).cmp(&(b.0.is_none(), b)));
    nets.dedup();
    nets.into_iter().map(|(_, g)| g).collect()
}

fn vrf_config(v: &NamedVrf, table: u32) -> VrfConfig {
    let s = &v.spec;
    VrfConfig {
        name: s.vrf.clone(),
        device: s.vrf.clone(),
        table,
        vni: s.vni,
        mtu: s.mtu.unwrap_or(DEFAULT_VRF_MTU),
        bridge: s.vni.map(|_| vrf_bridge_name(&s.vrf)),
        vxlan: s.vni.map(|_| vrf_vxlan_name(&s.vrf)),
        route_target: s.route_target.clone(),
        import: canonical_prefix_list(&s.import),
        export: canonical_prefix_list(&s.export),
        aggregate: sorted_networks(&s.aggregate, parse_network),
        communities: sorted_set(s.communities.iter().cloned()),
    }
}

fn layer2_config(l: &NamedLayer2) -> Layer2Config {
    let s = &l.spec;
    Layer2Config {
        vlan: s.id,
        vni: s.vni,
        mtu: s.mtu,
        bridge: layer2_bridge_name(s.id),
        vxlan: layer2_vxlan_name(s.id),
        anycast_mac: s.anycast_mac.as_ref().map(|m| m.to_ascii_lowercase()),
        anycast_gateways: sorted_networks(&s.anycast_gateways, parse_host_address),
        vrf: s.vrf.clone(),
        neigh_suppression: s.neigh_suppression.unwrap_or(false),
    }
}

pub(crate) fn table_config(r: &NamedRoutingTable) -> (Vec<RouteConfig>, Vec<RuleConfig>) {
    let s = &r.spec;
    let routes = s
        .routes
        .iter()
        .map(|route| RouteConfig {
            table: s.table_id,
            prefix: canonical_network(&route.prefix),
            via: route.via.as_deref().map(canonical_ip),
            dev: route.dev.clone(),
            kind: route.kind,
            metric: route.metric,
        })
        .collect();
    let rules = s
        .rules
        .iter()
        .map(|rule| RuleConfig {
            priority: rule.priority,
            table: s.table_id,
            from: rule.from.as_deref().map(canonical_network),
            to: rule.to.as_deref().map(canonical_network),
            iif: rule.iif.clone(),
        })
        .collect();
    (routes, rules)
}
