//! Whether a configurator replica can do a leader's work, and so may hold the leader Lease (DESIGN §6:
//! "a leader that cannot work lets go of the Lease"). A replica whose caches never synced, whose watch
//! keeps failing, or whose reconcile loop died or hangs would otherwise renew the Lease forever: the
//! fleet would have a leader that does nothing, and the standby could never take over.
//!
//! ```text
//!  View { each watch: listing for, synced? failing since/last error, needed before the Lease?,
//!         reconcile loop: idle|busy for|ended }
//!        ──fitness(view, bounds)──► Starting  (caches still syncing: take no Lease yet)
//!                                   Working   (acquire and renew)
//!                                   Unfit(why) (let go of the Lease, fail /readyz, one log line;
//!                                               /healthz too only if a restart repairs it)
//! ```
//!
//! Pure: the shell measures how long each thing has been as it is and passes durations in.

use std::fmt;
use std::time::Duration;

/// How long each part may be unable to work before the replica is unfit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Every watch must have listed within this long of its start, and a watch whose requests keep
    /// failing is given this long to recover.
    pub sync: Duration,
    /// One reconcile pass may take this long.
    pub reconcile: Duration,
    /// Errors of a watch further apart than this are separate problems, not one that persists: a
    /// failing watch retries at least this often (the watcher's backoff caps below it), and a watch
    /// that recovered without a new event (a re-watch that succeeded) simply stops reporting errors.
    pub error_gap: Duration,
}

/// One watch as the shell saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchView {
    /// The kind it watches, for the message.
    pub kind: String,
    /// Its initial list arrived at least once.
    pub synced: bool,
    /// Since the watch started (at the replica's start, or when it began to lead for a watch only a
    /// leader keeps).
    pub started: Duration,
    /// The replica needs its cache before it takes the Lease. A watch only a leader keeps starts once
    /// the Lease is held, and its first list is awaited while leading (#28).
    pub before_lease: bool,
    /// Errors since its last good event, if any.
    pub failing: Option<WatchErrors>,
}

/// A run of errors of one watch with no good event in between.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchErrors {
    /// Since the first error of the run.
    pub for_: Duration,
    /// Since the last error of the run.
    pub last_ago: Duration,
    /// The last error, as the watcher said it.
    pub error: String,
}

/// The reconcile loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loop {
    /// Waiting for a change (or for the caches, before its first pass).
    Idle,
    /// In a pass for this long.
    Busy { for_: Duration },
    /// The task ended (panicked or returned) without a shutdown: nothing reconciles any more.
    Ended,
}

/// What the shell knows of the replica's ability to work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    pub watches: Vec<WatchView>,
    pub reconcile: Loop,
}

/// Whether the replica may hold the Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fitness {
    /// Caches still syncing, within [`Bounds::sync`]: take no Lease yet (a leader with empty caches
    /// would do nothing), but nothing is wrong.
    Starting,
    /// Able to work: acquire and renew the Lease.
    Working,
    /// Unable to work: let go of the Lease, fail the readiness probe (and the liveness probe if
    /// [`Unfit::restart_repairs`]), say why.
    Unfit(Unfit),
}

/// Why a replica cannot work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unfit {
    /// The reconcile loop ended: a restart is the only repair.
    ReconcileEnded,
    /// Some watches have not listed within [`Bounds::sync`] of their start: `(kind, last error)`.
    NeverSynced {
        after: Duration,
        waiting: Vec<(String, Option<String>)>,
    },
    /// A watch's requests have kept failing for longer than [`Bounds::sync`].
    WatchFailing {
        kind: String,
        for_: Duration,
        error: String,
    },
    /// One reconcile pass has been running for longer than [`Bounds::reconcile`].
    ReconcileStalled { for_: Duration },
}

impl Unfit {
    /// Whether restarting the process repairs it: a dead or hung reconcile loop. A watch that cannot
    /// list or keeps failing waits on something outside the process (the API server, the network, its
    /// RBAC): a restart would only relist everything into the same answer, and an API outage of a few
    /// minutes would restart every replica at once, into CrashLoopBackOff. Such a replica lets go of the
    /// Lease and is not ready, but stays alive and recovers as soon as its watches do.
    pub fn restart_repairs(&self) -> bool {
        match self {
            Unfit::ReconcileEnded | Unfit::ReconcileStalled { .. } => true,
            Unfit::NeverSynced { .. } | Unfit::WatchFailing { .. } => false,
        }
    }

