//! How long the leader's reconcile loop gathers changes before it plans (#28).
//!
//! ```text
//!  agent report ──► first change not taken ──wait──► reconcile (cost) ──► next assignment written
//!                   └──────────────── reaction: wait + cost ─────────────────┘
//!  wait = max(--coalesce-window, --reaction-target − cost)     cost: recent reconciles, smoothed
//! ```
//!
//! During a rollout the changes never stop (at 5,000 nodes, hundreds of agent reports a second), so
//! the loop reconciles back to back and the number of reconciles is set by how long each waits, not
//! by the events. Each reconcile plans over the whole fleet, so its cost grows with the fleet and the
//! leader's CPU per rollout is about `cost / (wait + cost)` of the rollout's wall time. A fixed wait
//! was either short for a small fleet (reconciles every few milliseconds, each answering one or two
//! reports) or long for a large one (its reaction is the wait plus a long reconcile). Aiming the
//! wait plus the reconcile at one reaction target spends what a fast reconcile leaves of the target
//! on batching more reports into it, and never waits less than the window: a fleet whose reconciles
//! take longer than the target waits the window, as before.

use std::time::Duration;

/// Weight of the newest reconcile in the smoothed cost: a few reconciles follow a change of pace
/// (a rollout starting, the fleet growing), one slow reconcile does not double the next wait.
const NEWEST: f64 = 0.2;

/// The wait before a leader's reconcile, from the cost of the last ones.
#[derive(Clone, Debug)]
pub struct Pace {
    window: Duration,
    target: Duration,
    /// Smoothed cost of a reconcile, in seconds (`None`: none measured yet).
    cost: Option<f64>,
}

impl Pace {
    /// `window`: the least wait (`--coalesce-window`); `target`: what the wait and the reconcile
    /// after it aim at (`--reaction-target`).
    pub fn new(window: Duration, target: Duration) -> Self {
        Pace {
            window,
            target,
            cost: None,
        }
    }

    /// A reconcile took `took`.
    pub fn observe(&mut self, took: Duration) {
        let took = took.as_secs_f64();
        self.cost = Some(match self.cost {
            None => took,
            Some(c) => c + NEWEST * (took - c),
        });
    }

    /// How long to wait after the first change not taken before the next reconcile.
    pub fn wait(&self) -> Duration {
        // Until a reconcile was measured, no more than the window: a new leader answers at once.
        let Some(cost) = self.cost else {
            return self.window;
        };
        let left = self.target.as_secs_f64() - cost;
        self.window.max(Duration::from_secs_f64(left.max(0.0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A fast reconcile leaves most of the target to gather reports in; a slow one waits the window;
    /// the wait follows the cost over a few reconciles, not at the first slow one.
    #[test]
    fn the_wait_is_what_the_reconciles_leave_of_the_target_and_at_least_the_window() {
        let mut p = Pace::new(15 * MS, 30 * MS);
        assert_eq!(p.wait(), 15 * MS, "nothing measured yet: the window");
        p.observe(4 * MS);
        assert_eq!(p.wait(), 26 * MS);
        // A larger fleet: its reconciles take 20 ms.
        for _ in 0..30 {
            p.observe(20 * MS);
        }
        assert_eq!(p.wait(), 15 * MS, "the window is the least wait");
        // Back to 8 ms reconciles; then one of 28 ms moves the cost by a fifth of the difference.
        for _ in 0..60 {
            p.observe(8 * MS);
        }
        let steady = p.wait();
        assert!(steady > 21 * MS && steady <= 22 * MS, "{steady:?}");
        p.observe(28 * MS);
        let w = p.wait();
        assert!(w > 17 * MS && w < 19 * MS, "{w:?}");
        // A fleet whose reconciles outgrow the target still waits the window.
        for _ in 0..30 {
            p.observe(80 * MS);
        }
        assert_eq!(p.wait(), 15 * MS);
    }
}
