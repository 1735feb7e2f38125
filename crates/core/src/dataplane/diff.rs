//! `diff(desired, observed) -> Vec<NetOp>`: the ordered kernel operations that turn what the kernel has into
//! what the config wants. Pure and deterministic; the netlink shell executes the list without making any
//! choice of its own.
//!
//! Order (each stage only depends on earlier ones, so the ops inside one stage may run concurrently):
//!
//! ```text
//!  del mirror filters, del clsact qdiscs, del rules → del routes → del addresses → del ports
//!  → del bridges and tunnels → del VRFs → add links → add tunnels (their VRF exists) → set VRFs → set bridges and tunnels (enslave
//!  to VRF) → set ports (enslave to bridge) → bridge-port flags → add addresses → add/replace routes
//!  → add rules → add clsact qdiscs → add mirror filters
//! ```
//!
//! Mirror filters are compared by what they do (device, hook, match, tunnel), not by the priority
//! they sit at: a filter that stays keeps its slot, a new one takes its desired slot or the next free
//! one, so adding or removing one selector never rewrites another's filters.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use ipnet::IpNet;

use super::{
    Dataplane, Hook, Link, LinkKind, MIRROR_PRIORITY_BASE, Mac, MirrorFilter, Route, RouteAction,
    RouteKey, Rule,
};

/// What the kernel has: the managed objects plus the names of every link the agent does not own (so a
/// desired device can never take over a foreign one).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    pub managed: Dataplane,
    pub foreign_links: BTreeSet<String>,
}

/// Attribute changes on an existing (or just created) link. `None` fields stay as they are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkChange {
    /// Write the ownership alias (only right after the agent created the link).
    pub mark: bool,
    pub mtu: Option<u32>,
    pub mac: Option<Mac>,
    /// `Some(None)`: release from its master.
    pub master: Option<Option<String>>,
    pub up: Option<bool>,
}

/// One kernel write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NetOp {
    DelRule(Rule),
    DelRoute(Route),
    DelAddr {
        dev: String,
        addr: IpNet,
    },
    DelLink {
        name: String,
        kind: LinkKind,
    },
    AddLink {
        name: String,
        kind: LinkKind,
        mtu: Option<u32>,
        mac: Option<Mac>,
    },
    SetLink {
        name: String,
        /// [`LinkKind::rank`] of the link: masters are set up before their ports.
        rank: u8,
        change: LinkChange,
    },
    SetNeighSuppress {
        name: String,
        on: bool,
    },
    AddAddr {
        dev: String,
        addr: IpNet,
    },
    AddRoute(Route),
    ReplaceRoute(Route),
    AddRule(Rule),
    /// Remove a mirror filter (by device, hook and priority).
    DelFilter(MirrorFilter),
    /// Remove a link's `clsact` qdisc, and the filters on it.
    DelQdisc {
        dev: String,
    },
    AddQdisc {
        dev: String,
    },
    AddFilter(MirrorFilter),
}

impl NetOp {
    /// Stage in the order above. Ops of one stage are independent of each other.
    pub fn stage(&self) -> u8 {
        match self {
            NetOp::DelRule(_) | NetOp::DelFilter(_) | NetOp::DelQdisc { .. } => 0,
            NetOp::DelRoute(_) => 1,
            NetOp::DelAddr { .. } => 2,
            NetOp::DelLink { kind, .. } => 5 - kind.rank(),
            NetOp::AddLink { kind, .. } => 6 + u8::from(kind.needs_device()),
            NetOp::SetLink { rank, .. } => 8 + rank,
            NetOp::SetNeighSuppress { .. } => 11,
            NetOp::AddAddr { .. } => 12,
            NetOp::AddRoute(_) | NetOp::ReplaceRoute(_) => 13,
            NetOp::AddRule(_) => 14,
            NetOp::AddQdisc { .. } => 15,
            NetOp::AddFilter(_) => 16,
        }
    }
}

