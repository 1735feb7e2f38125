//! netwave's functional core: everything that *decides*, as pure, synchronous, deterministic code.
//! Time and randomness come in as arguments; no tokio, no kube client, no netlink, no I/O.
//!
//! ```text
//!  inputs (VRF, L2, RT specs) + nodes ──► revision::  canonical hash, when to create a revision
//!                                    ──► render::    one NodeConfig + configHash per node
//!                                    ──► fleet::     fleet-wide validation (errors block, warnings shown)
//!                                    ──► limits::    folded inputs and node configs fit one etcd object
//!  revisions + nodes + NNCs + now    ──► rollout::   step() -> Plan { assignments, status, events, report }
//!                                        sim::       (feature `sim`) seeded fleet simulator for tests
//!  configurator replica's caches + loop ──► leadership:: may it hold the leader Lease (fitness)
//!  objects that do not decode         ──► undecodable:: what the rollout holds without them
//! ```

pub mod dataplane;
pub mod fleet;
pub mod frr;
pub mod leadership;
pub mod limits;
pub mod render;
pub mod revision;
pub mod rollout;
pub mod selector;
#[cfg(feature = "sim")]
pub mod sim;
pub mod sym;
pub mod types;
pub mod undecodable;

pub use sym::{Interner, Sym};
pub use types::*;
