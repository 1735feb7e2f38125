//! Health probes around an apply: interfaces that must be up (name globs), TCP connect and ICMP echo
//! reachability targets, BGP sessions that must be Established (FRR's `show bgp summary json`, when
//! the agent runs FRR), and an uncached API-server probe. The node config's BGPPeerings bring their
//! own gate ([`peering_session`], run by the agent's judge after these): each session must reach
//! Established within its hold time of the apply, whatever it was before.
//!
//! Gating (DESIGN.md §4): every probe runs once *before* the apply; only probes that passed then can fail
//! the apply afterwards (a target that was already unreachable says nothing about the new config). After
//! the apply, failing gating probes are retried with exponential backoff until they pass or the deadline
//! passes. The decisions ([`gating`], [`first_gating_failure`], [`backoff`]) are pure; [`Prober`] does
//! the I/O.
//!
//! ICMP uses a socket2 ICMP socket (an unprivileged `SOCK_DGRAM` "ping socket" where the node allows it,
//! else `SOCK_RAW`, which the agent's CAP_NET_RAW permits) driven by tokio's `AsyncFd`. socket2 is the
//! socket crate tokio itself builds on and is already in the tree; shelling out to `ping` would depend on
//! the image shipping iputils and on parsing its output, and the ping crates add dependencies for ~60
//! lines of echo request/reply handling.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use futures::future::{BoxFuture, join_all};
use netwave_api::ProbeResult;
use serde::{Deserialize, Serialize};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use tokio::time::{Instant, timeout};

use crate::netlink::Netlink;

/// Health configuration, read from the agent's health config file (YAML).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct HealthConfig {
    /// Interface name globs (`*`, `?`); every matching interface must be up, and each glob must match.
    pub interfaces: Vec<String>,
    /// TCP targets that must accept a connection, e.g. `198.18.0.1:179`.
    pub tcp: Vec<SocketAddr>,
    /// ICMP echo targets.
    pub icmp: Vec<IpAddr>,
    /// BGP neighbours (an address, or the interface of an unnumbered one, as FRR names them) whose
    /// session must be Established in some address family; needs the agent's FRR (`--frr-config`).
    /// A session a revision breaks stays Established until its hold time runs out (9 s with FRR's
    /// datacenter defaults): set `settleSeconds` above the hold time, or the probe passes too early.
    pub bgp_peers: Vec<String>,
    /// Probe the API server (uncached request) after an apply.
    pub api_server: bool,
    /// One probe attempt gives up after this long.
    pub attempt_timeout_seconds: f64,
    /// All retries after an apply fit within this long.
    pub deadline_seconds: f64,
    /// Wait this long after an apply before probing (routing daemons, ARP).
    pub settle_seconds: f64,
    pub backoff_initial_seconds: f64,
    pub backoff_max_seconds: f64,
    /// Node taints removed once the node is healthy.
    pub taints: Vec<String>,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            interfaces: Vec::new(),
            tcp: Vec::new(),
            icmp: Vec::new(),
            bgp_peers: Vec::new(),
            api_server: true,
            attempt_timeout_seconds: 1.0,
            deadline_seconds: 30.0,
            settle_seconds: 1.0,
            backoff_initial_seconds: 0.2,
            backoff_max_seconds: 2.0,
            taints: Vec::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HealthConfigError {
    #[error("reading health config {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("health config {path}: {why}")]
    Parse { path: String, why: String },
}

