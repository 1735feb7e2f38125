//! The three input kinds network admins edit. Field names follow das-schiff-network-operator where the
//! concept is the same, so existing manifests port by changing `apiVersion`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::input_status::InputStatus;

/// Kernel device names are at most 15 bytes (`IFNAMSIZ - 1`); VRF names become device names.
pub const VRF_NAME_PATTERN: &str = "^[a-zA-Z0-9._-]{1,15}$";
/// A unicast or multicast MAC in colon notation, either case.
pub const MAC_PATTERN: &str = "^([0-9a-fA-F]{2}:){5}[0-9a-fA-F]{2}$";

/// One entry of a VRF's import or export prefix list.
#[derive(
    Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct PrefixItem {
    /// Network prefix in CIDR notation, e.g. `10.0.76.80/28` or `fd00:1::/64`.
    pub cidr: String,
    /// Sequence number in the generated prefix list. When omitted the item's position (1-based) is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4294967295u32))]
    pub seq: Option<u32>,
    /// Match prefixes at least this long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 128))]
    pub ge: Option<u8>,
    /// Match prefixes at most this long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 128))]
    pub le: Option<u8>,
    /// What to do with a matching prefix.
    pub action: PrefixAction,
}

impl PrefixItem {
    /// The sequence number this item gets in the generated prefix list: its own `seq`, or its 1-based
    /// position in the list when `seq` is omitted.
    pub fn effective_seq(&self, index: usize) -> u64 {
        self.seq.map(u64::from).unwrap_or(index as u64 + 1)
    }
}

#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum PrefixAction {
    Permit,
    Deny,
}

/// A VRF with its VXLAN layer-3 VNI, route target and route leaking between it and the default VRF.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "netwave.dev",
    version = "v1alpha1",
    kind = "VRFRouteConfiguration",
    plural = "vrfrouteconfigurations",
    shortname = "vrf",
    category = "netwave",
    derive = "PartialEq",
    status = "InputStatus",
    doc = "A VRF on the selected nodes: its L3 VNI, table, route target and import/export prefix lists.",
    printcolumn(name = "VRF", type_ = "string", json_path = ".spec.vrf"),
    printcolumn(name = "VNI", type_ = "integer", json_path = ".spec.vni"),
    printcolumn(name = "Table", type_ = "integer", json_path = ".status.tableId"),
    printcolumn(
        name = "Accepted",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Accepted\")].status"
    ),
    printcolumn(name = "Nodes", type_ = "integer", json_path = ".status.selectedNodes"),
    printcolumn(name = "Seq", type_ = "integer", json_path = ".spec.seq", priority = 1),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct VRFRouteConfigurationSpec {
    /// VRF name; it becomes the kernel device name, so at most 15 characters of `[a-zA-Z0-9._-]`.
    #[schemars(length(min = 1, max = 15), pattern(r"^[a-zA-Z0-9._-]{1,15}$"))]
    pub vrf: String,
    /// Layer-3 VXLAN network identifier of the VRF.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 16777215))]
    pub vni: Option<u32>,
    /// BGP route target, e.g. `65000:100`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_target: Option<String>,
    /// Kernel routing table of the VRF. Allocated deterministically from the VRF name when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4294967295u32))]
    pub table_id: Option<u32>,
    /// Prefixes imported from this VRF into the default VRF.
    #[serde(default)]
    pub import: Vec<PrefixItem>,
    /// Prefixes exported from the default VRF into this VRF.
    #[serde(default)]
    pub export: Vec<PrefixItem>,
    /// Aggregate prefixes announced from this VRF.
    #[serde(default)]
    pub aggregate: Vec<String>,
    /// Source-based routing: traffic of the default VRF *from* these prefixes is routed by this VRF's
    /// routes (and the default VRF's where this VRF has none), as das-schiff-network-operator does it:
    /// a local VRF `s-<vrf>` that imports both, and a policy rule per prefix (priority 100) that sends
    /// the source to its table.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sbr_prefixes: Vec<String>,
    /// Order of this VRF's entries in the generated route maps.
    #[schemars(range(min = 1, max = 65534))]
    pub seq: u32,
    /// BGP communities attached to exported routes, e.g. `65000:10`.
    #[serde(default)]
    pub communities: Vec<String>,
    /// MTU of the VRF's layer-3 VXLAN devices. Defaults to 9000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1000, max = 9000))]
    pub mtu: Option<u32>,
    /// Nodes that get this VRF. All nodes when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// Loopbacks in the VRF: every selected node gets one host address (/32, /128) of each subnet,
    /// allocated deterministically by node name and shown in its NodeNetworkConfig; the VRF announces
    /// it like its other connected routes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub loopbacks: Vec<VrfLoopback>,
}

