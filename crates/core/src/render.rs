//! Render: all inputs + the nodes (name, labels) → one fully resolved [`NodeConfig`] and its `configHash`
//! per node. Pure and deterministic: the same inputs and nodes in any order give byte-identical output.
//!
//! ```text
//!  RevisionInputs ─┬─ canonical order, compile + dedupe selectors, allocate VRF tables
//!  nodes (labels) ─┴─ project labels onto the keys selectors use; evaluate once per distinct projection
//!                     └─► group nodes selecting the same objects ─► index lists + hash once per group
//!                                                                 ─► BTreeMap<node, RenderedNode>
//! ```
//!
//! Each object is rendered and serialized once. Nodes that select the same objects form a group, and a
//! group is only a list of indices into those shared parts; its `configHash` is computed by feeding the
//! parts' JSON to sha256 in order, without building the config. A [`RenderedNode`] materializes its
//! [`NodeConfig`] on demand. So 5,000 nodes render in well under a second and a few tens of MiB even
//! when every node's config differs.
//!
//! **Device names** (all ≤ 15 bytes when the VRF name is ≤ 12; longer ones are a validation error):
//!
//! | object | device | name |
//! | --- | --- | --- |
//! | VRF `v` | VRF device | `v` |
//! | VRF `v` with a VNI | L3 VNI bridge / VXLAN | `br.v` / `vx.v` |
//! | L2 with VLAN `n` | bridge / VXLAN | `l2.n` / `vx.n` |
//! | VRF `v` with `sbrPrefixes` | local VRF of its source-based routing | `s-v` (table allocated like a VRF's) |
//!
//! **Loopbacks** (`spec.loopbacks`) are the one per-node part of a config: each node selecting the VRF
//! gets one host address of each subnet ([`allocate_loopback`]: a home slot from the node's name,
//! the next free one on a collision), in its `vrfs[].loopbacks`; the agent puts them on the VRF
//! device. Nodes with loopbacks get their `configHash` from their own materialized config.
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
pub(crate) mod mirror;
mod objects;

use std::collections::BTreeMap;
use std::fmt;
use std::io::Write as _;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use netwave_api::features::FeatureSet;
use netwave_api::validate::{parse_host_address, parse_network};
use netwave_api::{
    BgpPeerConfig, Layer2Config, LoopbackConfig, MirrorConfig, MirrorTunnelConfig, NamedBgpPeering,
    NamedLayer2, NamedRoutingTable, NamedUnderlay, NamedVrf, NodeConfig, PrefixItem,
    RevisionInputs, RouteConfig, RuleConfig, SbrConfig, UnderlayConfig, VrfConfig, VrfLoopback,
};
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::selector::SelectorError;
use index::Index;
pub use mirror::tunnel_device;
pub use objects::{
    InputKind, InputRef, NodeInfo, TABLE_ALLOC_BASE, TABLE_ALLOC_SIZE, layer2_bridge_name,
    layer2_vxlan_name, sbr_vrf_name, vrf_bridge_name, vrf_vxlan_name,
};

/// The version of this rendering. Bump it in the change that makes the same inputs render to other
/// node configs (golden: `tests/render_version.rs`, which fails until it is bumped): a revision records
/// the version it was cut for (`RevisionInputs::render_version`), and a configurator renders only
/// revisions of its own version. One whose rendering differs therefore cuts a new revision for the same
/// inputs, which rolls out in waves under the gate, and never rewrites the node configs of an existing
/// revision in place (#46).
pub const RENDER_VERSION: u32 = 1;

/// The render version a revision's inputs were cut for (none recorded: 1, the first).
pub fn render_version_of(inputs: &RevisionInputs) -> u32 {
    inputs.render_version.unwrap_or(1)
}

/// `inputs` marked as cut for render version `version`: what a configurator of that version folds the
/// live inputs into, so that its revisions hash (and are named) apart from those of other versions.
/// Version 1 is recorded as nothing, so revisions cut before versions existed keep their hash.
pub fn stamp_render_version(inputs: &mut RevisionInputs, version: u32) {
    inputs.render_version = (version != 1).then_some(version);
}

/// MTU of a VRF's layer-3 VXLAN devices when `spec.mtu` is omitted.
pub const DEFAULT_VRF_MTU: u32 = 9000;
/// Priority of the policy rules of `sbrPrefixes` (das-schiff-network-operator's): before the kernel's
/// `main` rule (32766), so a listed source never reaches the main table's routes first.
pub const SBR_RULE_PRIORITY: u32 = 100;

