//! Fleet rollout benchmark (#14): the real configurator binary (two replicas, leader election on)
//! with N simulated agents in this process, against each API server in turn — the testbed
//! (`netwave-testbed`, its own process) and the real kube-apiserver + etcd (`netwave-control-plane`,
//! built from Go modules) — and das-schiff-network-operator's rollout rules simulated as a baseline.
//!
//! `cargo build --release -p netwave-configurator -p netwave-testbed --bins &&
//!  cargo run --release -p netwave-configurator --example bench_fleet [N...]`
//! (sizes from the arguments, else `BENCH_FLEET_SIZES=1000,5000`, else 1000; servers from
//! `BENCH_FLEET_SERVERS=testbed,apiserver`, the default, in that order, kube-apiserver only up to
//! `BENCH_FLEET_APISERVER_MAX` nodes, default 5000; the agents' watches from
//! `BENCH_FLEET_AGENT_WATCH=fleet|node`, see [`AgentWatch`]; the configurators'
//! `--coalesce-window` from `BENCH_FLEET_COALESCE`, e.g. `15ms`, their `--reaction-target` from
//! `BENCH_FLEET_REACTION`, e.g. `30ms`)
//!
//! ```text
//!  this process: N simulated agents (NNC watches) ──► Provisioning, answer after 1–3 s ─┐
//!                  ▲ spec (revision) observed, timestamped                             ▼
//!  netwave-configurator ×2 (Lease) ◄──── netwave-testbed (request counters per bearer token)
//!                                    or  kube-apiserver + etcd (audit log: one event per request,
//!                                        user per client, tallied here)
//! ```
//!
//! On the real server every client (each configurator, the agents, this benchmark) is a static-token
//! user in group `system:masters`: no RBAC rule is evaluated and API Priority and Fairness exempts the
//! group, so neither throttles the rollout (the testbed has neither). Requests are counted from the
//! audit log (level Metadata, stage RequestReceived, our four users only): at arrival, as the testbed
//! counts, so a watch counts when it is opened; requests without an object (discovery) and the API
//! server's own traffic are left out on both servers, and the Lease renewals are in both. The audit log
//! itself costs the API server some CPU. RSS and CPU are measured for kube-apiserver and etcd where the
//! testbed's are for the testbed. A size a server cannot carry (a rollout past its limit, a server
//! process gone, under 256 MiB of memory left) is reported as FAILED with the servers' RSS and the
//! machine's available memory, and the run goes on.
//!
//! Each agent reports on a new spec as the real agent does (`netwave_agent::sim::report`): `Provisioning`
//! when it picks it up (the apply timeout counts from it), then its answer after an apply delay drawn
//! uniformly from 1–3 s; 0.5% of the nodes report `Invalid`, 0.2% never answer nor start (the same
//! nodes in every rollout). One fleet per
//! size goes through these rollouts, one after the other:
//!
//! 1. the samples (first rollout of an empty fleet), maxUnavailable 10% (the configurator's default);
//! 2. one RoutingTable added, 10%;
//! 3. 5%; 4. a canary (1% of the nodes) with a 5 s bake, then 10%; 5. ten failure domains
//!    (`topology.kubernetes.io/zone`), maxUnavailable 10% and maxUnavailablePerDomain 10%;
//! 6. 10%, and the leader is killed (SIGKILL) once 40% of the nodes are updated: the writes of the
//!    first minute after that show whether the new leader storms.
//!
//! Rollouts 3–6 swap one RoutingTable for another: the configurators run with
//! `--destructive-threshold 0`, so the new revision is created paused (`DestructiveChange`) and this
//! benchmark sets its `spec.rollout` and resumes it, as an admin would — the policy is in place before
//! any node is assigned. Per rollout it prints wall time (first assignment → last answer, and →
//! revision terminal), the ideal ⌈N / budget⌉ × mean(delay) (plus the canary wave and bake), their
//! ratio, the reaction latency (an agent's status observed → the next assignment observed, in the
//! report's failure domain when budgets are per domain, both from
//! this process's watch), API requests and writes per node by verb and resource and per client (the
//! testbed's counters or the audit log; each configurator, the agents and this benchmark use their
//! own bearer token),
//! and peak RSS and CPU seconds of the configurator leader and standby, the server's processes and
//! this process (from /proc), and the API server's cost per node ([`Cost`]): its CPU (kube-apiserver
//! and etcd apart), the bytes it sent (answers and watch events, by its own count: the testbed's
//! per-token counters, kube-apiserver's size metrics read before and after), the watch events it
//! delivered, and the agents' share of them as the agents here received them. A table per size closes, with das-schiff's rules (one node per pass, 1 s debounce,
//! `netwave_core::sim::das_schiff`) on the same agents as the baseline: "+fails" with the failing and
//! silent agents, the others with every agent healthy (one failure ends a das-schiff rollout). Column
//! "/instnt" is wall time over that of a scheduler reacting instantly over the same agents
//! ([`perfect_wall`]): the configurator's own share of the distance to the ideal.

use netwave_api::vocab::{ConditionStatus, NodePhase, RevisionPhase, node_conditions};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use netwave_agent::reconcile::Reason;
use netwave_agent::sim::{self, Answer};
use netwave_api::{NetworkConfigRevision, NodeNetworkConfig, RoutingTable};
use netwave_core::sim::das_schiff;
use serde_json::{Value, json};

/// The simulated agents allocate as the configurator does (mimalloc): at 15,000 nodes they shared the
/// 2 cores with the server and both configurators.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SEED: u64 = 14;
/// The configurators' `--max-unavailable`.
const DEFAULT_PERCENT: u32 = 10;
/// Per mille of nodes whose agent reports `Invalid` / never answers.
const FAIL_PER_MILLE: usize = 5;
const SILENT_PER_MILLE: usize = 2;
const DELAY_MS: (u64, u64) = (1000, 3000);
const APPLY_TIMEOUT_S: u64 = 10;
const LEASE: (&str, &str) = ("netwave-system", "netwave-configurator");
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
const ZONES: usize = 10;
/// Writes counted after the leader is killed.
const FAILOVER_WINDOW: Duration = Duration::from_secs(60);
/// A rollout not terminal after this long fails the benchmark.
const ROLLOUT_LIMIT: Duration = Duration::from_secs(300);

/// SplitMix64: a seeded, dependency-free generator (the figures must be reproducible).
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What node `i` does in rollout `r`: its answer and apply delay.
fn fate(i: usize, n: usize, r: u64) -> (Answer, Duration) {
    let delay = DELAY_MS.0 + mix(SEED ^ ((i as u64) << 8) ^ r) % (DELAY_MS.1 - DELAY_MS.0 + 1);
    // The failing and silent nodes are spread over the fleet (every k-th by a seeded offset).
    let pick = |per_mille: usize, salt: u64| {
        let k = n.div_ceil(per_mille * n / 1000).max(1);
        per_mille * n / 1000 > 0 && (i + mix(SEED ^ salt) as usize % k).is_multiple_of(k)
    };
    let answer = if pick(SILENT_PER_MILLE, 1) {
        Answer::Silent
    } else if pick(FAIL_PER_MILLE, 2) {
        Answer::Invalid {
            reason: Reason::ApplyFailed,
            message: "ApplyFailed: simulated (bench_fleet)".into(),
        }
    } else {
        Answer::Provisioned
    };
    (answer, Duration::from_millis(delay))
}

fn mean_delay_s() -> f64 {
    (DELAY_MS.0 + DELAY_MS.1) as f64 / 2000.0
}

/// First assignment → last answer of a scheduler that reacts instantly (every freed slot is refilled
/// the moment the agent answers) over the same agents of rollout `r`, in the configurator's order
/// (node name): what no configurator can beat, given the spread of the apply delays and the silent
/// nodes. A canary wave (all at once, failed canaries replaced) and its bake go first.
///
/// A silent node holds its slot to the end (DESIGN.md §3 **Budget**: a node is in flight until its
/// agent reports on its spec, and a dead agent never does; so a fleet with dead agents rolls out with
/// fewer slots, as a MachineConfigPool with degraded nodes does). The same agents are silent in every
/// rollout, so from the second on they hold their slots from the start: they are still in flight on
/// the revision before. Until #28's per-domain figures this model freed their slots at the apply
/// timeout, and the ten-domain rollout, whose silent nodes all lie in one domain, read 1.17 × it.
fn perfect_wall(n: usize, r: u64, sc: &Scenario) -> f64 {
    if let Some(p) = sc.per_domain_percent {
        // Each failure domain is a pipeline of its own with its own budget (their sum is within
        // maxUnavailable here): the slowest domain decides.
        let slots = (n / ZONES * p as usize / 100).max(1);
        return (0..ZONES)
            .map(|z| pipeline(n, r, slots, None, |i| i % ZONES == z))
            .fold(0.0, f64::max);
    }
    pipeline(n, r, sc.concurrency(n), sc.canary, |_| true)
}

/// [`perfect_wall`] of the nodes `member` picks, with `concurrency` slots.
fn pipeline(
    n: usize,
    r: u64,
    concurrency: usize,
    canary: Option<(usize, u64)>,
    member: impl Fn(usize) -> bool,
) -> f64 {
    let mut order: Vec<usize> = (0..n).filter(|&i| member(i)).collect();
    order.sort_by_key(|i| format!("node-{i}"));
    let silent = |i: usize| matches!(fate(i, n, r).0, Answer::Silent);
    let busy = |i: usize| match fate(i, n, r) {
        (Answer::Silent, _) => (Duration::from_secs(APPLY_TIMEOUT_S), false),
        (_, d) => (d, true),
    };
    let held_from_start = if r > 1 {
        order.iter().filter(|&&i| silent(i)).count()
    } else {
        0
    };
    let mut start = Duration::ZERO;
    let mut last = Duration::ZERO;
    let mut rest = &order[..];
    if let Some((k, bake)) = canary {
        // The wave: the first k nodes at once. A canary that fails (its agent answers Invalid, or
        // never answers and the timeout fails it) is replaced by the next node in order as soon as
        // its failure is known, since a node that failed the target is never a canary (the core's
        // `pick_canaries`): the wave ends when k canaries are updated, and the bake starts then. Until #28's 15,000-node figures
        // this model took the slowest of the first k, failed or not, and the canary rollout, whose
        // first 150 nodes there hold a silent and a failing one, read 1.08 x it.
        let mut slots: std::collections::BinaryHeap<std::cmp::Reverse<Duration>> =
            (0..k).map(|_| std::cmp::Reverse(Duration::ZERO)).collect();
        let (mut updated, mut next, mut wave) = (0, 0, Duration::ZERO);
        while updated < k && next < order.len() {
            let Some(std::cmp::Reverse(t)) = slots.pop() else {
                break;
            };
            match fate(order[next], n, r) {
                (Answer::Provisioned, d) => {
                    updated += 1;
                    wave = wave.max(t + d);
                }
                (Answer::Silent, _) => {
                    slots.push(std::cmp::Reverse(t + Duration::from_secs(APPLY_TIMEOUT_S)))
                }
                (_, d) => {
                    last = last.max(t + d);
                    slots.push(std::cmp::Reverse(t + d));
                }
            }
            next += 1;
        }
        last = last.max(wave);
        start = wave + Duration::from_secs(bake);
        rest = &order[next..];
    }
    let mut free: std::collections::BinaryHeap<std::cmp::Reverse<Duration>> = (0..concurrency
        .saturating_sub(held_from_start))
        .map(|_| std::cmp::Reverse(start))
        .collect();
    for &i in rest {
        if held_from_start > 0 && silent(i) {
            continue; // in flight already: it takes the target without a slot of its own
        }
        let Some(std::cmp::Reverse(t)) = free.pop() else {
            return f64::INFINITY; // every slot held by a silent node: the rollout stalls
        };
        let (d, answers) = busy(i);
        if answers {
            last = last.max(t + d);
            free.push(std::cmp::Reverse(t + d));
        }
    }
    last.as_secs_f64()
}

