//! Leader election on a `coordination.k8s.io/v1` Lease, the way client-go's `leaderelection` does it:
//! GET the lease, then create it or `replace` it with its `resourceVersion` as precondition; a 409 means
//! another replica got there first.
//!
//! Why not kube-lease-manager 0.13: its `watch()` channel keeps reporting leadership while renewals fail
//! with API errors (the error path only logs and backs off), so a partitioned leader would keep writing
//! after its lease expired and another replica took over. Here leadership has a local deadline: a leader
//! that has not renewed within `renew_deadline` stops writing at once, before any other replica may take
//! over (`renew_deadline < lease_duration`). Expiry of someone else's lease is judged by when *we* last saw
//! its record change (local monotonic clock), as client-go does, so clock skew between nodes cannot cause
//! two leaders.
//!
//! ```text
//!   follower ──(lease free or expired; replace with rv succeeds)──► leader
//!   leader ──(renew ok every retry_period)──► leader
//!   leader ──(no successful renew for renew_deadline | 409 | holder changed)──► follower
//!   leader ──(cannot work: caches not synced, reconcile loop dead or hung; release)──► follower
//!   leader ──(shutdown: release = clear holder)──► gone
//! ```
//!
//! A replica takes part only while it can do a leader's work ([`Elector::with_fitness`], judged by
//! `netwave_core::leadership`): one that cannot would otherwise renew forever and do nothing, and the
//! standby could never take over (DESIGN §6). Until its caches have synced it takes no Lease; once it
//! cannot work it lets go of the Lease at once and says why in one log line.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use netwave_core::leadership::{Fitness, Unfit};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{error, info, warn};

#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    /// How long a lease stays valid after its last renewal, for other replicas.
    pub lease_duration: Duration,
    /// A leader that could not renew for this long stops acting as leader. Must be < `lease_duration`.
    pub renew_deadline: Duration,
    /// Time between attempts to acquire or renew.
    pub retry_period: Duration,
}

/// What this replica may do right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leadership {
    Follower,
    /// Leader until the given instant unless renewed before it.
    Leader {
        until: Instant,
    },
}

/// A cheap handle to ask "may I write now?".
#[derive(Clone, Debug)]
pub struct LeaderGate {
    rx: watch::Receiver<Leadership>,
}

impl LeaderGate {
    /// True while this replica holds the lease and its last renewal is recent enough.
    pub fn is_leader(&self) -> bool {
        matches!(*self.rx.borrow(), Leadership::Leader { until } if Instant::now() < until)
    }

    /// Waits for the next leadership change and returns whether we lead now; `None` once the elector
    /// has stopped (nothing will change any more).
    pub async fn changed(&mut self) -> Option<bool> {
        self.rx.changed().await.ok()?;
        Some(self.is_leader())
    }

    /// Waits until this replica leads or `deadline` passes; whether it leads then. Wakes only when
    /// the elector says something, not on a timer (a standby waited in 20 ms naps, #28).
    pub async fn leads_by(&mut self, deadline: Instant) -> bool {
        loop {
            self.rx.borrow_and_update();
            if self.is_leader() {
                return true;
            }
            match tokio::time::timeout_at(deadline, self.rx.changed()).await {
                Ok(Ok(())) => {}
                Err(_) => return self.is_leader(),
                // The elector stopped: nothing will change any more.
                Ok(Err(_)) => {
                    tokio::time::sleep_until(deadline).await;
                    return self.is_leader();
                }
            }
        }
    }

    /// A gate that is always leader (single-replica mode and tests).
    pub fn always() -> Self {
        let (_tx, rx) = watch::channel(Leadership::Leader {
            until: Instant::now() + Duration::from_secs(1 << 40),
        });
        // Dropping the sender keeps the last value readable.
        Self { rx }
    }
}

/// Asked before every acquire or renew: can this replica do a leader's work now?
pub type FitnessCheck = Arc<dyn Fn() -> Fitness + Send + Sync>;

