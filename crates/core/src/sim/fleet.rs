//! The seeded fleet: agents, world events, admins and a killable leader around one [`Store`].

use netwave_api::vocab::NodeReason;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use netwave_api::{Canary, RolloutPolicy};
use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use sha2::{Digest, Sha256};
use thiserror::Error;

use super::store::Store;
use crate::render::{InputKind, InputRef};
use crate::rollout::hold;
use crate::rollout::{
    AgentPhase, AgentReport, AssignReason, Budget, Phase, Plan, PolicyDefaults,
    REASON_APPLY_TIMEOUT, REASON_PICKUP_TIMEOUT, RolloutInput, StepMemo, Write, is_in_flight,
    is_updated, resolve, step,
};
use crate::sym::Sym;
use crate::types::Timestamp;

/// The label that names a node's failure domain in the simulation.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// Fault probabilities. Per-apply ones are drawn when an agent starts applying; per-tick ones once per
/// node (flap, crash) or once per tick (join, leave, kill_step); `kill_write` before every leader write.
#[derive(Clone, Debug, PartialEq)]
pub struct Faults {
    /// The apply fails: the agent restores its last good config and reports `Invalid`.
    pub fail: f64,
    /// The agent starts this apply (reports `Provisioning`) but never reports on it (until it
    /// restarts): the apply timeout, counted from its start, catches it.
    pub hang: f64,
    /// The agent sees a new spec late (an overloaded API server delivers it after 1 to
    /// [`Faults::late_secs`] s), then applies it as usual: its apply timeout counts from that late
    /// start, so it fails only if it starts after the pickup deadline.
    pub late: f64,
    pub late_secs: u64,
    /// The agent never takes up a new spec (a dead agent, a deleted pod; until it restarts): it
    /// reports nothing, and the pickup deadline, counted from the assignment, catches it.
    pub deaf: f64,
    /// The agent process restarts (down 1–5 s); an apply in progress is rolled back locally and redone.
    pub crash: f64,
    /// The node goes Not Ready or is cordoned for 1–20 s.
    pub flap: f64,
    pub join: f64,
    pub leave: f64,
    /// The leader dies before a write: the rest of its plan is lost.
    pub kill_write: f64,
    /// No leader this tick (killed between steps, the next one not elected yet).
    pub kill_step: f64,
}

impl Faults {
    pub fn none() -> Faults {
        Faults {
            fail: 0.0,
            hang: 0.0,
            late: 0.0,
            late_secs: 0,
            deaf: 0.0,
            crash: 0.0,
            flap: 0.0,
            join: 0.0,
            leave: 0.0,
            kill_write: 0.0,
            kill_step: 0.0,
        }
    }
}

/// One simulation run.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    pub seed: u64,
    /// Nodes at the start.
    pub nodes: usize,
    /// Failure domains (`topology.kubernetes.io/zone` values).
    pub domains: usize,
    /// Ticks with faults and admin activity; then a quiet phase until the fleet settles.
    pub ticks: u32,
    /// Most ticks the quiet phase may take before "did not converge" is a violation.
    pub settle_ticks: u32,
    pub faults: Faults,
    /// Every revision's `spec.rollout`.
    pub policy: RolloutPolicy,
    pub defaults: PolicyDefaults,
    /// Per tick: an admin edit produces a new revision.
    pub new_revision: f64,
    /// Share of new revisions that fail fleet validation.
    pub invalid_revision: f64,
    /// Per tick: an admin toggles `spec.paused` on the newest revision or bumps `spec.retry` of a failed
    /// one.
    pub admin: f64,
    /// Nodes fall into this many config groups; a new revision changes only some groups, so the nodes
    /// of the others take the fast path.
    pub config_groups: u32,
    /// Share of new revisions that remove most or all of what the groups run (a `kubectl delete -f`,
    /// emptied selectors): the destructive-change hold is about these.
    pub destructive_revision: f64,
    /// Per tick: the inputs go back to an older revision's (by hand or `kubectl netwave undo`), which
    /// becomes the target again under a new sequence, as the configurator reactivates it.
    pub reactivate: f64,
    /// Per tick: an admin resumes a held revision (approves the hold).
    pub approve: f64,
    /// A node whose agent reports `Invalid` on every config it is given (compromised) from tick
    /// `hostile_from` on: its name.
    pub hostile: Option<String>,
    pub hostile_from: u32,
    /// Per tick: an admin releases a quarantined node (removes `netwave.dev/quarantined`).
    pub release: f64,
}