/// A process this benchmark started; SIGKILLed and reaped on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Peak RSS (MiB) and CPU seconds (user + system) of `pid` from /proc.
fn usage(pid: u32, tick: f64) -> Result<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let hwm_kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("VmHWM missing")?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').context("bad /proc stat")? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let cpu = (f[11].parse::<f64>()? + f[12].parse::<f64>()?) / tick;
    Ok((hwm_kb / 1024.0, cpu))
}

/// A rollout stops when the machine has less memory available than this (MiB).
const LOW_MEMORY_MIB: f64 = 256.0;

/// `MemAvailable` of /proc/meminfo, MiB.
fn mem_available_mib() -> Option<f64> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<f64>()
        .ok()
        .map(|kb| kb / 1024.0)
}

/// The 1 and 5 minute load averages.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split(' ')
        .take(2)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Current and peak RSS of `pids`, and the machine's available memory: what a failure message says
/// about what limited the run.
fn resources(pids: &[(String, u32)]) -> String {
    let mut parts: Vec<String> = pids
        .iter()
        .map(|(who, pid)| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let field = |f: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(f))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
                    .map_or("?".to_string(), |kb| format!("{:.0}", kb / 1024.0))
            };
            format!(
                "{who} RSS {} MiB (peak {})",
                field("VmRSS:"),
                field("VmHWM:")
            )
        })
        .collect();
    parts.push(format!(
        "MemAvailable {} MiB",
        mem_available_mib().map_or("?".into(), |m| format!("{m:.0}"))
    ));
    parts.join(", ")
}

fn clock_tick() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// What this process's watch saw, timestamped on arrival.
#[derive(Default)]
struct Observed {
    /// (when, node, revision): a node's spec got a new (revision, retry, configHash).
    assigned: Vec<(Instant, String, String)>,
    /// Per entry of `assigned`: its spec's `netwave.dev/assigned-at` (stamped when the configurator
    /// sent the write) → this process's watch, in ms: the way to the agent that the pickup timeout
    /// counts besides the agent's own work (same machine, same clock).
    /// `None`: the spec carries no readable assigned-at.
    delivered_ms: Vec<Option<i64>>,
    /// (when, node, revision, phase): a node's status reported on its current spec.
    reported: Vec<(Instant, String, String, String)>,
    events: u64,
    /// The agents' received bytes as counted here: watch events re-encoded as JSON in their
    /// `{"type":…,"object":…}` line, and answers to their status writes re-encoded, one in
    /// [`SIZE_SAMPLE`] of each measured and counted for [`SIZE_SAMPLE`] (the objects are alike in
    /// size; re-encoding every one cost the simulated agents a tenth of their CPU, on the cores the
    /// configurators and the server share at 15,000 nodes).
    event_bytes: u64,
    answers: u64,
    answer_bytes: u64,
}

/// One watch event and one answer in this many are re-encoded to estimate the agents' bytes.
const SIZE_SAMPLE: u64 = 8;

/// The length of `o` re-encoded as JSON, in a watch event's line (`{"type":"MODIFIED","object":…}\n`)
/// if `event`: what the server sent, up to the order of fields.
fn encoded_len(o: &NodeNetworkConfig, event: bool) -> u64 {
    let body = serde_json::to_vec(o).map_or(0, |v| v.len() as u64);
    if event {
        body + r#"{"type":"MODIFIED","object":}"#.len() as u64 + 1
    } else {
        body
    }
}

/// The wall clock now, in ms since the epoch (as API timestamps count).
fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// `now` (wall clock, ms) minus the config's `netwave.dev/assigned-at`, if it has one.
fn delivery_ms(nnc: &NodeNetworkConfig) -> Option<i64> {
    let now = wall_ms();
    (nnc.annotations().get(netwave_api::ASSIGNED_AT_ANNOTATION))
        .and_then(|v| netwave_core::types::Timestamp::parse_rfc3339(v).ok())
        .map(|t| now - t.0)
}

/// The instant of wall-clock time `ms` (since the epoch): API timestamps on this process's clock.
/// Kubernetes times have whole seconds: `ms` is up to a second before the event it dates.
fn instant_at(ms: i64) -> Instant {
    let ago = Duration::from_millis(wall_ms().saturating_sub(ms).max(0) as u64);
    let at = Instant::now();
    at.checked_sub(ago).unwrap_or(at)
}

/// Whether the status already answers this spec, as the real agent judges it
/// (`netwave_agent::reconcile::decide`): `Invalid` for this revision, retry (and config, when the
/// agent says which it judged), or `Provisioned` for them and this config.
fn already_answered(nnc: &NodeNetworkConfig) -> bool {
    let Some(st) = &nnc.status else {
        return false;
    };
    let same_attempt = st.observed_revision.as_deref() == Some(nnc.spec.revision.as_str())
        && st.observed_retry.unwrap_or(0) == nnc.spec.retry;
    same_attempt
        && match st.phase.as_deref() {
            Some(p) if p == NodePhase::Invalid.as_str() => st
                .observed_config_hash
                .as_deref()
                .is_none_or(|h| h == nnc.spec.config_hash),
            Some(p) if p == NodePhase::Provisioned.as_str() => {
                st.config_hash.as_deref() == Some(nnc.spec.config_hash.as_str())
            }
            _ => false,
        }
}

/// How the simulated agents watch their NodeNetworkConfigs (`BENCH_FLEET_AGENT_WATCH`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AgentWatch {
    /// One watch on every NNC for all agents (`fleet`, the default): the same events reach this
    /// process as reach N agents, but the server dispatches each event to one watch instead of
    /// matching it against N.
    Fleet,
    /// One watch per node with a field selector on its name, as each real agent watches (`node`): N
    /// watch connections.
    Node,
}

impl AgentWatch {
    fn from_env() -> Result<AgentWatch> {
        match std::env::var("BENCH_FLEET_AGENT_WATCH").as_deref() {
            Err(_) | Ok("" | "fleet") => Ok(AgentWatch::Fleet),
            Ok("node") => Ok(AgentWatch::Node),
            Ok(other) => bail!("BENCH_FLEET_AGENT_WATCH={other:?} is neither `fleet` nor `node`"),
        }
    }

    fn describe(self) -> &'static str {
        match self {
            AgentWatch::Fleet => "the agents share one NNC watch (BENCH_FLEET_AGENT_WATCH=fleet)",
            AgentWatch::Node => {
                "each agent watches its own NNC by field selector (BENCH_FLEET_AGENT_WATCH=node)"
            }
        }
    }
}

/// What the simulated agents remember: per node, the spec last seen and the report last recorded.
#[derive(Default)]
struct AgentMemory {
    specs: BTreeMap<String, (String, u32, String)>,
    statuses: BTreeMap<String, (String, String)>,
}

/// The simulated agents: their NNC watches ([`AgentWatch`]); each new (revision, retry, configHash)
/// is answered per [`fate`] as the real agent answers it: `Provisioning` when picked up, the answer
/// after the apply delay. A placeholder (no revision assigned yet) is not answered, as by the real
/// agent.
fn spawn_agents(
    client: Client,
    n: usize,
    watch: AgentWatch,
    rollout: Arc<Mutex<u64>>,
    seen: Arc<Mutex<Observed>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<NodeNetworkConfig> = Api::all(client);
        let memory: Arc<Mutex<AgentMemory>> = Arc::default();
        let configs: Vec<watcher::Config> = match watch {
            AgentWatch::Fleet => vec![watcher::Config::default()],
            AgentWatch::Node => (0..n)
                .map(|i| watcher::Config::default().fields(&format!("metadata.name=node-{i}")))
                .collect(),
        };
        // Dropped (every watch aborted) when this task is aborted.
        let mut watches = tokio::task::JoinSet::new();
        for config in configs {
            watches.spawn(agent_watch(
                api.clone(),
                config,
                n,
                rollout.clone(),
                seen.clone(),
                memory.clone(),
            ));
        }
        while watches.join_next().await.is_some() {}
    })
}

async fn agent_watch(
    api: Api<NodeNetworkConfig>,
    config: watcher::Config,
    n: usize,
    rollout: Arc<Mutex<u64>>,
    seen: Arc<Mutex<Observed>>,
    memory: Arc<Mutex<AgentMemory>>,
) {
    let stream = watcher(api.clone(), config).default_backoff();
    futures::pin_mut!(stream);
    while let Some(ev) = stream.next().await {
        let now = Instant::now();
        let nnc = match ev {
            Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => o,
            _ => continue,
        };
        let mut obs = seen.lock().unwrap();
        obs.events += 1;
        if obs.events.is_multiple_of(SIZE_SAMPLE) {
            obs.event_bytes += SIZE_SAMPLE * encoded_len(&nnc, true);
        }
        if nnc.spec.is_placeholder() {
            continue;
        }
        let name = nnc.name_any();
        let key = netwave_agent::sim::spec_key(&nnc);
        let st = nnc.status.clone().unwrap_or_default();
        let mut mem = memory.lock().unwrap();
        if let (Some(rev), Some(phase)) = (&st.observed_revision, &st.phase)
            && *rev == key.0
            && matches!(
                NodePhase::parse(phase),
                Some(NodePhase::Provisioned | NodePhase::Invalid)
            )
            && mem.statuses.get(&name) != Some(&(rev.clone(), phase.clone()))
        {
            mem.statuses
                .insert(name.clone(), (rev.clone(), phase.clone()));
            obs.reported
                .push((now, name.clone(), rev.clone(), phase.clone()));
        }
        if mem.specs.get(&name) == Some(&key) {
            continue;
        }
        mem.specs.insert(name.clone(), key.clone());
        drop(mem);
        if already_answered(&nnc) {
            continue;
        }
        obs.assigned.push((now, name.clone(), key.0.clone()));
        obs.delivered_ms.push(delivery_ms(&nnc));
        drop(obs);
        let i: usize = name
            .rsplit('-')
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let (answer, delay) = fate(i, n, *rollout.lock().unwrap());
        let api = api.clone();
        let seen = seen.clone();
        tokio::spawn(async move {
            // As the real agent: Provisioning at pick-up, the answer after the apply.
            let written = sim::report(&api, &nnc, &answer, delay, 100).await;
            for o in &written {
                let sampled = {
                    let mut s = seen.lock().unwrap();
                    s.answers += 1;
                    s.answers.is_multiple_of(SIZE_SAMPLE)
                };
                if sampled {
                    let bytes = SIZE_SAMPLE * encoded_len(o, false);
                    seen.lock().unwrap().answer_bytes += bytes;
                }
            }
        });
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `target/<profile>/` of this example (it lives in `examples/` under it).
fn bin_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .context("example has no target dir")?;
    for b in ["netwave-testbed", "netwave-configurator"] {
        if !dir.join(b).exists() {
            bail!(
                "{} is missing: build it first with `cargo build --release -p netwave-configurator -p netwave-testbed --bins`",
                dir.join(b).display()
            );
        }
    }
    Ok(dir.to_path_buf())
}

async fn start_testbed(bins: &Path, dir: &Path) -> Result<Proc> {
    let kubeconfig = dir.join("kubeconfig");
    let mut child = Command::new(bins.join("netwave-testbed"))
        .args(["--bind", "127.0.0.1", "--port", "0", "--kubeconfig"])
        .arg(&kubeconfig)
        .arg("--crds")
        .arg(workspace_root().join("crds"))
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(dir.join("testbed.log"))?))
        .stdin(Stdio::null())
        .spawn()
        .context("starting netwave-testbed")?;
    let stdout = child.stdout.take().context("testbed stdout")?;
    let p = Proc(child);
    let url = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    })
    .await??;
    if url.trim().is_empty() {
        bail!(
            "testbed printed no URL (see {})",
            dir.join("testbed.log").display()
        );
    }
    Ok(p)
}

