//! The dataplane model: what a node's config *means* to the kernel, as plain data — the one definition
//! the agent applies and fleet validation checks before a revision touches any node. Both sides of an
//! agent's reconcile use it: [`desired`] builds it from a [`NodeConfig`] plus node-local
//! [`NodeSettings`], and the agent's netlink shell observes the kernel into it, so [`diff`] can compare
//! them without a kernel.
//!
//! ```text
//!  NodeConfig + NodeSettings ──desired──► Dataplane ─┐
//!  kernel ──(agent: netlink observe)──► Observed ────┴─diff──► Vec<NetOp> ──(agent: netlink apply)
//!  RoutingTable route ──route──► Route (the kernel's identity and defaults: RouteKey)
//! ```
//!
//! Ownership: a link is the agent's when its alias is [`MANAGED_ALIAS`] (and, when the node configures
//! name prefixes, its name starts with one of them); a route or rule is the agent's when its protocol is
//! [`RTPROT_NETWAVE`]. Nothing else is ever changed or deleted.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use netwave_api::{NodeConfig, RouteConfig, RouteType};
use serde::{Deserialize, Serialize};

pub mod diff;

/// Link alias (`IFLA_IFALIAS`) that marks a link as created and owned by the agent.
pub const MANAGED_ALIAS: &str = "netwave:managed";

/// Route and rule protocol (`rtm_protocol` / `FRA_PROTOCOL`) that marks a route or rule as the agent's.
/// 242 (0xf2) is unassigned in iproute2's `rt_protos` and far from the routing daemons' values
/// (zebra 11, bird 12, bgp 186 … eigrp 192); `ip route show proto 242` lists what the agent owns.
pub const RTPROT_NETWAVE: u8 = 242;

/// IANA VXLAN UDP port.
pub const VXLAN_PORT: u16 = 4789;

/// Metric the kernel gives an IPv6 route added without one (`IP6_RT_PRIO_USER`).
pub const IPV6_DEFAULT_METRIC: u32 = 1024;

/// Main routing table id: its default route is never the agent's to touch.
pub const MAIN_TABLE: u32 = 254;

/// Node-local settings that are not part of the rollout (they differ per node and never change with a
/// revision).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSettings {
    /// Underlay address VXLAN devices send from (`local`); none lets the kernel choose.
    pub vxlan_local: Option<IpAddr>,
    /// VXLAN UDP destination port.
    pub vxlan_port: u16,
    /// Physical trunk interface; when set, every layer-2 segment also gets a VLAN sub-interface
    /// (`vlan.<id>`) on it, enslaved to the segment's bridge.
    pub vlan_trunk: Option<String>,
    /// When non-empty, a link is only ever considered the agent's if its name starts with one of these
    /// (in addition to the alias marker), and desired devices must be named accordingly.
    pub name_prefixes: Vec<String>,
    /// Interfaces the agent must never touch, whatever their alias says (e.g. the management NIC).
    pub protected: Vec<String>,
}

impl Default for NodeSettings {
    fn default() -> Self {
        NodeSettings {
            vxlan_local: None,
            vxlan_port: VXLAN_PORT,
            vlan_trunk: None,
            name_prefixes: Vec::new(),
            protected: Vec::new(),
        }
    }
}

impl NodeSettings {
    /// Whether a link with this name and alias belongs to the agent.
    pub fn owns(&self, name: &str, alias: Option<&str>) -> bool {
        alias == Some(MANAGED_ALIAS) && self.name_allowed(name)
    }

    fn name_allowed(&self, name: &str) -> bool {
        !self.protected.iter().any(|p| p == name)
            && self.vlan_trunk.as_deref() != Some(name)
            && (self.name_prefixes.is_empty()
                || self.name_prefixes.iter().any(|p| name.starts_with(p)))
    }
}

/// A 48-bit MAC address.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Mac(pub [u8; 6]);

impl Mac {
    pub fn parse(s: &str) -> Option<Mac> {
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for b in &mut out {
            let p = parts.next()?;
            if p.len() != 2 {
                return None;
            }
            *b = u8::from_str_radix(p, 16).ok()?;
        }
        parts.next().is_none().then_some(Mac(out))
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl fmt::Debug for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// What kind of device a link is, with the parameters the kernel cannot change in place: a difference in
/// any of them means delete and recreate.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum LinkKind {
    Vrf {
        table: u32,
    },
    Bridge,
    Vxlan {
        vni: u32,
        local: Option<IpAddr>,
        port: u16,
        learning: bool,
    },
    Vlan {
        parent: String,
        id: u16,
    },
    /// A mirror tunnel (MirrorTarget): `gretap`/`ip6gretap` when `tap` (l2gre), else `gre`/`ip6gre`
    /// (l3gre), by the family of its ends. Enslaved to its VRF, which is also its underlay device
    /// (`IFLA_GRE_LINK`), so its packets are routed in the VRF.
    Gre {
        tap: bool,
        /// The underlay device (`IFLA_GRE_LINK`): the VRF the tunnel routes its packets in.
        dev: String,
        local: IpAddr,
        remote: IpAddr,
        key: Option<u32>,
    },
}

impl LinkKind {
    /// Creation order: masters before the ports enslaved to them (VRF ← bridge ← vxlan/vlan).
    pub fn rank(&self) -> u8 {
        match self {
            LinkKind::Vrf { .. } => 0,
            LinkKind::Bridge | LinkKind::Gre { .. } => 1,
            LinkKind::Vxlan { .. } | LinkKind::Vlan { .. } => 2,
        }
    }

