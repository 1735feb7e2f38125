//! Semantic validation of single input objects: the rules an OpenAPI schema cannot express. Each function
//! returns every problem it finds, each with the field path it concerns, so an admin fixes them all at once.
//!
//! Rules that span objects or nodes (duplicate VNIs, table collisions, references to other objects) need
//! the whole fleet and live in `netwave-core`'s fleet validation.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::inputs::{
    BGPPeeringSpec, Layer2NetworkConfigurationSpec, MIRROR_REF_GROUPS, MirrorObjectRef,
    MirrorSelectorSpec, MirrorTargetSpec, PrefixAction, PrefixItem, RoutingTableSpec, TrafficMatch,
    VRFRouteConfigurationSpec,
};

/// One problem with one field.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FieldError {
    /// JSON path of the field, e.g. `spec.import[3].cidr`.
    pub path: String,
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

impl std::error::Error for FieldError {}

/// Kernel tables netwave must not manage: `unspec`, `default`, `main`, `local`.
pub const RESERVED_TABLES: [u32; 4] = [0, 253, 254, 255];
/// Priorities of the kernel's own `main` and `default` rules.
pub const RESERVED_RULE_PRIORITIES: [u32; 2] = [32766, 32767];

#[derive(Default)]
struct Problems(Vec<FieldError>);

impl Problems {
    fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError {
            path: path.into(),
            message: message.into(),
        });
    }
}

/// Parses a network in CIDR notation that must be a network address (no host bits set).
pub fn parse_network(s: &str) -> Result<IpNet, String> {
    let net: IpNet = s.parse().map_err(|_| {
        format!("{s} is not a network in CIDR notation (e.g. 10.0.0.0/24 or fd00::/64)")
    })?;
    if net.trunc() != net {
        return Err(format!(
            "{s} is not a network address (want {})",
            net.trunc()
        ));
    }
    Ok(net)
}

/// Parses an interface address (`address/prefix-length`) that must be a host address inside its prefix:
/// neither the network address nor, for IPv4, the broadcast address.
pub fn parse_host_address(s: &str) -> Result<IpNet, String> {
    let net: IpNet = s
        .parse()
        .map_err(|_| format!("{s} is not an address with prefix length (e.g. 10.250.0.1/24)"))?;
    let host_bits = net.max_prefix_len() - net.prefix_len();
    // /31 and /32 (and /127, /128) have no network or broadcast address to avoid.
    if host_bits >= 2 {
        if net.addr() == net.network() {
            return Err(format!(
                "{s} is the network address of {}, not a host address",
                net.trunc()
            ));
        }
        if matches!(net, IpNet::V4(_)) && net.addr() == net.broadcast() {
            return Err(format!(
                "{s} is the broadcast address of {}, not a host address",
                net.trunc()
            ));
        }
    }
    Ok(net)
}

fn check_prefix_list(items: &[PrefixItem], field: &str, p: &mut Problems) {
    // Two items are the same when cidr, action, ge and le agree.
    type ItemKey = (PrefixAction, String, Option<u8>, Option<u8>);
    let mut seen_items: BTreeMap<ItemKey, usize> = BTreeMap::new();
    let mut seen_seq: BTreeMap<u64, usize> = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("spec.{field}[{i}]");
        match parse_network(&item.cidr) {
            Err(e) => p.push(format!("{at}.cidr"), e),
            Ok(net) => {
                let len = net.prefix_len();
                let max = net.max_prefix_len();
                for (name, value) in [("ge", item.ge), ("le", item.le)] {
                    if let Some(v) = value {
                        if v > max {
                            p.push(
                                format!("{at}.{name}"),
                                format!(
                                    "{v} is longer than an {} prefix can be ({max})",
                                    family(&net)
                                ),
                            );
                        } else if v < len {
                            p.push(
                                format!("{at}.{name}"),
                                format!(
                                    "{v} is shorter than the prefix length of {} ({len})",
                                    item.cidr
                                ),
                            );
                        }
                    }
                }
                if let (Some(ge), Some(le)) = (item.ge, item.le)
                    && ge > le
                {
                    p.push(
                        format!("{at}.ge"),
                        format!("ge {ge} is greater than le {le}"),
                    );
                }
            }
        }
        let key = (
            item.action,
            item.cidr.to_ascii_lowercase(),
            item.ge,
            item.le,
        );
        if let Some(first) = first_seen(&mut seen_items, key, i) {
            p.push(
                at.clone(),
                format!("duplicates spec.{field}[{first}] (same cidr, action, ge and le)"),
            );
        }
        let seq = item.effective_seq(i);
        if let Some(first) = first_seen(&mut seen_seq, seq, i) {
            p.push(
                format!("{at}.seq"),
                format!("sequence {seq} is already used by spec.{field}[{first}]"),
            );
        }
    }
}

