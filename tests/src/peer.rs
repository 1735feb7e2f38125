//! The real node's BGP neighbour (`netwave_control_plane::node`): FRR in a namespace of its own wired to the
//! node's eth1, the underlay ConfigMap that names it, and what the real-node tests check through it (the
//! EVPN session, type-3 routes and flood entries; the node's frr.conf). Used by `tests/tests/real_node*.rs`.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use netwave_control_plane::frr::FrrInstance;
use netwave_control_plane::node::{Cluster, NETNS, NODE_ADDR};

use crate::install::until;
use crate::netns::{self, ip};

/// The BGP neighbour of the real node: FRR (zebra + bgpd) in namespace [`PEER_NS`], its eth0
/// (198.19.1.2/30) wired to the node's eth1 (198.19.1.1/30), its own VTEP 198.19.2.2 with the samples'
/// monitoring segment's VNI (1000103, VLAN 103) in a
/// bridge, iBGP (AS 65000) with IPv4 unicast and L2VPN EVPN. Dropping it stops FRR, then deletes the
/// namespace (the veth goes with it).
pub struct Peer {
    frr: Option<FrrInstance>,
}

pub const PEER_NS: &str = "netwave-rn-peer";
pub const PEER_VTEP: &str = "198.19.2.2";

impl Peer {
    pub fn start() -> Result<Peer> {
        let _ = ip(&["netns", "del", PEER_NS]);
        ip(&["netns", "add", PEER_NS])?;
        let mut peer = Peer { frr: None };
        let p = |args: &[&str]| {
            let mut full = vec!["-n", PEER_NS];
            full.extend_from_slice(args);
            ip(&full)
        };
        ip(&[
            "link",
            "add",
            "nwrnpeer0",
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            PEER_NS,
        ])?;
        ip(&["link", "set", "nwrnpeer0", "netns", NETNS, "name", "eth1"])?;
        ip(&["-n", NETNS, "addr", "add", "198.19.1.1/30", "dev", "eth1"])?;
        ip(&["-n", NETNS, "link", "set", "eth1", "up"])?;
        p(&["link", "set", "lo", "up"])?;
        p(&["addr", "add", &format!("{PEER_VTEP}/32"), "dev", "lo"])?;
        p(&["addr", "add", "198.19.1.2/30", "dev", "eth0"])?;
        p(&["link", "set", "eth0", "up"])?;
        // The node's VTEP is its eth0 address, which it does not advertise as a /32 of its own.
        p(&["route", "add", "198.19.0.0/24", "via", "198.19.1.1"])?;
        p(&["link", "add", "br103", "type", "bridge"])?;
        p(&[
            "link",
            "add",
            "vx103",
            "type",
            "vxlan",
            "id",
            "1000103",
            "local",
            PEER_VTEP,
            "dstport",
            "4789",
            "nolearning",
        ])?;
        p(&["link", "set", "vx103", "master", "br103"])?;
        p(&["link", "set", "br103", "up"])?;
        p(&["link", "set", "vx103", "up"])?;
        let frr = FrrInstance::start_in(PEER_NS)?;
        frr.vtysh(&[
            "-c",
            "configure terminal",
            "-c",
            "router bgp 65000",
            "-c",
            &format!("bgp router-id {PEER_VTEP}"),
            "-c",
            "no bgp default ipv4-unicast",
            "-c",
            "no bgp ebgp-requires-policy",
            "-c",
            "neighbor 198.19.1.1 remote-as internal",
            "-c",
            "address-family ipv4 unicast",
            "-c",
            &format!("network {PEER_VTEP}/32"),
            "-c",
            "neighbor 198.19.1.1 activate",
            "-c",
            "exit-address-family",
            "-c",
            "address-family l2vpn evpn",
            "-c",
            "neighbor 198.19.1.1 activate",
            "-c",
            "advertise-all-vni",
            "-c",
            "exit-address-family",
        ])?;
        peer.frr = Some(frr);
        Ok(peer)
    }