/// `ip`-like rendering, used in logs, Events and golden tests.
impl fmt::Display for NetOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NetOp::DelRule(r) => write!(f, "rule del {r}"),
            NetOp::DelRoute(r) => write!(f, "route del {r}"),
            NetOp::DelAddr { dev, addr } => write!(f, "addr del {addr} dev {dev}"),
            NetOp::DelLink { name, .. } => write!(f, "link del {name}"),
            NetOp::AddLink {
                name,
                kind,
                mtu,
                mac,
            } => {
                write!(f, "link add {name}")?;
                if let Some(m) = mtu {
                    write!(f, " mtu {m}")?;
                }
                if let Some(m) = mac {
                    write!(f, " address {m}")?;
                }
                write!(f, " type {kind}")
            }
            NetOp::SetLink { name, change, .. } => {
                write!(f, "link set {name}")?;
                if change.mark {
                    write!(f, " alias {}", super::MANAGED_ALIAS)?;
                }
                if let Some(m) = change.mtu {
                    write!(f, " mtu {m}")?;
                }
                if let Some(m) = change.mac {
                    write!(f, " address {m}")?;
                }
                match &change.master {
                    Some(Some(m)) => write!(f, " master {m}")?,
                    Some(None) => write!(f, " nomaster")?,
                    None => {}
                }
                match change.up {
                    Some(true) => write!(f, " up")?,
                    Some(false) => write!(f, " down")?,
                    None => {}
                }
                Ok(())
            }
            NetOp::SetNeighSuppress { name, on } => write!(
                f,
                "link set {name} type bridge_slave neigh_suppress {}",
                if *on { "on" } else { "off" }
            ),
            NetOp::AddAddr { dev, addr } => write!(f, "addr add {addr} dev {dev}"),
            NetOp::AddRoute(r) => write!(f, "route add {r}"),
            NetOp::ReplaceRoute(r) => write!(f, "route replace {r}"),
            NetOp::AddRule(r) => write!(f, "rule add {r}"),
            NetOp::DelFilter(m) => write!(f, "filter del {m}"),
            NetOp::DelQdisc { dev } => write!(f, "qdisc del dev {dev} clsact"),
            NetOp::AddQdisc { dev } => write!(f, "qdisc add dev {dev} clsact"),
            NetOp::AddFilter(m) => write!(f, "filter add {m}"),
        }
    }
}

/// The desired config cannot be applied without touching something the agent does not own.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DiffError {
    #[error("device {name} already exists and is not managed by netwave; refusing to take it over")]
    ForeignLink { name: String },
}

fn route(key: &RouteKey, action: &RouteAction) -> Route {
    Route {
        key: key.clone(),
        action: action.clone(),
    }
}

/// Whether the kernel's route does what the wanted one asks. A gateway route without `dev` is reported by
/// the kernel with the device it resolved to; that device is the kernel's choice, not drift.
fn route_matches(want: &RouteAction, have: &RouteAction) -> bool {
    match (want, have) {
        (RouteAction::Unicast { via: wv, dev: None }, RouteAction::Unicast { via: hv, .. })
            if wv.is_some() =>
        {
            wv == hv
        }
        _ => want == have,
    }
}

/// Operations that make `observed` equal `desired` (for the managed objects). Empty when nothing differs:
/// re-applying the same config writes nothing.
pub fn diff(desired: &Dataplane, observed: &Observed) -> Result<Vec<NetOp>, DiffError> {
    let actual = &observed.managed;
    if let Some(name) = desired
        .links
        .keys()
        .find(|n| observed.foreign_links.contains(*n))
    {
        return Err(DiffError::ForeignLink { name: name.clone() });
    }
    let plan = LinkPlan::new(desired, actual);
    let mut ops = Vec::new();
    let mirrors = plan.mirrors(desired, actual);
    ops.extend(mirrors.removals);
    plan.removals(desired, actual, &mut ops);
    for l in &plan.created {
        ops.push(NetOp::AddLink {
            name: l.name.clone(),
            kind: l.kind.clone(),
            mtu: l.mtu,
            mac: l.mac,
        });
    }
    plan.link_changes(desired, actual, &mut ops);
    plan.additions(desired, actual, &mut ops);
    ops.extend(mirrors.additions);
    debug_assert!(ops.windows(2).all(|w| w[0].stage() <= w[1].stage()));
    Ok(ops)
}

/// Links that go away entirely or must be recreated (a kind parameter such as the VNI changed),
/// and the links to create, masters first.
struct LinkPlan<'a> {
    removed: BTreeMap<&'a str, &'a Link>,
    created: Vec<&'a Link>,
}

