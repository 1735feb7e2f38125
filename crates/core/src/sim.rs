//! A seeded fleet simulator for the rollout state machine (test support; feature `sim`).
//!
//! ```text
//!   Fleet (seeded ChaCha8, virtual clock)
//!   ├── Store: revisions, nodes, NNCs — the only state that survives a leader
//!   ├── agents: succeed / fail (Invalid) / hang / crash+restart, per node, from their NNC spec
//!   ├── world: nodes flap Ready, get cordoned, join, leave; admins create revisions (some removing
//!   │   most of what the nodes run), reactivate older ones, pause, retry, approve holds
//!   └── leader: input = Store → step(input, now) → apply writes one at a time; may be killed
//!       between any two writes or skip a step; invariants are checked after every write
//!
//!   das_schiff: das-schiff-network-operator's rollout rules on a virtual clock (the fleet
//!   benchmark's baseline; no rollout::step)
//! ```
//!
//! The leader keeps nothing between steps, so "killing" it is dropping the rest of its plan: the next
//! leader rebuilds its input from the store alone. Identical seeds give identical histories.

pub mod das_schiff;
mod fleet;
mod store;

pub use fleet::{Faults, Fleet, Outcome, SimConfig, Violation, ZONE_LABEL, run_seed};
pub use store::{Store, StoreError};