impl SimConfig {
    /// A configuration drawn from `seed`: random policy (count or percent budget, canaries, domains,
    /// per-domain budget, maxFailures), random fault rates, `nodes` nodes.
    pub fn random(seed: u64, nodes: usize) -> SimConfig {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_c0f1_9000_0000);
        let domains = rng.random_range(1..=4usize);
        let max_unavailable = if rng.random_bool(0.5) {
            IntOrString::Int(rng.random_range(1..=6))
        } else {
            IntOrString::String(format!("{}%", rng.random_range(5..=30)))
        };
        let canary = rng.random_bool(0.5).then(|| Canary {
            count: Some(rng.random_range(1..=3)),
            selector: None,
            bake_seconds: rng.random_range(0..=20),
        });
        let per_domain = (domains > 1 && rng.random_bool(0.5))
            .then(|| IntOrString::Int(rng.random_range(1..=2)));
        let policy = RolloutPolicy {
            max_unavailable: Some(max_unavailable),
            max_failures: Some(rng.random_range(1..=3)),
            apply_timeout_seconds: Some(rng.random_range(15..=40)),
            progress_deadline_seconds: Some(rng.random_range(30..=120)),
            canary,
            topology_key: (domains > 1).then(|| ZONE_LABEL.to_string()),
            max_unavailable_per_domain: per_domain,
            quarantine: None,
            pickup_timeout_seconds: None,
        };
        let chaos = rng.random_range(0.0..1.0f64);
        let faults = Faults {
            fail: chaos * 0.03,
            hang: chaos * 0.01,
            late: 0.0,
            late_secs: 0,
            deaf: 0.0,
            crash: chaos * 0.002,
            flap: chaos * 0.002,
            join: chaos * 0.02,
            leave: chaos * 0.01,
            kill_write: rng.random_range(0.0..0.3),
            kill_step: rng.random_range(0.0..0.2),
        };
        SimConfig {
            seed,
            nodes,
            domains,
            ticks: 150,
            settle_ticks: 2_000,
            faults,
            policy,
            defaults: PolicyDefaults {
                revision_history_limit: rng.random_range(2..=5),
                destructive_threshold: [0, 30, 50, 100][rng.random_range(0..4usize)],
                ..PolicyDefaults::default()
            },
            new_revision: 0.03,
            invalid_revision: 0.15,
            admin: 0.01,
            config_groups: rng.random_range(1..=4),
            destructive_revision: 0.2,
            reactivate: 0.01,
            approve: 0.02,
            hostile: None,
            hostile_from: 0,
            release: 0.0,
        }
        .with_quarantine_drawn(&mut rng, nodes)
        .with_late_agents_drawn(&mut rng)
    }

    /// Draws after everything else (so earlier draws stay what they were): in some runs agents that
    /// start late (a slow API server) and agents that never start (dead), and a pickup deadline of
    /// its own.
    fn with_late_agents_drawn(mut self, rng: &mut ChaCha8Rng) -> SimConfig {
        if rng.random_bool(0.3) {
            let chaos = rng.random_range(0.0..0.05f64);
            self.faults.late = chaos;
            self.faults.deaf = chaos * 0.2;
            let apply = self.policy.apply_timeout_seconds.unwrap_or(300);
            let pickup = apply + rng.random_range(0..=40);
            self.policy.pickup_timeout_seconds = Some(pickup);
            self.faults.late_secs = u64::from(pickup) + 10;
        }
        self
    }

    /// Draws last (so the draws above stay what they were): in some runs a hostile node, in some
    /// quarantine on (`afterConsecutiveFailures` 1 to 3) and admins releasing quarantined nodes.
    fn with_quarantine_drawn(mut self, rng: &mut ChaCha8Rng, nodes: usize) -> SimConfig {
        if rng.random_bool(0.3) {
            self.policy.quarantine = Some(netwave_api::Quarantine {
                after_consecutive_failures: rng.random_range(1..=3),
            });
            self.release = 0.01;
        }
        if nodes > 1 && rng.random_bool(0.3) {
            self.hostile = Some(format!("node-{:03}", rng.random_range(0..nodes)));
            self.hostile_from = rng.random_range(0..self.ticks);
        }
        self
    }

    /// The same run without any fault, node churn or leader kill (admins still create revisions; holds
    /// are approved in the quiet phase).
    pub fn without_faults(mut self) -> SimConfig {
        self.faults = Faults::none();
        self.admin = 0.0;
        self.approve = 0.0;
        self.invalid_revision = 0.0;
        self.hostile = None;
        self.release = 0.0;
        self
    }
}

/// An invariant that did not hold.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("seed {seed}, tick {tick}: {rule}: {detail}")]
pub struct Violation {
    pub seed: u64,
    pub tick: u32,
    pub rule: &'static str,
    pub detail: String,
}

/// What a run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// sha256 over every leader write, agent report and world event, in order.
    pub history: String,
    pub ticks: u32,
    pub steps: u32,
    pub writes: u32,
    pub leader_kills: u32,
    pub revisions: u32,
    pub failed_revisions: u32,
    pub node_failures: u32,
    /// Of those: agents that did not start in time (`PickupTimeout`), agents that started and did
    /// not finish in time (`ApplyTimeout`).
    pub pickup_timeouts: u32,
    pub apply_timeouts: u32,
    pub rollbacks: u32,
    pub fast_paths: u32,
    pub canary_bakes: u32,
    /// Holds the leader recorded (a destructive target), and the admins' approvals of them.
    pub holds: u32,
    pub approvals: u32,
    pub reactivations: u32,
    /// Nodes quarantined (record writes that quarantine), and released by an admin.
    pub quarantines: u32,
    pub releases: u32,
    /// Revisions that failed while a node was quarantined.
    pub failed_while_quarantined: u32,
    /// The target at the end, every node updated for it (or failed on it).
    pub final_target: Option<String>,
}

#[derive(Clone, Debug)]
struct Pending {
    /// `None`: hung, never reports until the agent restarts.
    done_at: Option<Timestamp>,
    fail: bool,
}

#[derive(Clone, Debug, Default)]
struct Agent {
    /// (revision, retry, hash) of the spec this agent last acted on.
    handled: Option<(String, u32, String)>,
    /// A spec this agent sees late ([`Faults::late`]), and from when.
    sees: Option<((String, u32, String), Timestamp)>,
    pending: Option<Pending>,
    /// Hash of the config the kernel runs.
    running: Option<Sym>,
    /// Revision of the durable backup.
    last_good: Option<Sym>,
    down_until: Option<Timestamp>,
    /// (revision, retry, hash) reported Invalid: not re-applied unless the retry (or the config)
    /// changes.
    invalid: BTreeSet<(String, u32, String)>,
}

/// A simulated cluster.
pub struct Fleet {
    cfg: SimConfig,
    rng: ChaCha8Rng,
    tick: u32,
    now: Timestamp,
    store: Store,
    agents: BTreeMap<String, Agent>,
    /// Node → when its flap ends.
    flapping: BTreeMap<String, Timestamp>,
    next_node: u32,
    next_sequence: u64,
    /// Revision → config version per group.
    versions: BTreeMap<String, Vec<u32>>,
    /// Revision → the objects each group gets (a group's version changes whenever these do).
    contents: BTreeMap<String, Vec<Arc<BTreeSet<InputRef>>>>,
    /// The revision whose inputs are the current ones (the newest cut or reactivated).
    current: Option<String>,
    /// Holds an admin approved: (revision, basis), recorded when the admin resumed it.
    approved: BTreeSet<(String, String)>,
    invalid: BTreeSet<String>,
    history: Sha256,
    outcome: Outcome,
    quiet: bool,
    /// The leader's memo and the input it last stepped over (both gone with the leader).
    memo: StepMemo,
    last_input: Option<RolloutInput>,
}

const START: Timestamp = Timestamp(1_800_000_000_000);