/// Records `index` as the first holder of `key`; returns the earlier holder if there was one.
fn first_seen<K: Ord>(seen: &mut BTreeMap<K, usize>, key: K, index: usize) -> Option<usize> {
    match seen.entry(key) {
        Entry::Occupied(e) => Some(*e.get()),
        Entry::Vacant(e) => {
            e.insert(index);
            None
        }
    }
}

/// The prefix lengths an item matches, as FRR reads it: exactly the CIDR's length without `ge`/`le`,
/// from the length to `le`, from `ge` to the family's maximum, or `ge` to `le`.
fn length_range(item: &PrefixItem, net: &IpNet) -> (u8, u8) {
    let len = net.prefix_len();
    match (item.ge, item.le) {
        (None, None) => (len, len),
        (None, Some(le)) => (len, le),
        (Some(ge), None) => (ge, net.max_prefix_len()),
        (Some(ge), Some(le)) => (ge, le),
    }
}

/// Items of a prefix list that can never match: an item that comes earlier in `seq` order (an item
/// without `seq` has its position + 1) matches every prefix they match, so it decides first. Returns
/// `(shadowed, by)` positions. Items that do not parse are left to the per-object checks.
pub fn shadowed_items(items: &[PrefixItem]) -> Vec<(usize, usize)> {
    let parsed: Vec<Option<(IpNet, (u8, u8))>> = items
        .iter()
        .map(|item| {
            let net: IpNet = item.cidr.parse().ok()?;
            Some((net.trunc(), length_range(item, &net)))
        })
        .collect();
    let mut out = Vec::new();
    for (b, item_b) in items.iter().enumerate() {
        let Some((net_b, (lo_b, hi_b))) = parsed[b] else {
            continue;
        };
        let by = items
            .iter()
            .enumerate()
            .filter(|&(a, item_a)| a != b && item_a.effective_seq(a) < item_b.effective_seq(b))
            .filter(|&(a, _)| {
                parsed[a].is_some_and(|(net_a, (lo_a, hi_a))| {
                    net_a.contains(&net_b) && lo_a <= lo_b && hi_b <= hi_a
                })
            })
            .min_by_key(|&(a, item_a)| item_a.effective_seq(a));
        if let Some((a, _)) = by {
            out.push((b, a));
        }
    }
    out
}

fn family(net: &IpNet) -> &'static str {
    match net {
        IpNet::V4(_) => "IPv4",
        IpNet::V6(_) => "IPv6",
    }
}

fn check_table(table: u32, path: &str, p: &mut Problems) {
    if RESERVED_TABLES.contains(&table) {
        p.push(
            path,
            format!("table {table} is reserved for the kernel's unspec/default/main/local tables"),
        );
    }
}

/// A BGP route target or community value: `<asn>:<number>` or `<ipv4>:<number>`.
fn check_route_target(value: &str, path: &str, p: &mut Problems) {
    let ok = value.rsplit_once(':').is_some_and(|(admin, assigned)| {
        assigned.parse::<u32>().is_ok()
            && (admin.parse::<u32>().is_ok() || admin.parse::<std::net::Ipv4Addr>().is_ok())
    });
    if !ok {
        p.push(
            path,
            format!("{value} is not a route target (want <asn>:<number> or <ipv4>:<number>)"),
        );
    }
}