/// One node's rendered config: its [`config_hash`] now, the [`NodeConfig`] itself on demand.
///
/// Rendering keeps every object's config once, shared by all nodes, plus per group of equal nodes the
/// list of parts it has. A 5,000-node fleet where every node differs then costs tens of MiB instead of
/// a full config per node; the configurator materializes a config only when it writes a
/// NodeNetworkConfig. Two `RenderedNode`s are equal when their hashes are (equal sha256 of the
/// canonical JSON means equal configs).
#[derive(Clone)]
pub struct RenderedNode {
    pub config_hash: String,
    parts: Arc<Parts>,
    selection: Arc<Selection>,
    /// This node's own loopback addresses, by VRF part: the one per-node piece of a config.
    loopbacks: Vec<(u32, Vec<LoopbackConfig>)>,
    /// This node's mirror tunnels and mirrors (they use its loopback addresses, so they are per node).
    mirrors: (Vec<MirrorTunnelConfig>, Vec<MirrorConfig>),
}

impl RenderedNode {
    /// The node's full desired config (clones the shared parts).
    pub fn config(&self) -> NodeConfig {
        let (p, s) = (&*self.parts, &*self.selection);
        let mut vrfs: Vec<VrfConfig> = s.vrfs.iter().map(|&i| p.vrfs[i as usize].clone()).collect();
        for (part, loopbacks) in &self.loopbacks {
            if let Some(k) = s.vrfs.iter().position(|i| i == part) {
                vrfs[k].loopbacks = loopbacks.clone();
            }
        }
        NodeConfig {
            vrfs,
            layer2s: s.l2s.iter().map(|&i| p.l2s[i as usize].clone()).collect(),
            routes: s
                .routes
                .iter()
                .map(|&i| p.routes[i as usize].clone())
                .collect(),
            rules: s
                .rules
                .iter()
                .map(|&i| p.rules[i as usize].clone())
                .collect(),
            bgp_peers: s
                .peers
                .iter()
                .map(|&i| p.peers[i as usize].clone())
                .collect(),
            mirror_tunnels: self.mirrors.0.clone(),
            mirrors: self.mirrors.1.clone(),
            underlay: s.underlay.map(|i| p.underlays[i as usize].clone()),
        }
    }
}

/// The lists of `spec.config` whose items [`RenderedNode::needs`] asks about: every field a feature
/// covers must lie under one of them (a test holds them together).
pub const FEATURE_LISTS: [&str; 8] = [
    "vrfs",
    "vrfs[].loopbacks",
    "layer2s",
    "routes",
    "rules",
    "bgpPeers",
    "mirrorTunnels",
    "mirrors",
];

/// The fields of `spec.config` that are one object, not a list, whose features [`RenderedNode::needs`]
/// asks about (a test holds every feature's field in one of these or of [`FEATURE_LISTS`]).
pub const FEATURE_OBJECTS: [&str; 1] = ["underlay"];

impl RenderedNode {
    /// The agent features [`RenderedNode::config`] needs (`netwave_api::features`), from each part's,
    /// worked out once per render, without building the config (the configurator asks this of every
    /// node of every render). A test holds it equal to `FeatureSet::needed_by(&config())`.
    pub fn needs(&self) -> FeatureSet {
        let (p, s) = (&*self.parts, &*self.selection);
        let of = |sel: &[u32], needs: &[FeatureSet]| {
            (sel.iter()).fold(FeatureSet::NONE, |acc, &i| acc.union(needs[i as usize]))
        };
        let mut needs = of(&s.vrfs, &p.vrf_needs)
            .union(of(&s.l2s, &p.l2_needs))
            .union(of(&s.routes, &p.route_needs))
            .union(of(&s.rules, &p.rule_needs))
            .union(of(&s.peers, &p.peer_needs))
            .union(of(s.underlay.as_slice(), &p.underlay_needs));
        for (_, loopbacks) in &self.loopbacks {
            for l in loopbacks {
                needs = needs.union(FeatureSet::needed_by_item("vrfs[].loopbacks", l));
            }
        }
        for t in &self.mirrors.0 {
            needs = needs.union(FeatureSet::needed_by_item("mirrorTunnels", t));
        }
        for m in &self.mirrors.1 {
            needs = needs.union(FeatureSet::needed_by_item("mirrors", m));
        }
        needs
    }
}

