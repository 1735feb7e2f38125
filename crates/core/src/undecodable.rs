//! What skipping an object the configurator cannot decode means (DESIGN.md §6, "One bad object never
//! blinds the fleet"). The CRDs bound every integer by its Rust type, so the API server refuses such
//! values; an object can still fail to decode when it was stored before a bound existed (or under an
//! older CRD). The shell's watches keep it with its name and the decode error; this module decides what
//! the rollout does without it and what the Event on it says.
//!
//! ```text
//!   undecodable objects ──► holds() ──► Holds { cutting, rollout, unreadable_nodes }
//!     (kind, name, error)       │
//!                               └─────► note() ──► the Event on the object (reason Undecodable)
//! ```
//!
//! - An **input** (VRF, layer 2, routing table) that cannot be read must not silently vanish from the
//!   next revision: that would remove its network from every node. No revision is cut from the inputs
//!   (none created, none reactivated) while one cannot be read; the current target keeps rolling out.
//! - A **revision or its inputs** that cannot be read hides what nodes run and where a failure would take
//!   them back: the rollout is held (nothing assigned, rolled back or pruned) until it is fixed.
//! - A **NodeNetworkConfig** that cannot be read is a node whose state is unknown: it is not updated,
//!   not failed, not in flight and never written; it counts as skipped (left for later, like a node that
//!   is not Ready) and the others roll on. While one is unknown no revision is pruned (it may run any).

use std::collections::BTreeSet;
use std::fmt;

use netwave_api::InputKind;

/// Event reason on an object that cannot be decoded.
pub const REASON: &str = "Undecodable";

/// The kinds the configurator watches and decodes: every input kind, and the rollout's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Input(InputKind),
    Revision,
    RevisionInputs,
    NodeConfig,
}

impl Kind {
    /// Every kind: the input kinds in their list's order, then the rollout's.
    pub fn all() -> impl Iterator<Item = Kind> {
        InputKind::ALL.iter().map(|k| Kind::Input(*k)).chain([
            Kind::Revision,
            Kind::RevisionInputs,
            Kind::NodeConfig,
        ])
    }

    /// The Kubernetes kind.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Input(k) => k.as_str(),
            Kind::Revision => "NetworkConfigRevision",
            Kind::RevisionInputs => "NetworkConfigInputs",
            Kind::NodeConfig => "NodeNetworkConfig",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An object that does not decode: its kind, name and the decode error (field path and message).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Undecodable {
    pub kind: Kind,
    pub name: String,
    pub error: String,
}

/// What the configurator holds back while objects cannot be decoded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holds {
    /// Input objects that cannot be read (`Kind/name`): no revision is cut from the inputs.
    pub cutting: Vec<String>,
    /// Revisions or revision inputs that cannot be read (`Kind/name`): nothing is rolled out.
    pub rollout: Vec<String>,
    /// Nodes whose NodeNetworkConfig cannot be read: state unknown, skipped.
    pub unreadable_nodes: BTreeSet<String>,
}

/// The holds `objects` call for (see the module docs).
pub fn holds(objects: &[Undecodable]) -> Holds {
    let mut h = Holds::default();
    for o in objects {
        let id = format!("{}/{}", o.kind, o.name);
        match o.kind {
            Kind::Input(_) => h.cutting.push(id),
            Kind::Revision | Kind::RevisionInputs => h.rollout.push(id),
            _ => {
                h.unreadable_nodes.insert(o.name.clone());
            }
        }
    }
    h.cutting.sort();
    h.rollout.sort();
    h
}

/// The Event on an undecodable object: what does not decode, and what the configurator does meanwhile.
pub fn note(o: &Undecodable) -> String {
    let consequence = match o.kind {
        Kind::Input(_) => {
            "no revision is cut from the inputs until it is fixed (leaving it out would remove its \
             network from every node); the current revision keeps rolling out"
                .to_string()
        }
        Kind::Revision | Kind::RevisionInputs => {
            "the rollout is held (nothing is assigned, rolled back or pruned) until it is fixed: \
             without it, what nodes run and where they would go back is unknown"
                .to_string()
        }
        _ => format!(
            "node {}'s state is unknown: it is skipped (not updated, not failed, not written) until \
             it is fixed; the other nodes roll on",
            o.name
        ),
    };
    format!(
        "{} {} cannot be decoded ({}): {consequence}",
        o.kind, o.name, o.error
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bad(kind: Kind, name: &str) -> Undecodable {
        Undecodable {
            kind,
            name: name.into(),
            error: "status.observedRetry: invalid value: integer `4294967296`, expected u32".into(),
        }
    }

    /// An input that cannot be read holds cutting (it must not vanish from the next revision), a
    /// revision or its inputs hold the rollout, and an unreadable node config only its own node.
    #[test]
    fn each_kind_holds_what_it_hides() {
        let h = holds(&[
            bad(Kind::Input(InputKind::RoutingTable), "edge"),
            bad(Kind::NodeConfig, "node-3"),
        ]);
        assert_eq!(h.cutting, ["RoutingTable/edge"]);
        assert!(h.rollout.is_empty());
        assert_eq!(h.unreadable_nodes, BTreeSet::from(["node-3".to_string()]));
        let h = holds(&[
            bad(Kind::RevisionInputs, "rev-1"),
            bad(Kind::Revision, "rev-2"),
        ]);
        assert_eq!(
            h.rollout,
            ["NetworkConfigInputs/rev-1", "NetworkConfigRevision/rev-2"]
        );
        assert!(h.cutting.is_empty() && h.unreadable_nodes.is_empty());
        assert_eq!(holds(&[]), Holds::default());
    }

    #[test]
    fn the_event_names_the_field_and_what_is_held() {
        let n = note(&bad(Kind::NodeConfig, "node-3"));
        assert!(
            n.starts_with("NodeNetworkConfig node-3 cannot be decoded (status.observedRetry: "),
            "{n}"
        );
        assert!(n.contains("node node-3's state is unknown"), "{n}");
        let n = note(&bad(Kind::Input(InputKind::Layer2), "vlan100"));
        assert!(n.contains("no revision is cut"), "{n}");
        let n = note(&bad(Kind::Revision, "rev-1"));
        assert!(n.contains("the rollout is held"), "{n}");
    }
}