impl<'a> LinkPlan<'a> {
    fn new(desired: &'a Dataplane, actual: &'a Dataplane) -> Self {
        let mut removed: BTreeMap<&str, &Link> = BTreeMap::new();
        let mut created: Vec<&Link> = Vec::new();
        for (name, have) in &actual.links {
            match desired.links.get(name) {
                None => {
                    removed.insert(name, have);
                }
                Some(want) if want.kind != have.kind => {
                    removed.insert(name, have);
                    created.push(want);
                }
                Some(_) => {}
            }
        }
        created.extend(
            desired
                .links
                .values()
                .filter(|l| !actual.links.contains_key(&l.name)),
        );
        // Masters first; a link created on top of another managed device (a tunnel's VRF) after
        // every other, in a stage of its own, once the shell knows the new devices' indexes.
        created.sort_by(|a, b| {
            (a.kind.needs_device(), a.kind.rank(), &a.name).cmp(&(
                b.kind.needs_device(),
                b.kind.rank(),
                &b.name,
            ))
        });
        LinkPlan { removed, created }
    }

    /// Rules, routes and addresses that go, then the removed links, ports before masters.
    fn removals(&self, desired: &Dataplane, actual: &Dataplane, ops: &mut Vec<NetOp>) {
        for r in actual.rules.difference(&desired.rules) {
            ops.push(NetOp::DelRule(r.clone()));
        }
        // Routes through a removed link vanish with it; deleting them first is harmless and keeps the list
        // independent of that kernel behaviour.
        for (key, action) in &actual.routes {
            if !desired.routes.contains_key(key) {
                ops.push(NetOp::DelRoute(route(key, action)));
            }
        }
        for (name, have) in &actual.links {
            if self.removed.contains_key(name.as_str()) {
                continue;
            }
            let want = &desired.links[name];
            for addr in have.addresses.difference(&want.addresses) {
                ops.push(NetOp::DelAddr {
                    dev: name.clone(),
                    addr: *addr,
                });
            }
        }
        let mut dels: Vec<&Link> = self.removed.values().copied().collect();
        dels.sort_by(|a, b| (b.kind.rank(), &a.name).cmp(&(a.kind.rank(), &b.name)));
        for l in dels {
            ops.push(NetOp::DelLink {
                name: l.name.clone(),
                kind: l.kind.clone(),
            });
        }
    }

    /// A link's master changes, or its master is recreated (which releases every port of the old one).
    fn master_lost(&self, want: &Link, have: &Link) -> bool {
        want.master != have.master
            || want
                .master
                .as_deref()
                .is_some_and(|m| self.removed.contains_key(m))
    }

    /// Attribute changes, masters before ports; then the bridge-port flags, then the addresses.
    fn link_changes(&self, desired: &Dataplane, actual: &Dataplane, ops: &mut Vec<NetOp>) {
        let fresh: BTreeSet<&str> = self.created.iter().map(|l| l.name.as_str()).collect();
        let mut order: Vec<&Link> = desired.links.values().collect();
        order.sort_by(|a, b| (a.kind.rank(), &a.name).cmp(&(b.kind.rank(), &b.name)));
        let mut port_flags = Vec::new();
        let mut addrs = Vec::new();
        for want in order {
            let is_new = fresh.contains(want.name.as_str());
            let have = (!is_new).then(|| &actual.links[&want.name]);
            let change = match have {
                None => LinkChange {
                    mark: true,
                    master: want.master.as_ref().map(|m| Some(m.clone())),
                    up: want.up.then_some(true),
                    ..LinkChange::default()
                },
                Some(have) => LinkChange {
                    mark: false,
                    mtu: want.mtu.filter(|m| have.mtu != Some(*m)),
                    mac: want.mac.filter(|m| have.mac != Some(*m)),
                    master: self.master_lost(want, have).then(|| want.master.clone()),
                    up: (want.up != have.up).then_some(want.up),
                },
            };
            if change != LinkChange::default() {
                ops.push(NetOp::SetLink {
                    name: want.name.clone(),
                    rank: want.kind.rank(),
                    change,
                });
            }
            port_flags.extend(self.neigh_suppress(desired, want, have));
            let have_addrs = have.map(|h| &h.addresses);
            for addr in &want.addresses {
                if !have_addrs.is_some_and(|h| h.contains(addr)) {
                    addrs.push(NetOp::AddAddr {
                        dev: want.name.clone(),
                        addr: *addr,
                    });
                }
            }
        }
        ops.extend(port_flags);
        ops.extend(addrs);
    }