    /// Whether `other` is the same problem (told once), not a new one: the durations in the message
    /// grow every time it is judged.
    pub fn same_problem(&self, other: &Unfit) -> bool {
        match (self, other) {
            (Unfit::WatchFailing { kind: a, .. }, Unfit::WatchFailing { kind: b, .. }) => a == b,
            (Unfit::NeverSynced { waiting: a, .. }, Unfit::NeverSynced { waiting: b, .. }) => {
                a.iter().map(|w| &w.0).eq(b.iter().map(|w| &w.0))
            }
            _ => std::mem::discriminant(self) == std::mem::discriminant(other),
        }
    }
}

impl fmt::Display for Unfit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unfit::ReconcileEnded => f.write_str(
                "the reconcile loop ended (panicked or returned): nothing reconciles any more",
            ),
            Unfit::NeverSynced { after, waiting } => {
                write!(f, "caches not synced after {}s: ", after.as_secs())?;
                for (i, (kind, error)) in waiting.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    match error {
                        Some(e) => write!(f, "{kind} watch failing: {e}")?,
                        None => write!(f, "{kind} not listed yet")?,
                    }
                }
                Ok(())
            }
            Unfit::WatchFailing { kind, for_, error } => write!(
                f,
                "the {kind} watch has failed for {}s (cache stale): {error}",
                for_.as_secs()
            ),
            Unfit::ReconcileStalled { for_ } => write!(
                f,
                "one reconcile pass has been running for {}s",
                for_.as_secs()
            ),
        }
    }
}

