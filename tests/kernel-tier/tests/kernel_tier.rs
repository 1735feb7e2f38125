//! The kernel objects netwave's agent manages on a node, built with rtnetlink and read back through
//! netlink: VRFs with their tables, routes and rules; VLAN sub-interfaces; a VLAN-filtering bridge with a
//! VXLAN port. Each test runs in its own network namespace (see `run_in_fresh_netns`). On the host kernel
//! they skip (it lacks VRF, VLAN, dummy and VLAN filtering); `tests/kernel-tier/run.sh` runs them inside
//! a Debian kernel under qemu, where skipping is an error.

use std::net::{IpAddr, Ipv4Addr};

use anyhow::{Context, Result, ensure};
use futures::TryStreamExt;
use netlink_packet_route::AddressFamily;
use netlink_packet_route::link::{
    AfSpecBridge, BridgeVlanInfoFlags, InfoBridge, InfoData, InfoKind, InfoVlan, InfoVrf,
    InfoVxlan, LinkAttribute, LinkExtentMask, VlanProtocol,
};
use netlink_packet_route::route::RouteFlags;
use netlink_packet_route::rule::{RuleAction, RuleAttribute};
use netwave_kernel_tier::{
    Feature, Route4, controller, errno, info_data, kind, link, link_index, lower, route4,
    routes_v4, run_in_fresh_netns,
};
use nix::errno::Errno;
use rtnetlink::{
    Handle, IpVersion, LinkBridge, LinkBridgeVlan, LinkDummy, LinkUnspec, LinkVeth, LinkVlan,
    LinkVrf, LinkVxlan, RouteMessageBuilder,
};

const BLOCK: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 0);

fn net(third: u8, fourth: u8) -> Ipv4Addr {
    let [a, b, _, _] = BLOCK.octets();
    Ipv4Addr::new(a, b, third, fourth)
}

async fn enslave(handle: &Handle, port: &str, controller: u32) -> Result<()> {
    let index = link_index(handle, port).await?;
    handle
        .link()
        .set(
            LinkUnspec::new_with_index(index)
                .controller(controller)
                .up()
                .build(),
        )
        .execute()
        .await
        .with_context(|| format!("enslaving {port} to link {controller}"))
}

async fn add_address(handle: &Handle, name: &str, address: Ipv4Addr, prefix_len: u8) -> Result<()> {
    let index = link_index(handle, name).await?;
    handle
        .address()
        .add(index, IpAddr::V4(address), prefix_len)
        .execute()
        .await
        .with_context(|| format!("adding {address}/{prefix_len} to {name}"))
}

fn vrf_table(vrf: &netlink_packet_route::link::LinkMessage) -> Option<u32> {
    match info_data(vrf)? {
        InfoData::Vrf(infos) => infos.iter().find_map(|i| match i {
            InfoVrf::TableId(t) => Some(*t),
            _ => None,
        }),
        _ => None,
    }
}

/// `ip route get <target> [oif <index>]`: the route the kernel would use.
async fn route_get(handle: &Handle, target: Ipv4Addr, oif: Option<u32>) -> Result<Route4> {
    let mut query = RouteMessageBuilder::<Ipv4Addr>::new().destination_prefix(target, 32);
    if let Some(index) = oif {
        query = query.output_interface(index);
    }
    let mut query = query.build();
    // Without RTM_F_LOOKUP_TABLE the kernel reports every answer as table main (`ip route get` sets it).
    query.header.flags |= RouteFlags::LookupTable;
    let answer = handle
        .route()
        .get(query)
        .execute()
        .try_next()
        .await
        .with_context(|| format!("route get {target}"))?
        .with_context(|| format!("route get {target}: no answer"))?;
    Ok(route4(&answer))
}

fn in_table(routes: &[Route4], table: u32, destination: Ipv4Addr, prefix_len: u8) -> Vec<Route4> {
    routes
        .iter()
        .filter(|r| r.table == table && r.destination == destination && r.prefix_len == prefix_len)
        .cloned()
        .collect()
}

