//! Fleet validation: every rule that needs more than one object or the nodes, run over a revision's
//! inputs before anything is rolled out. Errors block the revision (it goes `Failed` without touching a
//! node); warnings are shown in its status.
//!
//! ```text
//!  RevisionInputs + nodes + FleetParams ──► per object:   API validation, ranges, selector, names, MTU
//!                                       ──► fleet-wide:   duplicate VNI / VRF name, missing VRF
//!                                       ──► per node*:    VLAN, table, device, gateway, route, rule clashes;
//!                                                         VRF or device missing where it is referenced
//!                                       ──► FleetValidation { errors, warnings }   (* per group of nodes
//!                                                                                  selecting the same objects)
//! ```
//!
//! Each [`Finding`] names the objects, the field when there is one, and every node concerned (its
//! `Display` shortens long node lists). Rules that clash only when two objects meet on a node (VLAN,
//! table, device names, gateways, routes, rule priorities) are checked only where both are selected:
//! the same VLAN in two racks is fine. VNIs and VRF names are fabric-wide identities, so duplicates are
//! errors wherever the objects are.
//!
//! Warnings: an object that selects no node; RoutingTables sharing a table id on a node (their routes and
//! rules are merged); a cluster with no nodes.

mod mirror;
mod underlay;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use ipnet::IpNet;
use netwave_api::validate::{
    FieldError, parse_host_address, validate_layer2, validate_routing_table, validate_vrf,
};
use netwave_api::{NodeConfig, RevisionInputs, RuleConfig, ValidationResult};

use crate::dataplane;
use crate::render::index::Index;
use crate::render::{
    DEFAULT_VRF_MTU, InputKind, InputRef, NodeInfo, RenderedNode, layer2_bridge_name,
    layer2_vxlan_name, loopback_capacity, sbr_vrf_name, vrf_bridge_name, vrf_vxlan_name,
};
use netwave_api::validate::parse_network;

/// The underlay MTU assumed when the configurator is not told otherwise (typical for a jumbo-frame
/// datacenter fabric).
pub const DEFAULT_UNDERLAY_MTU: u32 = 9100;
/// Linux' limit on interface names (`IFNAMSIZ - 1`).
pub const MAX_DEVICE_NAME: usize = 15;
/// Findings written into a revision's status, per list; the rest are counted in one closing line.
pub const MAX_STATUS_FINDINGS: usize = 50;
/// Nodes named in a finding's text before "and N more".
pub const NODES_SHOWN: usize = 5;

/// Address family of the VXLAN underlay (what the VTEPs talk over).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UnderlayFamily {
    #[default]
    Ipv4,
    Ipv6,
}

impl UnderlayFamily {
    /// Bytes VXLAN adds to an inner frame: outer Ethernet 14 + IP (20 or 40) + UDP 8 + VXLAN 8.
    pub fn vxlan_overhead(self) -> u32 {
        match self {
            UnderlayFamily::Ipv4 => 50,
            UnderlayFamily::Ipv6 => 70,
        }
    }
}

/// Facts about the fabric and the cluster validation needs that are not in the inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FleetParams {
    /// MTU of the underlay interfaces VXLAN packets leave through.
    pub underlay_mtu: u32,
    pub underlay_family: UnderlayFamily,
    /// Largest node config (`spec.config` of a NodeNetworkConfig, as JSON) one object may hold
    /// ([`crate::limits`]).
    pub max_object_bytes: u64,
}

impl Default for FleetParams {
    fn default() -> Self {
        FleetParams {
            underlay_mtu: DEFAULT_UNDERLAY_MTU,
            underlay_family: UnderlayFamily::Ipv4,
            max_object_bytes: crate::limits::DEFAULT_MAX_OBJECT_BYTES,
        }
    }
}

/// Which rule a finding comes from. [`Check::as_str`] is a fixed, bounded set: fit for Event reasons and
/// metric labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Check {
    /// A single object's spec is invalid (API validation or a schema range).
    ObjectSpec,
    InvalidSelector,
    DuplicateVrfName,
    DuplicateVni,
    MissingVrf,
    VrfNotOnNode,
    DuplicateVlan,
    TableCollision,
    DeviceNameTooLong,
    DeviceNameCollision,
    DeviceNotOnNode,
    MtuExceedsUnderlay,
    AnycastGatewayOverlap,
    RouteConflict,
    RulePriorityConflict,
    /// A VRF's `loopbacks[].subnet` has fewer addresses than the VRF has nodes.
    LoopbackPoolTooSmall,
    /// Loopback subnets of different VRFs overlap on a node.
    LoopbackOverlap,
    /// One `sbrPrefixes` source is steered into two VRFs on a node.
    SbrPrefixConflict,
    /// A rendered node config the agent's model refuses (the net under the checks above).
    NodeConfig,
    /// A rendered node config larger than one NodeNetworkConfig may hold ([`crate::limits`]).
    NodeConfigTooLarge,
    /// Warning: the object is on no node.
    SelectsNoNode,
    /// Warning: RoutingTables share a table id on a node.
    SharedRoutingTable,
    /// Warning: there are no nodes at all.
    NoNodes,
    /// A VRF's import or export item can never match (an earlier item covers it): a warning for a
    /// VRF, an error for a BGPPeering (its lists are what a workload may announce and is sent).
    ShadowedPrefixItem,
    /// A BGPPeering's `peeringVlan` names no Layer2NetworkConfiguration.
    MissingPeeringSegment,
    /// A BGPPeering's segment is in no VRF, or has no anycast gateway to listen on.
    PeeringSegmentUnusable,
    /// A BGPPeering is on nodes its segment is not on.
    PeeringSegmentNotOnNode,
    /// Two BGPPeerings listen on overlapping ranges, or peer with one address, in one VRF of a node.
    PeeringOverlap,
    /// A MirrorTarget's VRF does not exist or has no VNI, its loopback is not one of that VRF's, or its
    /// destination is of the other family than the loopback.
    MirrorTargetVrf,
    /// A MirrorSelector names a target or source that does not exist.
    MissingMirrorReference,
    /// A MirrorSelector's source VRF has no VNI (no device to mirror on).
    MirrorSourceUnusable,
    /// Two Underlays select one node: which one its FRR peers by would depend on their names.
    UnderlayOverlap,
    /// The inputs were cut for another render version than this build's
    /// ([`crate::render::RENDER_VERSION`]): their node configs are not this build's to render.
    RenderVersion,
}