/// The testbed's kubeconfig with bearer token `who`: the testbed counts requests per token.
fn testbed_kubeconfig(dir: &Path, who: &str) -> Result<PathBuf> {
    let text = std::fs::read_to_string(dir.join("kubeconfig"))?;
    if !text.contains("token: testbed") {
        bail!("the testbed's kubeconfig has no token to replace");
    }
    let path = dir.join(format!("kubeconfig-{who}"));
    std::fs::write(
        &path,
        text.replace("token: testbed", &format!("token: {who}")),
    )?;
    Ok(path)
}

async fn client_from(kubeconfig: &Path) -> Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// Which API server a fleet runs against (`BENCH_FLEET_SERVERS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ServerKind {
    Testbed,
    Apiserver,
}

impl ServerKind {
    fn name(self) -> &'static str {
        match self {
            ServerKind::Testbed => "testbed",
            ServerKind::Apiserver => "apiserver",
        }
    }

    fn parse(s: &str) -> Result<ServerKind> {
        match s {
            "testbed" => Ok(ServerKind::Testbed),
            "apiserver" => Ok(ServerKind::Apiserver),
            _ => bail!("bench_fleet: server {s:?} is neither `testbed` nor `apiserver`"),
        }
    }
}

/// Every client of a fleet, each with its own bearer token (testbed) or token user (kube-apiserver), so
/// requests are counted per client.
const CLIENTS: [&str; 4] = ["bench", "agents", "configurator-0", "configurator-1"];

/// The API server of one fleet and how its requests are counted.
enum Server {
    /// `netwave-testbed`: its admin endpoints count requests per bearer token.
    Testbed { proc: Proc, dir: PathBuf },
    /// kube-apiserver + etcd (`netwave-control-plane`): every client is a `system:masters` token user
    /// and the API server's audit log (level Metadata, stage RequestReceived, our users only) is
    /// tallied by this process.
    Apiserver {
        cp: Box<netwave_control_plane::ControlPlane>,
        dir: PathBuf,
        audit: Mutex<AuditTally>,
        /// What kube-apiserver's and etcd's /metrics said at the last reset.
        sent0: Mutex<Sent>,
    },
}

/// What the server sent since the last reset. Bytes are body bytes (HTTP headers and chunk framing
/// left out), as kube-apiserver's `apiserver_response_sizes` and `apiserver_watch_events_sizes` count
/// them and the testbed's per-token counters too.
#[derive(Debug, Default, Clone)]
struct Sent {
    /// Answers to reads (get, list): both servers count them.
    read_bytes: f64,
    /// Answers to writes: the testbed only (kube-apiserver's `apiserver_response_sizes` covers reads
    /// only).
    write_answer_bytes: Option<f64>,
    /// Watch events (added, modified, deleted; no bookmarks), one per watch that received it, and their
    /// bytes, per resource.
    watch_events: BTreeMap<String, f64>,
    watch_bytes: BTreeMap<String, f64>,
    /// Per client as the server counted it (testbed only: kube-apiserver's metrics have no user
    /// label): (bytes, watch events).
    by_client: BTreeMap<String, (f64, f64)>,
    /// etcd's gRPC bytes to kube-apiserver (`etcd_network_client_grpc_sent_bytes_total`).
    etcd_bytes: Option<f64>,
}

impl Sent {
    /// Answers to reads and watch events: what both servers count.
    fn bytes(&self) -> f64 {
        self.read_bytes + self.watch_bytes.values().sum::<f64>()
    }

    fn events(&self) -> f64 {
        self.watch_events.values().sum()
    }

    /// `self - before` (cumulative counters).
    fn minus(&self, before: &Sent) -> Sent {
        let sub = |a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>| {
            a.iter()
                .map(|(k, v)| (k.clone(), v - b.get(k).copied().unwrap_or(0.0)))
                .filter(|(_, v)| *v > 0.0)
                .collect()
        };
        Sent {
            read_bytes: self.read_bytes - before.read_bytes,
            write_answer_bytes: None,
            watch_events: sub(&self.watch_events, &before.watch_events),
            watch_bytes: sub(&self.watch_bytes, &before.watch_bytes),
            by_client: self.by_client.clone(),
            etcd_bytes: self
                .etcd_bytes
                .map(|e| e - before.etcd_bytes.unwrap_or(0.0)),
        }
    }

    /// From kube-apiserver's and etcd's /metrics (cumulative since they started).
    fn from_metrics(apiserver: &str, etcd: Option<&str>) -> Sent {
        let mut s = Sent::default();
        // The label naming the watched kind: `resource` in recent releases, `kind` before.
        let kind = |labels: &str| {
            let r = prom_label(labels, "resource");
            if r.is_empty() {
                prom_label(labels, "kind").to_lowercase()
            } else {
                r.to_string()
            }
        };
        for (labels, v) in prom_samples(apiserver, "apiserver_watch_events_total") {
            *s.watch_events.entry(kind(labels)).or_default() += v;
        }
        for (labels, v) in prom_samples(apiserver, "apiserver_watch_events_sizes_sum") {
            *s.watch_bytes.entry(kind(labels)).or_default() += v;
        }
        // Recorded for reads only; a watch's bytes are its events' (above).
        s.read_bytes = prom_samples(apiserver, "apiserver_response_sizes_sum")
            .filter(|(l, _)| matches!(prom_label(l, "verb"), "GET" | "LIST"))
            .map(|(_, v)| v)
            .sum();
        s.etcd_bytes = etcd.map(|e| {
            prom_samples(e, "etcd_network_client_grpc_sent_bytes_total")
                .map(|(_, v)| v)
                .sum()
        });
        s
    }
}

/// (labels, value) of every sample of metric `name` in Prometheus' text format.
fn prom_samples<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = (&'a str, f64)> + 'a {
    text.lines().filter_map(move |l| {
        let rest = l.strip_prefix(name)?;
        let (labels, value) = match rest.strip_prefix('{') {
            Some(r) => r.split_once('}')?,
            None if rest.starts_with(' ') => ("", rest),
            None => return None,
        };
        Some((labels, value.split_whitespace().next()?.parse().ok()?))
    })
}

/// The value of label `key` in a sample's labels (`a="x",b="y"`), empty if absent.
fn prom_label<'a>(labels: &'a str, key: &str) -> &'a str {
    let pat = format!("{key}=\"");
    labels
        .match_indices(&pat)
        .find(|(i, _)| *i == 0 || labels.as_bytes()[i - 1] == b',')
        .and_then(|(i, _)| labels[i + pat.len()..].split('"').next())
        .unwrap_or("")
}

