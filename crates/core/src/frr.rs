//! FRR rendering: a node's desired config and its underlay settings → FRR configuration as data →
//! canonical FRR text. Pure and deterministic: the same inputs give the same bytes.
//!
//! ```text
//!  NodeNetworkConfig spec.config (NodeConfig, from the revision) ─┐
//!                                                                 ├─ render() ─► FrrConfig ─ to_text() ─► frr.conf
//!  agent config file ─► Underlay (ASN, VTEP, neighbours, timers) ─┘   (checks,     (model,     (what FRR's
//!                       + uname -n (hostname)                          FrrError)    FRR order)  running config shows)
//! ```
//!
//! **What each node config field becomes** (names are the VRF's *device*, which is what FRR sees):
//!
//! | NodeConfig | FRR |
//! | --- | --- |
//! | `vrfs[].vni` | zebra `vrf D` / `vni N`; `router bgp ASN vrf D` with `address-family l2vpn evpn` `advertise ipv4 unicast` + `advertise ipv6 unicast` (the VRF's routes as type-5) |
//! | `vrfs[].routeTarget` | in that block `route-target import RT` and `route-target export RT` (else FRR's automatic RT, ASN:VNI) |
//! | `vrfs[].import[]` (VRF → default VRF) | `ip[v6] prefix-list nw-D-import-v4/-v6 seq S permit\|deny P [ge] [le]`; the default instance `import vrf D` through `route-map nw-default-import`, one entry per VRF and family: `match ip[v6] address prefix-list …` + `match source-vrf D` |
//! | `vrfs[].export[]` (default VRF → VRF) | `prefix-list nw-D-export-v4/-v6`; the VRF instance `import vrf default` through `route-map nw-D-export`; the default instance redistributes kernel + connected routes of that family so it has routes to leak |
//! | `vrfs[].communities` | `set community … additive` / `set large-community … additive` on the `nw-D-export` entries (exported routes only) |
//! | `vrfs[].aggregate[]` | `aggregate-address P` in the VRF instance (see [`render`] for why not blackhole statics) |
//! | `vrfs[].sbr` (`sbrPrefixes`) | `router bgp ASN vrf s-D` importing (`import vrf`) everything of `D` and of the default VRF, as the reference's local VRF `s-<vrf>` does; the policy rules are the agent's (netlink) |
//! | `vrfs[].loopbacks` | nothing of their own: the addresses sit on the VRF device, so the VRF instance's `redistribute connected` announces them (as type-5 routes when the VRF has a VNI) |
//! | `layer2s[].vni` | nothing per VNI: `advertise-all-vni` makes every VXLAN device the agent creates an EVPN VNI with FRR's automatic RD/RT; only checked for clashes |
//! | `layer2s[].routeTarget` | under `advertise-all-vni`: `vni N` / `route-target import RT` / `route-target export RT` / `exit-vni` (left out when equal to FRR's automatic `ASN:VNI`, which FRR never shows) |
//! | everything else (device names, tables, MTUs, bridges, anycast MAC/gateways, neighbour suppression, routes, rules) | nothing: the agent applies them with netlink |
//!
//! The prefix-list `seq` and action are the items' own, so evaluation is the reference's: items in
//! `seq` order, the first match decides, no match denies. Every VRF instance also redistributes its
//! table's kernel and connected routes (the agent's routes, the anycast gateway subnets).
//!
//! **Underlay**: `router bgp ASN` with `no bgp default ipv4-unicast`, every neighbour activated in
//! IPv4 unicast (VTEP reachability, `network VTEP/32`) and L2VPN EVPN (`advertise-all-vni`). Towards
//! the underlay only the VTEP /32 is sent (`route-map nw-underlay-out` → `prefix-list nw-vtep-v4`):
//! routes leaked into or redistributed by the default instance must never reach the fabric underlay.
//!
//! **Canonical form** (`text`): FRR 8.4's `show running-config` order and spelling, measured on these
//! machines (`../shared/docs/FRR-LAB.md`), so `frr-reload.py --test` shows no diff once applied. Traps
//! handled: forwarding is the node's, rendered as FRR shows it (`no ip forwarding` only when the kernel has
//! it off, [`Forwarding`]), so a reload never changes it; `hostname` only as the kernel's own name,
//! timers equal to the profile's defaults left out, communities sorted with FRR's well-known names,
//! route targets canonicalised (`65188:02026` → `65188:2026`), no empty `vrf` blocks. The daemons must
//! run with the `datacenter` profile ([`PROFILE`]).

pub mod model;
mod text;
pub mod underlay;

use std::collections::{BTreeMap, BTreeSet};

use ipnet::{IpNet, Ipv4Net};
use netwave_api::{BgpPeerConfig, NodeConfig, PrefixAction, PrefixItem, VrfConfig};
use thiserror::Error;

pub use model::{
    Action, BgpInstance, Community, EvpnFamily, Family, Forwarding, FrrConfig, LargeCommunity,
    PrefixEntry, PrefixList, Redistribute, RouteMapEntry, RouteTarget, UnicastFamily,
    WorkloadFamily, WorkloadId, WorkloadPeer,
};
pub use text::PROFILE;
pub use underlay::{
    NeighborSettings, Peer, RemoteAs, RemoteAsSetting, TimerSettings, Underlay, UnderlayError,
    UnderlayNeighbor, UnderlaySettings,
};

