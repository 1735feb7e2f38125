//! Test fixtures for every crate's tests (the `testing` feature, which only dev-dependencies enable):
//! one place that spells a whole `VrfConfig` or `Layer2Config`, so a new field is one edit here instead
//! of one per test.
//!
//! `VrfConfig` has no `Default` on purpose: an empty name, device and table 0 is not a config anyone
//! should be able to ship by writing `..Default::default()`. Tests start from [`VrfConfig::named`] and
//! change what they are about.

use crate::{Layer2Config, VRFRouteConfigurationSpec, VrfConfig};

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

impl Layer2Config {
    /// A bare layer-2 segment as a test starts from: bridge `l2.<vlan>`, VXLAN `vx.<vlan>`, MTU 9000,
    /// no anycast gateway, no VRF, no neighbour suppression, no route target.
    pub fn segment(vlan: u16, vni: u32) -> Layer2Config {
        Layer2Config {
            vlan,
            vni,
            mtu: 9000,
            bridge: format!("l2.{vlan}"),
            vxlan: format!("vx.{vlan}"),
            anycast_mac: None,
            anycast_gateways: vec![],
            vrf: None,
            neigh_suppression: false,
            route_target: None,
        }
    }

    pub fn with_mtu(mut self, mtu: u32) -> Layer2Config {
        self.mtu = mtu;
        self
    }

    /// The anycast gateway: its MAC and addresses.
    pub fn with_anycast(mut self, mac: &str, gateways: &[String]) -> Layer2Config {
        self.anycast_mac = Some(mac.into());
        self.anycast_gateways = gateways.to_vec();
        self
    }

    pub fn with_vrf(mut self, vrf: Option<&str>) -> Layer2Config {
        self.vrf = vrf.map(str::to_string);
        self
    }

    pub fn with_neigh_suppression(mut self, on: bool) -> Layer2Config {
        self.neigh_suppression = on;
        self
    }
}

impl VRFRouteConfigurationSpec {
    /// A VRFRouteConfiguration's spec as a test starts from: VRF `vrf`, `seq` 10, no VNI, route
    /// target, table, prefixes, communities, MTU, selector, source prefixes or loopbacks.
    pub fn named(vrf: &str) -> VRFRouteConfigurationSpec {
        VRFRouteConfigurationSpec {
            vrf: vrf.into(),
            vni: None,
            route_target: None,
            table_id: None,
            import: vec![],
            export: vec![],
            aggregate: vec![],
            seq: 10,
            communities: vec![],
            mtu: None,
            node_selector: None,
            sbr_prefixes: vec![],
            loopbacks: vec![],
        }
    }
}
