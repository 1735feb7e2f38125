//! Node-local underlay settings: the part of a node's FRR configuration that does not come from the
//! revision (local ASN, VTEP address, BGP neighbours, timers).
//!
//! ```text
//!  agent config file (YAML) ──serde──► UnderlaySettings ──Underlay::new──► Underlay (validated)
//!                                        (raw strings)      field-named         │
//!                                                            errors             ▼
//!                                          uname -n ──with_hostname──► frr::render(node config, &underlay)
//! ```
//!
//! The settings differ per node and never change with a revision, so they live in the agent's config
//! file and are validated once, at start-up, with errors that name the field. An `Underlay` is only
//! built by [`Underlay::new`] (directly or through serde's `try_from`), so render can trust it.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Keepalive FRR's `datacenter` profile uses when `timers bgp` is not configured.
pub const DATACENTER_KEEPALIVE: u16 = 3;
/// Hold time FRR's `datacenter` profile uses when `timers bgp` is not configured.
pub const DATACENTER_HOLD: u16 = 9;
/// `AS_TRANS` (RFC 6793): a placeholder a 4-byte-ASN speaker shows 2-byte peers, never a real ASN.
const AS_TRANS: u32 = 23456;
/// The kernel's interface-name limit (IFNAMSIZ - 1).
const MAX_INTERFACE_NAME: usize = 15;

/// The underlay section of the agent's config file, as written. Nothing is checked yet: build an
/// [`Underlay`] from it.
///
/// ```yaml
/// asn: 65000
/// vtepAddress: 198.18.1.1        # IPv4 only: FRR 8.4 cannot use IPv6 VTEPs
/// routerId: 198.18.1.1           # optional, defaults to vtepAddress
/// neighbors:
///   - address: 198.18.0.254      # numbered, IPv4
///     remoteAs: internal
///   - interface: eth1            # unnumbered (IPv6 link-local)
///     remoteAs: external         # or an ASN
/// timers: { keepalive: 3, hold: 9 }   # optional, seconds
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UnderlaySettings {
    /// The node's BGP autonomous system number.
    pub asn: u32,
    /// IPv4 address VXLAN tunnels start and end at; advertised as a /32 into the underlay. May be left
    /// out of a file shared by many nodes: the agent then takes its `--vxlan-local` (the DaemonSet sets it
    /// to the node's address), so one file serves a whole pool.
    #[serde(default)]
    pub vtep_address: String,
    /// BGP router id; the VTEP address when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router_id: Option<String>,
    /// Underlay BGP sessions; every one carries IPv4 unicast (VTEP reachability) and L2VPN EVPN.
    #[serde(default)]
    pub neighbors: Vec<NeighborSettings>,
    /// BGP keepalive and hold time for every session; FRR's datacenter defaults (3 s, 9 s) when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timers: Option<TimerSettings>,
}

impl UnderlaySettings {
    /// The settings of a node an Underlay input selects (its `spec.config.underlay`): that underlay's
    /// ASN, neighbours and timers with the node's own VTEP address and router id.
    pub fn of_input(
        u: &netwave_api::UnderlayConfig,
        vtep: Ipv4Addr,
        router_id: Option<Ipv4Addr>,
    ) -> UnderlaySettings {
        let remote_as = |r: &str| match r.parse::<u32>() {
            Ok(n) => RemoteAsSetting::Number(n),
            Err(_) => RemoteAsSetting::Keyword(r.to_string()),
        };
        UnderlaySettings {
            asn: u.asn,
            vtep_address: vtep.to_string(),
            router_id: router_id.map(|r| r.to_string()),
            neighbors: (u.neighbors.iter())
                .map(|n| NeighborSettings {
                    address: n.address.clone(),
                    interface: n.interface.clone(),
                    remote_as: remote_as(&n.remote_as),
                })
                .collect(),
            timers: u.timers.map(|t| TimerSettings {
                keepalive: t.keepalive,
                hold: t.hold,
            }),
        }
    }
}

/// One underlay BGP neighbour: by `address` (numbered) or by `interface` (unnumbered), not both.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NeighborSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    /// `internal`, `external` or the neighbour's ASN.
    pub remote_as: RemoteAsSetting,
}