/// Route map the default instance imports VRF routes through (`import[]` items).
pub const DEFAULT_IMPORT_ROUTE_MAP: &str = "nw-default-import";
/// Route map on every underlay neighbour's IPv4 unicast output.
pub const UNDERLAY_OUT_ROUTE_MAP: &str = "nw-underlay-out";
/// Prefix list holding the VTEP /32, the only route sent to the underlay.
pub const VTEP_PREFIX_LIST: &str = "nw-vtep-v4";
/// VRFs per node the default import route map has sequence numbers for (10 per VRF, at most 65535).
pub const MAX_VRFS: usize = 6553;
/// FRR's name for the default VRF; a VRF device cannot be called that.
const DEFAULT_VRF: &str = "default";
const MAX_VNI: u32 = 16_777_215;

/// A node config FRR cannot express, or would take differently from what it says.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum FrrError {
    /// A VRF field; `field` is its path inside the VRF (`import[2].le`).
    #[error("VRF {vrf}: {field}: {message}")]
    Vrf {
        vrf: String,
        field: String,
        message: String,
    },
    /// A VNI used twice on the node (zebra maps a VNI to one VXLAN device) or out of range.
    #[error("VNI {vni}: {message}")]
    Vni { vni: u32, message: String },
    #[error("{count} VRFs on one node: the default import route map has room for {MAX_VRFS}")]
    TooManyVrfs { count: usize },
    /// A BGPPeering's field; `field` is its path inside the node config's peer (`import[0].cidr`).
    #[error("BGPPeering {peering}: {field}: {message}")]
    Peering {
        peering: String,
        field: String,
        message: String,
    },
    /// The config's underlay (an Underlay input) is not usable on this node (a neighbour is the node's
    /// own VTEP address, say); `field` is its path inside `spec.config.underlay`.
    #[error("Underlay {underlay}: {field}: {message}")]
    Underlay {
        underlay: String,
        field: String,
        message: String,
    },
}

impl FrrError {
    /// A small fixed set, for metric labels and Event reasons.
    pub fn category(&self) -> &'static str {
        match self {
            FrrError::Vrf { .. } => "vrf",
            FrrError::Vni { .. } => "vni",
            FrrError::TooManyVrfs { .. } => "too_many_vrfs",
            FrrError::Peering { .. } => "peering",
            FrrError::Underlay { .. } => "underlay",
        }
    }
}

/// One VRF, checked and split by family.
struct Vrf {
    device: String,
    vni: Option<u32>,
    /// The source-based-routing VRF's device (`sbrPrefixes`).
    sbr: Option<String>,
    route_target: Option<RouteTarget>,
    import: BTreeMap<Family, BTreeMap<u32, PrefixEntry>>,
    export: BTreeMap<Family, BTreeMap<u32, PrefixEntry>>,
    aggregates: BTreeSet<IpNet>,
    communities: Vec<Community>,
    large_communities: Vec<LargeCommunity>,
}

impl Vrf {
    fn imports(&self, f: Family) -> bool {
        self.import.contains_key(&f)
    }
    fn exports(&self, f: Family) -> bool {
        self.export.contains_key(&f)
    }
    /// A VRF with nothing for BGP to do stays kernel-only: no instance, no `vrf` block.
    fn needs_instance(&self, peers: &Peers) -> bool {
        peers.contains_key(&Some(self.device.clone()))
            || self.vni.is_some()
            || self.sbr.is_some()
            || !self.import.is_empty()
            || !self.export.is_empty()
            || !self.aggregates.is_empty()
    }
    fn prefix_list(&self, field: &str, f: Family) -> String {
        format!("nw-{}-{field}-{}", self.device, f.suffix())
    }
    fn export_route_map(&self) -> String {
        format!("nw-{}-export", self.device)
    }
}

/// The VRF fields of `config` that only BGP can apply, as `VRF <name>: vni, routeTarget`; empty when the
/// config is kernel-only. Layer-2 segments are not BGP content (see netwave-agent's `frr` module docs: segments get their flood entries without EVPN too). Pure.
pub fn bgp_content(config: &NodeConfig) -> Vec<String> {
    config
        .vrfs
        .iter()
        .filter_map(|v| {
            let fields: Vec<&str> = [
                ("vni", v.vni.is_some()),
                ("routeTarget", v.route_target.is_some()),
                ("import", !v.import.is_empty()),
                ("export", !v.export.is_empty()),
                ("aggregate", !v.aggregate.is_empty()),
                ("communities", !v.communities.is_empty()),
                ("sbrPrefixes", v.sbr.is_some()),
            ]
            .into_iter()
            .filter_map(|(name, set)| set.then_some(name))
            .collect();
            (!fields.is_empty()).then(|| format!("VRF {}: {}", v.name, fields.join(", ")))
        })
        .chain(
            config
                .layer2s
                .iter()
                .filter(|l| l.route_target.is_some())
                .map(|l| format!("layer-2 VLAN {}: routeTarget", l.vlan)),
        )
        .chain(
            config
                .bgp_peers
                .iter()
                .map(|p| format!("BGPPeering {}", p.name)),
        )
        .collect()
}

