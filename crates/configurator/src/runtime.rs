//! Wiring: client, leader election, watches, reconcile loop, HTTP endpoints, signals.

use std::sync::Arc;

use anyhow::Context;
use kube::Client;
use kube::runtime::events::{Recorder, Reporter};
use netwave_core::fleet::FleetParams;
use netwave_core::leadership::Bounds;
use netwave_core::rollout::PolicyDefaults;
use netwave_runtime::{self as http, Readiness};
use tokio::sync::watch as channel;
use tracing::info;

use crate::args::Args;
use crate::lease::{Elector, LeaderGate, LeaseConfig};
use crate::liveness::Liveness;
use crate::metrics::Metrics;
use crate::reconcile::{Reconciler, Settings};
use crate::watch::{self as watches, Stores};
use crate::writer::Writer;

pub use netwave_runtime::{init_tracing, shutdown_signal};

pub fn settings(args: &Args) -> Settings {
    Settings {
        defaults: PolicyDefaults {
            max_unavailable: args.max_unavailable,
            max_failures: args.max_failures,
            apply_timeout_seconds: args.apply_timeout.as_secs() as u32,
            pickup_timeout_seconds: args.pickup_timeout.map(|d| d.as_secs() as u32),
            progress_deadline_seconds: args.progress_deadline.as_secs() as u32,
            revision_history_limit: args.revision_history_limit as usize,
            destructive_threshold: args.destructive_threshold,
            quarantine_after: args.quarantine_after,
        },
        fleet: FleetParams {
            underlay_mtu: args.underlay_mtu,
            max_object_bytes: args.max_object_bytes,
            ..FleetParams::default()
        },
        resync: args.resync_interval,
        input_settle: args.input_settle,
        coalesce: args.coalesce_window,
        reaction_target: args.reaction_target,
        naming: args.revision_names.into(),
    }
}

/// Errors of one watch further apart than this are separate problems: kube's default watch backoff
/// retries at most 30 s apart (plus jitter), so a watch that keeps failing reports well within it.
const WATCH_ERROR_GAP: std::time::Duration = std::time::Duration::from_secs(90);

/// How long this replica may be unable to work before it lets go of the Lease.
pub fn bounds(args: &Args) -> Bounds {
    Bounds {
        sync: args.cache_sync_timeout,
        reconcile: args.reconcile_timeout,
        error_gap: WATCH_ERROR_GAP,
    }
}

fn metrics_router(metrics: &Arc<Metrics>) -> axum::Router {
    let metrics = metrics.clone();
    http::metrics_router(move || metrics.encode())
}

/// Runs the configurator until SIGTERM/SIGINT: on shutdown the reconcile in progress finishes its
/// writes, then the lease is released so a standby takes over at once.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let client = netwave_runtime::client(args.kubeconfig.as_deref()).await?;
    run_with(args, client, shutdown_signal()).await
}

/// [`run`] with a given client and shutdown trigger (tests run configurators in-process this way).
pub async fn run_with(
    args: Args,
    client: Client,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::default());
    let ready = Readiness::default();
    // Fed by the watches and the reconcile loop; asked by the elector and the health endpoints.
    let liveness = Liveness::new(bounds(&args));
    let (metrics_addr, health_addr) = serve(&args, &metrics, &ready, &liveness).await?;
    let identity = args.identity();
    info!(%identity, %metrics_addr, %health_addr, "netwave-configurator starting");

    let (stop_tx, stop_rx) = channel::channel(false);
    let stopped = |mut rx: channel::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let changed = Arc::new(watches::Wakeups::default());
    let stores = watches::start(&client, changed.clone(), &liveness);
    let (elector, gate) = elector(&args, &client, identity.clone(), &liveness, &stores);
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "netwave-configurator".into(),
            instance: Some(identity),
        },
    );
    let writer = Writer::new(client, gate.clone(), recorder);
    let reconciler = Reconciler::new(
        stores.clone(),
        writer,
        metrics.clone(),
        settings(&args),
        changed.clone(),
    )
    .with_liveness(liveness.clone());

    wake_on_leadership(gate.clone(), changed.clone(), &stores);
    let elector_task = tokio::spawn(elector.run(stopped(stop_rx.clone())));
    let ready_task = {
        let stores = stores.clone();
        tokio::spawn(async move {
            if stores.wait_until_ready().await {
                ready.set_ready();
                info!("caches synced");
            }
        })
    };
    let reconcile_task = {
        let stop = stop_rx.clone();
        let stopping = stop_rx.clone();
        // Dropped without `stopped` (the task panicked or returned by itself), it tells the elector the
        // loop is dead: the replica lets go of the Lease.
        let guard = liveness.reconcile_task();
        let run = reconciler.run(stopped(stop_rx));
        #[cfg(feature = "fault-hooks")]
        let run = with_fault(args.fault_reconcile, gate.clone(), run);
        tokio::spawn(async move {
            // A shutdown before the caches ever synced (API server unreachable) ends here at once.
            tokio::select! {
                _ = ready_task => run.await,
                _ = stopped(stop) => {}
            }
            if *stopping.borrow() {
                guard.stopped();
            }
        })
    };

    shutdown.await;
    info!("shutting down: finishing the current reconcile, then releasing the lease");
    let _ = stop_tx.send(true);
    let _ = reconcile_task.await;
    let _ = elector_task.await;
    Ok(())
}

