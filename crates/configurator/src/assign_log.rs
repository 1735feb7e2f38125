//! The log lines about assignments, for the people who read the configurator's log (#28).
//!
//! A rollout at 5,000 nodes assigns in about a thousand reconciles, and one line per reconcile was a
//! thousand lines per rollout: a few a second on any large fleet, each naming five nodes. Now:
//! - the first assignment of a revision for a reason (a rollout starts, a canary wave, nodes joining)
//!   is logged at once;
//! - after that, at most one line per revision and reason every [`SUMMARY_EVERY`], saying how many
//!   more nodes it assigned since and naming the first few;
//! - a revision and reason that assigned nothing for a whole interval starts afresh (its next
//!   assignment is logged at once);
//! - rollbacks, retries, re-renders and restamps are logged at once, every time: they follow a failure
//!   or an admin's action, and are what someone reads the log for afterwards.
//!
//! Only what the writer sent counts: an assignment planned again before the cache showed it (not sent
//! twice) is not a second assignment.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use netwave_core::rollout::{AssignReason, Plan};

/// How often a revision's moves of one reason are summed up in one line.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(10);

/// How many node names a line lists before "and N more".
const SHOWN: usize = 5;

/// One line to log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub revision: String,
    pub reason: &'static str,
    pub count: usize,
    pub message: String,
}

/// What was assigned and not logged yet, per revision and reason; see the module docs.
#[derive(Debug, Default)]
pub struct AssignLog {
    groups: BTreeMap<(String, AssignReason), Group>,
}

#[derive(Debug)]
struct Group {
    /// When this group's last line was written.
    logged: Instant,
    /// Nodes assigned since that line, in the order assigned (the first [`SHOWN`] are named).
    count: usize,
    names: Vec<String>,
    /// New nodes given the last good revision (worded as nodes joining).
    joined: bool,
}

/// Moves logged every time: rare, and each one follows a failure or an admin's action.
fn at_once(reason: AssignReason) -> bool {
    matches!(
        reason,
        AssignReason::Rollback
            | AssignReason::Retry
            | AssignReason::Rerender
            | AssignReason::Restamp
    )
}

impl AssignLog {
    /// The lines to log now: the summaries that are due, then what `plan` assigned of the nodes the
    /// writer sent (`sent`), where it is the first of its kind or logged at once.
    pub fn record(&mut self, plan: Option<&Plan>, sent: &HashSet<&str>, now: Instant) -> Vec<Line> {
        let mut lines = self.due(now);
        let Some(plan) = plan else {
            return lines;
        };
        let mut assigned: BTreeMap<(&str, AssignReason), Vec<&str>> = BTreeMap::new();
        for a in &plan.assignments {
            if sent.contains(a.node.as_str()) {
                (assigned.entry((a.revision.as_str(), a.reason)).or_default())
                    .push(a.node.as_str());
            }
        }
        for ((revision, reason), nodes) in assigned {
            let joined = reason == AssignReason::NewNode
                && plan.report.last_good.as_deref() == Some(revision);
            if at_once(reason) {
                lines.push(line(revision, reason, joined, &nodes, nodes.len(), None));
                continue;
            }
            match self.groups.get_mut(&(revision.to_string(), reason)) {
                Some(g) => {
                    g.count += nodes.len();
                    let room = SHOWN.saturating_sub(g.names.len());
                    g.names
                        .extend(nodes.iter().take(room).map(ToString::to_string));
                }
                None => {
                    lines.push(line(revision, reason, joined, &nodes, nodes.len(), None));
                    self.groups.insert(
                        (revision.to_string(), reason),
                        Group {
                            logged: now,
                            count: 0,
                            names: Vec::new(),
                            joined,
                        },
                    );
                }
            }
        }
        lines
    }

    /// When the next summary is due (the run loop wakes for it, so the last moves of a rollout are
    /// not left unlogged until something else happens).
    pub fn next_due(&self) -> Option<Instant> {
        (self.groups.values())
            .filter(|g| g.count > 0)
            .map(|g| g.logged + SUMMARY_EVERY)
            .min()
    }

    /// The summaries whose interval is over; groups that assigned nothing in theirs are forgotten.
    fn due(&mut self, now: Instant) -> Vec<Line> {
        let mut lines = Vec::new();
        self.groups.retain(|(revision, reason), g| {
            if now < g.logged + SUMMARY_EVERY {
                return true;
            }
            if g.count == 0 {
                return false;
            }
            let names: Vec<&str> = g.names.iter().map(String::as_str).collect();
            let over = now.duration_since(g.logged);
            lines.push(line(
                revision,
                *reason,
                g.joined,
                &names,
                g.count,
                Some(over),
            ));
            (g.logged, g.count) = (now, 0);
            g.names.clear();
            true
        });
        lines
    }
}