/// A per-node loopback of a VRF (das-schiff-network-operator's `loopbacks[]`).
#[derive(
    Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct VrfLoopback {
    /// Name of the loopback, unique in the VRF (e.g. `lo.mir`).
    #[schemars(length(min = 1, max = 15), pattern(r"^[a-zA-Z0-9._-]{1,15}$"))]
    pub name: String,
    /// Network the nodes' addresses are allocated from, e.g. `10.250.91.0/29` or `fd94::/125`.
    pub subnet: String,
}

/// A layer-2 segment: VLAN, its VXLAN VNI, a bridge with anycast gateway addresses, optionally in a VRF.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "netwave.dev",
    version = "v1alpha1",
    kind = "Layer2NetworkConfiguration",
    plural = "layer2networkconfigurations",
    shortname = "l2",
    category = "netwave",
    derive = "PartialEq",
    status = "InputStatus",
    doc = "A layer-2 segment on the selected nodes: VLAN, VXLAN VNI, bridge with anycast gateways.",
    printcolumn(name = "VLAN", type_ = "integer", json_path = ".spec.id"),
    printcolumn(name = "VNI", type_ = "integer", json_path = ".spec.vni"),
    printcolumn(name = "VRF", type_ = "string", json_path = ".spec.vrf"),
    printcolumn(name = "MTU", type_ = "integer", json_path = ".spec.mtu"),
    printcolumn(
        name = "Accepted",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Accepted\")].status"
    ),
    printcolumn(name = "Nodes", type_ = "integer", json_path = ".status.selectedNodes"),
    printcolumn(
        name = "Gateways",
        type_ = "string",
        json_path = ".spec.anycastGateways",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct Layer2NetworkConfigurationSpec {
    /// VLAN id of the segment.
    #[schemars(range(min = 1, max = 4094))]
    pub id: u16,
    /// VXLAN network identifier of the segment.
    #[schemars(range(min = 1, max = 16777215))]
    pub vni: u32,
    /// MTU of the segment's bridge and VXLAN device.
    #[schemars(range(min = 1000, max = 9000))]
    pub mtu: u32,
    /// MAC address the anycast gateway answers with on every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^([0-9a-fA-F]{2}:){5}[0-9a-fA-F]{2}$"))]
    pub anycast_mac: Option<String>,
    /// Gateway addresses with their prefix length, identical on every node, e.g. `10.250.0.1/24`.
    #[serde(default)]
    pub anycast_gateways: Vec<String>,
    /// VRF (its `spec.vrf` name) the segment's bridge is enslaved to. The default VRF when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 15), pattern(r"^[a-zA-Z0-9._-]{1,15}$"))]
    pub vrf: Option<String>,
    /// Answer ARP/ND from the bridge's neighbour table instead of flooding it over VXLAN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub neigh_suppression: Option<bool>,
    /// EVPN route target (import and export) of the segment's VNI, e.g. `65188:501`. FRR's automatic
    /// one (`<asn>:<vni>`) when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_target: Option<String>,
    /// Nodes that get this segment. All nodes when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
}

/// Static routes and policy rules for one kernel routing table.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "netwave.dev",
    version = "v1alpha1",
    kind = "RoutingTable",
    plural = "routingtables",
    shortname = "rt",
    category = "netwave",
    derive = "PartialEq",
    status = "InputStatus",
    doc = "Static routes and policy routing rules for one kernel routing table on the selected nodes.",
    printcolumn(name = "Table", type_ = "integer", json_path = ".spec.tableId"),
    printcolumn(
        name = "Accepted",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Accepted\")].status"
    ),
    printcolumn(name = "Nodes", type_ = "integer", json_path = ".status.selectedNodes"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct RoutingTableSpec {
    /// Kernel routing table id.
    #[schemars(range(min = 1, max = 4294967295u32))]
    pub table_id: u32,
    /// Routes in the table.
    #[serde(default)]
    pub routes: Vec<Route>,
    /// Policy rules that send traffic to the table.
    #[serde(default)]
    pub rules: Vec<Rule>,
    /// Nodes that get this table. All nodes when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
}

#[derive(
    Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    /// Destination network in CIDR notation.
    pub prefix: String,
    /// Next-hop address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    /// Output device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 15))]
    pub dev: Option<String>,
    /// Route type (default `unicast`). `unicast` needs `via` or `dev`.
    // No default in the schema: a default the server fills into an item of an atomic list makes every
    // client-side `kubectl apply` of an unchanged file report the object "configured". Still written
    // when unicast, so folded inputs (and the revision hash) are what they were.
    #[serde(rename = "type", default)]
    #[schemars(transform = without_default)]
    pub kind: RouteType,
    /// Route metric (priority); lower wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<u32>,
}

#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum RouteType {
    #[default]
    Unicast,
    Blackhole,
    Unreachable,
}