impl Fleet {
    pub fn new(cfg: SimConfig) -> Fleet {
        let mut fleet = Fleet {
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            tick: 0,
            now: START,
            store: Store {
                defaults: cfg.defaults.clone(),
                ..Store::default()
            },
            agents: BTreeMap::new(),
            flapping: BTreeMap::new(),
            next_node: 0,
            next_sequence: 1,
            versions: BTreeMap::new(),
            contents: BTreeMap::new(),
            current: None,
            approved: BTreeSet::new(),
            invalid: BTreeSet::new(),
            history: Sha256::new(),
            outcome: Outcome::default(),
            quiet: false,
            memo: StepMemo::default(),
            last_input: None,
            cfg,
        };
        for _ in 0..fleet.cfg.nodes {
            fleet.join();
        }
        fleet.new_revision(false);
        fleet
    }

    /// The store as it is now (for tests that inspect the end state).
    pub fn store(&self) -> &Store {
        &self.store
    }

    fn record(&mut self, line: &str) {
        self.history.update(line.as_bytes());
        self.history.update(b"\n");
    }

    fn violation(&self, rule: &'static str, detail: String) -> Violation {
        Violation {
            seed: self.cfg.seed,
            tick: self.tick,
            rule,
            detail,
        }
    }

    fn group_of(&self, node: &str) -> usize {
        let n: usize = node
            .trim_start_matches("node-")
            .parse()
            .expect("simulated node names are numbered");
        n % self.cfg.config_groups.max(1) as usize
    }

    fn render(&mut self, rev: &str, node: &str) {
        let g = self.group_of(node);
        let v = self.versions[rev][g];
        self.store.rendered.insert(rev, node, format!("g{g}v{v}"));
        let objects = self.contents[rev][g].clone();
        Arc::make_mut(self.store.footprints.entry(rev.to_string()).or_default())
            .insert(node, objects);
    }

    fn join(&mut self) {
        let name = format!("node-{:03}", self.next_node);
        let zone = format!("zone-{}", self.next_node as usize % self.cfg.domains.max(1));
        self.next_node += 1;
        self.store
            .add_node(&name, BTreeMap::from([(ZONE_LABEL.to_string(), zone)]));
        self.agents.insert(name.clone(), Agent::default());
        let revs: Vec<String> = self.versions.keys().cloned().collect();
        for r in revs {
            self.render(&r, &name);
        }
        self.record(&format!("join {name}"));
    }

    fn new_revision(&mut self, may_be_invalid: bool) {
        let groups = self.cfg.config_groups.max(1) as usize;
        let seq = self.next_sequence;
        self.next_sequence += 1;
        let name = format!("r{seq:03}");
        // Edits start from the current inputs (the newest cut or reactivated revision's).
        let from = self.current.clone();
        let mut versions = from
            .as_ref()
            .map(|r| self.versions[r].clone())
            .unwrap_or_else(|| vec![0; groups]);
        let mut contents = from.as_ref().map_or_else(
            || {
                let base: BTreeSet<InputRef> = (0..4)
                    .map(|i| InputRef::new(InputKind::RoutingTable, format!("o{i}")))
                    .collect();
                // Every group starts with the same objects, one shared set.
                let base = Arc::new(base);
                (0..groups).map(|_| base.clone()).collect()
            },
            |r| self.contents[r].clone(),
        );
        let destructive = from.is_some() && self.rng.random_bool(self.cfg.destructive_revision);
        let changed = self.rng.random_range(0..groups);
        for (g, (v, objects)) in versions.iter_mut().zip(contents.iter_mut()).enumerate() {
            if destructive {
                // Everything gone, or all but one object: deleted, or selecting no node any more.
                let keep = self.rng.random_bool(0.5) as usize;
                *objects = Arc::new(objects.iter().take(keep).cloned().collect());
                *v = seq as u32;
            } else if g == changed || self.rng.random_bool(0.5) {
                let mut next = (**objects).clone();
                if next.len() > 1 && self.rng.random_bool(0.3) {
                    let drop = next
                        .iter()
                        .nth(self.rng.random_range(0..next.len()))
                        .cloned();
                    next.retain(|o| Some(o) != drop.as_ref());
                }
                next.insert(InputRef::new(InputKind::RoutingTable, format!("o{seq}")));
                *objects = Arc::new(next);
                *v = seq as u32;
            }
        }
        let invalid = may_be_invalid && self.rng.random_bool(self.cfg.invalid_revision);
        self.versions.insert(name.clone(), versions);
        self.contents.insert(name.clone(), contents);
        self.current = Some(name.clone());
        let rev = self.store.add_revision(&name, seq);
        rev.policy = self.cfg.policy.clone();
        if invalid {
            rev.validation.errors = vec![format!("simulated validation error in {name}")];
            self.invalid.insert(name.clone());
        }
        let nodes: Vec<String> = self.store.nodes.keys().cloned().collect();
        for n in nodes {
            self.render(&name, &n);
        }
        self.outcome.revisions += 1;
        self.record(&format!(
            "revision {name} invalid={invalid} destructive={destructive}"
        ));
    }

    /// The inputs go back to an older good revision's: it is the target again under the next
    /// sequence, with a fresh rollout in its status (what the configurator's reactivation writes).
    fn reactivate(&mut self) {
        let newest = self.store.revisions.values().map(|r| r.sequence).max();
        let older: Vec<String> = (self.store.revisions.values())
            .filter(|r| Some(r.sequence) != newest && !self.invalid.contains(r.name.as_str()))
            .filter(|r| r.status.phase.as_deref() != Some(Phase::Failed.as_str()))
            .map(|r| r.name.to_string())
            .collect();
        if older.is_empty() {
            return;
        }
        let name = older[self.rng.random_range(0..older.len())].clone();
        let seq = self.next_sequence;
        self.next_sequence += 1;
        let rev = self.store.revision(&name);
        rev.sequence = crate::types::Sequence(seq);
        let st = &mut rev.status;
        st.phase = Some(Phase::Pending.as_str().to_string());
        st.started_at = None;
        st.completed_at = None;
        st.canaries_updated_at = None;
        st.last_progress_at = None;
        st.failed_nodes.clear();
        st.failed = 0;
        st.reactivated_at = Some(self.now.to_time());
        self.current = Some(name.clone());
        self.outcome.reactivations += 1;
        self.record(&format!("reactivate {name} as {seq}"));
    }