/// The fabric sessions an underlay change must bring up (#47), and within how many seconds of the
/// apply: `None` when the node's underlay does not change (`config.underlay` equals `before`, the one
/// it ran). Otherwise every neighbour of the new effective underlay (the config's, or `bootstrap`'s
/// when it has none), within its hold time and at least 10 s (FRR connects at once, and a session
/// needs a few round trips).
pub fn underlay_sessions(
    config: &NodeConfig,
    before: Option<&netwave_api::UnderlayConfig>,
    bootstrap: &Underlay,
) -> Option<(Vec<String>, u64)> {
    if config.underlay.as_ref() == before {
        return None;
    }
    let (peers, hold): (Vec<String>, Option<u16>) = match &config.underlay {
        Some(u) => (
            (u.neighbors.iter())
                .filter_map(|n| n.address.clone().or_else(|| n.interface.clone()))
                .collect(),
            u.timers.map(|t| t.hold),
        ),
        None => (
            (bootstrap.neighbors().iter())
                .map(|n| n.peer.to_string())
                .collect(),
            bootstrap.timers().map(|t| t.hold),
        ),
    };
    let hold = hold.unwrap_or(underlay::DATACENTER_HOLD);
    Some((peers, u64::from(hold.max(10))))
}

/// Renders a node's FRR configuration.
///
/// Aggregates are `aggregate-address` in the VRF's BGP instance, not blackhole static routes as the
/// reference renders them: a static route would need staticd and would put a route into a kernel
/// table the agent's dataplane model owns (its drift repair would see a foreign route), and BGP
/// originates the aggregate only while a more specific route of it exists in the VRF, so a node
/// with nothing inside the range does not attract traffic just to drop it. No `summary-only`: the
/// more specific routes stay advertised, as with the reference.
///
/// `bootstrap` is the node's own underlay (the agent's `--frr-config`): its VTEP address, router id
/// and host name always; its ASN, neighbours and timers unless the config carries an Underlay input's
/// (`spec.config.underlay`), which then replaces them.
pub fn render(config: &NodeConfig, bootstrap: &Underlay) -> Result<FrrConfig, FrrError> {
    let from_input;
    let underlay = match &config.underlay {
        None => bootstrap,
        Some(u) => {
            let settings =
                UnderlaySettings::of_input(u, bootstrap.vtep(), Some(bootstrap.router_id()));
            let checked = Underlay::new(settings).map_err(|e| FrrError::Underlay {
                underlay: u.name.clone(),
                field: e.field,
                message: e.message,
            })?;
            from_input = checked.with_hostname(bootstrap.hostname().unwrap_or_default());
            &from_input
        }
    };
    check_vnis(config)?;
    let vrfs = checked_vrfs(config)?;
    let vnis = layer2_route_targets(config, underlay.asn())?;
    let vtep = IpNet::V4(Ipv4Net::new(underlay.vtep(), 32).expect("/32 is a valid length"));
    let (mut prefix_lists, mut route_maps) = policies(&vrfs, vtep);
    let mut workload = workload_peers(config, &mut prefix_lists, &mut route_maps)?;
    for vrf in workload.keys().flatten() {
        if !vrfs.iter().any(|v| &v.device == vrf) {
            let who = &workload[&Some(vrf.clone())].0[0].1;
            return Err(peering_error(
                who,
                "vrf",
                format!("VRF {vrf} is not on this node"),
            ));
        }
    }
    let default_peers = workload.remove(&None).unwrap_or_default();
    let bgp = default_instance(&vrfs, underlay, vtep, vnis, &default_peers);
    let vrf_bgp = vrf_instances(&vrfs, &bgp, underlay, &workload);
    Ok(FrrConfig {
        hostname: underlay.hostname().map(str::to_string),
        forwarding: Forwarding::ON,
        vrf_vnis: vrfs
            .iter()
            .filter_map(|v| Some((v.device.clone(), v.vni?)))
            .collect(),
        bgp,
        vrf_bgp,
        prefix_lists,
        route_maps,
    })
}

/// The node's VRFs, checked, by device name: no device twice, at most `MAX_VRFS`.
fn checked_vrfs(config: &NodeConfig) -> Result<Vec<Vrf>, FrrError> {
    let mut vrfs = config
        .vrfs
        .iter()
        .map(check_vrf)
        .collect::<Result<Vec<Vrf>, FrrError>>()?;
    vrfs.sort_by(|a, b| a.device.cmp(&b.device));
    if let Some(w) = vrfs.windows(2).find(|w| w[0].device == w[1].device) {
        return Err(vrf_error(
            &w[0].device,
            "device",
            "two VRFs of this node have this device name",
        ));
    }
    if vrfs.len() > MAX_VRFS {
        return Err(FrrError::TooManyVrfs { count: vrfs.len() });
    }
    Ok(vrfs)
}

type RouteMaps = BTreeMap<String, BTreeMap<u16, RouteMapEntry>>;