#[test]
fn kernel_tier_vrf_with_table_route_and_rule() -> Result<()> {
    run_in_fresh_netns(
        "kernel_tier_vrf_with_table_route_and_rule",
        &[Feature::Vrf, Feature::Dummy],
        |h| async move {
            const TABLE: u32 = 1001;
            h.link()
                .add(LinkVrf::new("vrf-red", TABLE).up().build())
                .execute()
                .await?;
            h.link()
                .add(LinkDummy::new("dum-red").build())
                .execute()
                .await?;
            let vrf = link_index(&h, "vrf-red").await?;
            enslave(&h, "dum-red", vrf).await?;
            add_address(&h, "dum-red", net(10, 1), 24).await?;

            let via = RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(net(100, 0), 24)
                .gateway(net(10, 2))
                .table_id(TABLE)
                .build();
            h.route()
                .add(via)
                .execute()
                .await
                .context("route via a gateway in the VRF table")?;

            // Measured pitfall the agent guards against by masking: host bits set → EINVAL.
            let host_bits = RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(net(101, 1), 24)
                .gateway(net(10, 2))
                .table_id(TABLE)
                .build();
            let err = h
                .route()
                .add(host_bits)
                .execute()
                .await
                .err()
                .context("198.18.101.1/24 was accepted")?;
            ensure!(
                errno(&err) == Some(Errno::EINVAL),
                "host bits set: expected EINVAL, got {err}"
            );

            // rtnetlink 0.24 leaves the action unset (the rule then breaks every lookup): set it.
            h.rule()
                .add()
                .v4()
                .table_id(TABLE)
                .priority(1001)
                .action(RuleAction::ToTable)
                .execute()
                .await
                .context("rule lookup 1001")?;

            // Read back.
            let vrf_link = link(&h, "vrf-red").await?;
            ensure!(
                kind(&vrf_link) == Some(&InfoKind::Vrf),
                "vrf-red kind: {:?}",
                kind(&vrf_link)
            );
            ensure!(
                vrf_table(&vrf_link) == Some(TABLE),
                "vrf-red table: {:?}",
                vrf_table(&vrf_link)
            );
            let dummy = link(&h, "dum-red").await?;
            ensure!(
                controller(&dummy) == Some(vrf),
                "dum-red not enslaved to vrf-red: {:?}",
                controller(&dummy)
            );

            let routes = routes_v4(&h).await?;
            let dummy_index = dummy.header.index;
            let expected = Route4 {
                table: TABLE,
                destination: net(100, 0),
                prefix_len: 24,
                gateway: Some(net(10, 2)),
                oif: Some(dummy_index),
            };
            ensure!(
                in_table(&routes, TABLE, net(100, 0), 24) == vec![expected],
                "route 198.18.100.0/24 in table {TABLE}: {routes:#?}"
            );
            ensure!(
                in_table(&routes, TABLE, net(101, 0), 24).is_empty(),
                "rejected route present: {routes:#?}"
            );
            // Enslaving moved the connected route of the port into the VRF table, out of main.
            ensure!(
                in_table(&routes, TABLE, net(10, 0), 24).len() == 1,
                "connected route not in {TABLE}: {routes:#?}"
            );
            ensure!(
                in_table(&routes, 254, net(10, 0), 24).is_empty(),
                "connected route leaked to main: {routes:#?}"
            );

            let rules: Vec<_> = h.rule().get(IpVersion::V4).execute().try_collect().await?;
            let ours: Vec<_> = rules
                .iter()
                .filter(|r| r.attributes.contains(&RuleAttribute::Priority(1001)))
                .collect();
            ensure!(
                ours.len() == 1,
                "expected one rule with priority 1001: {rules:#?}"
            );
            ensure!(
                ours[0].header.action == RuleAction::ToTable,
                "rule action: {:?}",
                ours[0].header.action
            );
            ensure!(
                ours[0].attributes.contains(&RuleAttribute::Table(TABLE)),
                "rule table: {:?}",
                ours[0]
            );

            // The kernel resolves through them: bound to the VRF (`ip route get … oif vrf-red`), and
            // unbound through the rule (a rule without action would fail this lookup with EINVAL).
            let target = net(100, 5);
            let bound = route_get(&h, target, Some(vrf)).await?;
            let unbound = route_get(&h, target, None).await?;
            for (how, got) in [("oif vrf-red", bound), ("via rule 1001", unbound)] {
                ensure!(
                    got.table == TABLE
                        && got.gateway == Some(net(10, 2))
                        && got.oif == Some(dummy_index),
                    "route get {target} {how}: {got:?}"
                );
            }
            Ok(())
        },
    )
}

#[test]
fn kernel_tier_vlan_subinterfaces_enslaved_to_vrf() -> Result<()> {
    run_in_fresh_netns(
        "kernel_tier_vlan_subinterfaces_enslaved_to_vrf",
        &[Feature::Vrf, Feature::Vlan, Feature::Dummy, Feature::Veth],
        |h| async move {
            const TABLE: u32 = 1002;
            h.link()
                .add(LinkVrf::new("vrf-blue", TABLE).up().build())
                .execute()
                .await?;
            let vrf = link_index(&h, "vrf-blue").await?;
            h.link()
                .add(LinkDummy::new("trunk0").up().build())
                .execute()
                .await?;
            h.link()
                .add(LinkVeth::new("vt0", "vt1").up().build())
                .execute()
                .await?;
            let trunk = link_index(&h, "trunk0").await?;
            let vt0 = link_index(&h, "vt0").await?;
            h.link()
                .add(LinkVlan::new("trunk0.100", trunk, 100).build())
                .execute()
                .await?;
            h.link()
                .add(LinkVlan::new("vt0.200", vt0, 200).build())
                .execute()
                .await?;
            enslave(&h, "trunk0.100", vrf).await?;
            enslave(&h, "vt0.200", vrf).await?;
            add_address(&h, "trunk0.100", net(20, 1), 24).await?;

            for (name, parent, id) in [("trunk0.100", trunk, 100), ("vt0.200", vt0, 200)] {
                let vlan = link(&h, name).await?;
                ensure!(
                    kind(&vlan) == Some(&InfoKind::Vlan),
                    "{name} kind: {:?}",
                    kind(&vlan)
                );
                ensure!(
                    lower(&vlan) == Some(parent),
                    "{name} lower device: {:?}",
                    lower(&vlan)
                );
                ensure!(
                    controller(&vlan) == Some(vrf),
                    "{name} not in vrf-blue: {:?}",
                    controller(&vlan)
                );
                let Some(InfoData::Vlan(info)) = info_data(&vlan) else {
                    anyhow::bail!("{name}: no VLAN info: {vlan:?}");
                };
                ensure!(info.contains(&InfoVlan::Id(id)), "{name} VLAN id: {info:?}");
                ensure!(
                    info.contains(&InfoVlan::Protocol(VlanProtocol::Ieee8021Q)),
                    "{name} protocol: {info:?}"
                );
            }
            let routes = routes_v4(&h).await?;
            ensure!(
                in_table(&routes, TABLE, net(20, 0), 24).len() == 1,
                "VLAN subnet not in {TABLE}: {routes:#?}"
            );
            Ok(())
        },
    )
}