/// `remoteAs` as written: a number or a keyword.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RemoteAsSetting {
    Number(u32),
    Keyword(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TimerSettings {
    /// Seconds between keepalives.
    pub keepalive: u16,
    /// Seconds without a message before the session is dropped; 0 (never) or at least 3.
    pub hold: u16,
}

/// A setting that cannot be used, with the field that holds it (`neighbors[1].remoteAs`).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("underlay {field}: {message}")]
pub struct UnderlayError {
    pub field: String,
    pub message: String,
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> UnderlayError {
    UnderlayError {
        field: field.into(),
        message: message.into(),
    }
}

/// Validated underlay settings. Only [`Underlay::new`] builds one.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "UnderlaySettings")]
pub struct Underlay {
    asn: u32,
    vtep: Ipv4Addr,
    router_id: Ipv4Addr,
    neighbors: Vec<UnderlayNeighbor>,
    timers: Option<TimerSettings>,
    hostname: Option<String>,
}

/// A checked underlay neighbour.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct UnderlayNeighbor {
    pub peer: Peer,
    pub remote_as: RemoteAs,
}

/// How a BGP neighbour is reached.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Peer {
    /// Numbered session to an IPv4 address.
    Address(Ipv4Addr),
    /// Unnumbered session over an interface (IPv6 link-local, RFC 5549 next hops).
    Interface(String),
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::Address(a) => a.fmt(f),
            Peer::Interface(i) => f.write_str(i),
        }
    }
}

/// A neighbour's autonomous system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum RemoteAs {
    /// The local ASN (iBGP), whatever it is.
    Internal,
    /// Any ASN but the local one (eBGP).
    External,
    Number(u32),
}

impl fmt::Display for RemoteAs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RemoteAs::Internal => f.write_str("internal"),
            RemoteAs::External => f.write_str("external"),
            RemoteAs::Number(n) => n.fmt(f),
        }
    }
}

impl TryFrom<UnderlaySettings> for Underlay {
    type Error = UnderlayError;
    fn try_from(settings: UnderlaySettings) -> Result<Self, Self::Error> {
        Underlay::new(settings)
    }
}

impl Underlay {
    /// Checks every field; the first problem is returned with the field's path.
    pub fn new(s: UnderlaySettings) -> Result<Self, UnderlayError> {
        check_asn(s.asn, "asn")?;
        if s.vtep_address.is_empty() {
            return Err(invalid(
                "vtepAddress",
                "missing: give the node's VTEP address here or the agent's --vxlan-local",
            ));
        }
        let vtep = usable_ipv4(&s.vtep_address, "vtepAddress", "VTEP address").map_err(|e| {
            if s.vtep_address.parse::<std::net::Ipv6Addr>().is_ok() {
                invalid(
                    "vtepAddress",
                    format!(
                        "{} is IPv6: VTEPs must be IPv4 (FRR 8.4 advertises no IPv6 VTEPs)",
                        s.vtep_address
                    ),
                )
            } else {
                e
            }
        })?;
        let router_id = match &s.router_id {
            Some(r) => usable_ipv4(r, "routerId", "router id")?,
            None => vtep,
        };
        if s.neighbors.is_empty() {
            return Err(invalid(
                "neighbors",
                "at least one underlay neighbour is needed: EVPN routes (remote VTEPs and MACs) come \
                 from BGP peers",
            ));
        }
        let mut neighbors = Vec::with_capacity(s.neighbors.len());
        let mut seen: BTreeMap<Peer, usize> = BTreeMap::new();
        for (i, n) in s.neighbors.iter().enumerate() {
            let at = format!("neighbors[{i}]");
            let peer = match (&n.address, &n.interface) {
                (Some(a), None) => Peer::Address(neighbor_address(a, &at, vtep, router_id)?),
                (None, Some(ifname)) => Peer::Interface(interface_name(ifname, &at)?),
                (Some(_), Some(_)) => {
                    return Err(invalid(
                        at,
                        "set either address (numbered) or interface (unnumbered), not both",
                    ));
                }
                (None, None) => {
                    return Err(invalid(
                        at,
                        "set address (numbered) or interface (unnumbered)",
                    ));
                }
            };
            let remote_as = match &n.remote_as {
                RemoteAsSetting::Number(asn) => {
                    check_asn(*asn, &format!("{at}.remoteAs"))?;
                    RemoteAs::Number(*asn)
                }
                RemoteAsSetting::Keyword(k) if k == "internal" => RemoteAs::Internal,
                RemoteAsSetting::Keyword(k) if k == "external" => RemoteAs::External,
                RemoteAsSetting::Keyword(k) => {
                    return Err(invalid(
                        format!("{at}.remoteAs"),
                        format!("{k:?}: want internal, external or an ASN"),
                    ));
                }
            };
            if let Some(first) = seen.insert(peer.clone(), i) {
                return Err(invalid(
                    at,
                    format!("neighbour {peer} is already neighbors[{first}]"),
                ));
            }
            neighbors.push(UnderlayNeighbor { peer, remote_as });
        }
        if let Some(t) = s.timers {
            if t.hold != 0 && t.hold < 3 {
                return Err(invalid(
                    "timers.hold",
                    format!("{}: want 0 (no hold timer) or at least 3 seconds", t.hold),
                ));
            }
            if t.hold != 0 && t.keepalive > t.hold {
                return Err(invalid(
                    "timers.keepalive",
                    format!(
                        "{} s is longer than the hold time ({} s): every session would expire",
                        t.keepalive, t.hold
                    ),
                ));
            }
        }
        Ok(Underlay {
            asn: s.asn,
            vtep,
            router_id,
            neighbors,
            timers: s.timers,
            hostname: None,
        })
    }