/// The prefix lists and route maps: the underlay's (only the VTEP out), and each VRF's import
/// into the default instance and export out of it.
fn policies(vrfs: &[Vrf], vtep: IpNet) -> (BTreeMap<String, PrefixList>, RouteMaps) {
    let mut prefix_lists = BTreeMap::new();
    let mut route_maps: RouteMaps = BTreeMap::new();
    prefix_lists.insert(
        VTEP_PREFIX_LIST.to_string(),
        PrefixList {
            family: Family::V4,
            entries: BTreeMap::from([(
                10,
                PrefixEntry {
                    action: Action::Permit,
                    prefix: vtep,
                    ge: None,
                    le: None,
                },
            )]),
        },
    );
    route_maps.insert(
        UNDERLAY_OUT_ROUTE_MAP.to_string(),
        BTreeMap::from([(
            10,
            entry(Some((Family::V4, VTEP_PREFIX_LIST.to_string())), None),
        )]),
    );

    for (k, vrf) in vrfs.iter().enumerate() {
        for (family, offset) in [(Family::V4, 0u16), (Family::V6, 1)] {
            if let Some(entries) = vrf.import.get(&family) {
                let name = vrf.prefix_list("import", family);
                prefix_lists.insert(
                    name.clone(),
                    PrefixList {
                        family,
                        entries: entries.clone(),
                    },
                );
                // Entries of different VRFs never match the same route (`match source-vrf`), so
                // their order carries no meaning; by device name keeps it deterministic. k < MAX_VRFS.
                let seq = 10 * (k as u16 + 1) + offset;
                route_maps
                    .entry(DEFAULT_IMPORT_ROUTE_MAP.to_string())
                    .or_default()
                    .insert(seq, entry(Some((family, name)), Some(vrf.device.clone())));
            }
            if let Some(entries) = vrf.export.get(&family) {
                let name = vrf.prefix_list("export", family);
                prefix_lists.insert(
                    name.clone(),
                    PrefixList {
                        family,
                        entries: entries.clone(),
                    },
                );
                let mut e = entry(Some((family, name)), None);
                e.set_communities = vrf.communities.clone();
                e.set_large_communities = vrf.large_communities.clone();
                route_maps
                    .entry(vrf.export_route_map())
                    .or_default()
                    .insert(10 * (offset + 1), e);
            }
        }
    }
    (prefix_lists, route_maps)
}

/// The default instance: the underlay's peers, the VTEP, EVPN, and the VRFs it imports from.
fn default_instance(
    vrfs: &[Vrf],
    underlay: &Underlay,
    vtep: IpNet,
    vnis: BTreeMap<u32, BTreeSet<String>>,
    default_peers: &VrfPeers,
) -> BgpInstance {
    let mut neighbors: Vec<(Peer, RemoteAs)> = underlay
        .neighbors()
        .iter()
        .map(|n| (n.peer.clone(), n.remote_as))
        .collect();
    neighbors.sort_by(|a, b| model::cmp_peers(&a.0, &b.0));
    let peers: Vec<Peer> = neighbors.iter().map(|(p, _)| p.clone()).collect();

    let default_family = |family: Family| {
        let importing: Vec<String> = vrfs
            .iter()
            .filter(|v| v.imports(family))
            .map(|v| v.device.clone())
            .collect();
        UnicastFamily {
            networks: match family {
                Family::V4 => BTreeSet::from([vtep]),
                Family::V6 => BTreeSet::new(),
            },
            aggregates: BTreeSet::new(),
            // The default instance needs the main table's routes in BGP only to leak them into VRFs.
            redistribute: if vrfs.iter().any(|v| v.exports(family) || v.sbr.is_some()) {
                BTreeSet::from([Redistribute::Kernel, Redistribute::Connected])
            } else {
                BTreeSet::new()
            },
            neighbors: match family {
                Family::V4 => peers
                    .iter()
                    .map(|p| (p.clone(), Some(UNDERLAY_OUT_ROUTE_MAP.to_string())))
                    .collect(),
                Family::V6 => Vec::new(),
            },
            import_vrf_route_map: (!importing.is_empty())
                .then(|| DEFAULT_IMPORT_ROUTE_MAP.to_string()),
            import_vrfs: importing,
            workload: default_peers.1.get(&family).cloned().unwrap_or_default(),
        }
    };
    BgpInstance {
        asn: underlay.asn(),
        vrf: None,
        router_id: underlay.router_id(),
        no_default_ipv4_unicast: true,
        timers: underlay
            .timers()
            .map(|t| (t.keepalive, t.hold))
            .filter(|&t| t != (underlay::DATACENTER_KEEPALIVE, underlay::DATACENTER_HOLD)),
        neighbors,
        workload_peers: default_peers.0.iter().map(|(p, _)| p.clone()).collect(),
        ipv4: default_family(Family::V4),
        ipv6: default_family(Family::V6),
        evpn: Some(EvpnFamily {
            neighbors: peers,
            advertise_all_vni: true,
            vnis,
            ..EvpnFamily::default()
        }),
    }
}

/// The VRFs' BGP instances, in the order FRR prints them.
fn vrf_instances(
    vrfs: &[Vrf],
    bgp: &BgpInstance,
    underlay: &Underlay,
    workload: &Peers,
) -> Vec<BgpInstance> {
    // FRR prints BGP instances in creation order, and the default instance's `import vrf` lines
    // create the instances they name: first IPv4's, then IPv6's, then the rest as the text goes.
    let mut order: Vec<&Vrf> = Vec::new();
    for name in bgp.ipv4.import_vrfs.iter().chain(&bgp.ipv6.import_vrfs) {
        if let Some(v) = vrfs.iter().find(|v| &v.device == name)
            && !order.iter().any(|o| &o.device == name)
        {
            order.push(v);
        }
    }
    for v in vrfs.iter().filter(|v| v.needs_instance(workload)) {
        if !order.iter().any(|o| o.device == v.device) {
            order.push(v);
        }
    }
    let mut vrf_bgp: Vec<BgpInstance> = order
        .into_iter()
        .map(|v| vrf_instance(v, underlay, workload.get(&Some(v.device.clone()))))
        .collect();
    // Last, so every VRF they import from already exists (an `import vrf` line would create it).
    vrf_bgp.extend(vrfs.iter().filter_map(|v| sbr_instance(v, underlay)));
    vrf_bgp
}

