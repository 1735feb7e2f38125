//! The netlink shell: observes the managed kernel objects into the [`netwave_core::dataplane`] and executes
//! [`NetOp`] lists. It makes no decisions of its own — the list comes from [`netwave_core::dataplane::diff`].
//!
//! Writes within one stage of the list are independent, so they are pipelined (up to [`IN_FLIGHT`]
//! requests outstanding on the socket): one request at a time is about 2× slower than `ip -batch`.
//! Every write is counted ([`Netlink::writes`]) so tests and metrics can prove a no-op reconcile writes
//! nothing.
//!
//! Kernel pitfalls handled here:
//! - a rule added without an action breaks every lookup with EINVAL: rules always carry `ToTable`;
//! - a route prefix with host bits set is rejected with EINVAL: the model masks prefixes;
//! - IPv6 routes get metric 1024 when none is given: the model normalizes IPv6 metric 0 to 1024;
//! - a missing kernel feature answers EOPNOTSUPP (errno 95): [`Netlink::capabilities`] probes with
//!   throwaway links and reads exactly that;
//! - a GRE tunnel enslaved to a VRF still routes its outer packets in the main table unless its
//!   underlay device (`IFLA_GRE_LINK`) is the VRF: the model names it, and a tunnel whose VRF was
//!   recreated (a stale ifindex) reads as another kind and is recreated with it;
//! - mirror filters live in a `clsact` qdisc (see [`tc`]); deleting the qdisc deletes its filters, and
//!   deleting a link deletes its qdisc.
//!
//! What it reads does not grow with what it does not own (#49): an edge node may hold a million BGP
//! routes in its tables. The socket asks for strict checking of dump requests (`NETLINK_GET_STRICT_CHK`,
//! as iproute2 does), so a route dump names the agent's protocol and the kernel sends only those
//! routes; every dump is parsed one message at a time as it arrives, never collected whole. On a kernel
//! without strict checking (before 4.20) the same dump returns every route and the agent drops the
//! foreign ones as they arrive.

mod tc;

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::{StreamExt, stream};
use ipnet::IpNet;
use rtnetlink::Handle;
use rtnetlink::packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST, NetlinkMessage,
    NetlinkPayload,
};
use rtnetlink::packet_route::address::{AddressAttribute, AddressMessage};
use rtnetlink::packet_route::link::{
    GreIOFlags, InfoBridge, InfoBridgePort, InfoData, InfoGre, InfoGre6, InfoKind, InfoPortData,
    InfoPortKind, InfoVlan, InfoVrf, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use rtnetlink::packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use rtnetlink::packet_route::tc::{TcAttribute, TcHandle, TcMessage};
use rtnetlink::packet_route::{AddressFamily, RouteNetlinkMessage};

use netwave_core::dataplane::diff::{DiffError, NetOp, Observed, diff};
use netwave_core::dataplane::{
    Capabilities, Dataplane, Family, Feature, Hook, Link, LinkKind, MANAGED_ALIAS, Mac,
    NodeSettings, RTPROT_NETWAVE, RouteAction, RouteKey, Rule, canonical_fwmask,
};

/// Requests outstanding at once within one stage (measured: ≈16 matches `ip -batch`).
pub const IN_FLIGHT: usize = 16;

/// `RT_TABLE_COMPAT`: header value when the real table id (> 255) is in the `RTA_TABLE` attribute.
const RT_TABLE_COMPAT: u8 = 252;

const EOPNOTSUPP: i32 = 95;

#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("opening a netlink socket: {0}")]
    Connect(#[source] io::Error),
    #[error("reading {what} from the kernel: {source}")]
    Dump {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("`{op}` failed: {source}")]
    Write {
        op: String,
        #[source]
        source: io::Error,
    },
    #[error("`{op}`: device {name} does not exist")]
    MissingDevice { op: String, name: String },
    #[error(transparent)]
    Conflict(#[from] DiffError),
    #[error("kernel state still differs after {passes} apply passes: {remaining}")]
    NotConverged { passes: usize, remaining: String },
}

impl NetlinkError {
    /// The errno a write failed with, if the kernel refused it.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NetlinkError::Write { source, .. } | NetlinkError::Dump { source, .. } => {
                source.raw_os_error()
            }
            _ => None,
        }
    }

    /// Bounded label for metrics and status reasons.
    pub fn category(&self) -> &'static str {
        match self {
            NetlinkError::Connect(_) => "connect",
            NetlinkError::Dump { .. } => "observe",
            NetlinkError::Write { .. } if self.errno() == Some(EOPNOTSUPP) => "unsupported",
            NetlinkError::Write { .. } => "write",
            NetlinkError::MissingDevice { .. } => "missing_device",
            NetlinkError::Conflict(_) => "conflict",
            NetlinkError::NotConverged { .. } => "not_converged",
        }
    }
}

/// What one [`Netlink::reconcile`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Every operation applied, in order (empty: the kernel already matched).
    pub applied: Vec<NetOp>,
    /// Netlink writes performed.
    pub writes: u64,
}

/// A netlink route socket in the network namespace of the thread that opened it.
#[derive(Clone)]
pub struct Netlink {
    handle: Handle,
    writes: Arc<AtomicU64>,
    /// Reads of the whole kernel state ([`Netlink::observe`]): an apply makes one before it changes
    /// anything and passes it down (#30).
    observations: Arc<AtomicU64>,
    settings: NodeSettings,
    /// The kernel filters route dumps by protocol on this socket (strict checking is on).
    filtered: bool,
    /// Route messages the kernel sent in observations, the agent's and (unfiltered) foreign ones.
    route_messages: Arc<AtomicU64>,
}

/// Observed state plus the interface indexes needed to address links.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub observed: Observed,
    pub index: BTreeMap<String, u32>,
}

