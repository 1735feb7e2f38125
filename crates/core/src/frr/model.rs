//! FRR configuration as data: only what netwave renders, each collection already in the order FRR's
//! `show running-config` prints it, so [`FrrConfig::to_text`](super::FrrConfig::to_text) only formats.
//!
//! Where FRR prints in *creation* order rather than a sorted one (prefix lists, route maps, BGP
//! instances, `import vrf` lines), the model holds the order our own text creates them in, which is
//! what a daemon loaded from that text prints. `frr-reload.py` compares those contexts as sets, so an
//! FRR that reached the same config another way shows no diff either.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

use super::underlay::{Peer, RemoteAs};

/// The whole FRR configuration of one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrrConfig {
    /// `hostname`: the node's `uname -n` when the agent knows it (see `Underlay::with_hostname`).
    pub hostname: Option<String>,
    /// The node's IP forwarding as the kernel has it: FRR shows `no ip forwarding` / `no ipv6
    /// forwarding` when it is off, and a reload of a text without that line would turn it on (or, in a
    /// container whose /proc/sys is read-only, fail to and never converge). Forwarding is the node's
    /// setting, not netwave's: the agent observes it before each render ([`Forwarding::ON`] until then).
    pub forwarding: Forwarding,
    /// zebra's `vrf NAME` / `vni N` blocks (the L3 VNIs), by VRF device name. Only VRFs with a VNI:
    /// FRR never shows an empty `vrf` block, so rendering one would be a permanent diff.
    pub vrf_vnis: BTreeMap<String, u32>,
    /// `router bgp ASN`: the underlay and EVPN instance.
    pub bgp: BgpInstance,
    /// `router bgp ASN vrf NAME`, in creation order (see the module docs).
    pub vrf_bgp: Vec<BgpInstance>,
    /// `ip prefix-list` and `ipv6 prefix-list`, by name (names carry a `-v4`/`-v6` suffix, so the
    /// two FRR namespaces never share one).
    pub prefix_lists: BTreeMap<String, PrefixList>,
    /// `route-map NAME permit|deny SEQ`, by name then sequence.
    pub route_maps: BTreeMap<String, BTreeMap<u16, RouteMapEntry>>,
}

/// Whether the kernel forwards IPv4 and IPv6 (`net.ipv4.ip_forward`, `net.ipv6.conf.all.forwarding`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Forwarding {
    pub ipv4: bool,
    pub ipv6: bool,
}

impl Forwarding {
    /// Both on: what a routing node runs with, and what renders no line.
    pub const ON: Forwarding = Forwarding {
        ipv4: true,
        ipv6: true,
    };
}

impl Default for Forwarding {
    fn default() -> Self {
        Forwarding::ON
    }
}

/// One `router bgp` instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BgpInstance {
    pub asn: u32,
    /// `None` for the default instance.
    pub vrf: Option<String>,
    pub router_id: Ipv4Addr,
    /// `no bgp default ipv4-unicast`: every neighbour is activated per address family explicitly.
    pub no_default_ipv4_unicast: bool,
    /// `timers bgp K H`; `None` when equal to the profile's defaults (FRR would not show them).
    pub timers: Option<(u16, u16)>,
    /// In FRR's order: interface neighbours (by FRR's interface-name order), then addresses.
    pub neighbors: Vec<(Peer, RemoteAs)>,
    /// Sessions with workloads (BGPPeerings), in FRR's order: peer groups by name, then addresses
    /// (IPv4 before IPv6). Their address neighbours are printed among [`Self::neighbors`] in
    /// address order; the listen ranges after every neighbour.
    pub workload_peers: Vec<WorkloadPeer>,
    pub ipv4: UnicastFamily,
    pub ipv6: UnicastFamily,
    pub evpn: Option<EvpnFamily>,
}