/// Called while the holder has gone unrenewed past a leader's renew deadline: a takeover is near.
pub type TakeoverNear = Arc<dyn Fn() + Send + Sync>;

/// Runs the election loop until `shutdown` resolves, then releases the lease if held.
pub struct Elector {
    api: Api<Lease>,
    config: LeaseConfig,
    tx: watch::Sender<Leadership>,
    /// The holder record we saw last and when we first saw it (local clock).
    observed: Option<(String, Option<MicroTime>, Instant)>,
    /// Lease requests failing in a row, and the problem last logged (logged again only when it changes).
    failing: Option<(u32, String)>,
    fitness: Option<FitnessCheck>,
    /// Why this replica cannot work, while it cannot (logged once per problem).
    unfit: Option<Unfit>,
    takeover_near: Option<TakeoverNear>,
}

/// Longest wait between lease attempts while they keep failing as a follower.
const MAX_FAILING_RETRY: Duration = Duration::from_secs(30);

/// One line a person can act on: what failed with the Lease and, where we know it, what to do.
fn lease_problem(e: &kube::Error, namespace: &str, name: &str) -> String {
    match e {
        kube::Error::Api(ae) if ae.code == 404 => format!(
            "namespace {namespace} does not exist, so the Lease {namespace}/{name} cannot be created: \
             create it (kubectl create namespace {namespace}) or set --lease-namespace"
        ),
        kube::Error::Api(ae) if ae.code == 403 => format!(
            "not allowed to use the Lease {namespace}/{name} ({}): the configurator's Role needs get, \
             create and update on leases in {namespace}",
            ae.message
        ),
        kube::Error::Api(ae) => format!("{} {}: {}", ae.code, ae.reason, ae.message),
        other => other.to_string(),
    }
}

impl Elector {
    pub fn new(client: kube::Client, config: LeaseConfig) -> (Self, LeaderGate) {
        assert!(
            config.renew_deadline < config.lease_duration,
            "renew deadline must be below lease duration"
        );
        let (tx, rx) = watch::channel(Leadership::Follower);
        let api = Api::namespaced(client, &config.namespace);
        (
            Self {
                api,
                config,
                tx,
                observed: None,
                failing: None,
                fitness: None,
                unfit: None,
                takeover_near: None,
            },
            LeaderGate { rx },
        )
    }

    /// Takes part in the election only while `check` says the replica can work (without it: always).
    pub fn with_fitness(mut self, check: FitnessCheck) -> Self {
        self.fitness = Some(check);
        self
    }

    /// Calls `near` at each attempt while another holder's record has gone unrenewed for longer than a
    /// leader's renew deadline allows: the Lease's duration less the margin between `lease_duration`
    /// and `renew_deadline` (10 s of 15 by default). A leader renews every retry period, and one that
    /// cannot renew within its deadline stops leading on its own, so a takeover is near: what a new
    /// leader needs first can be fetched while the Lease runs out, instead of after (the node
    /// configs, `crate::watch`). Half the duration was too early: on a kube-apiserver saturated by
    /// a rollout of 5,000 nodes, a healthy leader's renewals came that late.
    pub fn with_takeover_near(mut self, near: TakeoverNear) -> Self {
        self.takeover_near = Some(near);
        self
    }

    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            match self.fitness.as_ref().map_or(Fitness::Working, |f| f()) {
                Fitness::Working => {
                    if let Some(why) = self.unfit.take() {
                        info!(lease = %self.config.name, "able to work again (was: {why}): taking part in leader election");
                    }
                    self.acquire_or_renew().await;
                }
                // Caches still syncing: a leader now would do nothing. Nothing is held yet.
                Fitness::Starting => self.set(Leadership::Follower),
                Fitness::Unfit(why) => self.let_go(why).await,
            }
            // A follower whose requests keep failing backs off (doubling, at most 30 s); a leader keeps
            // its pace so it renews before its deadline.
            let failures = match *self.tx.borrow() {
                Leadership::Leader { .. } => 0,
                Leadership::Follower => self.failing.as_ref().map_or(0, |f| f.0),
            };
            let pause = self
                .config
                .retry_period
                .saturating_mul(1 << failures.min(6))
                .min(MAX_FAILING_RETRY.max(self.config.retry_period));
            let next = Instant::now() + pause;
            let deadline = match *self.tx.borrow() {
                Leadership::Leader { until } => next.min(until),
                Leadership::Follower => next,
            };
            tokio::select! {
                _ = &mut shutdown => break,
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
        // An API server that does not answer must not hold up the shutdown: the standby takes over
        // after expiry anyway.
        let deadline = self.config.renew_deadline;
        if tokio::time::timeout(deadline, self.release())
            .await
            .is_err()
        {
            warn!(lease = %self.config.name, "releasing the lease timed out; standby takes over after expiry");
        }
    }

