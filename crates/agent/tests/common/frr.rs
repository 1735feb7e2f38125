//! The agent's view of the shared FRR harness ([`netwave_control_plane::frr`]): a real zebra + bgpd in the
//! calling thread's network namespace, plus the agent settings that point at it. Used by the FRR root
//! tests and the benchmark (`examples/bench.rs` includes this file).

#![allow(dead_code, unused_imports)]

use std::ops::{Deref, DerefMut};

use anyhow::Result;
use netwave_agent::frr::FrrSettings;
pub use netwave_control_plane::frr::{FRR_LIB, FrrInstance, INSTALL, body};
use netwave_core::frr::{NeighborSettings, RemoteAsSetting, UnderlaySettings};

/// The node's VTEP (on `lo`) in every FRR test namespace.
pub const VTEP: &str = "198.18.1.1";

/// zebra + bgpd in the calling thread's network namespace (stopped by pid on drop).
pub struct FrrDaemons(pub FrrInstance);

impl FrrDaemons {
    pub fn start() -> Result<FrrDaemons> {
        Ok(FrrDaemons(FrrInstance::start()?))
    }

    /// Agent settings for this instance: every path in its dir, the [`underlay`] below.
    pub fn settings(&self) -> FrrSettings {
        let mut s = FrrSettings::new(underlay());
        s.config_dir = self.dir().to_path_buf();
        s.vty_socket = Some(self.dir().to_path_buf());
        s.run_dir = Some(self.dir().to_path_buf());
        s
    }
}

impl Deref for FrrDaemons {
    type Target = FrrInstance;
    fn deref(&self) -> &FrrInstance {
        &self.0
    }
}

impl DerefMut for FrrDaemons {
    fn deref_mut(&mut self) -> &mut FrrInstance {
        &mut self.0
    }
}

/// iBGP to one (absent) route reflector: the session never comes up, which the tests do not need.
pub fn underlay() -> UnderlaySettings {
    UnderlaySettings {
        asn: 65000,
        vtep_address: VTEP.into(),
        router_id: None,
        neighbors: vec![NeighborSettings {
            address: Some("198.18.0.254".into()),
            interface: None,
            remote_as: RemoteAsSetting::Keyword("internal".into()),
        }],
        timers: None,
    }
}