/// The metrics and health endpoints, bound (their addresses, for the start-up line).
async fn serve(
    args: &Args,
    metrics: &Arc<Metrics>,
    ready: &Readiness,
    liveness: &Liveness,
) -> anyhow::Result<(std::net::SocketAddr, std::net::SocketAddr)> {
    let metrics_addr = http::serve(args.metrics_addr, metrics_router(metrics))
        .await
        .with_context(|| format!("binding --metrics-addr {}", args.metrics_addr))?;
    let alive = {
        let l = liveness.clone();
        move || l.check()
    };
    let health_addr = http::serve(
        args.health_addr,
        http::health_router_checked(ready.clone(), alive),
    )
    .await
    .with_context(|| format!("binding --health-addr {}", args.health_addr))?;
    Ok((metrics_addr, health_addr))
}

/// The Lease elector, judged by `liveness` (a replica that cannot work lets go), listing the node
/// configs while a faltering leader's Lease runs out, not after.
fn elector(
    args: &Args,
    client: &Client,
    identity: String,
    liveness: &Liveness,
    stores: &Stores,
) -> (Elector, LeaderGate) {
    let (elector, gate) = Elector::new(
        client.clone(),
        LeaseConfig {
            namespace: args.lease_namespace.clone(),
            name: args.lease_name.clone(),
            identity,
            lease_duration: args.lease_duration,
            renew_deadline: args.renew_deadline,
            retry_period: args.retry_period,
        },
    );
    let elector = elector.with_fitness({
        let l = liveness.clone();
        Arc::new(move || l.judge())
    });
    let elector = elector.with_takeover_near({
        let node_configs = stores.node_configs_watch.clone();
        Arc::new(move || {
            if node_configs.start() {
                info!("the leader has not renewed the Lease within its renew deadline: listing the node configs for a takeover");
            }
        })
    });
    (elector, gate)
}

/// Leadership changes wake the reconcile loop: a new leader acts at once, once it has listed the
/// node configs (a standby does not watch them, `watch`).
fn wake_on_leadership(gate: LeaderGate, changed: Arc<watches::Wakeups>, stores: &Stores) {
    let mut leadership = gate;
    let wake = changed;
    let node_configs = stores.node_configs_watch.clone();
    tokio::spawn(async move {
        // Ends with the elector (a stopped elector's channel is closed: looping on it would spin).
        while let Some(leads) = leadership.changed().await {
            if leads && node_configs.start() {
                info!("leading: listing the node configs");
            }
            wake.wake();
        }
    });
}

/// `--fault-reconcile` (feature `fault-hooks`, tests only): once this replica leads, the reconcile task
/// dies the given way instead of reconciling.
#[cfg(feature = "fault-hooks")]
async fn with_fault(
    fault: Option<crate::args::ReconcileFault>,
    mut gate: crate::lease::LeaderGate,
    run: impl std::future::Future<Output = ()>,
) {
    use crate::args::ReconcileFault;
    let Some(fault) = fault else {
        return run.await;
    };
    let leads = async move {
        while !gate.is_leader() {
            if gate.changed().await.is_none() {
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = run => {}
        _ = leads => match fault {
            ReconcileFault::Panic => panic!("injected fault (--fault-reconcile panic): the reconcile task panics"),
            ReconcileFault::Return => tracing::warn!("injected fault (--fault-reconcile return): the reconcile task returns"),
        },
    }
}