fn vrf_instance(v: &Vrf, underlay: &Underlay, peers: Option<&VrfPeers>) -> BgpInstance {
    let family = |f: Family| UnicastFamily {
        workload: peers.and_then(|p| p.1.get(&f).cloned()).unwrap_or_default(),
        aggregates: v
            .aggregates
            .iter()
            .filter(|a| Family::of(a) == f)
            .copied()
            .collect(),
        redistribute: BTreeSet::from([Redistribute::Kernel, Redistribute::Connected]),
        import_vrf_route_map: v.exports(f).then(|| v.export_route_map()),
        import_vrfs: if v.exports(f) {
            vec![DEFAULT_VRF.to_string()]
        } else {
            Vec::new()
        },
        ..UnicastFamily::default()
    };
    let rts: BTreeSet<String> = v.route_target.iter().map(|rt| rt.to_string()).collect();
    BgpInstance {
        asn: underlay.asn(),
        vrf: Some(v.device.clone()),
        // The VRF's automatic RD is derived from its router id: the same on every VRF of the node.
        router_id: underlay.router_id(),
        // With workload sessions every family is activated explicitly, as in the default instance:
        // what FRR shows then does not depend on its defaults.
        no_default_ipv4_unicast: peers.is_some(),
        timers: None,
        neighbors: Vec::new(),
        workload_peers: peers
            .map(|p| p.0.iter().map(|(w, _)| w.clone()).collect())
            .unwrap_or_default(),
        ipv4: family(Family::V4),
        ipv6: family(Family::V6),
        evpn: v.vni.map(|_| EvpnFamily {
            advertise_ipv4: true,
            advertise_ipv6: true,
            route_targets_import: rts.clone(),
            route_targets_export: rts,
            ..EvpnFamily::default()
        }),
    }
}

/// The reference's SBR VRF `s-<vrf>`: all of the VRF's and the default VRF's routes, unfiltered, so
/// the sources steered into it reach the VRF first and everything else as before.
fn sbr_instance(v: &Vrf, underlay: &Underlay) -> Option<BgpInstance> {
    let device = v.sbr.clone()?;
    let family = || UnicastFamily {
        import_vrfs: vec![v.device.clone(), DEFAULT_VRF.to_string()],
        ..UnicastFamily::default()
    };
    Some(BgpInstance {
        asn: underlay.asn(),
        vrf: Some(device),
        router_id: underlay.router_id(),
        no_default_ipv4_unicast: false,
        timers: None,
        neighbors: Vec::new(),
        workload_peers: Vec::new(),
        ipv4: family(),
        ipv6: family(),
        evpn: None,
    })
}

/// Layer-2 VNIs with a route target other than FRR's automatic one (`ASN:VNI`, the ASN's low 16 bits
/// for a 4-byte ASN), which FRR never shows and so must not be rendered.
fn layer2_route_targets(
    config: &NodeConfig,
    asn: u32,
) -> Result<BTreeMap<u32, BTreeSet<String>>, FrrError> {
    let mut out = BTreeMap::new();
    for l in &config.layer2s {
        let Some(rt) = &l.route_target else { continue };
        let parsed = RouteTarget::parse(rt).map_err(|why| FrrError::Vni {
            vni: l.vni,
            message: format!("layer-2 VLAN {}: routeTarget {rt:?}: {why}", l.vlan),
        })?;
        if parsed == RouteTarget::As2((asn & 0xFFFF) as u16, l.vni) {
            continue;
        }
        out.insert(l.vni, BTreeSet::from([parsed.to_string()]));
    }
    Ok(out)
}

/// One VRF's workload sessions (each with the BGPPeering it comes from) and their per-family lines.
type VrfPeers = (
    Vec<(WorkloadPeer, String)>,
    BTreeMap<Family, Vec<WorkloadFamily>>,
);
/// Workload sessions by VRF device (`None`: the default instance).
type Peers = BTreeMap<Option<String>, VrfPeers>;

/// TTL security of a `loopbackPeer` session (das-schiff-network-operator's multihop of 2: the
/// workload's loopback is one routed hop behind the node).
pub const LOOPBACK_PEER_HOPS: u8 = 2;

/// Name of the peer group of a BGPPeering's listen ranges of one family, and of its route maps and
/// prefix lists (`nw-peer-<name>-v4`, `nw-peer-<name>-in-v4`, `nw-peer-<name>-out-v4`). No VRF's names
/// end like these (theirs end in `-import-v4`, `-export-v4`, `-export`).
pub fn peer_group_name(peering: &str, f: Family) -> String {
    format!("nw-peer-{peering}-{}", f.suffix())
}

fn peer_filter_name(peering: &str, direction: &str, f: Family) -> String {
    format!("nw-peer-{peering}-{direction}-{}", f.suffix())
}

fn peering_error(peering: &str, field: impl Into<String>, message: impl Into<String>) -> FrrError {
    FrrError::Peering {
        peering: peering.to_string(),
        field: field.into(),
        message: message.into(),
    }
}

