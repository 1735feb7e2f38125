//! netwave-configurator: the leader-elected imperative shell around `netwave-core`.
//!
//! ```text
//!  watch (reflectors, one per input kind  ─► snapshot ─► decide::compute ─────► writer ─► API
//!   from netwave_api::kinds, Nodes,            │        (pure: memory, the     (sends what the plan
//!   revisions, node configs once leading)      │         cut, core's step,      says; leader only)
//!                                              │         intents, events)
//!  reconcile: the loop ─ when to run, rechecks on a fresh read (recheck), record (metrics), Events
//!  Lease ◄──── lease::Elector (client-go style; local renew deadline gates every write)
//!                 ▲ renews only while liveness (watches synced, reconcile loop alive) says it can work
//! ```
//!
//! Where things live: `reconcile` is the loop and nothing else; `decide` is what one reconcile
//! decides (synchronous, deterministic from the snapshot, `memory` and `now`); `memory` is everything
//! kept between reconciles; `events` is every Event the configurator writes; `record` is what plans
//! tell Prometheus; `writer` sends intents; `snapshot` is what a reconcile reads; `clock` is the only
//! wall clock.

pub mod args;
pub mod assign_log;
pub mod clock;
pub mod decide;
pub mod events;
pub mod integrity;
pub mod lease;
pub mod liveness;
pub mod memory;
pub mod metrics;
mod moves;
pub mod observed;
pub mod pace;
pub mod recheck;
pub mod reconcile;
pub mod record;
pub mod runtime;
pub mod snapshot;
#[cfg(feature = "testing")]
pub mod testing;
pub mod watch;
pub mod wire;
pub mod writer;
