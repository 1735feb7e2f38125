//! Traffic mirroring (MirrorTarget, MirrorSelector): which objects a selector names, on which nodes it
//! lands, and what a node gets. Render, fleet validation and the input status all read it from here,
//! so they never disagree about where a mirror is.
//!
//! ```text
//!  MirrorSelector ─ mirrorSource ──► Layer2NetworkConfiguration | VRFRouteConfiguration (by object name)
//!        └──────── mirrorTarget ──► MirrorTarget ─ destinationVrf ──► VRF (by spec.vrf) + sourceLoopback
//!  a node gets the selector where it has the source and the target's VRF; the target's tunnel goes
//!  with it (local = the node's address of the loopback, remote = destinationIP, in the VRF)
//! ```

use netwave_api::validate::mirror_ref_group_ok;
use netwave_api::{MirrorTargetType, NamedMirrorTarget};
use sha2::{Digest, Sha256};

use super::index::Index;

/// What a MirrorSelector copies from, by position in the index's lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    Layer2(usize),
    Vrf(usize),
}

/// A selector whose references all resolve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Resolved {
    /// Position in `Index::mirror_targets`.
    pub target: usize,
    /// Position in `Index::vrfs` of the target's VRF.
    pub target_vrf: usize,
    pub source: Source,
}

/// The VRF object a MirrorTarget's `destinationVrf` names (by `spec.vrf`; the first in canonical order
/// when several share it, which validation reports).
pub(crate) fn target_vrf(ix: &Index, t: &NamedMirrorTarget) -> Option<usize> {
    ix.vrfs
        .iter()
        .position(|v| v.spec.vrf == t.spec.destination_vrf)
}

/// Whether a MirrorTarget can have a tunnel at all: its VRF exists, has a VNI, and has the loopback.
/// (Families and addresses are validation's; a target failing them fails the revision.)
fn target_usable(ix: &Index, t: &NamedMirrorTarget) -> Option<usize> {
    let v = target_vrf(ix, t)?;
    let spec = &ix.vrfs[v].spec;
    (spec.vni.is_some()
        && spec
            .loopbacks
            .iter()
            .any(|lb| lb.name == t.spec.source_loopback))
    .then_some(v)
}

/// The objects selector `i` names, when they all exist and can carry a mirror.
pub(crate) fn resolve(ix: &Index, i: usize) -> Option<Resolved> {
    let s = &ix.mirror_selectors[i].spec;
    let (t, src) = (&s.mirror_target, &s.mirror_source);
    if !mirror_ref_group_ok(t) || !mirror_ref_group_ok(src) || t.kind != "MirrorTarget" {
        return None;
    }
    let target = ix.mirror_targets.iter().position(|o| o.name == t.name)?;
    let target_vrf = target_usable(ix, ix.mirror_targets[target])?;
    let source = match src.kind.as_str() {
        "Layer2NetworkConfiguration" => {
            Source::Layer2(ix.l2s.iter().position(|o| o.name == src.name)?)
        }
        "VRFRouteConfiguration" => {
            let v = ix.vrfs.iter().position(|o| o.name == src.name)?;
            // A VRF's traffic is mirrored on its layer-3 VXLAN device.
            ix.vrfs[v].spec.vni?;
            Source::Vrf(v)
        }
        _ => return None,
    };
    Some(Resolved {
        target,
        target_vrf,
        source,
    })
}

/// Whether group `g` gets the resolved selector: it has the source and the target's VRF.
pub(crate) fn on_group(ix: &Index, r: &Resolved, g: usize) -> bool {
    let group = &ix.groups[g];
    let source = match r.source {
        Source::Layer2(l) => ix.l2_sel[l],
        Source::Vrf(v) => ix.vrf_sel[v],
    };
    group.has(source) && group.has(ix.vrf_sel[r.target_vrf])
}

/// Every selector's resolution and the groups it lands on (parallel to `Index::mirror_selectors`).
pub(crate) fn placements(ix: &Index) -> Vec<Option<(Resolved, Vec<usize>)>> {
    (0..ix.mirror_selectors.len())
        .map(|i| {
            resolve(ix, i).map(|r| {
                let groups = (0..ix.groups.len())
                    .filter(|&g| on_group(ix, &r, g))
                    .collect();
                (r, groups)
            })
        })
        .collect()
}

/// The tunnel device of a MirrorTarget: `gre-` (l3gre) or `gtap-` (l2gre) and the first 8 hex digits
/// of sha256 of its name (das-schiff-network-operator's names), 12 or 13 bytes.
pub fn tunnel_device(target: &str, kind: MirrorTargetType) -> String {
    let digest = Sha256::digest(target.as_bytes());
    let head = hex::encode(&digest[..4]);
    match kind {
        MirrorTargetType::L3gre => format!("gre-{head}"),
        MirrorTargetType::L2gre => format!("gtap-{head}"),
    }
}
