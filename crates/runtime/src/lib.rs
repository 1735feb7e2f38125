//! Plumbing shared by `netwave-configurator` and `netwave-agent` (shells only; nothing here decides):
//! log setup, the Kubernetes client, shutdown signals, the `/metrics`, `/healthz`, `/readyz` endpoints,
//! and watches that one undecodable object does not break ([`decoded`]).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use kube::Client;
use kube::config::{Config, KubeConfigOptions, Kubeconfig};

pub mod apply;
pub mod deadline;
pub mod decoded;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Json,
    Text,
}

/// Structured logs to stderr; `RUST_LOG` overrides the default `info` filter.
pub fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// Kubeconfig from the flag, else in-cluster, else `$KUBECONFIG` / `~/.kube/config`.
pub async fn client(kubeconfig: Option<&Path>) -> anyhow::Result<Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?
        }
        None => match Config::incluster() {
            Ok(c) => c,
            Err(_) => Config::infer()
                .await
                .context("no in-cluster config and no usable kubeconfig")?,
        },
    };
    client_with_deadline(config, deadline::API_READ_IDLE)
}

/// A client for `config` whose requests, watches excepted, fail once the API server sent nothing for
/// `idle` ([`deadline`]).
pub fn client_with_deadline(config: Config, idle: std::time::Duration) -> anyhow::Result<Client> {
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&deadline::ReadDeadline::new(idle))
        .build())
}

/// The watcher config of every netwave watch: a relist (at start, after a watch expired) is a quorum
/// read (`ListSemantic::MostRecent`), never one served from an API server's cache with
/// `resourceVersion=0`, which may be older than what the watch has already shown: a relist never goes
/// back in time and brings back a deleted object (#48). kube-runtime 5's default, held here so a change
/// of that default cannot change ours.
pub fn watch_config() -> kube::runtime::watcher::Config {
    kube::runtime::watcher::Config::default()
        .list_semantic(kube::runtime::watcher::ListSemantic::MostRecent)
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// Set once the process is ready to serve (caches synced, start-up recovery done), unless something
/// holds it back ([`Readiness::block`]: `/readyz` then answers 503 with the reasons).
#[derive(Clone, Default)]
pub struct Readiness(
    Arc<AtomicBool>,
    Arc<std::sync::Mutex<std::collections::BTreeMap<&'static str, String>>>,
);

impl Readiness {
    pub fn set_ready(&self) {
        self.0.store(true, Ordering::Release);
    }
    /// Ready, and nothing blocks it.
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire) && self.blocked().is_none()
    }
    fn blocks(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<&'static str, String>> {
        self.1.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// Not ready whatever else is, for `why` (said by `/readyz`), until [`Readiness::unblock`] of the
    /// same `cause`; each cause blocks on its own.
    pub fn block(&self, cause: &'static str, why: String) {
        self.blocks().insert(cause, why);
    }
    pub fn unblock(&self, cause: &'static str) {
        self.blocks().remove(cause);
    }
    /// What `cause` blocks readiness for, if it does.
    pub fn blocked_by(&self, cause: &'static str) -> Option<String> {
        self.blocks().get(cause).cloned()
    }
    /// Every reason readiness is blocked for, joined, if any.
    pub fn blocked(&self) -> Option<String> {
        let blocks = self.blocks();
        (!blocks.is_empty()).then(|| blocks.values().cloned().collect::<Vec<_>>().join("; "))
    }
}

/// `/metrics`, answered with whatever `encode` returns (a registry's text exposition).
pub fn metrics_router(encode: impl Fn() -> String + Clone + Send + Sync + 'static) -> Router {
    Router::new().route("/metrics", get(move || async move { encode() }))
}

/// `/healthz` (process alive) and `/readyz` (503 until `ready` is set).
pub fn health_router(ready: Readiness) -> Router {
    health_router_checked(ready, || Ok(()))
}

/// Why a process cannot work, as its health endpoints tell it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unable {
    /// Something inside the process is dead or hung; a restart repairs it: `/healthz` and `/readyz`
    /// answer 503 with the reason (Kubernetes restarts it).
    Restart(String),
    /// It waits on something outside (the API server, the network, its RBAC); a restart would not
    /// help: only `/readyz` answers 503 with the reason, `/healthz` stays 200.
    Wait(String),
}

/// [`health_router`] for a process that can be alive but unable to work: while `check` answers
/// `Err(why)`, `/readyz` answers 503 with the reason, and `/healthz` too for [`Unable::Restart`].
pub fn health_router_checked(
    ready: Readiness,
    check: impl Fn() -> Result<(), Unable> + Clone + Send + Sync + 'static,
) -> Router {
    let healthz = {
        let check = check.clone();
        move || async move {
            match check() {
                Err(Unable::Restart(why)) => (StatusCode::SERVICE_UNAVAILABLE, why),
                Ok(()) | Err(Unable::Wait(_)) => (StatusCode::OK, "ok".to_string()),
            }
        }
    };
    let readyz = move |State(r): State<Readiness>| async move {
        match check() {
            Err(Unable::Restart(why) | Unable::Wait(why)) => (StatusCode::SERVICE_UNAVAILABLE, why),
            Ok(()) if r.is_ready() => (StatusCode::OK, "ok".to_string()),
            Ok(()) => (
                StatusCode::SERVICE_UNAVAILABLE,
                r.blocked().unwrap_or_else(|| "not ready".to_string()),
            ),
        }
    };
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(ready)
}

/// Binds `addr` now (so a bad address fails at start) and serves `router` in the background.
pub async fn serve(addr: SocketAddr, router: Router) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::error!(error = %e, %local, "http server stopped");
        }
    });
    Ok(local)
}