impl Check {
    pub fn as_str(self) -> &'static str {
        match self {
            Check::ObjectSpec => "ObjectSpec",
            Check::InvalidSelector => "InvalidSelector",
            Check::DuplicateVrfName => "DuplicateVrfName",
            Check::DuplicateVni => "DuplicateVni",
            Check::MissingVrf => "MissingVrf",
            Check::VrfNotOnNode => "VrfNotOnNode",
            Check::DuplicateVlan => "DuplicateVlan",
            Check::TableCollision => "TableCollision",
            Check::DeviceNameTooLong => "DeviceNameTooLong",
            Check::DeviceNameCollision => "DeviceNameCollision",
            Check::DeviceNotOnNode => "DeviceNotOnNode",
            Check::MtuExceedsUnderlay => "MtuExceedsUnderlay",
            Check::AnycastGatewayOverlap => "AnycastGatewayOverlap",
            Check::RouteConflict => "RouteConflict",
            Check::RulePriorityConflict => "RulePriorityConflict",
            Check::LoopbackPoolTooSmall => "LoopbackPoolTooSmall",
            Check::LoopbackOverlap => "LoopbackOverlap",
            Check::SbrPrefixConflict => "SbrPrefixConflict",
            Check::NodeConfig => "NodeConfig",
            Check::NodeConfigTooLarge => "NodeConfigTooLarge",
            Check::SelectsNoNode => "SelectsNoNode",
            Check::SharedRoutingTable => "SharedRoutingTable",
            Check::NoNodes => "NoNodes",
            Check::ShadowedPrefixItem => "ShadowedPrefixItem",
            Check::MissingPeeringSegment => "MissingPeeringSegment",
            Check::PeeringSegmentUnusable => "PeeringSegmentUnusable",
            Check::PeeringSegmentNotOnNode => "PeeringSegmentNotOnNode",
            Check::PeeringOverlap => "PeeringOverlap",
            Check::MirrorTargetVrf => "MirrorTargetVrf",
            Check::MissingMirrorReference => "MissingMirrorReference",
            Check::MirrorSourceUnusable => "MirrorSourceUnusable",
            Check::UnderlayOverlap => "UnderlayOverlap",
            Check::RenderVersion => "RenderVersion",
        }
    }
}

/// One problem: the rule, the objects, the field (for single-object problems), what is wrong, and every
/// node concerned (sorted; empty when the problem is not about nodes).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Finding {
    pub check: Check,
    pub objects: Vec<InputRef>,
    pub field: Option<String>,
    pub message: String,
    pub nodes: Vec<String>,
}

/// `Kind/a, Kind/b field: message (nodes: n1, n2, n3, n4, n5 and 45 more)`.
impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, o) in self.objects.iter().enumerate() {
            write!(f, "{}{o}", if i > 0 { ", " } else { "" })?;
        }
        if let Some(field) = &self.field {
            write!(f, " {field}")?;
        }
        if !self.objects.is_empty() || self.field.is_some() {
            f.write_str(": ")?;
        }
        f.write_str(&self.message)?;
        if !self.nodes.is_empty() {
            f.write_str(" (nodes: ")?;
            for (i, n) in self.nodes.iter().take(NODES_SHOWN).enumerate() {
                write!(f, "{}{n}", if i > 0 { ", " } else { "" })?;
            }
            if self.nodes.len() > NODES_SHOWN {
                write!(f, " and {} more", self.nodes.len() - NODES_SHOWN)?;
            }
            f.write_str(")")?;
        }
        Ok(())
    }
}

/// The result of [`validate`]: both lists sorted by (check, objects, field, message).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetValidation {
    pub errors: Vec<Finding>,
    pub warnings: Vec<Finding>,
}

impl FleetValidation {
    /// No errors: the revision may be rolled out.
    pub fn is_valid(&self) -> bool {
        self.errors.is_empty()
    }

    /// The revision's `status.validation`: at most [`MAX_STATUS_FINDINGS`] lines per list (a status must
    /// stay small), then one line counting the rest.
    pub fn to_status(&self) -> ValidationResult {
        fn lines(findings: &[Finding], what: &str) -> Vec<String> {
            let mut out: Vec<String> = findings
                .iter()
                .take(MAX_STATUS_FINDINGS)
                .map(ToString::to_string)
                .collect();
            if findings.len() > MAX_STATUS_FINDINGS {
                out.push(format!(
                    "and {} more {what}",
                    findings.len() - MAX_STATUS_FINDINGS
                ));
            }
            out
        }
        ValidationResult {
            errors: lines(&self.errors, "errors"),
            warnings: lines(&self.warnings, "warnings"),
        }
    }
}

/// A revision rendered for the current nodes, with everything that blocks or concerns its rollout.
pub struct Checked {
    /// Every selected node's config; empty when rendering failed (validation then has the errors).
    pub nodes: BTreeMap<String, RenderedNode>,
    pub validation: FleetValidation,
}

/// Renders a revision and validates it: [`validate`] over the inputs, then the agent's own model
/// ([`dataplane::desired`]) and the size limit ([`crate::limits`]) over every distinct rendered node
/// config, so a config an agent would refuse, or one no NodeNetworkConfig can hold, blocks the revision
/// before any node gets it. The input checks name the object and field; the
/// rendered-config check is the net under them and names the node config's field and the nodes.
/// Node-local agent settings (name prefixes, protected interfaces, a VLAN trunk) and kernel features
/// are not known here; the agent still checks those.
pub fn render_and_validate(
    inputs: &RevisionInputs,
    nodes: &[NodeInfo],
    params: &FleetParams,
) -> Checked {
    let mut validation = validate(inputs, nodes, params);
    // Invalid selectors fail rendering, and `validate` reports those as errors; inputs of another
    // render version are reported here, so an empty render always comes with an error.
    let rendered = match crate::render::render(inputs, nodes) {
        Ok(rendered) => rendered,
        Err(e @ crate::render::RenderError::OtherVersion { .. }) => {
            validation.errors.push(Finding {
                check: Check::RenderVersion,
                objects: Vec::new(),
                field: None,
                message: e.to_string(),
                nodes: Vec::new(),
            });
            BTreeMap::new()
        }
        Err(crate::render::RenderError::InvalidSelector { .. }) => BTreeMap::new(),
    };
    if validation.errors.is_empty() {
        validation.errors = rendered_configs(&rendered, inputs, nodes, params.max_object_bytes);
    }
    Checked {
        nodes: rendered,
        validation,
    }
}

/// The size limit, then [`dataplane::desired`], over each distinct rendered config (by `configHash`).
fn rendered_configs(
    rendered: &BTreeMap<String, RenderedNode>,
    inputs: &RevisionInputs,
    nodes: &[NodeInfo],
    max_bytes: u64,
) -> Vec<Finding> {
    let mut by_hash: BTreeMap<&str, (&RenderedNode, Vec<String>)> = BTreeMap::new();
    for (node, r) in rendered {
        by_hash
            .entry(r.config_hash.as_str())
            .or_insert_with(|| (r, Vec::new()))
            .1
            .push(node.clone());
    }
    let configs: Vec<(NodeConfig, Vec<String>)> = by_hash
        .into_values()
        .map(|(r, nodes)| (r.config(), nodes))
        .collect();
    let mut out = oversized_configs(&configs, inputs, nodes, max_bytes);
    out.extend(refused_configs(configs.into_iter()));
    out.sort();
    out
}

