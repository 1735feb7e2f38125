//! The shared preparation step of render and fleet validation: inputs in canonical order, selectors
//! compiled and deduplicated, VRF tables allocated, and nodes grouped by which objects select them.
//!
//! Grouping is what makes 5,000 nodes cheap: each distinct selector is evaluated once per node, and
//! every later step (render, hash, per-node checks) runs once per *group* of nodes that select exactly
//! the same objects.

use std::collections::{BTreeMap, BTreeSet};

use netwave_api::validate::RESERVED_TABLES;
use netwave_api::{
    NamedBgpPeering, NamedLayer2, NamedMirrorSelector, NamedMirrorTarget, NamedRoutingTable,
    NamedUnderlay, NamedVrf, RevisionInputs,
};
use sha2::{Digest, Sha256};

use super::objects::{
    InputKind, InputRef, NodeInfo, TABLE_ALLOC_BASE, TABLE_ALLOC_SIZE, sbr_vrf_name,
};
use crate::revision::canonical_refs;
use crate::selector::{Selector, SelectorError, SelectorSet};

/// Nodes that select exactly the same set of distinct selectors.
pub(crate) struct Group {
    /// Bit `s` set when distinct selector `s` matches these nodes.
    bits: Vec<u64>,
    /// Indices into [`Index::nodes`], ascending (so in name order).
    pub nodes: Vec<u32>,
}

impl Group {
    /// Whether an object with this selector index is on the group's nodes. Objects with an invalid
    /// selector (`None`) are on no node.
    pub fn has(&self, selector: Option<u32>) -> bool {
        selector.is_some_and(|s| self.bits[(s / 64) as usize] & (1 << (s % 64)) != 0)
    }
}

pub(crate) struct Index<'a> {
    pub vrfs: Vec<&'a NamedVrf>,
    pub l2s: Vec<&'a NamedLayer2>,
    pub rts: Vec<&'a NamedRoutingTable>,
    pub peerings: Vec<&'a NamedBgpPeering>,
    /// MirrorTargets and MirrorSelectors, by name (they have no selector of their own: a selector is
    /// on the nodes that have its source and its target's VRF, see `render::mirror`).
    pub mirror_targets: Vec<&'a NamedMirrorTarget>,
    pub mirror_selectors: Vec<&'a NamedMirrorSelector>,
    pub underlays: Vec<&'a NamedUnderlay>,
    /// Sorted by name, one per name.
    pub nodes: Vec<&'a NodeInfo>,
    /// Distinct selector of each object (parallel to `vrfs`, `l2s`, `rts`); `None` when invalid.
    pub vrf_sel: Vec<Option<u32>>,
    pub l2_sel: Vec<Option<u32>>,
    pub rt_sel: Vec<Option<u32>>,
    pub peering_sel: Vec<Option<u32>>,
    pub underlay_sel: Vec<Option<u32>>,
    /// Table of each VRF, parallel to `vrfs`.
    pub vrf_tables: Vec<u32>,
    /// Table of each VRF's source-based-routing VRF (`s-<vrf>`), parallel to `vrfs`; `None` without
    /// `sbrPrefixes`.
    pub sbr_tables: Vec<Option<u32>>,
    /// Objects whose selector does not compile, in canonical order.
    pub selector_errors: Vec<(InputRef, Vec<SelectorError>)>,
    /// Ordered by their selector results (deterministic; no meaning beyond that).
    pub groups: Vec<Group>,
}

