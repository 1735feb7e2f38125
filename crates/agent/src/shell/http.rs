//! `/metrics`, `/healthz` (process alive) and `/readyz` (start-up recovery done and own NNC listed).

use std::sync::Arc;

use axum::Router;
pub use netwave_runtime::{Readiness, serve};

use super::metrics::Metrics;

/// The metrics router and the health router.
pub fn router(metrics: Arc<Metrics>, ready: Readiness) -> (Router, Router) {
    let m = netwave_runtime::metrics_router(move || metrics.encode());
    (m, netwave_runtime::health_router(ready))
}