/// Of `names`, those no unmarked link of `snap` holds (see [`Netlink::not_foreign`]).
pub fn not_foreign_in(snap: &Snapshot, names: impl IntoIterator<Item = String>) -> Vec<String> {
    names
        .into_iter()
        .filter(|n| !snap.observed.foreign_links.contains(n))
        .collect()
}

fn io_err(e: rtnetlink::Error) -> io::Error {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.to_io(),
        other => io::Error::other(other.to_string()),
    }
}

impl Netlink {
    /// Opens a socket and spawns its connection task on the current tokio runtime. The socket lives in
    /// the network namespace of the calling thread.
    pub fn connect(settings: NodeSettings) -> Result<Netlink, NetlinkError> {
        Self::connect_with(settings, true)
    }

    /// [`Netlink::connect`], with the kernel's filtering of route dumps only if `kernel_filter` (the
    /// benchmark's baseline turns it off).
    pub fn connect_with(
        settings: NodeSettings,
        kernel_filter: bool,
    ) -> Result<Netlink, NetlinkError> {
        let strict = match kernel_filter {
            true => rtnetlink::new_connection_with_strict_check(),
            false => Err(io::ErrorKind::Unsupported.into()),
        };
        let (conn, handle, filtered) = match strict {
            Ok((conn, handle, _)) => (conn, handle, true),
            // ENOPROTOOPT before Linux 4.20: every dump is whole, filtered here.
            Err(_) => {
                let (conn, handle, _) =
                    rtnetlink::new_connection().map_err(NetlinkError::Connect)?;
                (conn, handle, false)
            }
        };
        tokio::spawn(conn);
        Ok(Netlink {
            handle,
            writes: Arc::new(AtomicU64::new(0)),
            observations: Arc::new(AtomicU64::new(0)),
            settings,
            filtered,
            route_messages: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Whether the kernel sends this socket only the agent's routes (see the module doc).
    pub fn kernel_filters_routes(&self) -> bool {
        self.filtered
    }

    /// Route messages the kernel has sent to observations on this socket.
    pub fn route_messages(&self) -> u64 {
        self.route_messages.load(Ordering::Relaxed)
    }

    pub fn settings(&self) -> &NodeSettings {
        &self.settings
    }

    /// Netlink writes since this socket was opened.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// Kernel observations ([`Netlink::observe`]) since this socket was opened.
    pub fn observations(&self) -> u64 {
        self.observations.load(Ordering::Relaxed)
    }

    async fn dump(
        &self,
        msg: RouteNetlinkMessage,
        what: &'static str,
    ) -> Result<Vec<RouteNetlinkMessage>, NetlinkError> {
        let mut out = Vec::new();
        self.dump_each(msg, what, |m| out.push(m)).await?;
        Ok(out)
    }

    /// A dump handed to `each` one message at a time, as the kernel sends them: nothing of it is
    /// kept but what `each` keeps.
    async fn dump_each(
        &self,
        msg: RouteNetlinkMessage,
        what: &'static str,
        mut each: impl FnMut(RouteNetlinkMessage),
    ) -> Result<(), NetlinkError> {
        let mut req = NetlinkMessage::from(msg);
        req.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        let mut handle = self.handle.clone();
        let mut resp = handle.request(req).map_err(|e| NetlinkError::Dump {
            what,
            source: io_err(e),
        })?;
        while let Some(m) = resp.next().await {
            match m.payload {
                NetlinkPayload::InnerMessage(inner) => each(inner),
                NetlinkPayload::Error(e) if e.code.is_some() => {
                    return Err(NetlinkError::Dump {
                        what,
                        source: e.to_io(),
                    });
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// One write request; `Err` carries the kernel's errno.
    async fn write(&self, msg: RouteNetlinkMessage, flags: u16) -> io::Result<()> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        let mut req = NetlinkMessage::from(msg);
        req.header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        let mut handle = self.handle.clone();
        let mut resp = handle.request(req).map_err(io_err)?;
        while let Some(m) = resp.next().await {
            if let NetlinkPayload::Error(e) = m.payload
                && e.code.is_some()
            {
                return Err(e.to_io());
            }
        }
        Ok(())
    }

    async fn link_index(&self) -> Result<BTreeMap<String, u32>, NetlinkError> {
        let links = self
            .dump(
                RouteNetlinkMessage::GetLink(LinkMessage::default()),
                "links",
            )
            .await?;
        Ok(links
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => link_name(&l).map(|n| (n, l.header.index)),
                _ => None,
            })
            .collect())
    }

    /// Every link's name and whether it is up (administratively up and with carrier), for the interface
    /// health probe.
    pub async fn link_states(&self) -> Result<Vec<(String, bool)>, NetlinkError> {
        let links = self
            .dump(
                RouteNetlinkMessage::GetLink(LinkMessage::default()),
                "links",
            )
            .await?;
        Ok(links
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => link_name(&l).map(|n| {
                    let f = l.header.flags;
                    (
                        n,
                        f.contains(LinkFlags::Up) && f.contains(LinkFlags::LowerUp),
                    )
                }),
                _ => None,
            })
            .collect())
    }

    /// Reads every managed object (and the names of all other links) from the kernel.
    pub async fn observe(&self) -> Result<Snapshot, NetlinkError> {
        self.observations.fetch_add(1, Ordering::Relaxed);
        let links = self
            .dump(
                RouteNetlinkMessage::GetLink(LinkMessage::default()),
                "links",
            )
            .await?;
        let mut index = BTreeMap::new();
        let mut names = BTreeMap::new();
        let mut msgs = Vec::new();
        for m in links {
            if let RouteNetlinkMessage::NewLink(l) = m
                && let Some(name) = link_name(&l)
            {
                index.insert(name.clone(), l.header.index);
                names.insert(l.header.index, name.clone());
                msgs.push((name, l));
            }
        }
        let mut snap = Snapshot {
            index,
            ..Snapshot::default()
        };
        let mut managed_idx = BTreeMap::new();
        for (name, l) in msgs {
            let alias = l.attributes.iter().find_map(|a| match a {
                LinkAttribute::IfAlias(s) => Some(s.as_str()),
                _ => None,
            });
            match (
                self.settings.owns(&name, alias),
                parse_link(&name, &l, &names),
            ) {
                (true, Some(link)) => {
                    managed_idx.insert(l.header.index, name.clone());
                    snap.observed.managed.links.insert(name, link);
                }
                // Ours by marker but of a kind the agent never creates: leave it alone.
                _ => {
                    snap.observed.foreign_links.insert(name);
                }
            }
        }

        let mut addrs = Vec::new();
        self.dump_each(
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            "addresses",
            |m| match m {
                RouteNetlinkMessage::NewAddress(a) if managed_idx.contains_key(&a.header.index) => {
                    addrs.push(a)
                }
                _ => {}
            },
        )
        .await?;
        for a in addrs {
            let Some(dev) = managed_idx.get(&a.header.index) else {
                continue;
            };
            let local = a.attributes.iter().find_map(|x| match x {
                AddressAttribute::Local(ip) => Some(*ip),
                _ => None,
            });
            let addr = local.or_else(|| {
                a.attributes.iter().find_map(|x| match x {
                    AddressAttribute::Address(ip) => Some(*ip),
                    _ => None,
                })
            });
            let Some(ip) = addr else { continue };
            if let IpAddr::V6(v6) = ip
                && v6.segments()[0] & 0xffc0 == 0xfe80
            {
                continue; // link-local: the kernel's, not ours
            }
            if let Ok(net) = IpNet::new(ip, a.header.prefix_len)
                && let Some(link) = snap.observed.managed.links.get_mut(dev)
            {
                link.addresses.insert(net);
            }
        }

        self.observe_routes(&mut snap.observed.managed, &names)
            .await?;
        self.observe_mirrors(&mut snap, &managed_idx, &names)
            .await?;
        Ok(snap)
    }

    /// The agent's routes and rules (protocol 242), the routes filtered by the kernel (module doc).
    async fn observe_routes(
        &self,
        managed: &mut Dataplane,
        names: &BTreeMap<u32, String>,
    ) -> Result<(), NetlinkError> {
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut q = RouteMessage::default();
            q.header.address_family = family;
            // The kernel's filter under strict checking; ignored without it (checked below).
            q.header.protocol = RouteProtocol::Other(RTPROT_NETWAVE);
            self.dump_each(RouteNetlinkMessage::GetRoute(q), "routes", |m| {
                self.route_messages.fetch_add(1, Ordering::Relaxed);
                if let RouteNetlinkMessage::NewRoute(r) = m
                    && r.header.protocol == RouteProtocol::Other(RTPROT_NETWAVE)
                    && let Some((key, action)) = parse_route(&r, names)
                {
                    managed.routes.insert(key, action);
                }
            })
            .await?;
            // Rules are not filtered by the kernel; a node has few.
            let mut q = RuleMessage::default();
            q.header.family = family;
            self.dump_each(RouteNetlinkMessage::GetRule(q), "rules", |m| {
                if let RouteNetlinkMessage::NewRule(r) = m
                    && r.attributes
                        .contains(&RuleAttribute::Protocol(RouteProtocol::Other(
                            RTPROT_NETWAVE,
                        )))
                    && let Some(rule) = parse_rule(&r)
                {
                    managed.rules.insert(rule);
                }
            })
            .await?;
        }
        Ok(())
    }

    /// The clsact qdiscs of managed links, and the agent's mirror filters in them.
    async fn observe_mirrors(
        &self,
        snap: &mut Snapshot,
        managed_idx: &BTreeMap<u32, String>,
        names: &BTreeMap<u32, String>,
    ) -> Result<(), NetlinkError> {
        let qdiscs = self
            .dump(
                RouteNetlinkMessage::GetQueueDiscipline(TcMessage::default()),
                "qdiscs",
            )
            .await?;
        let mut with_clsact = Vec::new();
        for m in qdiscs {
            let RouteNetlinkMessage::NewQueueDiscipline(q) = m else {
                continue;
            };
            let Some(dev) = u32::try_from(q.header.index)
                .ok()
                .and_then(|i| managed_idx.get(&i))
            else {
                continue;
            };
            if q.attributes.contains(&TcAttribute::Kind("clsact".into()))
                && let Some(link) = snap.observed.managed.links.get_mut(dev)
            {
                link.clsact = true;
                with_clsact.push((q.header.index, dev.clone()));
            }
        }
        for (index, dev) in with_clsact {
            for hook in [Hook::Ingress, Hook::Egress] {
                let mut q = TcMessage::with_index(index);
                q.header.parent = TcHandle::from(tc::parent(hook));
                for m in self
                    .dump(RouteNetlinkMessage::GetTrafficFilter(q), "tc filters")
                    .await?
                {
                    if let RouteNetlinkMessage::NewTrafficFilter(f) = m
                        && let Some(filter) = tc::parse_filter(&dev, hook, &f, names)
                    {
                        snap.observed.managed.mirrors.insert(filter);
                    }
                }
            }
        }
        Ok(())
    }

    /// Executes `ops` in order, pipelining the ops of each stage. Stops at the first stage with a failure
    /// and reports the first failed op.
    pub async fn apply(
        &self,
        ops: &[NetOp],
        index: &mut BTreeMap<String, u32>,
    ) -> Result<(), NetlinkError> {
        let mut rest = ops;
        while let Some(first) = rest.first() {
            let stage = first.stage();
            let n = rest.iter().take_while(|o| o.stage() == stage).count();
            let (group, tail) = rest.split_at(n);
            rest = tail;
            let idx: &BTreeMap<String, u32> = index;
            // Futures collected first: a stream holding the closure makes the caller's future !Send
            // (higher-ranked lifetime inference), which would keep the agent off multi-threaded spawns.
            let futs: Vec<_> = group.iter().map(|op| self.exec(op, idx)).collect();
            let results: Vec<Result<(), NetlinkError>> =
                stream::iter(futs).buffered(IN_FLIGHT).collect().await;
            if let Some(err) = results.into_iter().find_map(Result::err) {
                return Err(err);
            }
            if group.iter().any(|o| matches!(o, NetOp::AddLink { .. })) {
                *index = self.link_index().await?;
            }
        }
        Ok(())
    }

    /// Of `names`, those no one else holds now (no unmarked link of that name exists): the links an
    /// apply or its restore may create or recreate, and so may leave unmarked if the agent dies.
    pub async fn not_foreign(
        &self,
        names: impl IntoIterator<Item = String>,
    ) -> Result<Vec<String>, NetlinkError> {
        let snap = self.observe().await?;
        Ok(not_foreign_in(&snap, names))
    }

    /// Marks as the agent's the links among `names` that exist without the ownership alias: links an
    /// interrupted apply created and was killed before marking (see `backup::Applying::creating`).
    /// Returns the names adopted.
    pub async fn adopt(&self, names: &[String]) -> Result<Vec<String>, NetlinkError> {
        let mut snap = self.observe().await?;
        let orphans: Vec<String> = names
            .iter()
            .filter(|n| snap.observed.foreign_links.contains(*n))
            .cloned()
            .collect();
        let ops: Vec<NetOp> = orphans
            .iter()
            .map(|name| NetOp::SetLink {
                name: name.clone(),
                rank: 0,
                change: netwave_core::dataplane::diff::LinkChange {
                    mark: true,
                    ..Default::default()
                },
            })
            .collect();
        self.apply(&ops, &mut snap.index).await?;
        Ok(orphans)
    }

    /// Brings one link up or down, outside any plan: the FRR apply holds a new L3 VNI's VRF bridge down
    /// across the reload (see `frr`), then brings it back up so the kernel matches the model again.
    pub async fn set_up(&self, name: &str, up: bool) -> Result<(), NetlinkError> {
        let mut index = self.link_index().await?;
        let op = NetOp::SetLink {
            name: name.to_string(),
            rank: 0,
            change: netwave_core::dataplane::diff::LinkChange {
                up: Some(up),
                ..Default::default()
            },
        };
        self.apply(&[op], &mut index).await
    }

    /// observe → diff → apply → observe again, until the kernel matches `desired` (verify). A second pass
    /// is sometimes needed because the kernel itself removes state as a side effect (e.g. enslaving to a
    /// VRF cycles the device, which drops its IPv6 addresses). Gives up after three passes.
    pub async fn reconcile(&self, desired: &Dataplane) -> Result<ReconcileReport, NetlinkError> {
        let snap = self.observe().await?;
        self.reconcile_from(desired, snap).await
    }

    /// [`Netlink::reconcile`] whose first pass diffs against `first`, an observation the caller just
    /// made (the apply's preflight): the kernel is read once before it is changed. Later passes, and the
    /// verify, observe afresh, so a kernel that moved since `first` still converges.
    pub async fn reconcile_from(
        &self,
        desired: &Dataplane,
        first: Snapshot,
    ) -> Result<ReconcileReport, NetlinkError> {
        const PASSES: usize = 3;
        let start = self.writes();
        let mut applied = Vec::new();
        let mut first = Some(first);
        for _ in 0..PASSES {
            let mut snap = match first.take() {
                Some(snap) => snap,
                None => self.observe().await?,
            };
            let ops = diff(desired, &snap.observed)?;
            if ops.is_empty() {
                return Ok(ReconcileReport {
                    applied,
                    writes: self.writes() - start,
                });
            }
            self.apply(&ops, &mut snap.index).await?;
            applied.extend(ops);
        }
        let snap = self.observe().await?;
        let remaining = diff(desired, &snap.observed)?;
        if remaining.is_empty() {
            return Ok(ReconcileReport {
                applied,
                writes: self.writes() - start,
            });
        }
        Err(NetlinkError::NotConverged {
            passes: PASSES,
            remaining: remaining
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
        })
    }

    async fn exec(&self, op: &NetOp, index: &BTreeMap<String, u32>) -> Result<(), NetlinkError> {
        let (msg, flags) = op_message(op, index)?;
        self.write(msg, flags)
            .await
            .map_err(|source| NetlinkError::Write {
                op: op.to_string(),
                source,
            })
    }

    /// Which features this kernel supports, probed by creating and deleting throwaway links (names
    /// `nwprobe*`). EOPNOTSUPP, the kernel's answer to an unknown link kind or option, means missing; any
    /// other failure is reported as missing too (logged by the caller with the error).
    pub async fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::new();
        for f in Feature::ALL {
            caps.insert(f, self.probe(f).await.is_ok());
        }
        caps
    }