impl PartialEq for RenderedNode {
    fn eq(&self, other: &Self) -> bool {
        self.config_hash == other.config_hash
    }
}

impl Eq for RenderedNode {}

impl fmt::Debug for RenderedNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RenderedNode")
            .field("config_hash", &self.config_hash)
            .field("vrfs", &self.selection.vrfs.len())
            .field("layer2s", &self.selection.l2s.len())
            .field("routes", &self.selection.routes.len())
            .field("rules", &self.selection.rules.len())
            .field("bgp_peers", &self.selection.peers.len())
            .finish()
    }
}

/// Every object's rendered part, in output order, with its canonical JSON and the selectors that put
/// it on a node.
struct Parts {
    vrfs: Vec<VrfConfig>,
    /// `spec.loopbacks` of each VRF part (its per-node addresses are allocated in [`render`]).
    vrf_loopbacks: Vec<Vec<VrfLoopback>>,
    l2s: Vec<Layer2Config>,
    /// Distinct routes and rules of all RoutingTables; identical ones from several tables are one entry.
    routes: Vec<RouteConfig>,
    rules: Vec<RuleConfig>,
    /// BGPPeerings, by name.
    peers: Vec<BgpPeerConfig>,
    /// Underlays, by name.
    underlays: Vec<UnderlayConfig>,
    /// The agent features each part needs ([`RenderedNode::needs`]).
    vrf_needs: Vec<FeatureSet>,
    l2_needs: Vec<FeatureSet>,
    route_needs: Vec<FeatureSet>,
    rule_needs: Vec<FeatureSet>,
    peer_needs: Vec<FeatureSet>,
    underlay_needs: Vec<FeatureSet>,
    vrf_json: Vec<Vec<u8>>,
    l2_json: Vec<Vec<u8>>,
    route_json: Vec<Vec<u8>>,
    rule_json: Vec<Vec<u8>>,
    peer_json: Vec<Vec<u8>>,
    underlay_json: Vec<Vec<u8>>,
    vrf_sel: Vec<Option<u32>>,
    l2_sel: Vec<Option<u32>>,
    route_sels: Vec<Vec<Option<u32>>>,
    rule_sels: Vec<Vec<Option<u32>>>,
    peer_sel: Vec<Option<u32>>,
    underlay_sel: Vec<Option<u32>>,
}

/// Which parts one group of nodes has, as indices into [`Parts`] (ascending, so in output order).
struct Selection {
    vrfs: Vec<u32>,
    l2s: Vec<u32>,
    routes: Vec<u32>,
    rules: Vec<u32>,
    peers: Vec<u32>,
    /// The first Underlay (by name) that selects these nodes; two is a fleet validation error.
    underlay: Option<u32>,
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
    /// The inputs were cut for another render version ([`RENDER_VERSION`]): their node configs are
    /// what that configurator rendered, which this one cannot reproduce.
    #[error(
        "spec.renderVersion: {recorded}, and this build renders version {RENDER_VERSION}: the node \
         configs of these inputs come from the configurator release that renders version {recorded}"
    )]
    OtherVersion { recorded: u32 },
}