#[test]
fn kernel_tier_vlan_filtering_bridge_with_vxlan_port_in_vrf() -> Result<()> {
    run_in_fresh_netns(
        "kernel_tier_vlan_filtering_bridge_with_vxlan_port_in_vrf",
        &[
            Feature::Vrf,
            Feature::BridgeVlanFiltering,
            Feature::Vxlan,
            Feature::Veth,
        ],
        |h| async move {
            const TABLE: u32 = 1003;
            h.link()
                .add(LinkVrf::new("vrf-green", TABLE).up().build())
                .execute()
                .await?;
            let vrf = link_index(&h, "vrf-green").await?;
            h.link()
                .add(LinkBridge::new("br100").vlan_filtering(true).up().build())
                .execute()
                .await?;
            let bridge = link_index(&h, "br100").await?;
            let vxlan = LinkVxlan::new("vx100", 100)
                .local(net(30, 1))
                .port(4789)
                .learning(false)
                .build();
            h.link().add(vxlan).execute().await?;
            h.link()
                .add(LinkVeth::new("bp0", "bp1").build())
                .execute()
                .await?;
            enslave(&h, "vx100", bridge).await?;
            enslave(&h, "bp0", bridge).await?;
            enslave(&h, "br100", vrf).await?;
            let bp0 = link_index(&h, "bp0").await?;
            let vlan = LinkBridgeVlan::new(bp0)
                .vlan(
                    100,
                    BridgeVlanInfoFlags::Pvid | BridgeVlanInfoFlags::Untagged,
                )
                .build();
            h.link()
                .set(vlan)
                .execute()
                .await
                .context("bridge vlan add vid 100 dev bp0 pvid untagged")?;

            let br = link(&h, "br100").await?;
            let Some(InfoData::Bridge(info)) = info_data(&br) else {
                anyhow::bail!("br100: no bridge info: {br:?}");
            };
            ensure!(
                info.contains(&InfoBridge::VlanFiltering(true)),
                "br100 vlan_filtering off: {info:?}"
            );
            ensure!(
                controller(&br) == Some(vrf),
                "br100 not in vrf-green: {:?}",
                controller(&br)
            );

            let vx = link(&h, "vx100").await?;
            ensure!(
                controller(&vx) == Some(bridge),
                "vx100 not a port of br100: {:?}",
                controller(&vx)
            );
            let Some(InfoData::Vxlan(info)) = info_data(&vx) else {
                anyhow::bail!("vx100: no VXLAN info: {vx:?}");
            };
            for want in [
                InfoVxlan::Id(100),
                InfoVxlan::Port(4789),
                InfoVxlan::Learning(false),
                InfoVxlan::Local(net(30, 1)),
            ] {
                ensure!(info.contains(&want), "vx100 lacks {want:?}: {info:?}");
            }

            // `bridge vlan show dev bp0`: AF_BRIDGE dump with the compressed VLAN mask.
            let dump: Vec<_> = h
                .link()
                .get()
                .set_filter_mask(
                    AddressFamily::Bridge,
                    vec![LinkExtentMask::BrvlanCompressed],
                )
                .execute()
                .try_collect()
                .await?;
            let port = dump
                .iter()
                .find(|m| m.header.index == bp0)
                .context("bp0 not in the bridge dump")?;
            let vlans: Vec<_> = port
                .attributes
                .iter()
                .filter_map(|a| match a {
                    LinkAttribute::AfSpecBridge(specs) => Some(specs),
                    _ => None,
                })
                .flatten()
                .filter_map(|s| match s {
                    AfSpecBridge::VlanInfo(v) => Some((v.vid, v.flags)),
                    _ => None,
                })
                .collect();
            let pvid = vlans
                .iter()
                .find(|(vid, _)| *vid == 100)
                .context(format!("vid 100 not on bp0: {vlans:?}"))?;
            ensure!(
                pvid.1
                    .contains(BridgeVlanInfoFlags::Pvid | BridgeVlanInfoFlags::Untagged),
                "vid 100 on bp0 not pvid untagged: {vlans:?}"
            );
            Ok(())
        },
    )
}