    /// Created with another managed device's index in it (a tunnel's underlay VRF): after the
    /// other links, in a stage of its own.
    pub fn needs_device(&self) -> bool {
        matches!(self, LinkKind::Gre { .. })
    }

    pub fn feature(&self) -> Feature {
        match self {
            LinkKind::Vrf { .. } => Feature::Vrf,
            LinkKind::Bridge => Feature::Bridge,
            LinkKind::Vxlan { .. } => Feature::Vxlan,
            LinkKind::Vlan { .. } => Feature::Vlan,
            LinkKind::Gre { .. } => Feature::Gre,
        }
    }
}

impl fmt::Display for LinkKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkKind::Vrf { table } => write!(f, "vrf table {table}"),
            LinkKind::Bridge => write!(f, "bridge"),
            LinkKind::Vxlan {
                vni,
                local,
                port,
                learning,
            } => {
                write!(f, "vxlan id {vni}")?;
                if let Some(l) = local {
                    write!(f, " local {l}")?;
                }
                write!(f, " dstport {port}")?;
                if !learning {
                    write!(f, " nolearning")?;
                }
                Ok(())
            }
            LinkKind::Vlan { parent, id } => write!(f, "vlan link {parent} id {id}"),
            LinkKind::Gre {
                tap,
                dev,
                local,
                remote,
                key,
            } => {
                write!(
                    f,
                    "{} dev {dev} local {local} remote {remote}",
                    gre_kind(*tap, local)
                )?;
                if let Some(k) = key {
                    write!(f, " key {k}")?;
                }
                Ok(())
            }
        }
    }
}

/// One managed link and everything the agent sets on it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub name: String,
    pub kind: LinkKind,
    /// `None`: the agent does not care (e.g. a VRF device keeps the kernel's default).
    pub mtu: Option<u32>,
    /// `None`: the kernel's choice is fine.
    pub mac: Option<Mac>,
    /// The link's master (VRF or bridge) by name.
    pub master: Option<String>,
    pub up: bool,
    /// Bridge port flag `neigh_suppress` (only meaningful while enslaved to a bridge).
    pub neigh_suppress: bool,
    /// Addresses with prefix length (`10.250.0.1/24`); IPv6 link-local addresses are the kernel's and
    /// never part of the model.
    pub addresses: BTreeSet<IpNet>,
    /// A `clsact` qdisc, for the link's mirror filters.
    #[serde(default)]
    pub clsact: bool,
}

/// The kernel's name of a GRE link kind.
pub fn gre_kind(tap: bool, local: &IpAddr) -> &'static str {
    match (tap, local.is_ipv6()) {
        (true, false) => "gretap",
        (true, true) => "ip6gretap",
        (false, false) => "gre",
        (false, true) => "ip6gre",
    }
}

/// The `clsact` hook a tc filter hangs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Hook {
    Ingress,
    Egress,
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Hook::Ingress => "ingress",
            Hook::Egress => "egress",
        })
    }
}

/// What one mirror filter compares (a flower match): the family always, the rest when set. The very
/// filter a MirrorSelector's `trafficMatch` becomes, so no copy between the two.
pub use netwave_api::validate::TrafficFilter as MirrorMatch;

/// Lowest tc priority of the agent's mirror filters; each (device, hook) numbers its filters up from
/// here, so they stay clear of low priorities other tools use.
pub const MIRROR_PRIORITY_BASE: u16 = 0x8000;

/// One mirror filter: on `dev`'s `hook`, packets matching `matcher` are copied (`mirred egress
/// mirror`) to the tunnel `to`. Its identity is everything but `priority` (the slot it took).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct MirrorFilter {
    pub dev: String,
    pub hook: Hook,
    pub matcher: MirrorMatch,
    pub to: String,
    pub priority: u16,
}

impl MirrorFilter {
    /// What the filter does, without the slot it sits in.
    pub fn identity(&self) -> (&str, Hook, &MirrorMatch, &str) {
        (&self.dev, self.hook, &self.matcher, &self.to)
    }
}

impl fmt::Display for MirrorFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "dev {} {} pref {} flower {} action mirred egress mirror dev {}",
            self.dev, self.hook, self.priority, self.matcher, self.to
        )
    }
}

