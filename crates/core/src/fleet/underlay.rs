//! Fleet validation of Underlays (#47): each spec as FRR would take it, and at most one per node.
//!
//! ```text
//!  Underlay  asn, neighbors[], timers ──► frr::Underlay::new (the agent's own check, field-named)
//!            nodeSelector ──► two Underlays on one node: UnderlayOverlap, naming both and the nodes
//! ```

use std::net::Ipv4Addr;

use netwave_api::UnderlayConfig;

use super::{Check, Obj, Validator};
use crate::frr::{Underlay, UnderlaySettings};

impl Validator<'_> {
    pub(super) fn underlays(&mut self) {
        for i in 0..self.ix.underlays.len() {
            let config = crate::render::underlay_config(self.ix.underlays[i]);
            if let Err(e) = Underlay::new(settings_for_check(&config)) {
                let field = format!("spec.{}", e.field);
                self.object_error(Check::ObjectSpec, Obj::Underlay(i), &field, e.message);
            }
        }
        let members: Vec<Obj> = (0..self.ix.underlays.len()).map(Obj::Underlay).collect();
        for (present, groups) in self.co_located(&members) {
            let objs: Vec<Obj> = present.iter().map(|&m| members[m]).collect();
            let nodes = self.ix.node_names(groups);
            self.push(
                true,
                Check::UnderlayOverlap,
                &objs,
                Some("spec.nodeSelector".into()),
                "select the same nodes: a node has one underlay; narrow the selectors so each node \
                 matches one"
                    .into(),
                nodes,
            );
        }
    }
}

/// The settings the agent would build for a node of this underlay, with a VTEP address none of its
/// neighbours has: the configurator does not know each node's VTEP (the agent checks a neighbour
/// against its own when it applies).
fn settings_for_check(u: &UnderlayConfig) -> UnderlaySettings {
    let taken = |a: &Ipv4Addr| {
        let a = a.to_string();
        u.neighbors.iter().any(|n| n.address.as_deref() == Some(&a))
    };
    // TEST-NET-1 (RFC 5737): never a real neighbour, and the neighbours are at most 16.
    let vtep = (1..=17)
        .map(|h| Ipv4Addr::new(192, 0, 2, h))
        .find(|a| !taken(a))
        .unwrap_or(Ipv4Addr::new(192, 0, 2, 100));
    UnderlaySettings::of_input(u, vtep, None)
}
