//! NodeNetworkConfig status from an [`Outcome`] (pure). The agent is the only writer of NNC status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use netwave_api::features::FeatureSet;
use netwave_api::{NodeNetworkConfig, NodeNetworkConfigStatus};
use netwave_core::rollout::health;
use netwave_core::types::Timestamp;

use crate::reconcile::{Outcome, PROVISIONING, Target};
use netwave_core::dataplane::Capabilities;

pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");

fn caps_map(caps: &Capabilities) -> std::collections::BTreeMap<String, bool> {
    caps.iter()
        .map(|(f, ok)| (f.name().to_string(), *ok))
        .collect()
}

fn transition(prev: Option<&NodeNetworkConfigStatus>, phase: &str, now: &Time) -> Option<Time> {
    match prev {
        Some(p) if p.phase.as_deref() == Some(phase) => {
            p.last_transition_time.clone().or(Some(now.clone()))
        }
        _ => Some(now.clone()),
    }
}

/// `prev` reports on the attempt `t` (its revision, retry and config).
fn same_attempt(prev: &NodeNetworkConfigStatus, t: &Target) -> bool {
    prev.observed_revision.as_deref() == Some(t.revision.as_str())
        && prev.observed_retry == Some(t.retry)
        && prev.observed_config_hash.as_deref() == Some(t.config_hash.as_str())
}

/// Status reporting `o`.
pub fn from_outcome(
    o: &Outcome,
    prev: Option<&NodeNetworkConfigStatus>,
    caps: &Capabilities,
    now: Time,
) -> NodeNetworkConfigStatus {
    let phase = o.phase();
    NodeNetworkConfigStatus {
        phase: Some(phase.to_string()),
        observed_revision: Some(o.revision.clone()),
        observed_retry: Some(o.retry),
        // The caller, who knows which spec `o` answers, sets it (see `answering`).
        observed_config_hash: None,
        config_hash: o.running_hash.clone(),
        last_good_revision: o.last_good_revision.clone(),
        reason: o.reason.map(|r| r.as_str().to_string()),
        message: Some(o.message.clone()),
        last_transition_time: transition(prev, phase, &now),
        probes: o.probes.clone(),
        agent_version: Some(AGENT_VERSION.to_string()),
        agent_features: Some(FeatureSet::all().names()),
        kernel_capabilities: caps_map(caps),
        // Set by `judged`; the configurator's (Quarantined) are never the agent's.
        observed_generation: None,
        conditions: Vec::new(),
    }
}

/// `prev` saying which agent runs here, what it can apply and what the kernel supports (after an
/// upgrade, or on a placeholder: `prev` is then `None`, and nothing else is said).
pub fn announcing(
    prev: Option<&NodeNetworkConfigStatus>,
    caps: &Capabilities,
) -> NodeNetworkConfigStatus {
    NodeNetworkConfigStatus {
        agent_version: Some(AGENT_VERSION.to_string()),
        agent_features: Some(FeatureSet::all().names()),
        kernel_capabilities: caps_map(caps),
        // Set by `judged`; the configurator's (Quarantined) are never the agent's.
        conditions: Vec::new(),
        ..prev.cloned().unwrap_or_default()
    }
}

/// `st` already names this agent and its features.
pub fn announces_this_agent(st: &NodeNetworkConfigStatus) -> bool {
    st.agent_version.as_deref() == Some(AGENT_VERSION)
        && st.agent_features.as_deref() == Some(FeatureSet::all().names().as_slice())
}

/// `st`, saying which config it answers: `nnc`'s, when `st` reports on its spec's revision and retry;
/// then [`judged`].
pub fn answering(
    mut st: NodeNetworkConfigStatus,
    nnc: &NodeNetworkConfig,
    now: &Time,
) -> NodeNetworkConfigStatus {
    let spec = &nnc.spec;
    if st.observed_revision.as_deref() == Some(spec.revision.as_str())
        && st.observed_retry == Some(spec.retry)
    {
        st.observed_config_hash = Some(spec.config_hash.clone());
    }
    judged(st, nnc, now)
}

/// `st` with what generic tools read (#50): `observedGeneration`, `nnc`'s generation, and the
/// kstatus conditions `Ready`, `Reconciling`, `Stalled` of `st` for `nnc`'s spec
/// (`netwave_core::rollout::health::of_node`; none on a placeholder). Never the configurator's
/// `Quarantined`: the list is a map keyed by type, and the agent applies only its own entries.
pub fn judged(
    mut st: NodeNetworkConfigStatus,
    nnc: &NodeNetworkConfig,
    now: &Time,
) -> NodeNetworkConfigStatus {
    let verdict = health::of_node(&nnc.spec, &st);
    let old = nnc.status.as_ref().map(|s| s.conditions.as_slice());
    st.conditions = health::conditions(
        &verdict,
        old.unwrap_or_default(),
        nnc.metadata.generation,
        Timestamp(now.0.as_millisecond()),
    );
    st.observed_generation = nnc.metadata.generation;
    st
}