/// How a route forwards.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum RouteAction {
    Unicast {
        via: Option<IpAddr>,
        dev: Option<String>,
    },
    Blackhole,
    Unreachable,
}

/// The kernel's identity of a route: a second route with the same key replaces the first.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RouteKey {
    pub table: u32,
    /// Always a network address (host bits cleared): the kernel rejects anything else with EINVAL.
    pub dst: IpNet,
    pub metric: u32,
}

impl fmt::Display for RouteKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} table {} metric {}",
            self.dst, self.table, self.metric
        )
    }
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Route {
    pub key: RouteKey,
    pub action: RouteAction,
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.action {
            RouteAction::Unicast { .. } => write!(f, "{}", self.key.dst)?,
            RouteAction::Blackhole => write!(f, "blackhole {}", self.key.dst)?,
            RouteAction::Unreachable => write!(f, "unreachable {}", self.key.dst)?,
        }
        if let RouteAction::Unicast { via, dev } = &self.action {
            if let Some(v) = via {
                write!(f, " via {v}")?;
            }
            if let Some(d) = dev {
                write!(f, " dev {d}")?;
            }
        }
        write!(f, " table {}", self.key.table)?;
        if self.key.metric != 0 {
            write!(f, " metric {}", self.key.metric)?;
        }
        Ok(())
    }
}

/// Address family of a rule (rules are per family in the kernel).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Family {
    V4,
    V6,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Rule {
    pub family: Family,
    pub priority: u32,
    pub table: u32,
    pub from: Option<IpNet>,
    pub to: Option<IpNet>,
    pub iif: Option<String>,
    /// Firewall mark; `Some(0)` only with a mask (the kernel does not compare a zero mark without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fwmark: Option<u32>,
    /// Mask of the mark, in [`canonical_fwmask`]'s form: the kernel's default (all bits on a non-zero
    /// mark) is `None`, as the kernel reports it back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fwmask: Option<u32>,
}

/// The one form of a rule's mark mask: all bits on a non-zero mark is what the kernel sets when no mask
/// is given, so it is `None`, and equal kernel rules render (and hash) equal. A zero mark keeps its
/// mask, which is then the only thing that makes the kernel compare the mark at all.
pub fn canonical_fwmask(mark: Option<u32>, mask: Option<u32>) -> Option<u32> {
    mask.filter(|&k| k != u32::MAX || mark.is_none_or(|m| m == 0))
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fam = match self.family {
            Family::V4 => "-4",
            Family::V6 => "-6",
        };
        write!(f, "{fam} priority {}", self.priority)?;
        if let Some(x) = &self.from {
            write!(f, " from {x}")?;
        }
        if let Some(x) = &self.to {
            write!(f, " to {x}")?;
        }
        if let Some(x) = &self.iif {
            write!(f, " iif {x}")?;
        }
        if self.fwmark.is_some() || self.fwmask.is_some() {
            write!(f, " fwmark {:#x}", self.fwmark.unwrap_or(0))?;
        }
        if let Some(k) = self.fwmask {
            write!(f, "/{k:#x}")?;
        }
        write!(f, " lookup {}", self.table)
    }
}

/// Every managed kernel object of a node. `BTreeMap`/`BTreeSet` so iteration (and thus the operation list)
/// is deterministic.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dataplane {
    pub links: BTreeMap<String, Link>,
    pub routes: BTreeMap<RouteKey, RouteAction>,
    pub rules: BTreeSet<Rule>,
    /// Mirror filters (MirrorSelectors) on managed links.
    #[serde(default)]
    pub mirrors: BTreeSet<MirrorFilter>,
}

impl Dataplane {
    /// Number of managed objects (links, addresses, routes, rules), for the `managed objects` metric.
    pub fn object_count(&self) -> usize {
        self.links.len()
            + self
                .links
                .values()
                .map(|l| l.addresses.len())
                .sum::<usize>()
            + self.routes.len()
            + self.rules.len()
            + self.mirrors.len()
    }

    /// Kernel features this dataplane needs.
    pub fn required_features(&self) -> BTreeSet<Feature> {
        self.links.values().map(|l| l.kind.feature()).collect()
    }
}

/// Kernel features the agent relies on, probed at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Feature {
    Vrf,
    Vlan,
    Bridge,
    Vxlan,
    BridgeVlanFiltering,
    /// GRE tunnels (`ip_gre`, `ip6_gre`), for mirror targets.
    Gre,
}

impl Feature {
    pub const ALL: [Feature; 6] = [
        Feature::Vrf,
        Feature::Vlan,
        Feature::Bridge,
        Feature::Vxlan,
        Feature::BridgeVlanFiltering,
        Feature::Gre,
    ];