impl<'a> Index<'a> {
    pub fn build(inputs: &'a RevisionInputs, nodes: &'a [NodeInfo]) -> Self {
        let vrfs = canonical_refs(&inputs.vrfs, |o| &o.name);
        let l2s = canonical_refs(&inputs.layer2s, |o| &o.name);
        let rts = canonical_refs(&inputs.routing_tables, |o| &o.name);
        let peerings = canonical_refs(&inputs.bgp_peerings, |o| &o.name);
        let mirror_targets = canonical_refs(&inputs.mirror_targets, |o| &o.name);
        let mirror_selectors = canonical_refs(&inputs.mirror_selectors, |o| &o.name);
        let underlays = canonical_refs(&inputs.underlays, |o| &o.name);

        let mut distinct: BTreeMap<Selector, u32> = BTreeMap::new();
        let mut selector_errors = Vec::new();
        let mut compile = |kind, name: &str, sel| match Selector::parse(sel) {
            Ok(s) => {
                let next = distinct.len() as u32;
                Some(*distinct.entry(s).or_insert(next))
            }
            Err(errors) => {
                selector_errors.push((InputRef::new(kind, name), errors));
                None
            }
        };
        let vrf_sel: Vec<_> = vrfs
            .iter()
            .map(|o| compile(InputKind::Vrf, &o.name, o.spec.node_selector.as_ref()))
            .collect();
        let l2_sel: Vec<_> = l2s
            .iter()
            .map(|o| compile(InputKind::Layer2, &o.name, o.spec.node_selector.as_ref()))
            .collect();
        let rt_sel: Vec<_> = rts
            .iter()
            .map(|o| {
                compile(
                    InputKind::RoutingTable,
                    &o.name,
                    o.spec.node_selector.as_ref(),
                )
            })
            .collect();
        let peering_sel: Vec<_> = peerings
            .iter()
            .map(|o| {
                compile(
                    InputKind::BgpPeering,
                    &o.name,
                    o.spec.node_selector.as_ref(),
                )
            })
            .collect();
        let underlay_sel: Vec<_> = underlays
            .iter()
            .map(|o| compile(InputKind::Underlay, &o.name, o.spec.node_selector.as_ref()))
            .collect();
        let mut selectors: Vec<(u32, Selector)> =
            distinct.into_iter().map(|(s, i)| (i, s)).collect();
        selectors.sort_by_key(|(i, _)| *i);

        let mut sorted_nodes: Vec<&NodeInfo> = nodes.iter().collect();
        sorted_nodes.sort();
        sorted_nodes.dedup_by(|a, b| a.name == b.name);

        // Nodes that look the same to every selector share one evaluation; nodes with the same results
        // form a group.
        let selectors: Vec<Selector> = selectors.into_iter().map(|(_, s)| s).collect();
        let set = SelectorSet::new(&selectors);
        let mut by_projection: BTreeMap<Vec<u32>, Vec<u32>> = BTreeMap::new();
        for (n, node) in sorted_nodes.iter().enumerate() {
            by_projection
                .entry(set.project(&node.labels))
                .or_default()
                .push(n as u32);
        }
        let mut by_bits: BTreeMap<Vec<u64>, Vec<u32>> = BTreeMap::new();
        for (projection, members) in by_projection {
            by_bits
                .entry(set.eval(&projection))
                .or_default()
                .extend(members);
        }
        let groups: Vec<Group> = by_bits
            .into_iter()
            .map(|(bits, mut nodes)| {
                nodes.sort_unstable();
                Group { bits, nodes }
            })
            .collect();

        let (vrf_tables, sbr_tables) = allocate_all_tables(&vrfs, &rts);
        Index {
            vrfs,
            l2s,
            rts,
            peerings,
            mirror_targets,
            mirror_selectors,
            underlays,
            nodes: sorted_nodes,
            vrf_sel,
            l2_sel,
            rt_sel,
            peering_sel,
            underlay_sel,
            vrf_tables,
            sbr_tables,
            selector_errors,
            groups,
        }
    }

    /// Names of the nodes in these groups, sorted.
    pub fn node_names(&self, groups: impl IntoIterator<Item = usize>) -> Vec<String> {
        let mut ids: Vec<u32> = groups
            .into_iter()
            .flat_map(|g| self.groups[g].nodes.iter().copied())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter()
            .map(|n| self.nodes[n as usize].name.clone())
            .collect()
    }
}

/// Tables of `vrfs` (canonical order): `tableId`, or the allocation described in the `render` module docs.
pub(crate) fn allocate_tables(vrfs: &[&NamedVrf], rts: &[&NamedRoutingTable]) -> Vec<u32> {
    allocate_all_tables(vrfs, rts).0
}

/// Tables of `vrfs` and of their source-based-routing VRFs (`s-<vrf>`, only for VRFs with
/// `sbrPrefixes`; allocated like a VRF of that name without `tableId`).
pub(crate) fn allocate_all_tables(
    vrfs: &[&NamedVrf],
    rts: &[&NamedRoutingTable],
) -> (Vec<u32>, Vec<Option<u32>>) {
    let mut used: BTreeSet<u32> = RESERVED_TABLES.into_iter().collect();
    used.extend(vrfs.iter().filter_map(|v| v.spec.table_id));
    used.extend(rts.iter().map(|r| r.spec.table_id));
    let mut tables: Vec<u32> = vrfs.iter().map(|v| v.spec.table_id.unwrap_or(0)).collect();
    let mut sbr_tables: Vec<Option<u32>> = vec![None; vrfs.len()];
    // (name the slot is derived from, VRF index, whether it is the SBR VRF's)
    let mut pending: Vec<(String, usize, bool)> = (0..vrfs.len())
        .filter(|&i| vrfs[i].spec.table_id.is_none())
        .map(|i| (vrfs[i].spec.vrf.clone(), i, false))
        .collect();
    pending.extend(
        (0..vrfs.len())
            .filter(|&i| !vrfs[i].spec.sbr_prefixes.is_empty())
            .map(|i| (sbr_vrf_name(&vrfs[i].spec.vrf), i, true)),
    );
    // Earlier (VRF name, object order) wins a contested slot, whatever order the inputs came in.
    pending.sort();
    for (name, i, sbr) in pending {
        let mut t = home_slot(&name);
        // The range holds 10 million ids; it cannot fill up with the objects one cluster has, but stop
        // after a full lap rather than loop forever.
        for _ in 0..TABLE_ALLOC_SIZE {
            if !used.contains(&t) {
                break;
            }
            t = TABLE_ALLOC_BASE + (t - TABLE_ALLOC_BASE + 1) % TABLE_ALLOC_SIZE;
        }
        used.insert(t);
        if sbr {
            sbr_tables[i] = Some(t);
        } else {
            tables[i] = t;
        }
    }
    (tables, sbr_tables)
}

/// The id a VRF gets when nothing else holds it: depends on the VRF name only.
fn home_slot(vrf: &str) -> u32 {
    let digest = Sha256::digest(vrf.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    TABLE_ALLOC_BASE + (u64::from_be_bytes(first) % u64::from(TABLE_ALLOC_SIZE)) as u32
}
