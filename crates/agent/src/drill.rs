//! A deliberate rendering change, to play an agent release whose rendering differs (`crate::upgrade`'s
//! tests, and an admin's drill on a spare node). The flag that sets it (`--rendering-drill`) exists
//! only in builds with the `rendering-drill` feature.

use netwave_api::{NodeConfig, RouteConfig, RouteType};

/// A deliberate change to every rendering of this agent: one extra route, so a test (or an admin's
/// drill on a spare node) can play a new agent release whose rendering differs. `blackhole:PREFIX`
/// (main table): harmful when PREFIX covers a probe target, benign otherwise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Drill {
    route: RouteConfig,
}

impl Drill {
    /// `blackhole:PREFIX`, PREFIX an IPv4 or IPv6 prefix.
    pub fn parse(s: &str) -> Result<Drill, String> {
        let prefix = s
            .strip_prefix("blackhole:")
            .ok_or_else(|| format!("rendering drill {s:?}: expected blackhole:PREFIX"))?;
        prefix
            .parse::<ipnet::IpNet>()
            .map_err(|e| format!("rendering drill {s:?}: {prefix:?} is no prefix: {e}"))?;
        Ok(Drill {
            route: RouteConfig {
                table: 254,
                prefix: prefix.to_string(),
                via: None,
                dev: None,
                kind: RouteType::Blackhole,
                metric: None,
            },
        })
    }

    /// `cfg` as this drill renders it.
    pub fn apply(&self, cfg: &NodeConfig) -> NodeConfig {
        let mut cfg = cfg.clone();
        cfg.routes.push(self.route.clone());
        cfg
    }
}

#[cfg(test)]
mod tests {
    use netwave_api::{NodeConfig, RouteType};

    use crate::drill::Drill;

    #[test]
    fn a_drill_is_one_blackhole_route_in_the_main_table() {
        let d = Drill::parse("blackhole:198.18.8.2/32").expect("parses");
        let cfg = d.apply(&NodeConfig::default());
        assert_eq!(cfg.routes.len(), 1);
        assert_eq!(
            (cfg.routes[0].table, cfg.routes[0].prefix.as_str()),
            (254, "198.18.8.2/32")
        );
        assert_eq!(cfg.routes[0].kind, RouteType::Blackhole);
        for bad in ["198.18.8.2/32", "blackhole:nope", "mtu:9000"] {
            assert!(Drill::parse(bad).is_err(), "{bad}");
        }
    }
}
