//! A fleet of "nodes" on one machine: a `fabric` network namespace with a bridge, and one namespace per
//! node wired to it with a veth pair and an underlay address in 198.18.0.0/15.
//!
//! ```text
//!   <run>-fabric:   br0 ─┬─ v<id>n0 ══ veth ══ eth0  <run>-node0  198.18.0.1/16
//!                        ├─ v<id>n1 ══ veth ══ eth0  <run>-node1  198.18.0.2/16
//!                        └─ …
//! ```
//!
//! Every name carries a per-run prefix that includes our process id, so parallel runs never collide and
//! [`sweep_stale`] can remove what a SIGKILLed run left behind. Namespaces are deleted on drop — also when a
//! test panics — and deleting a namespace deletes every link in it.

use std::net::Ipv4Addr;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result, bail};

/// Prefix of every namespace this harness creates: `nwt<pid>x<seq>-…`.
pub const NETNS_PREFIX: &str = "nwt";

/// Runs a command, failing with its stderr when it exits non-zero.
pub fn run(program: &str, args: &[&str]) -> Result<Output> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}

/// `ip` with the given arguments.
pub fn ip(args: &[&str]) -> Result<String> {
    Ok(String::from_utf8_lossy(&run("ip", args)?.stdout).into_owned())
}

pub fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

/// One node's namespace.
#[derive(Clone, Debug)]
pub struct NodeNs {
    /// Node name as the fleet knows it (`node-0`, …).
    pub name: String,
    /// Network namespace name.
    pub netns: String,
    pub underlay: Ipv4Addr,
}

/// The fabric and node namespaces of one run. Dropping it deletes them all.
#[derive(Debug)]
pub struct NetnsFleet {
    pub run_id: String,
    pub fabric: String,
    pub nodes: Vec<NodeNs>,
    /// Workload namespaces (one per node at most), deleted with the fleet.
    pub workloads: Vec<String>,
    /// Index of the next node (names are never reused within a run).
    next_index: usize,
    /// Names only, nothing created (the no-kernel mode of the demo).
    planned_only: bool,
}

static RUNS: AtomicU32 = AtomicU32::new(0);

/// Underlay prefix length: one flat L2 underlay for up to 65k nodes.
pub const UNDERLAY_PREFIX_LEN: u8 = 16;

impl NetnsFleet {
    /// Builds the fabric and `n` nodes. Needs root.
    pub fn build(n: usize) -> Result<Self> {
        if !is_root() {
            bail!("building network namespaces needs root");
        }
        sweep_stale();
        let seq = RUNS.fetch_add(1, Ordering::Relaxed);
        let run_id = format!("{NETNS_PREFIX}{}x{seq}", std::process::id());
        let mut fleet = NetnsFleet {
            fabric: format!("{run_id}-fabric"),
            run_id,
            nodes: Vec::new(),
            workloads: Vec::new(),
            next_index: 0,
            planned_only: false,
        };
        // From here on, drop cleans up whatever was created, also on an early return.
        ip(&["netns", "add", &fleet.fabric])?;
        ip(&["-n", &fleet.fabric, "link", "add", "br0", "type", "bridge"])?;
        // A bridge without a set address takes the lowest MAC of its ports, so it changes whenever a
        // node joins or leaves; every node's ARP entry for the fabric address (the agents' probe target)
        // then points nowhere for tens of seconds. Pin it.
        ip(&[
            "-n",
            &fleet.fabric,
            "link",
            "set",
            "br0",
            "address",
            "02:00:00:00:fa:b0",
        ])?;
        ip(&["-n", &fleet.fabric, "link", "set", "br0", "up"])?;
        ip(&["-n", &fleet.fabric, "link", "set", "lo", "up"])?;
        for _ in 0..n {
            fleet.add_node()?;
        }
        Ok(fleet)
    }