/// One finding per config larger than `max_bytes` as JSON: its size, the limit and the largest input
/// objects its nodes get, and the nodes. Such a config could never be written (the API server refuses
/// the NodeNetworkConfig), so the revision fails validation instead of its rollout stalling there.
fn oversized_configs(
    configs: &[(NodeConfig, Vec<String>)],
    inputs: &RevisionInputs,
    nodes: &[NodeInfo],
    max_bytes: u64,
) -> Vec<Finding> {
    use crate::limits::{Bytes, LARGEST_SHOWN, contributors, json_bytes};
    let oversized: Vec<(u64, &Vec<String>)> = configs
        .iter()
        .map(|(config, names)| (json_bytes(config), names))
        .filter(|(bytes, _)| *bytes > max_bytes)
        .collect();
    if oversized.is_empty() {
        return Vec::new();
    }
    let ix = Index::build(inputs, nodes);
    let mut out = Vec::new();
    for (bytes, names) in oversized {
        // What these nodes get: every node of a config selects the same objects, so the first says.
        let group = names.first().and_then(|first| {
            let n = ix.nodes.iter().position(|n| &n.name == first)? as u32;
            ix.groups.iter().find(|g| g.nodes.contains(&n))
        });
        let selected = |o: &InputRef| {
            let sel = match o.kind {
                InputKind::Vrf => ix
                    .vrfs
                    .iter()
                    .position(|v| v.name == o.name)
                    .map(|i| ix.vrf_sel[i]),
                InputKind::Layer2 => ix
                    .l2s
                    .iter()
                    .position(|v| v.name == o.name)
                    .map(|i| ix.l2_sel[i]),
                InputKind::RoutingTable => ix
                    .rts
                    .iter()
                    .position(|v| v.name == o.name)
                    .map(|i| ix.rt_sel[i]),
                InputKind::BgpPeering => ix
                    .peerings
                    .iter()
                    .position(|v| v.name == o.name)
                    .map(|i| ix.peering_sel[i]),
                // Small, and on the nodes of the objects they name, which are listed.
                InputKind::MirrorTarget | InputKind::MirrorSelector => None,
                // At most 16 neighbours: never what makes a config large.
                InputKind::Underlay => None,
            };
            group.is_some_and(|g| sel.is_some_and(|s| g.has(s)))
        };
        let mut largest = contributors(inputs, selected);
        largest.truncate(LARGEST_SHOWN);
        out.push(Finding {
            check: Check::NodeConfigTooLarge,
            objects: Vec::new(),
            field: None,
            message: format!(
                "the node config these nodes would get (spec.config of their NodeNetworkConfig) is {}, \
                 over the limit of {} set by --max-object-bytes (etcd refuses objects over 1.5 MiB by \
                 default): no node gets this revision; shrink the objects these nodes get, or select \
                 fewer of them onto each node; the largest are {}",
                Bytes(bytes),
                Bytes(max_bytes),
                crate::limits::listed(&largest)
            ),
            nodes: names.clone(),
        });
    }
    out
}

/// One finding per config the agent's model refuses — its kernel objects ([`dataplane::desired`]) or
/// its FRR configuration ([`crate::frr::render`]) — with node-independent settings (FRR's underlay is
/// node-local and never changes what a config's VRFs and VNIs mean to FRR, so a placeholder stands in).
fn refused_configs(configs: impl Iterator<Item = (NodeConfig, Vec<String>)>) -> Vec<Finding> {
    let settings = dataplane::NodeSettings::default();
    let underlay = crate::frr::Underlay::new(crate::frr::UnderlaySettings {
        asn: 64512,
        vtep_address: "192.0.2.1".into(),
        neighbors: vec![crate::frr::NeighborSettings {
            address: None,
            interface: Some("eth0".into()),
            remote_as: crate::frr::RemoteAsSetting::Keyword("external".into()),
        }],
        ..Default::default()
    })
    .expect("the placeholder underlay is valid");
    let mut out: Vec<Finding> = configs
        .filter_map(|(config, nodes)| {
            let e = match dataplane::desired(&config, &settings) {
                Err(e) => e.to_string(),
                Ok(_) => crate::frr::render(&config, &underlay).err()?.to_string(),
            };
            Some(Finding {
                check: Check::NodeConfig,
                objects: Vec::new(),
                field: None,
                message: format!("the rendered node config is one no agent can apply: {e}"),
                nodes,
            })
        })
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod rendered_tests {
    use netwave_api::VrfConfig;

    use super::*;

    #[test]
    fn a_rendered_config_the_agent_refuses_is_an_error_naming_its_nodes() {
        let vrf = |name: &str| VrfConfig::named(name).with_device("vrf-x");
        let bad = NodeConfig {
            vrfs: vec![vrf("a"), vrf("b")],
            ..NodeConfig::default()
        };
        let found = refused_configs(
            [
                (bad, vec!["n1".to_string(), "n2".to_string()]),
                (NodeConfig::default(), vec!["n3".to_string()]),
            ]
            .into_iter(),
        );
        assert_eq!(found.len(), 1);
        assert_eq!(
            found[0].to_string(),
            "the rendered node config is one no agent can apply: device vrf-x is declared twice \
             (vrfs[0].device and vrfs[1].device) (nodes: n1, n2)"
        );
    }
}

/// Validates the whole fleet. Never panics on bad input; every problem becomes a finding.
pub fn validate(
    inputs: &RevisionInputs,
    nodes: &[NodeInfo],
    params: &FleetParams,
) -> FleetValidation {
    let mut v = Validator {
        ix: Index::build(inputs, nodes),
        params: *params,
        out: FleetValidation::default(),
    };
    v.per_object();
    v.fleet_wide();
    v.vrf_references();
    v.duplicate_vlans();
    v.tables();
    v.devices();
    v.anycast_gateways();
    v.routes_and_rules();
    v.loopbacks();
    v.sbr_prefixes();
    v.bgp_peerings();
    v.mirrors();
    v.underlays();
    v.out.errors.sort();
    v.out.errors.dedup();
    v.out.warnings.sort();
    v.out.warnings.dedup();
    v.out
}

/// An object by position in the index's canonical lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Obj {
    Vrf(usize),
    L2(usize),
    Rt(usize),
    Peer(usize),
    Underlay(usize),
}

struct Validator<'a> {
    ix: Index<'a>,
    params: FleetParams,
    out: FleetValidation,
}