    /// Name used in NNC status `kernelCapabilities` and in `KernelUnsupported` messages.
    pub fn name(self) -> &'static str {
        match self {
            Feature::Vrf => "vrf",
            Feature::Vlan => "vlan",
            Feature::Bridge => "bridge",
            Feature::Vxlan => "vxlan",
            Feature::BridgeVlanFiltering => "bridgeVlanFiltering",
            Feature::Gre => "gre",
        }
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which kernel features work on this node.
pub type Capabilities = BTreeMap<Feature, bool>;

/// The features `dp` needs that `caps` says are missing (unknown features count as missing).
pub fn missing_features(dp: &Dataplane, caps: &Capabilities) -> Vec<Feature> {
    dp.required_features()
        .into_iter()
        .filter(|f| !caps.get(f).copied().unwrap_or(false))
        .collect()
}

/// A config that cannot be turned into kernel objects; each variant names the offending field.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ModelError {
    #[error("{field}: {value:?} is not valid: {why}")]
    InvalidValue {
        field: String,
        value: String,
        why: String,
    },
    #[error("device {name} is declared twice ({first} and {second})")]
    DuplicateDevice {
        name: String,
        first: String,
        second: String,
    },
    #[error("{field}: device name {name:?} is not one the agent may manage ({why})")]
    DeviceName {
        field: String,
        name: String,
        why: String,
    },
    #[error("{field}: the default route of the main table is never managed by netwave")]
    MainDefaultRoute { field: String },
    #[error("{field}: route {key} is declared twice")]
    DuplicateRoute { field: String, key: String },
}

impl ModelError {
    /// The field path the error is about.
    pub fn field(&self) -> &str {
        match self {
            ModelError::InvalidValue { field, .. }
            | ModelError::DeviceName { field, .. }
            | ModelError::MainDefaultRoute { field }
            | ModelError::DuplicateRoute { field, .. } => field,
            ModelError::DuplicateDevice { second, .. } => second,
        }
    }
}

fn invalid(field: impl Into<String>, value: &str, why: impl Into<String>) -> ModelError {
    ModelError::InvalidValue {
        field: field.into(),
        value: value.to_string(),
        why: why.into(),
    }
}

fn parse_net(field: &str, s: &str) -> Result<IpNet, ModelError> {
    s.parse::<IpNet>()
        .map_err(|_| invalid(field, s, "not a prefix in CIDR notation"))
}

/// Name of the VLAN sub-interface of segment `id` on the trunk.
pub fn vlan_device(id: u16) -> String {
    format!("vlan.{id}")
}

struct Builder<'a> {
    settings: &'a NodeSettings,
    dp: Dataplane,
    origin: BTreeMap<String, String>,
}

impl Builder<'_> {
    fn add_link(&mut self, field: String, link: Link) -> Result<(), ModelError> {
        let name = link.name.clone();
        if name.is_empty() || name.len() > 15 || name.contains(['/', ' ', ':']) || name == "." {
            return Err(ModelError::DeviceName {
                field,
                name,
                why: "kernel device names are 1 to 15 bytes without '/', ':' or spaces".into(),
            });
        }
        if !self.settings.name_allowed(&name) {
            return Err(ModelError::DeviceName {
                field,
                name,
                why: "protected interface, trunk, or missing a configured name prefix".into(),
            });
        }
        if let Some(first) = self.origin.get(&name) {
            return Err(ModelError::DuplicateDevice {
                name,
                first: first.clone(),
                second: field,
            });
        }
        self.origin.insert(name.clone(), field);
        self.dp.links.insert(name, link);
        Ok(())
    }
}

fn new_link(name: &str, kind: LinkKind, mtu: Option<u32>) -> Link {
    Link {
        name: name.to_string(),
        kind,
        mtu,
        mac: None,
        master: None,
        up: true,
        neigh_suppress: false,
        addresses: BTreeSet::new(),
        clsact: false,
    }
}

/// The kernel's identity of a route in `table` to `prefix` with the metric as written: the prefix with
/// host bits cleared, and the metric the kernel gives a route added without one (0 for IPv4,
/// [`IPV6_DEFAULT_METRIC`] for IPv6, where an explicit 0 also means 1024).
pub fn route_key(table: u32, prefix: IpNet, metric: Option<u32>) -> RouteKey {
    let dst = prefix.trunc();
    let metric = match (metric.unwrap_or(0), dst) {
        (0, IpNet::V6(_)) => IPV6_DEFAULT_METRIC,
        (m, _) => m,
    };
    RouteKey { table, dst, metric }
}