    /// The node's `uname -n`. FRR's running config always shows the kernel's host name, whatever the
    /// file says (FRR issues #7583, #20398); rendering it makes `frr-reload.py --test` show no diff.
    /// It is not a setting: the agent reads it from the kernel. An empty name or one with whitespace
    /// is ignored, as FRR could not show it either.
    pub fn with_hostname(mut self, hostname: &str) -> Self {
        let ok = !hostname.is_empty() && !hostname.chars().any(|c| c.is_whitespace());
        self.hostname = ok.then(|| hostname.to_string());
        self
    }

    pub fn asn(&self) -> u32 {
        self.asn
    }
    pub fn vtep(&self) -> Ipv4Addr {
        self.vtep
    }
    pub fn router_id(&self) -> Ipv4Addr {
        self.router_id
    }
    pub fn neighbors(&self) -> &[UnderlayNeighbor] {
        &self.neighbors
    }
    pub fn timers(&self) -> Option<TimerSettings> {
        self.timers
    }
    pub fn hostname(&self) -> Option<&str> {
        self.hostname.as_deref()
    }
}

fn check_asn(asn: u32, field: &str) -> Result<(), UnderlayError> {
    match asn {
        0 => Err(invalid(field, "0 is not an ASN (want 1 to 4294967295)")),
        AS_TRANS => Err(invalid(
            field,
            "23456 is AS_TRANS, a placeholder for 4-byte ASNs (RFC 6793), not a usable ASN",
        )),
        _ => Ok(()),
    }
}

fn usable_ipv4(s: &str, field: &str, what: &str) -> Result<Ipv4Addr, UnderlayError> {
    let a: Ipv4Addr = s
        .parse()
        .map_err(|_| invalid(field, format!("{s:?} is not an IPv4 address")))?;
    if a.is_unspecified() || a.is_broadcast() || a.is_multicast() || a.is_loopback() {
        return Err(invalid(
            field,
            format!("{a} cannot be a {what} (unspecified, broadcast, multicast or loopback)"),
        ));
    }
    Ok(a)
}

fn neighbor_address(
    s: &str,
    at: &str,
    vtep: Ipv4Addr,
    router_id: Ipv4Addr,
) -> Result<Ipv4Addr, UnderlayError> {
    let field = format!("{at}.address");
    if let Ok(IpAddr::V6(_)) = s.parse::<IpAddr>() {
        return Err(invalid(
            field,
            format!(
                "{s} is IPv6: the underlay session carries the IPv4 VTEP routes and needs an IPv4 \
                 next hop; use `interface` for BGP over IPv6 link-local (unnumbered)"
            ),
        ));
    }
    let a = usable_ipv4(s, &field, "neighbour address")?;
    if a == vtep || a == router_id {
        return Err(invalid(
            field,
            format!("{a} is this node's own VTEP address or router id"),
        ));
    }
    Ok(a)
}

/// An interface name FRR can take as `neighbor NAME interface`: a kernel name (1-15 bytes) of the
/// characters netwave allows in device names, and not an address (FRR would read it as one).
fn interface_name(s: &str, at: &str) -> Result<String, UnderlayError> {
    let field = format!("{at}.interface");
    let chars_ok = s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if s.is_empty() || s.len() > MAX_INTERFACE_NAME || !chars_ok {
        return Err(invalid(
            field,
            format!("{s:?} is not an interface name (1-15 characters of [a-zA-Z0-9._-])"),
        ));
    }
    if s.parse::<IpAddr>().is_ok() {
        return Err(invalid(
            field,
            format!("{s:?} is an address: use `address` for a numbered neighbour"),
        ));
    }
    Ok(s.to_string())
}