    /// `Ok(what it saw)` once the session is up, the peer has the node's type-3 route for VNI 1000103
    /// and each side's kernel floods VNI 1000103 to the other's VTEP; `Err(what is missing)` until then.
    pub fn evpn(&self) -> std::result::Result<String, String> {
        let frr = self.frr.as_ref().ok_or("no FRR")?;
        let summary = frr
            .vtysh(&["-c", "show bgp l2vpn evpn summary json"])
            .map_err(|e| e.to_string())?;
        let json: serde_json::Value = serde_json::from_str(&summary).map_err(|e| e.to_string())?;
        let state = json["peers"]["198.19.1.1"]["state"]
            .as_str()
            .unwrap_or("unknown")
            .to_string();
        if state != "Established" {
            return Err(format!("session {state}: {summary}"));
        }
        let routes = frr
            .vtysh(&["-c", "show bgp l2vpn evpn route type multicast"])
            .map_err(|e| e.to_string())?;
        let from_node = routes
            .lines()
            .any(|l| l.contains("[3]:") && l.contains(&NODE_ADDR.to_string()));
        let (node_fdb, peer_fdb) = (fdb(Some(NETNS)), fdb(Some(PEER_NS)));
        let node_floods = node_fdb.contains(&format!("dst {PEER_VTEP}"));
        let peer_floods = peer_fdb.contains(&format!("dst {NODE_ADDR}"));
        if from_node && node_floods && peer_floods {
            Ok(format!(
                "session {state}, the node's type-3 route at the peer, flood entries node→{PEER_VTEP} \
                 and peer→{NODE_ADDR}"
            ))
        } else {
            Err(format!(
                "session {state}; node's type-3 at the peer: {from_node}; node floods to the peer: \
                 {node_floods}; peer floods to the node: {peer_floods}\n--- peer's type-3 routes\n\
                 {routes}\n--- node's fdb\n{node_fdb}\n--- peer's fdb\n{peer_fdb}"
            ))
        }
    }

    /// Waits up to `within` for [`Peer::evpn`]; fails with what was still missing.
    pub async fn evpn_up(&self, cluster: &Cluster, what: &str, within: Duration) -> Result<String> {
        let last = std::sync::Mutex::new(String::new());
        let r = until(cluster, what, within, || async {
            Ok(match self.evpn() {
                Ok(seen) => Some(seen),
                Err(missing) => {
                    *last.lock().unwrap() = missing;
                    None
                }
            })
        })
        .await;
        r.with_context(|| format!("last seen: {}", last.lock().unwrap()))
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        drop(self.frr.take());
        let _ = ip(&["netns", "del", PEER_NS]);
    }
}

/// `bridge fdb show` (in `netns`).
pub fn fdb(netns: Option<&str>) -> String {
    let mut args = Vec::new();
    if let Some(n) = netns {
        args.extend(["-n", n]);
    }
    args.extend(["fdb", "show"]);
    netns::run("bridge", &args)
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// The underlay of the test's ConfigMap: the peer is the node's one neighbour.
pub const UNDERLAY: &str = "underlay:
  asn: 65000
  neighbors: [{address: 198.19.1.2, remoteAs: internal}]
configDir: /etc/frr
vtySocket: /var/run/frr
runDir: /var/run/frr
";

/// The frr.conf the agent wrote in FRR's config directory is what the NodeNetworkConfig renders to on
/// this node (the underlay of the test's ConfigMap, the node's address as VTEP, the kernel's host name).
pub fn check_frr_conf(frr_dir: &Path, config: &netwave_api::NodeConfig) -> Result<()> {
    use netwave_core::frr::{
        Forwarding, NeighborSettings, RemoteAsSetting, Underlay, UnderlaySettings, render,
    };
    let hostname = netwave_agent::frr::kernel_hostname()?;
    let underlay = Underlay::new(UnderlaySettings {
        asn: 65000,
        vtep_address: NODE_ADDR.to_string(),
        neighbors: vec![NeighborSettings {
            address: Some("198.19.1.2".into()),
            interface: None,
            remote_as: RemoteAsSetting::Keyword("internal".into()),
        }],
        ..UnderlaySettings::default()
    })?
    .with_hostname(&hostname);
    let mut frr = render(config, &underlay)?;
    // The node's forwarding as its kernel has it (the agent renders FRR's view of it).
    let on = |key: &str| -> Result<bool> {
        Ok(ip(&["netns", "exec", NETNS, "sysctl", "-n", key])?.trim() != "0")
    };
    frr.forwarding = Forwarding {
        ipv4: on("net.ipv4.ip_forward")?,
        ipv6: on("net.ipv6.conf.all.forwarding")?,
    };
    let want = frr.to_text();
    let got = std::fs::read_to_string(frr_dir.join("frr.conf"))
        .with_context(|| format!("{}/frr.conf", frr_dir.display()))?;
    if got != want {
        bail!(
            "the node's frr.conf is not what its NodeNetworkConfig renders to:\n--- got\n{got}\n--- want\n{want}"
        );
    }
    Ok(())
}