/// Renders every node's config. Inputs cut for another render version are refused
/// ([`RenderError::OtherVersion`]). Every node in `nodes` is in the result (an empty config when nothing
/// selects it). Nodes with the same name are taken once (the first in (name, labels) order).
///
/// Inconsistent inputs (duplicate VLANs, table clashes, …) are rendered as written: deciding whether
/// they may be rolled out is [`crate::fleet::validate`]'s job.
pub fn render(
    inputs: &RevisionInputs,
    nodes: &[NodeInfo],
) -> Result<BTreeMap<String, RenderedNode>, RenderError> {
    let recorded = render_version_of(inputs);
    if recorded != RENDER_VERSION {
        return Err(RenderError::OtherVersion { recorded });
    }
    let index = Index::build(inputs, nodes);
    if let Some((object, errors)) = index.selector_errors.first() {
        return Err(RenderError::InvalidSelector {
            object: object.clone(),
            source: errors[0].clone(),
        });
    }
    let parts = Arc::new(Parts::build(&index));
    let loopbacks = allocate_node_loopbacks(&index, &parts);
    let placements = mirror::placements(&index);
    let mut out = BTreeMap::new();
    for (g, group) in index.groups.iter().enumerate() {
        let mirrored: Vec<(usize, mirror::Resolved)> = placements
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                p.as_ref()
                    .filter(|(_, gs)| gs.contains(&g))
                    .map(|(r, _)| (i, *r))
            })
            .collect();
        let pick = |sels: &[Option<u32>]| -> Vec<u32> {
            (0..sels.len() as u32)
                .filter(|&i| group.has(sels[i as usize]))
                .collect()
        };
        let pick_any = |sels: &[Vec<Option<u32>>]| -> Vec<u32> {
            (0..sels.len() as u32)
                .filter(|&i| sels[i as usize].iter().any(|&s| group.has(s)))
                .collect()
        };
        let selection = Arc::new(Selection {
            vrfs: pick(&parts.vrf_sel),
            l2s: pick(&parts.l2_sel),
            routes: pick_any(&parts.route_sels),
            rules: pick_any(&parts.rule_sels),
            peers: pick(&parts.peer_sel),
            underlay: pick(&parts.underlay_sel).first().copied(),
        });
        let config_hash = parts.hash(&selection);
        for &n in &group.nodes {
            let name = &index.nodes[n as usize].name;
            let mut node = RenderedNode {
                config_hash: config_hash.clone(),
                parts: Arc::clone(&parts),
                selection: Arc::clone(&selection),
                loopbacks: loopbacks.get(name).cloned().unwrap_or_default(),
                mirrors: (Vec::new(), Vec::new()),
            };
            node.mirrors = node_mirrors(&index, &parts, &node.loopbacks, &mirrored);
            if !node.loopbacks.is_empty() || !node.mirrors.1.is_empty() {
                // Its config differs from its group's: hash the materialized one.
                node.config_hash = config_hash_of(&node.config());
            }
            out.insert(name.clone(), node);
        }
    }
    Ok(out)
}

/// [`FeatureSet::needed_by_item`] of every item of `list`.
fn item_needs<T: serde::Serialize>(list: &str, items: &[T]) -> Vec<FeatureSet> {
    items
        .iter()
        .map(|item| FeatureSet::needed_by_item(list, item))
        .collect()
}

impl Parts {
    fn build(index: &Index) -> Self {
        // VRFs by name and layer-2s by VLAN; ties (validation errors) keep canonical object order.
        // ((config, its spec's loopbacks), selector)
        type VrfPart = ((VrfConfig, Vec<VrfLoopback>), Option<u32>);
        let mut vrfs: Vec<VrfPart> = index
            .vrfs
            .iter()
            .zip(&index.vrf_tables)
            .zip(&index.sbr_tables)
            .zip(&index.vrf_sel)
            .map(|(((v, &table), &sbr), &sel)| {
                ((vrf_config(v, table, sbr), v.spec.loopbacks.clone()), sel)
            })
            .collect();
        // Stable: same-named VRFs (a validation error) keep canonical object order.
        vrfs.sort_by(|a, b| a.0.0.name.cmp(&b.0.0.name));
        let mut l2s: Vec<(Layer2Config, Option<u32>)> = index
            .l2s
            .iter()
            .zip(&index.l2_sel)
            .map(|(l, &sel)| (layer2_config(l), sel))
            .collect();
        l2s.sort_by_key(|(l, _)| l.vlan);
        let mut routes: BTreeMap<RouteConfig, Vec<Option<u32>>> = BTreeMap::new();
        let mut rules: BTreeMap<RuleConfig, Vec<Option<u32>>> = BTreeMap::new();
        for (rt, &sel) in index.rts.iter().zip(&index.rt_sel) {
            let (rt_routes, rt_rules) = table_config(rt);
            for r in rt_routes {
                routes.entry(r).or_default().push(sel);
            }
            for r in rt_rules {
                rules.entry(r).or_default().push(sel);
            }
        }
        let (vrfs, vrf_sel): (Vec<_>, Vec<_>) = vrfs.into_iter().unzip();
        let (vrfs, vrf_loopbacks): (Vec<_>, Vec<_>) = vrfs.into_iter().unzip();
        let (l2s, l2_sel): (Vec<_>, Vec<_>) = l2s.into_iter().unzip();
        let (routes, route_sels): (Vec<_>, Vec<_>) = routes.into_iter().unzip();
        let (rules, rule_sels): (Vec<_>, Vec<_>) = rules.into_iter().unzip();
        // Canonical object order is by name, and names are unique per kind: already sorted.
        let (peers, peer_sel): (Vec<_>, Vec<_>) = index
            .peerings
            .iter()
            .zip(&index.peering_sel)
            .map(|(p, &sel)| (bgp_peer_config(p, &index.l2s), sel))
            .unzip();
        let underlays: Vec<UnderlayConfig> =
            index.underlays.iter().map(|u| underlay_config(u)).collect();
        Parts {
            underlay_needs: (underlays.iter())
                .map(|u| {
                    FeatureSet::needed_by(&NodeConfig {
                        underlay: Some(u.clone()),
                        ..NodeConfig::default()
                    })
                })
                .collect(),
            underlay_json: underlays.iter().map(to_json).collect(),
            underlay_sel: index.underlay_sel.clone(),
            underlays,
            vrf_needs: item_needs("vrfs", &vrfs),
            l2_needs: item_needs("layer2s", &l2s),
            route_needs: item_needs("routes", &routes),
            rule_needs: item_needs("rules", &rules),
            peer_needs: item_needs("bgpPeers", &peers),
            vrf_json: vrfs.iter().map(to_json).collect(),
            l2_json: l2s.iter().map(to_json).collect(),
            route_json: routes.iter().map(to_json).collect(),
            rule_json: rules.iter().map(to_json).collect(),
            peer_json: peers.iter().map(to_json).collect(),
            vrfs,
            vrf_loopbacks,
            l2s,
            routes,
            rules,
            vrf_sel,
            l2_sel,
            route_sels,
            rule_sels,
            peers,
            peer_sel,
        }
    }

