//! Fleet validation of MirrorTargets and MirrorSelectors: each spec on its own, and what they name.
//!
//! ```text
//!  MirrorTarget   destinationVrf: a VRF (by spec.vrf) with a VNI ── sourceLoopback: a loopback of it
//!                 destinationIP: of the loopback subnet's family
//!  MirrorSelector mirrorTarget: an existing MirrorTarget ── mirrorSource: an existing segment, or VRF
//!                 with a VNI ── on no node (source and target VRF never meet): a warning
//! ```

use std::net::IpAddr;

use netwave_api::validate::{parse_network, validate_mirror_selector, validate_mirror_target};

use super::{Check, Finding, Validator};
use crate::render::mirror;
use crate::render::{InputKind, InputRef};

impl Validator<'_> {
    fn mirror_finding(
        &mut self,
        error: bool,
        check: Check,
        object: InputRef,
        field: &str,
        message: String,
    ) {
        let f = Finding {
            check,
            objects: vec![object],
            field: Some(field.to_string()),
            message,
            nodes: Vec::new(),
        };
        if error {
            self.out.errors.push(f);
        } else {
            self.out.warnings.push(f);
        }
    }

    pub(super) fn mirrors(&mut self) {
        for i in 0..self.ix.mirror_targets.len() {
            self.mirror_target(i);
        }
        for i in 0..self.ix.mirror_selectors.len() {
            self.mirror_selector(i);
        }
        self.same_tunnel();
    }

    /// Two targets of one type from one VRF loopback to one destination with one key would be one
    /// tunnel to the kernel: it refuses the second (EEXIST).
    fn same_tunnel(&mut self) {
        let mut seen: std::collections::BTreeMap<_, &str> = std::collections::BTreeMap::new();
        let targets = self.ix.mirror_targets.clone();
        for t in targets {
            let s = &t.spec;
            let Ok(dest) = s.destination_ip.parse::<IpAddr>() else {
                continue;
            };
            let key = (
                s.kind,
                s.destination_vrf.as_str(),
                s.source_loopback.as_str(),
                dest,
                s.key,
            );
            if let Some(first) = seen.insert(key, &t.name) {
                self.mirror_finding(
                    true,
                    Check::MirrorTargetVrf,
                    InputRef::new(InputKind::MirrorTarget, &t.name),
                    "spec.destinationIP",
                    format!(
                        "MirrorTarget {first} is the same tunnel (type, VRF loopback, destination and key): \
                         a node can have only one; give one a key of its own"
                    ),
                );
            }
        }
    }

    fn mirror_target(&mut self, i: usize) {
        let t = self.ix.mirror_targets[i];
        let me = InputRef::new(InputKind::MirrorTarget, &t.name);
        for p in validate_mirror_target(&t.spec) {
            self.mirror_finding(true, Check::ObjectSpec, me.clone(), &p.path, p.message);
        }
        let vrf_name = &t.spec.destination_vrf;
        let Some(v) = mirror::target_vrf(&self.ix, t) else {
            self.mirror_finding(
                true,
                Check::MirrorTargetVrf,
                me,
                "spec.destinationVrf",
                format!("VRF {vrf_name} does not exist (no VRFRouteConfiguration has spec.vrf {vrf_name})"),
            );
            return;
        };
        let vrf = &self.ix.vrfs[v].spec;
        if vrf.vni.is_none() {
            self.mirror_finding(
                true,
                Check::MirrorTargetVrf,
                me.clone(),
                "spec.destinationVrf",
                format!(
                    "VRF {vrf_name} ({}) has no vni: the tunnel reaches its collector over the fabric, \
                     so its VRF needs a layer-3 VNI",
                    self.ix.vrfs[v].name
                ),
            );
        }
        let loopback = &t.spec.source_loopback;
        let Some(lb) = vrf.loopbacks.iter().find(|lb| &lb.name == loopback) else {
            let have: Vec<&str> = vrf.loopbacks.iter().map(|lb| lb.name.as_str()).collect();
            self.mirror_finding(
                true,
                Check::MirrorTargetVrf,
                me,
                "spec.sourceLoopback",
                format!(
                    "{loopback} is not a loopback of VRF {vrf_name} ({} spec.loopbacks has {})",
                    self.ix.vrfs[v].name,
                    if have.is_empty() {
                        "none".to_string()
                    } else {
                        have.join(", ")
                    }
                ),
            );
            return;
        };
        if let (Ok(subnet), Ok(dest)) = (
            parse_network(&lb.subnet),
            t.spec.destination_ip.parse::<IpAddr>(),
        ) && subnet.addr().is_ipv4() != dest.is_ipv4()
        {
            let fam = |v4: bool| if v4 { "IPv4" } else { "IPv6" };
            self.mirror_finding(
                true,
                Check::MirrorTargetVrf,
                me,
                "spec.destinationIP",
                format!(
                    "{dest} is {} but loopback {loopback} ({}) is {}: a tunnel's two ends are of one family",
                    fam(dest.is_ipv4()),
                    lb.subnet,
                    fam(subnet.addr().is_ipv4())
                ),
            );
        }
    }

    fn mirror_selector(&mut self, i: usize) {
        let s = self.ix.mirror_selectors[i];
        let me = InputRef::new(InputKind::MirrorSelector, &s.name);
        let problems = validate_mirror_selector(&s.spec);
        let spec_ok = problems.is_empty();
        for p in problems {
            self.mirror_finding(true, Check::ObjectSpec, me.clone(), &p.path, p.message);
        }
        let (t, src) = (&s.spec.mirror_target, &s.spec.mirror_source);
        if t.kind == "MirrorTarget" && !self.ix.mirror_targets.iter().any(|o| o.name == t.name) {
            self.mirror_finding(
                true,
                Check::MissingMirrorReference,
                me.clone(),
                "spec.mirrorTarget.name",
                format!("MirrorTarget {} does not exist", t.name),
            );
        }
        match src.kind.as_str() {
            "Layer2NetworkConfiguration" if !self.ix.l2s.iter().any(|o| o.name == src.name) => {
                self.mirror_finding(
                    true,
                    Check::MissingMirrorReference,
                    me.clone(),
                    "spec.mirrorSource.name",
                    format!("Layer2NetworkConfiguration {} does not exist", src.name),
                );
            }
            "VRFRouteConfiguration" => match self.ix.vrfs.iter().find(|o| o.name == src.name) {
                None => self.mirror_finding(
                    true,
                    Check::MissingMirrorReference,
                    me.clone(),
                    "spec.mirrorSource.name",
                    format!("VRFRouteConfiguration {} does not exist", src.name),
                ),
                Some(v) if v.spec.vni.is_none() => self.mirror_finding(
                    true,
                    Check::MirrorSourceUnusable,
                    me.clone(),
                    "spec.mirrorSource.name",
                    format!(
                        "VRF {} has no vni: a VRF's traffic is mirrored on its layer-3 VXLAN device, \
                         and it has none",
                        v.spec.vrf
                    ),
                ),
                Some(_) => {}
            },
            _ => {}
        }
        if spec_ok
            && let Some(r) = mirror::resolve(&self.ix, i)
            && !(0..self.ix.groups.len()).any(|g| mirror::on_group(&self.ix, &r, g))
            && !self.ix.nodes.is_empty()
        {
            self.mirror_finding(
                false,
                Check::SelectsNoNode,
                me,
                "spec.mirrorSource",
                format!(
                    "no node has both {} {} and the target's VRF {}, so it mirrors nowhere",
                    src.kind, src.name, self.ix.mirror_targets[r.target].spec.destination_vrf
                ),
            );
        }
    }
}