/// One route of a config as the kernel sees it, or why the agent could not install it; `at` is the
/// route's field path for the error (`routes[3]` in a node config, `spec.routes[3]` in a RoutingTable).
///
/// A next hop must be of the prefix's family: an IPv4 route via an IPv6 next hop (RFC 5549) needs
/// `RTA_VIA`, which the agent does not write; BGP unnumbered sessions are FRR's business, not static
/// routes'.
pub fn route(r: &RouteConfig, at: &str) -> Result<Route, ModelError> {
    let prefix = parse_net(&format!("{at}.prefix"), &r.prefix)?;
    let key = route_key(r.table, prefix, r.metric);
    if r.table == MAIN_TABLE && key.dst.prefix_len() == 0 {
        return Err(ModelError::MainDefaultRoute { field: at.into() });
    }
    let no_next_hop = |what: &str| {
        let (field, value) = match (&r.via, &r.dev) {
            (Some(v), _) => ("via", v.as_str()),
            (None, Some(d)) => ("dev", d.as_str()),
            (None, None) => return Ok(()),
        };
        Err(invalid(
            format!("{at}.{field}"),
            value,
            format!("{what} route has no next hop or device"),
        ))
    };
    let action = match r.kind {
        RouteType::Blackhole => {
            no_next_hop("a blackhole")?;
            RouteAction::Blackhole
        }
        RouteType::Unreachable => {
            no_next_hop("an unreachable")?;
            RouteAction::Unreachable
        }
        RouteType::Unicast => {
            let via = match &r.via {
                None => None,
                Some(v) => {
                    let ip: IpAddr = v
                        .parse()
                        .map_err(|_| invalid(format!("{at}.via"), v, "not an IP address"))?;
                    if ip.is_ipv4() != matches!(key.dst, IpNet::V4(_)) {
                        return Err(invalid(
                            format!("{at}.via"),
                            v,
                            format!(
                                "the next hop's address family differs from the prefix {} (an IPv4 \
                                 route via an IPv6 next hop, RFC 5549, is not supported)",
                                key.dst
                            ),
                        ));
                    }
                    Some(ip)
                }
            };
            if via.is_none() && r.dev.is_none() {
                return Err(invalid(at, &r.prefix, "a unicast route needs via or dev"));
            }
            RouteAction::Unicast {
                via,
                dev: r.dev.clone(),
            }
        }
    };
    Ok(Route { key, action })
}

/// The kernel objects a node must have for `cfg`. Pure: same inputs, same result.
pub fn desired(cfg: &NodeConfig, settings: &NodeSettings) -> Result<Dataplane, ModelError> {
    let mut b = Builder {
        settings,
        dp: Dataplane::default(),
        origin: BTreeMap::new(),
    };
    for (i, vrf) in cfg.vrfs.iter().enumerate() {
        b.add_vrf(&format!("vrfs[{i}]"), vrf)?;
    }
    for (i, l2) in cfg.layer2s.iter().enumerate() {
        b.add_layer2(&format!("layer2s[{i}]"), l2)?;
    }
    for (i, r) in cfg.routes.iter().enumerate() {
        b.add_route(format!("routes[{i}]"), r)?;
    }
    for (i, r) in cfg.rules.iter().enumerate() {
        b.add_rule(&format!("rules[{i}]"), r)?;
    }
    for (i, t) in cfg.mirror_tunnels.iter().enumerate() {
        b.add_mirror_tunnel(&format!("mirrorTunnels[{i}]"), t, cfg)?;
    }
    for (i, m) in cfg.mirrors.iter().enumerate() {
        b.add_mirror(&format!("mirrors[{i}]"), m, cfg)?;
    }
    b.check_masters()?;
    Ok(b.dp)
}