/// One line: `count` nodes, `names` the first of them; `over` the time a summary covers.
fn line(
    revision: &str,
    reason: AssignReason,
    joined: bool,
    names: &[&str],
    count: usize,
    over: Option<Duration>,
) -> Line {
    let shown = names.len().min(SHOWN);
    let mut listed = names[..shown].join(", ");
    if count > shown {
        listed = format!("{listed} and {} more", count - shown);
    }
    let message = match (over, joined) {
        (None, false) => format!("assigned {listed}"),
        (None, true) => format!(
            "joined: {listed} got the last good revision without waiting for the rollout budget \
             (nothing of ours runs there to disrupt)"
        ),
        (Some(over), false) => format!(
            "assigned {count} more node(s) in the last {}s: {listed}",
            over.as_secs()
        ),
        (Some(over), true) => format!(
            "joined: {count} more node(s) got the last good revision in the last {}s: {listed}",
            over.as_secs()
        ),
    };
    Line {
        revision: revision.to_string(),
        reason: reason.as_str(),
        count,
        message,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::time::{Duration, Instant};

    use netwave_core::rollout::{AssignReason, Assignment, Plan};
    use netwave_core::{Sequence, Timestamp};

    use super::{AssignLog, Line, SUMMARY_EVERY};

    fn plan(revision: &str, reason: AssignReason, nodes: &[String]) -> Plan {
        let assignments = nodes
            .iter()
            .map(|n| Assignment {
                node: n.as_str().into(),
                create: false,
                revision: revision.into(),
                sequence: Sequence(2),
                config_hash: "hash".into(),
                retry: 0,
                assigned_at: Timestamp(0),
                reason,
            })
            .collect();
        Plan {
            assignments,
            ..Plan::default()
        }
    }

    fn names(from: usize, n: usize) -> Vec<String> {
        (from..from + n).map(|i| format!("node-{i:04}")).collect()
    }

    fn all(nodes: &[String]) -> HashSet<&str> {
        nodes.iter().map(String::as_str).collect()
    }

    /// A rollout of 1,000 nodes over 25 s in reconciles of 4: one line when it starts, one summary
    /// per 10 s, the last moves when their interval is over; every sent node counted once.
    #[test]
    fn a_rollout_is_one_line_when_it_starts_and_one_per_interval_after() {
        let t0 = Instant::now();
        let mut log = AssignLog::default();
        let mut lines: Vec<(Duration, Line)> = Vec::new();
        for step in 0..250 {
            let at = t0 + Duration::from_millis(100 * step as u64);
            let nodes = names(4 * step, 4);
            let p = plan("rev-b", AssignReason::Rollout, &nodes);
            lines
                .extend((log.record(Some(&p), &all(&nodes), at).into_iter()).map(|l| (at - t0, l)));
        }
        let due = log
            .next_due()
            .expect("the last moves are waiting for their summary");
        // Ten seconds after the last summary, not after the last move: one line per interval.
        assert_eq!(due, t0 + Duration::from_secs(30));
        lines.extend((log.record(None, &HashSet::new(), due).into_iter()).map(|l| (due - t0, l)));
        let texts: Vec<(u64, usize, &str)> = (lines.iter())
            .map(|(at, l)| (at.as_secs(), l.count, l.message.as_str()))
            .collect();
        assert_eq!(
            texts,
            vec![
                (0, 4, "assigned node-0000, node-0001, node-0002, node-0003"),
                (
                    10,
                    396,
                    "assigned 396 more node(s) in the last 10s: node-0004, node-0005, node-0006, \
                     node-0007, node-0008 and 391 more"
                ),
                (
                    20,
                    400,
                    "assigned 400 more node(s) in the last 10s: node-0400, node-0401, node-0402, \
                     node-0403, node-0404 and 395 more"
                ),
                (
                    30,
                    200,
                    "assigned 200 more node(s) in the last 10s: node-0800, node-0801, node-0802, \
                     node-0803, node-0804 and 195 more"
                ),
            ]
        );
        assert!(
            lines
                .iter()
                .all(|(_, l)| l.revision == "rev-b" && l.reason == "Rollout")
        );
        assert_eq!(lines.iter().map(|(_, l)| l.count).sum::<usize>(), 1000);
        assert_eq!(log.next_due(), None, "nothing is left to say");
        // Quiet for a whole interval: the next move is news again, logged at once.
        let later = due + SUMMARY_EVERY;
        let nodes = names(5000, 1);
        let p = plan("rev-b", AssignReason::Rollout, &nodes);
        let now = log.record(Some(&p), &all(&nodes), later);
        assert_eq!(
            (now.len(), now.first().map(|l| l.message.as_str())),
            (1, Some("assigned node-5000"))
        );
    }

    /// Rollbacks are logged every time; an assignment the writer did not send (planned again before
    /// the cache showed it) is not counted; new nodes onto the last good revision read as joining.
    #[test]
    fn rollbacks_are_logged_at_once_and_unsent_moves_not_at_all() {
        let t0 = Instant::now();
        let mut log = AssignLog::default();
        let first = names(0, 2);
        let p = plan("rev-a", AssignReason::Rollback, &first);
        assert_eq!(log.record(Some(&p), &all(&first), t0).len(), 1);
        let p = plan("rev-a", AssignReason::Rollback, &names(2, 1));
        let again = log.record(Some(&p), &all(&names(2, 1)), t0 + Duration::from_millis(50));
        assert_eq!(
            again.iter().map(|l| l.message.as_str()).collect::<Vec<_>>(),
            vec!["assigned node-0002"]
        );
        assert_eq!(log.next_due(), None, "rollbacks leave nothing to sum up");

        let planned = names(10, 3);
        let p = plan("rev-b", AssignReason::Rollout, &planned);
        let sent: HashSet<&str> = planned[..1].iter().map(String::as_str).collect();
        let lines = log.record(Some(&p), &sent, t0 + Duration::from_secs(1));
        assert_eq!(
            (lines.len(), lines[0].count, lines[0].message.as_str()),
            (1, 1, "assigned node-0010")
        );
        let lines = log.record(Some(&p), &HashSet::new(), t0 + Duration::from_secs(2));
        assert!(lines.is_empty());
        assert_eq!(
            log.next_due(),
            None,
            "nothing unsent is waiting to be summed up"
        );

        let mut p = plan("rev-a", AssignReason::NewNode, &names(20, 1));
        p.report.last_good = Some("rev-a".into());
        let lines = log.record(Some(&p), &all(&names(20, 1)), t0 + Duration::from_secs(3));
        assert!(
            lines[0]
                .message
                .starts_with("joined: node-0020 got the last good revision")
        );
    }
}
