//! What a node config can need of its agent beyond release 0.1.0, and what an agent says it can apply.
//!
//! The skew contract (DESIGN.md §6, README "Upgrading netwave"): agents of an older release run beside a
//! newer configurator during every upgrade and downgrade. An agent older than a field of `spec.config`
//! would drop it and report `Provisioned` for a config it did not apply, so the configurator never
//! assigns a config to a node whose agent lacks one of the features the config uses: the node waits
//! for its agent (counted in the revision, an Event, a metric).
//!
//! Adding a field to [`NodeConfig`] means one line in [`FEATURES`]: its name, the release that
//! brings it and the field paths it covers. A test compares the NodeNetworkConfig CRD with the fields
//! release 0.1.0 knew (`features/nodeconfig-0.1.0.txt`) and fails on a field no feature covers.
//!
//! Agents from 0.2.0 on declare the features they know (`status.agentFeatures`); an agent that
//! declares none (0.1.0, or one that has not reported yet) has none of them.

use crate::{NodeConfig, NodeNetworkConfigStatus};

/// One thing a node config can need of its agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Feature {
    /// As agents declare it in `status.agentFeatures`.
    pub name: &'static str,
    /// The first release whose agents apply it.
    pub since: &'static str,
    /// Paths in `spec.config` (`rules[].fwmark`: the key `fwmark` in any item of `rules`); a config
    /// that holds any of them needs the feature.
    pub fields: &'static [&'static str],
}

/// Every feature, oldest first. Never reorder or remove one: [`FeatureSet`] numbers them by position.
pub const FEATURES: &[Feature] = &[
    Feature {
        name: "ruleFwmark",
        since: "0.2.0",
        fields: &["rules[].fwmark", "rules[].fwmask"],
    },
    // An older agent would keep its bootstrap underlay and report Provisioned (#47).
    Feature {
        name: "underlay",
        since: "0.2.0",
        fields: &["underlay"],
    },
];

/// A set of [`FEATURES`], by position.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FeatureSet(u64);

impl FeatureSet {
    pub const NONE: FeatureSet = FeatureSet(0);

    /// Every feature this build knows: what its agent declares.
    pub fn all() -> FeatureSet {
        FeatureSet((1u64 << FEATURES.len()) - 1)
    }

    /// The features `config` uses.
    pub fn needed_by(config: &NodeConfig) -> FeatureSet {
        let Ok(value) = serde_json::to_value(config) else {
            return FeatureSet::default();
        };
        Self::matching(|f| f.fields.iter().any(|p| holds(&value, p)))
    }

    /// The features one item of a list in `spec.config` needs: `list` is the list's path (`rules`,
    /// `vrfs[].loopbacks`). Nothing is serialized unless a feature has a field under `list`, so the
    /// renderer asks this of every part it renders once, at no cost for lists no feature touches.
    pub fn needed_by_item<T: serde::Serialize>(list: &str, item: &T) -> FeatureSet {
        let under = |p: &'static str| p.strip_prefix(list).and_then(|r| r.strip_prefix("[]."));
        if !FEATURES
            .iter()
            .any(|f| f.fields.iter().any(|p| under(p).is_some()))
        {
            return FeatureSet::NONE;
        }
        let Ok(value) = serde_json::to_value(item) else {
            return FeatureSet::NONE;
        };
        Self::matching(|f| {
            (f.fields.iter()).any(|p| under(p).is_some_and(|rest| holds(&value, rest)))
        })
    }

    /// The features named (names this build does not know are a newer agent's, and ignored).
    pub fn named<S: AsRef<str>>(names: &[S]) -> FeatureSet {
        Self::matching(|f| names.iter().any(|n| n.as_ref() == f.name))
    }

    /// What the agent whose report `status` is can apply: the features it declares, none when it
    /// declares nothing (an agent before 0.2.0, or one that has not reported).
    pub fn of_agent(status: Option<&NodeNetworkConfigStatus>) -> FeatureSet {
        status
            .and_then(|s| s.agent_features.as_deref())
            .map_or_else(FeatureSet::default, FeatureSet::named)
    }

    fn matching(pred: impl Fn(&Feature) -> bool) -> FeatureSet {
        FeatureSet(
            FEATURES
                .iter()
                .enumerate()
                .filter(|(_, f)| pred(f))
                .fold(0, |bits, (i, _)| bits | 1 << i),
        )
    }

    /// These features without `other`'s.
    pub fn without(self, other: FeatureSet) -> FeatureSet {
        FeatureSet(self.0 & !other.0)
    }

    pub fn union(self, other: FeatureSet) -> FeatureSet {
        FeatureSet(self.0 | other.0)
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn iter(self) -> impl Iterator<Item = &'static Feature> {
        FEATURES
            .iter()
            .enumerate()
            .filter(move |(i, _)| self.0 & 1 << i != 0)
            .map(|(_, f)| f)
    }

    /// The names, as agents declare them.
    pub fn names(self) -> Vec<String> {
        self.iter().map(|f| f.name.to_string()).collect()
    }
}