impl Builder<'_> {
    fn vxlan(&self, vni: u32) -> LinkKind {
        LinkKind::Vxlan {
            vni,
            local: self.settings.vxlan_local,
            port: self.settings.vxlan_port,
            learning: false,
        }
    }

    /// A VRF's device with its loopbacks, its source-based-routing VRF and rules, and its layer-3
    /// VNI (a bridge in the VRF with a VXLAN port).
    fn add_vrf(&mut self, at: &str, vrf: &netwave_api::VrfConfig) -> Result<(), ModelError> {
        self.add_link(
            format!("{at}.device"),
            new_link(&vrf.device, LinkKind::Vrf { table: vrf.table }, None),
        )?;
        // Loopbacks: the node's addresses on the VRF device itself, the VRF's own loopback (its
        // connected routes are the VRF's, and its BGP instance redistributes them).
        if !vrf.loopbacks.is_empty() {
            let link = self
                .dp
                .links
                .get_mut(&vrf.device)
                .expect("added just above");
            for (j, lb) in vrf.loopbacks.iter().enumerate() {
                let field = format!("{at}.loopbacks[{j}].address");
                let net = parse_net(&field, &lb.address)?;
                if net.prefix_len() != net.max_prefix_len() {
                    return Err(invalid(
                        field,
                        &lb.address,
                        "a loopback address is a host prefix",
                    ));
                }
                if !link.addresses.insert(net) {
                    return Err(invalid(field, &lb.address, "listed twice"));
                }
            }
        }
        // Source-based routing: the local VRF `s-<vrf>` (FRR fills its table) and one rule per source
        // prefix in front of the main table.
        if let Some(sbr) = &vrf.sbr {
            self.add_link(
                format!("{at}.sbr.device"),
                new_link(&sbr.device, LinkKind::Vrf { table: sbr.table }, None),
            )?;
            for (j, p) in sbr.prefixes.iter().enumerate() {
                let from = parse_net(&format!("{at}.sbr.prefixes[{j}]"), p)?.trunc();
                self.dp.rules.insert(Rule {
                    family: match from {
                        IpNet::V4(_) => Family::V4,
                        IpNet::V6(_) => Family::V6,
                    },
                    priority: sbr.priority,
                    table: sbr.table,
                    from: Some(from),
                    to: None,
                    iif: None,
                    fwmark: None,
                    fwmask: None,
                });
            }
        }
        // The layer-3 VNI: a bridge in the VRF with a VXLAN port, both at the VRF's MTU.
        if let (Some(vni), Some(br), Some(vx)) = (vrf.vni, &vrf.bridge, &vrf.vxlan) {
            let mut bridge = new_link(br, LinkKind::Bridge, Some(vrf.mtu));
            bridge.master = Some(vrf.device.clone());
            self.add_link(format!("{at}.bridge"), bridge)?;
            let mut port = new_link(vx, self.vxlan(vni), Some(vrf.mtu));
            port.master = Some(br.clone());
            self.add_link(format!("{at}.vxlan"), port)?;
        }
        Ok(())
    }

    /// A layer-2 segment: its bridge (anycast MAC and gateways), VXLAN port and, with a trunk,
    /// VLAN sub-interface.
    fn add_layer2(&mut self, at: &str, l2: &netwave_api::Layer2Config) -> Result<(), ModelError> {
        let mut bridge = new_link(&l2.bridge, LinkKind::Bridge, Some(l2.mtu));
        bridge.master = l2.vrf.clone();
        if let Some(mac) = &l2.anycast_mac {
            bridge.mac =
                Some(Mac::parse(mac).ok_or_else(|| {
                    invalid(format!("{at}.anycastMac"), mac, "not a MAC address")
                })?);
        }
        for (j, gw) in l2.anycast_gateways.iter().enumerate() {
            let field = format!("{at}.anycastGateways[{j}]");
            let net = parse_net(&field, gw)?;
            if !bridge.addresses.insert(net) {
                return Err(invalid(field, gw, "listed twice"));
            }
        }
        self.add_link(format!("{at}.bridge"), bridge)?;
        let mut port = new_link(&l2.vxlan, self.vxlan(l2.vni), Some(l2.mtu));
        port.master = Some(l2.bridge.clone());
        port.neigh_suppress = l2.neigh_suppression;
        self.add_link(format!("{at}.vxlan"), port)?;
        if let Some(trunk) = &self.settings.vlan_trunk {
            let mut sub = new_link(
                &vlan_device(l2.vlan),
                LinkKind::Vlan {
                    parent: trunk.clone(),
                    id: l2.vlan,
                },
                Some(l2.mtu),
            );
            sub.master = Some(l2.bridge.clone());
            self.add_link(format!("{at}.vlan"), sub)?;
        }
        Ok(())
    }

    fn add_route(&mut self, at: String, r: &RouteConfig) -> Result<(), ModelError> {
        let route = route(r, &at)?;
        if let Some(action) = self.dp.routes.get(&route.key) {
            // Render merges identical routes; two routes with one kernel identity cannot both exist.
            if action != &route.action {
                return Err(ModelError::DuplicateRoute {
                    field: at,
                    key: route.key.to_string(),
                });
            }
        }
        self.dp.routes.insert(route.key, route.action);
        Ok(())
    }

    /// A policy rule, once per family its prefixes allow (both without a prefix).
    fn add_rule(&mut self, at: &str, r: &netwave_api::RuleConfig) -> Result<(), ModelError> {
        let from = r
            .from
            .as_deref()
            .map(|s| parse_net(&format!("{at}.from"), s).map(|n| n.trunc()))
            .transpose()?;
        let to =
            r.to.as_deref()
                .map(|s| parse_net(&format!("{at}.to"), s).map(|n| n.trunc()))
                .transpose()?;
        let fams: Vec<Family> = match (from.or(to), to) {
            (Some(a), Some(b)) if a.addr().is_ipv4() != b.addr().is_ipv4() => {
                return Err(invalid(
                    format!("{at}.to"),
                    r.to.as_deref().unwrap_or_default(),
                    "address family differs from `from`",
                ));
            }
            (Some(IpNet::V4(_)), _) => vec![Family::V4],
            (Some(IpNet::V6(_)), _) => vec![Family::V6],
            // No prefix fixes the family: the rule applies to both, as `iif X lookup T` means.
            (None, _) => vec![Family::V4, Family::V6],
        };
        if let Err((field, why)) = netwave_api::validate::check_fwmark(r.fwmark, r.fwmask) {
            let value = match field {
                "fwmark" => r.fwmark,
                _ => r.fwmask,
            };
            return Err(invalid(
                format!("{at}.{field}"),
                &value.map(|v| v.to_string()).unwrap_or_default(),
                why,
            ));
        }
        for family in fams {
            self.dp.rules.insert(Rule {
                family,
                priority: r.priority,
                table: r.table,
                from,
                to,
                iif: r.iif.clone(),
                fwmark: r.fwmark,
                fwmask: canonical_fwmask(r.fwmark, r.fwmask),
            });
        }
        Ok(())
    }

    /// A MirrorTarget's tunnel, enslaved to its VRF's device.
    fn add_mirror_tunnel(
        &mut self,
        at: &str,
        t: &netwave_api::MirrorTunnelConfig,
        cfg: &NodeConfig,
    ) -> Result<(), ModelError> {
        let ip = |field: &str, v: &str| -> Result<IpAddr, ModelError> {
            v.parse()
                .map_err(|_| invalid(format!("{at}.{field}"), v, "not an IP address"))
        };
        let (local, remote) = (ip("local", &t.local)?, ip("remote", &t.remote)?);
        if local.is_ipv4() != remote.is_ipv4() {
            return Err(invalid(
                format!("{at}.remote"),
                &t.remote,
                format!("of another address family than local {local}"),
            ));
        }
        let vrf = cfg
            .vrfs
            .iter()
            .find(|v| v.name == t.vrf)
            .ok_or_else(|| invalid(format!("{at}.vrf"), &t.vrf, "not a VRF of this config"))?;
        let mut link = new_link(
            &t.device,
            LinkKind::Gre {
                tap: t.kind == netwave_api::MirrorTargetType::L2gre,
                dev: vrf.device.clone(),
                local,
                remote,
                key: t.key,
            },
            None,
        );
        link.master = Some(vrf.device.clone());
        self.add_link(format!("{at}.device"), link)
    }

    /// A MirrorSelector: its filters on the source's devices (a segment's bridge and VXLAN device, or
    /// a VRF's layer-3 VXLAN device), each with a `clsact` qdisc.
    ///
    /// Direction is the workload's, as in das-schiff-network-operator: `ingress` is traffic to the
    /// source's workloads, `egress` from them. A VXLAN device faces the fabric (to the workloads is its
    /// ingress); a segment's bridge faces the node (traffic the node routes to the workloads leaves
    /// through the bridge device, its egress, and what they send the gateway arrives on its ingress).
    /// Together the two see what the segment exchanges with the node and with other nodes; frames
    /// switched between two local ports of the bridge pass neither.
    fn add_mirror(
        &mut self,
        at: &str,
        m: &netwave_api::MirrorConfig,
        cfg: &NodeConfig,
    ) -> Result<(), ModelError> {
        let to_workload = m.direction == netwave_api::MirrorDirection::Ingress;
        let fabric = if to_workload {
            Hook::Ingress
        } else {
            Hook::Egress
        };
        let node_side = if to_workload {
            Hook::Egress
        } else {
            Hook::Ingress
        };
        let devices: Vec<(String, Hook)> = match (m.vlan, &m.vrf) {
            (Some(vlan), None) => {
                let l2 = cfg.layer2s.iter().find(|l| l.vlan == vlan).ok_or_else(|| {
                    invalid(
                        format!("{at}.vlan"),
                        &vlan.to_string(),
                        "not a segment of this config",
                    )
                })?;
                vec![(l2.bridge.clone(), node_side), (l2.vxlan.clone(), fabric)]
            }
            (None, Some(vrf)) => {
                let vx = cfg
                    .vrfs
                    .iter()
                    .find(|v| &v.name == vrf)
                    .and_then(|v| v.vxlan.clone())
                    .ok_or_else(|| {
                        invalid(
                            format!("{at}.vrf"),
                            vrf,
                            "not a VRF of this config with a layer-3 VNI",
                        )
                    })?;
                vec![(vx, fabric)]
            }
            _ => {
                return Err(invalid(
                    format!("{at}.vlan"),
                    &format!("{:?}/{:?}", m.vlan, m.vrf),
                    "a mirror has one source: vlan or vrf",
                ));
            }
        };
        if !self
            .dp
            .links
            .get(&m.tunnel)
            .is_some_and(|l| matches!(l.kind, LinkKind::Gre { .. }))
        {
            return Err(invalid(
                format!("{at}.tunnel"),
                &m.tunnel,
                "not a mirror tunnel of this config",
            ));
        }
        let filters =
            netwave_api::validate::traffic_filters(&m.traffic_match, &format!("{at}.trafficMatch"))
                .map_err(|e| {
                    let first = &e[0];
                    invalid(first.path.clone(), "", first.message.clone())
                })?;
        for (dev, hook) in devices {
            let link = self.dp.links.get_mut(&dev).ok_or_else(|| {
                invalid(
                    at.to_string(),
                    &dev,
                    "source device is not a device of this config",
                )
            })?;
            link.clsact = true;
            for f in &filters {
                let matcher: MirrorMatch = f.clone();
                // Two selectors asking the same of one device: one filter copies once.
                if self
                    .dp
                    .mirrors
                    .iter()
                    .any(|x| x.identity() == (dev.as_str(), hook, &matcher, m.tunnel.as_str()))
                {
                    continue;
                }
                let next = self
                    .dp
                    .mirrors
                    .iter()
                    .filter(|x| x.dev == dev && x.hook == hook)
                    .count();
                let priority = u16::try_from(next)
                    .ok()
                    .and_then(|n| MIRROR_PRIORITY_BASE.checked_add(n))
                    .ok_or_else(|| {
                        invalid(
                            at.to_string(),
                            &dev,
                            "too many mirror filters on one device",
                        )
                    })?;
                self.dp.mirrors.insert(MirrorFilter {
                    dev: dev.clone(),
                    hook,
                    matcher,
                    to: m.tunnel.clone(),
                    priority,
                });
            }
        }
        Ok(())
    }

    /// Masters must be links of this dataplane: the agent never enslaves into a device it does not own.
    fn check_masters(&self) -> Result<(), ModelError> {
        for link in self.dp.links.values() {
            if let Some(m) = &link.master
                && !self.dp.links.contains_key(m)
            {
                return Err(ModelError::DeviceName {
                    field: self.origin[&link.name].clone(),
                    name: m.clone(),
                    why: format!("master of {} is not a device of this config", link.name),
                });
            }
        }
        Ok(())
    }
}