/// Every BGPPeering of the node as FRR sessions: `listenRanges` become a peer group per family
/// (`bgp listen range`), `addresses` a neighbour each (TTL security [`LOOPBACK_PEER_HOPS`]; IPv4
/// unicast always and IPv6 unicast for an IPv6 address, as the reference activates them). Each family
/// a session runs filters both ways through `nw-peer-<name>-in|out-<v4|v6>`: a permit entry matching
/// the prefix list of the items of that family, or, with none, one deny entry: what is not listed is
/// neither accepted nor sent.
fn workload_peers(
    config: &NodeConfig,
    prefix_lists: &mut BTreeMap<String, PrefixList>,
    route_maps: &mut BTreeMap<String, BTreeMap<u16, RouteMapEntry>>,
) -> Result<Peers, FrrError> {
    let mut out: Peers = BTreeMap::new();
    let mut seen: BTreeMap<(Option<String>, WorkloadId), String> = BTreeMap::new();
    for p in &config.bgp_peers {
        let (sessions, families) = check_peer(p)?;
        let import = prefix_entries(&p.name, "import", &p.import)
            .map_err(|e| as_peering_error(&p.name, e))?;
        let export = prefix_entries(&p.name, "export", &p.export)
            .map_err(|e| as_peering_error(&p.name, e))?;
        let used: BTreeSet<Family> = families.iter().flatten().copied().collect();
        for &f in &used {
            for (direction, entries) in [("in", &import), ("out", &export)] {
                let name = peer_filter_name(&p.name, direction, f);
                let mut e = match entries.get(&f) {
                    Some(list) => {
                        prefix_lists.insert(
                            name.clone(),
                            PrefixList {
                                family: f,
                                entries: list.clone(),
                            },
                        );
                        entry(Some((f, name.clone())), None)
                    }
                    None => entry(None, None),
                };
                if !entries.contains_key(&f) {
                    e.action = Action::Deny;
                }
                route_maps.insert(name, BTreeMap::from([(10, e)]));
            }
        }
        let vrf_peers = out.entry(p.vrf.clone()).or_default();
        for (session, fams) in sessions.into_iter().zip(families) {
            if let Some(first) = seen.insert((p.vrf.clone(), session.id.clone()), p.name.clone()) {
                return Err(peering_error(
                    &p.name,
                    "listenRanges",
                    format!("{} is also BGPPeering {first}'s on this node", session.id),
                ));
            }
            for f in fams {
                vrf_peers.1.entry(f).or_default().push(WorkloadFamily {
                    id: session.id.clone(),
                    maximum_prefix: p.maximum_prefixes,
                    route_map_in: peer_filter_name(&p.name, "in", f),
                    route_map_out: peer_filter_name(&p.name, "out", f),
                });
            }
            vrf_peers.0.push((session, p.name.clone()));
        }
    }
    for (sessions, families) in out.values_mut() {
        sessions.sort_by(|a, b| a.0.id.cmp(&b.0.id));
        for list in families.values_mut() {
            list.sort_by(|a, b| a.id.cmp(&b.id));
        }
        if let Some(w) = sessions.windows(2).find(|w| {
            let ranges = |p: &WorkloadPeer| p.listen_ranges.clone();
            ranges(&w[0].0).iter().any(|a| {
                ranges(&w[1].0)
                    .iter()
                    .any(|b| a.contains(b) || b.contains(a))
            })
        }) {
            return Err(peering_error(
                &w[1].1,
                "listenRanges",
                format!(
                    "overlaps a listen range of BGPPeering {} on this node",
                    w[0].1
                ),
            ));
        }
    }
    Ok(out)
}

/// A node config's peer as FRR sessions, each with the families it runs.
fn check_peer(p: &BgpPeerConfig) -> Result<(Vec<WorkloadPeer>, Vec<Vec<Family>>), FrrError> {
    let name = &p.name;
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-'))
    {
        return Err(peering_error(
            name,
            "name",
            "not a Kubernetes object name FRR can carry in a peer group name ([a-z0-9.-])",
        ));
    }
    if p.remote_asn == 0 {
        return Err(peering_error(name, "remoteASN", "0 is not an AS number"));
    }
    let timers = match (p.keepalive_time, p.hold_time) {
        (None, None) => None,
        (Some(k), Some(h)) => {
            let max = u32::from(u16::MAX);
            if h > max || k > max || (1..3).contains(&h) || (h > 0 && k >= h) || (h == 0 && k != 0)
            {
                return Err(peering_error(
                    name,
                    "holdTime",
                    format!(
                        "keepalive {k} s with hold {h} s: FRR takes a hold time of 0 or 3 to 65535 s and a \
                         keepalive below it"
                    ),
                ));
            }
            Some((k as u16, h as u16))
        }
        _ => {
            return Err(peering_error(
                name,
                "holdTime",
                "holdTime and keepaliveTime are set together",
            ));
        }
    };
    if p.listen_ranges.is_empty() && p.addresses.is_empty() {
        return Err(peering_error(
            name,
            "listenRanges",
            "nothing to peer with: no listen range and no address",
        ));
    }
    let mut sessions = Vec::new();
    let mut families = Vec::new();
    let mut ranges: BTreeMap<Family, Vec<IpNet>> = BTreeMap::new();
    for (i, r) in p.listen_ranges.iter().enumerate() {
        let net: IpNet = r
            .parse()
            .ok()
            .filter(|n: &IpNet| n.trunc() == *n)
            .ok_or_else(|| {
                peering_error(
                    name,
                    format!("listenRanges[{i}]"),
                    format!("{r:?} is not a network"),
                )
            })?;
        ranges.entry(Family::of(&net)).or_default().push(net);
    }
    for (f, mut nets) in ranges {
        nets.sort();
        nets.dedup();
        sessions.push(WorkloadPeer {
            id: WorkloadId::Group(peer_group_name(name, f)),
            remote_asn: p.remote_asn,
            bfd: p.bfd,
            ttl_security_hops: None,
            timers,
            listen_ranges: nets,
        });
        families.push(vec![f]);
    }
    for (i, a) in p.addresses.iter().enumerate() {
        let addr: std::net::IpAddr = a.parse().map_err(|_| {
            peering_error(
                name,
                format!("addresses[{i}]"),
                format!("{a:?} is not an IP address"),
            )
        })?;
        sessions.push(WorkloadPeer {
            id: WorkloadId::Address(addr),
            remote_asn: p.remote_asn,
            bfd: p.bfd,
            ttl_security_hops: Some(LOOPBACK_PEER_HOPS),
            timers,
            listen_ranges: Vec::new(),
        });
        families.push(if addr.is_ipv4() {
            vec![Family::V4]
        } else {
            vec![Family::V4, Family::V6]
        });
    }
    Ok((sessions, families))
}

