//! The whole system on one machine: node namespaces ([`crate::netns`]), the testbed API server, two
//! configurator replicas and one agent per node, all as real processes.
//!
//! ```text
//!   root ns:  netwave-testbed on 198.18.255.254 (veth into the fabric bridge), configurators
//!   fabric:   br0 198.18.255.253 (the agents' ICMP probe target)
//!   node ns:  eth0 198.18.0.x, netwave-agent (`ip netns exec`), optional workload veth on a segment,
//!             with `frr`: zebra + bgpd (iBGP full mesh over eth0, VTEP = 198.18.0.x) that the agent
//!             configures through `--frr-config`
//! ```
//!
//! Remote VTEPs of a layer-2 segment: with `frr`, EVPN type-3 routes make zebra install the VXLAN flood
//! entries (and type-2 the remote MACs); without it a test calls [`Fleet::install_flood_entries`], which
//! puts them in by hand.
//!
//! Dropping a [`Fleet`] kills every process it started (by its own child handles), then deletes its
//! namespaces (which deletes their links and the root-side veth) and its temporary directory. Tests hold
//! [`Fleet::lock`] so that no two fleets overlap, in one process or across test binaries run at once
//! (they share the host address and the fabric's subnet in the root namespace).

use netwave_api::vocab::{ConditionStatus, NodePhase, RevisionPhase, node_conditions};
use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, ResourceExt};
use netwave_api::manifest::Manifest;
use netwave_api::{NetworkConfigRevision, NodeNetworkConfig};
use serde_json::{Value, json};

use crate::netns::{self, NetnsFleet, NodeNs, ip};

/// Root-namespace end of the host veth: the API server listens here.
pub const HOST_ADDR: Ipv4Addr = Ipv4Addr::new(198, 18, 255, 254);
/// Address of the fabric bridge: every agent's ICMP probe target.
pub const PROBE_TARGET: Ipv4Addr = Ipv4Addr::new(198, 18, 255, 253);
/// Default-VRF segment of the samples that reaches every node: the data-plane checks use it.
pub const DATA_VLAN: u16 = 103;
/// Its anycast gateway.
pub const DATA_GATEWAY: &str = "10.250.3.1";
/// Lease the configurators elect a leader with.
pub const LEASE: (&str, &str) = ("netwave-system", "netwave-configurator");

/// Paths of the three binaries.
#[derive(Clone, Debug)]
pub struct Bins {
    pub testbed: PathBuf,
    pub configurator: PathBuf,
    pub agent: PathBuf,
}

/// The workspace root (this crate lives in `tests/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

impl Bins {
    /// Builds the three binaries with cargo (debug profile, the caller's `CARGO_TARGET_DIR`) and returns
    /// their paths. With `NETWAVE_BIN_DIR` set, the binaries already built in that directory: the
    /// full-kernel VM has no cargo, and `tests/run-suites.sh` built them with the workspace's tests.
    /// The agent has the `rendering-drill` feature either way (the workspace's tests turn it on), so
    /// the two builds never relink each other's binary. (`--features rendering-drill` with several
    /// `-p`: the packages that have it; `netwave-agent/rendering-drill` is ignored here.)
    pub fn build() -> Result<Bins> {
        if let Some(dir) = std::env::var_os("NETWAVE_BIN_DIR") {
            return Self::in_dir(Path::new(&dir));
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(&cargo)
            .current_dir(workspace_root())
            .args([
                "build",
                "-q",
                "-p",
                "netwave-testbed",
                "-p",
                "netwave-configurator",
                "-p",
                "netwave-agent",
                "--features",
                "rendering-drill",
                "--bins",
            ])
            .status()
            .with_context(|| format!("running {cargo} build"))?;
        if !status.success() {
            bail!("cargo build of the netwave binaries failed");
        }
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace_root().join("target"));
        Self::in_dir(&target.join("debug"))
    }

    /// The binaries in `dir` (e.g. next to the demo's own executable).
    pub fn in_dir(dir: &Path) -> Result<Bins> {
        let bins = Bins {
            testbed: dir.join("netwave-testbed"),
            configurator: dir.join("netwave-configurator"),
            agent: dir.join("netwave-agent"),
        };
        for b in [&bins.testbed, &bins.configurator, &bins.agent] {
            if !b.exists() {
                bail!(
                    "{} is missing: build with `cargo build -p netwave-testbed -p netwave-configurator -p netwave-agent --bins`",
                    b.display()
                );
            }
        }
        Ok(bins)
    }
}

/// A child process this harness started. Dropping it SIGKILLs and reaps it.
#[derive(Debug)]
pub struct Proc {
    pub name: String,
    pub log: PathBuf,
    child: Child,
}