    async fn probe(&self, f: Feature) -> io::Result<()> {
        let name = format!("nwprobe{}", std::process::id() % 100_000);
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(name.clone()));
        let info = match f {
            Feature::Vrf => vec![
                LinkInfo::Kind(InfoKind::Vrf),
                LinkInfo::Data(InfoData::Vrf(vec![InfoVrf::TableId(4_000_000_000)])),
            ],
            Feature::Bridge | Feature::Vlan => vec![LinkInfo::Kind(InfoKind::Bridge)],
            Feature::BridgeVlanFiltering => vec![
                LinkInfo::Kind(InfoKind::Bridge),
                LinkInfo::Data(InfoData::Bridge(vec![InfoBridge::VlanFiltering(true)])),
            ],
            Feature::Vxlan => vec![
                LinkInfo::Kind(InfoKind::Vxlan),
                LinkInfo::Data(InfoData::Vxlan(vec![
                    InfoVxlan::Id(16_000_000),
                    InfoVxlan::Port(0),
                ])),
            ],
            // With a remote: one without would clash with the fallback `gretap0` (EEXIST).
            Feature::Gre => vec![
                LinkInfo::Kind(InfoKind::GreTap),
                LinkInfo::Data(InfoData::GreTap(vec![InfoGre::Remote(
                    std::net::Ipv4Addr::new(198, 18, 255, 254),
                )])),
            ],
        };
        m.attributes.push(LinkAttribute::LinkInfo(info));
        self.write(RouteNetlinkMessage::NewLink(m), NLM_F_CREATE | NLM_F_EXCL)
            .await?;
        let mut result = Ok(());
        if f == Feature::Vlan {
            // A VLAN sub-interface on the throwaway bridge.
            let parent = self
                .link_index()
                .await
                .map_err(|e| io::Error::other(e.to_string()))?
                .get(&name)
                .copied()
                .unwrap_or(0);
            let mut v = LinkMessage::default();
            v.attributes.push(LinkAttribute::IfName(format!("{name}v")));
            v.attributes.push(LinkAttribute::Link(parent));
            v.attributes.push(LinkAttribute::LinkInfo(vec![
                LinkInfo::Kind(InfoKind::Vlan),
                LinkInfo::Data(InfoData::Vlan(vec![InfoVlan::Id(4094)])),
            ]));
            result = self
                .write(RouteNetlinkMessage::NewLink(v), NLM_F_CREATE | NLM_F_EXCL)
                .await;
        }
        // Deleting the parent removes the VLAN on it too.
        let mut d = LinkMessage::default();
        d.attributes.push(LinkAttribute::IfName(name));
        self.write(RouteNetlinkMessage::DelLink(d), 0).await?;
        result
    }
}

