//! NodeNetworkConfig status from an [`Outcome`] (pure). The agent is the only writer of NNC status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use netwave_api::NodeNetworkConfigStatus;
use netwave_api::features::FeatureSet;

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
        // The configurator's (Quarantined); empty is left out of the agent's apply, so it never
        // takes them over.
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
        // The configurator's (Quarantined); never taken over.
        conditions: Vec::new(),
        ..prev.cloned().unwrap_or_default()
    }
}

/// `st` already names this agent and its features.
pub fn announces_this_agent(st: &NodeNetworkConfigStatus) -> bool {
    st.agent_version.as_deref() == Some(AGENT_VERSION)
        && st.agent_features.as_deref() == Some(FeatureSet::all().names().as_slice())
}

/// `st`, saying which config it answers: `spec`'s, when `st` reports on `spec`'s revision and retry.
pub fn answering(
    mut st: NodeNetworkConfigStatus,
    spec: &netwave_api::NodeNetworkConfigSpec,
) -> NodeNetworkConfigStatus {
    if st.observed_revision.as_deref() == Some(spec.revision.as_str())
        && st.observed_retry == Some(spec.retry)
    {
        st.observed_config_hash = Some(spec.config_hash.clone());
    }
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
        // The configurator's (Quarantined); empty is left out of the agent's apply, so it never
        // takes them over.
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
        assert_eq!(st.agent_features, Some(vec!["ruleFwmark".to_string()]));
        assert_eq!(
            (st.phase.as_deref(), st.observed_revision.as_deref()),
            (Some("Provisioned"), Some("r1"))
        );
        // On a placeholder it says nothing else.
        let bare = announcing(None, &caps);
        assert!(announces_this_agent(&bare));
        assert_eq!((bare.phase, bare.observed_revision), (None, None));
    }
}
