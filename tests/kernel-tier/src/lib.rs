//! Kernel tier: netlink tests that need a full Debian kernel (VRF, VLAN, dummy links, bridge VLAN
//! filtering), which the minimal VM kernel of CI and developer machines lacks.
//!
//! ```text
//!  run.sh ── RUSTFLAGS=+crt-static cargo test --no-run ──► static test executables ─┐
//!    │                                                                              ▼
//!    └─ apt: qemu, busybox, linux-image-cloud-amd64 ──► vmlinux + initramfs ──► qemu (TCG)
//!                                                                                   │
//!           host parses `TEST-EXIT-CODE=<n>` ◄── guest /init: modprobe, run tests ◄─┘
//! ```
//!
//! A test opts in by its name (`kernel_tier_…`, the filter `run.sh` passes to libtest) and runs its body
//! through [`run_in_fresh_netns`]: a thread of its own inside a new network namespace, which the kernel
//! removes with everything in it when the thread ends, also when the test panics. The body first probes
//! the kernel for the [`Feature`]s it needs. `cargo test --workspace` runs the same tests on the host
//! kernel, where a missing feature makes the test print `SKIPPED …` and pass; inside the kernel tier
//! (`NETWAVE_KERNEL_TIER=1`, set by the guest) a missing feature fails the test, so the tier cannot go
//! green by skipping.

use std::future::Future;
use std::net::Ipv4Addr;

use anyhow::{Context, Result, bail};
use futures::TryStreamExt;
use netlink_packet_route::link::{InfoData, InfoKind, LinkAttribute, LinkInfo, LinkMessage};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};
use nix::errno::Errno;
use nix::sched::{CloneFlags, unshare};
use rtnetlink::{
    Handle, LinkBridge, LinkDummy, LinkUnspec, LinkVeth, LinkVlan, LinkVrf, LinkVxlan,
    RouteMessageBuilder,
};

/// Set to `1` inside the kernel tier guest: a missing kernel feature then fails the test.
pub const STRICT_ENV: &str = "NETWAVE_KERNEL_TIER";

/// Kernel features the minimal VM kernel may lack. Each is probed by creating a throwaway link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feature {
    Dummy,
    Veth,
    Vrf,
    Vlan,
    Vxlan,
    BridgeVlanFiltering,
}

impl Feature {
    pub fn name(self) -> &'static str {
        match self {
            Feature::Dummy => "dummy links",
            Feature::Veth => "veth links",
            Feature::Vrf => "VRF devices",
            Feature::Vlan => "802.1Q VLAN sub-interfaces",
            Feature::Vxlan => "VXLAN links",
            Feature::BridgeVlanFiltering => "bridge VLAN filtering",
        }
    }
}

/// Whether this process runs inside the kernel tier guest, where nothing may be skipped.
pub fn strict() -> bool {
    std::env::var_os(STRICT_ENV).is_some_and(|v| v == "1")
}

/// The errno of a netlink error reply, if `err` is one.
pub fn errno(err: &rtnetlink::Error) -> Option<Errno> {
    match err {
        rtnetlink::Error::NetlinkError(msg) => msg.code.map(|c| Errno::from_raw(c.get().abs())),
        _ => None,
    }
}

/// The kernel answers "Unknown device type" and "Operation not supported" with EOPNOTSUPP (errno 95):
/// the one way to tell a missing feature from a bad request.
pub fn is_unsupported(err: &rtnetlink::Error) -> bool {
    errno(err) == Some(Errno::EOPNOTSUPP)
}

/// Creates and deletes a throwaway link that needs `feature`; `Ok(false)` when the kernel lacks it.
pub async fn probe(handle: &Handle, feature: Feature) -> Result<bool> {
    const PROBE: &str = "ktprobe0";
    const PARENT: &str = "ktprobe1";
    let mut cleanup = vec![PROBE];
    let message = match feature {
        Feature::Dummy => LinkDummy::new(PROBE).build(),
        Feature::Veth => LinkVeth::new(PROBE, PARENT).build(),
        Feature::Vrf => LinkVrf::new(PROBE, 65_000).build(),
        Feature::Vxlan => LinkVxlan::new(PROBE, 4_000).port(4789).build(),
        Feature::BridgeVlanFiltering => LinkBridge::new(PROBE).vlan_filtering(true).build(),
        Feature::Vlan => {
            // VLAN needs an Ethernet parent; veth is the one every kernel we run on has.
            handle
                .link()
                .add(LinkVeth::new(PARENT, "ktprobe2").build())
                .execute()
                .await
                .with_context(|| format!("probing {}: creating the veth parent", feature.name()))?;
            cleanup = vec![PARENT];
            LinkVlan::new(PROBE, link_index(handle, PARENT).await?, 4_000).build()
        }
    };
    let created = match handle.link().add(message).execute().await {
        Ok(()) => true,
        Err(e) if is_unsupported(&e) => false,
        Err(e) => return Err(e).with_context(|| format!("probing {}", feature.name())),
    };
    for name in cleanup {
        if let Ok(index) = link_index(handle, name).await {
            handle
                .link()
                .del(index)
                .execute()
                .await
                .with_context(|| format!("deleting probe {name}"))?;
        }
    }
    Ok(created)
}

enum Outcome {
    Ran,
    Skipped(String),
}