impl Proc {
    fn spawn(name: &str, mut cmd: Command, log: PathBuf) -> Result<Proc> {
        let file = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        cmd.stdout(Stdio::from(file.try_clone()?))
            .stderr(Stdio::from(file))
            .stdin(Stdio::null());
        let child = cmd.spawn().with_context(|| format!("starting {name}"))?;
        Ok(Proc {
            name: name.into(),
            log,
            child,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL (our own child, by its handle) and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// How to build a fleet.
#[derive(Clone, Debug)]
pub struct FleetOptions {
    pub nodes: usize,
    pub configurators: usize,
    /// `--max-unavailable` of the configurators (the default of `spec.rollout.maxUnavailable`).
    pub max_unavailable: u32,
    /// `--apply-timeout` of the configurators.
    pub apply_timeout: Duration,
    /// Agent health: deadline for probes after an apply.
    pub health_deadline_secs: f64,
    /// Agent health: wait after an apply before probing (widens the apply window for crash tests).
    pub settle_secs: f64,
    /// Real agents in node namespaces (needs root). `false`: no namespaces, API server on 127.0.0.1,
    /// simulated agents in this process ([`simulate_agents`]) that never touch the kernel.
    pub kernel: bool,
    /// Label nodes into pools (`compute`/`storage`) so the VRF-bound samples apply. `None`: label them
    /// only if the kernel supports VRF devices.
    pub pools: Option<bool>,
    /// Which API server the fleet talks to.
    pub server: ApiServer,
    /// A real FRR (zebra + bgpd) in every node namespace, started before the agents, and each agent
    /// started with `--frr-config` pointing at it: iBGP (AS [`FRR_ASN`]) full mesh between the nodes'
    /// underlay addresses, VTEP = the node's underlay address. Needs `kernel`, root and FRR installed.
    /// The node set is fixed: [`Fleet::add_node`] refuses to join a node to a full mesh it is not in.
    pub frr: bool,
    /// Every node gets a trunk `trunk0` (the agent's `--vlan-trunk`: each segment also gets a VLAN
    /// sub-interface on it), a veth whose other end `eth0` is in a namespace of its own, a host behind
    /// the trunk ([`Fleet::trunk_host`]). Needs a kernel with 802.1Q.
    pub vlan_trunk: bool,
}

/// The trunk interface of every node when [`FleetOptions::vlan_trunk`] is on.
pub const TRUNK: &str = "trunk0";

/// The fleet's iBGP AS when [`FleetOptions::frr`] is on.
pub const FRR_ASN: u32 = 65000;

/// The fleet's API server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiServer {
    /// kube-apiserver + etcd built from Go modules (`tests/control-plane`): what a cluster runs.
    Real,
    /// `netwave-testbed`: starts instantly, and injects faults (5xx, 429, cut watches) on request.
    Testbed,
}

impl Default for FleetOptions {
    fn default() -> Self {
        FleetOptions {
            nodes: 6,
            configurators: 2,
            max_unavailable: 2,
            apply_timeout: Duration::from_secs(60),
            // Generous enough that a loaded 2-core CI machine (and the ≈2 s netlink stall a namespace
            // deletion causes elsewhere) does not fail a healthy apply; a broken probe still fails
            // within it.
            health_deadline_secs: 8.0,
            settle_secs: 0.2,
            kernel: true,
            pools: None,
            server: ApiServer::Real,
            frr: false,
            vlan_trunk: false,
        }
    }
}

static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Held while a fleet may exist: the process's own turn ([`LOCK`]) and the machine's (an exclusive lock
/// on [`MACHINE_LOCK`], which the kernel releases when the process ends, however it ends).
pub struct FleetLock {
    _machine: fs::File,
    _process: tokio::sync::MutexGuard<'static, ()>,
}

/// The file whose lock serialises fleets across processes (test binaries run in parallel lanes).
pub const MACHINE_LOCK: &str = "netwave-e2e-fleet.lock";

/// Everything of one run.
pub struct Fleet {
    pub opts: FleetOptions,
    pub net: NetnsFleet,
    pub dir: PathBuf,
    pub url: String,
    pub kubeconfig: PathBuf,
    pub client: Client,
    pub bins: Bins,
    /// The kernel can create VRF devices.
    pub vrf: bool,
    /// Nodes are labelled into pools (VRF-bound samples apply).
    pub pools: bool,
    /// Root-namespace end of the host veth.
    host_link: String,
    testbed: Option<Proc>,
    control_plane: Option<netwave_control_plane::ControlPlane>,
    configurators: Vec<Option<Proc>>,
    agents: BTreeMap<String, Proc>,
    /// FRR per node ([`FleetOptions::frr`]); stopped by pid before the namespaces go.
    frr: BTreeMap<String, netwave_control_plane::frr::FrrInstance>,
    /// When the first node's zebra was started.
    pub frr_started: Option<Instant>,
    restarts: BTreeMap<String, u32>,
    /// `--metrics-addr` of each configurator replica (by index), kept after it stops (a scrape target).
    configurator_metrics: BTreeMap<usize, std::net::SocketAddr>,
    simulator: Option<tokio::task::JoinHandle<()>>,
}

impl Fleet {
    /// Serialises fleets within one process and across processes (they share the host address). A
    /// failed test releases it like a passing one (no poisoning); a process that dies releases it too.
    pub async fn lock() -> FleetLock {
        let process = LOCK.lock().await;
        let machine = netwave_control_plane::machine_lock(MACHINE_LOCK, "fleet")
            .await
            .expect("the fleet lock file can be opened and locked");
        FleetLock {
            _machine: machine,
            _process: process,
        }
    }

    /// Builds namespaces, starts the API server, creates Nodes, starts agents and configurators.
    pub async fn start(bins: Bins, opts: FleetOptions) -> Result<Fleet> {
        let (net, vrf, host_link, bind) = if opts.kernel {
            let net = NetnsFleet::build(opts.nodes)?;
            let vrf = net.kernel_has_vrf();
            let host_link =
                net.wire_host(&format!("{HOST_ADDR}/16"), &format!("{PROBE_TARGET}/16"))?;
            (net, vrf, host_link, HOST_ADDR)
        } else {
            (
                NetnsFleet::plan(opts.nodes),
                false,
                String::new(),
                Ipv4Addr::LOCALHOST,
            )
        };
        if opts.frr {
            if !opts.kernel {
                bail!("FleetOptions::frr needs kernel (real agents in node namespaces)");
            }
            if !netwave_control_plane::frr::installed() {
                bail!("FleetOptions::frr: {}", netwave_control_plane::frr::INSTALL);
            }
        }
        let pools = opts.pools.unwrap_or(vrf);
        let dir = std::env::temp_dir().join(&net.run_id);
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        let (url, kubeconfig, client, testbed, control_plane) = match opts.server {
            ApiServer::Testbed => {
                let (url, kubeconfig, client, testbed) = start_testbed(&bins, &dir, bind).await?;
                (url, kubeconfig, client, Some(testbed), None)
            }
            ApiServer::Real => {
                let cp =
                    netwave_control_plane::ControlPlane::start(netwave_control_plane::Options {
                        bind: bind.into(),
                        ..Default::default()
                    })
                    .await?;
                let client = cp.client().await?;
                cp.install_crds(&client, netwave_api::crds().into_iter().map(|(_, c)| c))
                    .await?;
                let url = format!("https://{}", cp.addr());
                (url, cp.kubeconfig().to_path_buf(), client, None, Some(cp))
            }
        };
        let mut fleet = Fleet {
            opts: opts.clone(),
            net,
            dir,
            url,
            kubeconfig,
            client,
            bins,
            vrf,
            pools,
            host_link,
            testbed,
            control_plane,
            configurators: Vec::new(),
            agents: BTreeMap::new(),
            frr: BTreeMap::new(),
            frr_started: None,
            restarts: BTreeMap::new(),
            configurator_metrics: BTreeMap::new(),
            simulator: None,
        };
        Api::<Namespace>::all(fleet.client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": LEASE.0}}))?,
            )
            .await?;
        fs::write(
            fleet.dir.join("health.yaml"),
            format!(
                "icmp: [\"{PROBE_TARGET}\"]\napiServer: true\nattemptTimeoutSeconds: 1\n\
                 deadlineSeconds: {}\nsettleSeconds: {}\nbackoffInitialSeconds: 0.2\n\
                 backoffMaxSeconds: 1\ntaints: []\n",
                opts.health_deadline_secs, opts.settle_secs
            ),
        )?;
        let nodes: Vec<NodeNs> = fleet.net.nodes.clone();
        if opts.frr {
            fleet.start_frr()?;
        }
        if opts.vlan_trunk {
            for n in &nodes {
                fleet.net.add_trunk_host(&n.name, TRUNK)?;
            }
        }
        for n in &nodes {
            fleet.create_node(n).await?;
            if opts.kernel {
                fleet.start_agent(&n.name)?;
            }
        }
        if !opts.kernel {
            fleet.simulator = Some(simulate_agents(fleet.client.clone()));
        }
        for i in 0..opts.configurators {
            fleet.configurators.push(None);
            fleet.start_configurator(i)?;
        }
        Ok(fleet)
    }

    /// Starts FRR in every node namespace and writes each node's `--frr-config`: iBGP full mesh over the
    /// underlay, VTEP = the node's underlay address, every FRR path in the instance's own dir.
    fn start_frr(&mut self) -> Result<()> {
        self.frr_started = Some(Instant::now());
        let nodes = self.net.nodes.clone();
        for n in &nodes {
            // Forwarding on, as on a node: FRR shows `no ip forwarding` otherwise, which the rendered
            // config leaves out, so every reload would see a diff (FRR-LAB.md §7).
            netns::run(
                "ip",
                &[
                    "netns",
                    "exec",
                    &n.netns,
                    "sysctl",
                    "-qw",
                    "net.ipv4.ip_forward=1",
                    "net.ipv6.conf.all.forwarding=1",
                ],
            )?;
            let fr = netwave_control_plane::frr::FrrInstance::start_in(&n.netns)
                .with_context(|| format!("starting FRR on {}", n.name))?;
            let d = fr.dir().display().to_string();
            self.frr.insert(n.name.clone(), fr);
            let neighbors: String = nodes
                .iter()
                .filter(|p| p.name != n.name)
                .map(|p| format!("    - {{address: {}, remoteAs: internal}}\n", p.underlay))
                .collect();
            fs::write(
                self.frr_config(&n.name),
                format!(
                    "underlay:\n  asn: {FRR_ASN}\n  vtepAddress: {}\n  neighbors:\n{neighbors}  \
                     timers: {{keepalive: 1, hold: 3}}\nconfigDir: {d}\nvtySocket: {d}\nrunDir: {d}\n",
                    n.underlay
                ),
            )?;
        }
        Ok(())
    }

    /// The namespace of the host behind `node`'s trunk ([`FleetOptions::vlan_trunk`]): its `eth0` is
    /// the other end of the node's [`TRUNK`].
    pub fn trunk_host(&self, node: &str) -> Result<String> {
        let ns = netns::trunk_host_ns(&self.net.node(node).context("no such node")?.netns);
        if !self.net.workloads.contains(&ns) {
            bail!("{node} has no trunk (FleetOptions::vlan_trunk is off)");
        }
        Ok(ns)
    }

    /// The `--frr-config` file of `node`.
    pub fn frr_config(&self, node: &str) -> PathBuf {
        self.dir.join(format!("frr-{node}.yaml"))
    }

    /// The FRR instance of `node` ([`FleetOptions::frr`]): `vtysh` on its sockets, its pids.
    pub fn frr(&self, node: &str) -> Option<&netwave_control_plane::frr::FrrInstance> {
        self.frr.get(node)
    }

    /// `bridge fdb show dev <dev>` in `node`'s namespace, one entry a line.
    pub fn fdb(&self, node: &str, dev: &str) -> Result<Vec<String>> {
        let ns = &self.net.node(node).context("no such node")?.netns;
        let out = netns::run("bridge", &["-n", ns, "fdb", "show", "dev", dev])?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect())
    }

    fn pool_of(&self, node: &str) -> Option<&'static str> {
        if !self.pools {
            return None;
        }
        let i: usize = node.rsplit('-').next()?.parse().ok()?;
        Some(if i.is_multiple_of(2) {
            "compute"
        } else {
            "storage"
        })
    }

    async fn create_node(&self, n: &NodeNs) -> Result<()> {
        let mut labels = json!({"kubernetes.io/hostname": n.name});
        if let Some(pool) = self.pool_of(&n.name) {
            labels["node-restriction.kubernetes.io/netwave-pool"] = json!(pool);
        }
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": n.name, "labels": labels},
            "spec": {},
            "status": {
                "conditions": [{"type": node_conditions::READY, "status": ConditionStatus::True.as_str()}],
                "addresses": [{"type": "InternalIP", "address": n.underlay.to_string()}],
            },
        }))?;
        let api = Api::<Node>::all(self.client.clone());
        api.create(&PostParams::default(), &node)
            .await
            .with_context(|| format!("creating Node {}", n.name))?;
        // An API server ignores status on create: the kubelet reports it through the subresource.
        api.patch_status(
            &n.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": node.status})),
        )
        .await
        .with_context(|| format!("setting the status of Node {}", n.name))?;
        Ok(())
    }

    /// Starts (or restarts) the agent of `node` inside its namespace.
    pub fn start_agent(&mut self, node: &str) -> Result<u32> {
        self.start_agent_with(node, &[])
    }

    /// As [`Fleet::start_agent`], with more environment (`NETWAVE_RENDERING_DRILL`: another agent
    /// release's rendering).
    pub fn start_agent_with(&mut self, node: &str, env: &[(&str, &str)]) -> Result<u32> {
        let n = self.net.node(node).context("no such node")?.clone();
        let state = self.dir.join("state").join(node);
        fs::create_dir_all(&state)?;
        let count = self.restarts.entry(node.into()).or_insert(0);
        let log = self.dir.join(format!("agent-{node}.{count}.log"));
        *count += 1;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &n.netns])
            .arg(&self.bins.agent)
            .args(["--node-name", node, "--state-dir"])
            .arg(&state)
            .arg("--health-config")
            .arg(self.dir.join("health.yaml"))
            .args(["--vxlan-local", &n.underlay.to_string(), "--kubeconfig"])
            .arg(&self.kubeconfig)
            .arg("--metrics-addr")
            .arg(agent_metrics_addr(&n).to_string())
            .args([
                "--health-addr",
                "127.0.0.1:8082",
                "--log-format",
                "text",
                "--drift-interval",
                "60s",
                "--protect",
                "eth0,wl0",
            ])
            .env("RUST_LOG", "info")
            .envs(env.iter().copied());
        if self.frr.contains_key(node) {
            cmd.arg("--frr-config").arg(self.frr_config(node));
        }
        if self.opts.vlan_trunk {
            cmd.args(["--vlan-trunk", TRUNK]);
        }
        let p = Proc::spawn(&format!("agent {node}"), cmd, log)?;
        let pid = p.pid();
        self.agents.insert(node.into(), p);
        Ok(pid)
    }

    /// Where `node`'s agent serves /metrics: its underlay address, reachable from the root namespace.
    pub fn agent_metrics_addr(&self, node: &str) -> Option<std::net::SocketAddr> {
        self.net.node(node).map(agent_metrics_addr)
    }

    /// Where each configurator replica started so far serves /metrics (stopped ones included).
    pub fn configurator_metrics_addrs(&self) -> Vec<std::net::SocketAddr> {
        self.configurator_metrics.values().copied().collect()
    }

    /// The agent's state directory (backup, applying marker).
    pub fn state_dir(&self, node: &str) -> PathBuf {
        self.dir.join("state").join(node)
    }

    /// SIGKILLs the agent of `node` (our child, by id).
    pub fn kill_agent(&mut self, node: &str) {
        if let Some(mut p) = self.agents.remove(node) {
            p.kill();
        }
    }

    pub fn start_configurator(&mut self, i: usize) -> Result<()> {
        let mut cmd = Command::new(&self.bins.configurator);
        let identity = format!("configurator-{i}");
        let metrics = std::net::SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
        self.configurator_metrics.insert(i, metrics);
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args([
                "--lease-namespace",
                LEASE.0,
                "--lease-name",
                LEASE.1,
                "--identity",
                &identity,
            ])
            .args(netwave_configurator::testing::LEASE_TIMINGS)
            .args([
                "--max-unavailable",
                &self.opts.max_unavailable.to_string(),
                "--apply-timeout",
                &format!("{}s", self.opts.apply_timeout.as_secs().max(1)),
                "--metrics-addr",
                &metrics.to_string(),
                "--health-addr",
                &format!("127.0.0.1:{}", free_port()),
                "--log-format",
                "text",
            ])
            .env("RUST_LOG", "info");
        let log = self.dir.join(format!("{identity}.log"));
        let p = Proc::spawn(&identity, cmd, log)?;
        self.configurators[i] = Some(p);
        Ok(())
    }

    /// The current Lease holder's identity.
    pub async fn leader(&self) -> Result<Option<String>> {
        let lease = Api::<Lease>::namespaced(self.client.clone(), LEASE.0)
            .get_opt(LEASE.1)
            .await?;
        Ok(lease
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty()))
    }

    /// SIGKILLs the configurator holding the Lease; returns its identity.
    pub async fn kill_leader(&mut self) -> Result<String> {
        let leader = self.leader().await?.context("no leader yet")?;
        let i: usize = leader
            .strip_prefix("configurator-")
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("unknown leader {leader}"))?;
        if let Some(mut p) = self.configurators.get_mut(i).and_then(Option::take) {
            p.kill();
        }
        Ok(leader)
    }

    /// SIGKILLs configurator replica `i` (our child, by id), if it runs.
    pub fn stop_configurator(&mut self, i: usize) {
        if let Some(mut p) = self.configurators.get_mut(i).and_then(Option::take) {
            p.kill();
        }
    }

    /// Number of configurator processes still running.
    pub fn configurators_running(&mut self) -> usize {
        let mut n = 0;
        for p in self.configurators.iter_mut().flatten() {
            if p.is_running() {
                n += 1;
            }
        }
        n
    }

    /// Adds a node: namespace, Node object, agent.
    pub async fn add_node(&mut self) -> Result<String> {
        if self.opts.frr {
            bail!(
                "add_node with FleetOptions::frr: the other nodes' full mesh does not know the new node"
            );
        }
        let n = self.net.add_node()?;
        self.create_node(&n).await?;
        if self.opts.kernel {
            self.start_agent(&n.name)?;
        }
        Ok(n.name)
    }

    /// Removes a node: stops its agent, deletes the Node, deletes its namespace.
    pub async fn remove_node(&mut self, node: &str) -> Result<()> {
        self.kill_agent(node);
        // Deleting a namespace does not end the processes in it.
        self.frr.remove(node);
        Api::<Node>::all(self.client.clone())
            .delete(node, &DeleteParams::default())
            .await?;
        self.net.remove_node(node)
    }

    pub fn node_names(&self) -> Vec<String> {
        self.net.nodes.iter().map(|n| n.name.clone()).collect()
    }

    // ---- API ----

    /// Creates every object of `manifests` (inputs only).
    pub async fn apply(&self, manifests: &[Manifest]) -> Result<()> {
        let pp = PostParams::default();
        for m in manifests {
            let Manifest::Input(o) = m else {
                bail!("{} is not an input object", m.name());
            };
            Api::<DynamicObject>::all_with(self.client.clone(), &o.kind().api_resource())
                .create(&pp, &o.to_dynamic())
                .await?;
        }
        Ok(())
    }

    /// Creates a RoutingTable from JSON.
    pub async fn create_routing_table(&self, obj: Value) -> Result<()> {
        let rt: netwave_api::RoutingTable = serde_json::from_value(obj)?;
        Api::all(self.client.clone())
            .create(&PostParams::default(), &rt)
            .await?;
        Ok(())
    }

    pub async fn create_layer2(&self, obj: Value) -> Result<()> {
        let l2: netwave_api::Layer2NetworkConfiguration = serde_json::from_value(obj)?;
        Api::all(self.client.clone())
            .create(&PostParams::default(), &l2)
            .await?;
        Ok(())
    }

    pub async fn delete_layer2(&self, name: &str) -> Result<()> {
        Api::<netwave_api::Layer2NetworkConfiguration>::all(self.client.clone())
            .delete(name, &DeleteParams::default())
            .await?;
        Ok(())
    }

    pub async fn delete_routing_table(&self, name: &str) -> Result<()> {
        Api::<netwave_api::RoutingTable>::all(self.client.clone())
            .delete(name, &DeleteParams::default())
            .await?;
        Ok(())
    }

    /// Merge-patches a Layer2NetworkConfiguration's spec.
    pub async fn patch_layer2(&self, name: &str, spec: Value) -> Result<()> {
        Api::<netwave_api::Layer2NetworkConfiguration>::all(self.client.clone())
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": spec })),
            )
            .await?;
        Ok(())
    }

    /// Re-arms a failed revision (`spec.retry`, what an admin does after fixing the cause).
    pub async fn retry(&self, revision: &str, retry: u32) -> Result<()> {
        Api::<NetworkConfigRevision>::all(self.client.clone())
            .patch(
                revision,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"retry": retry}})),
            )
            .await?;
        Ok(())
    }

    /// Revisions by sequence.
    pub async fn revisions(&self) -> Result<Vec<NetworkConfigRevision>> {
        let mut list = Api::<NetworkConfigRevision>::all(self.client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        list.sort_by_key(|r| r.spec.sequence);
        Ok(list)
    }

    pub async fn configs(&self) -> Result<BTreeMap<String, NodeNetworkConfig>> {
        Ok(Api::<NodeNetworkConfig>::all(self.client.clone())
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .map(|c| (c.name_any(), c))
            .collect())
    }

    /// Waits for a revision with a sequence above `after` and returns it.
    pub async fn wait_new_revision(
        &self,
        after: u64,
        timeout: Duration,
    ) -> Result<NetworkConfigRevision> {
        self.eventually(timeout, "a new revision", || async {
            let revs = self.revisions().await.map_err(|e| e.to_string())?;
            revs.into_iter()
                .rfind(|r| r.spec.sequence > after)
                .ok_or_else(|| format!("none above sequence {after}"))
        })
        .await
    }

    /// Waits until the newest revision (sequence above `after`) reaches one of `phases` and returns it.
    /// Inputs created one by one can yield intermediate revisions that the next one supersedes; this
    /// follows whichever is newest.
    pub async fn wait_latest(
        &self,
        after: u64,
        phases: &[RevisionPhase],
        timeout: Duration,
    ) -> Result<NetworkConfigRevision> {
        self.eventually(
            timeout,
            &format!("the newest revision in {phases:?}"),
            || async {
                let revs = self.revisions().await.map_err(|e| e.to_string())?;
                match revs.into_iter().rfind(|r| r.spec.sequence > after) {
                    Some(r) if reached(&r, phases) => Ok(r),
                    Some(r) => Err(format!("{:?} is {:?}", r.metadata.name, phase(&r))),
                    None => Err(format!("no revision above sequence {after}")),
                }
            },
        )
        .await
    }

    /// Waits until revision `name` reaches one of `phases`; returns it.
    pub async fn wait_phase(
        &self,
        name: &str,
        phases: &[RevisionPhase],
        timeout: Duration,
    ) -> Result<NetworkConfigRevision> {
        self.eventually(
            timeout,
            &format!("revision {name} in {phases:?}"),
            || async {
                let r = Api::<NetworkConfigRevision>::all(self.client.clone())
                    .get(name)
                    .await
                    .map_err(|e| e.to_string())?;
                if reached(&r, phases) {
                    Ok(r)
                } else {
                    Err(format!("phase {:?}", phase(&r)))
                }
            },
        )
        .await
    }

    /// Waits until every node's NodeNetworkConfig is Provisioned on `revision`.
    pub async fn wait_all_on(&self, revision: &str, timeout: Duration) -> Result<()> {
        let nodes = self.node_names();
        self.eventually(timeout, &format!("every node on {revision}"), || async {
            let configs = self.configs().await.map_err(|e| e.to_string())?;
            for n in &nodes {
                let Some(c) = configs.get(n) else {
                    return Err(format!("{n}: no NodeNetworkConfig"));
                };
                if !provisioned_on(c, revision) {
                    return Err(format!("{n}: {}", describe(c)));
                }
            }
            Ok(())
        })
        .await
    }

    /// Polls `check` until it returns Ok, or fails after `timeout` with the last state and the tails of
    /// the process logs.
    pub async fn eventually<T, F, Fut>(&self, timeout: Duration, what: &str, check: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        netwave_control_plane::poll::eventually(what, timeout, check)
            .await
            .map_err(|e| anyhow::anyhow!("{e:#}\n{}", self.logs_tail(8)))
    }

    /// The last lines of every process log (for failure messages).
    pub fn logs_tail(&self, lines: usize) -> String {
        let mut s = String::new();
        let procs = self
            .testbed
            .iter()
            .chain(self.configurators.iter().flatten())
            .chain(self.agents.values());
        for p in procs {
            s.push_str(&format!(
                "--- {} ({})\n{}\n",
                p.name,
                p.log.display(),
                p.log_tail(lines)
            ));
        }
        if let Some(cp) = &self.control_plane {
            s.push_str(&format!("--- kube-apiserver\n{}\n", cp.apiserver_log()));
        }
        s
    }

    // ---- faults ----

    /// POSTs (or DELETEs with `body == None`) to the testbed's admin endpoint, e.g.
    /// `admin("POST", "/testbed/faults", Some(json!({...})))`.
    pub async fn admin(&self, method: &str, path: &str, body: Option<Value>) -> Result<String> {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(body.map(|b| b.to_string().into_bytes()).unwrap_or_default())?;
        Ok(self.client.request_text(req).await?)
    }

    // ---- kernel ----

    /// Installs the VXLAN flooding entries a control plane would (EVPN type-3 routes): for every managed
    /// VXLAN device on every node, one all-zero FDB entry per peer underlay address.
    /// Refused with [`FleetOptions::frr`]: EVPN installs them there.
    pub fn install_flood_entries(&self) -> Result<usize> {
        if self.opts.frr {
            bail!(
                "install_flood_entries with FRR on: EVPN type-3 routes install the flood entries"
            );
        }
        let mut added = 0;
        for n in &self.net.nodes {
            for dev in vxlan_devices(&n.netns)? {
                for peer in &self.net.nodes {
                    if peer.name == n.name {
                        continue;
                    }
                    let r = netns::run(
                        "bridge",
                        &[
                            "-n",
                            &n.netns,
                            "fdb",
                            "append",
                            "00:00:00:00:00:00",
                            "dev",
                            &dev,
                            "dst",
                            &peer.underlay.to_string(),
                        ],
                    );
                    match r {
                        Ok(_) => added += 1,
                        Err(e) if e.to_string().contains("exists") => {}
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        Ok(added)
    }

    /// One workload per node on the data segment: `10.250.3.(100+i)/24`, default route via the anycast
    /// gateway. Returns (node, workload namespace, address).
    pub fn add_workloads(&mut self) -> Result<Vec<(String, String, String)>> {
        let bridge = format!("l2.{DATA_VLAN}");
        let mut out = Vec::new();
        for n in self.net.nodes.clone() {
            let i: u32 = n.name.rsplit('-').next().unwrap_or("0").parse()?;
            let addr = format!("10.250.3.{}", 100 + i);
            let ns =
                self.net
                    .add_workload(&n.name, &bridge, &format!("{addr}/24"), DATA_GATEWAY)?;
            out.push((n.name.clone(), ns, addr));
        }
        Ok(out)
    }

    /// What netwave owns in `node`'s kernel, normalised: managed links (kind, MTU, master, MAC except
    /// VXLAN's random one, up),
    /// their addresses, routes and rules with protocol 242. Two nodes' snapshots or one node's at two
    /// times compare with `==`.
    pub fn kernel_state(&self, node: &str) -> Result<String> {
        let ns = &self.net.node(node).context("no such node")?.netns;
        kernel_state(ns)
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if let Some(s) = self.simulator.take() {
            s.abort();
        }
        for c in self.configurators.iter_mut().flatten() {
            c.kill();
        }
        for a in self.agents.values_mut() {
            a.kill();
        }
        if let Some(t) = self.testbed.as_mut() {
            t.kill();
        }
        // FRR by pid (bgpd, then zebra) while its namespaces still exist: deleting a namespace does not
        // end the processes in it.
        self.frr.clear();
        // Stops kube-apiserver and etcd before the address they listen on goes away.
        self.control_plane.take();
        // Namespaces are freed asynchronously; delete the root-side veth now so nothing lingers.
        if !self.host_link.is_empty() {
            let _ = ip(&["link", "del", &self.host_link]);
        }
        if std::env::var_os("NETWAVE_E2E_KEEP_LOGS").is_none() {
            let _ = fs::remove_dir_all(&self.dir);
        }
        // `net` drops after this: namespaces, their links and the host veth go.
    }
}

/// Starts `netwave-testbed` on `bind`; returns its URL, kubeconfig, an admin client and the process.
async fn start_testbed(
    bins: &Bins,
    dir: &Path,
    bind: Ipv4Addr,
) -> Result<(String, PathBuf, Client, Proc)> {
    let kubeconfig = dir.join("kubeconfig");
    let mut cmd = Command::new(&bins.testbed);
    cmd.arg("--bind")
        .arg(bind.to_string())
        .args(["--port", "0", "--kubeconfig"])
        .arg(&kubeconfig)
        .arg("--crds")
        .arg(workspace_root().join("crds"));
    // stdout carries the URL; stderr goes to the log.
    let log = dir.join("testbed.log");
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::from(fs::File::create(&log)?))
        .stdin(Stdio::null());
    let mut child = cmd.spawn().context("starting netwave-testbed")?;
    let stdout = child.stdout.take().context("testbed stdout")?;
    let testbed = Proc {
        name: "testbed".into(),
        log,
        child,
    };
    let url = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    })
    .await??
    .trim()
    .to_string();
    if url.is_empty() {
        bail!("testbed printed no URL: {}", testbed.log_tail(20));
    }
    let kc = Kubeconfig::read_from(&kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    let client = Client::try_from(config)?;
    Ok((url, kubeconfig, client, testbed))
}

/// A revision's phase ("" without status).
/// Whether the revision's phase is one of `phases`.
fn reached(r: &NetworkConfigRevision, phases: &[RevisionPhase]) -> bool {
    RevisionPhase::parse(Some(&phase(r))).is_some_and(|p| phases.contains(&p))
}

pub fn phase(r: &NetworkConfigRevision) -> String {
    r.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

/// Provisioned on `revision` (spec and report agree).
pub fn provisioned_on(c: &NodeNetworkConfig, revision: &str) -> bool {
    let st = c.status.clone().unwrap_or_default();
    c.spec.revision == revision
        && st.observed_revision.as_deref() == Some(revision)
        && st.phase.as_deref() == Some(NodePhase::Provisioned.as_str())
}

/// One line about a node's config: spec revision, reported phase and revision, reason.
pub fn describe(c: &NodeNetworkConfig) -> String {
    let st = c.status.clone().unwrap_or_default();
    format!(
        "spec={} phase={} observed={} lastGood={} reason={}",
        c.spec.revision,
        st.phase.unwrap_or_default(),
        st.observed_revision.unwrap_or_default(),
        st.last_good_revision.unwrap_or_default(),
        st.reason.unwrap_or_default()
    )
}

/// See [`Fleet::agent_metrics_addr`].
fn agent_metrics_addr(n: &NodeNs) -> std::net::SocketAddr {
    (n.underlay, 9091).into()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

fn json_of(ns: &str, args: &[&str]) -> Result<Vec<Value>> {
    let mut full = vec!["-n", ns, "-j"];
    full.extend_from_slice(args);
    let text = ip(&full)?;
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    Ok(serde_json::from_str(&text)?)
}

/// Names of the managed VXLAN devices in namespace `ns`.
pub fn vxlan_devices(ns: &str) -> Result<Vec<String>> {
    Ok(json_of(ns, &["-d", "link", "show"])?
        .into_iter()
        .filter(|l| l["ifalias"] == "netwave:managed" && l["linkinfo"]["info_kind"] == "vxlan")
        .filter_map(|l| l["ifname"].as_str().map(str::to_string))
        .collect())
}

/// See [`Fleet::kernel_state`].
pub fn kernel_state(ns: &str) -> Result<String> {
    let mut lines = Vec::new();
    let links = json_of(ns, &["-d", "link", "show"])?;
    let managed: Vec<&Value> = links
        .iter()
        .filter(|l| l["ifalias"] == "netwave:managed")
        .collect();
    for l in &managed {
        // VXLAN devices get a random MAC at creation; the others carry configured ones.
        let mac = if l["linkinfo"]["info_kind"] == "vxlan" {
            "random"
        } else {
            l["address"].as_str().unwrap_or_default()
        };
        lines.push(format!(
            "link {} kind={} mtu={} master={} mac={} up={}",
            l["ifname"].as_str().unwrap_or_default(),
            l["linkinfo"]["info_kind"].as_str().unwrap_or_default(),
            l["mtu"],
            l["master"].as_str().unwrap_or("-"),
            mac,
            l["flags"]
                .as_array()
                .is_some_and(|f| f.iter().any(|x| x == "UP")),
        ));
    }
    let names: Vec<&str> = managed
        .iter()
        .filter_map(|l| l["ifname"].as_str())
        .collect();
    for a in json_of(ns, &["addr", "show"])? {
        let dev = a["ifname"].as_str().unwrap_or_default();
        if !names.contains(&dev) {
            continue;
        }
        for info in a["addr_info"].as_array().into_iter().flatten() {
            if info["scope"] == "link" {
                continue;
            }
            lines.push(format!(
                "addr {dev} {}/{}",
                info["local"].as_str().unwrap_or_default(),
                info["prefixlen"]
            ));
        }
    }
    for fam in ["-4", "-6"] {
        let routes = ip(&[
            "-n", ns, fam, "route", "show", "table", "all", "proto", "242",
        ])?;
        lines.extend(routes.lines().map(|l| format!("route {}", l.trim())));
        let rules = ip(&["-n", ns, fam, "rule", "show"])?;
        lines.extend(
            rules
                .lines()
                .filter(|l| l.contains("proto 242"))
                .map(|l| format!("rule {}", l.trim())),
        );
    }
    lines.sort();
    Ok(lines.join("\n"))
}

/// Agents that do not touch the kernel, for runs without root (`netwave_agent::sim`): each new
/// (revision, retry) is answered after 300 ms with the status a real agent writes. The health check is
/// simulated on the config itself: a config whose policy rules send traffic for the probe target
/// ([`PROBE_TARGET`]) into a table that blackholes it fails with `HealthCheckFailed`, and the node keeps
/// its last good revision; anything else is `Provisioned`.
pub fn simulate_agents(client: Client) -> tokio::task::JoinHandle<()> {
    use netwave_agent::reconcile::Reason;
    use netwave_agent::sim::Answer;
    let behaviour: netwave_agent::sim::Behaviour = std::sync::Arc::new(|c: &NodeNetworkConfig| {
        match blackholes_probe_target(&c.spec.config) {
            None => Answer::Provisioned,
            Some(table) => Answer::Invalid {
                reason: Reason::HealthCheckFailed,
                message: format!(
                    "HealthCheckFailed: reachability icmp {PROBE_TARGET}: blackholed by table {table} \
                     (simulated agent, no kernel); restored the last good config"
                ),
            },
        }
    });
    netwave_agent::sim::spawn(client, behaviour, Duration::from_millis(300))
}

/// The table whose blackhole route catches the probe target through a policy rule, if any.
fn blackholes_probe_target(config: &netwave_api::NodeConfig) -> Option<u32> {
    let target = format!("{PROBE_TARGET}/32");
    config
        .rules
        .iter()
        .filter(|r| r.to.as_deref() == Some(target.as_str()))
        .map(|r| r.table)
        .find(|t| {
            config.routes.iter().any(|r| {
                r.table == *t && r.prefix == target && r.kind == netwave_api::RouteType::Blackhole
            })
        })
}