impl HealthConfig {
    pub fn load(path: &std::path::Path) -> Result<HealthConfig, HealthConfigError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| HealthConfigError::Read {
            path: p.clone(),
            source,
        })?;
        let cfg: HealthConfig =
            serde_saphyr::from_str(&text).map_err(|e| HealthConfigError::Parse {
                path: p.clone(),
                why: e.to_string(),
            })?;
        for (name, v) in [
            ("attemptTimeoutSeconds", cfg.attempt_timeout_seconds),
            ("deadlineSeconds", cfg.deadline_seconds),
            ("backoffInitialSeconds", cfg.backoff_initial_seconds),
            ("backoffMaxSeconds", cfg.backoff_max_seconds),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(HealthConfigError::Parse {
                    path: p,
                    why: format!("{name} must be a positive number of seconds, got {v}"),
                });
            }
        }
        if !(cfg.settle_seconds.is_finite() && cfg.settle_seconds >= 0.0) {
            return Err(HealthConfigError::Parse {
                path: p,
                why: format!("settleSeconds must be >= 0, got {}", cfg.settle_seconds),
            });
        }
        Ok(cfg)
    }

    pub fn probes(&self) -> Vec<Probe> {
        let mut v: Vec<Probe> = self
            .interfaces
            .iter()
            .cloned()
            .map(Probe::Interface)
            .collect();
        v.extend(self.tcp.iter().copied().map(Probe::Tcp));
        v.extend(self.icmp.iter().copied().map(Probe::Icmp));
        v.extend(self.bgp_peers.iter().cloned().map(Probe::Bgp));
        if self.api_server {
            v.push(Probe::Api);
        }
        v
    }

    pub fn deadline(&self) -> Duration {
        Duration::from_secs_f64(self.deadline_seconds)
    }

    pub fn settle(&self) -> Duration {
        Duration::from_secs_f64(self.settle_seconds)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    Interface(String),
    Tcp(SocketAddr),
    Icmp(IpAddr),
    /// A BGP session to this neighbour.
    Bgp(String),
    Api,
}

impl Probe {
    /// Name in status and in `HealthCheckFailed` messages.
    pub fn name(&self) -> String {
        match self {
            Probe::Interface(g) => format!("interface {g}"),
            Probe::Tcp(a) => format!("reachability {a}"),
            Probe::Icmp(ip) => format!("reachability icmp {ip}"),
            Probe::Bgp(peer) => format!("bgp {peer}"),
            Probe::Api => "api".into(),
        }
    }
}

/// Glob match with `*` (any run) and `?` (one character).
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// Names of the probes that passed before the apply: the only ones allowed to fail it.
pub fn gating(before: &[ProbeResult]) -> BTreeSet<String> {
    before
        .iter()
        .filter(|r| r.result == PASSED)
        .map(|r| r.name.clone())
        .collect()
}

/// The first gating probe that failed after the apply, if any.
pub fn first_gating_failure(after: &[ProbeResult]) -> Option<&ProbeResult> {
    after.iter().find(|r| r.gating && r.result != PASSED)
}

/// Delay before retry `attempt` (0-based): initial × 2^attempt, capped.
pub fn backoff(attempt: u32, cfg: &HealthConfig) -> Duration {
    let secs = cfg.backoff_initial_seconds * 2f64.powi(attempt.min(30) as i32);
    Duration::from_secs_f64(secs.min(cfg.backoff_max_seconds))
}

pub use netwave_api::vocab::probe_results::{FAILED, PASSED};

/// An uncached API-server request (in the Kubernetes shell: `GET /version`).
pub type ApiCheck = Arc<dyn Fn() -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// FRR's `show bgp summary json` of the node's instance, uncached.
pub type BgpSummary = Arc<dyn Fn() -> BoxFuture<'static, Result<String, String>> + Send + Sync>;

/// Whether the session to `peer` is Established, from `show bgp summary json` (FRR 8.4: one object
/// per address family, e.g. `ipv4Unicast`, `l2VpnEvpn`, each with `peers` by address or interface
/// name and their `state`). Established in any family counts; otherwise the message names the state.
pub fn bgp_session(summary: &str, peer: &str) -> Result<(), String> {
    let v: serde_json::Value = serde_json::from_str(summary)
        .map_err(|e| format!("show bgp summary json is not JSON: {e}"))?;
    let mut states: BTreeSet<String> = BTreeSet::new();
    for family in v.as_object().into_iter().flat_map(|m| m.values()) {
        if let Some(p) = family.get("peers").and_then(|p| p.get(peer)) {
            let state = p.get("state").and_then(|s| s.as_str()).unwrap_or("unknown");
            if state == "Established" {
                return Ok(());
            }
            states.insert(state.to_string());
        }
    }
    if states.is_empty() {
        Err("not a BGP neighbour of this node's FRR".into())
    } else {
        Err(format!(
            "session not Established (state {})",
            states.into_iter().collect::<Vec<_>>().join(", ")
        ))
    }
}