/// Runs `body` in a new network namespace on a thread of its own (current-thread tokio runtime, an
/// rtnetlink connection bound to that namespace, `lo` up), after checking the kernel has `needs`.
///
/// Without root, or on a kernel lacking a feature, prints `SKIPPED <test>: <why>` and returns `Ok`,
/// unless [`strict`] (inside the kernel tier), where that is an error. A panic in `body` is re-raised.
pub fn run_in_fresh_netns<F, Fut>(test: &str, needs: &[Feature], body: F) -> Result<()>
where
    F: FnOnce(Handle) -> Fut + Send + 'static,
    Fut: Future<Output = Result<()>>,
{
    let needs = needs.to_vec();
    let thread = std::thread::Builder::new()
        .name(test.to_owned())
        .spawn(move || -> Result<Outcome> {
            // Only this thread moves: the namespace dies with it (and with the sockets opened here).
            match unshare(CloneFlags::CLONE_NEWNET) {
                Ok(()) => {}
                Err(Errno::EPERM) => {
                    return Ok(Outcome::Skipped(
                        "creating a network namespace needs root".into(),
                    ));
                }
                Err(e) => return Err(e).context("unshare(CLONE_NEWNET)"),
            }
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async move {
                let (connection, handle, _) =
                    rtnetlink::new_connection().context("netlink socket")?;
                tokio::spawn(connection);
                let lo = link_index(&handle, "lo").await?;
                handle
                    .link()
                    .set(LinkUnspec::new_with_index(lo).up().build())
                    .execute()
                    .await?;
                let mut missing = Vec::new();
                for feature in needs {
                    if !probe(&handle, feature).await? {
                        missing.push(feature.name());
                    }
                }
                if !missing.is_empty() {
                    return Ok(Outcome::Skipped(format!(
                        "this kernel lacks {} (EOPNOTSUPP)",
                        missing.join(", ")
                    )));
                }
                body(handle).await?;
                Ok(Outcome::Ran)
            })
        })
        .context("spawning the test thread")?;
    let outcome = match thread.join() {
        Ok(outcome) => outcome?,
        Err(panic) => std::panic::resume_unwind(panic),
    };
    match outcome {
        Outcome::Ran => Ok(()),
        Outcome::Skipped(why) if strict() => {
            bail!("{test}: {why}; the kernel tier ({STRICT_ENV}=1) must provide it")
        }
        Outcome::Skipped(why) => {
            println!(
                "SKIPPED {test}: {why}; it runs in the kernel tier (tests/kernel-tier/run.sh)"
            );
            Ok(())
        }
    }
}

/// The link called `name`.
pub async fn link(handle: &Handle, name: &str) -> Result<LinkMessage> {
    handle
        .link()
        .get()
        .match_name(name.to_owned())
        .execute()
        .try_next()
        .await
        .with_context(|| format!("looking up link {name}"))?
        .with_context(|| format!("link {name} not found"))
}

pub async fn link_index(handle: &Handle, name: &str) -> Result<u32> {
    Ok(link(handle, name).await?.header.index)
}

/// The `IFLA_INFO_KIND` of a link (`vrf`, `vlan`, `bridge`, …).
pub fn kind(link: &LinkMessage) -> Option<&InfoKind> {
    link_info(link).find_map(|info| match info {
        LinkInfo::Kind(kind) => Some(kind),
        _ => None,
    })
}

/// The kind-specific attributes of a link (`IFLA_INFO_DATA`).
pub fn info_data(link: &LinkMessage) -> Option<&InfoData> {
    link_info(link).find_map(|info| match info {
        LinkInfo::Data(data) => Some(data),
        _ => None,
    })
}

fn link_info(link: &LinkMessage) -> impl Iterator<Item = &LinkInfo> {
    link.attributes
        .iter()
        .filter_map(|attr| match attr {
            LinkAttribute::LinkInfo(infos) => Some(infos),
            _ => None,
        })
        .flatten()
}

/// The index of the bridge or VRF a link is enslaved to (`IFLA_MASTER`).
pub fn controller(link: &LinkMessage) -> Option<u32> {
    link.attributes.iter().find_map(|attr| match attr {
        LinkAttribute::Controller(index) => Some(*index),
        _ => None,
    })
}

/// The index of the lower device of a VLAN or veth (`IFLA_LINK`).
pub fn lower(link: &LinkMessage) -> Option<u32> {
    link.attributes.iter().find_map(|attr| match attr {
        LinkAttribute::Link(index) => Some(*index),
        _ => None,
    })
}

/// One IPv4 route as read back from the kernel, reduced to what the tests compare.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route4 {
    pub table: u32,
    pub destination: Ipv4Addr,
    pub prefix_len: u8,
    pub gateway: Option<Ipv4Addr>,
    pub oif: Option<u32>,
}

/// Every IPv4 route in every table of the namespace.
pub async fn routes_v4(handle: &Handle) -> Result<Vec<Route4>> {
    let dump: Vec<RouteMessage> = handle
        .route()
        .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
        .execute()
        .try_collect()
        .await
        .context("dumping IPv4 routes")?;
    Ok(dump.iter().map(route4).collect())
}

/// Reduces a route message to [`Route4`].
pub fn route4(msg: &RouteMessage) -> Route4 {
    let mut route = Route4 {
        table: u32::from(msg.header.table),
        destination: Ipv4Addr::UNSPECIFIED,
        prefix_len: msg.header.destination_prefix_length,
        gateway: None,
        oif: None,
    };
    for attr in &msg.attributes {
        match attr {
            RouteAttribute::Table(table) => route.table = *table,
            RouteAttribute::Destination(RouteAddress::Inet(a)) => route.destination = *a,
            RouteAttribute::Gateway(RouteAddress::Inet(a)) => route.gateway = Some(*a),
            RouteAttribute::Oif(index) => route.oif = Some(*index),
            _ => {}
        }
    }
    route
}