impl Validator<'_> {
    fn object(&self, o: Obj) -> InputRef {
        match o {
            Obj::Vrf(i) => InputRef::new(InputKind::Vrf, &self.ix.vrfs[i].name),
            Obj::L2(i) => InputRef::new(InputKind::Layer2, &self.ix.l2s[i].name),
            Obj::Rt(i) => InputRef::new(InputKind::RoutingTable, &self.ix.rts[i].name),
            Obj::Peer(i) => InputRef::new(InputKind::BgpPeering, &self.ix.peerings[i].name),
            Obj::Underlay(i) => InputRef::new(InputKind::Underlay, &self.ix.underlays[i].name),
        }
    }

    fn sel(&self, o: Obj) -> Option<u32> {
        match o {
            Obj::Vrf(i) => self.ix.vrf_sel[i],
            Obj::L2(i) => self.ix.l2_sel[i],
            Obj::Rt(i) => self.ix.rt_sel[i],
            Obj::Peer(i) => self.ix.peering_sel[i],
            Obj::Underlay(i) => self.ix.underlay_sel[i],
        }
    }

    fn all_objects(&self) -> impl Iterator<Item = Obj> + use<> {
        let (v, l, r) = (self.ix.vrfs.len(), self.ix.l2s.len(), self.ix.rts.len());
        let (p, u) = (self.ix.peerings.len(), self.ix.underlays.len());
        (0..v)
            .map(Obj::Vrf)
            .chain((0..l).map(Obj::L2))
            .chain((0..r).map(Obj::Rt))
            .chain((0..p).map(Obj::Peer))
            .chain((0..u).map(Obj::Underlay))
    }

    /// Nodes where any of `objs` is.
    fn nodes_of(&self, objs: &[Obj]) -> Vec<String> {
        let sels: Vec<Option<u32>> = objs.iter().map(|&o| self.sel(o)).collect();
        let groups =
            (0..self.ix.groups.len()).filter(|&g| sels.iter().any(|&s| self.ix.groups[g].has(s)));
        self.ix.node_names(groups)
    }

    /// For objects that clash when they meet on a node: each subset (≥ 2, as positions in `members`) that
    /// meets, with the groups where it does.
    fn co_located(&self, members: &[Obj]) -> BTreeMap<Vec<usize>, Vec<usize>> {
        let sels: Vec<Option<u32>> = members.iter().map(|&o| self.sel(o)).collect();
        let mut out: BTreeMap<Vec<usize>, Vec<usize>> = BTreeMap::new();
        for (g, group) in self.ix.groups.iter().enumerate() {
            let present: Vec<usize> = (0..members.len()).filter(|&m| group.has(sels[m])).collect();
            if present.len() >= 2 {
                out.entry(present).or_default().push(g);
            }
        }
        out
    }

    fn push(
        &mut self,
        error: bool,
        check: Check,
        objs: &[Obj],
        field: Option<String>,
        message: String,
        nodes: Vec<String>,
    ) {
        let mut objects: Vec<InputRef> = objs.iter().map(|&o| self.object(o)).collect();
        objects.sort();
        objects.dedup();
        let finding = Finding {
            check,
            objects,
            field,
            message,
            nodes,
        };
        if error {
            self.out.errors.push(finding);
        } else {
            self.out.warnings.push(finding);
        }
    }

    /// An error about one object, on the nodes where that object is.
    fn object_error(&mut self, check: Check, o: Obj, field: &str, message: String) {
        let nodes = self.nodes_of(&[o]);
        self.push(true, check, &[o], Some(field.to_string()), message, nodes);
    }

    fn per_object(&mut self) {
        self.selector_errors();
        for i in 0..self.ix.vrfs.len() {
            self.check_vrf(i);
        }
        for i in 0..self.ix.l2s.len() {
            self.check_layer2(i);
        }
        for i in 0..self.ix.rts.len() {
            self.check_routing_table(i);
        }
        self.placement();
    }

    fn selector_errors(&mut self) {
        for (obj, errors) in self.ix.selector_errors.clone() {
            for e in errors {
                self.out.errors.push(Finding {
                    check: Check::InvalidSelector,
                    objects: vec![obj.clone()],
                    field: Some(format!("spec.nodeSelector.{}", e.path)),
                    message: e.problem.to_string(),
                    nodes: Vec::new(),
                });
            }
        }
    }

    /// Why an overlay MTU does not fit the underlay with VXLAN's overhead (`None`: it fits).
    fn mtu_problem(&self, mtu: u32) -> Option<String> {
        let overhead = self.params.underlay_family.vxlan_overhead();
        let underlay = self.params.underlay_mtu;
        let family = match self.params.underlay_family {
            UnderlayFamily::Ipv4 => "IPv4",
            UnderlayFamily::Ipv6 => "IPv6",
        };
        (mtu + overhead > underlay).then(|| {
            format!(
                "MTU {mtu} plus {overhead} bytes of VXLAN-over-{family} overhead exceeds the underlay \
                 MTU {underlay} (at most {} fits)",
                underlay.saturating_sub(overhead)
            )
        })
    }

    fn check_vrf(&mut self, i: usize) {
        let o = Obj::Vrf(i);
        let s = &self.ix.vrfs[i].spec;
        let mut problems = validate_vrf(s);
        check_vrf_name(&s.vrf, "spec.vrf", &mut problems);
        if let Some(vni) = s.vni {
            check_range(u64::from(vni), 1, 16_777_215, "spec.vni", &mut problems);
        }
        if let Some(mtu) = s.mtu {
            check_range(u64::from(mtu), 1000, 9000, "spec.mtu", &mut problems);
        }
        check_range(u64::from(s.seq), 1, 65534, "spec.seq", &mut problems);
        let too_long: Vec<String> = if s.vni.is_some() {
            vec![vrf_bridge_name(&s.vrf), vrf_vxlan_name(&s.vrf)]
        } else {
            Vec::new()
        }
        .into_iter()
        .filter(|d| d.len() > MAX_DEVICE_NAME)
        .collect();
        let mtu = s
            .vni
            .and(self.mtu_problem(s.mtu.unwrap_or(DEFAULT_VRF_MTU)));
        for p in problems {
            self.object_error(Check::ObjectSpec, o, &p.path, p.message);
        }
        for (field, items) in [("import", &s.import), ("export", &s.export)] {
            self.shadowed_items(o, field, items);
        }
        if !too_long.is_empty() {
            self.object_error(
                Check::DeviceNameTooLong,
                o,
                "spec.vrf",
                format!(
                    "device names {} are longer than {MAX_DEVICE_NAME} characters (a VRF with a VNI \
                     needs a name of at most {} characters)",
                    too_long.join(", "),
                    MAX_DEVICE_NAME - 3
                ),
            );
        }
        if let Some(m) = mtu {
            self.object_error(Check::MtuExceedsUnderlay, o, "spec.mtu", m);
        }
        let sbr = sbr_vrf_name(&s.vrf);
        if !s.sbr_prefixes.is_empty() && sbr.len() > MAX_DEVICE_NAME {
            self.object_error(
                Check::DeviceNameTooLong,
                o,
                "spec.sbrPrefixes",
                format!(
                    "the source-based-routing VRF {sbr} is longer than {MAX_DEVICE_NAME} characters \
                     (a VRF with sbrPrefixes needs a name of at most {} characters)",
                    MAX_DEVICE_NAME - 2
                ),
            );
        }
    }

    /// Warnings for a VRF's import or export items that an earlier item always matches first.
    fn shadowed_items(&mut self, o: Obj, field: &str, items: &[netwave_api::PrefixItem]) {
        for (b, a) in netwave_api::validate::shadowed_items(items) {
            let ia = &items[a];
            let action = match ia.action {
                netwave_api::PrefixAction::Permit => "permit",
                netwave_api::PrefixAction::Deny => "deny",
            };
            let message = format!(
                "never matches: {field}[{a}] ({} {} with seq {}) comes first and matches every \
                 prefix this item does (items apply in seq order; one without seq has its \
                 position + 1)",
                action,
                ia.cidr,
                ia.effective_seq(a),
            );
            let nodes = self.nodes_of(&[o]);
            self.push(
                false,
                Check::ShadowedPrefixItem,
                &[o],
                Some(format!("spec.{field}[{b}]")),
                message,
                nodes,
            );
        }
    }

    fn check_layer2(&mut self, i: usize) {
        let o = Obj::L2(i);
        let s = &self.ix.l2s[i].spec;
        let mut problems = validate_layer2(s);
        check_range(u64::from(s.id), 1, 4094, "spec.id", &mut problems);
        check_range(u64::from(s.vni), 1, 16_777_215, "spec.vni", &mut problems);
        check_range(u64::from(s.mtu), 1000, 9000, "spec.mtu", &mut problems);
        if let Some(vrf) = &s.vrf {
            check_vrf_name(vrf, "spec.vrf", &mut problems);
        }
        let mtu = self.mtu_problem(s.mtu);
        for p in problems {
            self.object_error(Check::ObjectSpec, o, &p.path, p.message);
        }
        if let Some(m) = mtu {
            self.object_error(Check::MtuExceedsUnderlay, o, "spec.mtu", m);
        }
    }

    fn check_routing_table(&mut self, i: usize) {
        let o = Obj::Rt(i);
        let s = &self.ix.rts[i].spec;
        let problems = validate_routing_table(s);
        self.routes_of_one_table(o, &problems);
        let mut long = Vec::new();
        for (j, r) in s.routes.iter().enumerate() {
            if let Some(dev) = r.dev.as_ref().filter(|d| d.len() > MAX_DEVICE_NAME) {
                long.push((format!("spec.routes[{j}].dev"), dev.clone()));
            }
        }
        for (j, r) in s.rules.iter().enumerate() {
            if let Some(dev) = r.iif.as_ref().filter(|d| d.len() > MAX_DEVICE_NAME) {
                long.push((format!("spec.rules[{j}].iif"), dev.clone()));
            }
        }
        for p in problems {
            self.object_error(Check::ObjectSpec, o, &p.path, p.message);
        }
        for (field, dev) in long {
            self.object_error(
                Check::DeviceNameTooLong,
                o,
                &field,
                format!("device name {dev} is longer than {MAX_DEVICE_NAME} characters"),
            );
        }
    }

    /// Placement warnings: no nodes at all, or an object whose selector matches none.
    fn placement(&mut self) {
        if self.ix.nodes.is_empty() {
            if self.all_objects().next().is_some() {
                self.push(
                    false,
                    Check::NoNodes,
                    &[],
                    None,
                    "the cluster has no nodes: nothing will be rolled out".into(),
                    Vec::new(),
                );
            }
            return;
        }
        for o in self.all_objects() {
            let sel = self.sel(o);
            if sel.is_some() && !self.ix.groups.iter().any(|g| g.has(sel)) {
                self.push(
                    false,
                    Check::SelectsNoNode,
                    &[o],
                    Some("spec.nodeSelector".into()),
                    "selects no node, so it is rolled out nowhere".into(),
                    Vec::new(),
                );
            }
        }
    }

    /// BGPPeerings: each spec on its own, the segment a `peeringVlan` names (it exists, is in a VRF,
    /// has a gateway subnet to listen on and is on every node the peering is), and no two peerings
    /// listening on overlapping ranges or calling one address in one VRF of a node (FRR would give the
    /// session to one of them).
    fn bgp_peerings(&mut self) {
        for i in 0..self.ix.peerings.len() {
            let o = Obj::Peer(i);
            let s = &self.ix.peerings[i].spec;
            for p in netwave_api::validate::validate_bgp_peering(s) {
                self.object_error(Check::ObjectSpec, o, &p.path, p.message);
            }
            for (field, items) in [("import", &s.import), ("export", &s.export)] {
                for (b, a) in netwave_api::validate::shadowed_items(items) {
                    self.object_error(
                        Check::ShadowedPrefixItem,
                        o,
                        &format!("spec.{field}[{b}]"),
                        format!(
                            "never matches: spec.{field}[{a}] ({}, seq {}) comes first and matches every \
                             prefix this item does; reorder or remove one (items apply in seq order; one \
                             without seq has its position + 1)",
                            items[a].cidr,
                            items[a].effective_seq(a)
                        ),
                    );
                }
            }
            let Some(vlan) = s.peering_vlan.as_ref().map(|v| v.name.clone()) else {
                continue;
            };
            if vlan.is_empty() {
                continue;
            }
            let Some(l) = self.ix.l2s.iter().position(|l| l.name == vlan) else {
                self.object_error(
                    Check::MissingPeeringSegment,
                    o,
                    "spec.peeringVlan.name",
                    format!("segment {vlan} does not exist (no Layer2NetworkConfiguration is named {vlan})"),
                );
                continue;
            };
            let seg = &self.ix.l2s[l].spec;
            // The peering is what is wrong (the segment may serve other purposes): only it is named.
            if seg.vrf.is_none() {
                self.object_error(
                    Check::PeeringSegmentUnusable,
                    o,
                    "spec.peeringVlan.name",
                    format!(
                        "segment {vlan} is in no VRF (its spec.vrf is empty): a peering segment's \
                         sessions live in the segment's VRF"
                    ),
                );
            }
            if seg.anycast_gateways.is_empty() {
                self.object_error(
                    Check::PeeringSegmentUnusable,
                    o,
                    "spec.peeringVlan.name",
                    format!(
                        "segment {vlan} has no anycastGateways: the nodes listen for sessions from the \
                         gateway subnets, and it has none"
                    ),
                );
            }
            let (peer_sel, seg_sel) = (self.sel(o), self.sel(Obj::L2(l)));
            let missing: Vec<usize> = (0..self.ix.groups.len())
                .filter(|&g| self.ix.groups[g].has(peer_sel) && !self.ix.groups[g].has(seg_sel))
                .collect();
            if !missing.is_empty() {
                let nodes = self.ix.node_names(missing);
                self.push(
                    true,
                    Check::PeeringSegmentNotOnNode,
                    &[o],
                    Some("spec.peeringVlan.name".into()),
                    format!(
                        "segment {vlan} is not on these nodes (its nodeSelector does not select them), \
                         but the peering is"
                    ),
                    nodes,
                );
            }
        }
        self.peering_overlaps();
    }

    /// Listen ranges and addresses of every peering, by VRF (`None`: the default VRF).
    fn peering_overlaps(&mut self) {
        let l2s = self.ix.l2s.clone();
        let mut claims: BTreeMap<Option<String>, Vec<(usize, IpNet, bool)>> = BTreeMap::new();
        for (i, p) in self.ix.peerings.iter().enumerate() {
            let s = &p.spec;
            if let Some(seg) = s
                .peering_vlan
                .as_ref()
                .and_then(|v| l2s.iter().find(|l| l.name == v.name))
            {
                for g in &seg.spec.anycast_gateways {
                    if let Ok(net) = parse_host_address(g) {
                        claims.entry(seg.spec.vrf.clone()).or_default().push((
                            i,
                            net.trunc(),
                            true,
                        ));
                    }
                }
            }
            for ip in s.loopback_peer.iter().flat_map(|lo| &lo.ip_addresses) {
                if let Ok(addr) = ip.parse::<std::net::IpAddr>() {
                    claims
                        .entry(None)
                        .or_default()
                        .push((i, IpNet::from(addr), false));
                }
            }
        }
        for (vrf, list) in claims {
            for (x, &(a, na, ra)) in list.iter().enumerate() {
                for &(b, nb, rb) in &list[x + 1..] {
                    if a == b || !(na.contains(&nb) || nb.contains(&na)) {
                        continue;
                    }
                    let members = [Obj::Peer(a), Obj::Peer(b)];
                    for (_, groups) in self.co_located(&members) {
                        let nodes = self.ix.node_names(groups);
                        let what = |n: IpNet, range: bool| {
                            if range {
                                format!("listen range {n}")
                            } else {
                                format!("address {}", n.addr())
                            }
                        };
                        self.push(
                            true,
                            Check::PeeringOverlap,
                            &members,
                            None,
                            format!(
                                "{} and {} overlap in {} on the same node: FRR would give a session to \
                                 only one of the two peerings",
                                what(na, ra),
                                what(nb, rb),
                                vrf.as_deref().map_or("the default VRF".to_string(), |v| format!("VRF {v}"))
                            ),
                            nodes,
                        );
                    }
                }
            }
        }
    }

    fn vrfs_named(&self) -> BTreeMap<&str, Vec<Obj>> {
        let mut by_name: BTreeMap<&str, Vec<Obj>> = BTreeMap::new();
        for (i, v) in self.ix.vrfs.iter().enumerate() {
            by_name
                .entry(v.spec.vrf.as_str())
                .or_default()
                .push(Obj::Vrf(i));
        }
        by_name
    }

    fn fleet_wide(&mut self) {
        let by_name: Vec<(String, Vec<Obj>)> = self
            .vrfs_named()
            .into_iter()
            .filter(|(_, objs)| objs.len() > 1)
            .map(|(n, objs)| (n.to_string(), objs))
            .collect();
        for (name, objs) in by_name {
            let nodes = self.nodes_of(&objs);
            self.push(
                true,
                Check::DuplicateVrfName,
                &objs,
                None,
                format!("VRF name {name} is defined by more than one object"),
                nodes,
            );
        }
        let mut by_vni: BTreeMap<u32, Vec<Obj>> = BTreeMap::new();
        for (i, v) in self.ix.vrfs.iter().enumerate() {
            if let Some(vni) = v.spec.vni {
                by_vni.entry(vni).or_default().push(Obj::Vrf(i));
            }
        }
        for (i, l) in self.ix.l2s.iter().enumerate() {
            by_vni.entry(l.spec.vni).or_default().push(Obj::L2(i));
        }
        for (vni, objs) in by_vni.into_iter().filter(|(_, o)| o.len() > 1) {
            let nodes = self.nodes_of(&objs);
            self.push(
                true,
                Check::DuplicateVni,
                &objs,
                None,
                format!(
                    "VNI {vni} is used by more than one object; a VNI names one VRF or segment across \
                     the whole fabric"
                ),
                nodes,
            );
        }
    }

    /// Layer-2 segments name a VRF that must exist, and be on every node the segment is on.
    fn vrf_references(&mut self) {
        let by_name: BTreeMap<String, Vec<Obj>> = self
            .vrfs_named()
            .into_iter()
            .map(|(n, o)| (n.to_string(), o))
            .collect();
        for i in 0..self.ix.l2s.len() {
            let o = Obj::L2(i);
            let Some(vrf) = self.ix.l2s[i].spec.vrf.clone() else {
                continue;
            };
            let Some(owners) = by_name.get(&vrf) else {
                self.object_error(
                    Check::MissingVrf,
                    o,
                    "spec.vrf",
                    format!(
                        "VRF {vrf} does not exist (no VRFRouteConfiguration has spec.vrf: {vrf})"
                    ),
                );
                continue;
            };
            let own_sels: Vec<Option<u32>> = owners.iter().map(|&v| self.sel(v)).collect();
            let l2_sel = self.sel(o);
            let missing: Vec<usize> = (0..self.ix.groups.len())
                .filter(|&g| {
                    let group = &self.ix.groups[g];
                    group.has(l2_sel) && !own_sels.iter().any(|&s| group.has(s))
                })
                .collect();
            if !missing.is_empty() {
                let nodes = self.ix.node_names(missing);
                let mut objs = vec![o];
                objs.extend(owners);
                self.push(
                    true,
                    Check::VrfNotOnNode,
                    &objs,
                    Some("spec.vrf".into()),
                    format!(
                        "VRF {vrf} is not on these nodes (its nodeSelector does not select them), but the \
                         segment is"
                    ),
                    nodes,
                );
            }
        }
    }

    fn duplicate_vlans(&mut self) {
        let mut by_vlan: BTreeMap<u16, Vec<Obj>> = BTreeMap::new();
        for (i, l) in self.ix.l2s.iter().enumerate() {
            by_vlan.entry(l.spec.id).or_default().push(Obj::L2(i));
        }
        for (vlan, members) in by_vlan.into_iter().filter(|(_, m)| m.len() > 1) {
            for (subset, groups) in self.co_located(&members) {
                let objs: Vec<Obj> = subset.iter().map(|&m| members[m]).collect();
                let nodes = self.ix.node_names(groups);
                self.push(
                    true,
                    Check::DuplicateVlan,
                    &objs,
                    None,
                    format!("VLAN {vlan} is used by more than one segment on the same node"),
                    nodes,
                );
            }
        }
    }

    fn tables(&mut self) {
        let mut by_table: BTreeMap<u32, Vec<Obj>> = BTreeMap::new();
        for (i, &t) in self.ix.vrf_tables.iter().enumerate() {
            by_table.entry(t).or_default().push(Obj::Vrf(i));
        }
        for (i, t) in self.ix.sbr_tables.iter().enumerate() {
            if let Some(t) = *t {
                by_table.entry(t).or_default().push(Obj::Vrf(i));
            }
        }
        for (i, r) in self.ix.rts.iter().enumerate() {
            by_table
                .entry(r.spec.table_id)
                .or_default()
                .push(Obj::Rt(i));
        }
        for (table, members) in by_table.into_iter().filter(|(_, m)| m.len() > 1) {
            for (subset, groups) in self.co_located(&members) {
                let objs: Vec<Obj> = subset.iter().map(|&m| members[m]).collect();
                let nodes = self.ix.node_names(groups);
                if objs.iter().any(|o| matches!(o, Obj::Vrf(_))) {
                    self.push(
                        true,
                        Check::TableCollision,
                        &objs,
                        None,
                        format!(
                            "routing table {table} is claimed by more than one object on the same node; \
                             a VRF needs a table of its own"
                        ),
                        nodes,
                    );
                } else {
                    self.push(
                        false,
                        Check::SharedRoutingTable,
                        &objs,
                        None,
                        format!(
                            "RoutingTables share table {table} on the same node; their routes and rules \
                             are merged"
                        ),
                        nodes,
                    );
                }
            }
        }
    }

    /// Every device name netwave creates, with the objects creating it and what it is.
    fn device_owners(&self) -> BTreeMap<String, Vec<(Obj, String)>> {
        let mut owners: BTreeMap<String, Vec<(Obj, String)>> = BTreeMap::new();
        for (i, v) in self.ix.vrfs.iter().enumerate() {
            let s = &v.spec;
            let o = Obj::Vrf(i);
            let vrf = &s.vrf;
            owners
                .entry(vrf.clone())
                .or_default()
                .push((o, format!("VRF device of VRF {vrf}")));
            if !s.sbr_prefixes.is_empty() {
                owners
                    .entry(sbr_vrf_name(vrf))
                    .or_default()
                    .push((o, format!("source-based-routing VRF of VRF {vrf}")));
            }
            if s.vni.is_some() {
                owners
                    .entry(vrf_bridge_name(vrf))
                    .or_default()
                    .push((o, format!("L3 VNI bridge of VRF {vrf}")));
                owners
                    .entry(vrf_vxlan_name(vrf))
                    .or_default()
                    .push((o, format!("L3 VNI VXLAN device of VRF {vrf}")));
            }
        }
        for (i, l) in self.ix.l2s.iter().enumerate() {
            let vlan = l.spec.id;
            owners
                .entry(layer2_bridge_name(vlan))
                .or_default()
                .push((Obj::L2(i), format!("bridge of VLAN {vlan}")));
            owners
                .entry(layer2_vxlan_name(vlan))
                .or_default()
                .push((Obj::L2(i), format!("VXLAN device of VLAN {vlan}")));
        }
        owners
    }

    fn devices(&mut self) {
        let owners = self.device_owners();
        for (device, claims) in &owners {
            // Same-named VRFs and same-VLAN segments clash on every device they make; DuplicateVrfName and
            // DuplicateVlan already say so once. Report only clashes between different kinds of names.
            let roles: BTreeSet<&str> = claims.iter().map(|(_, r)| r.as_str()).collect();
            if roles.len() < 2 {
                continue;
            }
            let members: Vec<Obj> = claims.iter().map(|(o, _)| *o).collect();
            for (subset, groups) in self.co_located(&members) {
                let roles: BTreeSet<&str> = subset.iter().map(|&m| claims[m].1.as_str()).collect();
                if roles.len() < 2 {
                    continue;
                }
                let objs: Vec<Obj> = subset.iter().map(|&m| members[m]).collect();
                let nodes = self.ix.node_names(groups);
                self.push(
                    true,
                    Check::DeviceNameCollision,
                    &objs,
                    None,
                    format!(
                        "device {device} would be the {} on the same node",
                        roles.into_iter().collect::<Vec<_>>().join(" and the ")
                    ),
                    nodes,
                );
            }
        }
        // Routes and rules naming a netwave device must only be on nodes that have it. Names netwave does
        // not create (eth0, bond0, …) are the node's own business.
        for i in 0..self.ix.rts.len() {
            let o = Obj::Rt(i);
            let s = &self.ix.rts[i].spec;
            let refs: Vec<(String, &str)> =
                s.routes
                    .iter()
                    .enumerate()
                    .filter_map(|(j, r)| Some((format!("spec.routes[{j}].dev"), r.dev.as_deref()?)))
                    .chain(s.rules.iter().enumerate().filter_map(|(j, r)| {
                        Some((format!("spec.rules[{j}].iif"), r.iif.as_deref()?))
                    }))
                    .collect();
            for (field, dev) in refs {
                let Some(claims) = owners.get(dev) else {
                    continue;
                };
                let own_sels: Vec<Option<u32>> = claims.iter().map(|(c, _)| self.sel(*c)).collect();
                let rt_sel = self.sel(o);
                let missing: Vec<usize> = (0..self.ix.groups.len())
                    .filter(|&g| {
                        let group = &self.ix.groups[g];
                        group.has(rt_sel) && !own_sels.iter().any(|&s| group.has(s))
                    })
                    .collect();
                if missing.is_empty() {
                    continue;
                }
                let nodes = self.ix.node_names(missing);
                let mut objs = vec![o];
                objs.extend(claims.iter().map(|(c, _)| *c));
                let what = claims[0].1.clone();
                self.push(
                    true,
                    Check::DeviceNotOnNode,
                    &objs,
                    Some(field),
                    format!("device {dev} ({what}) is not on these nodes, but the RoutingTable is"),
                    nodes,
                );
            }
        }
    }

    /// Gateways of different segments in the same VRF must not overlap where the segments meet: the
    /// kernel would hold two connected routes for the same addresses in one table.
    ///
    /// Checked per group of nodes, never per pair of segments: rack-local segments that all reuse one
    /// gateway subnet are common and fine, and pairing them up fleet-wide would be quadratic.
    fn anycast_gateways(&mut self) {
        // Per VRF, every gateway network (sorted once): (network, segment, gateway as written).
        let mut by_vrf: BTreeMap<Option<&str>, Vec<(IpNet, usize, &str)>> = BTreeMap::new();
        for (i, l) in self.ix.l2s.iter().enumerate() {
            for g in &l.spec.anycast_gateways {
                if let Ok(net) = parse_host_address(g) {
                    by_vrf.entry(l.spec.vrf.as_deref()).or_default().push((
                        net.trunc(),
                        i,
                        g.as_str(),
                    ));
                }
            }
        }
        for nets in by_vrf.values_mut() {
            // A containing prefix sorts before what it contains, so one pass with a stack of nested
            // prefixes finds every gateway's containers.
            nets.sort();
        }
        // (segment a, segment b) → (gateway of a, gateway of b, VRF, groups)
        type Pair = (String, String, String, Vec<usize>);
        let mut pairs: BTreeMap<(usize, usize), Pair> = BTreeMap::new();
        let mut stack: Vec<(IpNet, usize, &str)> = Vec::new();
        for (g, group) in self.ix.groups.iter().enumerate() {
            for (vrf, nets) in &by_vrf {
                stack.clear();
                for &cur in nets.iter().filter(|n| group.has(self.ix.l2_sel[n.1])) {
                    while stack.last().is_some_and(|top| !top.0.contains(&cur.0)) {
                        stack.pop();
                    }
                    // Report the nearest container from another segment: every overlapping segment shows
                    // up in some finding, and a node with many overlaps yields a linear number of them.
                    if let Some(outer) = stack.iter().rev().find(|o| o.1 != cur.1) {
                        let (a, b) = if outer.1 < cur.1 {
                            (outer, &cur)
                        } else {
                            (&cur, outer)
                        };
                        let entry = pairs.entry((a.1, b.1)).or_insert_with(|| {
                            (
                                a.2.to_string(),
                                b.2.to_string(),
                                vrf.unwrap_or("default").to_string(),
                                Vec::new(),
                            )
                        });
                        if entry.3.last() != Some(&g) {
                            entry.3.push(g);
                        }
                    }
                    stack.push(cur);
                }
            }
        }
        for ((a, b), (ga, gb, vrf, groups)) in pairs {
            let nodes = self.ix.node_names(groups);
            self.push(
                true,
                Check::AnycastGatewayOverlap,
                &[Obj::L2(a), Obj::L2(b)],
                None,
                format!(
                    "anycast gateways {ga} and {gb} overlap in VRF {vrf}, and both segments are on the \
                     same node"
                ),
                nodes,
            );
        }
    }

    /// Every route of one RoutingTable as the agent will see it (`dataplane::route`: next hop or device
    /// by type, address families, the main table's default route), and two routes of the table with one
    /// kernel identity. Routes whose prefix the API validation already refused are skipped.
    fn routes_of_one_table(&mut self, o: Obj, api_problems: &[FieldError]) {
        let Obj::Rt(i) = o else { return };
        let (routes, _) = crate::render::table_config(self.ix.rts[i]);
        let mut seen: BTreeMap<dataplane::RouteKey, usize> = BTreeMap::new();
        for (j, rc) in routes.iter().enumerate() {
            let at = format!("spec.routes[{j}]");
            if api_problems.iter().any(|p| p.path.starts_with(&at)) {
                continue;
            }
            let route = match dataplane::route(rc, &at) {
                Ok(r) => r,
                Err(e) => {
                    let field = e.field().to_string();
                    let text = e.to_string();
                    let message = text
                        .strip_prefix(&format!("{field}: "))
                        .unwrap_or(&text)
                        .to_string();
                    self.object_error(Check::ObjectSpec, o, &field, message);
                    continue;
                }
            };
            if let Some(first) = seen.get(&route.key) {
                self.object_error(
                    Check::RouteConflict,
                    o,
                    &at,
                    format!(
                        "the same kernel route as spec.routes[{first}] ({}): the kernel keeps one route \
                         per table, prefix and metric, and a route without a metric has metric 0 \
                         (IPv4) or 1024 (IPv6)",
                        route.key
                    ),
                );
            } else {
                seen.insert(route.key, j);
            }
        }
    }

    /// Routes with the same kernel identity (`dataplane::route_key`), or rules with the same priority,
    /// that differ between RoutingTables on one node. (Within one RoutingTable: `routes_of_one_table`.)
    fn routes_and_rules(&mut self) {
        let mut routes: BTreeMap<dataplane::RouteKey, Vec<(usize, dataplane::Route)>> =
            BTreeMap::new();
        let mut rules: BTreeMap<u32, Vec<(usize, RuleConfig)>> = BTreeMap::new();
        for (i, rt) in self.ix.rts.iter().enumerate() {
            // Compare what the kernel gets, so equal routes written differently merge.
            let (rendered_routes, rendered_rules) = crate::render::table_config(rt);
            for (j, route) in rendered_routes.iter().enumerate() {
                // A route the kernel cannot take is reported by `routes_of_one_table`.
                if let Ok(r) = dataplane::route(route, &format!("spec.routes[{j}]")) {
                    routes.entry(r.key.clone()).or_default().push((i, r));
                }
            }
            for rule in rendered_rules {
                rules.entry(rule.priority).or_default().push((i, rule));
            }
        }
        fn conflicting<T: PartialEq>(entries: &[(usize, T)]) -> Option<Vec<Obj>> {
            let mut rts: Vec<usize> = entries.iter().map(|(i, _)| *i).collect();
            rts.dedup();
            let differ = entries.iter().any(|(_, e)| e != &entries[0].1);
            (rts.len() > 1 && differ).then(|| rts.into_iter().map(Obj::Rt).collect())
        }
        for (key, entries) in routes {
            let Some(members) = conflicting(&entries) else {
                continue;
            };
            for (subset, groups) in self.co_located(&members) {
                let objs: Vec<Obj> = subset.iter().map(|&m| members[m]).collect();
                let nodes = self.ix.node_names(groups);
                self.push(
                    true,
                    Check::RouteConflict,
                    &objs,
                    None,
                    format!(
                        "route {key} is defined differently by more than one RoutingTable on the same \
                         node (a route without a metric has metric 0 for IPv4, 1024 for IPv6)"
                    ),
                    nodes,
                );
            }
        }
        for (priority, entries) in rules {
            let Some(members) = conflicting(&entries) else {
                continue;
            };
            for (subset, groups) in self.co_located(&members) {
                let objs: Vec<Obj> = subset.iter().map(|&m| members[m]).collect();
                let nodes = self.ix.node_names(groups);
                self.push(
                    true,
                    Check::RulePriorityConflict,
                    &objs,
                    None,
                    format!(
                        "rule priority {priority} is used by different rules of more than one \
                         RoutingTable on the same node"
                    ),
                    nodes,
                );
            }
        }
    }
}