/// Whether a BGPPeering's session is Established, from FRR 8.4's `show bgp vrf VRF neighbors json`
/// (neighbours by address, each with `bgpState` and, for a dynamic one, its `peerGroup`). A peer group
/// (listen ranges) needs one Established workload; an address its own session. Otherwise the message
/// says what FRR shows: no workload connected (a wrong AS number is refused before a neighbour
/// appears), or the states. Pure.
pub fn peering_session(
    neighbors: &str,
    session: &netwave_core::frr::WorkloadId,
) -> Result<(), String> {
    use netwave_core::frr::WorkloadId;
    let v: serde_json::Value = serde_json::from_str(neighbors)
        .map_err(|e| format!("show bgp neighbors json is not JSON: {e}"))?;
    let state = |n: &serde_json::Value| {
        n.get("bgpState")
            .and_then(|s| s.as_str())
            .unwrap_or("unknown")
            .to_string()
    };
    let states: Vec<(String, String)> = match session {
        WorkloadId::Address(a) => v
            .get(a.to_string())
            .map(|n| (a.to_string(), state(n)))
            .into_iter()
            .collect(),
        WorkloadId::Group(g) => v
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(_, n)| n.get("peerGroup").and_then(|p| p.as_str()) == Some(g))
            .map(|(addr, n)| (addr.clone(), state(n)))
            .collect(),
    };
    if states.iter().any(|(_, s)| s == "Established") {
        return Ok(());
    }
    if states.is_empty() {
        return Err(match session {
            WorkloadId::Address(a) => format!("{a} is not a neighbour of this node's FRR"),
            WorkloadId::Group(_) => "no workload has connected (a workload with another AS number \
                                     is refused before it shows)"
                .to_string(),
        });
    }
    Err(format!(
        "not Established ({})",
        states
            .iter()
            .map(|(a, s)| format!("{a} {s}"))
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// Told every round of probe results as it completes: the probe gauges (`netwave_agent_probe_up` is a
/// probe's last run, so an apply's retries and the re-check after a rollback count, not only the
/// results the verdict is about).
pub type ProbeObserver = Arc<dyn Fn(&[ProbeResult]) + Send + Sync>;

/// Runs probes. Sockets are opened on the calling thread, i.e. in its network namespace.
#[derive(Clone)]
pub struct Prober {
    pub cfg: HealthConfig,
    netlink: Netlink,
    api: Option<ApiCheck>,
    bgp: Option<BgpSummary>,
    observer: Option<ProbeObserver>,
}

impl Prober {
    pub fn new(cfg: HealthConfig, netlink: Netlink, api: Option<ApiCheck>) -> Prober {
        Prober {
            cfg,
            netlink,
            api,
            bgp: None,
            observer: None,
        }
    }

    /// Who is told each round of results as it completes.
    pub fn with_observer(mut self, observer: ProbeObserver) -> Prober {
        self.observer = Some(observer);
        self
    }

    fn observe(&self, results: &[ProbeResult]) {
        if let Some(o) = &self.observer {
            o(results);
        }
    }

    /// Where the `bgp` probes read the sessions from (the agent's FRR instance).
    pub fn with_bgp(mut self, summary: BgpSummary) -> Prober {
        self.bgp = Some(summary);
        self
    }

    /// One attempt, bounded by the attempt timeout (or `limit` if shorter).
    pub async fn check(&self, probe: &Probe, limit: Duration) -> Result<(), String> {
        let t = Duration::from_secs_f64(self.cfg.attempt_timeout_seconds).min(limit);
        match timeout(t, self.check_inner(probe)).await {
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {:.1}s", t.as_secs_f64())),
        }
    }

    async fn check_inner(&self, probe: &Probe) -> Result<(), String> {
        match probe {
            Probe::Interface(glob) => {
                let links = self
                    .netlink
                    .link_states()
                    .await
                    .map_err(|e| e.to_string())?;
                let matching: Vec<_> = links.iter().filter(|(n, _)| glob_match(glob, n)).collect();
                if matching.is_empty() {
                    return Err("no interface matches".into());
                }
                let down: Vec<&str> = matching
                    .iter()
                    .filter(|(_, up)| !up)
                    .map(|(n, _)| n.as_str())
                    .collect();
                if down.is_empty() {
                    Ok(())
                } else {
                    Err(format!("down: {}", down.join(", ")))
                }
            }
            Probe::Tcp(addr) => tokio::net::TcpStream::connect(addr)
                .await
                .map(drop)
                .map_err(|e| connect_error(&e, addr.ip())),
            Probe::Icmp(ip) => {
                let t = Duration::from_secs_f64(self.cfg.attempt_timeout_seconds);
                icmp_echo(*ip, t).await
            }
            Probe::Bgp(peer) => match &self.bgp {
                Some(f) => bgp_session(&f().await?, peer),
                None => Err("the agent runs no FRR (--frr-config) to ask".into()),
            },
            Probe::Api => match &self.api {
                Some(f) => f().await,
                None => Err("no API client configured".into()),
            },
        }
    }

    /// Every probe once, concurrently (the baseline before an apply, or a re-check after a rollback).
    pub async fn run_once(&self, gating: &BTreeSet<String>) -> Vec<ProbeResult> {
        let probes = self.cfg.probes();
        let limit = Duration::from_secs_f64(self.cfg.attempt_timeout_seconds);
        let results = join_all(probes.iter().map(|p| async move {
            let start = Instant::now();
            let r = self.check(p, limit).await;
            result(p, r, gating, start.elapsed())
        }))
        .await;
        self.observe(&results);
        results
    }

    /// After an apply: retries failing probes with backoff until every gating probe passed or the
    /// deadline passed. Non-gating probes are reported but never extend the wait.
    pub async fn run_until_healthy(&self, gating: &BTreeSet<String>) -> Vec<ProbeResult> {
        let deadline = Instant::now() + self.cfg.deadline();
        let probes = self.cfg.probes();
        let mut last: BTreeMap<usize, ProbeResult> = BTreeMap::new();
        let mut attempt = 0;
        loop {
            let pending: Vec<(usize, &Probe)> = probes
                .iter()
                .enumerate()
                .filter(|(i, _)| last.get(i).is_none_or(|r| r.result != PASSED))
                .collect();
            // The deadline bounds when the last attempt starts; that attempt still gets its full
            // attempt timeout (a vtysh round trip cut to the last millisecond would only time out).
            let attempt_limit = Duration::from_secs_f64(self.cfg.attempt_timeout_seconds);
            let rs = join_all(pending.iter().map(|(i, p)| async move {
                let start = Instant::now();
                let r = self.check(p, attempt_limit).await;
                (*i, result(p, r, gating, start.elapsed()))
            }))
            .await;
            self.observe(&rs.iter().map(|(_, r)| r.clone()).collect::<Vec<_>>());
            last.extend(rs);
            let gating_ok = last.values().all(|r| !r.gating || r.result == PASSED);
            let now = Instant::now();
            if gating_ok || now >= deadline {
                break;
            }
            tokio::time::sleep(backoff(attempt, &self.cfg).min(deadline - now)).await;
            attempt += 1;
        }
        last.into_values().collect()
    }
}

fn result(
    p: &Probe,
    r: Result<(), String>,
    gating: &BTreeSet<String>,
    took: Duration,
) -> ProbeResult {
    let name = p.name();
    ProbeResult {
        gating: gating.contains(&name),
        name,
        result: if r.is_ok() { PASSED } else { FAILED }.into(),
        message: r.err(),
        duration_seconds: Some((took.as_secs_f64() * 1000.0).round() / 1000.0),
    }
}

/// A connect error in routing terms where the kernel's errno is cryptic: a blackhole route makes
/// `connect` fail with EINVAL ("Invalid argument").
fn connect_error(e: &std::io::Error, ip: IpAddr) -> String {
    use std::io::ErrorKind;
    match e.kind() {
        ErrorKind::InvalidInput => format!("no route to {ip}: a blackhole route covers it"),
        ErrorKind::HostUnreachable | ErrorKind::NetworkUnreachable => {
            format!("no route to {ip}: {e}")
        }
        _ => format!("connect: {e}"),
    }
}

static ICMP_SEQ: AtomicU16 = AtomicU16::new(1);

/// One ICMP echo request and its reply. The socket is opened here, on the calling thread (its network
/// namespace); the blocking receive, bounded by `wait`, runs on tokio's blocking pool. (`AsyncFd::new` is
/// deprecated as unsound and its replacement is `unsafe`, which this workspace forbids.)
async fn icmp_echo(ip: IpAddr, wait: Duration) -> Result<(), String> {
    let (domain, proto, request, reply) = match ip {
        IpAddr::V4(_) => (Domain::IPV4, Protocol::ICMPV4, 8u8, 0u8),
        IpAddr::V6(_) => (Domain::IPV6, Protocol::ICMPV6, 128, 129),
    };
    let (sock, raw) = match Socket::new(domain, Type::DGRAM, Some(proto)) {
        Ok(s) => (s, false),
        Err(_) => (
            Socket::new(domain, Type::RAW, Some(proto)).map_err(|e| format!("icmp socket: {e}"))?,
            true,
        ),
    };
    sock.set_read_timeout(Some(wait.max(Duration::from_millis(1))))
        .map_err(|e| e.to_string())?;
    // Connected: the kernel delivers only this target's packets to the socket.
    sock.connect(&SockAddr::from(SocketAddr::new(ip, 0)))
        .map_err(|e| connect_error(&e, ip))?;
    let id = (std::process::id() as u16).to_be_bytes();
    let seq = ICMP_SEQ.fetch_add(1, Ordering::Relaxed).to_be_bytes();
    let mut pkt = vec![request, 0, 0, 0, id[0], id[1], seq[0], seq[1]];
    pkt.extend_from_slice(b"netwave-probe");
    if ip.is_ipv4() {
        // ICMPv4 needs our checksum on a raw socket (ping sockets recompute it); the kernel does ICMPv6's.
        let c = checksum(&pkt).to_be_bytes();
        pkt[2] = c[0];
        pkt[3] = c[1];
    }
    sock.send(&pkt).map_err(|e| format!("send: {e}"))?;
    tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + wait;
        let mut buf = [0u8; 1500];
        while std::time::Instant::now() < deadline {
            let n = match (&sock).read(&mut buf) {
                Ok(n) => n,
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut =>
                {
                    break;
                }
                Err(e) => return Err(format!("receive: {e}")),
            };
            let mut msg = &buf[..n];
            if raw && ip.is_ipv4() && !msg.is_empty() {
                // Raw IPv4 sockets deliver the IP header too.
                let ihl = usize::from(msg[0] & 0x0f) * 4;
                msg = msg.get(ihl..).unwrap_or_default();
            }
            if msg.len() >= 8 && msg[0] == reply && msg[6..8] == seq && (!raw || msg[4..6] == id) {
                return Ok(());
            }
        }
        Err(format!("no echo reply within {:.1}s", wait.as_secs_f64()))
    })
    .await
    .map_err(|e| format!("icmp task: {e}"))?
}

