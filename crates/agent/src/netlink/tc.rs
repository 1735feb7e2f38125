//! Traffic control for mirrors: `clsact` qdiscs and flower filters with a `mirred egress mirror`
//! action, built and read with netlink-packet-route's tc types (qdisc kind `clsact` is an ingress-style
//! qdisc the crate has no builder for; the message is three fields, written here).
//!
//! ```text
//!  MirrorFilter { dev, hook, priority, matcher, to } ─► RTM_NEWTFILTER dev parent ffff:fff2|fff3
//!      pref <priority> protocol ip|ipv6  flower [ip_proto, src/dst ip, ports]
//!      action mirred egress mirror dev <to> pipe
//!  RTM_GETTFILTER dump per (managed link with clsact, hook) ─► MirrorFilter (pref ≥ the agent's base)
//! ```

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use netwave_api::validate::{IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP};
use netwave_core::dataplane::{Hook, MIRROR_PRIORITY_BASE, MirrorFilter, MirrorMatch};
use rtnetlink::packet_route::tc::{
    TcAction, TcActionAttribute, TcActionGeneric, TcActionMirrorOption, TcActionOption,
    TcActionType, TcAttribute, TcFilterFlowerOption, TcHandle, TcMessage, TcMirror,
    TcMirrorActionType, TcOption,
};

/// `TC_H_CLSACT`: the parent of a clsact qdisc (same value as `TC_H_INGRESS`).
pub const CLSACT_PARENT: u32 = 0xFFFF_FFF1;
/// A clsact qdisc's handle, `ffff:`.
const CLSACT_HANDLE: u32 = 0xFFFF_0000;
/// Parents of the clsact hooks' filters (`TC_H_MIN_INGRESS`, `TC_H_MIN_EGRESS` under `ffff:`).
pub const INGRESS_PARENT: u32 = 0xFFFF_FFF2;
pub const EGRESS_PARENT: u32 = 0xFFFF_FFF3;

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86DD;

pub fn parent(hook: Hook) -> u32 {
    match hook {
        Hook::Ingress => INGRESS_PARENT,
        Hook::Egress => EGRESS_PARENT,
    }
}

/// `tcm_info` of a filter: priority in the upper half, the protocol in network byte order below.
fn info(priority: u16, ethertype: u16) -> u32 {
    (u32::from(priority) << 16) | u32::from(ethertype.to_be())
}

fn ethertype(m: &MirrorMatch) -> u16 {
    if m.ipv6 { ETH_P_IPV6 } else { ETH_P_IP }
}

/// The clsact qdisc of link `index` (to add or delete).
pub fn clsact(index: u32) -> TcMessage {
    let mut m = TcMessage::with_index(index as i32);
    m.header.parent = TcHandle::from(CLSACT_PARENT);
    m.header.handle = TcHandle::from(CLSACT_HANDLE);
    m.attributes.push(TcAttribute::Kind("clsact".into()));
    m
}

/// Deleting the filter at `f`'s hook and priority on link `dev`.
pub fn filter_del(f: &MirrorFilter, dev: u32) -> TcMessage {
    let mut m = TcMessage::with_index(dev as i32);
    m.header.parent = TcHandle::from(parent(f.hook));
    m.header.info = info(f.priority, ethertype(&f.matcher));
    m
}

fn mirred(to: u32) -> TcAction {
    let mut generic = TcActionGeneric::default();
    // Pipe: the copy goes to the tunnel, the packet itself on its way.
    generic.action = TcActionType::Pipe;
    let mut parms = TcMirror::default();
    parms.generic = generic;
    parms.eaction = TcMirrorActionType::EgressMirror;
    parms.ifindex = to;
    let mut a = TcAction::default();
    a.tab = 1;
    a.attributes = vec![
        TcActionAttribute::Kind("mirred".into()),
        TcActionAttribute::Options(vec![TcActionOption::Mirror(TcActionMirrorOption::Parms(
            parms,
        ))]),
    ];
    a
}

fn mask4(n: u8) -> std::net::Ipv4Addr {
    u32::MAX.checked_shl(32 - u32::from(n)).unwrap_or(0).into()
}

fn mask6(n: u8) -> std::net::Ipv6Addr {
    u128::MAX
        .checked_shl(128 - u32::from(n))
        .unwrap_or(0)
        .into()
}