    /// The flag lives on the bridge port, so it is (re)applied whenever the link is (re)enslaved.
    fn neigh_suppress(
        &self,
        desired: &Dataplane,
        want: &Link,
        have: Option<&Link>,
    ) -> Option<NetOp> {
        let master_is_bridge = want
            .master
            .as_ref()
            .and_then(|m| desired.links.get(m))
            .is_some_and(|m| m.kind == LinkKind::Bridge);
        if !master_is_bridge {
            return None;
        }
        let reenslaved = have.is_none_or(|h| self.master_lost(want, h));
        let current = if reenslaved {
            false
        } else {
            have.is_some_and(|h| h.neigh_suppress)
        };
        (want.neigh_suppress != current).then(|| NetOp::SetNeighSuppress {
            name: want.name.clone(),
            on: want.neigh_suppress,
        })
    }

    /// The qdisc and filter operations: removals (run first) and additions (run last, once the
    /// devices and tunnels are up).
    fn mirrors(&self, desired: &Dataplane, actual: &Dataplane) -> MirrorOps {
        let mut out = MirrorOps::default();
        let gone = |name: &str| self.removed.contains_key(name);
        // Qdiscs: a link that goes or is recreated takes its qdisc and filters with it.
        let mut qdisc_dropped: BTreeSet<&str> = BTreeSet::new();
        for (name, have) in &actual.links {
            if gone(name) || !have.clsact {
                continue;
            }
            if !desired.links.get(name).is_some_and(|w| w.clsact) {
                qdisc_dropped.insert(name);
                out.removals.push(NetOp::DelQdisc { dev: name.clone() });
            }
        }
        for want in desired.links.values().filter(|l| l.clsact) {
            let has = actual
                .links
                .get(&want.name)
                .is_some_and(|h| h.clsact && !gone(&want.name));
            if !has {
                out.additions.push(NetOp::AddQdisc {
                    dev: want.name.clone(),
                });
            }
        }
        // Filters: keep what still does what is wanted (its tunnel not recreated), drop the rest.
        let wanted: BTreeSet<_> = desired.mirrors.iter().map(MirrorFilter::identity).collect();
        let mut kept: BTreeMap<(&str, Hook), BTreeSet<u16>> = BTreeMap::new();
        let mut kept_ids = BTreeSet::new();
        for f in &actual.mirrors {
            if gone(&f.dev) || qdisc_dropped.contains(f.dev.as_str()) {
                continue;
            }
            if wanted.contains(&f.identity()) && !gone(&f.to) && kept_ids.insert(f.identity()) {
                kept.entry((&f.dev, f.hook)).or_default().insert(f.priority);
            } else {
                out.removals.push(NetOp::DelFilter(f.clone()));
            }
        }
        for f in &desired.mirrors {
            if kept_ids.contains(&f.identity()) {
                continue;
            }
            let used = kept.entry((&f.dev, f.hook)).or_default();
            let mut priority = f.priority;
            if used.contains(&priority) {
                priority = (MIRROR_PRIORITY_BASE..=u16::MAX)
                    .find(|p| !used.contains(p))
                    .unwrap_or(f.priority);
            }
            used.insert(priority);
            out.additions.push(NetOp::AddFilter(MirrorFilter {
                priority,
                ..f.clone()
            }));
        }
        out
    }

    /// Routes and rules to add or replace.
    fn additions(&self, desired: &Dataplane, actual: &Dataplane, ops: &mut Vec<NetOp>) {
        for (key, action) in &desired.routes {
            // A route through a recreated device was removed by the kernel with the old device.
            let through_new = matches!(action, RouteAction::Unicast { dev: Some(d), .. } if self.removed.contains_key(d.as_str()));
            match actual.routes.get(key) {
                None => ops.push(NetOp::AddRoute(route(key, action))),
                Some(_) if through_new => ops.push(NetOp::AddRoute(route(key, action))),
                Some(have) if !route_matches(action, have) => {
                    ops.push(NetOp::ReplaceRoute(route(key, action)))
                }
                Some(_) => {}
            }
        }
        for r in desired.rules.difference(&actual.rules) {
            ops.push(NetOp::AddRule(r.clone()));
        }
    }
}

#[derive(Default)]
struct MirrorOps {
    removals: Vec<NetOp>,
    additions: Vec<NetOp>,
}