/// A session with a workload: a peer group with listen ranges (`peeringVlan`) or an address
/// (`loopbackPeer`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadPeer {
    pub id: WorkloadId,
    pub remote_asn: u32,
    /// `neighbor X bfd`.
    pub bfd: bool,
    /// `neighbor X ttl-security hops N` (multihop sessions with loopback addresses).
    pub ttl_security_hops: Option<u8>,
    /// `neighbor X timers KEEPALIVE HOLD`.
    pub timers: Option<(u16, u16)>,
    /// `bgp listen range P peer-group X`, IPv4 then IPv6, each by address (FRR's order).
    pub listen_ranges: Vec<IpNet>,
}

/// How FRR names a workload session.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum WorkloadId {
    /// `neighbor NAME peer-group`.
    Group(String),
    Address(IpAddr),
}

impl fmt::Display for WorkloadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkloadId::Group(g) => f.write_str(g),
            WorkloadId::Address(a) => a.fmt(f),
        }
    }
}

/// A workload session's lines in one address family: `activate`, `maximum-prefix`, the import and
/// export route maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadFamily {
    pub id: WorkloadId,
    pub maximum_prefix: Option<u32>,
    pub route_map_in: String,
    pub route_map_out: String,
}

/// `address-family ipv4|ipv6 unicast`. Printed only when something is in it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnicastFamily {
    /// `network P`; FRR prints its BGP table order, which for networks is (address, length).
    pub networks: BTreeSet<IpNet>,
    /// `aggregate-address P`, same order.
    pub aggregates: BTreeSet<IpNet>,
    /// `redistribute kernel|connected`, in FRR's route-type order.
    pub redistribute: BTreeSet<Redistribute>,
    /// `neighbor P activate` (+ `neighbor P route-map NAME out`), in the instance's neighbour order.
    pub neighbors: Vec<(Peer, Option<String>)>,
    /// Workload sessions in this family, in [`BgpInstance::workload_peers`] order.
    pub workload: Vec<WorkloadFamily>,
    /// `import vrf route-map NAME`.
    pub import_vrf_route_map: Option<String>,
    /// `import vrf NAME`, in creation order.
    pub import_vrfs: Vec<String>,
}

impl UnicastFamily {
    pub fn is_empty(&self) -> bool {
        self == &UnicastFamily::default()
    }
}

/// Route types FRR redistributes into BGP, ordered as FRR prints them (zebra's route-type numbers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Redistribute {
    /// Routes other programs (netwave's agent) put into the kernel table.
    Kernel,
    /// The table's connected subnets (interface addresses, e.g. anycast gateways).
    Connected,
}

/// `address-family l2vpn evpn`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EvpnFamily {
    pub neighbors: Vec<Peer>,
    /// `advertise-all-vni`: every VXLAN device in the kernel is an EVPN VNI (type-2/3 routes).
    pub advertise_all_vni: bool,
    /// `vni N` blocks (layer-2 VNIs with a route target of their own): VNI → route targets, each
    /// imported and exported.
    pub vnis: BTreeMap<u32, BTreeSet<String>>,
    /// `advertise ipv4 unicast` / `advertise ipv6 unicast`: the VRF's routes as type-5.
    pub advertise_ipv4: bool,
    pub advertise_ipv6: bool,
    /// `route-target import|export`; FRR sorts them by their text.
    pub route_targets_import: BTreeSet<String>,
    pub route_targets_export: BTreeSet<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(net: &IpNet) -> Family {
        match net {
            IpNet::V4(_) => Family::V4,
            IpNet::V6(_) => Family::V6,
        }
    }
    /// `ip` / `ipv6`, as in `ipv6 prefix-list` and `match ipv6 address`.
    pub fn keyword(self) -> &'static str {
        match self {
            Family::V4 => "ip",
            Family::V6 => "ipv6",
        }
    }
    pub fn suffix(self) -> &'static str {
        match self {
            Family::V4 => "v4",
            Family::V6 => "v6",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    Permit,
    Deny,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Action::Permit => "permit",
            Action::Deny => "deny",
        })
    }
}