/// Standard (`65000:10`), large (`65000:1:2`) or well-known (`no-export`, …) BGP community.
fn check_community(value: &str, path: &str, p: &mut Problems) {
    const WELL_KNOWN: [&str; 5] = [
        "no-export",
        "no-advertise",
        "local-as",
        "no-peer",
        "blackhole",
    ];
    let parts: Vec<&str> = value.split(':').collect();
    let ok = WELL_KNOWN.contains(&value)
        || match parts.len() {
            2 => parts.iter().all(|n| n.parse::<u16>().is_ok()),
            3 => parts.iter().all(|n| n.parse::<u32>().is_ok()),
            _ => false,
        };
    if !ok {
        p.push(
            path,
            format!("{value} is not a BGP community (want <asn>:<value>, <asn>:<a>:<b> or a well-known name)"),
        );
    }
}

/// Problems with one `VRFRouteConfiguration` spec.
pub fn validate_vrf(spec: &VRFRouteConfigurationSpec) -> Vec<FieldError> {
    let mut p = Problems::default();
    check_prefix_list(&spec.import, "import", &mut p);
    check_prefix_list(&spec.export, "export", &mut p);
    let mut aggregates = BTreeMap::new();
    for (i, agg) in spec.aggregate.iter().enumerate() {
        match parse_network(agg) {
            Err(e) => p.push(format!("spec.aggregate[{i}]"), e),
            Ok(net) => {
                if let Some(first) = first_seen(&mut aggregates, net, i) {
                    p.push(
                        format!("spec.aggregate[{i}]"),
                        format!("duplicates spec.aggregate[{first}]"),
                    );
                }
            }
        }
    }
    if let Some(table) = spec.table_id {
        check_table(table, "spec.tableId", &mut p);
    }
    if let Some(rt) = &spec.route_target {
        check_route_target(rt, "spec.routeTarget", &mut p);
    }
    for (i, c) in spec.communities.iter().enumerate() {
        check_community(c, &format!("spec.communities[{i}]"), &mut p);
    }
    let mut sources = BTreeMap::new();
    for (i, prefix) in spec.sbr_prefixes.iter().enumerate() {
        let path = format!("spec.sbrPrefixes[{i}]");
        match parse_network(prefix) {
            Err(e) => p.push(path, e),
            Ok(net) => {
                if let Some(first) = first_seen(&mut sources, net, i) {
                    p.push(path, format!("duplicates spec.sbrPrefixes[{first}]"));
                }
            }
        }
    }
    let mut names = BTreeMap::new();
    let mut subnets: Vec<(IpNet, usize)> = Vec::new();
    for (i, lb) in spec.loopbacks.iter().enumerate() {
        let at = format!("spec.loopbacks[{i}]");
        if let Some(first) = first_seen(&mut names, lb.name.as_str(), i) {
            p.push(
                format!("{at}.name"),
                format!("{} is already spec.loopbacks[{first}]", lb.name),
            );
        }
        match parse_network(&lb.subnet) {
            Err(e) => p.push(format!("{at}.subnet"), e),
            Ok(net) => {
                // Two loopbacks of one VRF drawing from overlapping pools could give a node the same
                // address twice, or two nodes one address.
                if let Some((other, j)) = subnets
                    .iter()
                    .find(|(o, _)| o.contains(&net) || net.contains(o))
                {
                    p.push(
                        format!("{at}.subnet"),
                        format!("{net} overlaps {other} of spec.loopbacks[{j}]"),
                    );
                }
                subnets.push((net, i));
            }
        }
    }
    p.0
}

/// Problems with one `Layer2NetworkConfiguration` spec.
pub fn validate_layer2(spec: &Layer2NetworkConfigurationSpec) -> Vec<FieldError> {
    let mut p = Problems::default();
    if let Some(rt) = &spec.route_target {
        check_route_target(rt, "spec.routeTarget", &mut p);
    }
    let mut seen: BTreeMap<IpAddr, usize> = BTreeMap::new();
    for (i, gw) in spec.anycast_gateways.iter().enumerate() {
        let path = format!("spec.anycastGateways[{i}]");
        match parse_host_address(gw) {
            Err(e) => p.push(path, e),
            Ok(net) => {
                if let Some(first) = first_seen(&mut seen, net.addr(), i) {
                    p.push(
                        path,
                        format!("{} is already spec.anycastGateways[{first}]", net.addr()),
                    );
                }
            }
        }
    }
    if let Some(mac) = &spec.anycast_mac
        && let Some(first) = mac.get(0..2).and_then(|o| u8::from_str_radix(o, 16).ok())
    {
        if first & 1 == 1 {
            p.push(
                "spec.anycastMac",
                format!("{mac} is a multicast address; a gateway needs a unicast MAC"),
            );
        } else if mac.split(':').all(|o| o == "00") {
            p.push("spec.anycastMac", format!("{mac} is the all-zero address"));
        }
    }
    if !spec.anycast_gateways.is_empty() && spec.anycast_mac.is_none() {
        p.push(
            "spec.anycastMac",
            "required when anycastGateways are set: every node must answer with the same MAC",
        );
    }
    p.0
}