    /// An admin resumes held revisions (every one when `all`, else one at random): approval of the
    /// hold on record, remembered to check every assignment against.
    fn approve_holds(&mut self, all: bool) {
        let held: Vec<String> = (self.store.revisions.values())
            .filter(|r| r.paused && r.hold_basis.is_some())
            .map(|r| r.name.to_string())
            .collect();
        if held.is_empty() {
            return;
        }
        let picked = if all {
            held
        } else {
            vec![held[self.rng.random_range(0..held.len())].clone()]
        };
        for name in picked {
            let rev = self.store.revision(&name);
            rev.paused = false;
            let basis = rev.hold_basis.clone().unwrap_or_default();
            self.approved.insert((name.clone(), basis));
            self.outcome.approvals += 1;
            self.record(&format!("approve {name}"));
        }
    }

    /// An admin releases a quarantined node: removes the annotation (the streak was cleared when it
    /// was quarantined).
    fn release_one(&mut self) {
        let quarantined: Vec<String> = (self.store.configs.values())
            .filter(|c| c.record.is_quarantined())
            .map(|c| c.name.to_string())
            .collect();
        if quarantined.is_empty() {
            return;
        }
        let name = quarantined[self.rng.random_range(0..quarantined.len())].clone();
        if let Some(c) = self.store.configs.get_mut(&name) {
            c.record.quarantined = None;
        }
        self.outcome.releases += 1;
        self.record(&format!("release {name}"));
    }

    /// Runs the chaos phase, then the quiet phase until the fleet settles; checks every invariant.
    pub fn run(mut self) -> Result<Outcome, Violation> {
        for _ in 0..self.cfg.ticks {
            self.tick()?;
        }
        self.quiet = true;
        self.calm_down();
        let mut settled_for = 0;
        let mut ticks = 0;
        while settled_for < 3 {
            if ticks >= self.cfg.settle_ticks {
                return Err(self.violation(
                    "converges",
                    format!(
                        "fleet did not settle within {} quiet ticks",
                        self.cfg.settle_ticks
                    ),
                ));
            }
            let (writes, reports, timer) = self.tick()?;
            // Settled: nothing written, nothing reported, nobody applying, no timer (bake, deadline,
            // apply timeout) that would change anything later.
            settled_for = if writes == 0 && reports == 0 && !timer && self.agents_idle() {
                settled_for + 1
            } else {
                0
            };
            ticks += 1;
        }
        self.check_settled()?;
        self.outcome.ticks = self.tick;
        self.outcome.history = hex::encode(self.history.clone().finalize());
        Ok(self.outcome)
    }

    /// The quiet phase: every node back, no hung or crashed agent, nothing paused.
    fn calm_down(&mut self) {
        for (name, _) in std::mem::take(&mut self.flapping) {
            if let Some(n) = self.store.nodes.get_mut(&name) {
                n.ready = true;
                n.unschedulable = false;
            }
        }
        for agent in self.agents.values_mut() {
            if agent.down_until.is_some()
                || agent.pending.as_ref().is_some_and(|p| p.done_at.is_none())
            {
                agent.down_until = Some(START); // restarts on its next tick
            }
        }
        self.approve_holds(true);
        for rev in self.store.revisions.values_mut() {
            rev.paused = false;
        }
        self.record("quiet");
    }

    fn agents_idle(&self) -> bool {
        self.agents
            .values()
            .all(|a| a.pending.is_none() && a.down_until.is_none() && a.sees.is_none())
    }

    /// One tick: time passes, the world and the admins act, agents act, the leader steps.
    /// Returns (leader writes, agent reports, whether the leader waits on a timer).
    fn tick(&mut self) -> Result<(u32, u32, bool), Violation> {
        self.tick += 1;
        self.now = self.now.plus_secs(self.rng.random_range(1..=3));
        let faults = if self.quiet {
            Faults::none()
        } else {
            self.cfg.faults.clone()
        };
        if !self.quiet {
            self.world(&faults);
        } else {
            // A revision can become the target in the quiet phase (the newer one failed): the admin
            // approves its hold, so the fleet settles.
            self.approve_holds(true);
        }
        let reports = self.agents_act(&faults);
        self.check_budget("world and agents", None)?;
        let (writes, timer) = self.leader(&faults)?;
        Ok((writes, reports, timer))
    }

    fn world(&mut self, faults: &Faults) {
        let now = self.now;
        // Flaps end, new ones start.
        let ended: Vec<String> = self
            .flapping
            .iter()
            .filter(|(_, until)| **until <= now)
            .map(|(n, _)| n.clone())
            .collect();
        for n in ended {
            self.flapping.remove(&n);
            if let Some(node) = self.store.nodes.get_mut(&n) {
                node.ready = true;
                node.unschedulable = false;
                self.record(&format!("back {n}"));
            }
        }
        if faults.flap > 0.0 {
            let names: Vec<String> = self.store.nodes.keys().cloned().collect();
            for n in names {
                if self.flapping.contains_key(&n) || !self.rng.random_bool(faults.flap) {
                    continue;
                }
                let cordon = self.rng.random_bool(0.3);
                let until = now.plus_secs(self.rng.random_range(1..=20));
                let node = self.store.node(&n);
                if cordon {
                    node.unschedulable = true;
                } else {
                    node.ready = false;
                }
                self.flapping.insert(n.clone(), until);
                self.record(&format!("flap {n} cordon={cordon}"));
            }
        }
        if faults.join > 0.0 && self.rng.random_bool(faults.join) {
            self.join();
        }
        if faults.leave > 0.0 && self.store.nodes.len() > 1 && self.rng.random_bool(faults.leave) {
            let i = self.rng.random_range(0..self.store.nodes.len());
            let name = self.store.nodes.keys().nth(i).cloned().expect("in range");
            self.store.nodes.remove(&name);
            self.agents.remove(&name);
            self.flapping.remove(&name);
            self.record(&format!("leave {name}"));
        }
        if self.rng.random_bool(self.cfg.new_revision) {
            self.new_revision(true);
        }
        if self.cfg.reactivate > 0.0 && self.rng.random_bool(self.cfg.reactivate) {
            self.reactivate();
        }
        if self.cfg.approve > 0.0 && self.rng.random_bool(self.cfg.approve) {
            self.approve_holds(false);
        }
        if self.cfg.release > 0.0 && self.rng.random_bool(self.cfg.release) {
            self.release_one();
        }
        if self.cfg.admin > 0.0 && self.rng.random_bool(self.cfg.admin) {
            if self.rng.random_bool(0.5) {
                if let Some(rev) = self.store.revisions.values_mut().next_back() {
                    rev.paused = !rev.paused;
                    if !rev.paused
                        && let Some(basis) = &rev.hold_basis
                    {
                        self.approved.insert((rev.name.to_string(), basis.clone()));
                        self.outcome.approvals += 1;
                    }
                    let line = format!("pause {} {}", rev.name, rev.paused);
                    self.record(&line);
                }
            } else {
                let failed: Vec<String> = self
                    .store
                    .revisions
                    .values()
                    .filter(|r| r.status.phase.as_deref() == Some(Phase::Failed.as_str()))
                    .map(|r| r.name.to_string())
                    .collect();
                if !failed.is_empty() {
                    let pick = failed[self.rng.random_range(0..failed.len())].clone();
                    self.store.revision(&pick).retry += 1;
                    self.record(&format!("retry {pick}"));
                }
            }
        }
    }

