//! The configurator's wall clock: the one place a decision's `now` comes from. The core takes time as
//! an argument; the loop reads it here once per reconcile, and the writer stamps a spec write it sends
//! without an assignment time.

use std::time::{SystemTime, UNIX_EPOCH};

use netwave_core::Timestamp;

/// Now, in milliseconds since the epoch.
pub fn now() -> Timestamp {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp(d.as_millis() as i64)
}