/// Problems with one `RoutingTable` spec that the spec alone shows. What a route *means* — next hop or
/// device by type, address families, the kernel's identity of a route — is `netwave_core::dataplane`'s,
/// which fleet validation runs on every route (and the agent on every node config), so the API, the
/// fleet and the agent cannot disagree.
pub fn validate_routing_table(spec: &RoutingTableSpec) -> Vec<FieldError> {
    let mut p = Problems::default();
    check_table(spec.table_id, "spec.tableId", &mut p);
    for (i, route) in spec.routes.iter().enumerate() {
        if let Err(e) = parse_network(&route.prefix) {
            p.push(format!("spec.routes[{i}].prefix"), e);
        }
    }
    let mut priorities: BTreeMap<u32, usize> = BTreeMap::new();
    for (i, rule) in spec.rules.iter().enumerate() {
        let at = format!("spec.rules[{i}]");
        if RESERVED_RULE_PRIORITIES.contains(&rule.priority) {
            p.push(
                format!("{at}.priority"),
                format!(
                    "priority {} belongs to the kernel's main/default rule",
                    rule.priority
                ),
            );
        }
        if let Some(first) = first_seen(&mut priorities, rule.priority, i) {
            p.push(
                format!("{at}.priority"),
                format!(
                    "priority {} is already used by spec.rules[{first}]",
                    rule.priority
                ),
            );
        }
        let mut families = Vec::new();
        for (name, value) in [("from", &rule.from), ("to", &rule.to)] {
            if let Some(v) = value {
                match parse_network(v) {
                    Err(e) => p.push(format!("{at}.{name}"), e),
                    Ok(net) => families.push(family(&net)),
                }
            }
        }
        if families.len() == 2 && families[0] != families[1] {
            p.push(&at, "`from` and `to` are of different address families");
        }
        if let Err((field, message)) = check_fwmark(rule.fwmark, rule.fwmask) {
            p.push(format!("{at}.{field}"), message);
        }
    }
    p.0
}

/// [`check_fwmark`]'s refusals that CEL can say too ([`crate::cel`] has no bitwise operators for the
/// fourth), word for word.
pub const FWMASK_WITHOUT_FWMARK: &str = "a mask needs `fwmark`: it says which bits of the mark are \
     compared (to match packets whose masked mark is 0, write `fwmark: 0`)";
pub const FWMASK_ZERO: &str =
    "a mask of 0 compares no bit of the mark, so the rule would match every packet";
pub const FWMARK_ZERO_WITHOUT_FWMASK: &str = "the kernel neither compares nor reports a zero mark \
     without a mask; to match packets whose mark is 0, set `fwmask` (all bits: 4294967295)";

/// What is wrong with a policy rule's firewall mark and mask, as the field (`fwmark` or `fwmask`) and
/// why. The kernel takes each of these and then matches something else than written: a mask alone
/// compares against a zero mark nobody wrote, a zero mask matches every packet, a zero mark without a
/// mask is not compared at all, and a mark with bits outside its mask matches no packet.
pub fn check_fwmark(mark: Option<u32>, mask: Option<u32>) -> Result<(), (&'static str, String)> {
    match (mark, mask) {
        (None, Some(_)) => Err(("fwmask", FWMASK_WITHOUT_FWMARK.into())),
        (Some(_), Some(0)) => Err(("fwmask", FWMASK_ZERO.into())),
        (Some(m), Some(k)) if m & !k != 0 => Err((
            "fwmark",
            format!(
                "mark {m:#x} has bits outside mask {k:#x} ({:#x}): only the masked bits of a packet's \
                 mark are compared, so the rule could never match",
                m & !k
            ),
        )),
        (Some(0), None) => Err(("fwmark", FWMARK_ZERO_WITHOUT_FWMASK.into())),
        _ => Ok(()),
    }
}

