//! What rendering works on and names: the objects (nodes and input objects), the range tables are
//! allocated from, and the kernel device names netwave gives each object. A leaf module: `render` and
//! `render::index` both use it, it uses neither.

use std::collections::BTreeMap;
use std::fmt;

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

/// Kind of an input object (declared once, in `netwave_api::kinds`).
pub use netwave_api::InputKind;

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

/// Bridge of a VRF's layer-3 VNI.
pub fn vrf_bridge_name(vrf: &str) -> String {
    format!("br.{vrf}")
}
/// VXLAN device of a VRF's layer-3 VNI.
pub fn vrf_vxlan_name(vrf: &str) -> String {
    format!("vx.{vrf}")
}
/// Local VRF of a VRF's source-based routing (`sbrPrefixes`), as das-schiff-network-operator names it.
pub fn sbr_vrf_name(vrf: &str) -> String {
    format!("s-{vrf}")
}
/// Bridge of a layer-2 segment.
pub fn layer2_bridge_name(vlan: u16) -> String {
    format!("l2.{vlan}")
}
/// VXLAN device of a layer-2 segment.
pub fn layer2_vxlan_name(vlan: u16) -> String {
    format!("vx.{vlan}")
}
