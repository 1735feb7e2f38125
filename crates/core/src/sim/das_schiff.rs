//! das-schiff-network-operator's rollout rules, simulated on a virtual clock: the baseline the fleet
//! benchmark (#14) prints next to netwave's figures.
//!
//! ```text
//!  trigger (any watch event: its own writes, an agent's status) ──► pass `debounce` later (triggers
//!  │                                                                  while one is pending coalesce)
//!  pass: status update of every revision (counters), then, if ongoing < maxUpdating and a node is
//!        outdated, deploy ONE node (NodeNetworkConfig + NodeNetplanConfig write)
//!  agent: reports `delay` after its deploy ──► trigger
//! ```
//!
//! The rules, as its `ConfigRevisionReconciler.reconcileDebounced` has them: one pass deploys at most
//! one node, however large `--max-updating` (default 1) is; every pass writes every revision's status
//! counters; one node reporting `invalid` invalidates the whole revision (no failure budget), and the
//! previous valid revision becomes the one to deploy again; a node that never writes a status never
//! times out (its timeout counts from `status.lastUpdate`, which it never set), so it holds an
//! updating slot for good. Passes themselves take no time here (its reads come from an informer
//! cache), which favours the baseline. Agents report once, like netwave's simulated agents (the real
//! das-schiff agent also writes `provisioning` first: one more write per node, not counted).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// What one simulated agent does with its deploy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    Provisioned,
    Invalid,
    Silent,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Agent {
    /// From deploy to report.
    pub delay_ms: u64,
    pub answer: Answer,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// `--max-updating`.
    pub max_updating: usize,
    /// The debouncer's delay (das-schiff: 1 s).
    pub debounce_ms: u64,
    /// Revisions that exist during the rollout (each gets a status update per pass).
    pub revisions: u64,
    /// Virtual time after which the run stops.
    pub limit_ms: u64,
}

/// How the rollout ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// Every node reports `provisioned`.
    Complete,
    /// A node reported `invalid`: the revision is invalid and nothing more of it is deployed.
    Invalidated { node: usize },
    /// Nothing left to happen: nodes in flight never report (silent agents hold every slot).
    Stuck,
    /// `limit_ms` reached.
    TimeLimit,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub end: End,
    /// Virtual time the run ended at.
    pub end_ms: u64,
    /// Deploy time of each deployed node, in order.
    pub deploys_ms: Vec<u64>,
    /// Time of each agent report, in order.
    pub reports_ms: Vec<u64>,
    /// Nodes that report `provisioned`.
    pub updated: usize,
    pub passes: u64,
    /// Revision status updates (one per revision per pass).
    pub revision_status_writes: u64,
    /// NodeNetworkConfig creates/updates (one per deploy).
    pub node_config_writes: u64,
    /// NodeNetplanConfig creates/updates (one per deploy).
    pub netplan_writes: u64,
}

impl Outcome {
    /// Configurator writes (the agents' reports not included).
    pub fn writes(&self) -> u64 {
        self.revision_status_writes + self.node_config_writes + self.netplan_writes
    }

    /// First deploy → last report, if anything was deployed and reported.
    pub fn wall_ms(&self) -> Option<u64> {
        Some(self.reports_ms.last()? - self.deploys_ms.first()?)
    }