/// Status while `t` is being applied: the running config and last good revision stay what they were.
/// `lastTransitionTime` is when this attempt (revision, retry, config) started: the configurator counts
/// the apply timeout from it, so it is kept across restarts of the same attempt and set afresh for a
/// new one, even straight after another attempt's `Provisioning`.
pub fn provisioning(
    t: &Target,
    prev: Option<&NodeNetworkConfigStatus>,
    caps: &Capabilities,
    now: Time,
) -> NodeNetworkConfigStatus {
    NodeNetworkConfigStatus {
        phase: Some(PROVISIONING.to_string()),
        observed_revision: Some(t.revision.clone()),
        observed_retry: Some(t.retry),
        observed_config_hash: Some(t.config_hash.clone()),
        config_hash: prev.and_then(|p| p.config_hash.clone()),
        last_good_revision: prev.and_then(|p| p.last_good_revision.clone()),
        reason: None,
        message: Some(format!("applying revision {}", t.revision)),
        last_transition_time: transition(prev.filter(|p| same_attempt(p, t)), PROVISIONING, &now),
        probes: Vec::new(),
        agent_version: Some(AGENT_VERSION.to_string()),
        agent_features: Some(FeatureSet::all().names()),
        kernel_capabilities: caps_map(caps),
        // Set by `judged`; the configurator's (Quarantined) are never the agent's.
        observed_generation: None,
        conditions: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::Reason;
    use netwave_api::vocab::{NodePhase, NodeReason};
    use netwave_core::dataplane::Feature;

    fn t(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
    }

    #[test]
    fn invalid_outcome_names_reason_and_keeps_transition_time_while_phase_holds() {
        let o = Outcome {
            revision: "r2".into(),
            retry: 1,
            reason: Some(Reason::HealthCheckFailed),
            message: "HealthCheckFailed: reachability 198.18.0.1:179: connect: refused".into(),
            running_hash: Some("h1".into()),
            last_good_revision: Some("r1".into()),
            probes: vec![],
            applied: 3,
            writes: 5,
            rolled_back: true,
        };
        let caps = Capabilities::from([(Feature::Vrf, false), (Feature::Bridge, true)]);
        let s = from_outcome(&o, None, &caps, t(100));
        assert_eq!(s.phase.as_deref(), Some(NodePhase::Invalid.as_str()));
        assert_eq!(
            s.reason.as_deref(),
            Some(NodeReason::HealthCheckFailed.as_str())
        );
        assert_eq!(s.observed_retry, Some(1));
        assert_eq!(s.config_hash.as_deref(), Some("h1"));
        assert!(!s.kernel_capabilities["vrf"]);
        assert_eq!(s.last_transition_time, Some(t(100)));
        let again = from_outcome(&o, Some(&s), &caps, t(200));
        assert_eq!(again.last_transition_time, Some(t(100)));
        let ok = Outcome { reason: None, ..o };
        assert_eq!(
            from_outcome(&ok, Some(&s), &caps, t(300)).last_transition_time,
            Some(t(300))
        );
        assert_eq!(from_outcome(&ok, Some(&s), &caps, t(300)).reason, None);
    }

    /// The configurator counts the apply timeout from a `Provisioning` report's `lastTransitionTime`
    /// (#28): it is the start of this attempt, not of an earlier one the agent was still applying.
    #[test]
    fn provisioning_transition_time_is_the_start_of_this_attempt() {
        let target = |revision: &str, retry: u32, hash: &str| Target {
            revision: revision.into(),
            retry,
            config_hash: hash.into(),
            config: Default::default(),
        };
        let caps = Capabilities::default();
        let first = provisioning(&target("r2", 0, "h2"), None, &caps, t(100));
        assert_eq!(first.last_transition_time, Some(t(100)));
        // The same attempt again (the agent restarted mid-apply): still started at 100.
        let again = provisioning(&target("r2", 0, "h2"), Some(&first), &caps, t(150));
        assert_eq!(again.last_transition_time, Some(t(100)));
        // Superseded mid-apply, a re-render, a retry: each starts now.
        for next in [
            target("r3", 0, "h3"),
            target("r2", 0, "h2b"),
            target("r2", 1, "h2"),
        ] {
            let s = provisioning(&next, Some(&first), &caps, t(200));
            assert_eq!(s.last_transition_time, Some(t(200)), "{}", next.revision);
        }
    }

    /// The skew gate (#46) reads which agent runs on a node and what it can apply: an upgraded agent
    /// that has nothing to report, or one on a placeholder, still says so, keeping what it reported
    /// before and leaving the configurator's fields alone.
    #[test]
    fn an_agent_announces_its_version_and_features_over_what_it_reported() {
        let caps = Capabilities::default();
        let older = NodeNetworkConfigStatus {
            phase: Some(NodePhase::Provisioned.as_str().into()),
            observed_revision: Some("r1".into()),
            agent_version: Some("0.1.0".into()),
            ..Default::default()
        };
        assert!(!announces_this_agent(&older));
        let st = announcing(Some(&older), &caps);
        assert!(announces_this_agent(&st));
        assert_eq!(st.agent_features, Some(FeatureSet::all().names()));
        assert_eq!(
            (st.phase.as_deref(), st.observed_revision.as_deref()),
            (Some("Provisioned"), Some("r1"))
        );
        // On a placeholder it says nothing else.
        let bare = announcing(None, &caps);
        assert!(announces_this_agent(&bare));
        assert_eq!((bare.phase, bare.observed_revision), (None, None));
    }

    /// What generic tools read (#50): the agent's conditions say whether its node runs this very config
    /// (by generation), is applying it, or refused it; a placeholder has none; the configurator's
    /// `Quarantined` is never among them.
    #[test]
    fn the_agents_conditions_judge_the_config_it_was_given() {
        use netwave_api::vocab::kstatus;
        let mut nnc = NodeNetworkConfig::new(
            "n1",
            netwave_api::NodeNetworkConfigSpec {
                revision: "r2".into(),
                sequence: 2,
                config_hash: "h2".into(),
                retry: 0,
                config: Default::default(),
            },
        );
        nnc.metadata.generation = Some(7);
        nnc.status = Some(NodeNetworkConfigStatus {
            conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: netwave_api::QUARANTINED_CONDITION.into(),
                status: "True".into(),
                reason: "Quarantined".into(),
                message: "".into(),
                last_transition_time: t(1),
                observed_generation: None,
            }],
            ..Default::default()
        });
        let caps = Capabilities::default();
        let true_one = |st: &NodeNetworkConfigStatus| {
            assert_eq!(st.observed_generation, Some(7));
            assert!(
                st.conditions
                    .iter()
                    .all(|c| c.observed_generation == Some(7))
            );
            let types: Vec<&str> = st.conditions.iter().map(|c| c.type_.as_str()).collect();
            assert_eq!(types, health::TYPES, "only the agent's own");
            let on: Vec<_> = (st.conditions.iter())
                .filter(|c| c.status == "True")
                .collect();
            assert_eq!(on.len(), 1);
            (on[0].type_.clone(), on[0].reason.clone())
        };
        let target = Target::from(&nnc.spec);
        let applying = judged(provisioning(&target, None, &caps, t(10)), &nnc, &t(10));
        assert_eq!(
            true_one(&applying),
            (kstatus::RECONCILING.into(), "Provisioning".into())
        );
        let ok = Outcome::provisioned("r2", 0, "h2", "applied".into());
        let done = answering(from_outcome(&ok, None, &caps, t(20)), &nnc, &t(20));
        assert_eq!(
            true_one(&done),
            (kstatus::READY.into(), "Provisioned".into())
        );
        let bad = Outcome::invalid(
            "r2",
            0,
            Reason::HealthCheckFailed,
            "probe gateway: no answer".into(),
            (Some("h1".into()), Some("r1".into())),
        );
        let refused = answering(from_outcome(&bad, None, &caps, t(30)), &nnc, &t(30));
        assert_eq!(
            true_one(&refused),
            (kstatus::STALLED.into(), "Invalid".into())
        );
        let stalled = refused
            .conditions
            .iter()
            .find(|c| c.type_ == kstatus::STALLED);
        assert!(stalled.unwrap().message.contains("HealthCheckFailed"));
        // An answer about an earlier revision does not say the node runs this one.
        let old = Outcome::provisioned("r1", 0, "h1", "applied".into());
        let stale = answering(from_outcome(&old, None, &caps, t(40)), &nnc, &t(40));
        assert_eq!(
            true_one(&stale),
            (kstatus::RECONCILING.into(), kstatus::PENDING.into())
        );
        // A placeholder: nothing to wait for, no conditions of the agent's.
        let mut placeholder = nnc.clone();
        placeholder.spec = netwave_api::NodeNetworkConfigSpec::placeholder();
        let bare = judged(announcing(None, &caps), &placeholder, &t(50));
        assert!(bare.conditions.is_empty());
    }
}