    /// This replica cannot work: stop leading at once and give the Lease up so a standby takes over
    /// now, not after expiry. One log line per problem, not per retry.
    async fn let_go(&mut self, why: Unfit) {
        let new_problem = !self
            .unfit
            .as_ref()
            .is_some_and(|was| was.same_problem(&why));
        let was_leader = matches!(*self.tx.borrow(), Leadership::Leader { .. });
        self.set(Leadership::Follower);
        if new_problem {
            // Also a Lease this identity still holds from before a restart.
            let released = tokio::time::timeout(self.config.renew_deadline, self.clear_holder())
                .await
                .unwrap_or(false);
            let lease = format!("{}/{}", self.config.namespace, self.config.name);
            if was_leader || released {
                error!(identity = %self.config.identity, "cannot work as leader: {why}; released the Lease {lease} so a standby takes over");
            } else {
                error!(identity = %self.config.identity, "cannot work as leader: {why}; not taking the Lease {lease}");
            }
        }
        self.unfit = Some(why);
    }

    /// One acquire or renew attempt; leadership follows its answer.
    async fn acquire_or_renew(&mut self) {
        let started = Instant::now();
        // A request the server never answers must not hold the loop: give up after the renew deadline.
        let attempt = tokio::time::timeout(
            self.config.renew_deadline,
            self.try_acquire_or_renew(started),
        );
        let result = match attempt.await {
            Ok(r) => r,
            Err(_) => Err(kube::Error::Service("lease request timed out".into())),
        };
        match result {
            Ok(held) => {
                if self.failing.take().is_some() {
                    info!(lease = %self.config.name, "lease requests work again");
                }
                if held {
                    self.set(Leadership::Leader {
                        until: started + self.config.renew_deadline,
                    });
                } else {
                    self.set(Leadership::Follower);
                }
            }
            Err(e) => {
                // Keep what we have: a leader stays leader until its local deadline passes. One line
                // per new problem, not one per retry.
                let problem = lease_problem(&e, &self.config.namespace, &self.config.name);
                let (n, last) = self.failing.get_or_insert((0, String::new()));
                *n += 1;
                if *last != problem {
                    warn!(lease = %self.config.name, "lease acquire/renew failed: {problem}");
                    *last = problem;
                }
                // Copy out first: holding the borrow while sending would deadlock the channel.
                let current = *self.tx.borrow();
                if let Leadership::Leader { until } = current
                    && Instant::now() >= until
                {
                    self.set(Leadership::Follower);
                }
            }
        }
    }

    fn set(&self, new: Leadership) {
        let was_leader = matches!(*self.tx.borrow(), Leadership::Leader { .. });
        let is_leader = matches!(new, Leadership::Leader { .. });
        if was_leader != is_leader {
            info!(identity = %self.config.identity, leader = is_leader, "leadership changed");
        }
        self.tx.send_replace(new);
    }