/// A prefix list of one family; entries by sequence number (FRR evaluates and prints them so).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixList {
    pub family: Family,
    pub entries: BTreeMap<u32, PrefixEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixEntry {
    pub action: Action,
    pub prefix: IpNet,
    pub ge: Option<u8>,
    pub le: Option<u8>,
}

/// One route-map entry. Its matches are ANDed; FRR prints them in a fixed order, kept by the fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteMapEntry {
    pub action: Action,
    /// `match ip|ipv6 address prefix-list NAME`.
    pub match_prefix_list: Option<(Family, String)>,
    /// `match source-vrf NAME`: where a leaked route comes from.
    pub match_source_vrf: Option<String>,
    /// `set community … additive`, sorted by value (FRR sorts and deduplicates them).
    pub set_communities: Vec<Community>,
    /// `set large-community … additive`, sorted and deduplicated by us (FRR keeps the order given).
    pub set_large_communities: Vec<LargeCommunity>,
}

/// A standard BGP community (RFC 1997) as a 32-bit value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Community(pub u32);

/// The names FRR 8.4 prints instead of these values (lib `community_str`), measured with vtysh.
const WELL_KNOWN: [(u32, &str); 15] = [
    (0x0000_0000, "internet"),
    (0xFFFF_0000, "graceful-shutdown"),
    (0xFFFF_0001, "accept-own"),
    (0xFFFF_0002, "route-filter-translated-v4"),
    (0xFFFF_0003, "route-filter-v4"),
    (0xFFFF_0004, "route-filter-translated-v6"),
    (0xFFFF_0005, "route-filter-v6"),
    (0xFFFF_0006, "llgr-stale"),
    (0xFFFF_0007, "no-llgr"),
    (0xFFFF_0008, "accept-own-nexthop"),
    (0xFFFF_029A, "blackhole"),
    (0xFFFF_FF01, "no-export"),
    (0xFFFF_FF02, "no-advertise"),
    (0xFFFF_FF03, "local-AS"),
    (0xFFFF_FF04, "no-peer"),
];

impl Community {
    /// `65000:10` or a well-known name, case-insensitively (FRR itself only takes `local-AS`, while
    /// the API documents `local-as`).
    pub fn parse(s: &str) -> Option<Community> {
        if let Some((v, _)) = WELL_KNOWN
            .iter()
            .find(|(_, name)| name.eq_ignore_ascii_case(s))
        {
            return Some(Community(*v));
        }
        let (hi, lo) = s.split_once(':')?;
        let (hi, lo) = (hi.parse::<u16>().ok()?, lo.parse::<u16>().ok()?);
        Some(Community((u32::from(hi) << 16) | u32::from(lo)))
    }
}

impl fmt::Display for Community {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match WELL_KNOWN.iter().find(|(v, _)| *v == self.0) {
            Some((_, name)) => f.write_str(name),
            None => write!(f, "{}:{}", self.0 >> 16, self.0 & 0xFFFF),
        }
    }
}

/// A large BGP community (RFC 8092).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct LargeCommunity(pub u32, pub u32, pub u32);

impl LargeCommunity {
    pub fn parse(s: &str) -> Option<LargeCommunity> {
        let mut parts = s.split(':').map(str::parse::<u32>);
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(Ok(a)), Some(Ok(b)), Some(Ok(c)), None) => Some(LargeCommunity(a, b, c)),
            _ => None,
        }
    }
}

impl fmt::Display for LargeCommunity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.0, self.1, self.2)
    }
}

/// A route target as FRR 8.4 can encode it (RFC 4360 / 5668): a 2-byte ASN with a 4-byte number, a
/// 4-byte ASN or an IPv4 address with a 2-byte number. FRR refuses anything else with only a message
/// ("% Malformed Route Target list") and exit code 0, so it must never reach FRR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteTarget {
    As2(u16, u32),
    As4(u32, u16),
    Ip(Ipv4Addr, u16),
}

