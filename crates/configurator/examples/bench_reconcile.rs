//! The leader's reconcile without the API server (#14): [`compute`] on an in-memory fleet of
//! N nodes, fed back its own writes, to tell the reconcile's compute time from its write time in the
//! fleet benchmark's "reconcile duration".
//!
//! `cargo run --release -p netwave-configurator --example bench_reconcile [N...]` (default 1000 5000)
//!
//! ```text
//!  snapshot (samples, N Ready nodes, their NodeNetworkConfigs as the watch cache holds them)
//!      │  compute() ──► intents ──► applied to the snapshot (what the watches would deliver)
//!      └─ agents answer ◄────────────────────────────────────────────────────────────┘
//! ```
//!
//! Two rollouts per size, with the configurator's defaults (maxUnavailable 10%):
//! 1. the first rollout of an empty fleet, every in-flight node answering `Provisioned` between two
//!    reconciles (a reconcile per wave);
//! 2. one layer-2 MTU changed: one agent answers between two reconciles, as when each status event
//!    wakes the reconcile — the reconciles behind the reaction latency.
//!
//! Printed per rollout: reconciles, the time per reconcile before its writes (compute, plus the metrics
//! the leader records: what `netwave_reconcile_compute_duration_seconds` measures) as median, p99 and
//! max, the one-node baseline (the same rollouts on 1 node) so the ratio says what grows with the
//! fleet, and the CPU seconds of the whole rollout (which other work on the machine does not inflate
//! as it does the wall-clock times).
//!
//! Each rollout runs twice: told which nodes and node configs changed since the last reconcile, as the
//! configurator's watches tell it (#28), and, as the baseline in the same run, reading them whole.

use netwave_api::vocab::RevisionPhase;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use netwave_agent::sim::{Answer, status_for};
use netwave_api::NodeNetworkConfigStatus;
use netwave_configurator::decide::{Settings, compute};
use netwave_configurator::memory::Memory;
use netwave_configurator::metrics::Metrics;
use netwave_configurator::record::{ApplyTimes, record};
use netwave_configurator::snapshot::{Snapshot, fold_inputs};
use netwave_configurator::testing::inmem::{self, apply};
use netwave_core::Timestamp;
use netwave_core::revision::InputSettle;

/// Seconds between two reconciles in simulated time (an agent's apply delay).
const STEP_MS: i64 = 2_000;

/// Lets up to `max` agents whose spec is not answered yet report `Provisioned`; how many did.
fn answer(s: &mut Snapshot, max: usize) -> usize {
    let mut done = 0;
    for c in s.node_configs.iter_mut() {
        if done == max {
            break;
        }
        if c.spec.is_placeholder() {
            continue;
        }
        let st = c.status.clone().unwrap_or_default();
        if st.observed_revision.as_deref() == Some(c.spec.revision.as_str())
            && st.config_hash.as_deref() == Some(c.spec.config_hash.as_str())
        {
            continue;
        }
        let Some(v) = status_for(c, &Answer::Provisioned) else {
            continue;
        };
        let status: NodeNetworkConfigStatus = serde_json::from_value(v["status"].clone())
            .expect("the simulated agent's status parses");
        Arc::make_mut(c).status = Some(status);
        done += 1;
    }
    done
}

/// The rollout is over: the revision of the current inputs reads Complete.
fn complete(s: &Snapshot) -> bool {
    let hash = netwave_core::revision::inputs_hash(&fold_inputs(s));
    s.revisions
        .iter()
        .find(|r| r.spec.hash == hash)
        .and_then(|r| r.status.as_ref())
        .and_then(|st| st.phase.as_deref())
        == Some(RevisionPhase::Complete.as_str())
}

struct Run {
    reconciles: usize,
    compute: Vec<Duration>,
    /// CPU time of the reconciles' compute over the whole rollout (sampled by the kernel's tick: exact
    /// in sum, not per reconcile).
    cpu: Duration,
}

/// CPU time this process has used (user + system, from /proc; Linux counts it in 1/100 s). Unlike the
/// wall clock, it does not grow when other work shares the cores.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat reads");
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')').expect("a command name") + 2..];
    let ticks: u64 = rest
        .split(' ')
        .skip(11)
        .take(2)
        .map(|f| f.parse::<u64>().expect("a tick count"))
        .sum();
    Duration::from_millis(ticks * 10)
}

/// What the leader keeps between reconciles.
struct Leader {
    settings: Settings,
    cache: Memory,
    settle: InputSettle,
    metrics: Metrics,
    apply_times: ApplyTimes,
    /// Tell the reconcile which nodes and node configs changed, as the watches do (else it reads
    /// them all, the baseline).
    by_change: bool,
    /// Each node's and node config's object at the last reconcile, by name.
    last_nodes: BTreeMap<String, usize>,
    last_configs: BTreeMap<String, usize>,
}

