//! Bounds on what a node's agent writes in its NodeNetworkConfig status (#48). An agent may write its
//! own node config's status, and the configurator copies parts of it into the revision's status, its
//! Events and its logs: an unbounded string there (a 400 KB `reason`) made every revision status write
//! fail for ever (`etcdserver: request is too large`), froze the revision and flooded the log.
//!
//! The CRD enforces each bound (`maxLength`, `maxItems`, `maxProperties`, and a CEL rule on the
//! capability names), so the API server refuses an oversized write whole; the agent keeps its own
//! reports within them ([`NodeNetworkConfigStatus::bounded`]), so a long message of its own is cut,
//! never refused; and the configurator bounds again what it copies ([`FAILED_NODE_MESSAGE_MAX`]), for
//! statuses stored under an older CRD that had no bounds.

use crate::rollout::{NodeNetworkConfigStatus, ProbeResult};

/// `status.phase`: `Provisioning`, `Provisioned`, `Invalid`, `Pending`.
pub const PHASE_MAX: usize = 32;
/// `status.reason`: a machine-readable cause (`HealthCheckFailed`).
pub const REASON_MAX: usize = 128;
/// `status.message`, written by people's tools and read by people.
pub const MESSAGE_MAX: usize = 8192;
/// Revision names (`observedRevision`, `lastGoodRevision`): a Kubernetes object name.
pub const NAME_MAX: usize = 253;
/// Config hashes (`configHash`, `observedConfigHash`): hex sha256 is 64.
pub const HASH_MAX: usize = 128;
/// `agentVersion`.
pub const VERSION_MAX: usize = 64;
/// `agentFeatures`: how many, and each name's length.
pub const FEATURES_MAX: usize = 64;
pub const FEATURE_NAME_MAX: usize = 64;
/// `probes`: how many, and the length of each one's name, result and message.
pub const PROBES_MAX: usize = 32;
pub const PROBE_NAME_MAX: usize = 256;
pub const PROBE_RESULT_MAX: usize = 32;
pub const PROBE_MESSAGE_MAX: usize = 1024;
/// `kernelCapabilities`: how many, and each name's length.
pub const CAPABILITIES_MAX: usize = 64;
pub const CAPABILITY_NAME_MAX: usize = 64;
/// `conditions`: the agent's three kstatus conditions and the configurator's `Quarantined`, with room.
pub const CONDITIONS_MAX: usize = 8;
/// What the configurator copies of a node's `message` into the revision's `status.failedNodes`
/// (and its Events and logs): enough to say what failed; the whole message stays on the node config.
pub const FAILED_NODE_MESSAGE_MAX: usize = 1024;

const CUT: &str = "…";

/// `s` if it has at most `max` bytes, else its longest prefix (on a character boundary) that, with
/// "…" after it, has at most `max` bytes. Bytes bound characters, so the result also fits a CRD's
/// `maxLength` of `max` (which counts characters).
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max.saturating_sub(CUT.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{CUT}", &s[..end])
}

fn bound(s: &mut Option<String>, max: usize) {
    if let Some(v) = s.as_mut()
        && v.len() > max
    {
        *v = truncate(v, max);
    }
}

impl NodeNetworkConfigStatus {
    /// This status within every bound of the CRD: strings cut ([`truncate`]), lists cut to their
    /// first entries. What an agent writes, so that a long message of its own is never refused.
    pub fn bounded(mut self) -> Self {
        bound(&mut self.phase, PHASE_MAX);
        bound(&mut self.observed_revision, NAME_MAX);
        bound(&mut self.last_good_revision, NAME_MAX);
        bound(&mut self.observed_config_hash, HASH_MAX);
        bound(&mut self.config_hash, HASH_MAX);
        bound(&mut self.reason, REASON_MAX);
        bound(&mut self.message, MESSAGE_MAX);
        bound(&mut self.agent_version, VERSION_MAX);
        if let Some(features) = self.agent_features.as_mut() {
            features.truncate(FEATURES_MAX);
            for f in features.iter_mut() {
                if f.len() > FEATURE_NAME_MAX {
                    *f = truncate(f, FEATURE_NAME_MAX);
                }
            }
        }
        self.probes.truncate(PROBES_MAX);
        for p in self.probes.iter_mut() {
            let ProbeResult {
                name,
                result,
                message,
                ..
            } = p;
            *name = truncate(name, PROBE_NAME_MAX);
            *result = truncate(result, PROBE_RESULT_MAX);
            bound(message, PROBE_MESSAGE_MAX);
        }
        self.kernel_capabilities = std::mem::take(&mut self.kernel_capabilities)
            .into_iter()
            .map(|(k, v)| (truncate(&k, CAPABILITY_NAME_MAX), v))
            .take(CAPABILITIES_MAX)
            .collect();
        self.conditions.truncate(CONDITIONS_MAX);
        for c in self.conditions.iter_mut() {
            c.reason = truncate(&c.reason, REASON_MAX);
            c.message = truncate(&c.message, MESSAGE_MAX);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_cuts_on_a_character_boundary_within_the_bound() {
        assert_eq!(truncate("short", 10), "short");
        let cut = truncate(&"é".repeat(100), 11);
        assert!(cut.len() <= 11 && cut.ends_with('…'), "{cut}");
        assert_eq!(cut, "éééé…");
        assert_eq!(truncate(&"x".repeat(5000), 1024).len(), 1024);
    }

    #[test]
    fn a_bounded_status_fits_every_bound() {
        let huge = "x".repeat(400 * 1024);
        let st = NodeNetworkConfigStatus {
            phase: Some("Invalid".into()),
            reason: Some(huge.clone()),
            message: Some(huge.clone()),
            observed_revision: Some(huge.clone()),
            agent_features: Some(vec![huge.clone(); 100]),
            probes: vec![
                ProbeResult {
                    name: huge.clone(),
                    result: huge.clone(),
                    message: Some(huge.clone()),
                    ..ProbeResult::default()
                };
                100
            ],
            kernel_capabilities: (0..100).map(|i| (format!("{i}{huge}"), true)).collect(),
            ..NodeNetworkConfigStatus::default()
        }
        .bounded();
        assert_eq!(st.reason.as_ref().unwrap().len(), REASON_MAX);
        assert_eq!(st.message.as_ref().unwrap().len(), MESSAGE_MAX);
        assert_eq!(st.observed_revision.as_ref().unwrap().len(), NAME_MAX);
        assert_eq!(st.agent_features.as_ref().unwrap().len(), FEATURES_MAX);
        assert_eq!(st.probes.len(), PROBES_MAX);
        assert!(st.probes.iter().all(|p| p.name.len() <= PROBE_NAME_MAX
            && p.result.len() <= PROBE_RESULT_MAX
            && p.message.as_ref().unwrap().len() <= PROBE_MESSAGE_MAX));
        assert!(st.kernel_capabilities.len() <= CAPABILITIES_MAX);
        assert!(
            st.kernel_capabilities
                .keys()
                .all(|k| k.len() <= CAPABILITY_NAME_MAX)
        );
        let json = serde_json::to_vec(&st).unwrap();
        assert!(json.len() < 100 * 1024, "{} bytes", json.len());
        assert_eq!(st.phase.as_deref(), Some("Invalid"), "what fits is kept");
    }
}