/// One mirror health check after an apply: its probe name and what is wrong, if anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MirrorCheck {
    /// `mirror-tunnel TARGET (DEVICE)` or `mirror SELECTOR`.
    pub name: String,
    pub problem: Option<String>,
}

/// The health gate of a config's mirrors, against the kernel as observed after the apply (`up`: the
/// links that are up with carrier). Each MirrorTarget's tunnel must be up, enslaved to its VRF and
/// sourced from an address the VRF has (its loopback); each MirrorSelector's qdiscs and filters must be
/// in place on every device of its source. Pure: the agent observes, this judges.
pub fn mirror_health(
    cfg: &NodeConfig,
    settings: &NodeSettings,
    observed: &Dataplane,
    up: &BTreeSet<String>,
) -> Vec<MirrorCheck> {
    let mut out = Vec::new();
    for t in &cfg.mirror_tunnels {
        let link = observed.links.get(&t.device);
        let vrf = cfg.vrfs.iter().find(|v| v.name == t.vrf);
        let local: Option<IpAddr> = t.local.parse().ok();
        let problem = match (link, vrf) {
            (None, _) => Some(format!("tunnel {} does not exist", t.device)),
            (_, None) => Some(format!("VRF {} is not in the config", t.vrf)),
            (Some(l), Some(v)) => {
                if l.master.as_deref() != Some(v.device.as_str()) {
                    Some(format!("tunnel {} is not in VRF {}", t.device, v.device))
                } else if !up.contains(&t.device) {
                    Some(format!("tunnel {} is not up", t.device))
                } else if !observed
                    .links
                    .get(&v.device)
                    .is_some_and(|d| d.addresses.iter().any(|a| Some(a.addr()) == local))
                {
                    Some(format!(
                        "VRF {} does not have the tunnel's source address {}",
                        v.device, t.local
                    ))
                } else {
                    None
                }
            }
        };
        out.push(MirrorCheck {
            name: format!("mirror-tunnel {} ({})", t.name, t.device),
            problem,
        });
    }
    let have: BTreeSet<_> = observed
        .mirrors
        .iter()
        .map(MirrorFilter::identity)
        .collect();
    for m in &cfg.mirrors {
        let alone = NodeConfig {
            mirrors: vec![m.clone()],
            ..cfg.clone()
        };
        let problem = match desired(&alone, settings) {
            Err(e) => Some(e.to_string()),
            Ok(want) => {
                let missing: Vec<String> = want
                    .mirrors
                    .iter()
                    .filter(|f| !have.contains(&f.identity()))
                    .map(|f| format!("{} {} {}", f.dev, f.hook, f.matcher))
                    .collect();
                let no_qdisc: Vec<&str> = want
                    .links
                    .values()
                    .filter(|l| l.clsact && !observed.links.get(&l.name).is_some_and(|o| o.clsact))
                    .map(|l| l.name.as_str())
                    .collect();
                if !no_qdisc.is_empty() {
                    Some(format!("no clsact qdisc on {}", no_qdisc.join(", ")))
                } else if !missing.is_empty() {
                    Some(format!("filter not in place: {}", missing.join("; ")))
                } else {
                    None
                }
            }
        };
        out.push(MirrorCheck {
            name: format!("mirror {}", m.name),
            problem,
        });
    }
    out
}
