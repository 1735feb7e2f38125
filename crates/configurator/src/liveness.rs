//! What this replica knows of its own ability to work, fed by the watches and the reconcile loop and
//! judged by `netwave_core::leadership::fitness`: the Lease elector asks before every acquire or
//! renew, `/healthz` and `/readyz` before every answer.
//!
//! ```text
//!  watch tasks ──ok / error──┐
//!  reconcile loop ─pass()────┼─► Liveness ──judge()──► Elector (renew | let go), /healthz, /readyz
//!  reconcile task ─ended─────┘
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use kube::runtime::watcher;
use netwave_core::leadership::{self, Bounds, Fitness, Loop, View, WatchErrors, WatchView};
use netwave_runtime::Unable;
use tokio::time::Instant;

/// Shared by the watches, the reconcile loop, the elector and the health endpoints.
#[derive(Clone, Debug)]
pub struct Liveness {
    state: Arc<Mutex<State>>,
    bounds: Bounds,
}

#[derive(Debug)]
struct State {
    watches: BTreeMap<String, Watch>,
    reconcile: Reconcile,
}

#[derive(Debug)]
struct Watch {
    started: Instant,
    /// See [`netwave_core::leadership::WatchView::before_lease`].
    before_lease: bool,
    synced: bool,
    /// First and last error of the current run, and the last error's text.
    failing: Option<(Instant, Instant, String)>,
}

#[derive(Clone, Copy, Debug)]
enum Reconcile {
    Idle,
    Busy(Instant),
    Ended,
}

impl Liveness {
    pub fn new(bounds: Bounds) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                watches: BTreeMap::new(),
                reconcile: Reconcile::Idle,
            })),
            bounds,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while holding this lock leaves plain data behind: still readable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a watch of `kind` (not synced yet) whose cache the replica needs before it takes the
    /// Lease, and returns its reporter.
    pub fn watch(&self, kind: &str) -> WatchHealth {
        self.register(kind, true)
    }

    /// Registers a watch of `kind` that only a leader keeps, started once it leads: its first list
    /// is awaited while leading, within the same bound.
    pub fn leader_watch(&self, kind: &str) -> WatchHealth {
        self.register(kind, false)
    }

    fn register(&self, kind: &str, before_lease: bool) -> WatchHealth {
        let watch = Watch {
            started: Instant::now(),
            before_lease,
            synced: false,
            failing: None,
        };
        self.lock().watches.insert(kind.into(), watch);
        WatchHealth {
            liveness: self.clone(),
            kind: kind.into(),
        }
    }

    /// Marks the reconcile loop busy until the returned guard is dropped (end of the pass).
    pub fn pass(&self) -> Pass {
        self.lock().reconcile = Reconcile::Busy(Instant::now());
        Pass {
            liveness: self.clone(),
        }
    }

    /// A guard for the reconcile task: dropped without [`LoopGuard::stopped`] (the task panicked, or
    /// returned on its own), it marks the loop ended.
    pub fn reconcile_task(&self) -> LoopGuard {
        LoopGuard {
            liveness: Some(self.clone()),
        }
    }

    /// What the replica looks like now.
    pub fn view(&self) -> View {
        let now = Instant::now();
        let st = self.lock();
        View {
            watches: st
                .watches
                .iter()
                .map(|(kind, w)| WatchView {
                    kind: kind.clone(),
                    synced: w.synced,
                    started: now - w.started,
                    before_lease: w.before_lease,
                    failing: w.failing.as_ref().map(|(first, last, e)| WatchErrors {
                        for_: now - *first,
                        last_ago: now - *last,
                        error: e.clone(),
                    }),
                })
                .collect(),
            reconcile: match st.reconcile {
                Reconcile::Idle => Loop::Idle,
                Reconcile::Busy(since) => Loop::Busy { for_: now - since },
                Reconcile::Ended => Loop::Ended,
            },
        }
    }

    pub fn judge(&self) -> Fitness {
        leadership::fitness(&self.view(), &self.bounds)
    }

    /// `Err(why)` when the replica cannot work: what `/healthz` and `/readyz` answer. Only a dead or
    /// hung loop fails `/healthz` ([`leadership::Unfit::restart_repairs`]); a replica whose watches
    /// cannot reach the API server is not ready but is not restarted.
    pub fn check(&self) -> Result<(), Unable> {
        match self.judge() {
            Fitness::Unfit(why) if why.restart_repairs() => Err(Unable::Restart(why.to_string())),
            Fitness::Unfit(why) => Err(Unable::Wait(why.to_string())),
            Fitness::Starting | Fitness::Working => Ok(()),
        }
    }
}

/// A watch task's reports.
#[derive(Clone, Debug)]
pub struct WatchHealth {
    liveness: Liveness,
    kind: String,
}

impl WatchHealth {
    /// A good event; `listed` when it ends an initial list (the cache is synced).
    pub fn ok(&self, listed: bool) {
        let mut st = self.liveness.lock();
        if let Some(w) = st.watches.get_mut(&self.kind) {
            w.failing = None;
            w.synced |= listed;
        }
    }

    /// A failed list or watch request (the watcher retries it with backoff).
    pub fn failed(&self, e: &watcher::Error) {
        self.error(&watch_problem(e));
    }

    pub fn error(&self, error: &str) {
        let now = Instant::now();
        let gap = self.liveness.bounds.error_gap;
        let mut st = self.liveness.lock();
        if let Some(w) = st.watches.get_mut(&self.kind) {
            // Errors further apart than the gap are separate problems (the watch recovered quietly in
            // between); the run starts again.
            let first = match &w.failing {
                Some((first, last, _)) if now - *last < gap => *first,
                _ => now,
            };
            w.failing = Some((first, now, error.to_string()));
        }
    }
}