/// A prefix-list error of [`prefix_entries`] (worded for VRFs) as the peering's.
fn as_peering_error(peering: &str, e: FrrError) -> FrrError {
    match e {
        FrrError::Vrf { field, message, .. } => peering_error(peering, field, message),
        other => other,
    }
}

/// One session a node's BGPPeering promises once applied, as the agent's health gate checks it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeeringSession {
    /// The BGPPeering's name.
    pub peering: String,
    /// FRR's name of the VRF: `default` or the VRF device.
    pub vrf: String,
    /// The peer group (listen ranges: any workload of it) or the address.
    pub session: WorkloadId,
    /// Seconds the session may take to reach Established: its hold time (at most
    /// [`MAX_PEERING_WAIT`]), or the datacenter profile's (9 s) when it has none.
    pub within_seconds: u16,
}

/// The longest an agent waits for a peering session after an apply, whatever its hold time (FRR takes
/// up to 65535 s; a node's verdict must not wait hours).
pub const MAX_PEERING_WAIT: u16 = 600;

/// Every session of `config`'s BGPPeerings, in FRR's order per VRF. Peers FRR cannot render (which
/// [`render`] refuses) are left out. Pure.
pub fn peering_sessions(config: &NodeConfig) -> Vec<PeeringSession> {
    let mut out = Vec::new();
    for p in &config.bgp_peers {
        let Ok((sessions, _)) = check_peer(p) else {
            continue;
        };
        for w in sessions {
            let within = match w.timers {
                Some((_, hold)) if hold > 0 => hold.min(MAX_PEERING_WAIT),
                _ => underlay::DATACENTER_HOLD,
            };
            out.push(PeeringSession {
                peering: p.name.clone(),
                vrf: p.vrf.clone().unwrap_or_else(|| DEFAULT_VRF.to_string()),
                session: w.id,
                within_seconds: within,
            });
        }
    }
    out
}

fn entry(prefix_list: Option<(Family, String)>, source_vrf: Option<String>) -> RouteMapEntry {
    RouteMapEntry {
        action: Action::Permit,
        match_prefix_list: prefix_list,
        match_source_vrf: source_vrf,
        set_communities: Vec::new(),
        set_large_communities: Vec::new(),
    }
}

fn vrf_error(vrf: &str, field: impl Into<String>, message: impl Into<String>) -> FrrError {
    FrrError::Vrf {
        vrf: vrf.to_string(),
        field: field.into(),
        message: message.into(),
    }
}

/// Every L3 and L2 VNI of the node in range and used once.
fn check_vnis(config: &NodeConfig) -> Result<(), FrrError> {
    let mut seen: BTreeMap<u32, String> = BTreeMap::new();
    let vrf_vnis = config
        .vrfs
        .iter()
        .filter_map(|v| Some((v.vni?, format!("VRF {}", v.name))));
    let l2_vnis = config
        .layer2s
        .iter()
        .map(|l| (l.vni, format!("layer-2 VLAN {}", l.vlan)));
    for (vni, owner) in vrf_vnis.chain(l2_vnis) {
        if vni == 0 || vni > MAX_VNI {
            return Err(FrrError::Vni {
                vni,
                message: format!("{owner}: a VNI is 1 to {MAX_VNI}"),
            });
        }
        if let Some(first) = seen.insert(vni, owner.clone()) {
            return Err(FrrError::Vni {
                vni,
                message: format!("used by both {first} and {owner} on this node"),
            });
        }
    }
    Ok(())
}

/// A VRF device name FRR can take; `vrf` and `field` say where it comes from.
fn check_device(name: &str, vrf: &str, field: &str) -> Result<(), FrrError> {
    let name_ok = !name.is_empty()
        && name.len() <= 15
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !name_ok {
        return Err(vrf_error(
            vrf,
            field,
            "not a VRF device name FRR can take (1-15 characters of [a-zA-Z0-9._-])",
        ));
    }
    if name == DEFAULT_VRF {
        return Err(vrf_error(
            vrf,
            field,
            "\"default\" is FRR's name for the default VRF",
        ));
    }
    Ok(())
}