/// `GET path` over plain HTTP/1.0 from `addr` (host:port): the body.
async fn http_get(addr: &str, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr).await.ok()?;
    conn.write_all(format!("GET {path} HTTP/1.0\r\nHost: bench\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut text = String::new();
    conn.read_to_string(&mut text).await.ok()?;
    Some(
        text.split_once("\r\n\r\n")
            .map_or(text.clone(), |(_, b)| b.to_string()),
    )
}

fn token_of(who: &str) -> String {
    format!("netwave-bench-{who}")
}

/// The audit policy: one event per request of our clients, at arrival (stage RequestReceived) — where
/// the testbed counts too, so a watch counts when opened — and none for the API server's own loopback
/// traffic, which the testbed does not have.
fn audit_policy() -> String {
    let users = CLIENTS
        .iter()
        .map(|c| format!("\"{c}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "apiVersion: audit.k8s.io/v1\nkind: Policy\n\
         omitStages: [\"ResponseStarted\", \"ResponseComplete\", \"Panic\"]\n\
         rules:\n- level: Metadata\n  users: [{users}]\n- level: None\n"
    )
}

impl Server {
    async fn start(kind: ServerKind, bins: &Path, dir: &Path) -> Result<Server> {
        match kind {
            ServerKind::Testbed => Ok(Server::Testbed {
                proc: start_testbed(bins, dir).await?,
                dir: dir.to_path_buf(),
            }),
            ServerKind::Apiserver => {
                let policy = dir.join("audit-policy.yaml");
                std::fs::write(&policy, audit_policy())?;
                let log = dir.join("audit.log");
                std::fs::write(&log, "")?;
                let opts = netwave_control_plane::Options {
                    tokens: CLIENTS
                        .iter()
                        .map(|c| netwave_control_plane::TokenUser {
                            token: token_of(c),
                            user: c.to_string(),
                            groups: vec!["system:masters".into()],
                        })
                        .collect(),
                    apiserver_args: vec![
                        format!("--audit-policy-file={}", policy.display()),
                        format!("--audit-log-path={}", log.display()),
                        // Blocking: an event is in the file before its request is served, so reading
                        // the file to its end counts every request made so far.
                        "--audit-log-mode=blocking".into(),
                        "--audit-log-format=json".into(),
                        "--audit-log-maxsize=0".into(),
                    ],
                    ..Default::default()
                };
                let cp = netwave_control_plane::ControlPlane::start(opts).await?;
                install_crds(&cp)?;
                Ok(Server::Apiserver {
                    cp: Box::new(cp),
                    dir: dir.to_path_buf(),
                    audit: Mutex::new(AuditTally::new(log)),
                    sent0: Mutex::default(),
                })
            }
        }
    }

    fn kind(&self) -> ServerKind {
        match self {
            Server::Testbed { .. } => ServerKind::Testbed,
            Server::Apiserver { .. } => ServerKind::Apiserver,
        }
    }

    fn kubeconfig(&self, who: &str) -> Result<PathBuf> {
        match self {
            Server::Testbed { dir, .. } => testbed_kubeconfig(dir, who),
            Server::Apiserver { cp, dir, .. } => {
                let path = dir.join(format!("kubeconfig-{who}"));
                cp.write_kubeconfig(&path, &token_of(who))?;
                Ok(path)
            }
        }
    }

    async fn client(&self, who: &str) -> Result<Client> {
        client_from(&self.kubeconfig(who)?).await
    }

    async fn reset_counters(&self, client: &Client) -> Result<()> {
        match self {
            Server::Testbed { .. } => {
                admin(client, "DELETE", "/testbed/counters").await?;
            }
            Server::Apiserver { audit, sent0, .. } => {
                audit.lock().unwrap().reset()?;
                let now = self.sent_total(client).await?;
                *sent0.lock().unwrap() = now;
            }
        }
        Ok(())
    }

    /// kube-apiserver's and etcd's cumulative counters of what they sent.
    async fn sent_total(&self, client: &Client) -> Result<Sent> {
        let Server::Apiserver { cp, .. } = self else {
            return Ok(Sent::default());
        };
        let apiserver = admin(client, "GET", "/metrics").await?;
        let etcd = http_get(cp.etcd_url().trim_start_matches("http://"), "/metrics").await;
        Ok(Sent::from_metrics(&apiserver, etcd.as_deref()))
    }

    /// What the server sent since the last reset.
    async fn sent(&self, client: &Client) -> Result<Sent> {
        match self {
            Server::Testbed { .. } => {
                let traffic: BTreeMap<String, netwave_testbed::Traffic> = serde_json::from_str(
                    &admin(client, "GET", "/testbed/counters/traffic").await?,
                )?;
                let mut s = Sent {
                    write_answer_bytes: Some(0.0),
                    ..Sent::default()
                };
                for (who, t) in traffic {
                    let mut bytes = 0.0;
                    for (verb, b) in t.response_bytes {
                        let b = b as f64;
                        bytes += b;
                        if matches!(verb.as_str(), "get" | "list") {
                            s.read_bytes += b;
                        } else {
                            *s.write_answer_bytes.get_or_insert(0.0) += b;
                        }
                    }
                    let mut events = 0.0;
                    for (r, n) in t.watch_events {
                        *s.watch_events.entry(r).or_default() += n as f64;
                        events += n as f64;
                    }
                    for (r, b) in t.watch_event_bytes {
                        *s.watch_bytes.entry(r).or_default() += b as f64;
                        bytes += b as f64;
                    }
                    s.by_client.insert(who, (bytes, events));
                }
                Ok(s)
            }
            Server::Apiserver { sent0, .. } => {
                let now = self.sent_total(client).await?;
                Ok(now.minus(&sent0.lock().unwrap()))
            }
        }
    }

    /// Requests since the last reset, by "verb resource[/subresource]", in all and per client.
    async fn counters(&self, client: &Client) -> Result<(Counts, BTreeMap<String, Counts>)> {
        match self {
            Server::Testbed { .. } => {
                let total =
                    serde_json::from_str(&admin(client, "GET", "/testbed/counters").await?)?;
                let by_client = serde_json::from_str(
                    &admin(client, "GET", "/testbed/counters/clients").await?,
                )?;
                Ok((total, by_client))
            }
            Server::Apiserver { audit, .. } => {
                let mut a = audit.lock().unwrap();
                a.advance()?;
                Ok((a.total.clone(), a.by_client.clone()))
            }
        }
    }

    /// (name, pid) of the server's processes.
    fn pids(&self) -> Vec<(String, u32)> {
        match self {
            Server::Testbed { proc, .. } => vec![("netwave-testbed".into(), proc.0.id())],
            Server::Apiserver { cp, .. } => [
                ("kube-apiserver", cp.apiserver_pid()),
                ("etcd", cp.etcd_pid()),
            ]
            .into_iter()
            .filter_map(|(n, p)| Some((n.to_string(), p?)))
            .collect(),
        }
    }

    /// How the clients are authorized, for the heading.
    fn auth(&self) -> &'static str {
        match self {
            Server::Testbed { .. } => "the testbed has no authorization",
            Server::Apiserver { .. } => {
                "every client a token user in group system:masters (no RBAC rule evaluated, exempt \
                 from API Priority and Fairness); requests counted from the API server's audit log"
            }
        }
    }
}

/// Applies every CRD file of `crds/` (not a fixed list: new kinds come with their files) and waits
/// until each is Established.
fn install_crds(cp: &netwave_control_plane::ControlPlane) -> Result<()> {
    let dir = workspace_root().join("crds");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "yaml")
                && std::fs::read_to_string(p)
                    .is_ok_and(|t| t.contains("kind: CustomResourceDefinition"))
        })
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("no CRD files in {}", dir.display());
    }
    let mut apply = cp.kubectl();
    apply.args(["apply", "--server-side", "--force-conflicts"]);
    for f in &files {
        apply.arg("-f").arg(f);
    }
    let mut wait = cp.kubectl();
    wait.args(["wait", "--for=condition=Established", "crd", "--all"]);
    wait.arg("--timeout=60s");
    for mut c in [apply, wait] {
        let out = c.output().context("running kubectl")?;
        if !out.status.success() {
            bail!(
                "kubectl {:?} failed: {}",
                c.get_args().collect::<Vec<_>>(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    Ok(())
}

/// Lists every netwave.dev kind once. kube-apiserver builds a custom resource's serving state (its
/// schema and CEL validation compiled) on the kind's first request, which takes up to a second: in
/// the first rollout that pause fell between two of the samples' creates, longer than the
/// configurators' input settle, and they cut a revision of half the samples. Done on both servers.
async fn warm_up(client: &Client) -> Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
    let crds = Api::<CustomResourceDefinition>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    for crd in crds.items.iter().filter(|c| c.spec.group == "netwave.dev") {
        let Some(v) = crd.spec.versions.iter().find(|v| v.served) else {
            continue;
        };
        let gvk = GroupVersionKind::gvk(&crd.spec.group, &v.name, &crd.spec.names.kind);
        let ar = ApiResource::from_gvk_with_plural(&gvk, &crd.spec.names.plural);
        Api::<DynamicObject>::all_with(client.clone(), &ar)
            .list(&ListParams::default().limit(1))
            .await
            .with_context(|| format!("listing {}", ar.kind))?;
    }
    Ok(())
}

/// Requests per verb and resource tallied from kube-apiserver's audit log (JSON lines), read
/// incrementally from where the last read stopped.
struct AuditTally {
    path: PathBuf,
    offset: u64,
    total: Counts,
    by_client: BTreeMap<String, Counts>,
}

/// The fields of an audit event the tally reads.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct AuditEvent {
    stage: String,
    verb: String,
    user: AuditUser,
    object_ref: Option<AuditObject>,
}

#[derive(serde::Deserialize)]
struct AuditUser {
    username: String,
}

#[derive(serde::Deserialize)]
struct AuditObject {
    resource: Option<String>,
    subresource: Option<String>,
}

impl AuditTally {
    fn new(path: PathBuf) -> AuditTally {
        AuditTally {
            path,
            offset: 0,
            total: Counts::new(),
            by_client: BTreeMap::new(),
        }
    }

    /// Tallies the events written since the last read (whole lines only: the server may be writing one).
    fn advance(&mut self) -> Result<()> {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = std::fs::File::open(&self.path)
            .with_context(|| format!("opening {}", self.path.display()))?;
        f.seek(SeekFrom::Start(self.offset))?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)?;
        let end = buf.iter().rposition(|b| *b == b'\n').map_or(0, |p| p + 1);
        for line in buf[..end].split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let ev: AuditEvent = serde_json::from_slice(line)
                .with_context(|| format!("parsing an event of {}", self.path.display()))?;
            // Requests without an object (discovery, /version) are not counted by the testbed either.
            // The policy logs the arrival stage only; the filter keeps the count right if that changes.
            let Some((resource, sub)) = ev
                .object_ref
                .and_then(|o| Some((o.resource?, o.subresource)))
                .filter(|_| ev.stage == "RequestReceived")
            else {
                continue;
            };
            let key = match sub {
                Some(sub) => format!("{} {resource}/{sub}", ev.verb),
                None => format!("{} {resource}", ev.verb),
            };
            *self.total.entry(key.clone()).or_default() += 1;
            *self
                .by_client
                .entry(ev.user.username)
                .or_default()
                .entry(key)
                .or_default() += 1;
        }
        self.offset += end as u64;
        Ok(())
    }

    /// Counts from now on only.
    fn reset(&mut self) -> Result<()> {
        self.advance()?;
        self.total.clear();
        self.by_client.clear();
        Ok(())
    }
}

/// `BENCH_FLEET_COALESCE` (e.g. `15ms`): the configurators' `--coalesce-window`; unset, their default.
fn coalesce_window() -> Option<String> {
    env_flag("BENCH_FLEET_COALESCE")
}

/// `BENCH_FLEET_REACTION` (e.g. `30ms`): the configurators' `--reaction-target`; unset, their default.
fn reaction_target() -> Option<String> {
    env_flag("BENCH_FLEET_REACTION")
}

fn env_flag(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|w| !w.is_empty())
}

fn start_configurator(
    bins: &Path,
    server: &Server,
    dir: &Path,
    identity: &str,
    max_failures: usize,
) -> Result<(Proc, String)> {
    let log = std::fs::File::create(dir.join(format!("{identity}.log")))?;
    let port = || -> Result<String> {
        Ok(std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .to_string())
    };
    let metrics = port()?;
    let child = Command::new(bins.join("netwave-configurator"))
        .arg("--kubeconfig")
        .arg(server.kubeconfig(identity)?)
        .args(["--lease-namespace", LEASE.0, "--lease-name", LEASE.1])
        .args(["--identity", identity])
        .args(["--lease-duration", "3s", "--renew-deadline", "2s"])
        .args(["--retry-period", "300ms", "--input-settle", "500ms"])
        .args(["--max-unavailable", &format!("{DEFAULT_PERCENT}%")])
        .args(["--max-failures", &max_failures.to_string()])
        .args(
            (coalesce_window()
                .map(|w| ["--coalesce-window".to_string(), w])
                .into_iter())
            .chain(reaction_target().map(|t| ["--reaction-target".to_string(), t]))
            .flatten(),
        )
        .args(["--apply-timeout", &format!("{APPLY_TIMEOUT_S}s")])
        // Every revision that removes an input object is created paused: the benchmark sets its
        // policy before resuming it.
        .args(["--destructive-threshold", "0"])
        .args(["--metrics-addr", &metrics])
        .args(["--health-addr", &port()?])
        .args(["--log-format", "text"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::from(log.try_clone()?))
        .stderr(Stdio::from(log))
        .stdin(Stdio::null())
        .spawn()
        .context("starting netwave-configurator")?;
    Ok((Proc(child), metrics))
}

/// A configurator's reconcile histograms from its /metrics: the whole reconcile, then its part before
/// the writes (`netwave_reconcile_compute_duration_seconds`).
type Histograms = (Histogram, Histogram);

/// (upper bound, cumulative count) per bucket, then the sum of seconds.
type Histogram = (Vec<(f64, u64)>, f64);

async fn reconcile_histogram(addr: &str) -> Option<Histograms> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr).await.ok()?;
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n")
        .await
        .ok()?;
    let mut text = String::new();
    conn.read_to_string(&mut text).await.ok()?;
    let histogram = |name: &str| -> Option<Histogram> {
        let mut buckets = Vec::new();
        let mut sum = 0.0;
        for line in text.lines() {
            let Some(rest) = line.strip_prefix(name) else {
                continue;
            };
            let (key, value) = rest.rsplit_once(' ')?;
            if let Some(le) = key.strip_prefix("bucket{le=\"") {
                let le = le.trim_end_matches("\"}");
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                buckets.push((le, value.parse().ok()?));
            } else if key == "sum" {
                sum = value.parse().ok()?;
            }
        }
        Some((buckets, sum))
    };
    Some((
        histogram("netwave_reconcile_duration_seconds_")?,
        histogram("netwave_reconcile_compute_duration_seconds_")?,
    ))
}