    /// [`config_hash`] of the selection's config without building it: the hasher is fed the very bytes
    /// `serde_json` writes for a `NodeConfig` (`{"vrfs":[…],"layer2s":[…],"routes":[…],"rules":[…]}`),
    /// from each part's JSON serialized once. A test holds this equal to `config_hash(&config())`.
    fn hash(&self, s: &Selection) -> String {
        let mut h = Sha256::new();
        hash_list(&mut h, b"{\"vrfs\":[", &s.vrfs, &self.vrf_json);
        hash_list(&mut h, b",\"layer2s\":[", &s.l2s, &self.l2_json);
        hash_list(&mut h, b",\"routes\":[", &s.routes, &self.route_json);
        hash_list(&mut h, b",\"rules\":[", &s.rules, &self.rule_json);
        // `bgpPeers` is left out of the JSON when empty.
        if !s.peers.is_empty() {
            hash_list(&mut h, b",\"bgpPeers\":[", &s.peers, &self.peer_json);
        }
        // `mirrorTunnels` and `mirrors` are per node (a node with them is hashed from its config);
        // `underlay` is left out when no Underlay selects the node.
        if let Some(u) = s.underlay {
            h.update(b",\"underlay\":");
            h.update(&self.underlay_json[u as usize]);
        }
        h.update(b"}");
        hex::encode(h.finalize())
    }
}

fn to_json<T: serde::Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("netwave API types always serialize to JSON")
}

fn hash_list(h: &mut Sha256, open: &[u8], ids: &[u32], json: &[Vec<u8>]) {
    h.update(open);
    for (k, &i) in ids.iter().enumerate() {
        if k > 0 {
            h.update(b",");
        }
        h.update(&json[i as usize]);
    }
    h.update(b"]");
}

/// Hex sha256 of the JSON serialization of `config` (struct fields in declaration order, lists in the
/// order given — [`render`] emits them canonically). Equal hashes mean equal kernel state; the agent
/// and the configurator both call this.
pub fn config_hash(config: &NodeConfig) -> String {
    config_hash_of(config)
}

fn config_hash_of(config: &NodeConfig) -> String {
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

fn vrf_config(v: &NamedVrf, table: u32, sbr_table: Option<u32>) -> VrfConfig {
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
        sbr: sbr_table.map(|table| SbrConfig {
            device: sbr_vrf_name(&s.vrf),
            table,
            priority: SBR_RULE_PRIORITY,
            prefixes: sorted_networks(&s.sbr_prefixes, parse_network),
        }),
        loopbacks: Vec::new(),
    }
}