impl std::fmt::Display for FeatureSet {
    /// `ruleFwmark (since 0.2.0), …`
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, feat) in self.iter().enumerate() {
            let sep = if i > 0 { ", " } else { "" };
            write!(f, "{sep}{} (since {})", feat.name, feat.since)?;
        }
        Ok(())
    }
}

/// `value` holds the field at `path` (`a[].b`: key `b` in any item of the array `a`).
fn holds(value: &serde_json::Value, path: &str) -> bool {
    let Some((head, rest)) = path.split_once('.') else {
        let key = path.trim_end_matches("[]");
        return value.get(key).is_some_and(|v| !v.is_null());
    };
    match head.strip_suffix("[]") {
        Some(key) => value
            .get(key)
            .and_then(|v| v.as_array())
            .is_some_and(|items| items.iter().any(|item| holds(item, rest))),
        None => value.get(head).is_some_and(|v| holds(v, rest)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Field paths under `spec.config` in the NodeNetworkConfig CRD, in the notation of
    /// `features/nodeconfig-0.1.0.txt`.
    fn config_fields() -> BTreeSet<String> {
        fn walk(s: &serde_json::Value, prefix: &str, out: &mut BTreeSet<String>) {
            if s.get("type").and_then(|t| t.as_str()) == Some("array")
                && let Some(items) = s.get("items")
            {
                return walk(items, &format!("{prefix}[]"), out);
            }
            if let Some(props) = s.get("properties").and_then(|p| p.as_object()) {
                for (k, v) in props {
                    let p = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    out.insert(p.clone());
                    walk(v, &p, out);
                }
            }
            if let Some(ap) = s.get("additionalProperties").filter(|a| a.is_object()) {
                walk(ap, &format!("{prefix}{{}}"), out);
            }
        }
        let (_, crd) = crate::crds()
            .into_iter()
            .find(|(file, _)| file == "nodenetworkconfigs.yaml")
            .expect("the NodeNetworkConfig CRD");
        let crd = serde_json::to_value(crd).unwrap();
        let config = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["config"];
        let mut out = BTreeSet::new();
        walk(config, "", &mut out);
        out
    }

    #[test]
    fn every_node_config_field_newer_than_the_first_release_belongs_to_a_feature() {
        let baseline: BTreeSet<&str> = include_str!("features/nodeconfig-0.1.0.txt")
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .collect();
        let covered: BTreeSet<&str> = FEATURES.iter().flat_map(|f| f.fields).copied().collect();
        let fields = config_fields();
        assert!(
            fields.len() > 90,
            "the walk found {} fields: it no longer reads the CRD",
            fields.len()
        );
        let uncovered: Vec<&String> = fields
            .iter()
            .filter(|f| !baseline.contains(f.as_str()))
            // A feature's field covers everything under it (`underlay` covers `underlay.asn`).
            .filter(|f| {
                !covered.iter().any(|c| {
                    f.strip_prefix(c)
                        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
                })
            })
            .collect();
        assert!(
            uncovered.is_empty(),
            "fields of NodeNetworkConfig spec.config that agents of 0.1.0 do not know and no feature \
             in features::FEATURES covers (an older agent would drop them and report Provisioned): \
             {uncovered:?}"
        );
        for f in FEATURES {
            for p in f.fields {
                assert!(
                    fields.contains(*p),
                    "feature {} names {p}, which is not a field of spec.config",
                    f.name
                );
            }
        }
        let names: BTreeSet<&str> = FEATURES.iter().map(|f| f.name).collect();
        assert_eq!(names.len(), FEATURES.len(), "feature names are unique");
        assert!(FEATURES.len() < 64, "FeatureSet holds 63 features");
    }

    #[test]
    fn a_config_needs_the_features_of_the_fields_it_holds() {
        let mut config = NodeConfig::default();
        assert!(FeatureSet::needed_by(&config).is_empty());
        config.rules.push(crate::RuleConfig {
            priority: 100,
            table: 200,
            from: Some("198.18.0.0/24".into()),
            to: None,
            iif: None,
            fwmark: None,
            fwmask: None,
        });
        assert!(FeatureSet::needed_by(&config).is_empty());
        config.rules.push(crate::RuleConfig {
            fwmark: Some(0x10),
            ..config.rules[0].clone()
        });
        let needed = FeatureSet::needed_by(&config);
        assert_eq!(needed.names(), ["ruleFwmark"]);
        assert_eq!(needed.to_string(), "ruleFwmark (since 0.2.0)");

        // An agent before 0.2.0 declares nothing; this build's agent declares everything it knows,
        // and a newer agent's unknown names are ignored.
        assert_eq!(FeatureSet::of_agent(None), FeatureSet::default());
        let old = NodeNetworkConfigStatus {
            agent_version: Some("0.1.0".into()),
            ..Default::default()
        };
        assert_eq!(needed.without(FeatureSet::of_agent(Some(&old))), needed);
        let new = NodeNetworkConfigStatus {
            agent_features: Some(vec!["ruleFwmark".into(), "fromTheFuture".into()]),
            ..Default::default()
        };
        assert!(needed.without(FeatureSet::of_agent(Some(&new))).is_empty());
        assert_eq!(FeatureSet::all().names(), ["ruleFwmark", "underlay"]);
    }
}