    /// Names and addresses of `n` nodes without creating anything (no root needed): for runs whose
    /// agents do not touch the kernel.
    pub fn plan(n: usize) -> Self {
        let seq = RUNS.fetch_add(1, Ordering::Relaxed);
        let run_id = format!("{NETNS_PREFIX}{}x{seq}", std::process::id());
        let mut fleet = NetnsFleet {
            fabric: format!("{run_id}-fabric"),
            run_id,
            nodes: Vec::new(),
            workloads: Vec::new(),
            next_index: 0,
            planned_only: true,
        };
        for _ in 0..n {
            let node = fleet.next_node();
            fleet.nodes.push(node);
        }
        fleet
    }

    fn next_node(&mut self) -> NodeNs {
        let i = self.next_index;
        self.next_index += 1;
        let octets = u32::from(Ipv4Addr::new(198, 18, 0, 0)) + 1 + i as u32;
        NodeNs {
            name: format!("node-{i}"),
            netns: format!("{}-node{i}", self.run_id),
            underlay: Ipv4Addr::from(octets),
        }
    }

    /// Adds one more node (for join-mid-rollout scenarios) and returns it.
    pub fn add_node(&mut self) -> Result<NodeNs> {
        let node = self.next_node();
        if self.planned_only {
            self.nodes.push(node.clone());
            return Ok(node);
        }
        ip(&["netns", "add", &node.netns])?;
        self.nodes.push(node.clone());
        // Fabric-side name must fit in 15 bytes and be unique per run within the fabric namespace.
        let fabric_side = node.name.replace("node-", "n");
        ip(&[
            "-n",
            &self.fabric,
            "link",
            "add",
            &fabric_side,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &node.netns,
        ])?;
        ip(&[
            "-n",
            &self.fabric,
            "link",
            "set",
            &fabric_side,
            "master",
            "br0",
            "up",
        ])?;
        let addr = format!("{}/{UNDERLAY_PREFIX_LEN}", node.underlay);
        ip(&["-n", &node.netns, "addr", "add", &addr, "dev", "eth0"])?;
        ip(&["-n", &node.netns, "link", "set", "eth0", "up"])?;
        ip(&["-n", &node.netns, "link", "set", "lo", "up"])?;
        Ok(node)
    }