    fn report(&mut self, node: &str, report: AgentReport) {
        let line = format!(
            "report {node} {:?} {:?} {:?}",
            report.phase.as_ref().map(AgentPhase::as_str),
            report.observed_revision,
            report.config_hash
        );
        if let Some(cfg) = self.store.configs.get_mut(node) {
            cfg.status = report;
        }
        self.record(&line);
    }

    /// Every agent looks at its NNC and acts. Returns the number of status reports.
    fn agents_act(&mut self, faults: &Faults) -> u32 {
        let mut reports = 0;
        let names: Vec<String> = self.agents.keys().cloned().collect();
        for name in names {
            let mut agent = self.agents.remove(&name).expect("listed");
            if self.agent_up(&name, &mut agent, faults)
                && let Some(cfg) = self.store.configs.get(&name)
            {
                let spec = cfg.spec.clone();
                reports += self.agent_acts(&name, &mut agent, &spec, faults);
            }
            self.agents.insert(name, agent);
        }
        reports
    }

    /// Whether the agent runs this tick. Down: it waits for the restart, and an interrupted apply
    /// is undone from the backup; it may crash now.
    fn agent_up(&mut self, name: &str, agent: &mut Agent, faults: &Faults) -> bool {
        let now = self.now;
        if let Some(until) = agent.down_until {
            if now < until {
                return false;
            }
            agent.down_until = None;
            if agent.pending.take().is_some() {
                agent.running = agent
                    .last_good
                    .as_ref()
                    .map(|lg| self.store.hash_of(lg, name));
            }
            agent.handled = None;
            self.record(&format!("restart {name}"));
        }
        if faults.crash > 0.0 && self.rng.random_bool(faults.crash) {
            agent.down_until = Some(now.plus_secs(self.rng.random_range(1..=5)));
            self.record(&format!("crash {name}"));
            return false;
        }
        true
    }

    /// A running agent with a config: takes up a new spec, or finishes its pending apply. Returns
    /// the number of status reports (0 or 1).
    fn agent_acts(
        &mut self,
        name: &str,
        agent: &mut Agent,
        spec: &crate::rollout::AssignedSpec,
        faults: &Faults,
    ) -> u32 {
        let key = key_of(spec);
        if agent.handled.as_ref() == Some(&key) {
            // Back to the spec it acted on before a newer one reached it: that one never will.
            agent.sees = None;
        } else {
            match &agent.sees {
                Some((k, at)) if *k == key && self.now < *at => return 0,
                Some((k, _)) if *k == key => {}
                _ if faults.late > 0.0 && self.rng.random_bool(faults.late) => {
                    let at = self
                        .now
                        .plus_secs(self.rng.random_range(1..=faults.late_secs.max(1)));
                    agent.sees = Some((key, at));
                    return 0;
                }
                _ => {}
            }
            agent.sees = None;
            agent.handled = Some(key.clone());
            if faults.deaf > 0.0 && self.rng.random_bool(faults.deaf) {
                // Never takes this spec up and reports nothing, until it restarts and looks again
                // (the quiet phase restarts it like a hung one; it changed nothing).
                agent.pending = Some(Pending {
                    done_at: None,
                    fail: false,
                });
                self.record(&format!("deaf {name}"));
                return 0;
            }
            agent.pending = None;
            self.take_up(name, agent, spec, &key, faults);
            return 1;
        }
        let Some(p) = &agent.pending else { return 0 };
        if p.done_at.is_none_or(|t| self.now < t) {
            return 0;
        }
        let fail = p.fail;
        agent.pending = None;
        if fail {
            agent.invalid.insert(key_of(spec));
            agent.running = agent
                .last_good
                .as_ref()
                .map(|lg| self.store.hash_of(lg, name));
        } else {
            agent.running = Some(spec.config_hash.clone());
            agent.last_good = Some(spec.revision.clone());
        }
        self.report(
            name,
            AgentReport {
                phase: Some(if fail {
                    AgentPhase::Invalid
                } else {
                    AgentPhase::Provisioned
                }),
                observed_revision: Some(spec.revision.clone()),
                observed_retry: Some(spec.retry),
                observed_config_hash: Some(spec.config_hash.clone()),
                config_hash: agent.running.clone(),
                last_good_revision: agent.last_good.clone(),
                reason: fail.then(|| NodeReason::ApplyFailed.as_str().to_string()),
                message: None,
                started_at: None,
                features: netwave_api::features::FeatureSet::all(),
            },
        );
        1
    }