fn without_default(schema: &mut schemars::Schema) {
    schema.remove("default");
}

#[derive(
    Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    /// Source network in CIDR notation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Destination network in CIDR notation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// Incoming interface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 15))]
    pub iif: Option<String>,
    /// Firewall mark the packet must carry (`ip rule ... fwmark`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fwmark: Option<u32>,
    /// Bits of the mark compared (`ip rule ... fwmark MARK/MASK`); all of them when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fwmask: Option<u32>,
    /// Rule priority; lower is evaluated first. 32766 and 32767 belong to the kernel's `main` and
    /// `default` rules and cannot be used.
    #[schemars(range(min = 1, max = 4294967295u32))]
    pub priority: u32,
}

/// A BGP session between the selected nodes' FRR and a workload (BGP as a service:
/// das-schiff-network-operator's `BGPPeering`, every field kept). Either `peeringVlan`: the nodes accept
/// sessions from any address of the segment's anycast gateway subnets (`bgp listen range`, in the
/// segment's VRF); or `loopbackPeer`: the nodes peer with these workload addresses in the default VRF
/// (multihop, TTL security 2 hops).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "netwave.dev",
    version = "v1alpha1",
    kind = "BGPPeering",
    plural = "bgppeerings",
    shortname = "bgpp",
    category = "netwave",
    derive = "PartialEq",
    status = "InputStatus",
    doc = "A BGP session between the selected nodes and a workload: a listen range on a layer-2 segment (in its VRF) or workload loopback addresses, with the workload's ASN, BFD, timers, a prefix limit and import/export prefix lists.",
    printcolumn(name = "VLAN", type_ = "string", json_path = ".spec.peeringVlan.name"),
    printcolumn(name = "ASN", type_ = "integer", json_path = ".spec.remoteASN"),
    printcolumn(name = "BFD", type_ = "boolean", json_path = ".spec.enableBFD"),
    printcolumn(
        name = "Accepted",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Accepted\")].status"
    ),
    printcolumn(name = "Nodes", type_ = "integer", json_path = ".status.selectedNodes"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct BGPPeeringSpec {
    /// The layer-2 segment (its `Layer2NetworkConfiguration`'s name) the workloads peer over: every
    /// anycast gateway subnet of it becomes a listen range in the segment's VRF.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peering_vlan: Option<BgpPeeringVlan>,
    /// Workload addresses the nodes peer with in the default VRF (multihop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loopback_peer: Option<BgpPeeringLoopback>,
    /// The workload's AS number.
    #[serde(rename = "remoteASN")]
    #[schemars(range(min = 1, max = 4294967295u32))]
    pub remote_asn: u32,
    /// Run BFD on the session (FRR's bfdd), so a dead workload is noticed in about a second instead of
    /// the hold time.
    #[serde(rename = "enableBFD", default)]
    pub enable_bfd: bool,
    /// Prefixes accepted from the workload per address family (after the import list); more tear
    /// the session down. 10,000 when omitted (the API server fills it in): a workload cannot fill the
    /// node's bgpd; set 4294967295 for no practical limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4294967295u32))]
    pub maximum_prefixes: Option<u32>,
    /// BGP hold time, a duration such as `90s` or `1m30s`: 0 (no hold timer) or 3 s to 65535 s, whole
    /// seconds. FRR's default (9 s under the datacenter profile) when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_time: Option<String>,
    /// BGP keepalive interval, a duration such as `30s`: whole seconds, below the hold time. Set
    /// together with `holdTime`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keepalive_time: Option<String>,
    /// Prefixes accepted from the workload (evaluated in `seq` order; no match rejects).
    #[serde(default)]
    pub import: Vec<PrefixItem>,
    /// Prefixes announced to the workload (evaluated in `seq` order; no match rejects).
    #[serde(default)]
    pub export: Vec<PrefixItem>,
    /// Nodes that get this peering. All nodes when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
}

/// The prefix limit of a BGPPeering that names none (#48): the `default` of `spec.maximumPrefixes` in
/// its CRD, so the API server stores it and every reader (older configurators included) applies it.
/// Chosen above what a workload announces in practice (a service address per LoadBalancer, a few pod
/// blocks) and far below what fills bgpd: 10,000 accepted prefixes per family cost bgpd a few MiB.
pub const DEFAULT_MAXIMUM_PREFIXES: u32 = 10_000;

/// `spec.peeringVlan` of a BGPPeering.
#[derive(
    Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
pub struct BgpPeeringVlan {
    /// Name of the `Layer2NetworkConfiguration` object.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// `spec.loopbackPeer` of a BGPPeering.
#[derive(
    Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
pub struct BgpPeeringLoopback {
    /// The workload's addresses, one IPv4 and/or one IPv6.
    #[serde(rename = "ips")]
    pub ip_addresses: Vec<String>,
}

/// The API groups a mirror reference (`apiGroup`) may name: netwave's own, and das-schiff-network-operator's
/// (`network.t-caas.telekom.com`), so their MirrorSelectors port by changing `apiVersion` only. An empty
/// or omitted `apiGroup` means netwave's.
pub const MIRROR_REF_GROUPS: [&str; 2] = ["netwave.dev", "network.t-caas.telekom.com"];

/// The GRE encapsulation of a MirrorTarget's tunnel.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum MirrorTargetType {
    /// Ethernet over GRE (a `gretap`/`ip6gretap` device): the collector sees the mirrored frames.
    L2gre,
    /// IP over GRE (a `gre`/`ip6gre` device): the collector sees the mirrored IP packets.
    L3gre,
}

/// Where mirrored traffic goes: a GRE tunnel from every node that mirrors to a collector, living in a
/// VRF and sourced from the node's address of one of that VRF's loopbacks (das-schiff-network-operator's
/// `MirrorTarget`, every field kept).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "netwave.dev",
    version = "v1alpha1",
    kind = "MirrorTarget",
    plural = "mirrortargets",
    shortname = "mirrortarget",
    category = "netwave",
    derive = "PartialEq",
    status = "InputStatus",
    doc = "A mirror collector: a GRE tunnel (l2gre or l3gre) in a VRF to destinationIP, sourced from each node's address of one of the VRF's loopbacks.",
    printcolumn(name = "Type", type_ = "string", json_path = ".spec.type"),
    printcolumn(
        name = "Destination",
        type_ = "string",
        json_path = ".spec.destinationIP"
    ),
    printcolumn(name = "VRF", type_ = "string", json_path = ".spec.destinationVrf"),
    printcolumn(
        name = "Accepted",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Accepted\")].status"
    ),
    printcolumn(
        name = "Selectors",
        type_ = "integer",
        json_path = ".status.activeSelectors"
    ),
    printcolumn(name = "Nodes", type_ = "integer", json_path = ".status.activeNodes"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MirrorTargetSpec {
    /// `l2gre` (Ethernet over GRE) or `l3gre` (IP over GRE).
    #[serde(rename = "type")]
    pub kind: MirrorTargetType,
    /// The collector's address, the tunnel's remote end; of the family of the source loopback.
    #[serde(rename = "destinationIP")]
    pub destination_ip: String,
    /// GRE key, sent and expected on the tunnel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 4294967295u32))]
    pub key: Option<u32>,
    /// The VRF (its `spec.vrf` name) the tunnel lives in; it needs a VNI, so the collector is reached
    /// over the fabric.
    #[schemars(length(min = 1, max = 12), pattern(r"^[a-zA-Z0-9._-]{1,12}$"))]
    pub destination_vrf: String,
    /// The loopback of that VRF (`spec.loopbacks[].name`) whose per-node address is the tunnel's
    /// source.
    #[schemars(length(min = 1, max = 15), pattern(r"^[a-zA-Z0-9._-]{1,15}$"))]
    pub source_loopback: String,
}

/// A reference from a MirrorSelector to another object (Kubernetes' `TypedObjectReference`).
#[derive(
    Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct MirrorObjectRef {
    /// `netwave.dev` or das-schiff's `network.t-caas.telekom.com`; netwave's when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_group: Option<String>,
    /// The kind of the object.
    #[schemars(length(min = 1, max = 63))]
    pub kind: String,
    /// The object's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Accepted for compatibility with `TypedObjectReference`; every netwave object is cluster-scoped,
    /// so a namespace is an error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// Which traffic of a mirror source is copied, in das-schiff-network-operator's terms: `ingress` is
/// traffic to the source's workloads, `egress` traffic from them.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum MirrorDirection {
    Ingress,
    Egress,
}

/// Which packets a MirrorSelector copies; every field set must match, an empty match copies all IP
/// traffic.
#[derive(
    Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct TrafficMatch {
    /// Source network (CIDR) or address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src_prefix: Option<String>,
    /// Destination network (CIDR) or address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst_prefix: Option<String>,
    /// Source port (TCP, UDP or SCTP; all three when `protocol` is omitted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub src_port: Option<u16>,
    /// Destination port (TCP, UDP or SCTP; all three when `protocol` is omitted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub dst_port: Option<u16>,
    /// `tcp`, `udp`, `sctp`, `icmp` or `icmpv6`, in any case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 16))]
    pub protocol: Option<String>,
}

/// What to mirror: the traffic of a layer-2 segment or a VRF, in one direction, optionally narrowed by
/// a match, to a MirrorTarget (das-schiff-network-operator's `MirrorSelector`, every field kept). A node
/// mirrors where it has the source and the target's VRF.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "netwave.dev",
    version = "v1alpha1",
    kind = "MirrorSelector",
    plural = "mirrorselectors",
    shortname = "mirrorselector",
    category = "netwave",
    derive = "PartialEq",
    status = "InputStatus",
    doc = "Mirrors the traffic of a layer-2 segment or VRF (one direction, optionally matched) to a MirrorTarget, on every node that has both.",
    printcolumn(name = "Direction", type_ = "string", json_path = ".spec.direction"),
    printcolumn(
        name = "Source",
        type_ = "string",
        json_path = ".spec.mirrorSource.name"
    ),
    printcolumn(
        name = "Target",
        type_ = "string",
        json_path = ".spec.mirrorTarget.name"
    ),
    printcolumn(
        name = "Accepted",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Accepted\")].status"
    ),
    printcolumn(name = "Nodes", type_ = "integer", json_path = ".status.selectedNodes"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MirrorSelectorSpec {
    /// Which packets to copy; all IP traffic when omitted or empty.
    #[serde(default)]
    pub traffic_match: TrafficMatch,
    /// The MirrorTarget (kind `MirrorTarget`) the copies go to.
    pub mirror_target: MirrorObjectRef,
    /// The `Layer2NetworkConfiguration` or `VRFRouteConfiguration` whose traffic is copied.
    pub mirror_source: MirrorObjectRef,
    /// `ingress` (to the source's workloads) or `egress` (from them).
    pub direction: MirrorDirection,
}

/// The EVPN underlay of the selected nodes: their BGP autonomous system, the fabric neighbours they
/// peer with and the session timers (#47). It is an input like a VRF: folded into a revision, rendered
/// into each selected node's config (`spec.config.underlay`), applied by the agent behind its health
/// gate, rolled out in waves and rolled back with the revision. Each node keeps its own VTEP address
/// and router id (the agent's `--vxlan-local`). A node no Underlay selects keeps the agent's bootstrap
/// underlay (`--frr-config`); a node two select is a fleet validation error.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "netwave.dev",
    version = "v1alpha1",
    kind = "Underlay",
    plural = "underlays",
    shortname = "ul",
    category = "netwave",
    derive = "PartialEq",
    status = "InputStatus",
    doc = "The EVPN underlay of the selected nodes: their BGP ASN, fabric neighbours and timers, rolled out in waves like every input.",
    printcolumn(name = "ASN", type_ = "integer", json_path = ".spec.asn"),
    printcolumn(
        name = "Accepted",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Accepted\")].status"
    ),
    printcolumn(name = "Nodes", type_ = "integer", json_path = ".status.selectedNodes"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct UnderlaySpec {
    /// The nodes' BGP autonomous system number.
    #[schemars(range(min = 1, max = 4294967295u32))]
    pub asn: u32,
    /// Fabric BGP sessions; each carries IPv4 unicast (VTEP reachability) and L2VPN EVPN.
    #[schemars(length(min = 1, max = 16))]
    pub neighbors: Vec<UnderlayNeighborSpec>,
    /// Keepalive and hold time of every session; FRR's datacenter defaults (3 s, 9 s) when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timers: Option<UnderlayTimersSpec>,
    /// Nodes that get this underlay. All nodes when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
}

/// One fabric neighbour: by `address` (numbered) or by `interface` (unnumbered), not both.
#[derive(
    Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct UnderlayNeighborSpec {
    /// The neighbour's IPv4 address (a numbered session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The interface to peer over (an unnumbered session on IPv6 link-local addresses).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 15), pattern(r"^[a-zA-Z0-9._-]{1,15}$"))]
    pub interface: Option<String>,
    /// `internal` (iBGP), `external` (eBGP: any ASN but the node's) or the neighbour's ASN.
    #[schemars(pattern(r"^(internal|external|[1-9][0-9]{0,9})$"))]
    pub remote_as: String,
}

/// BGP timers of the underlay sessions, in seconds.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct UnderlayTimersSpec {
    /// Seconds between keepalives.
    #[schemars(range(min = 1, max = 3600))]
    pub keepalive: u16,
    /// Seconds without a message before a session is dropped: 0 (never) or at least 3.
    #[schemars(range(min = 0, max = 65535))]
    pub hold: u16,
}
