//! An agent upgrade goes through the gate (DESIGN.md §6, #46). A new agent binary (or new flags) may
//! render the config the node runs differently: an MTU default, an FRR line, a route attribute. That
//! difference is a change to the node's network like any revision, so at start, before the agent reads
//! its assignment or says it is ready, it is applied under the same health gate:
//!
//! ```text
//!  last good config ─► this agent's rendering ══ what the node runs (kernel objects, frr.conf)?
//!     ├─ yes ──────────────────────────────────────────────────────────────► Same (no write)
//!     └─ no ─► held.json := what the node runs ─► preflight ─► change (marker: upgrade) ─► judge
//!                 ├─ probes pass ─► held.json removed, last good saved ───────► Passed
//!                 └─ a change or probe failed ─► restore held (kernel + FRR) ─► Refused
//!                      (held.json says which rendering was refused, by which version and why; that
//!                       rendering is not tried again on a restart, drift repair keeps the node on the
//!                       held rendering, and the shell keeps /readyz failing, so a DaemonSet rolling
//!                       update stops at this node)
//! ```
//!
//! Nothing here is a verdict on the revision: its status stays as the node reports it (the node still
//! runs it, as rendered before), and an interrupted gated apply is recovered and gated again, never
//! counted against the revision.

use netwave_core::dataplane::diff::diff;

use crate::backup::{Held, Refusal, rendering_digest};
use crate::reconcile::{Agent, DriftError, Outcome, Target};

/// What the start-up gate found and did.
#[derive(Clone, Debug, PartialEq)]
pub enum UpgradeCheck {
    /// No last good config, or the node runs this agent's rendering of it (exactly, or drifted from
    /// it: drift repair puts it back): nothing written.
    Same,
    /// This agent renders the running config differently; the difference passed the health gate and
    /// the node now runs it.
    Passed(Outcome),
    /// The difference failed the gate; the node is back on what it ran (held).
    Refused { refusal: Refusal, outcome: Outcome },
    /// This very rendering, under these probes, already failed the gate on this node (before a
    /// restart): not tried again.
    StillRefused(Refusal),
}

impl Agent {
    /// Before this agent applies anything else: is its rendering of the last good config what the node
    /// runs? If not, apply it under the health gate (see the module doc). `version` is this agent's.
    pub async fn upgrade_gate(&self, version: &str) -> Result<UpgradeCheck, DriftError> {
        let Some(lg) = self.last_good().map_err(DriftError::Backup)? else {
            return Ok(UpgradeCheck::Same);
        };
        let held = self
            .state
            .held()
            .map_err(DriftError::Backup)?
            .filter(|h| h.revision == lg.revision && h.config_hash == lg.config_hash);
        let want = self.dataplane(&lg.config).map_err(DriftError::Config)?;
        let text = match &self.frr {
            Some(frr) => Some(
                frr.render(&lg.config)
                    .map_err(|e| DriftError::Config(format!("FRR: {e}")))?,
            ),
            None => None,
        };
        let digest = rendering_digest(&want, text.as_deref());
        let probes = probes_digest(&self.prober.cfg);
        if let Some(r) = held.as_ref().and_then(|h| h.refused.as_ref())
            && r.rendering == digest
            && r.probes == probes
        {
            return Ok(UpgradeCheck::StillRefused(r.clone()));
        }
        // What the node runs: the held rendering (an earlier gate of this config was interrupted or
        // refused by another version), else the kernel as it is and the frr.conf on disk.
        let running_is_held = held.is_some();
        let running = match held {
            Some(h) => h,
            None => Held {
                revision: lg.revision.clone(),
                config_hash: lg.config_hash.clone(),
                dataplane: self.netlink.observe().await?.observed.managed,
                frr: self.frr.as_ref().and_then(|f| f.config_on_disk()),
                refused: None,
            },
        };
        let kernel_same = diff(&want, &running_observed(&running))
            .map_err(|e| DriftError::Config(e.to_string()))?
            .is_empty();
        let frr_same = text.is_none() || text == running.frr;
        // The node runs this very rendering, as recorded by the apply that passed the gate with it:
        // a difference is drift, which drift repair puts back (it is what the node ran).
        let recorded = self.state.rendered().map_err(DriftError::Backup)?;
        let drift_only = !running_is_held
            && recorded.is_some_and(|r| {
                r.revision == lg.revision
                    && r.config_hash == lg.config_hash
                    && r.rendering == digest
            });
        if (kernel_same && frr_same) || drift_only {
            // Nothing to gate; a held copy of this same rendering is no longer needed.
            self.state.clear_held().map_err(DriftError::Backup)?;
            return Ok(UpgradeCheck::Same);
        }
        self.state
            .save_held(&Held {
                refused: None,
                ..running.clone()
            })
            .map_err(DriftError::Backup)?;
        let t = Target {
            revision: lg.revision.clone(),
            retry: 0,
            config_hash: lg.config_hash.clone(),
            config: lg.config.clone(),
        };
        let outcome = self.gated(&t).await;
        let Some(reason) = outcome.reason else {
            return Ok(UpgradeCheck::Passed(outcome));
        };
        let refusal = Refusal {
            rendering: digest,
            probes,
            agent_version: version.to_string(),
            reason: reason.as_str().to_string(),
            message: outcome.message.clone(),
        };
        self.state
            .save_held(&Held {
                refused: Some(refusal.clone()),
                ..running
            })
            .map_err(DriftError::Backup)?;
        Ok(UpgradeCheck::Refused { refusal, outcome })
    }

    /// `t` (the last good config, as this agent renders it) through the apply's three stages, its
    /// marker saying it is an upgrade's. A refusal before any change is a refusal too.
    async fn gated(&self, t: &Target) -> Outcome {
        let invalid = |reason: crate::reconcile::Reason, detail: String| {
            Outcome::invalid(
                &t.revision,
                t.retry,
                reason,
                format!("{reason}: {detail}"),
                (Some(t.config_hash.clone()), Some(t.revision.clone())),
            )
        };
        let prepared = match self.preflight(t).await {
            Ok(p) => p,
            Err((reason, detail)) => return invalid(reason, detail),
        };
        let changed = match self.change(t, prepared, true).await {
            Ok(c) => c,
            Err((reason, detail)) => return invalid(reason, detail),
        };
        self.judge(t, changed, Some(t.revision.clone())).await
    }
}

/// Hex sha256 of the health config (its JSON).
fn probes_digest(cfg: &crate::health::HealthConfig) -> String {
    use sha2::Digest;
    let bytes = serde_json::to_vec(cfg).expect("a health config always serializes");
    hex::encode(sha2::Sha256::digest(bytes))
}

/// A held rendering as an observation of the kernel (no foreign links: the diff only reads `managed`).
fn running_observed(h: &Held) -> netwave_core::dataplane::diff::Observed {
    netwave_core::dataplane::diff::Observed {
        managed: h.dataplane.clone(),
        foreign_links: Default::default(),
    }
}