    /// A new spec: Invalid at once if this agent failed it before, Provisioned if it is the
    /// running config, else Provisioning with an apply pending (failing, hanging or done later).
    fn take_up(
        &mut self,
        name: &str,
        agent: &mut Agent,
        spec: &crate::rollout::AssignedSpec,
        key: &(String, u32, String),
        faults: &Faults,
    ) {
        let now = self.now;
        let report_base = AgentReport {
            observed_revision: Some(spec.revision.clone()),
            observed_retry: Some(spec.retry),
            observed_config_hash: Some(spec.config_hash.clone()),
            last_good_revision: agent.last_good.clone(),
            ..AgentReport::default()
        };
        if agent.invalid.contains(key) {
            self.report(
                name,
                AgentReport {
                    phase: Some(AgentPhase::Invalid),
                    config_hash: agent.running.clone(),
                    reason: Some(NodeReason::ApplyFailed.as_str().into()),
                    ..report_base
                },
            );
        } else if agent.running.as_deref() == Some(spec.config_hash.as_str()) {
            // Same config: nothing to apply.
            agent.last_good = Some(spec.revision.clone());
            self.report(
                name,
                AgentReport {
                    phase: Some(AgentPhase::Provisioned),
                    config_hash: agent.running.clone(),
                    last_good_revision: agent.last_good.clone(),
                    ..report_base
                },
            );
        } else {
            // A hostile agent fails every config it is given, in the quiet phase too.
            let hostile =
                self.cfg.hostile.as_deref() == Some(name) && self.tick >= self.cfg.hostile_from;
            let fail = hostile || (faults.fail > 0.0 && self.rng.random_bool(faults.fail));
            let hang = !fail && faults.hang > 0.0 && self.rng.random_bool(faults.hang);
            let delay = if self.quiet {
                1
            } else {
                self.rng.random_range(1..=6)
            };
            agent.pending = Some(Pending {
                done_at: (!hang).then(|| now.plus_secs(delay)),
                fail,
            });
            self.report(
                name,
                AgentReport {
                    phase: Some(AgentPhase::Provisioning),
                    config_hash: agent.running.clone(),
                    started_at: Some(now),
                    ..report_base
                },
            );
        }
    }

    /// A new leader starts without the old one's memory.
    fn forget_leader(&mut self) {
        self.memo = StepMemo::default();
        self.last_input = None;
    }

    /// The leader's turn: rebuild the input from the store, step, apply writes one at a time.
    fn leader(&mut self, faults: &Faults) -> Result<(u32, bool), Violation> {
        if faults.kill_step > 0.0 && self.rng.random_bool(faults.kill_step) {
            self.outcome.leader_kills += 1;
            self.record("no leader");
            self.forget_leader();
            return Ok((0, true));
        }
        // The leader keeps a memo between steps, over inputs that share what did not change (as the
        // configurator's do); stepping from scratch, deciding again after every round, is the reference.
        let input = match &self.last_input {
            Some(before) => self.store.input_sharing(before),
            None => self.store.input(),
        };
        let plan = self.memo.step(&input, self.now);
        let full = crate::rollout::step_every_round(&input, self.now);
        if plan != full {
            let fresh = step(&input, self.now);
            let (rule, other, with) = if fresh == full {
                (
                    "a kept memo plans what a new one plans",
                    "a new memo",
                    &fresh,
                )
            } else {
                ("one round where it suffices", "every round", &full)
            };
            return Err(self.violation(
                rule,
                format!(
                    "the plan with a kept memo: {}\n{other}: {}",
                    summary(&plan),
                    summary(with)
                ),
            ));
        }
        self.last_input = Some(input);
        self.outcome.steps += 1;
        if plan
            .report
            .waiting
            .iter()
            .any(|w| matches!(w, crate::rollout::WaitingOn::CanaryBake { .. }))
        {
            self.outcome.canary_bakes += 1;
        }
        let mut writes = 0;
        for w in plan.writes() {
            if faults.kill_write > 0.0 && self.rng.random_bool(faults.kill_write) {
                self.outcome.leader_kills += 1;
                self.record("leader killed");
                self.forget_leader();
                return Ok((writes, true));
            }
            self.apply(w)?;
            writes += 1;
        }
        // A leader that applied its whole plan and steps again must find nothing to do.
        let again = step(&self.store.input(), self.now);
        if !again.is_empty() {
            return Err(self.violation(
                "idempotent",
                format!(
                    "second step over an applied plan is not empty: {}\nfirst plan: {}\ntargets {:?} then {:?}",
                    summary(&again),
                    summary(&plan),
                    plan.report.target,
                    again.report.target
                ),
            ));
        }
        Ok((writes, plan.report.requeue_at.is_some()))
    }

    fn apply(&mut self, w: Write<'_>) -> Result<(), Violation> {
        let before = self.in_flight();
        let mut line = String::new();
        match w {
            Write::Record(r) => {
                let _ = write!(
                    line,
                    "record {} streak={} quarantined={}",
                    r.node,
                    r.record.streak.len(),
                    r.record.is_quarantined()
                );
                let was = self
                    .store
                    .configs
                    .get(&r.node)
                    .is_some_and(|c| c.record.is_quarantined());
                if r.record.is_quarantined() && !was {
                    self.outcome.quarantines += 1;
                }
            }
            Write::Hold(h) => {
                let _ = write!(line, "hold {} {}", h.revision, h.basis);
                self.outcome.holds += 1;
            }
            Write::Status(u) => {
                let _ = write!(
                    line,
                    "status {} {:?} u={} p={} f={}",
                    u.revision,
                    u.status.phase,
                    u.status.updated,
                    u.status.in_progress,
                    u.status.failed
                );
                if u.status.phase.as_deref() == Some(Phase::Failed.as_str())
                    && self.store.revisions[&u.revision].status.phase.as_deref()
                        != Some(Phase::Failed.as_str())
                {
                    self.outcome.failed_revisions += 1;
                    if self
                        .store
                        .configs
                        .values()
                        .any(|c| c.record.is_quarantined())
                    {
                        self.outcome.failed_while_quarantined += 1;
                    }
                }
                let known = self.store.revisions[&u.revision].status.failed_nodes.len();
                self.outcome.node_failures +=
                    u.status.failed_nodes.len().saturating_sub(known) as u32;
                for f in u.status.failed_nodes.iter().skip(known) {
                    match f.reason.as_str() {
                        REASON_PICKUP_TIMEOUT => self.outcome.pickup_timeouts += 1,
                        REASON_APPLY_TIMEOUT => self.outcome.apply_timeouts += 1,
                        _ => {}
                    }
                }
                self.check_flagged(&u.revision, &u.status.failed_nodes)?;
            }
            Write::Assign(a) => {
                let _ = write!(
                    line,
                    "assign {} {} {} {} {:?}",
                    a.node, a.revision, a.retry, a.config_hash, a.reason
                );
                self.check_assignment(a)?;
                match a.reason {
                    AssignReason::Rollback => self.outcome.rollbacks += 1,
                    AssignReason::FastPath => self.outcome.fast_paths += 1,
                    _ => {}
                }
            }
            Write::DeleteConfig(n) => {
                let _ = write!(line, "delete-config {n}");
            }
            Write::DeleteRevision(r) => {
                let _ = write!(line, "delete-revision {r}");
            }
        }
        self.store
            .apply(w)
            .map_err(|e| self.violation("writes apply", e.to_string()))?;
        self.outcome.writes += 1;
        self.record(&line);
        self.check_budget("leader write", Some(before))
    }

