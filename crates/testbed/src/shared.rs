//! The state every request handler and watch shares: the store behind its lock, the wake-up of watches,
//! faults and counters. Its own module so the server and the watches both use it and neither uses the
//! other back.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::faults::{Counters, Faults};
use crate::store::Store;

/// Everything the request handlers share.
#[derive(Debug)]
pub struct Shared {
    store: Mutex<Store>,
    /// Latest resourceVersion, bumped after every write so watches wake up.
    pub notify: tokio::sync::watch::Sender<u64>,
    pub faults: Faults,
    pub counters: Counters,
    pub bookmark_interval: Duration,
    pub gc: std::sync::atomic::AtomicBool,
    pub server_address: String,
}

impl Shared {
    pub fn new(
        store: Store,
        bookmark_interval: Duration,
        gc: bool,
        server_address: String,
    ) -> Self {
        let rv = store.resource_version();
        Shared {
            store: Mutex::new(store),
            notify: tokio::sync::watch::Sender::new(rv),
            faults: Faults::default(),
            counters: Counters::default(),
            bookmark_interval,
            gc: std::sync::atomic::AtomicBool::new(gc),
            server_address,
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs a write under the lock and wakes watches.
    pub fn write<T>(&self, f: impl FnOnce(&mut Store) -> T) -> T {
        let mut st = self.lock();
        let out = f(&mut st);
        let rv = st.resource_version();
        drop(st);
        self.notify.send_if_modified(|v| {
            if *v != rv {
                *v = rv;
                true
            } else {
                false
            }
        });
        out
    }
}
