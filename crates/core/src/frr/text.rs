//! [`FrrConfig`] → FRR text, byte for byte what FRR 8.4's `show running-config` prints for it after
//! the header (`Building configuration...`, `frr version`, `service integrated-vtysh-config`): one
//! space of indentation per level, `!` between blocks, `exit`/`exit-vrf`/`exit-address-family`.
//! The golden tests load every rendered file into a real bgpd/zebra and compare.

use std::fmt::Write as _;

use super::model::{
    BgpInstance, EvpnFamily, Family, FrrConfig, PrefixList, Redistribute, RouteMapEntry,
    UnicastFamily, WorkloadFamily, WorkloadId, WorkloadPeer,
};

/// The profile the daemons must run with (`-F datacenter`): it decides which values FRR leaves out
/// of its running config as defaults (timers 3/9, no eBGP policy requirement), so a daemon on another
/// profile would show a permanent diff.
pub const PROFILE: &str = "datacenter";

impl FrrConfig {
    /// The canonical text: what a node's `/etc/frr/frr.conf` holds and `frr-reload.py` applies.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        // `writeln!` into a String cannot fail.
        let o = &mut out;
        let _ = writeln!(o, "frr defaults {PROFILE}");
        if let Some(h) = &self.hostname {
            let _ = writeln!(o, "hostname {h}");
        }
        if !self.forwarding.ipv4 {
            o.push_str("no ip forwarding\n");
        }
        if !self.forwarding.ipv6 {
            o.push_str("no ipv6 forwarding\n");
        }
        o.push_str("!\n");
        for (vrf, vni) in &self.vrf_vnis {
            let _ = writeln!(o, "vrf {vrf}\n vni {vni}\nexit-vrf\n!");
        }
        bgp_instance(o, &self.bgp);
        for instance in &self.vrf_bgp {
            bgp_instance(o, instance);
        }
        for family in [Family::V4, Family::V6] {
            let lists: Vec<(&String, &PrefixList)> = self
                .prefix_lists
                .iter()
                .filter(|(_, l)| l.family == family)
                .collect();
            if lists.is_empty() {
                continue;
            }
            for (name, list) in lists {
                for (seq, e) in &list.entries {
                    let _ = write!(
                        o,
                        "{} prefix-list {name} seq {seq} {} {}",
                        family.keyword(),
                        e.action,
                        e.prefix
                    );
                    if let Some(ge) = e.ge {
                        let _ = write!(o, " ge {ge}");
                    }
                    if let Some(le) = e.le {
                        let _ = write!(o, " le {le}");
                    }
                    o.push('\n');
                }
            }
            o.push_str("!\n");
        }
        for (name, entries) in &self.route_maps {
            for (seq, e) in entries {
                route_map_entry(o, name, *seq, e);
            }
        }
        o.push_str("end\n");
        out
    }
}

fn bgp_instance(o: &mut String, b: &BgpInstance) {
    let _ = write!(o, "router bgp {}", b.asn);
    if let Some(vrf) = &b.vrf {
        let _ = write!(o, " vrf {vrf}");
    }
    let _ = writeln!(o, "\n bgp router-id {}", b.router_id);
    if b.no_default_ipv4_unicast {
        o.push_str(" no bgp default ipv4-unicast\n");
    }
    if let Some((keepalive, hold)) = b.timers {
        let _ = writeln!(o, " timers bgp {keepalive} {hold}");
    }
    // FRR writes peer groups first, then every neighbour (interfaces, then addresses), then the
    // listen ranges.
    let groups = b
        .workload_peers
        .iter()
        .filter(|w| matches!(w.id, WorkloadId::Group(_)));
    for w in groups.clone() {
        let _ = writeln!(o, " neighbor {} peer-group", w.id);
        workload_peer(o, w);
    }
    let mut addresses = b
        .workload_peers
        .iter()
        .filter_map(|w| match w.id {
            WorkloadId::Address(a) => Some((a, w)),
            WorkloadId::Group(_) => None,
        })
        .peekable();
    for (peer, remote_as) in &b.neighbors {
        if let super::Peer::Address(at) = peer {
            while let Some((_, w)) = addresses.next_if(|(a, _)| *a < std::net::IpAddr::V4(*at)) {
                workload_peer(o, w);
            }
        }
        let kind = match peer {
            super::Peer::Interface(_) => " interface",
            super::Peer::Address(_) => "",
        };
        let _ = writeln!(o, " neighbor {peer}{kind} remote-as {remote_as}");
    }
    for (_, w) in addresses {
        workload_peer(o, w);
    }
    for w in groups {
        for r in &w.listen_ranges {
            let _ = writeln!(o, " bgp listen range {r} peer-group {}", w.id);
        }
    }
    unicast(o, "ipv4", &b.ipv4);
    unicast(o, "ipv6", &b.ipv6);
    if let Some(evpn) = &b.evpn {
        l2vpn_evpn(o, evpn);
    }
    o.push_str("exit\n!\n");
}