/// A BGPPeering as its nodes get it. `peeringVlan` resolves to the segment's VRF and its gateway
/// subnets (the first segment object of that name in canonical order; a missing one, or one without a
/// VRF, is a validation error and renders as a peering with no listen range).
fn bgp_peer_config(p: &NamedBgpPeering, l2s: &[&NamedLayer2]) -> BgpPeerConfig {
    let s = &p.spec;
    let segment = s
        .peering_vlan
        .as_ref()
        .and_then(|v| l2s.iter().find(|l| l.name == v.name));
    let listen_ranges = segment.map_or_else(Vec::new, |l| {
        let subnets: Vec<String> = l
            .spec
            .anycast_gateways
            .iter()
            .map(|g| parse_host_address(g).map_or_else(|_| g.clone(), |n| n.trunc().to_string()))
            .collect();
        sorted_networks(&subnets, parse_network)
    });
    let addresses = s.loopback_peer.as_ref().map_or_else(Vec::new, |lo| {
        let mut a: Vec<(Option<IpAddr>, String)> = lo
            .ip_addresses
            .iter()
            .map(|ip| match ip.parse::<IpAddr>() {
                Ok(addr) => (Some(addr), addr.to_string()),
                Err(_) => (None, ip.clone()),
            })
            .collect();
        a.sort_by(|x, y| (x.0.is_none(), x).cmp(&(y.0.is_none(), y)));
        a.dedup();
        a.into_iter().map(|(_, t)| t).collect()
    });
    let timers = netwave_api::validate::bgp_peering_timers(s);
    BgpPeerConfig {
        name: p.name.clone(),
        vrf: segment.and_then(|l| l.spec.vrf.clone()),
        listen_ranges,
        addresses,
        remote_asn: s.remote_asn,
        bfd: s.enable_bfd,
        maximum_prefixes: s.maximum_prefixes,
        hold_time: timers.map(|t| t.0),
        keepalive_time: timers.map(|t| t.1),
        import: canonical_prefix_list(&s.import),
        export: canonical_prefix_list(&s.export),
    }
}

/// An Underlay as a node's config carries it: as written (fleet validation checked it).
pub(crate) fn underlay_config(u: &NamedUnderlay) -> UnderlayConfig {
    UnderlayConfig {
        name: u.name.clone(),
        asn: u.spec.asn,
        neighbors: u.spec.neighbors.clone(),
        timers: u.spec.timers,
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
        route_target: s.route_target.clone(),
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
            fwmark: rule.fwmark,
            fwmask: crate::dataplane::canonical_fwmask(rule.fwmark, rule.fwmask),
        })
        .collect();
    (routes, rules)
}

/// Host addresses a loopback subnet has for nodes: all but IPv4's network and broadcast address and
/// IPv6's subnet-router anycast address (a /31, /32 or /128 has no such address to skip). Capped at
/// 2^64, more than any fleet has nodes.
pub fn loopback_capacity(subnet: &IpNet) -> u128 {
    let host_bits = u32::from(subnet.max_prefix_len() - subnet.prefix_len()).min(64);
    let all = 1u128 << host_bits;
    match (subnet, host_bits) {
        (_, 0) => 1,
        (IpNet::V4(_), 1) => 2,
        (IpNet::V4(_), _) => all - 2,
        (IpNet::V6(_), _) => all - 1,
    }
}

/// Per-node addresses of one loopback of VRF `vrf` for `nodes` (any order): each node's *home slot* is
/// `sha256("<vrf>/<loopback>/<node>") mod capacity`; nodes in name order take their home slot or the next
/// free one. So an address depends only on the VRF and loopback name, the subnet and the node's name:
/// other revisions keep it, and a node joining or leaving moves another node only when their slots
/// collide. Nodes beyond the capacity get none (fleet validation reports that as an error).
pub fn allocate_loopback(
    vrf: &str,
    loopback: &str,
    subnet: &IpNet,
    nodes: &[&str],
) -> BTreeMap<String, IpNet> {
    let capacity = loopback_capacity(subnet);
    let first: u128 = match (subnet, capacity) {
        (_, 1) => 0,
        (IpNet::V4(n), 2) if n.prefix_len() == 31 => 0,
        _ => 1,
    };
    let base: u128 = match subnet.network() {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    };
    let mut sorted: Vec<&str> = nodes.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut used: std::collections::BTreeSet<u128> = std::collections::BTreeSet::new();
    let mut out = BTreeMap::new();
    for node in sorted {
        if used.len() as u128 >= capacity {
            break;
        }
        let digest = Sha256::digest(format!("{vrf}/{loopback}/{node}").as_bytes());
        let mut head = [0u8; 16];
        head.copy_from_slice(&digest[..16]);
        let mut slot = u128::from_be_bytes(head) % capacity;
        while used.contains(&slot) {
            slot = (slot + 1) % capacity;
        }
        used.insert(slot);
        let value = base + first + slot;
        let address = match subnet {
            IpNet::V4(_) => IpNet::new(IpAddr::V4((value as u32).into()), 32),
            IpNet::V6(_) => IpNet::new(IpAddr::V6(value.into()), 128),
        }
        .expect("a host prefix length is valid");
        out.insert(node.to_string(), address);
    }
    out
}