/// The names of the objects that came, went or were replaced since `last` (updated to now).
fn changed<K: kube::Resource>(
    list: &[Arc<K>],
    last: &mut BTreeMap<String, usize>,
) -> BTreeSet<String> {
    let now: BTreeMap<String, usize> = list
        .iter()
        .map(|o| {
            (
                o.meta().name.clone().unwrap_or_default(),
                Arc::as_ptr(o) as usize,
            )
        })
        .collect();
    let names = (now.keys().chain(last.keys()))
        .filter(|k| now.get(*k) != last.get(*k))
        .cloned()
        .collect();
    *last = now;
    names
}

/// Reconciles until the current inputs' revision is Complete, letting `per_step` agents answer
/// between two reconciles.
fn roll_out(s: &mut Snapshot, l: &mut Leader, now: &mut Timestamp, per_step: usize) -> Run {
    let mut run = Run {
        reconciles: 0,
        compute: Vec::new(),
        cpu: Duration::ZERO,
    };
    for _ in 0..200_000 {
        // As the watches tell the configurator: which nodes and node configs changed since the last
        // reconcile (not timed: the watches do this as events arrive).
        if l.by_change {
            let nodes = changed(&s.nodes, &mut l.last_nodes);
            let configs = changed(&s.node_configs, &mut l.last_configs);
            s.changed_by_hand(nodes, configs);
        }
        // What the leader does before its writes (`netwave_reconcile_compute_duration_seconds`).
        let t = Instant::now();
        let cpu = cpu_time();
        let outcome = compute(s, &l.settings, &mut l.cache, &mut l.settle, *now);
        if let Some(plan) = &outcome.plan {
            record(&l.metrics, s, plan, outcome.quarantined);
            l.apply_times
                .observe(&outcome.configs, &outcome.changes, *now, &l.metrics);
        }
        run.compute.push(t.elapsed());
        run.cpu += cpu_time() - cpu;
        run.reconciles += 1;
        apply(s, outcome.intents, *now);
        if complete(s) {
            return run;
        }
        answer(s, per_step);
        *now = Timestamp(now.0 + if per_step == usize::MAX { STEP_MS } else { 10 });
    }
    panic!("the rollout did not complete in 200,000 reconciles");
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

/// Both rollouts on `n` nodes: (first, second); `by_change`: the reconcile is told what changed.
fn fleet(n: usize, by_change: bool) -> (Run, Run) {
    let settings = inmem::settings();
    let mut s = inmem::samples_snapshot((0..n).map(|i| format!("node-{i:05}")));
    let mut leader = Leader {
        settings,
        cache: Memory::default(),
        settle: InputSettle::default(),
        metrics: Metrics::default(),
        apply_times: ApplyTimes::default(),
        by_change,
        last_nodes: BTreeMap::new(),
        last_configs: BTreeMap::new(),
    };
    let mut now = Timestamp(1_800_000_000_000);
    let first = roll_out(&mut s, &mut leader, &mut now, usize::MAX);
    let l2 = Arc::make_mut(&mut s.inputs.layer2s[0]);
    l2.spec.mtu -= 100;
    let second = roll_out(&mut s, &mut leader, &mut now, 1);
    (first, second)
}

fn main() {
    let sizes: Vec<usize> = {
        let args: Vec<usize> = std::env::args()
            .skip(1)
            .filter_map(|a| a.parse().ok())
            .collect();
        if args.is_empty() {
            vec![1000, 5000]
        } else {
            args
        }
    };
    let (_, base) = fleet(1, true);
    let mut base = base.compute;
    base.sort();
    let base_median = quantile(&base, 0.5);
    println!(
        "reconcile compute (no API server), samples, maxUnavailable 10%; baseline: 1 node, median {} ms",
        ms(base_median)
    );
    println!(
        "{:>6}  {:<36}  {:>10}  {:>8}  {:>8}  {:>8}  {:>9}  {:>7}",
        "nodes", "rollout", "reconciles", "p50 ms", "p99 ms", "max ms", "p50/base", "CPU s"
    );
    let mut seen: BTreeMap<usize, ()> = BTreeMap::new();
    for n in sizes {
        if seen.insert(n, ()).is_some() {
            continue;
        }
        let (first, second) = fleet(n, true);
        let (first_whole, second_whole) = fleet(n, false);
        for (what, run) in [
            ("first rollout (a reconcile per wave)", first),
            ("  same, nodes and configs read whole", first_whole),
            ("MTU change (one report per reconcile)", second),
            ("  same, nodes and configs read whole", second_whole),
        ] {
            let mut c = run.compute;
            c.sort();
            let p50 = quantile(&c, 0.5);
            println!(
                "{:>6}  {:<36}  {:>10}  {:>8}  {:>8}  {:>8}  {:>9.0}  {:>7.2}",
                n,
                what,
                run.reconciles,
                ms(p50),
                ms(quantile(&c, 0.99)),
                ms(*c.last().expect("at least one reconcile")),
                p50.as_secs_f64() / base_median.as_secs_f64(),
                run.cpu.as_secs_f64()
            );
        }
    }
}