/// The longest BGP hold time and keepalive interval FRR takes, in seconds.
pub const MAX_BGP_TIMER: u32 = 65535;

/// A Go duration as Kubernetes writes a `metav1.Duration` (`90s`, `1m30s`, `1.5m`, `0`) in whole
/// seconds. Units `h`, `m`, `s`, `ms`, `us`/`µs`, `ns`; a negative or fractional-second total is an
/// error, as is one over `max` seconds.
pub fn parse_duration_seconds(s: &str, max: u32) -> Result<u32, String> {
    let bad = || format!("{s:?} is not a duration (e.g. 90s, 1m30s)");
    if s == "0" {
        return Ok(0);
    }
    if s.starts_with('-') {
        return Err(format!("{s:?} is negative"));
    }
    let rest = s.strip_prefix('+').unwrap_or(s);
    if rest.is_empty() {
        return Err(bad());
    }
    // Nanoseconds, exactly: the integer and fraction parts are kept apart until the unit is known.
    let mut total: u128 = 0;
    let mut r = rest;
    while !r.is_empty() {
        let int_len = r.bytes().take_while(u8::is_ascii_digit).count();
        let (int, after) = r.split_at(int_len);
        let (frac, after) = match after.strip_prefix('.') {
            Some(a) => {
                let n = a.bytes().take_while(u8::is_ascii_digit).count();
                a.split_at(n)
            }
            None => ("", after),
        };
        if int.is_empty() && frac.is_empty() {
            return Err(bad());
        }
        let unit_len = after
            .char_indices()
            .find(|(_, c)| c.is_ascii_digit() || *c == '.')
            .map_or(after.len(), |(i, _)| i);
        let (unit, tail) = after.split_at(unit_len);
        let scale: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return Err(bad()),
        };
        let int: u128 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| bad())?
        };
        let frac_ns = if frac.is_empty() {
            0
        } else {
            let digits = &frac[..frac.len().min(18)];
            let f: u128 = digits.parse().map_err(|_| bad())?;
            f * scale / 10u128.pow(digits.len() as u32)
        };
        total = int
            .checked_mul(scale)
            .and_then(|v| v.checked_add(frac_ns))
            .and_then(|v| total.checked_add(v))
            .ok_or_else(bad)?;
        r = tail;
    }
    if !total.is_multiple_of(1_000_000_000) {
        return Err(format!(
            "{s} is not a whole number of seconds (BGP timers are in seconds)"
        ));
    }
    let secs = total / 1_000_000_000;
    u32::try_from(secs)
        .ok()
        .filter(|&v| v <= max)
        .ok_or_else(|| format!("{s} is {secs} s, longer than {max} s"))
}

/// The hold time and keepalive interval of a BGPPeering in seconds, when both are set and valid.
/// Problems (one without the other, out of FRR's ranges, keepalive not below hold) go to `p`.
fn bgp_timers(spec: &BGPPeeringSpec, p: &mut Problems) -> Option<(u32, u32)> {
    let parse = |field: &str, v: &Option<String>, p: &mut Problems| {
        v.as_ref().and_then(|v| {
            parse_duration_seconds(v, MAX_BGP_TIMER)
                .map_err(|e| p.push(format!("spec.{field}"), e))
                .ok()
        })
    };
    let hold = parse("holdTime", &spec.hold_time, p);
    let keepalive = parse("keepaliveTime", &spec.keepalive_time, p);
    match (&spec.hold_time, &spec.keepalive_time) {
        (Some(_), None) => p.push(
            "spec.keepaliveTime",
            "required with holdTime: FRR sets the two together (e.g. keepaliveTime 30s with holdTime 90s)",
        ),
        (None, Some(_)) => p.push(
            "spec.holdTime",
            "required with keepaliveTime: FRR sets the two together (e.g. holdTime 90s with keepaliveTime 30s)",
        ),
        _ => {}
    }
    let (hold, keepalive) = (hold?, keepalive?);
    let mut ok = true;
    if (1..3).contains(&hold) {
        p.push(
            "spec.holdTime",
            format!("{hold} s: a hold time is 0 (no hold timer) or 3 s to {MAX_BGP_TIMER} s"),
        );
        ok = false;
    }
    if hold == 0 && keepalive != 0 {
        p.push(
            "spec.keepaliveTime",
            format!(
                "{keepalive} s with holdTime 0: without a hold timer no keepalives are sent; set 0"
            ),
        );
        ok = false;
    } else if hold > 0 && keepalive >= hold {
        p.push(
            "spec.keepaliveTime",
            format!("{keepalive} s is not below holdTime ({hold} s): the session would expire between keepalives"),
        );
        ok = false;
    }
    ok.then_some((hold, keepalive))
}