fn link_name(l: &LinkMessage) -> Option<String> {
    l.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(n) => Some(n.clone()),
        _ => None,
    })
}

fn parse_link(name: &str, l: &LinkMessage, names: &BTreeMap<u32, String>) -> Option<Link> {
    let mut kind = None;
    let mut data = None;
    let mut port = None;
    let mut link = Link {
        name: name.to_string(),
        kind: LinkKind::Bridge,
        mtu: None,
        mac: None,
        master: None,
        up: l.header.flags.contains(LinkFlags::Up),
        neigh_suppress: false,
        addresses: BTreeSet::new(),
        clsact: false,
    };
    let mut parent = None;
    for a in &l.attributes {
        match a {
            LinkAttribute::Mtu(m) => link.mtu = Some(*m),
            LinkAttribute::Address(b) if b.len() == 6 => {
                let mut mac = [0u8; 6];
                mac.copy_from_slice(b);
                link.mac = Some(Mac(mac));
            }
            LinkAttribute::Controller(i) => link.master = names.get(i).cloned(),
            LinkAttribute::Link(i) => parent = names.get(i).cloned(),
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    match i {
                        LinkInfo::Kind(k) => kind = Some(k.clone()),
                        LinkInfo::Data(d) => data = Some(d.clone()),
                        LinkInfo::PortData(p) => port = Some(p.clone()),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    if let Some(InfoPortData::BridgePort(p)) = &port {
        link.neigh_suppress = p.contains(&InfoBridgePort::NeighSupress(true));
    }
    link.kind = match (kind?, data) {
        (InfoKind::Bridge, _) => LinkKind::Bridge,
        (InfoKind::Vrf, Some(InfoData::Vrf(d))) => LinkKind::Vrf {
            table: d.iter().find_map(|x| match x {
                InfoVrf::TableId(t) => Some(*t),
                _ => None,
            })?,
        },
        (InfoKind::Vxlan, Some(InfoData::Vxlan(d))) => {
            let mut vni = None;
            let mut local = None;
            let mut port = 0;
            let mut learning = true;
            for x in d {
                match x {
                    InfoVxlan::Id(v) => vni = Some(v),
                    InfoVxlan::Local(a) => local = Some(IpAddr::V4(a)),
                    InfoVxlan::Local6(a) => local = Some(IpAddr::V6(a)),
                    InfoVxlan::Port(p) => port = p,
                    InfoVxlan::Learning(l) => learning = l,
                    _ => {}
                }
            }
            LinkKind::Vxlan {
                vni: vni?,
                local,
                port,
                learning,
            }
        }
        (InfoKind::GreTap, Some(InfoData::GreTap(d))) => {
            gre_kind(true, d.iter().filter_map(GreAttr::v4), names)?
        }
        (InfoKind::GreTun, Some(InfoData::GreTun(d))) => {
            gre_kind(false, d.iter().filter_map(GreAttr::v4), names)?
        }
        (InfoKind::GreTap6, Some(InfoData::GreTap6(d))) => {
            gre_kind(true, d.iter().filter_map(GreAttr::v6), names)?
        }
        (InfoKind::GreTun6, Some(InfoData::GreTun6(d))) => {
            gre_kind(false, d.iter().filter_map(GreAttr::v6), names)?
        }
        (InfoKind::Vlan, Some(InfoData::Vlan(d))) => LinkKind::Vlan {
            parent: parent?,
            id: d.iter().find_map(|x| match x {
                InfoVlan::Id(i) => Some(*i),
                _ => None,
            })?,
        },
        _ => return None,
    };
    Some(link)
}

/// A key counts when it is sent (`okey` with the key flag).
fn gre_key(flags: GreIOFlags, key: Option<u32>) -> Option<u32> {
    flags.contains(GreIOFlags::Key).then_some(key).flatten()
}

/// The GRE attributes the model reads, from either family's netlink attributes.
enum GreAttr {
    Local(IpAddr),
    Remote(IpAddr),
    OKey(u32),
    OFlags(GreIOFlags),
    Link(u32),
}

impl GreAttr {
    fn v4(a: &InfoGre) -> Option<GreAttr> {
        Some(match a {
            InfoGre::Local(a) => GreAttr::Local(IpAddr::V4(*a)),
            InfoGre::Remote(a) => GreAttr::Remote(IpAddr::V4(*a)),
            InfoGre::OKey(k) => GreAttr::OKey(*k),
            InfoGre::OFlags(f) => GreAttr::OFlags(*f),
            InfoGre::Link(i) => GreAttr::Link(*i),
            _ => return None,
        })
    }

    fn v6(a: &InfoGre6) -> Option<GreAttr> {
        Some(match a {
            InfoGre6::Local(a) => GreAttr::Local(IpAddr::V6(*a)),
            InfoGre6::Remote(a) => GreAttr::Remote(IpAddr::V6(*a)),
            InfoGre6::OKey(k) => GreAttr::OKey(*k),
            InfoGre6::OFlags(f) => GreAttr::OFlags(*f),
            InfoGre6::Link(i) => GreAttr::Link(*i),
            _ => return None,
        })
    }
}

/// A GRE link of either family as the model has it (`None`: no local or remote address).
fn gre_kind(
    tap: bool,
    attrs: impl IntoIterator<Item = GreAttr>,
    names: &BTreeMap<u32, String>,
) -> Option<LinkKind> {
    let (mut local, mut remote, mut key, mut flags, mut dev) =
        (None, None, None, GreIOFlags::empty(), String::new());
    for x in attrs {
        match x {
            GreAttr::Local(a) => local = Some(a),
            GreAttr::Remote(a) => remote = Some(a),
            GreAttr::OKey(k) => key = Some(k),
            GreAttr::OFlags(f) => flags = f,
            GreAttr::Link(i) => dev = names.get(&i).cloned().unwrap_or_default(),
        }
    }
    Some(LinkKind::Gre {
        tap,
        dev,
        local: local?,
        remote: remote?,
        key: gre_key(flags, key),
    })
}

fn ip_of(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v) => Some(IpAddr::V4(*v)),
        RouteAddress::Inet6(v) => Some(IpAddr::V6(*v)),
        _ => None,
    }
}

fn parse_route(r: &RouteMessage, names: &BTreeMap<u32, String>) -> Option<(RouteKey, RouteAction)> {
    let mut table = u32::from(r.header.table);
    let mut dst = None;
    let mut via = None;
    let mut dev = None;
    let mut metric = 0;
    for a in &r.attributes {
        match a {
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Destination(d) => dst = ip_of(d),
            RouteAttribute::Gateway(g) => via = ip_of(g),
            RouteAttribute::Oif(i) => dev = names.get(i).cloned(),
            RouteAttribute::Priority(p) => metric = *p,
            _ => {}
        }
    }
    let dst = match (dst, r.header.address_family) {
        (Some(ip), _) => IpNet::new(ip, r.header.destination_prefix_length).ok()?,
        (None, AddressFamily::Inet6) => "::/0".parse().ok()?,
        (None, _) => "0.0.0.0/0".parse().ok()?,
    };
    let action = match r.header.kind {
        RouteType::BlackHole => RouteAction::Blackhole,
        RouteType::Unreachable => RouteAction::Unreachable,
        RouteType::Unicast => RouteAction::Unicast { via, dev },
        _ => return None,
    };
    Some((RouteKey { table, dst, metric }, action))
}

fn parse_rule(r: &RuleMessage) -> Option<Rule> {
    let family = match r.header.family {
        AddressFamily::Inet => Family::V4,
        AddressFamily::Inet6 => Family::V6,
        _ => return None,
    };
    let mut rule = Rule {
        family,
        priority: 0,
        table: u32::from(r.header.table),
        from: None,
        to: None,
        iif: None,
        fwmark: None,
        fwmask: None,
    };
    for a in &r.attributes {
        match a {
            RuleAttribute::Priority(p) => rule.priority = *p,
            RuleAttribute::Table(t) => rule.table = *t,
            RuleAttribute::Source(ip) => rule.from = IpNet::new(*ip, r.header.src_len).ok(),
            RuleAttribute::Destination(ip) => rule.to = IpNet::new(*ip, r.header.dst_len).ok(),
            RuleAttribute::Iifname(n) => rule.iif = Some(n.clone()),
            RuleAttribute::FwMark(m) => rule.fwmark = Some(*m),
            RuleAttribute::FwMask(m) => rule.fwmask = Some(*m),
            _ => {}
        }
    }
    // The kernel reports the mark only when it is not 0 and the mask when either is not 0: a mask
    // alone is a zero mark compared under it. A mark given without a mask got all bits, which the
    // model writes as no mask.
    if rule.fwmask.is_some() {
        rule.fwmark.get_or_insert(0);
    }
    rule.fwmask = canonical_fwmask(rule.fwmark, rule.fwmask);
    Some(rule)
}

fn family_of(net: &IpNet) -> AddressFamily {
    match net {
        IpNet::V4(_) => AddressFamily::Inet,
        IpNet::V6(_) => AddressFamily::Inet6,
    }
}

fn addr_msg(index: u32, addr: &IpNet) -> AddressMessage {
    let mut m = AddressMessage::default();
    m.header.family = family_of(addr);
    m.header.prefix_len = addr.prefix_len();
    m.header.index = index;
    if let IpNet::V4(_) = addr {
        m.attributes.push(AddressAttribute::Local(addr.addr()));
    }
    m.attributes.push(AddressAttribute::Address(addr.addr()));
    m
}

/// The netlink message (and its flags) that carries out `op`; devices are named by their index.
fn op_message(
    op: &NetOp,
    index: &BTreeMap<String, u32>,
) -> Result<(RouteNetlinkMessage, u16), NetlinkError> {
    let idx = |name: &str| {
        index
            .get(name)
            .copied()
            .ok_or_else(|| NetlinkError::MissingDevice {
                op: op.to_string(),
                name: name.to_string(),
            })
    };
    Ok(match op {
        NetOp::DelRule(r) => (RouteNetlinkMessage::DelRule(rule_msg(r)), 0),
        NetOp::AddRule(r) => (
            RouteNetlinkMessage::NewRule(rule_msg(r)),
            NLM_F_CREATE | NLM_F_EXCL,
        ),
        NetOp::DelRoute(r) => {
            let mut m = route_msg(&r.key, &r.action, index, op)?;
            // Match whatever next hop it has: the key identifies our route.
            m.attributes
                .retain(|a| !matches!(a, RouteAttribute::Gateway(_) | RouteAttribute::Oif(_)));
            m.header.scope = RouteScope::NoWhere;
            (RouteNetlinkMessage::DelRoute(m), 0)
        }
        NetOp::AddRoute(r) => (
            RouteNetlinkMessage::NewRoute(route_msg(&r.key, &r.action, index, op)?),
            NLM_F_CREATE | NLM_F_EXCL,
        ),
        NetOp::ReplaceRoute(r) => (
            RouteNetlinkMessage::NewRoute(route_msg(&r.key, &r.action, index, op)?),
            NLM_F_CREATE | NLM_F_REPLACE,
        ),
        NetOp::DelAddr { dev, addr } => (
            RouteNetlinkMessage::DelAddress(addr_msg(idx(dev)?, addr)),
            0,
        ),
        NetOp::AddAddr { dev, addr } => (
            RouteNetlinkMessage::NewAddress(addr_msg(idx(dev)?, addr)),
            NLM_F_CREATE | NLM_F_EXCL,
        ),
        NetOp::DelLink { name, .. } => {
            let mut m = LinkMessage::default();
            m.header.index = idx(name)?;
            (RouteNetlinkMessage::DelLink(m), 0)
        }
        NetOp::AddLink {
            name,
            kind,
            mtu,
            mac,
        } => (
            RouteNetlinkMessage::NewLink(new_link_msg(name, kind, *mtu, *mac, &idx)?),
            NLM_F_CREATE | NLM_F_EXCL,
        ),
        NetOp::SetLink { name, change, .. } => (
            RouteNetlinkMessage::SetLink(set_link_msg(idx(name)?, change, &idx)?),
            0,
        ),
        NetOp::SetNeighSuppress { name, on } => {
            let mut m = LinkMessage::default();
            m.header.index = idx(name)?;
            m.attributes.push(LinkAttribute::LinkInfo(vec![
                LinkInfo::PortKind(InfoPortKind::Bridge),
                LinkInfo::PortData(InfoPortData::BridgePort(vec![
                    InfoBridgePort::NeighSupress(*on),
                ])),
            ]));
            (RouteNetlinkMessage::NewLink(m), 0)
        }
        NetOp::AddQdisc { dev } => (
            RouteNetlinkMessage::NewQueueDiscipline(tc::clsact(idx(dev)?)),
            NLM_F_CREATE | NLM_F_EXCL,
        ),
        NetOp::DelQdisc { dev } => (
            RouteNetlinkMessage::DelQueueDiscipline(tc::clsact(idx(dev)?)),
            0,
        ),
        NetOp::AddFilter(f) => (
            RouteNetlinkMessage::NewTrafficFilter(tc::filter_add(f, idx(&f.dev)?, idx(&f.to)?)),
            NLM_F_CREATE | NLM_F_EXCL,
        ),
        NetOp::DelFilter(f) => (
            RouteNetlinkMessage::DelTrafficFilter(tc::filter_del(f, idx(&f.dev)?)),
            0,
        ),
    })
}

/// A new link of `kind` (a VLAN's parent named by its index).
fn new_link_msg(
    name: &str,
    kind: &LinkKind,
    mtu: Option<u32>,
    mac: Option<Mac>,
    idx: &impl Fn(&str) -> Result<u32, NetlinkError>,
) -> Result<LinkMessage, NetlinkError> {
    let mut m = LinkMessage::default();
    m.attributes.push(LinkAttribute::IfName(name.to_string()));
    if let Some(mtu) = mtu {
        m.attributes.push(LinkAttribute::Mtu(mtu));
    }
    if let Some(mac) = mac {
        m.attributes.push(LinkAttribute::Address(mac.0.to_vec()));
    }
    let (k, data) = match kind {
        LinkKind::Vrf { table } => (
            InfoKind::Vrf,
            Some(InfoData::Vrf(vec![InfoVrf::TableId(*table)])),
        ),
        LinkKind::Bridge => (InfoKind::Bridge, None),
        LinkKind::Vxlan {
            vni,
            local,
            port,
            learning,
        } => {
            let mut d = vec![
                InfoVxlan::Id(*vni),
                InfoVxlan::Port(*port),
                InfoVxlan::Learning(*learning),
            ];
            match local {
                Some(IpAddr::V4(a)) => d.push(InfoVxlan::Local(*a)),
                Some(IpAddr::V6(a)) => d.push(InfoVxlan::Local6(*a)),
                None => {}
            }
            (InfoKind::Vxlan, Some(InfoData::Vxlan(d)))
        }
        LinkKind::Vlan { parent, id } => {
            m.attributes.push(LinkAttribute::Link(idx(parent)?));
            (
                InfoKind::Vlan,
                Some(InfoData::Vlan(vec![InfoVlan::Id(*id)])),
            )
        }
        LinkKind::Gre {
            tap,
            dev,
            local,
            remote,
            key,
        } => gre_info(*tap, idx(dev)?, *local, *remote, *key),
    };
    let mut info = vec![LinkInfo::Kind(k)];
    info.extend(data.map(LinkInfo::Data));
    m.attributes.push(LinkAttribute::LinkInfo(info));
    Ok(m)
}

/// A GRE link's kind and data: its ends, its underlay device and, with a key, the key both ways.
fn gre_info(
    tap: bool,
    link: u32,
    local: IpAddr,
    remote: IpAddr,
    key: Option<u32>,
) -> (InfoKind, Option<InfoData>) {
    let flags = if key.is_some() {
        GreIOFlags::Key
    } else {
        GreIOFlags::empty()
    };
    match (local, remote) {
        (IpAddr::V4(l), IpAddr::V4(r)) => {
            let mut d = vec![
                InfoGre::Link(link),
                InfoGre::Local(l),
                InfoGre::Remote(r),
                InfoGre::IFlags(flags),
                InfoGre::OFlags(flags),
            ];
            if let Some(k) = key {
                d.extend([InfoGre::IKey(k), InfoGre::OKey(k)]);
            }
            if tap {
                (InfoKind::GreTap, Some(InfoData::GreTap(d)))
            } else {
                (InfoKind::GreTun, Some(InfoData::GreTun(d)))
            }
        }
        (l, r) => {
            // The model refuses mixed families; both are IPv6 here.
            let v6 = |a: IpAddr| match a {
                IpAddr::V6(a) => a,
                IpAddr::V4(a) => a.to_ipv6_mapped(),
            };
            let mut d = vec![
                InfoGre6::Link(link),
                InfoGre6::Local(v6(l)),
                InfoGre6::Remote(v6(r)),
                InfoGre6::IFlags(flags),
                InfoGre6::OFlags(flags),
            ];
            if let Some(k) = key {
                d.extend([InfoGre6::IKey(k), InfoGre6::OKey(k)]);
            }
            if tap {
                (InfoKind::GreTap6, Some(InfoData::GreTap6(d)))
            } else {
                (InfoKind::GreTun6, Some(InfoData::GreTun6(d)))
            }
        }
    }
}

/// The attribute changes of link `index` (a new master named by its index, 0 for none).
fn set_link_msg(
    index: u32,
    change: &netwave_core::dataplane::diff::LinkChange,
    idx: &impl Fn(&str) -> Result<u32, NetlinkError>,
) -> Result<LinkMessage, NetlinkError> {
    let mut m = LinkMessage::default();
    m.header.index = index;
    if change.mark {
        m.attributes
            .push(LinkAttribute::IfAlias(MANAGED_ALIAS.to_string()));
    }
    if let Some(mtu) = change.mtu {
        m.attributes.push(LinkAttribute::Mtu(mtu));
    }
    if let Some(mac) = change.mac {
        m.attributes.push(LinkAttribute::Address(mac.0.to_vec()));
    }
    match &change.master {
        Some(Some(master)) => m.attributes.push(LinkAttribute::Controller(idx(master)?)),
        Some(None) => m.attributes.push(LinkAttribute::Controller(0)),
        None => {}
    }
    if let Some(up) = change.up {
        m.header.change_mask |= LinkFlags::Up;
        if up {
            m.header.flags |= LinkFlags::Up;
        }
    }
    Ok(m)
}

fn route_msg(
    key: &RouteKey,
    action: &RouteAction,
    index: &BTreeMap<String, u32>,
    op: &NetOp,
) -> Result<RouteMessage, NetlinkError> {
    let mut m = RouteMessage::default();
    m.header.address_family = family_of(&key.dst);
    m.header.destination_prefix_length = key.dst.prefix_len();
    m.header.table = u8::try_from(key.table).unwrap_or(RT_TABLE_COMPAT);
    m.header.protocol = RouteProtocol::Other(RTPROT_NETWAVE);
    m.header.scope = RouteScope::Universe;
    m.attributes.push(RouteAttribute::Table(key.table));
    if key.dst.prefix_len() > 0 {
        m.attributes
            .push(RouteAttribute::Destination(key.dst.network().into()));
    }
    if key.metric != 0 {
        m.attributes.push(RouteAttribute::Priority(key.metric));
    }
    m.header.kind = match action {
        RouteAction::Blackhole => RouteType::BlackHole,
        RouteAction::Unreachable => RouteType::Unreachable,
        RouteAction::Unicast { via, dev } => {
            if let Some(v) = via {
                m.attributes.push(RouteAttribute::Gateway((*v).into()));
            } else {
                // Directly connected: `ip route add … dev X` uses link scope.
                m.header.scope = RouteScope::Link;
            }
            if let Some(d) = dev {
                let i = index
                    .get(d)
                    .copied()
                    .ok_or_else(|| NetlinkError::MissingDevice {
                        op: op.to_string(),
                        name: d.clone(),
                    })?;
                m.attributes.push(RouteAttribute::Oif(i));
            }
            RouteType::Unicast
        }
    };
    Ok(m)
}

fn rule_msg(r: &Rule) -> RuleMessage {
    let mut m = RuleMessage::default();
    m.header.family = match r.family {
        Family::V4 => AddressFamily::Inet,
        Family::V6 => AddressFamily::Inet6,
    };
    // Without an action the kernel accepts the rule and then fails every lookup with EINVAL.
    m.header.action = RuleAction::ToTable;
    m.header.table = u8::try_from(r.table).unwrap_or(0);
    m.attributes.push(RuleAttribute::Table(r.table));
    m.attributes.push(RuleAttribute::Priority(r.priority));
    m.attributes
        .push(RuleAttribute::Protocol(RouteProtocol::Other(
            RTPROT_NETWAVE,
        )));
    if let Some(from) = &r.from {
        m.header.src_len = from.prefix_len();
        m.attributes.push(RuleAttribute::Source(from.network()));
    }
    if let Some(to) = &r.to {
        m.header.dst_len = to.prefix_len();
        m.attributes.push(RuleAttribute::Destination(to.network()));
    }
    if let Some(iif) = &r.iif {
        m.attributes.push(RuleAttribute::Iifname(iif.clone()));
    }
    // Without a mask the kernel compares all bits of a non-zero mark (and a zero one not at all:
    // the model never has that).
    if let Some(mark) = r.fwmark {
        m.attributes.push(RuleAttribute::FwMark(mark));
    }
    if let Some(mask) = r.fwmask {
        m.attributes.push(RuleAttribute::FwMask(mask));
    }
    m
}
