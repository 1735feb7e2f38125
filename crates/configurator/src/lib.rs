//! netwave-configurator: the leader-elected imperative shell around `netwave-core`.
//!
//! ```text
//!  watches (reflectors)                 reconcile (with node configs)               writes (leader only)
//!  VRF / L2 / RoutingTable ─┐
//!  Nodes                    ├─► stores ─► snapshot ─► core::render/validate/step ─► Plan ─► writer ─► API
//!  NodeNetworkConfigs       │   (watched once the replica leads: a standby reads no agent report)
//!  NetworkConfigRevisions  ─┘
//!  Lease ◄──── lease::Elector (client-go style; local renew deadline gates every write)
//!                 ▲ renews only while liveness (watches synced, reconcile loop alive) says it can work
//! ```

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
