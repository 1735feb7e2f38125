//! Domain newtypes shared by every part of the core. Values are validated at the edge (API → core) and
//! trusted inside.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A point in time, milliseconds since the Unix epoch. Time only ever comes into the core as an argument.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Timestamp(pub i64);

impl Timestamp {
    pub fn from_secs(secs: i64) -> Self {
        Timestamp(secs * 1000)
    }
    pub fn plus_secs(self, secs: u64) -> Self {
        Timestamp(self.0.saturating_add(secs as i64 * 1000))
    }
    /// Whole seconds from `earlier` to `self` (0 if `earlier` is later).
    pub fn secs_since(self, earlier: Timestamp) -> u64 {
        (self.0.saturating_sub(earlier.0).max(0) / 1000) as u64
    }
}

/// Monotonic revision number.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Sequence(pub u64);

impl fmt::Display for Sequence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}
