//! The seeded fleet simulation: 1,000 seeds × 50 nodes with random faults, churn and leader kills,
//! every invariant checked after every write (see `netwave_core::sim`).

use std::ops::Range;

use netwave_core::sim::{Fleet, Outcome, SimConfig, run_seed};

const NODES: usize = 50;

#[derive(Default, Debug)]
struct Totals {
    runs: u32,
    leader_kills: u32,
    failed_revisions: u32,
    node_failures: u32,
    rollbacks: u32,
    fast_paths: u32,
    canary_bakes: u32,
    converged: u32,
}

impl Totals {
    fn add(&mut self, o: &Outcome) {
        self.runs += 1;
        self.leader_kills += o.leader_kills;
        self.failed_revisions += o.failed_revisions;
        self.node_failures += o.node_failures;
        self.rollbacks += o.rollbacks;
        self.fast_paths += o.fast_paths;
        self.canary_bakes += o.canary_bakes;
        self.converged += o.final_target.is_some() as u32;
    }
}

fn run_range(seeds: Range<u64>) -> Totals {
    let mut totals = Totals::default();
    for seed in seeds {
        match run_seed(seed, NODES) {
            Ok(o) => totals.add(&o),
            Err(v) => panic!("invariant violated: {v}\nreproduce: run_seed({seed}, {NODES})"),
        }
    }
    // The runs must actually exercise what the invariants are about.
    assert!(totals.leader_kills > totals.runs, "{totals:?}");
    assert!(
        totals.failed_revisions > 0 && totals.rollbacks > 0,
        "{totals:?}"
    );
    assert!(
        totals.node_failures > 0 && totals.fast_paths > 0,
        "{totals:?}"
    );
    assert!(totals.canary_bakes > 0, "{totals:?}");
    totals
}

#[test]
fn invariants_hold_for_seeds_0_to_250() {
    run_range(0..250);
}

#[test]
fn invariants_hold_for_seeds_250_to_500() {
    run_range(250..500);
}

#[test]
fn invariants_hold_for_seeds_500_to_750() {
    run_range(500..750);
}

#[test]
fn invariants_hold_for_seeds_750_to_1000() {
    run_range(750..1000);
}

#[test]
fn identical_seeds_give_identical_histories() {
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..20 {
        let a = run_seed(seed, NODES).unwrap();
        let b = run_seed(seed, NODES).unwrap();
        assert_eq!(a, b, "seed {seed}");
        assert!(
            seen.insert(a.history),
            "seed {seed} repeats another seed's history"
        );
    }
}

#[test]
fn without_faults_every_node_converges_to_the_target() {
    for seed in 0..100 {
        let cfg = SimConfig::random(seed, NODES).without_faults();
        let o = Fleet::new(cfg).run().unwrap_or_else(|v| panic!("{v}"));
        assert!(o.final_target.is_some(), "seed {seed}");
        assert_eq!(
            (o.failed_revisions, o.node_failures, o.leader_kills),
            (0, 0, 0),
            "seed {seed}"
        );
    }
}

#[test]
fn larger_fleets_hold_the_invariants_too() {
    for seed in [7, 8, 9] {
        let o = run_seed(seed, 300).unwrap_or_else(|v| panic!("{v}"));
        assert!(o.writes > 300, "seed {seed}: {o:?}");
    }
}