    /// No node is ever given a failed or unvalidated revision, and no Not Ready or cordoned node is
    /// ever made in flight.
    fn check_assignment(&self, a: &crate::rollout::Assignment) -> Result<(), Violation> {
        let Some(rev) = self.store.revisions.get(a.revision.as_str()) else {
            return Err(self.violation("assigns known revisions", a.revision.to_string()));
        };
        let phase = rev.status.phase.as_deref();
        let validated = rev.status.conditions.iter().any(|c| {
            c.type_ == crate::rollout::ConditionType::Validated.as_str()
                && c.status == netwave_api::vocab::ConditionStatus::True.as_str()
        });
        if phase == Some(Phase::Failed.as_str())
            || !validated
            || self.invalid.contains(a.revision.as_str())
        {
            return Err(self.violation(
                "never assigns a failed or unvalidated revision",
                format!(
                    "{} → {} (phase {phase:?}, validated {validated}, reason {:?})",
                    a.node, a.revision, a.reason
                ),
            ));
        }
        let node = &self.store.nodes[a.node.as_str()];
        let config = self.store.configs.get(a.node.as_str());
        if config.is_some_and(|c| c.record.is_quarantined() && c.spec.revision != a.revision)
            && a.reason != AssignReason::Rollback
        {
            return Err(self.violation(
                "a quarantined node gets no new revision (only rollbacks to the last good one)",
                format!("{} → {} ({:?})", a.node, a.revision, a.reason),
            ));
        }
        let was = self
            .store
            .configs
            .get(a.node.as_str())
            .is_some_and(is_in_flight);
        let mut after = self
            .store
            .configs
            .get(a.node.as_str())
            .cloned()
            .unwrap_or_default();
        after.spec.revision = a.revision.clone();
        after.spec.config_hash = a.config_hash.clone();
        if !node.eligible() && !was && is_in_flight(&after) {
            return Err(self.violation(
                "never makes a Not Ready or cordoned node in flight",
                a.node.to_string(),
            ));
        }
        self.check_hold(a)
    }

    /// A failure written as not counting (`quarantined`) belongs to a node quarantined at that moment:
    /// records are written before statuses, so a quarantine is on record before any failure it
    /// discounts. With quarantine off, nothing is ever flagged.
    fn check_flagged(
        &self,
        revision: &str,
        failed: &[netwave_api::FailedNode],
    ) -> Result<(), Violation> {
        let before = &self.store.revisions[revision].status.failed_nodes;
        for f in failed.iter().filter(|f| f.quarantined) {
            if before.iter().any(|b| b.node == f.node && b.quarantined) {
                continue;
            }
            let on_record =
                (self.store.configs.get(&f.node)).is_some_and(|c| c.record.is_quarantined());
            if !on_record || self.cfg.policy.quarantine.is_none() {
                return Err(self.violation(
                    "only a quarantined node's failure goes uncounted",
                    format!(
                        "{} on {revision}: flagged, node not quarantined on record",
                        f.node
                    ),
                ));
            }
        }
        Ok(())
    }

    /// DESIGN.md §6: no node is moved to a revision that removes more than the threshold of the last
    /// good revision's content (or all of it) unless an admin approved that hold: resumed the revision
    /// while it was held as the target under this sequence against this last good revision. A rollback
    /// goes back to what the node ran; a revision the node already has is no move.
    fn check_hold(&self, a: &crate::rollout::Assignment) -> Result<(), Violation> {
        let moves = self
            .store
            .configs
            .get(a.node.as_str())
            .is_none_or(|c| c.spec.revision != a.revision);
        if !moves || a.reason == AssignReason::Rollback {
            return Ok(());
        }
        let Some(last_good) = (self.store.revisions.values())
            .filter(|r| r.status.phase.as_deref() == Some(Phase::Complete.as_str()))
            .max_by(|a, b| a.sequence.cmp(&b.sequence).then(b.name.cmp(&a.name)))
        else {
            return Ok(());
        };
        if last_good.name == a.revision {
            return Ok(());
        }
        let fp = |r: &str| self.store.footprints.get(r);
        let (Some(base), Some(cand)) = (fp(&last_good.name), fp(&a.revision)) else {
            return Ok(());
        };
        let threshold = self.cfg.defaults.destructive_threshold;
        let Some(removal) = hold::destructive(&last_good.name, base, cand, threshold) else {
            return Ok(());
        };
        let basis = hold::basis(
            self.store.revisions[a.revision.as_str()].sequence,
            &last_good.name,
        );
        if self
            .approved
            .contains(&(a.revision.to_string(), basis.clone()))
        {
            return Ok(());
        }
        Err(self.violation(
            "no node is moved to a destructive revision an admin did not approve",
            format!(
                "{} → {} ({:?}): it {removal}; no approval of {basis}",
                a.node, a.revision, a.reason
            ),
        ))
    }

