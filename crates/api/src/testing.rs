//! Test fixtures for every crate's tests (the `testing` feature, which only dev-dependencies enable):
//! one place that spells a whole `VrfConfig`, so a new field is one edit here instead of one per test.
//!
//! `VrfConfig` has no `Default` on purpose: an empty name, device and table 0 is not a config anyone
//! should be able to ship by writing `..Default::default()`. Tests start from [`VrfConfig::named`] and
//! change what they are about.

use crate::VrfConfig;

impl VrfConfig {
    /// A plain VRF as a test starts from: `name` on device `vr.<name>`, table 100, MTU 9000, no VNI,
    /// no BGP content, no source-based routing, no loopbacks.
    pub fn named(name: &str) -> VrfConfig {
        VrfConfig {
            name: name.into(),
            device: format!("vr.{name}"),
            table: 100,
            vni: None,
            mtu: 9000,
            bridge: None,
            vxlan: None,
            route_target: None,
            import: vec![],
            export: vec![],
            aggregate: vec![],
            communities: vec![],
            sbr: None,
            loopbacks: vec![],
        }
    }

    pub fn with_device(mut self, device: &str) -> VrfConfig {
        self.device = device.into();
        self
    }

    pub fn with_table(mut self, table: u32) -> VrfConfig {
        self.table = table;
        self
    }

    pub fn with_mtu(mut self, mtu: u32) -> VrfConfig {
        self.mtu = mtu;
        self
    }

    /// The layer-3 VNI alone (no bridge or VXLAN device).
    pub fn with_vni(mut self, vni: u32) -> VrfConfig {
        self.vni = Some(vni);
        self
    }

    /// The layer-3 VNI with its devices as the agent tests name them: bridge `br.<name>`, VXLAN
    /// `vx.<name>`.
    pub fn with_l3_vni(self, vni: u32) -> VrfConfig {
        let bridge = format!("br.{}", self.name);
        let vxlan = format!("vx.{}", self.name);
        VrfConfig {
            bridge: Some(bridge),
            vxlan: Some(vxlan),
            ..self.with_vni(vni)
        }
    }

    pub fn with_route_target(mut self, rt: &str) -> VrfConfig {
        self.route_target = Some(rt.into());
        self
    }
}