/// Reconciles between two histograms: count, mean seconds, and the bucket bound under which 50% and
/// 99% of them fell.
fn reconcile_delta(a: &Histogram, b: &Histogram) -> (u64, f64, f64, f64) {
    let d: Vec<(f64, u64)> =
        b.0.iter()
            .map(|(le, c)| {
                let before = a.0.iter().find(|x| x.0 == *le).map_or(0, |x| x.1);
                (*le, c.saturating_sub(before))
            })
            .collect();
    let count = d.last().map_or(0, |x| x.1);
    let bound = |p: f64| {
        d.iter()
            .find(|(_, c)| *c as f64 >= p * count as f64)
            .map_or(f64::NAN, |x| x.0)
    };
    let mean = if count > 0 {
        (b.1 - a.1) / count as f64
    } else {
        0.0
    };
    (count, mean, bound(0.5), bound(0.99))
}

async fn admin(client: &Client, method: &str, path: &str) -> Result<String> {
    let req = axum::http::Request::builder()
        .method(method)
        .uri(path)
        .body(Vec::new())?;
    Ok(client.request_text(req).await?)
}

type Counts = BTreeMap<String, u64>;

const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

fn writes(c: &Counts) -> u64 {
    c.iter()
        .filter(|(k, _)| WRITE_VERBS.iter().any(|w| k.starts_with(&format!("{w} "))))
        .map(|(_, v)| v)
        .sum()
}

/// `after - before`, per key.
fn minus(after: &Counts, before: &Counts) -> Counts {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0).min(*v)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// A RoutingTable the benchmark adds (one blackhole route, on every node).
fn table(k: u32) -> Result<RoutingTable> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "netwave.dev/v1alpha1", "kind": "RoutingTable",
        "metadata": {"name": format!("bench-{k}")},
        "spec": {"tableId": 300 + k, "routes": [{"prefix": format!("10.{}.0.0/16", 200 + k), "type": "blackhole"}]},
    }))?)
}

enum Trigger {
    Samples,
    Add(u32),
    /// Remove table `.0`, add table `.1`: the new revision is created paused.
    Swap(u32, u32),
}

struct Scenario {
    label: &'static str,
    trigger: Trigger,
    /// `spec.rollout` set on the (paused) new revision before it is resumed.
    policy: Option<Value>,
    percent: u32,
    /// Canary count and bake seconds.
    canary: Option<(usize, u64)>,
    per_domain_percent: Option<u32>,
    /// Kill the leader once this share of the nodes is updated.
    kill_leader_at: Option<f64>,
}

impl Scenario {
    fn budget(&self, n: usize) -> usize {
        (n * self.percent as usize / 100).max(1)
    }

    /// Nodes in flight at once at best: the budget, or the domains' budgets together if smaller.
    fn concurrency(&self, n: usize) -> usize {
        let budget = self.budget(n);
        match self.per_domain_percent {
            Some(p) => budget.min(ZONES * (n / ZONES * p as usize / 100).max(1)),
            None => budget,
        }
    }

    /// ⌈N / concurrency⌉ × mean(delay); with a canary, its wave (⌈canaries / budget⌉ × mean) and
    /// bake first.
    fn ideal(&self, n: usize) -> f64 {
        let c = self.concurrency(n);
        match self.canary {
            Some((k, bake)) => {
                k.div_ceil(c) as f64 * mean_delay_s()
                    + bake as f64
                    + (n - k).div_ceil(c) as f64 * mean_delay_s()
            }
            None => n.div_ceil(c) as f64 * mean_delay_s(),
        }
    }
}

fn scenarios(n: usize) -> Vec<Scenario> {
    let canaries = (n / 100).max(1);
    vec![
        Scenario {
            label: "1 samples (first rollout)",
            trigger: Trigger::Samples,
            policy: None,
            percent: DEFAULT_PERCENT,
            canary: None,
            per_domain_percent: None,
            kill_leader_at: None,
        },
        Scenario {
            label: "2 +1 RoutingTable",
            trigger: Trigger::Add(2),
            policy: None,
            percent: DEFAULT_PERCENT,
            canary: None,
            per_domain_percent: None,
            kill_leader_at: None,
        },
        Scenario {
            label: "3 maxUnavailable 5%",
            trigger: Trigger::Swap(2, 3),
            policy: Some(json!({"maxUnavailable": "5%"})),
            percent: 5,
            canary: None,
            per_domain_percent: None,
            kill_leader_at: None,
        },
        Scenario {
            label: "4 canary 1% + bake 5 s",
            trigger: Trigger::Swap(3, 4),
            policy: Some(
                json!({"maxUnavailable": "10%", "canary": {"count": canaries, "bakeSeconds": 5}}),
            ),
            percent: 10,
            canary: Some((canaries, 5)),
            per_domain_percent: None,
            kill_leader_at: None,
        },
        Scenario {
            label: "5 10 domains, 10%/domain",
            trigger: Trigger::Swap(4, 5),
            policy: Some(json!({"maxUnavailable": "10%", "topologyKey": ZONE_LABEL,
                "maxUnavailablePerDomain": "10%"})),
            percent: 10,
            canary: None,
            per_domain_percent: Some(10),
            kill_leader_at: None,
        },
        Scenario {
            label: "6 leader killed at 40%",
            trigger: Trigger::Swap(5, 6),
            policy: Some(json!({"maxUnavailable": "10%"})),
            percent: 10,
            canary: None,
            per_domain_percent: None,
            kill_leader_at: Some(0.4),
        },
    ]
}

/// One line of the closing table.
struct Row {
    label: String,
    wall: f64,
    ideal: f64,
    /// [`perfect_wall`], if it applies.
    perfect: Option<f64>,
    p50_ms: f64,
    p99_ms: f64,
    /// Writes per node: all (the agents' status patches included), the configurators'.
    writes: f64,
    configurator_writes: f64,
    leader_rss: Option<f64>,
    leader_cpu: Option<f64>,
    standby_cpu: Option<f64>,
    /// The API server's cost (not for the simulated das-schiff rows).
    cost: Option<Cost>,
    note: String,
}

/// The leader's CPU-seconds per rollout at 5,000 nodes on the testbed when #28 was filed, rollouts 1
/// to 6 in order: the base of its target (at most 20 % of these).
const FILED_CPU_S: [f64; 6] = [16.6, 17.0, 35.7, 19.4, 20.2, 10.2];

fn print_table(kind: ServerKind, n: usize, rows: &[Row]) {
    println!(
        "\n#### {}, N={n}: targets (#28, on the testbed at 5,000 and 15,000) wall <= 1.05 x the \
         instant scheduler's (/instnt), reaction p99 <= 50 ms, <= 2 configurator writes/node (cfg wr), \
         leader RSS <= 250 MiB at 15,000, leader CPU at 5,000 <= 20 % of the filing's",
        kind.name()
    );
    println!(
        "{:<28} {:>7} {:>7} {:>6} {:>7} {:>8} {:>8} {:>7} {:>7} {:>8} {:>8} {:>8} {:>7} {:>7} {:>7} {:>6} {:>7} {:>6} {:>6}  note",
        "rollout",
        "wall s",
        "ideal s",
        "ratio",
        "/instnt",
        "p50 ms",
        "p99 ms",
        "wr/node",
        "cfg wr",
        "RSS MiB",
        "CPU s",
        "stby CPU",
        "srv ms",
        "etcd ms",
        "KiB/nd",
        "ev/nd",
        "agt KiB",
        "agt ev",
        "agt wr"
    );
    let opt = |v: Option<f64>, prec: usize| v.map_or("-".to_string(), |v| format!("{v:.prec$}"));
    for r in rows {
        let c = r.cost.as_ref();
        println!(
            "{:<28} {:>7.1} {:>7.1} {:>6.2} {:>7} {:>8.1} {:>8.1} {:>7.2} {:>7.2} {:>8} {:>8} {:>8} {:>7} {:>7} {:>7} {:>6} {:>7} {:>6} {:>6}  {}",
            r.label,
            r.wall,
            r.ideal,
            r.wall / r.ideal,
            opt(r.perfect.map(|p| r.wall / p), 2),
            r.p50_ms,
            r.p99_ms,
            r.writes,
            r.configurator_writes,
            opt(r.leader_rss, 1),
            opt(r.leader_cpu, 2),
            opt(r.standby_cpu, 2),
            opt(c.map(|c| c.cpu_ms), 2),
            opt(c.and_then(|c| c.etcd_cpu_ms), 2),
            opt(c.map(|c| c.kib), 1),
            opt(c.map(|c| c.events), 2),
            opt(c.map(|c| c.agents_kib), 1),
            opt(c.map(|c| c.agents_events), 2),
            opt(c.map(|c| c.agents_writes), 2),
            r.note
        );
    }
    if kind == ServerKind::Testbed && n == 5_000 {
        let shares: Vec<String> = (rows.iter().filter_map(|r| r.leader_cpu))
            .zip(FILED_CPU_S)
            .map(|(cpu, filed)| format!("{:.1}", 100.0 * cpu / filed))
            .collect();
        println!(
            "leader CPU as % of the filing's (#28: {} CPU-s per rollout, the last the standby that \
             takes over): {} %",
            FILED_CPU_S.map(|c| c.to_string()).join(" / "),
            shares.join(" / ")
        );
    }
    println!(
        "cfg wr = the configurators' writes per node, their Lease writes left out (renewals every \
         --retry-period: time, not nodes; printed per rollout)"
    );
    println!(
        "API server cost per node and rollout: srv ms = CPU ms of the {} process, etcd ms = etcd's (both \
         from /proc); KiB/nd = KiB the server sent (answers to reads, plus watch events: answers to \
         writes are not in it as kube-apiserver has no metric of them; body bytes, by the server's own count: {}), ev/nd = watch events it delivered (one per \
         watch that received it); agt KiB / agt ev = the agents' share of the watch events, as the \
         simulated agents of this process received them (re-encoded as JSON, one event in {SIZE_SAMPLE} measured{}); agt wr = the agents' \
         writes",
        match kind {
            ServerKind::Testbed => "netwave-testbed",
            ServerKind::Apiserver => "kube-apiserver",
        },
        match kind {
            ServerKind::Testbed => "its per-token counters",
            ServerKind::Apiserver =>
                "apiserver_response_sizes (GET, LIST) and apiserver_watch_events_sizes/_total from \
                 /metrics, read before and after each rollout",
        },
        match kind {
            ServerKind::Testbed => "; the testbed's own count of them is printed per rollout",
            ServerKind::Apiserver => "; kube-apiserver's metrics have no user label",
        }
    );
}

/// One fleet: the testbed, two configurators, N agents.
struct Fleet {
    client: Client,
    dir: PathBuf,
    n: usize,
    seen: Arc<Mutex<Observed>>,
    rollout: Arc<Mutex<u64>>,
    /// identity → process (None once killed).
    configurators: Mutex<BTreeMap<String, Option<Proc>>>,
    /// identity → /metrics address.
    metrics: BTreeMap<String, String>,
    tick: f64,
    /// Last: dropped after the configurators.
    server: Server,
}