/// A new flower filter for `f` on link `dev`, copying to link `to`.
pub fn filter_add(f: &MirrorFilter, dev: u32, to: u32) -> TcMessage {
    let mut m = TcMessage::with_index(dev as i32);
    m.header.parent = TcHandle::from(parent(f.hook));
    m.header.info = info(f.priority, ethertype(&f.matcher));
    m.attributes.push(TcAttribute::Kind("flower".into()));
    let mut o = vec![TcFilterFlowerOption::EthType(ethertype(&f.matcher))];
    let k = &f.matcher;
    if let Some(p) = k.protocol {
        o.push(TcFilterFlowerOption::IpProto(p));
    }
    for (net, src) in [(k.src, true), (k.dst, false)] {
        match net {
            Some(IpNet::V4(n)) => {
                let (a, m) = (n.network(), mask4(n.prefix_len()));
                o.extend(if src {
                    [
                        TcFilterFlowerOption::Ipv4Src(a),
                        TcFilterFlowerOption::Ipv4SrcMask(m),
                    ]
                } else {
                    [
                        TcFilterFlowerOption::Ipv4Dst(a),
                        TcFilterFlowerOption::Ipv4DstMask(m),
                    ]
                });
            }
            Some(IpNet::V6(n)) => {
                let (a, m) = (n.network(), mask6(n.prefix_len()));
                o.extend(if src {
                    [
                        TcFilterFlowerOption::Ipv6Src(a),
                        TcFilterFlowerOption::Ipv6SrcMask(m),
                    ]
                } else {
                    [
                        TcFilterFlowerOption::Ipv6Dst(a),
                        TcFilterFlowerOption::Ipv6DstMask(m),
                    ]
                });
            }
            None => {}
        }
    }
    match k.protocol {
        Some(IPPROTO_TCP) => {
            o.extend(k.src_port.map(TcFilterFlowerOption::TcpSrc));
            o.extend(k.dst_port.map(TcFilterFlowerOption::TcpDst));
        }
        Some(IPPROTO_UDP) => {
            o.extend(k.src_port.map(TcFilterFlowerOption::UdpSrc));
            o.extend(k.dst_port.map(TcFilterFlowerOption::UdpDst));
        }
        Some(IPPROTO_SCTP) => {
            o.extend(k.src_port.map(TcFilterFlowerOption::SctpSrc));
            o.extend(k.dst_port.map(TcFilterFlowerOption::SctpDst));
        }
        _ => {}
    }
    o.push(TcFilterFlowerOption::Actions(vec![mirred(to)]));
    m.attributes.push(TcAttribute::Options(
        o.into_iter().map(TcOption::Flower).collect(),
    ));
    m
}

fn prefix(addr: IpAddr, mask: Option<IpAddr>) -> Option<IpNet> {
    let len = match mask? {
        IpAddr::V4(m) => u32::from(m).leading_ones(),
        IpAddr::V6(m) => u128::from(m).leading_ones(),
    };
    IpNet::new(addr, u8::try_from(len).ok()?).ok()
}

/// The agent's mirror filter in a dumped filter message of `dev`'s `hook`, when it is one: a flower
/// filter at a priority of the agent's range whose action mirrors to a link (named via `names`).
/// Anything else there is not the agent's and is left alone.
pub fn parse_filter(
    dev: &str,
    hook: Hook,
    msg: &TcMessage,
    names: &BTreeMap<u32, String>,
) -> Option<MirrorFilter> {
    let priority = (msg.header.info >> 16) as u16;
    if priority < MIRROR_PRIORITY_BASE {
        return None;
    }
    let mut flower = false;
    let mut opts: Vec<&TcFilterFlowerOption> = Vec::new();
    for a in &msg.attributes {
        match a {
            TcAttribute::Kind(k) => flower = k == "flower",
            TcAttribute::Options(o) => opts.extend(o.iter().filter_map(|x| match x {
                TcOption::Flower(f) => Some(f),
                _ => None,
            })),
            _ => {}
        }
    }
    if !flower || opts.is_empty() {
        return None;
    }
    let mut m = MirrorMatch {
        ipv6: false,
        protocol: None,
        src: None,
        dst: None,
        src_port: None,
        dst_port: None,
    };
    let (mut src, mut src_mask, mut dst, mut dst_mask) = (None, None, None, None);
    let mut to = None;
    let mut eth = None;
    for o in opts {
        use TcFilterFlowerOption as F;
        match o {
            F::EthType(t) => eth = Some(*t),
            F::IpProto(p) => m.protocol = Some(*p),
            F::Ipv4Src(a) => src = Some(IpAddr::V4(*a)),
            F::Ipv4SrcMask(a) => src_mask = Some(IpAddr::V4(*a)),
            F::Ipv4Dst(a) => dst = Some(IpAddr::V4(*a)),
            F::Ipv4DstMask(a) => dst_mask = Some(IpAddr::V4(*a)),
            F::Ipv6Src(a) => src = Some(IpAddr::V6(*a)),
            F::Ipv6SrcMask(a) => src_mask = Some(IpAddr::V6(*a)),
            F::Ipv6Dst(a) => dst = Some(IpAddr::V6(*a)),
            F::Ipv6DstMask(a) => dst_mask = Some(IpAddr::V6(*a)),
            F::TcpSrc(p) | F::UdpSrc(p) | F::SctpSrc(p) => m.src_port = Some(*p),
            F::TcpDst(p) | F::UdpDst(p) | F::SctpDst(p) => m.dst_port = Some(*p),
            F::Actions(actions) => {
                for a in actions {
                    for attr in &a.attributes {
                        if let TcActionAttribute::Options(opts) = attr {
                            for x in opts {
                                if let TcActionOption::Mirror(TcActionMirrorOption::Parms(p)) = x
                                    && p.eaction == TcMirrorActionType::EgressMirror
                                {
                                    to = names.get(&p.ifindex).cloned();
                                }
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
    m.ipv6 = match eth? {
        ETH_P_IP => false,
        ETH_P_IPV6 => true,
        _ => return None,
    };
    m.src = src.and_then(|a| prefix(a, src_mask));
    m.dst = dst.and_then(|a| prefix(a, dst_mask));
    Some(MirrorFilter {
        dev: dev.to_string(),
        hook,
        matcher: m,
        // A mirror to a device that is gone (the kernel zeroes it) is still the agent's to remove.
        to: to.unwrap_or_default(),
        priority,
    })
}
