//! Rollout knobs: a revision's `spec.rollout` merged over the configurator's defaults, checked once.
//!
//! A knob that makes no sense (`maxUnavailable: "abc"`, `0`, `maxUnavailablePerDomain` without a
//! `topologyKey`, a canary selector with an unknown operator) is a [`PolicyError`] naming the field. The
//! step then halts that revision's rollout (`WaitingOn::InvalidPolicy`, condition `Progressing=False`,
//! reason `InvalidPolicy`) and uses the defaults for everything else (timeouts, budget for rollbacks), so
//! a typo never speeds a rollout up and never stops a rollback.

use netwave_api::RolloutPolicy;
use thiserror::Error;

use crate::selector::Selector;

/// How many nodes may be in flight at once: a count, or a share of a node set (the API's one parser,
/// [`CountOrPercent`](netwave_api::CountOrPercent)).
pub type Budget = netwave_api::CountOrPercent;

/// A `maxUnavailable`-style value that is neither a positive count nor a percentage.
pub type BudgetError = netwave_api::CountOrPercentError;

/// What the configurator uses where a revision's `spec.rollout` says nothing (its command-line flags).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyDefaults {
    pub max_unavailable: Budget,
    pub max_failures: u32,
    pub apply_timeout_seconds: u32,
    /// `--pickup-timeout`: default of `spec.rollout.pickupTimeoutSeconds`; `None`: the revision's
    /// apply timeout.
    pub pickup_timeout_seconds: Option<u32>,
    pub progress_deadline_seconds: u32,
    /// Revisions kept; older ones are deleted unless a node still references them.
    pub revision_history_limit: usize,
    /// `--destructive-threshold`: a target that takes more than this percentage of the last good
    /// revision's placements off the nodes (and always one that takes all of them) is held
    /// ([`super::hold`]).
    pub destructive_threshold: u32,
    /// `--quarantine-after`: default of `spec.rollout.quarantine.afterConsecutiveFailures`; `None`
    /// (the default) leaves quarantine off ([`super::quarantine`]).
    pub quarantine_after: Option<u32>,
}

impl Default for PolicyDefaults {
    fn default() -> Self {
        PolicyDefaults {
            max_unavailable: Budget::Count(1),
            max_failures: 1,
            apply_timeout_seconds: 300,
            pickup_timeout_seconds: None,
            progress_deadline_seconds: 600,
            revision_history_limit: 10,
            destructive_threshold: super::hold::DEFAULT_DESTRUCTIVE_THRESHOLD,
            quarantine_after: None,
        }
    }
}

/// A revision's effective rollout policy.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    pub max_unavailable: Budget,
    pub max_failures: u32,
    /// Counted from the agent's start of this attempt ([`super::deadline`]).
    pub apply_timeout_seconds: u32,
    /// Counted from the assignment: the agent must have started by then ([`super::deadline`]).
    pub pickup_timeout_seconds: u32,
    pub progress_deadline_seconds: u32,
    pub canary: Option<CanaryPolicy>,
    /// Node label naming a failure domain; nodes without it form the domain `""`.
    pub topology_key: Option<String>,
    /// Only set together with `topology_key`.
    pub max_unavailable_per_domain: Option<Budget>,
    /// Consecutive failures of revisions other nodes provisioned that quarantine a node; `None`: off
    /// ([`super::quarantine`]).
    pub quarantine_after: Option<u32>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct CanaryPolicy {
    pub nodes: CanaryNodes,
    pub bake_seconds: u32,
}

/// Which nodes are canaries.
#[derive(Clone, Debug, PartialEq)]
pub enum CanaryNodes {
    /// The first N eligible nodes in rollout order (`canary.count`; 1 when only `bakeSeconds` is given).
    Count(u32),
    /// Eligible nodes matching `canary.selector`.
    Selector(Selector),
}

/// A `spec.rollout` field the step cannot use.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum PolicyError {
    #[error("spec.rollout.{field}: {source}")]
    Budget {
        field: &'static str,
        #[source]
        source: BudgetError,
    },
    #[error("spec.rollout.{field}: must be at least 1")]
    Zero { field: &'static str },
    #[error("spec.rollout.maxUnavailablePerDomain needs spec.rollout.topologyKey")]
    PerDomainWithoutTopologyKey,
    #[error("spec.rollout.topologyKey: must not be empty")]
    EmptyTopologyKey,
    #[error("spec.rollout.canary.selector.{0}")]
    CanarySelector(String),
}

impl PolicyDefaults {
    /// The policy every field of which comes from the defaults.
    pub fn policy(&self) -> Policy {
        Policy {
            max_unavailable: self.max_unavailable,
            max_failures: self.max_failures.max(1),
            apply_timeout_seconds: self.apply_timeout_seconds.max(1),
            pickup_timeout_seconds: self
                .pickup_timeout_seconds
                .unwrap_or(self.apply_timeout_seconds)
                .max(1),
            progress_deadline_seconds: self.progress_deadline_seconds.max(1),
            canary: None,
            topology_key: None,
            max_unavailable_per_domain: None,
            quarantine_after: self.quarantine_after.filter(|&n| n > 0),
        }
    }
}

impl Policy {
    /// The apply and pickup timeouts ([`super::deadline`]).
    pub fn timeouts(&self) -> Timeouts {
        Timeouts {
            apply: self.apply_timeout_seconds,
            pickup: self.pickup_timeout_seconds,
        }
    }
}