impl Fleet {
    async fn leader(&self) -> Result<String> {
        let leases = Api::<Lease>::namespaced(self.client.clone(), LEASE.0);
        let started = Instant::now();
        loop {
            if let Some(h) = leases
                .get_opt(LEASE.1)
                .await?
                .and_then(|l| l.spec)
                .and_then(|s| s.holder_identity)
                .filter(|h| !h.is_empty())
                && self
                    .configurators
                    .lock()
                    .unwrap()
                    .get(&h)
                    .is_some_and(Option::is_some)
            {
                return Ok(h);
            }
            if started.elapsed() > Duration::from_secs(60) {
                bail!("no live configurator holds the lease");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The Lease's holder now, if any.
    async fn holder(&self) -> Result<Option<String>> {
        Ok(Api::<Lease>::namespaced(self.client.clone(), LEASE.0)
            .get_opt(LEASE.1)
            .await?
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty()))
    }

    /// (who, pid) of every process measured: configurators (by identity), the server's, this process.
    fn pids(&self) -> Vec<(String, u32)> {
        let mut out: Vec<(String, u32)> = self
            .configurators
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(id, p)| p.as_ref().map(|p| (id.clone(), p.0.id())))
            .collect();
        out.extend(self.server.pids());
        out.push(("this process (agents)".into(), std::process::id()));
        out
    }

    fn usage(&self) -> BTreeMap<String, (f64, f64)> {
        self.pids()
            .into_iter()
            .filter_map(|(who, pid)| usage(pid, self.tick).ok().map(|u| (who, u)))
            .collect()
    }

    /// Fails the rollout, saying why, if a server process is gone or the machine is nearly out of
    /// memory, rather than waiting for a rollout that cannot finish.
    fn check_alive(&self) -> Result<()> {
        let want = match self.server.kind() {
            ServerKind::Testbed => 1,
            ServerKind::Apiserver => 2,
        };
        let pids = self.server.pids();
        let alive = pids
            .iter()
            .filter(|(_, p)| usage(*p, self.tick).is_ok())
            .count();
        if alive < want {
            bail!(
                "a server process is gone (alive: {:?}; see its log under {}); {}",
                pids,
                self.dir.display(),
                resources(&self.pids())
            );
        }
        if let Some(avail) = mem_available_mib()
            && avail < LOW_MEMORY_MIB
        {
            bail!(
                "the machine is nearly out of memory ({avail:.0} MiB available, under {LOW_MEMORY_MIB} \
                 MiB); {}",
                resources(&self.pids())
            );
        }
        Ok(())
    }

    async fn trigger(&self, t: &Trigger) -> Result<()> {
        let tables = Api::<RoutingTable>::all(self.client.clone());
        let pp = PostParams::default();
        match t {
            Trigger::Samples => {
                for m in netwave_api::manifest::samples()? {
                    if let netwave_api::manifest::Manifest::Input(o) = m {
                        let ar = o.kind().api_resource();
                        let api = Api::<DynamicObject>::all_with(self.client.clone(), &ar);
                        drop(api.create(&pp, &o.to_dynamic()).await?);
                    }
                }
            }
            Trigger::Add(k) => drop(tables.create(&pp, &table(*k)?).await?),
            Trigger::Swap(old, new) => {
                drop(
                    tables
                        .delete(&format!("bench-{old}"), &DeleteParams::default())
                        .await?,
                );
                drop(tables.create(&pp, &table(*new)?).await?);
            }
        }
        Ok(())
    }

    /// Triggers `sc`'s change, waits for its revision to be terminal, prints the figures.
    async fn measure(&self, sc: &Scenario, r: u64) -> Result<Row> {
        *self.rollout.lock().unwrap() = r;
        let revs: Api<NetworkConfigRevision> = Api::all(self.client.clone());
        let before: BTreeSet<String> = revs
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .map(|r| r.name_any())
            .collect();
        let mark = {
            let o = self.seen.lock().unwrap();
            (
                o.assigned.len(),
                o.reported.len(),
                o.events,
                (o.event_bytes, o.answer_bytes),
            )
        };
        self.server.reset_counters(&self.client).await?;
        let use0 = self.usage();
        let leader0 = self.leader().await?;
        let hist0 = reconcile_histogram(&self.metrics[&leader0]).await;
        self.trigger(&sc.trigger).await?;
        let started = Instant::now();
        // Listed until it shows, then read by name: the benchmark's own polling stays small in what the
        // server sends.
        let found: Mutex<Option<String>> = Mutex::default();
        let new_revision = || async {
            let known = found.lock().unwrap().clone();
            if let Some(name) = known {
                return anyhow::Ok(revs.get_opt(&name).await?);
            }
            let list = revs.list(&ListParams::default()).await?.items;
            let rev = list.into_iter().find(|r| !before.contains(&r.name_any()));
            *found.lock().unwrap() = rev.as_ref().map(|r| r.name_any());
            anyhow::Ok(rev)
        };
        let mut note = String::new();
        if let Some(policy) = &sc.policy {
            let rev = loop {
                if let Some(rev) = new_revision().await? {
                    break rev;
                }
                if started.elapsed() > Duration::from_secs(30) {
                    bail!("{}: no new revision within 30 s", sc.label);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            if !rev.spec.paused {
                note.push_str("revision was not created paused; ");
            }
            revs.patch(
                &rev.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"paused": false, "rollout": policy}})),
            )
            .await?;
        }
        let mut killed: Option<(Instant, Counts, BTreeMap<String, Counts>, String)> = None;
        // When the standby was first seen holding the Lease after the kill.
        let mut took_over: Option<Instant> = None;
        let (rev, done) = loop {
            let rev = new_revision().await?;
            if let Some(rev) = &rev
                && let Some(st) = &rev.status
                && matches!(
                    RevisionPhase::parse(st.phase.as_deref()),
                    Some(RevisionPhase::Complete | RevisionPhase::Failed)
                )
            {
                break (rev.clone(), Instant::now());
            }
            if let (Some(share), None, Some(rev)) = (sc.kill_leader_at, &killed, &rev) {
                let name = rev.name_any();
                let updated = self.seen.lock().unwrap().reported[mark.1..]
                    .iter()
                    .filter(|a| a.2 == name && a.3 == NodePhase::Provisioned.as_str())
                    .count();
                if updated as f64 >= share * self.n as f64 {
                    let leader = self.leader().await?;
                    let (c, by) = self.server.counters(&self.client).await?;
                    // SIGKILL and reap: no graceful Lease release, the standby waits it out.
                    drop(
                        self.configurators
                            .lock()
                            .unwrap()
                            .insert(leader.clone(), None),
                    );
                    killed = Some((Instant::now(), c, by, leader));
                }
            }
            if let (Some(k), None) = (&killed, took_over)
                && self.holder().await?.is_some_and(|h| h != k.3)
            {
                took_over = Some(Instant::now());
            }
            self.check_alive()?;
            if started.elapsed() > ROLLOUT_LIMIT {
                let st = rev.and_then(|r| r.status).unwrap_or_default();
                bail!(
                    "{}: revision not terminal after {} s: phase {:?}, updated {}, inProgress {}, queued {}, \
                     failed {}: {}; {}",
                    sc.label,
                    ROLLOUT_LIMIT.as_secs(),
                    st.phase,
                    st.updated,
                    st.in_progress,
                    st.queued,
                    st.failed,
                    st.message.unwrap_or_default(),
                    resources(&self.pids())
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let (counts, by_client) = self.server.counters(&self.client).await?;
        let sent = self.server.sent(&self.client).await?;
        let use1 = self.usage();
        let leader = self.leader().await?;
        let hist1 = reconcile_histogram(&self.metrics[&leader]).await;
        let name = rev.name_any();
        let st = rev.status.clone().unwrap_or_default();
        let (assigned, reported, events, agent_bytes) = {
            let o = self.seen.lock().unwrap();
            let assigned: Vec<Instant> = o.assigned[mark.0..]
                .iter()
                .filter(|a| a.2 == name)
                .map(|a| a.0)
                .collect();
            let reported: Vec<Instant> = o.reported[mark.1..]
                .iter()
                .filter(|a| a.2 == name)
                .map(|a| a.0)
                .collect();
            (
                assigned,
                reported,
                o.events - mark.2,
                (o.event_bytes - mark.3.0, o.answer_bytes - mark.3.1),
            )
        };
        let (Some(&first), Some(&last_assigned)) = (assigned.first(), assigned.last()) else {
            bail!("{}: revision {name} was assigned to no node", sc.label);
        };
        let last_answer = reported.iter().copied().max().unwrap_or(first);
        // Reaction: each status observed while nodes still wait → the next assignment observed. Not
        // counted: reports while nothing may move by design — the canary wave and bake (until the
        // first assignment after the bake, which the revision's `canariesUpdatedAt` dates) and the
        // failover (leader killed → the new leader's first assignment). Not the (k+1)-th assignment:
        // a canary that fails is followed by an assignment of its own within the wave (at 15,000
        // nodes one of the 150 canaries fails), and the reports of the others, which wait for the
        // wave and the bake by design, then read as reactions of seconds.
        let canary_gate = sc
            .canary
            .and_then(|(k, bake)| match st.canaries_updated_at.as_ref() {
                Some(t) => {
                    let baked = instant_at(t.0.as_millisecond()) + Duration::from_secs(bake);
                    assigned.iter().find(|a| **a >= baked).copied()
                }
                None => assigned.get(k).copied(),
            });
        // The failover: from the old leader's last assignment to the new leader's first — the first
        // seen after the standby holds the Lease: the old leader's last writes may still be on their
        // way after the kill (a loaded API server).
        let takeover = killed.as_ref().map(|k| took_over.unwrap_or(k.0).max(k.0));
        let failover_gate = killed.as_ref().zip(takeover).and_then(|(k, after)| {
            let from = assigned
                .iter()
                .rev()
                .find(|a| **a <= k.0)
                .copied()
                .unwrap_or(k.0);
            Some((from, *assigned.iter().find(|a| **a > after)?))
        });
        let gated = |t: Instant| {
            canary_gate.is_some_and(|g| t < g)
                || failover_gate.is_some_and(|(from, to)| t >= from && t < to)
        };
        // With per-domain budgets a report frees a slot only in its own failure domain (node-i is in
        // zone i % ZONES): its reaction is the next assignment there. A report from a domain where
        // nobody waits any more is followed by no assignment of its own and is not counted (it used
        // to be, up to the next assignment elsewhere).
        let zone = |node: &str| -> usize {
            sc.per_domain_percent
                .and_then(|_| node.strip_prefix("node-")?.parse::<usize>().ok())
                .map_or(0, |i| i % ZONES)
        };
        let (assigned_in, reported_in) = {
            let o = self.seen.lock().unwrap();
            let of = |at: Instant, node: &str| (at, zone(node));
            let assigned: Vec<(Instant, usize)> = (o.assigned[mark.0..].iter())
                .filter(|a| a.2 == name)
                .map(|a| of(a.0, &a.1))
                .collect();
            let reported: Vec<(Instant, usize)> = (o.reported[mark.1..].iter())
                .filter(|a| a.2 == name)
                .map(|a| of(a.0, &a.1))
                .collect();
            (assigned, reported)
        };
        let mut reaction: Vec<Duration> = reported_in
            .iter()
            .filter(|(r, _)| *r < last_assigned && !gated(*r))
            .filter_map(|(r, z)| {
                let (a, _) = assigned_in.iter().find(|(a, za)| za == z && a >= r)?;
                Some(*a - *r)
            })
            .collect();
        reaction.sort();
        let excluded = reported
            .iter()
            .filter(|r| **r < last_assigned && gated(**r))
            .count();
        let n = self.n as f64;
        let ideal = sc.ideal(self.n);
        let wall = (last_answer - first).as_secs_f64();
        let wall_done = (done - first).as_secs_f64();
        let phase = st.phase.as_deref().unwrap_or("?");
        println!(
            "\n== {}: rollout {}: N={} maxUnavailable {}% (budget {}, at most {} in flight), revision {name} \
             {phase}: updated {} failed {} of {}",
            self.server.kind().name(),
            sc.label,
            self.n,
            sc.percent,
            sc.budget(self.n),
            sc.concurrency(self.n),
            st.updated,
            st.failed,
            st.total
        );
        println!(
            "wall: first assignment -> last answer {wall:.1} s, -> revision {phase} {wall_done:.1} s \
             (silent nodes wait out applyTimeout {APPLY_TIMEOUT_S} s); input -> first assignment {:.2} s",
            (first - started).as_secs_f64()
        );
        let perfect = perfect_wall(self.n, r, sc);
        println!(
            "ideal: {ideal:.1} s; ratio {:.3} (to last answer), {:.3} (to terminal); an instant \
             scheduler over the same agents: {perfect:.1} s (ratio {:.3}), so the configurator's own \
             share is {:.3}",
            wall / ideal,
            wall_done / ideal,
            perfect / ideal,
            wall / perfect
        );
        if let Some(p) = sc.per_domain_percent {
            let slots = (self.n / ZONES * p as usize / 100).max(1);
            let domains: Vec<String> = (0..ZONES)
                .map(|z| {
                    let first = (assigned_in.iter().filter(|a| a.1 == z)).map(|a| a.0).min();
                    let last = (reported_in.iter().filter(|a| a.1 == z)).map(|a| a.0).max();
                    let wall = first.zip(last).map_or(0.0, |(f, l)| (l - f).as_secs_f64());
                    let perfect = pipeline(self.n, r, slots, None, |i| i % ZONES == z);
                    let (mut silent, mut failing) = (0, 0);
                    for i in (z..self.n).step_by(ZONES) {
                        match fate(i, self.n, r).0 {
                            Answer::Silent => silent += 1,
                            Answer::Invalid { .. } => failing += 1,
                            _ => {}
                        }
                    }
                    format!("z{z} {wall:.1}/{perfect:.1} s ({silent} silent, {failing} failing)")
                })
                .collect();
            println!(
                "per domain, first assignment -> last answer / the instant scheduler's: {}",
                domains.join(", ")
            );
        }
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "reaction (status observed -> next assignment observed, in its failure domain with per-domain \
             budgets; {} samples; {excluded} during the \
             canary wave and bake or the failover not counted): median {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            reaction.len(),
            ms(percentile(&reaction, 0.5)),
            ms(percentile(&reaction, 0.99)),
            ms(reaction.last().copied().unwrap_or_default())
        );
        let delivered: Vec<Duration> = {
            let o = self.seen.lock().unwrap();
            let mut d: Vec<Duration> = (o.assigned[mark.0..].iter())
                .zip(&o.delivered_ms[mark.0..])
                .filter(|(a, _)| a.2 == name)
                .filter_map(|(_, ms)| ms.map(|ms| Duration::from_millis(ms.max(0) as u64)))
                .collect();
            d.sort_unstable();
            d
        };
        println!(
            "spec delivery (netwave.dev/assigned-at, stamped when the configurator sends the write -> \
             the agents' watch here; the pickup timeout, {APPLY_TIMEOUT_S} s, counts it): median {:.1} ms, \
             p99 {:.1} ms, max {:.1} ms, {} of {} over half the timeout",
            ms(percentile(&delivered, 0.5)),
            ms(percentile(&delivered, 0.99)),
            ms(delivered.last().copied().unwrap_or_default()),
            (delivered.iter())
                .filter(|d| d.as_secs_f64() > APPLY_TIMEOUT_S as f64 / 2.0)
                .count(),
            delivered.len()
        );
        println!(
            "watch events received by the agents' watch: {events} ({:.2} per node); load average \
             (1, 5 min) now {} (2 cores, shared with whatever else runs)",
            events as f64 / n,
            loadavg()
        );
        let total: u64 = counts.values().sum();
        let written = writes(&counts);
        println!(
            "API requests {total} ({:.2}/node), writes {written} ({:.2}/node; the agents' status patches \
             are about 1/node of them):",
            total as f64 / n,
            written as f64 / n
        );
        for (k, v) in &counts {
            println!("  {k:<40} {v:>8} {:>8.3}/node", *v as f64 / n);
        }
        // The configurators' writes per node leave out their Lease writes: renewals come every
        // --retry-period (300 ms here, for a fast failover), so they are time, not nodes.
        let (mut cfg_writes, mut lease_writes) = (0, 0);
        println!("per client (requests, writes per node):");
        for (who, c) in &by_client {
            let (t, w) = (c.values().sum::<u64>(), writes(c));
            if who.starts_with("configurator-") {
                let leases: Counts = (c.iter())
                    .filter(|(k, _)| k.ends_with(" leases"))
                    .map(|(k, v)| (k.clone(), *v))
                    .collect();
                let lease = writes(&leases);
                cfg_writes += w - lease;
                lease_writes += lease;
            }
            let role = if *who == leader {
                " (leader at the end)"
            } else {
                ""
            };
            println!(
                "  {:<40} {t:>8} {:>8.3}/node, writes {w:>8} {:>8.3}/node",
                format!("{who}{role}"),
                t as f64 / n,
                w as f64 / n
            );
        }
        println!(
            "configurators' writes per node without their Lease writes (renewals every --retry-period: \
             time, not nodes): {:.3}; Lease writes {lease_writes}",
            cfg_writes as f64 / n
        );
        if let (Some(a), Some(b)) = (&hist0, &hist1)
            && leader == leader0
        {
            let (count, mean, p50, p99) = reconcile_delta(&a.0, &b.0);
            let (_, compute, c50, c99) = reconcile_delta(&a.1, &b.1);
            println!(
                "leader reconciles: {count} ({:.1}/s of wall), mean {:.1} ms, 50% under {:.1} ms, 99% \
                 under {:.1} ms (histogram bounds; a report waits for the reconcile in progress and \
                 then its own); before the writes (snapshot, plan, metrics): mean {:.1} ms, 50% under \
                 {:.1} ms, 99% under {:.1} ms; the rest is the API writes",
                count as f64 / wall_done.max(0.001),
                mean * 1e3,
                p50 * 1e3,
                p99 * 1e3,
                compute * 1e3,
                c50 * 1e3,
                c99 * 1e3
            );
        }
        for (who, (rss, cpu)) in &use1 {
            let before = use0.get(who).map_or(0.0, |u| u.1);
            println!(
                "  {who:<40} peak RSS {rss:>7.1} MiB, CPU {:>6.2} s this rollout",
                cpu - before
            );
        }
        let cpu_of = |who: &str| {
            use1.get(who)
                .map(|u| u.1 - use0.get(who).map_or(0.0, |b| b.1))
        };
        let cost = self.cost(&sent, events, agent_bytes, &by_client, &cpu_of);
        cost.print(&sent, n, self.server.kind());
        let standby = use1
            .keys()
            .find(|k| k.starts_with("configurator-") && **k != leader)
            .cloned();
        if let Some((at, c0, by0, old)) = killed {
            let until = at + FAILOVER_WINDOW;
            if let Some(wait) = until.checked_duration_since(Instant::now()) {
                tokio::time::sleep(wait).await;
            }
            let (c1, by1) = self.server.counters(&self.client).await?;
            let d = minus(&c1, &c0);
            let after = takeover.unwrap_or(at);
            let taken = assigned.iter().find(|a| **a > after).map(|a| *a - at);
            println!(
                "leader {old} killed at {:.1} s into the rollout; standby seen holding the Lease {:.2} s \
                 later, its first assignment {}; in the {} s after the kill: {} requests, {} writes \
                 ({:.3}/node):",
                (at - first).as_secs_f64(),
                (after - at).as_secs_f64(),
                taken.map_or("none".into(), |t| format!("{:.2} s later", t.as_secs_f64())),
                FAILOVER_WINDOW.as_secs(),
                d.values().sum::<u64>(),
                writes(&d),
                writes(&d) as f64 / n
            );
            for (k, v) in &d {
                println!("  {k:<40} {v:>8}");
            }
            let left = assigned.iter().filter(|a| **a > at).count();
            println!(
                "  (the rollout assigned {left} nodes after the kill: a new leader that rewrote what is \
                 done would patch far more nodeconfigs than that)"
            );
            for (who, c) in &by1 {
                let dc = minus(c, by0.get(who).unwrap_or(&Counts::new()));
                println!(
                    "  by {who:<37} {:>8} requests, {:>8} writes",
                    dc.values().sum::<u64>(),
                    writes(&dc)
                );
            }
            note = format!(
                "{note}failover: {} writes in {} s ({:.3}/node)",
                writes(&d),
                FAILOVER_WINDOW.as_secs(),
                writes(&d) as f64 / n
            );
        }
        Ok(Row {
            label: sc.label.to_string(),
            wall,
            ideal,
            perfect: Some(perfect),
            p50_ms: ms(percentile(&reaction, 0.5)),
            p99_ms: ms(percentile(&reaction, 0.99)),
            writes: written as f64 / n,
            configurator_writes: cfg_writes as f64 / n,
            leader_rss: use1.get(&leader).map(|u| u.0),
            leader_cpu: cpu_of(&leader),
            standby_cpu: standby.as_deref().and_then(cpu_of),
            cost: Some(cost),
            note,
        })
    }

    /// The API server's cost of one rollout per node, from what the server and this process counted.
    fn cost(
        &self,
        sent: &Sent,
        agent_events: u64,
        (agent_bytes, agent_answers): (u64, u64),
        by_client: &BTreeMap<String, Counts>,
        cpu_of: &dyn Fn(&str) -> Option<f64>,
    ) -> Cost {
        let n = self.n as f64;
        let (server, etcd) = match self.server.kind() {
            ServerKind::Testbed => (cpu_of("netwave-testbed"), None),
            ServerKind::Apiserver => (cpu_of("kube-apiserver"), cpu_of("etcd")),
        };
        Cost {
            cpu_ms: server.unwrap_or(f64::NAN) * 1e3 / n,
            etcd_cpu_ms: etcd.map(|c| c * 1e3 / n),
            kib: sent.bytes() / 1024.0 / n,
            events: sent.events() / n,
            agents_kib: agent_bytes as f64 / 1024.0 / n,
            agents_answers_kib: agent_answers as f64 / 1024.0 / n,
            agents_events: agent_events as f64 / n,
            agents_writes: by_client.get("agents").map_or(0, writes) as f64 / n,
        }
    }
}

/// The API server's cost of one rollout, per node.
#[derive(Debug, Clone)]
struct Cost {
    /// CPU ms of the server process (the testbed, or kube-apiserver) and of etcd, from /proc.
    cpu_ms: f64,
    etcd_cpu_ms: Option<f64>,
    /// KiB sent (answers + watch events) and watch events delivered, by the server's count.
    kib: f64,
    events: f64,
    /// The agents' share as received here (watch events re-encoded), and the answers to their writes.
    agents_kib: f64,
    agents_answers_kib: f64,
    agents_events: f64,
    /// The agents' writes (their status applies).
    agents_writes: f64,
}

impl Cost {
    fn print(&self, sent: &Sent, n: f64, kind: ServerKind) {
        let server = match kind {
            ServerKind::Testbed => format!("netwave-testbed {:.2} ms", self.cpu_ms),
            ServerKind::Apiserver => format!(
                "kube-apiserver {:.2} ms, etcd {:.2} ms",
                self.cpu_ms,
                self.etcd_cpu_ms.unwrap_or(f64::NAN)
            ),
        };
        println!(
            "API server cost per node: CPU {server} (from /proc); sent {:.2} KiB: answers to reads \
             {:.2} KiB, watch events {:.2} KiB in {:.2} events (one per watch that received it; body \
             bytes as the server counts them: kube-apiserver's response (reads only) and watch-event \
             size metrics, the testbed's per-token counters); this benchmark's own polling (revisions, \
             Lease) is in them",
            self.kib,
            sent.read_bytes / 1024.0 / n,
            sent.watch_bytes.values().sum::<f64>() / 1024.0 / n,
            self.events
        );
        for (r, e) in &sent.watch_events {
            println!(
                "  watch events {r:<30} {:>8.2}/node, {:>8.2} KiB/node ({:.0} B each)",
                e / n,
                sent.watch_bytes.get(r).copied().unwrap_or(0.0) / 1024.0 / n,
                sent.watch_bytes.get(r).copied().unwrap_or(0.0) / e.max(1.0)
            );
        }
        for (who, (b, e)) in &sent.by_client {
            println!(
                "  sent to {who:<35} {:>8.2} KiB/node, {:>6.2} watch events/node (testbed's count)",
                b / 1024.0 / n,
                e / n
            );
        }
        if let Some(w) = sent.write_answer_bytes {
            println!(
                "  answers to writes (testbed's count; kube-apiserver has no metric of them) {:.2} KiB/node",
                w / 1024.0 / n
            );
        }
        if let Some(e) = sent.etcd_bytes {
            println!(
                "  etcd -> kube-apiserver (gRPC, etcd's count) {:.2} KiB/node",
                e / 1024.0 / n
            );
        }
        println!(
            "the agents' share, as received by the simulated agents here (their NNC watches' events \
             re-encoded as JSON, one in {SIZE_SAMPLE} measured): {:.2} KiB/node in {:.2} watch events/node; their \
             writes {:.2}/node, answered with {:.2} KiB/node",
            self.agents_kib, self.agents_events, self.agents_writes, self.agents_answers_kib
        );
    }
}

/// das-schiff's rules over the same agents as rollout 2 (`fate(_, n, 2)`): rows for the table.
fn das_schiff_rows(n: usize) -> Vec<Row> {
    let budget = (n * DEFAULT_PERCENT as usize / 100).max(1);
    let ideal = n.div_ceil(budget) as f64 * mean_delay_s();
    let agents = |healthy: bool| -> Vec<das_schiff::Agent> {
        (0..n)
            .map(|i| {
                let (answer, delay) = fate(i, n, 2);
                das_schiff::Agent {
                    delay_ms: delay.as_millis() as u64,
                    answer: match answer {
                        _ if healthy => das_schiff::Answer::Provisioned,
                        Answer::Provisioned => das_schiff::Answer::Provisioned,
                        Answer::Invalid { .. } => das_schiff::Answer::Invalid,
                        Answer::Silent => das_schiff::Answer::Silent,
                    },
                }
            })
            .collect()
    };
    let mut rows = Vec::new();
    for (max_updating, healthy) in [(1, true), (budget, true), (budget, false)] {
        let o = das_schiff::run(
            &agents(healthy),
            &das_schiff::Params {
                max_updating,
                debounce_ms: 1000,
                revisions: 2,
                limit_ms: 24 * 3600 * 1000,
            },
        );
        let reaction = o.reactions_ms();
        let pct = |p: f64| {
            if reaction.is_empty() {
                0.0
            } else {
                reaction[((reaction.len() - 1) as f64 * p).round() as usize] as f64
            }
        };
        let end = match o.end {
            das_schiff::End::Complete => "complete".to_string(),
            das_schiff::End::Invalidated { node } => format!(
                "revision invalidated by node-{node}'s Invalid after {} of {n} nodes",
                o.updated
            ),
            das_schiff::End::Stuck => {
                format!("stuck behind silent nodes after {} nodes", o.updated)
            }
            das_schiff::End::TimeLimit => "time limit".to_string(),
        };
        rows.push(Row {
            label: format!(
                "das-schiff maxUpd {max_updating}{}",
                if healthy { "" } else { " +fails" }
            ),
            wall: o.wall_ms().unwrap_or(0) as f64 / 1000.0,
            ideal,
            perfect: None,
            p50_ms: pct(0.5),
            p99_ms: pct(0.99),
            writes: (o.writes() + o.reports_ms.len() as u64) as f64 / n as f64,
            configurator_writes: o.writes() as f64 / n as f64,
            leader_rss: None,
            leader_cpu: None,
            standby_cpu: None,
            cost: None,
            note: format!("{end}; {} passes (simulated)", o.passes),
        });
    }
    rows
}

async fn bench(bins: &Path, kind: ServerKind, n: usize) -> Result<()> {
    let dir = std::env::temp_dir().join(format!(
        "netwave-bench-fleet-{}-{}-{n}",
        std::process::id(),
        kind.name()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let server = Server::start(kind, bins, &dir).await?;
    let client = server.client("bench").await?;
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": LEASE.0}}))?,
        )
        .await?;
    let setup = Instant::now();
    warm_up(&client).await?;
    let nodes = Api::<Node>::all(client.clone());
    futures::stream::iter(0..n)
        .map(|i| {
            let nodes = nodes.clone();
            async move {
                let name = format!("node-{i}");
                let pool = if i % 2 == 0 { "compute" } else { "storage" };
                let node: Node = serde_json::from_value(json!({
                    "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                        "node-restriction.kubernetes.io/netwave-pool": pool, ZONE_LABEL: format!("zone-{}", i % ZONES)}},
                    "spec": {},
                }))?;
                nodes.create(&PostParams::default(), &node).await?;
                let status = json!({"status": {
                    "conditions": [{"type": node_conditions::READY, "status": ConditionStatus::True.as_str()}],
                    "addresses": [{"type": "InternalIP", "address": format!("198.18.{}.{}", i / 250, i % 250 + 1)}],
                }});
                nodes
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
                    .await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>>>()
        .with_context(|| {
            format!(
                "creating {n} Nodes on the {}: {}",
                kind.name(),
                resources(&server.pids())
            )
        })?;
    let seen: Arc<Mutex<Observed>> = Arc::default();
    let rollout = Arc::new(Mutex::new(0));
    let agent_watch = AgentWatch::from_env()?;
    let agents = spawn_agents(
        server.client("agents").await?,
        n,
        agent_watch,
        rollout.clone(),
        seen.clone(),
    );
    let silent = (0..n)
        .filter(|&i| fate(i, n, 0).0 == Answer::Silent)
        .count();
    let failing = (0..n)
        .filter(|&i| matches!(fate(i, n, 0).0, Answer::Invalid { .. }))
        .count();
    let max_failures = 2 * (silent + failing) + 1;
    let mut configurators = BTreeMap::new();
    let mut metrics = BTreeMap::new();
    for i in 0..2 {
        let id = format!("configurator-{i}");
        let (p, addr) = start_configurator(bins, &server, &dir, &id, max_failures)?;
        configurators.insert(id.clone(), Some(p));
        metrics.insert(id, addr);
    }
    let fleet = Fleet {
        client,
        dir,
        n,
        seen,
        rollout,
        configurators: Mutex::new(configurators),
        metrics,
        tick: clock_tick(),
        server,
    };
    let leader = fleet.leader().await?;
    println!(
        "\n#### fleet rollout benchmark on the {}: N={n}, {silent} silent and {failing} failing agents, \
         apply delay uniform {}-{} ms (seed {SEED}), maxFailures {max_failures}, {ZONES} zones; setup \
         {:.1} s; leader {leader}; coalesce window {}, reaction target {}; {}; {}; logs in {}",
        kind.name(),
        DELAY_MS.0,
        DELAY_MS.1,
        setup.elapsed().as_secs_f64(),
        coalesce_window().unwrap_or_else(|| "default".into()),
        reaction_target().unwrap_or_else(|| "default".into()),
        fleet.server.auth(),
        agent_watch.describe(),
        fleet.dir.display()
    );
    let mut rows = Vec::new();
    for (r, sc) in scenarios(n).iter().enumerate() {
        rows.push(fleet.measure(sc, r as u64 + 1).await?);
    }
    rows.extend(das_schiff_rows(n));
    print_table(kind, n, &rows);
    agents.abort();
    let dir = fleet.dir.clone();
    drop(fleet);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let bins = bin_dir()?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sizes: Vec<String> = if !args.is_empty() {
        args
    } else if let Ok(v) = std::env::var("BENCH_FLEET_SIZES") {
        v.split([',', ' '])
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect()
    } else {
        vec!["1000".into()]
    };
    let servers = std::env::var("BENCH_FLEET_SERVERS")
        .unwrap_or_else(|_| "testbed,apiserver".into())
        .split([',', ' '])
        .filter(|s| !s.is_empty())
        .map(ServerKind::parse)
        .collect::<Result<Vec<_>>>()?;
    // kube-apiserver took ~3 GiB at 5,000 nodes (#28) and its rollouts run several times slower than
    // the testbed's: larger fleets are measured on it only when asked.
    let apiserver_max: usize = match std::env::var("BENCH_FLEET_APISERVER_MAX") {
        Ok(v) => v
            .parse()
            .with_context(|| format!("BENCH_FLEET_APISERVER_MAX={v:?} is not a count"))?,
        Err(_) => 5000,
    };
    let mut failed = Vec::new();
    for s in sizes {
        let n: usize = s
            .parse()
            .with_context(|| format!("bench_fleet: size {s:?} is not a count"))?;
        for &kind in &servers {
            if kind == ServerKind::Apiserver && n > apiserver_max {
                println!(
                    "\n#### apiserver, N={n}: not run: over BENCH_FLEET_APISERVER_MAX={apiserver_max} \
                     (kube-apiserver took ~3 GiB at 5,000 nodes on this 24 GiB machine; set it to run)"
                );
                continue;
            }
            // A size one server cannot carry (a rollout past its limit, memory exhausted) is reported
            // and the run goes on with the next.
            if let Err(e) = bench(&bins, kind, n).await {
                println!(
                    "\n#### {}, N={n}: FAILED: {e:#}\n(load average now {})",
                    kind.name(),
                    loadavg()
                );
                failed.push(format!("{} N={n}", kind.name()));
            }
        }
    }
    if !failed.is_empty() {
        bail!("bench_fleet: failed: {}", failed.join(", "));
    }
    Ok(())
}