    /// (in flight overall, per domain) over existing nodes, as the budget counts them: a joining node
    /// given a proven revision (its agent has not reported yet) took no slot from the budget.
    fn in_flight(&self) -> (u32, BTreeMap<String, u32>) {
        let mut total = 0;
        let mut per = BTreeMap::new();
        for (name, node) in &self.store.nodes {
            if self
                .store
                .configs
                .get(name)
                .is_some_and(|c| is_in_flight(c) && !self.store.joining(c))
            {
                total += 1;
                *per.entry(zone(node)).or_insert(0) += 1;
            }
        }
        (total, per)
    }

    /// In flight never exceeds the budget: a write that adds an in-flight node leaves at most the budget
    /// in flight (globally and per domain). With count budgets (which nothing but the policy changes)
    /// in flight is at most the budget at all times.
    fn check_budget(
        &self,
        when: &str,
        before: Option<(u32, BTreeMap<String, u32>)>,
    ) -> Result<(), Violation> {
        let (policy, _) = resolve(&self.cfg.policy, &self.cfg.defaults);
        let eligible: Vec<&crate::rollout::NodeState> =
            self.store.nodes.values().filter(|n| n.eligible()).collect();
        let budget = policy.max_unavailable.of(eligible.len());
        let (now_total, now_per) = self.in_flight();
        let strong = matches!(policy.max_unavailable, Budget::Count(_));
        let grew = before.as_ref().is_some_and(|(t, _)| now_total > *t);
        if (strong || grew) && now_total > budget {
            return Err(self.violation(
                "in flight never exceeds the budget",
                format!("{when}: {now_total} in flight, budget {budget}"),
            ));
        }
        if let Some(per_budget) = policy.max_unavailable_per_domain {
            for (zone_name, &n) in &now_per {
                let in_zone = eligible.iter().filter(|e| zone(e) == *zone_name).count();
                let b = per_budget.of(in_zone);
                let strong = matches!(per_budget, Budget::Count(_));
                let grew = before
                    .as_ref()
                    .is_some_and(|(_, p)| n > p.get(zone_name).copied().unwrap_or(0));
                if (strong || grew) && n > b {
                    return Err(self.violation(
                        "in flight never exceeds the per-domain budget",
                        format!("{when}: {n} in flight in {zone_name}, budget {b}"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// After the quiet phase: every node runs the target (or failed it and runs the last good revision);
    /// no node is left on a failed revision when a last good one exists.
    fn check_settled(&mut self) -> Result<(), Violation> {
        let plan = step(&self.store.input(), self.now);
        let target = plan.report.target.clone();
        let last_good = plan.report.last_good.clone();
        self.outcome.final_target = target.clone();
        let failed: BTreeSet<&str> = self
            .store
            .revisions
            .values()
            .filter(|r| r.status.phase.as_deref() == Some(Phase::Failed.as_str()))
            .map(|r| r.name.as_str())
            .collect();
        for name in self.store.nodes.keys() {
            let cfg = self.store.configs.get(name);
            // A quarantined node stays where it is until an admin releases it.
            let quarantined = cfg.is_some_and(|c| c.record.is_quarantined());
            if let Some(t) = &target
                && !quarantined
            {
                let failed_here = self.store.revisions[t]
                    .status
                    .failed_nodes
                    .iter()
                    .any(|f| &f.node == name);
                let ok = match cfg {
                    Some(c) if failed_here => last_good
                        .as_deref()
                        .is_none_or(|lg| lg == t || is_updated(c, &lg.into())),
                    Some(c) => is_updated(c, &t.into()),
                    None => false,
                };
                if !ok {
                    return Err(self.violation(
                        "every eligible node converges to the target",
                        format!(
                            "{name}: spec {:?} status {:?}; target {t}, last good {last_good:?}; \
                             waiting {:?}; target status {:?}",
                            cfg.map(|c| &c.spec),
                            cfg.map(|c| &c.status),
                            plan.report.waiting,
                            self.store.revisions[t].status.message,
                        ),
                    ));
                }
            }
            if let (Some(c), Some(_)) = (cfg, &last_good)
                && failed.contains(c.spec.revision.as_str())
            {
                return Err(self.violation(
                    "a failed revision's touched nodes end on the last good revision",
                    format!("{name} still on failed {}", c.spec.revision),
                ));
            }
        }
        if let Some(t) = &target
            && !self.store.nodes.is_empty()
            && self.store.revisions[t].status.phase.as_deref() != Some(Phase::Complete.as_str())
            && self.store.revisions[t].status.updated > 0
        {
            return Err(self.violation(
                "a settled rollout is Complete",
                format!("{t}: {:?}", self.store.revisions[t].status.message),
            ));
        }
        Ok(())
    }
}

fn zone(node: &crate::rollout::NodeState) -> String {
    node.labels.get(ZONE_LABEL).cloned().unwrap_or_default()
}

fn summary(plan: &Plan) -> String {
    let mut s = String::new();
    for w in plan.writes() {
        match w {
            Write::Record(r) => {
                let _ = write!(s, "[record {} {:?}] ", r.node, r.record);
            }
            Write::Hold(h) => {
                let _ = write!(s, "[hold {} {}] ", h.revision, h.basis);
            }
            Write::Status(u) => {
                let _ = write!(
                    s,
                    "[status {} {:?} {:?}] ",
                    u.revision, u.status.phase, u.status.message
                );
            }
            Write::Assign(a) => {
                let _ = write!(s, "[assign {} {} {:?}] ", a.node, a.revision, a.reason);
            }
            Write::DeleteConfig(n) => {
                let _ = write!(s, "[delete-config {n}] ");
            }
            Write::DeleteRevision(r) => {
                let _ = write!(s, "[delete-revision {r}] ");
            }
        }
    }
    for e in &plan.events {
        let _ = write!(s, "[event {:?}] ", e.reason);
    }
    s
}

/// Runs one seed (random config, `nodes` nodes).
pub fn run_seed(seed: u64, nodes: usize) -> Result<Outcome, Violation> {
    Fleet::new(SimConfig::random(seed, nodes)).run()
}

/// What an agent judges a spec by: (revision, retry, configHash).
fn key_of(spec: &crate::rollout::AssignedSpec) -> (String, u32, String) {
    (
        spec.revision.to_string(),
        spec.retry,
        spec.config_hash.to_string(),
    )
}