/// Every node's loopback addresses: per VRF part with `loopbacks`, the nodes that select it.
fn allocate_node_loopbacks(
    index: &Index,
    parts: &Parts,
) -> BTreeMap<String, Vec<(u32, Vec<LoopbackConfig>)>> {
    let mut out: BTreeMap<String, Vec<(u32, Vec<LoopbackConfig>)>> = BTreeMap::new();
    for (part, specs) in parts.vrf_loopbacks.iter().enumerate() {
        if specs.is_empty() {
            continue;
        }
        let groups = (0..index.groups.len()).filter(|&g| index.groups[g].has(parts.vrf_sel[part]));
        let names = index.node_names(groups);
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let vrf = &parts.vrfs[part].name;
        let mut per_node: BTreeMap<&str, Vec<LoopbackConfig>> = BTreeMap::new();
        for lb in specs {
            // An unparsable subnet is a validation error; its nodes get no address from it.
            let Ok(subnet) = parse_network(&lb.subnet) else {
                continue;
            };
            for (node, address) in allocate_loopback(vrf, &lb.name, &subnet, &names) {
                let node = names[names
                    .binary_search(&node.as_str())
                    .expect("allocated to a node")];
                per_node.entry(node).or_default().push(LoopbackConfig {
                    name: lb.name.clone(),
                    subnet: subnet.to_string(),
                    address: address.to_string(),
                });
            }
        }
        for (node, mut lbs) in per_node {
            lbs.sort();
            lbs.dedup();
            out.entry(node.to_string())
                .or_default()
                .push((part as u32, lbs));
        }
    }
    out
}

/// A node's mirror tunnels and mirrors: for each selector placed on its group, the target's tunnel
/// from the node's address of the target's loopback (a node without one, beyond the loopback's
/// capacity, gets none: a validation error) and the selector itself. Tunnels by target name, mirrors
/// by selector name (the index's order).
fn node_mirrors(
    index: &Index,
    parts: &Parts,
    loopbacks: &[(u32, Vec<LoopbackConfig>)],
    placed: &[(usize, mirror::Resolved)],
) -> (Vec<MirrorTunnelConfig>, Vec<MirrorConfig>) {
    let mut tunnels: BTreeMap<&str, MirrorTunnelConfig> = BTreeMap::new();
    let mut mirrors = Vec::new();
    for &(i, r) in placed {
        let target = index.mirror_targets[r.target];
        let t = &target.spec;
        let local = loopbacks
            .iter()
            .filter(|(part, _)| parts.vrfs[*part as usize].name == t.destination_vrf)
            .flat_map(|(_, lbs)| lbs)
            .find(|lb| lb.name == t.source_loopback)
            .and_then(|lb| lb.address.parse::<IpNet>().ok());
        let Some(local) = local else {
            continue;
        };
        let device = mirror::tunnel_device(&target.name, t.kind);
        tunnels
            .entry(target.name.as_str())
            .or_insert_with(|| MirrorTunnelConfig {
                name: target.name.clone(),
                device: device.clone(),
                kind: t.kind,
                vrf: t.destination_vrf.clone(),
                local: local.addr().to_string(),
                remote: canonical_ip(&t.destination_ip),
                key: t.key,
            });
        let s = &index.mirror_selectors[i];
        let (vlan, vrf) = match r.source {
            mirror::Source::Layer2(l) => (Some(index.l2s[l].spec.id), None),
            mirror::Source::Vrf(v) => (None, Some(index.vrfs[v].spec.vrf.clone())),
        };
        mirrors.push(MirrorConfig {
            name: s.name.clone(),
            vlan,
            vrf,
            direction: s.spec.direction,
            tunnel: device,
            traffic_match: s.spec.traffic_match.clone(),
        });
    }
    (tunnels.into_values().collect(), mirrors)
}
