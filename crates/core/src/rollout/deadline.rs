//! When a node that has not reported on its assignment has failed (DESIGN.md §3 **Failure**): the
//! apply timeout measures the agent's work, not the API server's latency.
//!
//! ```text
//!  assigned_at ──── pickupTimeoutSeconds ────► pickup deadline: no start reported → PickupTimeout
//!       │  the agent sees the spec (late, if the API server is slow)
//!       └──► started (its Provisioning report's lastTransitionTime, clamped into the window above)
//!                 └──── applyTimeoutSeconds ────► apply deadline: no verdict → ApplyTimeout
//! ```
//!
//! Whose clock: the start is the agent's own `lastTransitionTime` of its `Provisioning` report for
//! this revision, retry and config, read from the object, so a new leader after a failover finds the
//! same start the old one used (an observation time kept in the leader's memory would be lost, and the
//! clock restarted or, worse, taken from the assignment). Agent clocks may be skewed, so the start is
//! clamped: never before the assignment (an agent clock running behind gets no less than the old
//! rule, counted from assignment) and never after the pickup deadline (an agent clock running ahead
//! delays its node's failure by at most `pickupTimeoutSeconds`). A node is thus failed at the latest
//! `pickupTimeoutSeconds + applyTimeoutSeconds` after its assignment, whatever its agent says.

use super::input::{AgentPhase, AgentReport};
// Defined with the policy it comes from, so the policy needs nothing from here (no import circle).
pub use super::policy::Timeouts;
use super::vocab::{REASON_APPLY_TIMEOUT, REASON_PICKUP_TIMEOUT};
use crate::types::Timestamp;

/// One assignment of a node: what the agent must start and finish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attempt<'a> {
    pub revision: &'a str,
    pub retry: u32,
    pub config_hash: &'a str,
    pub assigned_at: Timestamp,
}

/// When a node that has not reported its verdict on an attempt has failed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deadline {
    /// The agent has not started this attempt: it must by `at` (assignment + pickup timeout).
    Pickup { at: Timestamp, timeout: u32 },
    /// The agent started this attempt at `started` (clamped, see the module docs): it must report
    /// by `at` (start + apply timeout).
    Apply {
        started: Timestamp,
        at: Timestamp,
        timeout: u32,
    },
}

impl Deadline {
    pub fn at(&self) -> Timestamp {
        match *self {
            Deadline::Pickup { at, .. } | Deadline::Apply { at, .. } => at,
        }
    }

    /// The failure reason and message recorded when `now` is past the deadline of `attempt`.
    pub fn failure(&self, attempt: &Attempt) -> (&'static str, String) {
        let assigned = attempt.assigned_at.to_time().0;
        match *self {
            Deadline::Pickup { timeout, .. } => (
                REASON_PICKUP_TIMEOUT,
                format!(
                    "the agent did not start applying revision {} (no Provisioning report) within \
                     {timeout}s (pickupTimeoutSeconds) of assignment at {assigned}",
                    attempt.revision
                ),
            ),
            Deadline::Apply {
                started, timeout, ..
            } => (
                REASON_APPLY_TIMEOUT,
                format!(
                    "the agent started applying revision {} at {} but did not report it \
                     Provisioned within {timeout}s (applyTimeoutSeconds)",
                    attempt.revision,
                    started.to_time().0
                ),
            ),
        }
    }
}

/// The deadline of `attempt` given the agent's latest `report`. Pure; the caller compares it with
/// its `now`.
pub fn deadline(attempt: &Attempt, report: &AgentReport, timeouts: Timeouts) -> Deadline {
    let pickup_at = attempt.assigned_at.plus_secs(u64::from(timeouts.pickup));
    let this_attempt = report.phase == Some(AgentPhase::Provisioning)
        && report.observed_revision.as_deref() == Some(attempt.revision)
        && report.observed_retry.unwrap_or(0) == attempt.retry
        && report
            .observed_config_hash
            .as_deref()
            .is_none_or(|h| h == attempt.config_hash);
    match report.started_at.filter(|_| this_attempt) {
        Some(reported) => {
            let started = reported.clamp(attempt.assigned_at, pickup_at);
            Deadline::Apply {
                started,
                at: started.plus_secs(u64::from(timeouts.apply)),
                timeout: timeouts.apply,
            }
        }
        None => Deadline::Pickup {
            at: pickup_at,
            timeout: timeouts.pickup,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timeouts = Timeouts {
        apply: 60,
        pickup: 120,
    };

    fn attempt() -> Attempt<'static> {
        Attempt {
            revision: "r2",
            retry: 0,
            config_hash: "cfg-r2",
            assigned_at: Timestamp::from_secs(100),
        }
    }

    fn provisioning(revision: &str, hash: &str, started: i64) -> AgentReport {
        AgentReport {
            phase: Some(AgentPhase::Provisioning),
            observed_revision: Some(revision.into()),
            observed_retry: Some(0),
            observed_config_hash: Some(hash.into()),
            started_at: Some(Timestamp::from_secs(started)),
            ..AgentReport::default()
        }
    }

    #[test]
    fn the_apply_timeout_counts_from_the_agents_start_of_this_attempt() {
        let d = deadline(&attempt(), &provisioning("r2", "cfg-r2", 150), T);
        assert_eq!(d.at(), Timestamp::from_secs(210));
        assert_eq!(d.failure(&attempt()).0, REASON_APPLY_TIMEOUT);
    }

    #[test]
    fn a_start_reported_for_another_attempt_is_no_start() {
        for report in [
            provisioning("r1", "cfg-r2", 150),
            provisioning("r2", "cfg-old", 150),
            AgentReport {
                observed_retry: Some(1),
                ..provisioning("r2", "cfg-r2", 150)
            },
            AgentReport {
                phase: Some(AgentPhase::Provisioned),
                ..provisioning("r2", "cfg-r2", 150)
            },
            AgentReport::default(),
        ] {
            let d = deadline(&attempt(), &report, T);
            assert_eq!(
                d,
                Deadline::Pickup {
                    at: Timestamp::from_secs(220),
                    timeout: 120
                },
                "{report:?}"
            );
            assert_eq!(d.failure(&attempt()).0, REASON_PICKUP_TIMEOUT);
        }
    }

    #[test]
    fn a_skewed_agent_clock_moves_the_start_only_within_assignment_and_pickup_deadline() {
        // Behind: counted from the assignment (the old rule).
        let d = deadline(&attempt(), &provisioning("r2", "cfg-r2", 10), T);
        assert_eq!(d.at(), Timestamp::from_secs(160));
        // Far ahead: from the pickup deadline, never later.
        let d = deadline(&attempt(), &provisioning("r2", "cfg-r2", 100_000), T);
        assert_eq!(d.at(), Timestamp::from_secs(280));
    }
}