impl Validator<'_> {
    /// Every node of a VRF gets an address of each of its loopback subnets: the pool must hold them
    /// all. Pools of different VRFs that meet on a node must not overlap (the same address in two
    /// VRFs, both announced, is ambiguous wherever they are leaked together).
    fn loopbacks(&mut self) {
        let mut pools: Vec<(IpNet, Obj, String)> = Vec::new();
        for i in 0..self.ix.vrfs.len() {
            let o = Obj::Vrf(i);
            let loopbacks = self.ix.vrfs[i].spec.loopbacks.clone();
            if loopbacks.is_empty() {
                continue;
            }
            let nodes = self.nodes_of(&[o]);
            for (j, lb) in loopbacks.iter().enumerate() {
                let Ok(subnet) = parse_network(&lb.subnet) else {
                    continue; // the object's own validation reports it
                };
                let field = format!("spec.loopbacks[{j}].subnet");
                let capacity = loopback_capacity(&subnet);
                if nodes.len() as u128 > capacity {
                    self.push(
                        true,
                        Check::LoopbackPoolTooSmall,
                        &[o],
                        Some(field.clone()),
                        format!(
                            "{subnet} has {capacity} node address(es) but the VRF is on {} nodes; use \
                             a larger subnet or select fewer nodes",
                            nodes.len()
                        ),
                        nodes.clone(),
                    );
                }
                pools.push((subnet, o, field));
            }
        }
        for a in 0..pools.len() {
            for b in a + 1..pools.len() {
                let ((na, oa, fa), (nb, ob, fb)) = (&pools[a], &pools[b]);
                if oa == ob || !(na.contains(nb) || nb.contains(na)) {
                    continue;
                }
                for (_, groups) in self.co_located(&[*oa, *ob]) {
                    let nodes = self.ix.node_names(groups);
                    self.push(
                        true,
                        Check::LoopbackOverlap,
                        &[*oa, *ob],
                        Some(fa.clone()),
                        format!(
                            "loopback subnet {na} overlaps {nb} ({} {fb}) on the same node",
                            self.object(*ob)
                        ),
                        nodes,
                    );
                }
            }
        }
    }

    /// A source prefix steered into two VRFs on one node: only one rule can win.
    fn sbr_prefixes(&mut self) {
        let mut by_prefix: BTreeMap<IpNet, Vec<(Obj, usize)>> = BTreeMap::new();
        for (i, v) in self.ix.vrfs.iter().enumerate() {
            for (j, p) in v.spec.sbr_prefixes.iter().enumerate() {
                if let Ok(net) = parse_network(p) {
                    by_prefix.entry(net).or_default().push((Obj::Vrf(i), j));
                }
            }
        }
        for (prefix, claims) in by_prefix.into_iter().filter(|(_, c)| c.len() > 1) {
            let members: Vec<Obj> = claims.iter().map(|c| c.0).collect();
            for (subset, groups) in self.co_located(&members) {
                let objs: Vec<Obj> = subset.iter().map(|&m| members[m]).collect();
                let nodes = self.ix.node_names(groups);
                let (_, j) = claims[subset[0]];
                self.push(
                    true,
                    Check::SbrPrefixConflict,
                    &objs,
                    Some(format!("spec.sbrPrefixes[{j}]")),
                    format!("source {prefix} is steered into more than one VRF on the same node"),
                    nodes,
                );
            }
        }
    }
}

fn check_range(value: u64, min: u64, max: u64, path: &str, problems: &mut Vec<FieldError>) {
    if !(min..=max).contains(&value) {
        problems.push(FieldError {
            path: path.to_string(),
            message: format!("{value} is out of range {min}..={max}"),
        });
    }
}

fn check_vrf_name(name: &str, path: &str, problems: &mut Vec<FieldError>) {
    let ok = (1..=MAX_DEVICE_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'));
    if !ok {
        problems.push(FieldError {
            path: path.to_string(),
            message: format!(
                "{name:?} is not a VRF name: 1 to {MAX_DEVICE_NAME} characters of [a-zA-Z0-9._-] (it \
                 becomes a kernel device name)"
            ),
        });
    }
}