/// The hold time and keepalive of a valid BGPPeering in seconds (`None` when not set).
pub fn bgp_peering_timers(spec: &BGPPeeringSpec) -> Option<(u32, u32)> {
    bgp_timers(spec, &mut Problems::default())
}

/// Problems with one `BGPPeering` spec that the spec alone shows. Which segment it names, and whether
/// that segment is in a VRF, is fleet validation's.
pub fn validate_bgp_peering(spec: &BGPPeeringSpec) -> Vec<FieldError> {
    let mut p = Problems::default();
    match (&spec.peering_vlan, &spec.loopback_peer) {
        (None, None) => p.push(
            "spec",
            "one of peeringVlan (a layer-2 segment to listen on) or loopbackPeer (workload addresses) is required",
        ),
        (Some(_), Some(_)) => p.push(
            "spec.loopbackPeer",
            "peeringVlan and loopbackPeer exclude each other: make two BGPPeerings",
        ),
        _ => {}
    }
    if let Some(vlan) = &spec.peering_vlan
        && vlan.name.is_empty()
    {
        p.push(
            "spec.peeringVlan.name",
            "must name a Layer2NetworkConfiguration",
        );
    }
    if let Some(lo) = &spec.loopback_peer {
        if lo.ip_addresses.is_empty() {
            p.push("spec.loopbackPeer.ips", "at least one address is required");
        }
        let mut families: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, ip) in lo.ip_addresses.iter().enumerate() {
            let at = format!("spec.loopbackPeer.ips[{i}]");
            match ip.parse::<IpAddr>() {
                Err(_) => p.push(
                    at,
                    format!("{ip} is not an IP address (e.g. 10.250.3.1 or fd00::1)"),
                ),
                Ok(addr) => {
                    let fam = if addr.is_ipv4() { "IPv4" } else { "IPv6" };
                    if addr.is_unspecified() || addr.is_loopback() || addr.is_multicast() {
                        p.push(
                            at,
                            format!("{ip} is not a unicast address a workload can have"),
                        );
                    } else if let Some(first) = first_seen(&mut families, fam, i) {
                        p.push(
                            at,
                            format!("a second {fam} address: spec.loopbackPeer.ips[{first}] is the peering's {fam} address (one per family)"),
                        );
                    }
                }
            }
        }
    }
    if spec.remote_asn == 0 {
        p.push("spec.remoteASN", "0 is not an AS number (1 to 4294967295)");
    }
    if spec.maximum_prefixes == Some(0) {
        p.push(
            "spec.maximumPrefixes",
            "0 would tear the session down on the first prefix; omit it for no limit",
        );
    }
    bgp_timers(spec, &mut p);
    check_prefix_list(&spec.import, "import", &mut p);
    check_prefix_list(&spec.export, "export", &mut p);
    p.0
}

/// One packet filter a `trafficMatch` becomes: an IP family, at most one protocol, and the prefixes
/// (host bits cleared) and ports to compare. A match a single filter cannot say (ports without a
/// protocol, no family fixed by a prefix or protocol) becomes several, one per protocol and family.
/// It is also what a node's mirror filter matches (`netwave_core::dataplane::MirrorMatch`), displayed
/// as tc's flower match.
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct TrafficFilter {
    pub ipv6: bool,
    /// IP protocol number.
    pub protocol: Option<u8>,
    pub src: Option<IpNet>,
    pub dst: Option<IpNet>,
    pub src_port: Option<u16>,
    pub dst_port: Option<u16>,
}