/// A workload session's own lines (a group's `peer-group` line comes before).
fn workload_peer(o: &mut String, w: &WorkloadPeer) {
    let id = &w.id;
    let _ = writeln!(o, " neighbor {id} remote-as {}", w.remote_asn);
    if w.bfd {
        let _ = writeln!(o, " neighbor {id} bfd");
    }
    if let Some(hops) = w.ttl_security_hops {
        let _ = writeln!(o, " neighbor {id} ttl-security hops {hops}");
    }
    if let Some((keepalive, hold)) = w.timers {
        let _ = writeln!(o, " neighbor {id} timers {keepalive} {hold}");
    }
}

fn workload_family(o: &mut String, w: &WorkloadFamily) {
    let id = &w.id;
    let _ = writeln!(o, "  neighbor {id} activate");
    if let Some(n) = w.maximum_prefix {
        let _ = writeln!(o, "  neighbor {id} maximum-prefix {n}");
    }
    let _ = writeln!(o, "  neighbor {id} route-map {} in", w.route_map_in);
    let _ = writeln!(o, "  neighbor {id} route-map {} out", w.route_map_out);
}

fn unicast(o: &mut String, afi: &str, f: &UnicastFamily) {
    if f.is_empty() {
        return;
    }
    let _ = writeln!(o, " !\n address-family {afi} unicast");
    for n in &f.networks {
        let _ = writeln!(o, "  network {n}");
    }
    for a in &f.aggregates {
        let _ = writeln!(o, "  aggregate-address {a}");
    }
    for r in &f.redistribute {
        let _ = writeln!(
            o,
            "  redistribute {}",
            match r {
                Redistribute::Kernel => "kernel",
                Redistribute::Connected => "connected",
            }
        );
    }
    // Groups first, then neighbours in the instance's order (workload addresses among them).
    let mut workload = f.workload.iter().peekable();
    while let Some(w) = workload.next_if(|w| matches!(w.id, WorkloadId::Group(_))) {
        workload_family(o, w);
    }
    for (peer, route_map_out) in &f.neighbors {
        if let super::Peer::Address(at) = peer {
            while let Some(w) = workload.next_if(
                |w| matches!(w.id, WorkloadId::Address(a) if a < std::net::IpAddr::V4(*at)),
            ) {
                workload_family(o, w);
            }
        }
        let _ = writeln!(o, "  neighbor {peer} activate");
        if let Some(rm) = route_map_out {
            let _ = writeln!(o, "  neighbor {peer} route-map {rm} out");
        }
    }
    for w in workload {
        workload_family(o, w);
    }
    if let Some(rm) = &f.import_vrf_route_map {
        let _ = writeln!(o, "  import vrf route-map {rm}");
    }
    for vrf in &f.import_vrfs {
        let _ = writeln!(o, "  import vrf {vrf}");
    }
    o.push_str(" exit-address-family\n");
}

fn l2vpn_evpn(o: &mut String, e: &EvpnFamily) {
    o.push_str(" !\n address-family l2vpn evpn\n");
    for peer in &e.neighbors {
        let _ = writeln!(o, "  neighbor {peer} activate");
    }
    // `vni N` blocks would go right after this line: before it, FRR drops them silently.
    if e.advertise_all_vni {
        o.push_str("  advertise-all-vni\n");
    }
    // FRR prints `vni` blocks in its hash table's order, not sorted; frr-reload.py compares them as a
    // set, so sorted text still converges (a byte-for-byte comparison needs one block at most).
    for (vni, rts) in &e.vnis {
        let _ = writeln!(o, "  vni {vni}");
        for rt in rts {
            let _ = writeln!(o, "   route-target import {rt}");
        }
        for rt in rts {
            let _ = writeln!(o, "   route-target export {rt}");
        }
        o.push_str("  exit-vni\n");
    }
    if e.advertise_ipv4 {
        o.push_str("  advertise ipv4 unicast\n");
    }
    if e.advertise_ipv6 {
        o.push_str("  advertise ipv6 unicast\n");
    }
    for rt in &e.route_targets_import {
        let _ = writeln!(o, "  route-target import {rt}");
    }
    for rt in &e.route_targets_export {
        let _ = writeln!(o, "  route-target export {rt}");
    }
    o.push_str(" exit-address-family\n");
}

fn route_map_entry(o: &mut String, name: &str, seq: u16, e: &RouteMapEntry) {
    let _ = writeln!(o, "route-map {name} {} {seq}", e.action);
    if let Some((family, list)) = &e.match_prefix_list {
        let _ = writeln!(o, " match {} address prefix-list {list}", family.keyword());
    }
    if let Some(vrf) = &e.match_source_vrf {
        let _ = writeln!(o, " match source-vrf {vrf}");
    }
    if !e.set_communities.is_empty() {
        o.push_str(" set community");
        for c in &e.set_communities {
            let _ = write!(o, " {c}");
        }
        o.push_str(" additive\n");
    }
    if !e.set_large_communities.is_empty() {
        o.push_str(" set large-community");
        for c in &e.set_large_communities {
            let _ = write!(o, " {c}");
        }
        o.push_str(" additive\n");
    }
    o.push_str("exit\n!\n");
}