/// One line a person can act on: which request failed and the server's answer, without the debug dump
/// of the whole status a watcher error displays.
pub fn watch_problem(e: &watcher::Error) -> String {
    let api = |e: &kube::Error| match e {
        kube::Error::Api(ae) if ae.code == 403 => format!(
            "{} {}: {} (the configurator's ClusterRole needs get, list and watch on it)",
            ae.code, ae.reason, ae.message
        ),
        kube::Error::Api(ae) => format!("{} {}: {}", ae.code, ae.reason, ae.message),
        other => other.to_string(),
    };
    match e {
        watcher::Error::InitialListFailed(e) => format!("list failed: {}", api(e)),
        watcher::Error::WatchStartFailed(e) => format!("watch failed to start: {}", api(e)),
        watcher::Error::WatchFailed(e) => format!("watch failed: {}", api(e)),
        watcher::Error::WatchError(st) => {
            format!("watch error {} {}: {}", st.code, st.reason, st.message)
        }
        watcher::Error::NoResourceVersion => e.to_string(),
    }
}

/// The reconcile loop is in a pass while this lives.
#[must_use]
pub struct Pass {
    liveness: Liveness,
}

impl Drop for Pass {
    fn drop(&mut self) {
        let mut st = self.liveness.lock();
        if let Reconcile::Busy(_) = st.reconcile {
            st.reconcile = Reconcile::Idle;
        }
    }
}

/// Held by the reconcile task; see [`Liveness::reconcile_task`].
#[must_use]
pub struct LoopGuard {
    liveness: Option<Liveness>,
}

impl LoopGuard {
    /// The loop ended because the replica is shutting down: nothing is wrong.
    pub fn stopped(mut self) {
        self.liveness = None;
    }
}

impl Drop for LoopGuard {
    fn drop(&mut self) {
        if let Some(l) = self.liveness.take() {
            l.lock().reconcile = Reconcile::Ended;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use netwave_core::leadership::Unfit;

    use super::*;

    fn liveness() -> Liveness {
        Liveness::new(Bounds {
            sync: Duration::from_secs(10),
            reconcile: Duration::from_secs(30),
            error_gap: Duration::from_secs(5),
        })
    }

    /// The shell's bookkeeping on the paused clock: a watch that never lists turns the replica unfit
    /// after the sync bound; a task that panics marks the loop ended; a clean stop does not.
    #[tokio::test(start_paused = true)]
    async fn the_reports_of_watches_and_loop_turn_into_the_fitness_the_elector_asks() {
        let l = liveness();
        let nodes = l.watch("Node");
        let tables = l.watch("RoutingTable");
        nodes.ok(true);
        tables.error("403 forbidden");
        assert_eq!(l.judge(), Fitness::Starting);
        assert!(l.check().is_ok(), "starting is not a failure");
        for _ in 0..5 {
            tokio::time::advance(Duration::from_secs(2)).await;
            tables.error("403 forbidden");
        }
        let Err(Unable::Wait(why)) = l.check() else {
            panic!("unfit after 10 s without a list, and a restart would not help")
        };
        assert!(
            why.contains("RoutingTable watch failing: 403 forbidden"),
            "{why}"
        );
        tables.ok(true);
        assert_eq!(l.judge(), Fitness::Working);

        // Errors more than the gap apart do not add up to a long failure.
        for _ in 0..4 {
            tokio::time::advance(Duration::from_secs(6)).await;
            tables.error("watch stream reset");
        }
        assert_eq!(l.judge(), Fitness::Working);
        // Errors close together do.
        for _ in 0..6 {
            tokio::time::advance(Duration::from_secs(2)).await;
            tables.error("watch stream reset");
        }
        assert!(matches!(
            l.judge(),
            Fitness::Unfit(Unfit::WatchFailing { .. })
        ));
        assert!(
            matches!(l.check(), Err(Unable::Wait(_))),
            "an API server that keeps failing restarts nothing"
        );
        tables.ok(false);

        let pass = l.pass();
        tokio::time::advance(Duration::from_secs(31)).await;
        assert!(matches!(
            l.judge(),
            Fitness::Unfit(Unfit::ReconcileStalled { .. })
        ));
        assert!(
            matches!(l.check(), Err(Unable::Restart(_))),
            "a hung loop is restarted"
        );
        drop(pass);
        assert_eq!(l.judge(), Fitness::Working);

        l.reconcile_task().stopped();
        assert_eq!(l.judge(), Fitness::Working, "a clean stop is not a death");
        let guard = l.reconcile_task();
        let task = tokio::spawn(async move {
            let _guard = guard;
            panic!("injected");
        });
        assert!(task.await.is_err());
        assert_eq!(l.judge(), Fitness::Unfit(Unfit::ReconcileEnded));
        assert!(matches!(l.check(), Err(Unable::Restart(_))));
    }

    /// A forbidden list reads as one line naming the request, the server's words and what to grant.
    #[test]
    fn a_forbidden_list_is_one_line_saying_what_to_grant() {
        let status = kube::core::Status {
            message: "routingtables.netwave.dev is forbidden: User \"x\" cannot list resource"
                .into(),
            reason: "Forbidden".into(),
            code: 403,
            ..Default::default()
        };
        let e = watcher::Error::InitialListFailed(kube::Error::Api(status.into()));
        assert_eq!(
            watch_problem(&e),
            "list failed: 403 Forbidden: routingtables.netwave.dev is forbidden: User \"x\" cannot \
             list resource (the configurator's ClusterRole needs get, list and watch on it)"
        );
    }
}