impl fmt::Display for TrafficFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.ipv6 { "ipv6" } else { "ip" })?;
        if let Some(p) = self.protocol {
            write!(f, " ip_proto {p}")?;
        }
        if let Some(n) = self.src {
            write!(f, " src_ip {n}")?;
        }
        if let Some(n) = self.dst {
            write!(f, " dst_ip {n}")?;
        }
        if let Some(p) = self.src_port {
            write!(f, " src_port {p}")?;
        }
        if let Some(p) = self.dst_port {
            write!(f, " dst_port {p}")?;
        }
        Ok(())
    }
}

/// IP protocol numbers of the `trafficMatch.protocol` names.
pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_ICMPV6: u8 = 58;
pub const IPPROTO_SCTP: u8 = 132;

/// A `trafficMatch` prefix: a network in CIDR notation or a bare address (a host prefix).
fn match_prefix(s: &str) -> Result<IpNet, String> {
    if let Ok(addr) = s.parse::<IpAddr>() {
        return Ok(IpNet::from(addr));
    }
    parse_network(s).map_err(|e| format!("{e}; or a single address such as 10.0.0.1"))
}

/// The filters a `trafficMatch` becomes, in a fixed order (IPv4 before IPv6, then by protocol), or
/// every problem with it: a value that does not parse, and a match that can never match anything
/// (prefixes of two families, ports with ICMP, an ICMP protocol of the other family than a prefix).
/// `at` is its field path (`spec.trafficMatch`).
pub fn traffic_filters(m: &TrafficMatch, at: &str) -> Result<Vec<TrafficFilter>, Vec<FieldError>> {
    let mut p = Problems::default();
    let prefix = |field: &str, v: &Option<String>, p: &mut Problems| {
        v.as_ref().and_then(|v| {
            match_prefix(v)
                .map_err(|e| p.push(format!("{at}.{field}"), e))
                .ok()
        })
    };
    let src = prefix("srcPrefix", &m.src_prefix, &mut p);
    let dst = prefix("dstPrefix", &m.dst_prefix, &mut p);
    let protocol = m
        .protocol
        .as_ref()
        .and_then(|v| match v.to_ascii_lowercase().as_str() {
            "tcp" => Some(IPPROTO_TCP),
            "udp" => Some(IPPROTO_UDP),
            "sctp" => Some(IPPROTO_SCTP),
            "icmp" => Some(IPPROTO_ICMP),
            "icmpv6" => Some(IPPROTO_ICMPV6),
            _ => {
                p.push(
                    format!("{at}.protocol"),
                    format!(
                        "{v} is not a protocol netwave can match: tcp, udp, sctp, icmp or icmpv6"
                    ),
                );
                None
            }
        });
    for (field, port) in [("srcPort", m.src_port), ("dstPort", m.dst_port)] {
        if port == Some(0) {
            p.push(format!("{at}.{field}"), "port 0 never matches (1 to 65535)");
        }
    }
    if let (Some(s), Some(d)) = (src, dst)
        && s.addr().is_ipv4() != d.addr().is_ipv4()
    {
        p.push(
            format!("{at}.dstPrefix"),
            format!("{d} and srcPrefix {s} are of two address families: no packet has both"),
        );
    }
    let ports = m.src_port.is_some() || m.dst_port.is_some();
    if let Some(proto @ (IPPROTO_ICMP | IPPROTO_ICMPV6)) = protocol {
        if ports {
            let field = if m.src_port.is_some() {
                "srcPort"
            } else {
                "dstPort"
            };
            p.push(
                format!("{at}.{field}"),
                "ports match only tcp, udp or sctp; an ICMP packet has none",
            );
        }
        let v6 = proto == IPPROTO_ICMPV6;
        for (field, net) in [("srcPrefix", src), ("dstPrefix", dst)] {
            if let Some(n) = net
                && n.addr().is_ipv6() != v6
            {
                p.push(
                    format!("{at}.{field}"),
                    format!(
                        "{n} is {} but protocol {} is {}: no packet matches both",
                        if v6 { "IPv4" } else { "IPv6" },
                        m.protocol.as_deref().unwrap_or_default(),
                        if v6 { "IPv6's" } else { "IPv4's" },
                    ),
                );
            }
        }
    }
    if !p.0.is_empty() {
        return Err(p.0);
    }
    let families: Vec<bool> = match (src.or(dst), protocol) {
        (Some(n), _) => vec![n.addr().is_ipv6()],
        (None, Some(IPPROTO_ICMP)) => vec![false],
        (None, Some(IPPROTO_ICMPV6)) => vec![true],
        (None, _) => vec![false, true],
    };
    let protocols: Vec<Option<u8>> = match protocol {
        Some(proto) => vec![Some(proto)],
        None if ports => vec![Some(IPPROTO_TCP), Some(IPPROTO_UDP), Some(IPPROTO_SCTP)],
        None => vec![None],
    };
    let mut out = Vec::new();
    for &ipv6 in &families {
        for &protocol in &protocols {
            out.push(TrafficFilter {
                ipv6,
                protocol,
                src: src.map(|n| n.trunc()),
                dst: dst.map(|n| n.trunc()),
                src_port: m.src_port,
                dst_port: m.dst_port,
            });
        }
    }
    Ok(out)
}