/// Judges `view`: a dead loop first (nothing else matters), then the caches, then a hung pass.
pub fn fitness(view: &View, bounds: &Bounds) -> Fitness {
    if view.reconcile == Loop::Ended {
        return Fitness::Unfit(Unfit::ReconcileEnded);
    }
    let unsynced = || view.watches.iter().filter(|w| !w.synced);
    let overdue: Vec<&WatchView> = unsynced().filter(|w| w.started >= bounds.sync).collect();
    if let Some(after) = overdue.iter().map(|w| w.started).max() {
        return Fitness::Unfit(Unfit::NeverSynced {
            after,
            waiting: (overdue.iter())
                .map(|w| (w.kind.clone(), w.failing.as_ref().map(|e| e.error.clone())))
                .collect(),
        });
    }
    // A leader's own watch still listing holds no Lease back: its leader waits for the list.
    if unsynced().any(|w| w.before_lease) {
        return Fitness::Starting;
    }
    let failing = view.watches.iter().find_map(|w| {
        let e = w.failing.as_ref()?;
        (e.for_ >= bounds.sync && e.last_ago < bounds.error_gap).then(|| Unfit::WatchFailing {
            kind: w.kind.clone(),
            for_: e.for_,
            error: e.error.clone(),
        })
    });
    if let Some(why) = failing {
        return Fitness::Unfit(why);
    }
    match view.reconcile {
        Loop::Busy { for_ } if for_ >= bounds.reconcile => {
            Fitness::Unfit(Unfit::ReconcileStalled { for_ })
        }
        _ => Fitness::Working,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn bounds() -> Bounds {
        Bounds {
            sync: S(120),
            reconcile: S(300),
            error_gap: S(90),
        }
    }

    fn watch(kind: &str, synced: bool, failing: Option<(u64, u64, &str)>) -> WatchView {
        WatchView {
            kind: kind.into(),
            synced,
            started: S(0),
            before_lease: true,
            failing: failing.map(|(for_, last_ago, e)| WatchErrors {
                for_: S(for_),
                last_ago: S(last_ago),
                error: e.into(),
            }),
        }
    }

    /// The replica up for `up` seconds, its watches started with it.
    fn view(up: u64, mut watches: Vec<WatchView>, reconcile: Loop) -> View {
        for w in &mut watches {
            w.started = S(up);
        }
        View { watches, reconcile }
    }

    /// A replica still listing takes no Lease; one that cannot list is unfit once the bound passes, and
    /// the message names the kind and the server's answer.
    #[test]
    fn a_replica_whose_caches_never_sync_takes_no_lease_and_is_unfit_after_the_bound() {
        let forbidden = "RoutingTable list forbidden (403)";
        let watches = || {
            vec![
                watch("Node", true, None),
                watch("RoutingTable", false, Some((100, 5, forbidden))),
            ]
        };
        assert_eq!(
            fitness(&view(10, watches(), Loop::Idle), &bounds()),
            Fitness::Starting
        );
        let Fitness::Unfit(why) = fitness(&view(120, watches(), Loop::Idle), &bounds()) else {
            panic!("unfit after the sync bound");
        };
        assert_eq!(
            why.to_string(),
            "caches not synced after 120s: RoutingTable watch failing: RoutingTable list forbidden (403)"
        );
        let synced = vec![watch("Node", true, None), watch("RoutingTable", true, None)];
        assert_eq!(
            fitness(&view(500, synced, Loop::Idle), &bounds()),
            Fitness::Working
        );
    }

    /// A watch only a leader keeps (the node configs, #28) does not hold the Lease back while its
    /// first list is on its way, and its bound counts from when it started, not from the replica's
    /// start: a replica that led only after an hour as standby still gets the whole bound.
    #[test]
    fn a_leaders_own_watch_listing_holds_no_lease_back_until_its_bound_passes() {
        let leading = |started: u64, synced: bool| View {
            watches: vec![
                WatchView {
                    started: S(3600),
                    ..watch("Node", true, None)
                },
                WatchView {
                    started: S(started),
                    before_lease: false,
                    ..watch("NodeNetworkConfig", synced, None)
                },
            ],
            reconcile: Loop::Idle,
        };
        assert_eq!(fitness(&leading(5, false), &bounds()), Fitness::Working);
        assert_eq!(fitness(&leading(119, false), &bounds()), Fitness::Working);
        assert_eq!(
            fitness(&leading(120, false), &bounds()),
            Fitness::Unfit(Unfit::NeverSynced {
                after: S(120),
                waiting: vec![("NodeNetworkConfig".into(), None)],
            })
        );
        assert_eq!(fitness(&leading(500, true), &bounds()), Fitness::Working);
    }

    /// A loop that ended is unfit at once, whatever the caches say.
    #[test]
    fn a_replica_whose_reconcile_loop_ended_is_unfit_at_once() {
        for watches in [
            vec![watch("Node", true, None)],
            vec![watch("Node", false, None)],
        ] {
            assert_eq!(
                fitness(&view(1, watches, Loop::Ended), &bounds()),
                Fitness::Unfit(Unfit::ReconcileEnded)
            );
        }
    }

    /// After the sync, a watch is unfit only while its errors persist past the bound; a watch that
    /// recovered quietly (no error for longer than the gap) is not held against the replica.
    #[test]
    fn a_watch_failing_past_the_bound_makes_the_replica_unfit_a_recovered_one_does_not() {
        let with = |failing| {
            view(
                1000,
                vec![watch("NodeNetworkConfig", true, failing)],
                Loop::Idle,
            )
        };
        assert_eq!(
            fitness(&with(Some((60, 20, "503"))), &bounds()),
            Fitness::Working,
            "failing, within the bound"
        );
        assert_eq!(
            fitness(&with(Some((130, 20, "503"))), &bounds()),
            Fitness::Unfit(Unfit::WatchFailing {
                kind: "NodeNetworkConfig".into(),
                for_: S(130),
                error: "503".into()
            })
        );
        assert_eq!(
            fitness(&with(Some((400, 100, "503"))), &bounds()),
            Fitness::Working,
            "no error for longer than the gap: recovered"
        );
    }

    #[test]
    fn a_pass_running_past_the_bound_is_a_stall() {
        let synced = || vec![watch("Node", true, None)];
        assert_eq!(
            fitness(
                &view(1000, synced(), Loop::Busy { for_: S(299) }),
                &bounds()
            ),
            Fitness::Working
        );
        assert_eq!(
            fitness(
                &view(1000, synced(), Loop::Busy { for_: S(300) }),
                &bounds()
            ),
            Fitness::Unfit(Unfit::ReconcileStalled { for_: S(300) })
        );
    }
}