impl RouteTarget {
    pub fn parse(s: &str) -> Result<RouteTarget, &'static str> {
        let (admin, number) = s
            .rsplit_once(':')
            .ok_or("want <asn>:<number> or <ipv4>:<number>")?;
        let number: u32 = number
            .parse()
            .map_err(|_| "the part after ':' is not a number")?;
        if let Ok(ip) = admin.parse::<Ipv4Addr>() {
            let n = u16::try_from(number)
                .map_err(|_| "with an IPv4 address the number must be at most 65535")?;
            return Ok(RouteTarget::Ip(ip, n));
        }
        let asn: u32 = admin
            .parse()
            .map_err(|_| "the part before ':' is neither an ASN nor an IPv4 address")?;
        match u16::try_from(asn) {
            Ok(asn) => Ok(RouteTarget::As2(asn, number)),
            Err(_) => u16::try_from(number)
                .map(|n| RouteTarget::As4(asn, n))
                .map_err(|_| "with a 4-byte ASN (above 65535) the number must be at most 65535"),
        }
    }
}

impl fmt::Display for RouteTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouteTarget::As2(a, n) => write!(f, "{a}:{n}"),
            RouteTarget::As4(a, n) => write!(f, "{a}:{n}"),
            RouteTarget::Ip(a, n) => write!(f, "{a}:{n}"),
        }
    }
}

/// FRR's interface-name order (lib `if_cmp_name_func`): names compared chunk by chunk, digit runs as
/// numbers, so `eth2` < `eth10`. FRR prints unnumbered neighbours in this order.
pub fn cmp_interface_names(a: &str, b: &str) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    let (mut p1, mut p2) = (a.as_bytes(), b.as_bytes());
    let non_digits = |s: &[u8]| s.iter().take_while(|c| !c.is_ascii_digit()).count();
    let digits = |s: &[u8]| s.iter().take_while(|c| c.is_ascii_digit()).count();
    while !p1.is_empty() && !p2.is_empty() {
        let (l1, l2) = (non_digits(p1), non_digits(p2));
        if l1 != l2 {
            return p1.cmp(p2);
        }
        match p1[..l1].cmp(&p2[..l1]) {
            Ordering::Equal => {}
            other => return other,
        }
        p1 = &p1[l1..];
        p2 = &p2[l1..];
        match (p1.is_empty(), p2.is_empty()) {
            (true, true) => return Ordering::Equal,
            (true, false) => return Ordering::Less,
            (false, true) => return Ordering::Greater,
            _ => {}
        }
        let (d1, d2) = (digits(p1), digits(p2));
        // Interface names are at most 15 bytes, so a digit run fits in u64.
        let number = |s: &[u8]| {
            s.iter()
                .fold(0u64, |n, c| n.saturating_mul(10) + u64::from(c - b'0'))
        };
        match number(&p1[..d1]).cmp(&number(&p2[..d2])) {
            Ordering::Equal => {}
            other => return other,
        }
        if d1 != d2 {
            // `foo-1` vs `foo-001`: equal numbers, FRR falls back to comparing the rest as strings.
            return p1.cmp(p2);
        }
        p1 = &p1[d1..];
        p2 = &p2[d2..];
    }
    // Whatever is left is longer (C: `if (*p1) return 1; if (*p2) return -1;`).
    p1.len().cmp(&p2.len())
}

/// FRR's neighbour order (bgpd `peer_cmp` without peer groups): interface neighbours first, by
/// interface-name order, then numbered ones by address.
pub fn cmp_peers(a: &Peer, b: &Peer) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    match (a, b) {
        (Peer::Interface(x), Peer::Interface(y)) => cmp_interface_names(x, y),
        (Peer::Interface(_), Peer::Address(_)) => Ordering::Less,
        (Peer::Address(_), Peer::Interface(_)) => Ordering::Greater,
        (Peer::Address(x), Peer::Address(y)) => x.cmp(y),
    }
}