/// Whether a mirror reference's `apiGroup` is one netwave answers for (see [`MIRROR_REF_GROUPS`]).
pub fn mirror_ref_group_ok(r: &MirrorObjectRef) -> bool {
    r.api_group
        .as_deref()
        .is_none_or(|g| g.is_empty() || MIRROR_REF_GROUPS.contains(&g))
}

fn check_mirror_ref(r: &MirrorObjectRef, at: &str, kinds: &[&str], p: &mut Problems) {
    if !mirror_ref_group_ok(r) {
        p.push(
            format!("{at}.apiGroup"),
            format!(
                "{} is not netwave's group: use netwave.dev (or das-schiff's network.t-caas.telekom.com), or omit it",
                r.api_group.as_deref().unwrap_or_default()
            ),
        );
    }
    if !kinds.contains(&r.kind.as_str()) {
        p.push(
            format!("{at}.kind"),
            format!(
                "{} cannot be referenced here: want {}",
                r.kind,
                kinds.join(" or ")
            ),
        );
    }
    if r.name.is_empty() {
        p.push(format!("{at}.name"), "must name an object");
    }
    if r.namespace.as_deref().is_some_and(|n| !n.is_empty()) {
        p.push(
            format!("{at}.namespace"),
            "netwave's objects are cluster-scoped: omit the namespace",
        );
    }
}

/// Problems with one `MirrorTarget` spec that the spec alone shows. Whether its VRF and loopback exist,
/// and the loopback's family, is fleet validation's.
pub fn validate_mirror_target(spec: &MirrorTargetSpec) -> Vec<FieldError> {
    let mut p = Problems::default();
    match spec.destination_ip.parse::<IpAddr>() {
        Err(_) => p.push(
            "spec.destinationIP",
            format!(
                "{} is not an IP address (e.g. 10.250.90.100 or fd00::100)",
                spec.destination_ip
            ),
        ),
        Ok(a) if a.is_unspecified() || a.is_loopback() || a.is_multicast() => p.push(
            "spec.destinationIP",
            format!("{a} is not a unicast address a collector can have"),
        ),
        Ok(_) => {}
    }
    if spec.destination_vrf.is_empty() {
        p.push("spec.destinationVrf", "must name a VRF");
    }
    if spec.source_loopback.is_empty() {
        p.push("spec.sourceLoopback", "must name a loopback of the VRF");
    }
    p.0
}

/// The kinds a MirrorSelector's `mirrorSource` may name.
pub const MIRROR_SOURCE_KINDS: [&str; 2] = ["Layer2NetworkConfiguration", "VRFRouteConfiguration"];

/// Problems with one `MirrorSelector` spec that the spec alone shows. Whether the objects it names exist
/// is fleet validation's.
pub fn validate_mirror_selector(spec: &MirrorSelectorSpec) -> Vec<FieldError> {
    let mut p = Problems::default();
    check_mirror_ref(
        &spec.mirror_target,
        "spec.mirrorTarget",
        &["MirrorTarget"],
        &mut p,
    );
    check_mirror_ref(
        &spec.mirror_source,
        "spec.mirrorSource",
        &MIRROR_SOURCE_KINDS,
        &mut p,
    );
    if let Err(e) = traffic_filters(&spec.traffic_match, "spec.trafficMatch") {
        p.0.extend(e);
    }
    p.0
}