    /// For each report made while nodes still waited: the time to the next deploy, sorted.
    pub fn reactions_ms(&self) -> Vec<u64> {
        let Some(&last) = self.deploys_ms.last() else {
            return Vec::new();
        };
        let mut out: Vec<u64> = self
            .reports_ms
            .iter()
            .filter(|r| **r < last)
            .filter_map(|r| {
                let i = self.deploys_ms.partition_point(|d| d < r);
                self.deploys_ms.get(i).map(|d| d - r)
            })
            .collect();
        out.sort_unstable();
        out
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum NodeState {
    Outdated,
    Ongoing,
    Provisioned,
    Invalid,
}

/// Runs one rollout of a new revision over `agents` (node `i` answers as `agents[i]`), starting at
/// virtual time 0 with the revision's creation (a trigger).
pub fn run(agents: &[Agent], p: &Params) -> Outcome {
    let mut state = vec![NodeState::Outdated; agents.len()];
    let mut reports: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut pending: Option<u64> = Some(p.debounce_ms);
    let mut next_outdated = 0;
    let mut last_counters = None;
    let mut o = Outcome {
        end: End::Stuck,
        end_ms: 0,
        deploys_ms: Vec::new(),
        reports_ms: Vec::new(),
        updated: 0,
        passes: 0,
        revision_status_writes: 0,
        node_config_writes: 0,
        netplan_writes: 0,
    };
    let trigger = |pending: &mut Option<u64>, t: u64| {
        let at = t + p.debounce_ms;
        *pending = Some(pending.map_or(at, |x| x.min(at)));
    };
    loop {
        let report = reports.peek().map(|r| r.0);
        let t = match (report, pending) {
            (None, None) => break,
            (Some((r, _)), Some(q)) => r.min(q),
            (Some((r, _)), None) => r,
            (None, Some(q)) => q,
        };
        if t > p.limit_ms {
            o.end = End::TimeLimit;
            o.end_ms = p.limit_ms;
            return o;
        }
        o.end_ms = t;
        if let Some((r, node)) = report.filter(|(r, _)| pending.is_none_or(|q| *r <= q)) {
            reports.pop();
            o.reports_ms.push(r);
            state[node] = match agents[node].answer {
                Answer::Invalid => NodeState::Invalid,
                _ => NodeState::Provisioned,
            };
            trigger(&mut pending, r);
            continue;
        }
        // A pass.
        pending = None;
        o.passes += 1;
        o.revision_status_writes += p.revisions;
        if let Some(node) = state.iter().position(|s| *s == NodeState::Invalid) {
            o.end = End::Invalidated { node };
            break;
        }
        let ongoing = state.iter().filter(|s| **s == NodeState::Ongoing).count();
        let ready = state
            .iter()
            .filter(|s| **s == NodeState::Provisioned)
            .count();
        o.updated = ready;
        if ready == agents.len() {
            o.end = End::Complete;
            break;
        }
        let mut changed = last_counters != Some((ready, ongoing));
        if ongoing < p.max_updating && next_outdated < agents.len() {
            let node = next_outdated;
            next_outdated += 1;
            state[node] = NodeState::Ongoing;
            o.deploys_ms.push(t);
            o.node_config_writes += 1;
            o.netplan_writes += 1;
            if agents[node].answer != Answer::Silent {
                reports.push(Reverse((t + agents[node].delay_ms, node)));
            }
            changed = true;
        }
        last_counters = Some((ready, ongoing));
        // Its own writes come back through its watches as triggers.
        if changed {
            trigger(&mut pending, t);
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy(n: usize, delay_ms: u64) -> Vec<Agent> {
        vec![
            Agent {
                delay_ms,
                answer: Answer::Provisioned
            };
            n
        ]
    }

    fn params(max_updating: usize) -> Params {
        Params {
            max_updating,
            debounce_ms: 1000,
            revisions: 1,
            limit_ms: u64::MAX,
        }
    }

    #[test]
    fn one_node_per_pass_whatever_max_updating() {
        let o = run(&healthy(100, 2000), &params(50));
        assert_eq!(o.end, End::Complete);
        assert_eq!(o.updated, 100);
        // Deploys one debounce apart: 100 nodes take 99 s to deploy, the last reports 2 s later.
        assert_eq!(o.wall_ms(), Some(99_000 + 2000));
        assert!(o.deploys_ms.windows(2).all(|w| w[1] - w[0] == 1000));
    }

    #[test]
    fn max_updating_one_waits_for_each_report_plus_the_debounce() {
        let o = run(&healthy(10, 2500), &params(1));
        assert_eq!(o.end, End::Complete);
        // Each node: 2.5 s apply, then the pass its report triggers 1 s later deploys the next.
        assert!(o.deploys_ms.windows(2).all(|w| w[1] - w[0] == 3500));
        assert_eq!(o.reactions_ms(), vec![1000; 9]);
    }

    #[test]
    fn one_invalid_node_invalidates_the_revision() {
        let mut agents = healthy(20, 1000);
        agents[3].answer = Answer::Invalid;
        let o = run(&agents, &params(5));
        assert_eq!(o.end, End::Invalidated { node: 3 });
        assert!(o.updated < 20);
    }

    #[test]
    fn a_silent_node_holds_its_slot_for_good() {
        let mut agents = healthy(5, 1000);
        agents[1].answer = Answer::Silent;
        let o = run(&agents, &params(1));
        assert_eq!(o.end, End::Stuck);
        assert_eq!(o.deploys_ms.len(), 2);
        assert_eq!(o.updated, 1);
    }
}