/// Merges `spec.rollout` over the defaults. Invalid fields fall back to the defaults (or to "off" for
/// canary and topology) and are returned as errors; a caller must not roll out a revision whose policy
/// has errors.
pub fn resolve(spec: &RolloutPolicy, defaults: &PolicyDefaults) -> (Policy, Vec<PolicyError>) {
    let mut errors = Vec::new();
    let mut policy = defaults.policy();

    if let Some(v) = &spec.max_unavailable {
        match Budget::from_api(v) {
            Ok(b) => policy.max_unavailable = b,
            Err(source) => errors.push(PolicyError::Budget {
                field: "maxUnavailable",
                source,
            }),
        }
    }
    for (field, value, slot) in [
        (
            "maxFailures",
            spec.max_failures,
            &mut policy.max_failures as &mut u32,
        ),
        (
            "applyTimeoutSeconds",
            spec.apply_timeout_seconds,
            &mut policy.apply_timeout_seconds,
        ),
        (
            "progressDeadlineSeconds",
            spec.progress_deadline_seconds,
            &mut policy.progress_deadline_seconds,
        ),
    ] {
        match value {
            Some(0) => errors.push(PolicyError::Zero { field }),
            Some(n) => *slot = n,
            None => {}
        }
    }
    // The pickup deadline follows the apply timeout unless set on its own (here or by the default).
    match spec.pickup_timeout_seconds {
        Some(0) => errors.push(PolicyError::Zero {
            field: "pickupTimeoutSeconds",
        }),
        Some(n) => policy.pickup_timeout_seconds = n,
        None if defaults.pickup_timeout_seconds.is_none() => {
            policy.pickup_timeout_seconds = policy.apply_timeout_seconds
        }
        None => {}
    }
    match spec.topology_key.as_deref() {
        Some("") => errors.push(PolicyError::EmptyTopologyKey),
        Some(key) => policy.topology_key = Some(key.to_string()),
        None => {}
    }
    if let Some(v) = &spec.max_unavailable_per_domain {
        match Budget::from_api(v) {
            Ok(_) if spec.topology_key.is_none() => {
                errors.push(PolicyError::PerDomainWithoutTopologyKey)
            }
            Ok(b) => policy.max_unavailable_per_domain = Some(b),
            Err(source) => errors.push(PolicyError::Budget {
                field: "maxUnavailablePerDomain",
                source,
            }),
        }
    }
    if let Some(q) = &spec.quarantine {
        match q.after_consecutive_failures {
            0 => errors.push(PolicyError::Zero {
                field: "quarantine.afterConsecutiveFailures",
            }),
            n => policy.quarantine_after = Some(n),
        }
    }
    if let Some(canary) = &spec.canary {
        let nodes = if let Some(sel) = &canary.selector {
            match Selector::parse(Some(sel)) {
                Ok(s) => Some(CanaryNodes::Selector(s)),
                Err(errs) => {
                    for e in errs {
                        errors.push(PolicyError::CanarySelector(e.to_string()));
                    }
                    None
                }
            }
        } else {
            match canary.count {
                Some(0) => {
                    errors.push(PolicyError::Zero {
                        field: "canary.count",
                    });
                    None
                }
                Some(n) => Some(CanaryNodes::Count(n)),
                None => Some(CanaryNodes::Count(1)),
            }
        };
        policy.canary = nodes.map(|nodes| CanaryPolicy {
            nodes,
            bake_seconds: canary.bake_seconds,
        });
    }
    (policy, errors)
}

/// The two timeouts of a revision's `spec.rollout`, in seconds ([`super::deadline`] judges by them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    pub apply: u32,
    pub pickup: u32,
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    use super::*;
    use netwave_api::Canary;

    #[test]
    fn budget_counts_and_percentages() {
        assert_eq!(Budget::from_api(&IntOrString::Int(3)), Ok(Budget::Count(3)));
        assert_eq!(
            Budget::from_api(&IntOrString::String("10%".into())),
            Ok(Budget::Percent(10))
        );
        assert!(Budget::from_api(&IntOrString::Int(0)).is_err());
        assert!(Budget::from_api(&IntOrString::String("0%".into())).is_err());
        assert!(Budget::from_api(&IntOrString::String("101%".into())).is_err());
        assert!(Budget::from_api(&IntOrString::String("3".into())).is_err());
        assert_eq!(Budget::Percent(10).of(55), 5);
        assert_eq!(
            Budget::Percent(10).of(5),
            1,
            "rounded down but never below 1"
        );
        assert_eq!(Budget::Percent(100).of(0), 1);
        assert_eq!(Budget::Count(4).of(2), 4);
    }

    #[test]
    fn spec_overrides_defaults_and_bad_fields_are_named() {
        let spec = RolloutPolicy {
            max_unavailable: Some(IntOrString::String("25%".into())),
            max_failures: Some(3),
            apply_timeout_seconds: Some(0),
            max_unavailable_per_domain: Some(IntOrString::Int(1)),
            canary: Some(Canary {
                bake_seconds: 60,
                ..Canary::default()
            }),
            ..RolloutPolicy::default()
        };
        let (policy, errors) = resolve(&spec, &PolicyDefaults::default());
        assert_eq!(policy.max_unavailable, Budget::Percent(25));
        assert_eq!(policy.max_failures, 3);
        assert_eq!(
            policy.apply_timeout_seconds, 300,
            "invalid field keeps the default"
        );
        assert_eq!(
            policy.canary,
            Some(CanaryPolicy {
                nodes: CanaryNodes::Count(1),
                bake_seconds: 60
            })
        );
        let messages: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            messages,
            [
                "spec.rollout.applyTimeoutSeconds: must be at least 1",
                "spec.rollout.maxUnavailablePerDomain needs spec.rollout.topologyKey",
            ]
        );
    }
}