fn checksum(b: &[u8]) -> u16 {
    let mut sum: u32 = b
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `show bgp vrf default neighbors json` as FRR 8.4 printed it for a workload of a listen range
    /// (trimmed), plus a second one still connecting and a numbered neighbour.
    const NEIGHBORS: &str = r#"{
      "198.18.50.2": {"remoteAs": 65511, "peerGroup": "nw-peer-t-v4", "bgpState": "Established"},
      "198.18.50.3": {"remoteAs": 65511, "peerGroup": "nw-peer-t-v4", "bgpState": "OpenSent"},
      "198.18.51.9": {"remoteAs": 65512, "peerGroup": "nw-peer-u-v4", "bgpState": "OpenConfirm"},
      "10.250.4.10": {"remoteAs": 65511, "bgpState": "Active"}
    }"#;

    #[test]
    fn a_peering_session_is_established_by_any_workload_of_its_group_or_its_own_address() {
        use netwave_core::frr::WorkloadId;
        let group = |g: &str| WorkloadId::Group(g.into());
        assert_eq!(peering_session(NEIGHBORS, &group("nw-peer-t-v4")), Ok(()));
        assert_eq!(
            peering_session(NEIGHBORS, &group("nw-peer-u-v4")),
            Err("not Established (198.18.51.9 OpenConfirm)".into())
        );
        assert_eq!(
            peering_session("{}", &group("nw-peer-t-v4")),
            Err(
                "no workload has connected (a workload with another AS number is refused before \
                 it shows)"
                    .into()
            )
        );
        let addr = WorkloadId::Address("10.250.4.10".parse().unwrap());
        assert_eq!(
            peering_session(NEIGHBORS, &addr),
            Err("not Established (10.250.4.10 Active)".into())
        );
        assert_eq!(
            peering_session("{}", &addr),
            Err("10.250.4.10 is not a neighbour of this node's FRR".into())
        );
        assert!(
            peering_session("nonsense", &addr)
                .unwrap_err()
                .contains("not JSON")
        );
    }

    /// The shape FRR 8.4 prints (trimmed): an unnumbered peer by interface, a numbered one by address.
    const SUMMARY: &str = r#"{
      "ipv4Unicast": {"routerId": "198.18.1.1", "as": 65000, "peers": {
        "eth1": {"hostname": "n2", "remoteAs": 65000, "state": "Established", "idType": "interface"},
        "198.18.0.3": {"remoteAs": 65000, "state": "Active", "idType": "ipv4"}
      }},
      "l2VpnEvpn": {"routerId": "198.18.1.1", "as": 65000, "peers": {
        "eth1": {"remoteAs": 65000, "state": "Established", "idType": "interface"},
        "198.18.0.3": {"remoteAs": 65000, "state": "Connect", "idType": "ipv4"}
      }}
    }"#;

    #[test]
    fn a_bgp_probe_passes_only_on_an_established_session_and_says_the_state() {
        assert_eq!(bgp_session(SUMMARY, "eth1"), Ok(()));
        assert_eq!(
            bgp_session(SUMMARY, "198.18.0.3"),
            Err("session not Established (state Active, Connect)".into())
        );
        assert_eq!(
            bgp_session(SUMMARY, "198.18.0.9"),
            Err("not a BGP neighbour of this node's FRR".into())
        );
        // No session at all (FRR prints `{}` without a BGP instance).
        assert!(bgp_session("{}", "eth1").is_err());
        assert!(bgp_session("% Unknown command", "eth1").is_err());
    }

    #[test]
    fn bgp_probes_come_from_the_config_and_gate_only_when_they_passed_before() {
        let cfg: HealthConfig =
            serde_saphyr::from_str("bgpPeers: [eth1, 198.18.0.3]\napiServer: false\n").unwrap();
        let probes = cfg.probes();
        assert_eq!(
            probes,
            [Probe::Bgp("eth1".into()), Probe::Bgp("198.18.0.3".into())]
        );
        // Before the apply: eth1 up, 198.18.0.3 already down; only eth1 may fail the apply.
        let before: Vec<ProbeResult> = probes
            .iter()
            .map(|p| {
                let Probe::Bgp(peer) = p else { unreachable!() };
                result(
                    p,
                    bgp_session(SUMMARY, peer),
                    &BTreeSet::new(),
                    Duration::ZERO,
                )
            })
            .collect();
        let gates = gating(&before);
        assert_eq!(gates, BTreeSet::from(["bgp eth1".to_string()]));
        // After: both down. The failure that counts is eth1's, with FRR's state in the message.
        let down = SUMMARY.replace("Established", "Idle");
        let after: Vec<ProbeResult> = probes
            .iter()
            .map(|p| {
                let Probe::Bgp(peer) = p else { unreachable!() };
                result(p, bgp_session(&down, peer), &gates, Duration::ZERO)
            })
            .collect();
        let failed = first_gating_failure(&after).expect("eth1 gates");
        assert_eq!(failed.name, "bgp eth1");
        assert_eq!(
            failed.message.as_deref(),
            Some("session not Established (state Idle)")
        );
    }

    fn pr(name: &str, result: &str, gating: bool) -> ProbeResult {
        ProbeResult {
            name: name.into(),
            result: result.into(),
            message: None,
            gating,
            duration_seconds: None,
        }
    }

    /// A prober whose only probe is the API check `f(elapsed)`, on paused time. Virtual time only moves
    /// when every task waits, so the schedule below is exact whatever the machine is doing.
    fn api_prober(pass_after: Option<Duration>) -> (Prober, Arc<std::sync::Mutex<Vec<Duration>>>) {
        let calls: Arc<std::sync::Mutex<Vec<Duration>>> = Arc::default();
        let start = Instant::now();
        let c = calls.clone();
        let api: ApiCheck = Arc::new(move || {
            let c = c.clone();
            Box::pin(async move {
                let t = start.elapsed();
                c.lock().unwrap().push(t);
                match pass_after {
                    Some(after) if t >= after => Ok(()),
                    _ => Err("connection refused".to_string()),
                }
            })
        });
        let cfg = HealthConfig {
            backoff_initial_seconds: 0.5,
            backoff_max_seconds: 4.0,
            deadline_seconds: 30.0,
            ..HealthConfig::default()
        };
        let nl = Netlink::connect(netwave_core::dataplane::NodeSettings::default()).unwrap();
        (Prober::new(cfg, nl, Some(api)), calls)
    }

    fn secs(calls: &std::sync::Mutex<Vec<Duration>>) -> Vec<f64> {
        calls
            .lock()
            .unwrap()
            .iter()
            .map(Duration::as_secs_f64)
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_gating_probe_is_retried_with_exponential_backoff_until_it_passes() {
        let (p, calls) = api_prober(Some(Duration::from_secs(5)));
        let gating = BTreeSet::from(["api".to_string()]);
        let rs = p.run_until_healthy(&gating).await;
        assert_eq!(rs.len(), 1);
        assert_eq!(rs[0].result, PASSED);
        // 0.5 s, doubling: tries at 0, 0.5, 1.5, 3.5 fail; 7.5 passes.
        assert_eq!(secs(&calls), [0.0, 0.5, 1.5, 3.5, 7.5]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_that_never_passes_is_judged_at_the_deadline_not_later() {
        let (p, calls) = api_prober(None);
        let gating = BTreeSet::from(["api".to_string()]);
        let start = Instant::now();
        let rs = p.run_until_healthy(&gating).await;
        assert_eq!(rs[0].result, FAILED);
        assert_eq!(rs[0].message.as_deref(), Some("connection refused"));
        // Capped at 4 s between tries, and the last try lands on the deadline itself.
        assert_eq!(
            secs(&calls),
            [0.0, 0.5, 1.5, 3.5, 7.5, 11.5, 15.5, 19.5, 23.5, 27.5, 30.0]
        );
        assert_eq!(start.elapsed(), Duration::from_secs(30));
    }

    /// The probe gauges are told every run as it completes: each retry, and a later re-check (after a
    /// rollback) that passes again, so `netwave_agent_probe_up` never keeps a failure the next run
    /// disproved.
    #[tokio::test(start_paused = true)]
    async fn every_round_of_results_is_observed_as_it_completes() {
        let (p, _) = api_prober(Some(Duration::from_secs(1)));
        let seen: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let s = seen.clone();
        let p = p.with_observer(Arc::new(move |rs: &[ProbeResult]| {
            let mut s = s.lock().unwrap();
            s.extend(rs.iter().map(|r| format!("{} {}", r.name, r.result)));
        }));
        let gating = BTreeSet::from(["api".to_string()]);
        p.run_until_healthy(&gating).await;
        p.run_once(&gating).await;
        // Tries at 0 and 0.5 s fail, 1.5 s passes; then the re-check.
        assert_eq!(
            *seen.lock().unwrap(),
            ["api Failed", "api Failed", "api Passed", "api Passed"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_that_is_not_gating_never_extends_the_wait() {
        let (p, calls) = api_prober(None);
        let rs = p.run_until_healthy(&BTreeSet::new()).await;
        assert_eq!(rs[0].result, FAILED);
        assert!(!rs[0].gating);
        assert_eq!(secs(&calls), [0.0], "reported after one try");
    }

    #[test]
    fn globs() {
        assert!(glob_match("eth*", "eth0"));
        assert!(glob_match("eth*", "eth"));
        assert!(glob_match("l2.?0", "l2.10"));
        assert!(glob_match("*", "anything"));
        assert!(glob_match("a*b*c", "aXXbYYc"));
        assert!(!glob_match("eth*", "veth0"));
        assert!(!glob_match("l2.?", "l2.10"));
        assert!(!glob_match("a*b", "aXXc"));
    }

    #[test]
    fn only_probes_that_passed_before_gate_the_apply() {
        let before = [
            pr("reachability 198.18.0.1:179", PASSED, false),
            pr("reachability icmp 198.18.9.9", FAILED, false),
            pr("api", PASSED, false),
        ];
        let g = gating(&before);
        assert_eq!(
            g,
            BTreeSet::from(["api".to_string(), "reachability 198.18.0.1:179".to_string()])
        );
        // The target that was already down still fails: not a reason to roll back.
        let after = [
            pr("reachability 198.18.0.1:179", PASSED, true),
            pr("reachability icmp 198.18.9.9", FAILED, false),
            pr("api", PASSED, true),
        ];
        assert_eq!(first_gating_failure(&after), None);
        let after = [
            pr("reachability 198.18.0.1:179", FAILED, true),
            pr("api", PASSED, true),
        ];
        assert_eq!(
            first_gating_failure(&after).map(|r| r.name.as_str()),
            Some("reachability 198.18.0.1:179")
        );
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let cfg = HealthConfig {
            backoff_initial_seconds: 0.1,
            backoff_max_seconds: 1.0,
            ..HealthConfig::default()
        };
        let ms: Vec<u128> = (0..6).map(|a| backoff(a, &cfg).as_millis()).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1000, 1000]);
    }

    #[test]
    fn icmp_checksum_matches_rfc1071_example() {
        // Echo request id 1 seq 1, no payload: checksum 0xf7fd.
        assert_eq!(checksum(&[8, 0, 0, 0, 0, 1, 0, 1]), 0xf7fd);
    }

    #[test]
    fn config_file_is_validated() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("health.yaml");
        std::fs::write(
            &p,
            "interfaces: [\"eth*\"]\ntcp: [\"198.18.0.1:179\"]\nicmp: [\"198.18.0.1\"]\ndeadlineSeconds: 5\n",
        )
        .unwrap();
        let cfg = HealthConfig::load(&p).unwrap();
        assert_eq!(cfg.deadline(), Duration::from_secs(5));
        let names: Vec<String> = cfg.probes().iter().map(Probe::name).collect();
        assert_eq!(
            names,
            [
                "interface eth*",
                "reachability 198.18.0.1:179",
                "reachability icmp 198.18.0.1",
                "api"
            ]
        );
        std::fs::write(&p, "deadlineSeconds: 0\n").unwrap();
        assert!(
            HealthConfig::load(&p)
                .unwrap_err()
                .to_string()
                .contains("deadlineSeconds")
        );
        std::fs::write(&p, "tcp: [\"not-an-address\"]\n").unwrap();
        assert!(HealthConfig::load(&p).is_err());
        std::fs::write(&p, "deadlineSecs: 3\n").unwrap();
        assert!(HealthConfig::load(&p).is_err());
    }
}