fn check_vrf(v: &VrfConfig) -> Result<Vrf, FrrError> {
    let device = &v.device;
    check_device(device, device, "device")?;
    let route_target = match &v.route_target {
        None => None,
        Some(_) if v.vni.is_none() => {
            return Err(vrf_error(
                device,
                "routeTarget",
                "a route target needs the VRF's VNI: without an L3 VNI the VRF has no EVPN routes to \
                 tag",
            ));
        }
        Some(rt) => Some(
            RouteTarget::parse(rt)
                .map_err(|why| vrf_error(device, "routeTarget", format!("{rt:?}: {why}")))?,
        ),
    };
    let mut aggregates = BTreeSet::new();
    for (i, a) in v.aggregate.iter().enumerate() {
        aggregates.insert(network(device, &format!("aggregate[{i}]"), a)?);
    }
    let mut communities = BTreeSet::new();
    let mut large_communities = BTreeSet::new();
    for (i, c) in v.communities.iter().enumerate() {
        if let Some(l) = LargeCommunity::parse(c) {
            large_communities.insert(l);
        } else if let Some(s) = Community::parse(c) {
            communities.insert(s);
        } else {
            return Err(vrf_error(
                device,
                format!("communities[{i}]"),
                format!(
                    "{c:?} is not a BGP community (<asn>:<value>, <a>:<b>:<c> or a well-known name)"
                ),
            ));
        }
    }
    if let Some(sbr) = &v.sbr {
        check_device(&sbr.device, device, "sbr.device")?;
        if sbr.device == *device {
            return Err(vrf_error(
                device,
                "sbr.device",
                "the SBR VRF must not be the VRF itself",
            ));
        }
    }
    Ok(Vrf {
        device: device.clone(),
        vni: v.vni,
        sbr: v.sbr.as_ref().map(|s| s.device.clone()),
        route_target,
        import: prefix_entries(device, "import", &v.import)?,
        export: prefix_entries(device, "export", &v.export)?,
        aggregates,
        communities: communities.into_iter().collect(),
        large_communities: large_communities.into_iter().collect(),
    })
}

fn network(vrf: &str, field: &str, s: &str) -> Result<IpNet, FrrError> {
    let net: IpNet = s.parse().map_err(|_| {
        vrf_error(
            vrf,
            field,
            format!("{s:?} is not a network in CIDR notation"),
        )
    })?;
    if net.trunc() != net {
        // FRR would silently use the network address: say so instead of announcing something else.
        return Err(vrf_error(
            vrf,
            field,
            format!("{s} has host bits set (want {})", net.trunc()),
        ));
    }
    Ok(net)
}

/// A VRF's import or export items as prefix-list entries per family. Sequence numbers must be unique
/// per family: FRR would silently replace an entry with a later one of the same number.
fn prefix_entries(
    vrf: &str,
    field: &str,
    items: &[PrefixItem],
) -> Result<BTreeMap<Family, BTreeMap<u32, PrefixEntry>>, FrrError> {
    let mut out: BTreeMap<Family, BTreeMap<u32, PrefixEntry>> = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("{field}[{i}]");
        let prefix = network(vrf, &format!("{at}.cidr"), &item.cidr)?;
        let (len, max) = (prefix.prefix_len(), prefix.max_prefix_len());
        for (name, value) in [("ge", item.ge), ("le", item.le)] {
            if let Some(v) = value
                && (v < len || v > max)
            {
                return Err(vrf_error(
                    vrf,
                    format!("{at}.{name}"),
                    format!("{v} is outside {len}..={max} for {prefix}"),
                ));
            }
        }
        if let (Some(ge), Some(le)) = (item.ge, item.le)
            && ge > le
        {
            return Err(vrf_error(
                vrf,
                format!("{at}.ge"),
                format!("ge {ge} is greater than le {le}"),
            ));
        }
        let seq = u32::try_from(item.effective_seq(i))
            .ok()
            .filter(|&s| s > 0)
            .ok_or_else(|| {
                vrf_error(
                    vrf,
                    format!("{at}.seq"),
                    "FRR's sequence numbers are 1 to 4294967295",
                )
            })?;
        let entries = out.entry(Family::of(&prefix)).or_default();
        if entries.contains_key(&seq) {
            return Err(vrf_error(
                vrf,
                format!("{at}.seq"),
                format!("sequence {seq} is used twice in {field}"),
            ));
        }
        entries.insert(
            seq,
            PrefixEntry {
                action: match item.action {
                    PrefixAction::Permit => Action::Permit,
                    PrefixAction::Deny => Action::Deny,
                },
                prefix,
                ge: item.ge,
                le: item.le,
            },
        );
    }
    Ok(out)
}

#[cfg(test)]
mod bgp_content_tests {
    use netwave_api::{PrefixAction, PrefixItem, VrfConfig};

    use super::*;

    #[test]
    fn bgp_content_names_every_bgp_field_and_nothing_else() {
        let mut c = NodeConfig::default();
        c.vrfs.push(VrfConfig::named("plain"));
        c.layer2s
            .push(netwave_api::Layer2Config::segment(10, 1010).with_mtu(1500));
        assert!(
            bgp_content(&c).is_empty(),
            "a kernel-only VRF and a layer-2 segment need no FRR"
        );
        let item = PrefixItem {
            cidr: "198.18.0.0/16".into(),
            action: PrefixAction::Permit,
            ge: None,
            le: None,
            seq: None,
        };
        let mut red = VrfConfig::named("red");
        red.vni = Some(1000);
        red.route_target = Some("65000:1000".into());
        let mut blue = VrfConfig::named("blue");
        blue.import = vec![item.clone()];
        blue.export = vec![item];
        blue.aggregate = vec!["198.18.0.0/16".into()];
        blue.communities = vec!["65000:1".into()];
        c.vrfs.extend([red, blue]);
        assert_eq!(
            bgp_content(&c),
            [
                "VRF red: vni, routeTarget",
                "VRF blue: import, export, aggregate, communities"
            ]
        );
    }
}
