//! Leader election against the testbed: never two leaders at once — with replicas stopping, crashing and
//! being partitioned from the API server — and fast handover on a clean shutdown.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::testbed_env;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use netwave_configurator::lease::{Elector, LeaderGate, LeaseConfig};
use netwave_testbed::{ClientIdentity, Partition};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

fn config(identity: &str) -> LeaseConfig {
    LeaseConfig {
        namespace: "netwave-system".into(),
        name: "netwave-configurator".into(),
        identity: identity.into(),
        lease_duration: Duration::from_millis(1500),
        renew_deadline: Duration::from_millis(1000),
        retry_period: Duration::from_millis(200),
    }
}

struct Replica {
    gate: LeaderGate,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

fn replica(tb: &netwave_testbed::Testbed, identity: &str) -> Replica {
    replica_with(tb, config(identity), |e| e)
}

/// [`replica`] with its own lease timings and its elector set up by `f`.
fn replica_with(
    tb: &netwave_testbed::Testbed,
    config: LeaseConfig,
    f: impl FnOnce(Elector) -> Elector,
) -> Replica {
    let client = tb.client_as(ClientIdentity {
        user_agent: Some(format!("replica-{}", config.identity)),
        token: None,
    });
    let (elector, gate) = Elector::new(client, config);
    let elector = f(elector);
    let (stop, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(elector.run(async move {
        let _ = rx.await;
    }));
    Replica {
        gate,
        stop: Some(stop),
        task,
    }
}

/// Samples both gates every few milliseconds for `d`, failing on any instant with two leaders.
async fn watch_exclusion(a: &Replica, b: &Replica, d: Duration) -> (u32, u32) {
    let end = Instant::now() + d;
    let (mut a_led, mut b_led) = (0, 0);
    while Instant::now() < end {
        let (x, y) = (a.gate.is_leader(), b.gate.is_leader());
        assert!(!(x && y), "two leaders at once");
        a_led += u32::from(x);
        b_led += u32::from(y);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (a_led, b_led)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_leader_and_fast_handover_on_release() {
    let env = testbed_env().await;
    let a = replica(env.tb(), "a");
    let b = replica(env.tb(), "b");
    let (a_led, b_led) = watch_exclusion(&a, &b, Duration::from_secs(2)).await;
    assert!(a_led + b_led > 0, "someone leads");
    assert!(
        a_led == 0 || b_led == 0,
        "leadership does not flap between healthy replicas"
    );

    // The leader shuts down cleanly: it releases the lease and the other takes over well before expiry.
    let (mut leader, follower) = if a.gate.is_leader() { (a, b) } else { (b, a) };
    let started = Instant::now();
    let _ = leader.stop.take().unwrap().send(());
    leader.task.await.unwrap();
    // Within 1.2 s of the leader being asked to stop.
    let within = Duration::from_millis(1200).saturating_sub(started.elapsed());
    leads(&follower.gate, "the handover after release", within).await;
    let lease: Lease = Api::namespaced(env.client.clone(), "netwave-system")
        .get("netwave-configurator")
        .await
        .unwrap();
    assert!(lease.spec.unwrap().lease_transitions.unwrap() >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_stops_before_anyone_else_starts() {
    let env = testbed_env().await;
    let a = replica(env.tb(), "a");
    // Let `a` win first.
    leads(&a.gate, "a to lead", Duration::from_secs(3)).await;
    let b = replica(env.tb(), "b");
    watch_exclusion(&a, &b, Duration::from_millis(500)).await;
    // Cut `a` off from the API server: it cannot renew, and must give up on its own clock.
    env.tb()
        .faults()
        .partition(Partition::UserAgent("replica-a".into()));
    let cut = Instant::now();
    let (_, b_led) = watch_exclusion(&a, &b, Duration::from_secs(4)).await;
    assert!(
        !a.gate.is_leader(),
        "the partitioned replica still thinks it leads"
    );
    assert!(b_led > 0, "the healthy replica took over");
    assert!(cut.elapsed() >= Duration::from_secs(4));
    env.tb().faults().heal();
    watch_exclusion(&a, &b, Duration::from_secs(1)).await;
    assert!(b.gate.is_leader(), "healing does not flip leadership back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_leader_is_replaced_within_the_lease_duration() {
    let env = testbed_env().await;
    let a = replica(env.tb(), "a");
    leads(&a.gate, "a to lead", Duration::from_secs(3)).await;
    let b = replica(env.tb(), "b");
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Crash: no release, the lease just stops being renewed.
    a.task.abort();
    let crashed = Instant::now();
    let within = config("b").lease_duration + Duration::from_millis(800);
    leads(&b.gate, "b to take over", within).await;
    assert!(
        crashed.elapsed() >= Duration::from_millis(400),
        "took over before the lease could have expired"
    );
}

/// A standby is told a takeover is near once the leader has not renewed within its renew deadline,
/// early enough to list what it will need before the Lease runs out; never while the leader renews.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_is_told_a_takeover_is_near_while_a_crashed_leaders_lease_runs_out() {
    // A 3 s Lease, a 2 s renew deadline: told 2 s after the last renewal seen, taken over 1 s later.
    // A healthy leader renewing every 200 ms would have to stall for 2 s to tell anyone.
    let timings = |identity: &str| LeaseConfig {
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        ..config(identity)
    };
    let env = testbed_env().await;
    let a = replica_with(env.tb(), timings("a"), |e| e);
    leads(&a.gate, "a to lead", Duration::from_secs(5)).await;
    let told: Arc<Mutex<Option<Instant>>> = Arc::default();
    let b = replica_with(env.tb(), timings("b"), |e| {
        let told = told.clone();
        e.with_takeover_near(Arc::new(move || {
            told.lock().unwrap().get_or_insert_with(Instant::now);
        }))
    });
    // Two lease durations of a leader that renews: nothing is near.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(*told.lock().unwrap(), None, "a healthy leader tells no one");

    a.task.abort();
    let crashed = Instant::now();
    leads(&b.gate, "b to take over", Duration::from_secs(5)).await;
    let led = Instant::now();
    let told = told
        .lock()
        .unwrap()
        .expect("b was told before it took over");
    let (after_crash, before_lead) = (told - crashed, led - told);
    println!("told {after_crash:?} after the crash, {before_lead:?} before leading");
    assert!(
        after_crash >= Duration::from_millis(1500),
        "told only once the leader missed renewals: {after_crash:?} after the crash"
    );
    assert!(
        before_lead >= Duration::from_millis(600),
        "told while the Lease ran out, not as it was taken: {before_lead:?} before leading"
    );
}

/// Waits until `gate` leads: fails the test after `within`, naming `what`.
async fn leads(gate: &LeaderGate, what: &str, within: Duration) {
    netwave_control_plane::poll::until(what, within, async || {
        Ok(gate
            .is_leader()
            .then_some(())
            .ok_or_else(|| "not leading".to_string()))
    })
    .await
    .unwrap();
}