    async fn try_acquire_or_renew(&mut self, now: Instant) -> Result<bool, kube::Error> {
        let me = &self.config.identity;
        let duration_secs = self.config.lease_duration.as_secs().max(1) as i32;
        let stamp = MicroTime(Timestamp::now());
        let Some(mut lease) = self.api.get_opt(&self.config.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me.clone()),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: Some(stamp.clone()),
                    renew_time: Some(stamp),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(ae)) if ae.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        // Track when the holder record last changed, by our own clock.
        let record = (holder.clone(), spec.renew_time.clone());
        match &self.observed {
            Some((h, r, _)) if (h, r) == (&record.0, &record.1) => {}
            _ => self.observed = Some((record.0, record.1, now)),
        }
        let observed_at = self.observed.as_ref().map(|o| o.2).unwrap_or(now);
        let their_duration =
            Duration::from_secs(spec.lease_duration_seconds.unwrap_or(duration_secs).max(1) as u64);
        let held_by_other = !holder.is_empty() && holder != *me;
        let margin = (self.config.lease_duration).saturating_sub(self.config.renew_deadline);
        if held_by_other
            && now >= observed_at + their_duration.saturating_sub(margin)
            && let Some(near) = &self.takeover_near
        {
            near();
        }
        if held_by_other && now < observed_at + their_duration {
            return Ok(false);
        }
        if holder != *me {
            spec.acquire_time = Some(stamp.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.holder_identity = Some(me.clone());
        spec.lease_duration_seconds = Some(duration_secs);
        spec.renew_time = Some(stamp);
        // `lease` still carries the resourceVersion we read: a concurrent writer makes this a 409.
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(ae)) if ae.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the lease up so a standby takes over at once instead of waiting for expiry.
    async fn release(&mut self) {
        if !matches!(*self.tx.borrow(), Leadership::Leader { .. }) {
            return;
        }
        self.set(Leadership::Follower);
        if self.clear_holder().await {
            info!(lease = %self.config.name, "lease released");
        }
    }

    /// Clears the Lease's holder if it is this replica; true when it did.
    async fn clear_holder(&mut self) -> bool {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.config.name).await else {
            return false;
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return false;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => true,
            Err(e) => {
                warn!(error = %e, "could not release the lease; standby takes over after expiry");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, reason: &str, message: &str) -> kube::Error {
        let status = kube::core::Status {
            message: message.into(),
            reason: reason.into(),
            code,
            ..Default::default()
        };
        kube::Error::Api(status.into())
    }

    #[test]
    fn a_missing_lease_namespace_is_one_line_saying_what_to_do() {
        let e = api_error(404, "NotFound", "namespaces \"netwave-system\" not found");
        assert_eq!(
            lease_problem(&e, "netwave-system", "netwave-configurator"),
            "namespace netwave-system does not exist, so the Lease netwave-system/netwave-configurator \
             cannot be created: create it (kubectl create namespace netwave-system) or set \
             --lease-namespace"
        );
        let e = api_error(403, "Forbidden", "leases is forbidden");
        assert!(
            lease_problem(&e, "ns", "l").contains("needs get, create and update on leases in ns")
        );
    }

    /// A standby waiting out its interval wakes when it becomes the leader, not at the end of the
    /// interval (nor on a timer); a follower told it is still a follower waits on.
    #[tokio::test(start_paused = true)]
    async fn leads_by_returns_when_leadership_comes_and_not_before() {
        let (tx, rx) = watch::channel(Leadership::Follower);
        let mut gate = LeaderGate { rx };
        let start = Instant::now();
        assert!(!gate.leads_by(start + Duration::from_secs(2)).await);
        assert_eq!(start.elapsed(), Duration::from_secs(2));

        let start = Instant::now();
        let elector = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            tx.send_replace(Leadership::Follower);
            tokio::time::sleep(Duration::from_millis(300)).await;
            tx.send_replace(Leadership::Leader {
                until: Instant::now() + Duration::from_secs(3),
            });
            tx
        });
        assert!(gate.leads_by(start + Duration::from_secs(2)).await);
        assert_eq!(start.elapsed(), Duration::from_millis(600));
        drop(elector.await);
    }
}