    /// Removes a node's namespace (for leave-mid-rollout scenarios).
    pub fn remove_node(&mut self, name: &str) -> Result<()> {
        let Some(pos) = self.nodes.iter().position(|n| n.name == name) else {
            bail!("no node {name}");
        };
        let node = self.nodes.remove(pos);
        if !self.planned_only {
            ip(&["netns", "del", &node.netns])?;
            // The kernel tears a deleted namespace down asynchronously: until its veth is gone from the
            // fabric, the "removed" node still answers. Wait for that, so callers see it gone.
            let fabric_side = node.name.replace("node-", "n");
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while ip(&["-n", &self.fabric, "link", "show", &fabric_side]).is_ok() {
                if std::time::Instant::now() >= deadline {
                    bail!(
                        "{}'s veth {fabric_side} still on the fabric 10s after deleting its namespace",
                        node.name
                    );
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        Ok(())
    }

    pub fn node(&self, name: &str) -> Option<&NodeNs> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// Runs `ip` inside a node's namespace.
    pub fn ip_in(&self, node: &str, args: &[&str]) -> Result<String> {
        let ns = &self
            .node(node)
            .with_context(|| format!("no node {node}"))?
            .netns;
        let mut full = vec!["-n", ns.as_str()];
        full.extend_from_slice(args);
        ip(&full)
    }

    /// Pings `target` once from inside `node`'s namespace; true if a reply came back. A missing `ping`
    /// is an error, never an unanswered ping.
    pub fn ping(&self, node: &str, target: &str) -> Result<bool> {
        require_ping()?;
        let ns = &self
            .node(node)
            .with_context(|| format!("no node {node}"))?
            .netns;
        let status = Command::new("ip")
            .args([
                "netns", "exec", ns, "ping", "-c", "1", "-W", "2", "-q", target,
            ])
            .output()
            .context("running ping")?
            .status;
        Ok(status.success())
    }
}

impl NetnsFleet {
    /// Probes VRF support in the fabric namespace (a throwaway VRF device).
    pub fn kernel_has_vrf(&self) -> bool {
        vrf_probe(&self.fabric)
    }

    /// Wires the root namespace into the fabric bridge: a veth with `host_cidr` on the root side (so
    /// processes in the root namespace, like the API server, are reachable from every node), and
    /// `fabric_cidr` on the fabric bridge itself (a probe target outside every node). Deleted with the
    /// fabric namespace.
    pub fn wire_host(&self, host_cidr: &str, fabric_cidr: &str) -> Result<String> {
        let host_side = self.run_id.replacen(NETNS_PREFIX, "nwh", 1);
        ip(&[
            "link",
            "add",
            &host_side,
            "type",
            "veth",
            "peer",
            "name",
            "host",
            "netns",
            &self.fabric,
        ])?;
        ip(&["addr", "add", host_cidr, "dev", &host_side])?;
        ip(&["link", "set", &host_side, "up"])?;
        ip(&[
            "-n",
            &self.fabric,
            "link",
            "set",
            "host",
            "master",
            "br0",
            "up",
        ])?;
        ip(&["-n", &self.fabric, "addr", "add", fabric_cidr, "dev", "br0"])?;
        Ok(host_side)
    }

    /// A workload namespace for `node`: a veth whose node end (`wl0`) is a port of `bridge` and whose
    /// other end holds `cidr` with a default route via `gateway`. The node end is not marked as managed,
    /// so the agent leaves it alone. Returns the workload namespace's name.
    pub fn add_workload(
        &mut self,
        node: &str,
        bridge: &str,
        cidr: &str,
        gateway: &str,
    ) -> Result<String> {
        self.add_workload_on(node, 0, bridge, cidr, gateway)
    }

    /// Like [`NetnsFleet::add_workload`], workload number `k` of `node` (node end `wl<k>`): a node can
    /// hold workloads on several segments at once.
    pub fn add_workload_on(
        &mut self,
        node: &str,
        k: u8,
        bridge: &str,
        cidr: &str,
        gateway: &str,
    ) -> Result<String> {
        let nns = self
            .node(node)
            .with_context(|| format!("no node {node}"))?
            .netns
            .clone();
        let suffix = nns.rsplit("-node").next().unwrap_or_default();
        let wns = match k {
            0 => format!("{}-w{suffix}", self.run_id),
            k => format!("{}-w{suffix}-{k}", self.run_id),
        };
        let port = format!("wl{k}");
        if self.workloads.contains(&wns) {
            let _ = ip(&["netns", "del", &wns]);
            self.workloads.retain(|w| w != &wns);
        }
        ip(&["netns", "add", &wns])?;
        self.workloads.push(wns.clone());
        ip(&[
            "-n", &nns, "link", "add", &port, "mtu", "9000", "type", "veth", "peer", "name",
            "eth0", "mtu", "9000", "netns", &wns,
        ])?;
        ip(&["-n", &nns, "link", "set", &port, "master", bridge, "up"])?;
        ip(&["-n", &wns, "addr", "add", cidr, "dev", "eth0"])?;
        ip(&["-n", &wns, "link", "set", "eth0", "up"])?;
        ip(&["-n", &wns, "link", "set", "lo", "up"])?;
        ip(&["-n", &wns, "route", "add", "default", "via", gateway])?;
        Ok(wns)
    }
}

impl NetnsFleet {
    /// A host behind `node`'s trunk: a veth `trunk` in the node (up, no address: the agent puts VLAN
    /// sub-interfaces on it) whose other end `eth0` is in a namespace of its own, deleted with the fleet.
    /// Returns that namespace. The host tags its own frames (`ip link add link eth0 … type vlan`).
    pub fn add_trunk_host(&mut self, node: &str, trunk: &str) -> Result<String> {
        let nns = self
            .node(node)
            .with_context(|| format!("no node {node}"))?
            .netns
            .clone();
        let tns = trunk_host_ns(&nns);
        ip(&["netns", "add", &tns])?;
        self.workloads.push(tns.clone());
        ip(&[
            "-n", &nns, "link", "add", trunk, "mtu", "9000", "type", "veth", "peer", "name",
            "eth0", "mtu", "9000", "netns", &tns,
        ])?;
        ip(&["-n", &nns, "link", "set", trunk, "up"])?;
        ip(&["-n", &tns, "link", "set", "eth0", "up"])?;
        ip(&["-n", &tns, "link", "set", "lo", "up"])?;
        Ok(tns)
    }
}

/// Whether the kernel can create VRF devices, probed in a namespace of its own (created and deleted
/// here), for tests that decide before any fleet exists. Needs root.
pub fn kernel_has_vrf() -> bool {
    let ns = format!("nwvrfprobe{}", std::process::id());
    if ip(&["netns", "add", &ns]).is_err() {
        return false;
    }
    let ok = vrf_probe(&ns);
    let _ = ip(&["netns", "del", &ns]);
    ok
}

/// Creates and deletes a throwaway VRF device in namespace `ns`.
fn vrf_probe(ns: &str) -> bool {
    let ok = ip(&[
        "-n", ns, "link", "add", "vrfprobe", "type", "vrf", "table", "4242",
    ])
    .is_ok();
    let _ = ip(&["-n", ns, "link", "del", "vrfprobe"]);
    ok
}

/// The namespace of the host behind the trunk of the node in namespace `node_ns`.
pub fn trunk_host_ns(node_ns: &str) -> String {
    format!("{node_ns}-trunk")
}

/// `ping` is on the PATH, or an error saying how to install it: without it every data-plane check
/// would read as a dead data plane.
pub fn require_ping() -> Result<()> {
    let found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("ping").is_file()));
    if found {
        Ok(())
    } else {
        bail!(
            "ping is not installed, so the data plane cannot be checked: apt-get install iputils-ping (or make deps)"
        )
    }
}

/// Pings `target` once from inside namespace `ns`; true if a reply came back. Panics when `ping` is not
/// installed (a missing tool is not an unanswered ping).
pub fn ping_in(ns: &str, target: &str) -> bool {
    if let Err(e) = require_ping() {
        panic!("{e:#}");
    }
    Command::new("ip")
        .args([
            "netns", "exec", ns, "ping", "-c", "1", "-W", "1", "-q", target,
        ])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

impl Drop for NetnsFleet {
    fn drop(&mut self) {
        if self.planned_only {
            return;
        }
        for w in &self.workloads {
            let _ = ip(&["netns", "del", w]);
        }
        for node in &self.nodes {
            let _ = ip(&["netns", "del", &node.netns]);
        }
        let _ = ip(&["netns", "del", &self.fabric]);
    }
}

/// Deletes namespaces left behind by harness runs whose process no longer exists (a SIGKILLed test
/// cannot run its destructors).
pub fn sweep_stale() {
    let Ok(list) = ip(&["netns", "list"]) else {
        return;
    };
    for line in list.lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let Some(rest) = name.strip_prefix(NETNS_PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('x').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

/// Namespaces currently present that belong to run `run_id`.
pub fn namespaces_of(run_id: &str) -> Vec<String> {
    ip(&["netns", "list"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(run_id))
        .map(str::to_string)
        .collect()
}

/// The workload in `wns` resolves its gateway once, as a booting host does (DHCP, its first routed
/// packet). Its node's gateway, answering, learns the workload's MAC and IP, and EVPN carries that
/// route to the other nodes. Without it a routed flow towards the workload may never start: the
/// gateways share one anycast MAC, so another node's ARP request reaches the workload but the answer
/// is taken by the workload's own node, which did not ask. Best effort: a gateway not yet configured
/// is the caller's to wait for.
pub fn announce(wns: &str, gateway: &str) {
    let _ = Command::new("ip")
        .args([
            "netns", "exec", wns, "ping", "-c", "2", "-i", "0.2", "-W", "1", gateway,
        ])
        .output();
}
