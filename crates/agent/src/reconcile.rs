//! One apply, end to end, with rollback (DESIGN.md §4):
//!
//! ```text
//!  last good backup corrupt ─────────────────────────────────────────► Invalid BackupCorrupt   (no change)
//!  config ─► model::desired ──(bad field)──────────────────────────► Invalid InvalidConfig    (no change)
//!         ─► BGP content but FRR off (core::frr::bgp_content) ────────────► Invalid FrrUnavailable   (no change)
//!         ─► FRR render + `vtysh -C` ───────────────────────────────► Invalid FrrRejected      (no change)
//!         ─► missing kernel features ───────────────────────────────► Invalid KernelUnsupported (no change)
//!         ─► probes once (which ones gate) ─► applying marker ─► netlink reconcile + verify
//!               ├─(write failed / not converged)─► restore last good ─► re-probe ─► Invalid ApplyFailed
//!               └─► FRR: write frr.conf, reload, --test converged (FRR on)
//!                     ├─(failed)─► restore last good (kernel + FRR) ─► re-probe ─► Invalid FrrReloadFailed
//!                     └─► settle ─► probes with retries until the deadline
//!                     ├─(a gating probe failed)──► restore last good ─► re-probe ─► Invalid HealthCheckFailed
//!                     └─► save last good ─► clear marker ─► Provisioned
//! ```
//!
//! The rollback never waits for the API server: if the new config cut it off, the API probe fails, the
//! node restores locally, and the shell reports when the server is reachable again.
//! [`decide`] (pure) says whether a NodeNetworkConfig needs an apply at all.
//!
//! The FRR text of a config is a pure function of that config and the node's underlay, so a restore
//! re-renders the last good config's text instead of keeping a copy, and drift repair compares FRR's
//! running config with that same text. Except while a rendering is held (`crate::upgrade`): an agent
//! that renders the last good config differently than the node runs it applies its rendering under the
//! health gate first, and until that passes, restores and drift repair go back to what the node ran.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use netwave_api::{NodeConfig, NodeNetworkConfigSpec, NodeNetworkConfigStatus, ProbeResult};

use crate::backup::{Applying, BackupError, LastGood, Rejected, StateDir};
use crate::frr::{Frr, FrrApplyError, FrrTimings};
use crate::health::{Prober, first_gating_failure, gating};
use crate::netlink::{self, Netlink, NetlinkError, ReconcileReport};
use netwave_api::vocab::NodePhase;
use netwave_core::dataplane::{Capabilities, Dataplane, desired, missing_features};
use netwave_core::frr::bgp_content;

/// The Event on a node's own NodeNetworkConfig that does not decode (DESIGN.md §6): the agent applies
/// nothing new from it (it cannot tell what it says) and keeps the node on what it runs, drift repaired.
pub fn undecodable_note(error: &str, running: Option<&str>) -> String {
    format!(
        "this node's NodeNetworkConfig cannot be decoded ({error}): nothing new is applied until it is \
         fixed; the node keeps running {} and its drift is still repaired",
        running.unwrap_or("its current config")
    )
}

/// Why a revision is `Invalid`. The string form is the NNC `status.reason`, spelled in the API's
/// vocabulary.
pub use netwave_api::vocab::NodeReason as Reason;

pub const PROVISIONED: &str = NodePhase::Provisioned.as_str();
pub const INVALID: &str = NodePhase::Invalid.as_str();
pub const PROVISIONING: &str = NodePhase::Provisioning.as_str();

/// The config an NNC asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub revision: String,
    pub retry: u32,
    pub config_hash: String,
    pub config: NodeConfig,
}

impl From<&NodeNetworkConfigSpec> for Target {
    fn from(s: &NodeNetworkConfigSpec) -> Target {
        Target {
            revision: s.revision.clone(),
            retry: s.retry,
            config_hash: s.config_hash.clone(),
            config: s.config.clone(),
        }
    }
}

/// What an apply (or a start-up recovery) ended with; the shell turns it into NNC status, metrics and
/// Events.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub revision: String,
    pub retry: u32,
    /// `None`: Provisioned.
    pub reason: Option<Reason>,
    /// `Reason: detail`, naming the failed step or probe.
    pub message: String,
    /// configHash of the config the kernel runs now, when known.
    pub running_hash: Option<String>,
    pub last_good_revision: Option<String>,
    pub probes: Vec<ProbeResult>,
    /// Operations applied for the target (before any rollback).
    pub applied: usize,
    pub writes: u64,
    /// A rollback to the last good config happened (successfully or not: see `message`).
    pub rolled_back: bool,
}

impl Outcome {
    /// `revision` (and `retry`) applied and healthy: the node runs `config_hash` and records it as last
    /// good.
    pub fn provisioned(revision: &str, retry: u32, config_hash: &str, message: String) -> Outcome {
        Outcome {
            revision: revision.to_string(),
            retry,
            reason: None,
            message,
            running_hash: Some(config_hash.to_string()),
            last_good_revision: Some(revision.to_string()),
            probes: Vec::new(),
            applied: 0,
            writes: 0,
            rolled_back: false,
        }
    }

    /// `revision` (and `retry`) refused or failed for `reason`; `message` is the whole text (it starts
    /// with the reason by convention). The node runs what `running` says: (configHash, last good
    /// revision), each when known.
    pub fn invalid(
        revision: &str,
        retry: u32,
        reason: Reason,
        message: String,
        running: (Option<String>, Option<String>),
    ) -> Outcome {
        Outcome {
            revision: revision.to_string(),
            retry,
            reason: Some(reason),
            message,
            running_hash: running.0,
            last_good_revision: running.1,
            probes: Vec::new(),
            applied: 0,
            writes: 0,
            rolled_back: false,
        }
    }

    /// What the apply did on the way: operations applied, kernel writes, the probes' last answers.
    fn with_work(mut self, applied: usize, writes: u64, probes: Vec<ProbeResult>) -> Outcome {
        self.applied = applied;
        self.writes = writes;
        self.probes = probes;
        self
    }

    /// The apply was rolled back to the last good config (see the message for how it went).
    pub fn rolled_back(mut self) -> Outcome {
        self.rolled_back = true;
        self
    }

    pub fn phase(&self) -> &'static str {
        if self.reason.is_none() {
            PROVISIONED
        } else {
            INVALID
        }
    }
}

/// What the agent should do about its NNC. Pure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Apply the spec's config.
    Apply,
    /// The kernel already runs this config (same configHash): report the new revision Provisioned and
    /// record it as last good, without touching the kernel.
    FastPath,
    /// Already reported for this revision and retry; nothing to do (drift repair runs on its timer).
    UpToDate,
    /// Reported `Invalid` for this revision and retry: not re-applied until `spec.retry` changes.
    SkipInvalid,
    /// The config does not hash to the spec's configHash (edited by hand, or written by a configurator
    /// whose config this agent cannot read in full): report `Invalid/ConfigTampered`, touch nothing.
    Tampered { actual: String },
    /// Already reported as tampered for this revision and retry: nothing to do until the spec changes.
    StillTampered,
    /// A placeholder (no revision assigned yet, the node is queued): nothing to apply or report; the
    /// node keeps what it runs.
    Unassigned,
    /// The last good backup is corrupt: report `Invalid/BackupCorrupt`, touch nothing. Nothing is
    /// applied until an admin repairs the backup (a failed apply could not be rolled back).
    BackupCorrupt,
    /// Already reported as refused for a corrupt backup for this revision, retry and config: nothing
    /// to do (and nothing to log) until the backup is repaired or the spec changes.
    StillBackupCorrupt,
}

/// What the node runs, as its backup tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Running<'a> {
    /// The config with this configHash; `None`: nothing netwave applied yet (no backup).
    Known(Option<&'a str>),
    /// The backup is corrupt: unknown, and nothing may be applied until it is repaired.
    BackupCorrupt,
}

impl<'a> From<Option<&'a str>> for Running<'a> {
    fn from(hash: Option<&'a str>) -> Self {
        Running::Known(hash)
    }
}

pub fn decide<'a>(
    spec: &NodeNetworkConfigSpec,
    status: Option<&NodeNetworkConfigStatus>,
    running: impl Into<Running<'a>>,
) -> Decision {
    if spec.is_placeholder() {
        return Decision::Unassigned;
    }
    let same_attempt = status.is_some_and(|s| {
        s.observed_revision.as_deref() == Some(spec.revision.as_str())
            && s.observed_retry.unwrap_or(0) == spec.retry
    });
    // The verdict was on this very config: one re-rendered under the same revision and retry (a Node
    // label change) is judged afresh. Statuses without the field answer the revision and retry.
    let same_config = status.is_some_and(|s| {
        s.observed_config_hash
            .as_deref()
            .is_none_or(|h| h == spec.config_hash)
    });
    let phase = status.and_then(|s| s.phase.as_deref());
    // A refusal as tampered is no verdict on the revision: once the spec is put back, it is applied.
    let refused_for = |reason: Reason| {
        phase == Some(INVALID)
            && same_attempt
            && status.and_then(|s| s.reason.as_deref()) == Some(reason.as_str())
    };
    let refused_as_tampered = refused_for(Reason::ConfigTampered);
    // Neither is a refusal for a corrupt backup: once the backup is repaired, the spec is applied.
    let refused_for_backup = refused_for(Reason::BackupCorrupt);
    let running_hash = match running.into() {
        Running::Known(hash) => hash,
        Running::BackupCorrupt if refused_for_backup && same_config => {
            return Decision::StillBackupCorrupt;
        }
        Running::BackupCorrupt => return Decision::BackupCorrupt,
    };
    let actual = netwave_core::render::config_hash(&spec.config);
    if actual != spec.config_hash {
        return if refused_as_tampered {
            Decision::StillTampered
        } else {
            Decision::Tampered { actual }
        };
    }
    match phase {
        Some(INVALID)
            if same_attempt && same_config && !refused_as_tampered && !refused_for_backup =>
        {
            return Decision::SkipInvalid;
        }
        Some(PROVISIONED) if same_attempt && running_hash == Some(spec.config_hash.as_str()) => {
            return Decision::UpToDate;
        }
        _ => {}
    }
    if running_hash == Some(spec.config_hash.as_str()) {
        Decision::FastPath
    } else {
        Decision::Apply
    }
}

/// The refusal of `t` because the last good backup is unusable (`e`): nothing applied, nothing known of
/// what runs. The message names the file, what is wrong with it and how to repair it.
pub fn backup_corrupt(t: &Target, e: &BackupError) -> Outcome {
    let reason = Reason::BackupCorrupt;
    let what = match e {
        BackupError::Corrupt { path, why } => {
            format!("the last good backup {} is corrupt ({why})", path.display())
        }
        other => format!("the last good backup cannot be used: {other}"),
    };
    Outcome::invalid(
        &t.revision,
        t.retry,
        reason,
        format!(
            "{reason}: {what}. No config is applied while it is (a failed apply could not be rolled \
             back); the kernel is untouched. To repair, move the file aside: the node then has no last \
             good config and applies its assigned revision afresh"
        ),
        (None, None),
    )
}

/// Interrupted applies of one revision (and retry) after which it is reported `Invalid`.
pub const MAX_INTERRUPTIONS: u32 = 2;

/// What the agent does at start when it finds the `applying` marker of an apply it did not finish
/// (killed, node rebooted). The last good config is restored either way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AfterInterruption {
    /// Apply the revision again: one interruption may be the node's, not the revision's fault.
    Retry { interruptions: u32 },
    /// Interrupted [`MAX_INTERRUPTIONS`] times (or the marker names no revision): report it `Invalid`
    /// (`ApplyInterrupted`) so the rollout judges it instead of the node looping.
    Judge { interruptions: u32 },
}

/// The interruption policy. Pure.
pub fn after_interruption(marker: &Applying) -> AfterInterruption {
    let interruptions = marker.interruptions + 1;
    if interruptions < MAX_INTERRUPTIONS && !marker.revision.is_empty() {
        AfterInterruption::Retry { interruptions }
    } else {
        AfterInterruption::Judge { interruptions }
    }
}

/// Whether a verdict recorded before a restart answers this target: the same revision and retry were
/// judged `Invalid` and the verdict may never have reached the API server, so it is reported again
/// instead of applying the bad config a second time. Pure.
pub fn verdict_applies(rejected: Option<&Rejected>, target: &Target) -> bool {
    rejected.is_some_and(|r| r.revision == target.revision && r.retry == target.retry)
}

/// The agent's dataplane side: netlink, state dir, probes and the kernel's capabilities.
#[derive(Clone)]
pub struct Agent {
    pub netlink: Netlink,
    pub state: StateDir,
    pub prober: Prober,
    pub caps: Capabilities,
    /// FRR on this node (`--frr-config`); `None`: FRR is off and BGP content is refused.
    pub frr: Option<Frr>,
    /// How long the steps of the last apply took (metrics, benchmarks).
    pub timings: Timings,
    /// A deliberate change to every rendering (upgrade drills and their tests; the flag that sets it
    /// exists only in builds with the `rendering-drill` feature).
    pub drill: Option<crate::drill::Drill>,
}

/// How long the netlink and FRR parts of one apply took.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ApplyTimings {
    /// netlink reconcile + verify.
    pub netlink: Duration,
    /// render → check → write → reload → converged; `None` with FRR off (or when it did not run).
    pub frr: Option<FrrTimings>,
}

/// The last apply's [`ApplyTimings`], shared by clones of the agent.
#[derive(Clone, Debug, Default)]
pub struct Timings(Arc<Mutex<Option<ApplyTimings>>>);

impl Timings {
    pub fn last(&self) -> Option<ApplyTimings> {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn set(&self, t: ApplyTimings) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(t);
    }
}

/// What drift repair did: the kernel writes, and FRR's diff when FRR had drifted (re-applied).
#[derive(Debug, Default)]
pub struct DriftReport {
    pub netlink: ReconcileReport,
    /// `frr-reload.py --test`'s "Lines To Delete/Add" that were repaired.
    pub frr: Option<String>,
    /// The same, when this node has no last good config yet (its first start): FRR was set up with the
    /// underlay, which is no drift (#51: a fresh node used to report it as a repair).
    pub frr_baseline: Option<String>,
}

impl DriftReport {
    pub fn is_empty(&self) -> bool {
        self.netlink.applied.is_empty() && self.frr.is_none() && self.frr_baseline.is_none()
    }
}

/// What a restore did.
struct Restore {
    /// configHash and revision now running, if the restore succeeded.
    running: Option<(String, String)>,
    note: String,
}

impl Restore {
    /// (configHash, revision) the node runs after the restore, each when known.
    fn running_state(&self) -> (Option<String>, Option<String>) {
        match &self.running {
            Some((hash, rev)) => (Some(hash.clone()), Some(rev.clone())),
            None => (None, None),
        }
    }
}

/// Stage 1's result: what an apply changes, checked before anything is touched.
pub(crate) struct Prepared<'a> {
    /// The kernel objects of the target.
    want: Dataplane,
    /// FRR's text for the target (FRR on), already accepted by FRR's dry run.
    frr: Option<(&'a Frr, String)>,
    frr_timings: FrrTimings,
    /// VRF bridges whose new L3 VNI zebra must bind before they come up.
    hold: Vec<(String, u32)>,
    /// The kernel as preflight read it: the one observation before the change (the marker's links and
    /// the first reconcile pass come from it).
    kernel: netlink::Snapshot,
}

/// Stage 2's result: what changed, and whether the change itself went through.
pub(crate) struct Changed {
    /// `Err`: the step that failed, its detail and the operations applied before it.
    result: Result<usize, (Reason, String, usize)>,
    timings: ApplyTimings,
    /// The probes that passed before the change: the ones that gate it.
    gate: BTreeSet<String>,
    writes_before: u64,
    /// [`crate::backup::rendering_digest`] of what the change applied.
    rendering: String,
}

impl Agent {
    pub(crate) fn dataplane(&self, cfg: &NodeConfig) -> Result<Dataplane, String> {
        match &self.drill {
            None => desired(cfg, self.netlink.settings()),
            Some(d) => desired(&d.apply(cfg), self.netlink.settings()),
        }
        .map_err(|e| e.to_string())
    }

    /// What the node runs for the last good config `lg`: the held rendering when one is held for it
    /// (an agent upgrade's rendering has not passed the gate), else this agent's rendering (the kernel
    /// objects, and FRR's text when FRR is on).
    pub(crate) fn running_rendering(
        &self,
        cfg: &NodeConfig,
        revision: &str,
        config_hash: &str,
    ) -> Result<(Dataplane, Option<String>), String> {
        let held = self.state.held().map_err(|e| e.to_string())?;
        if let Some(h) = held.filter(|h| h.revision == revision && h.config_hash == config_hash) {
            let frr = match (&self.frr, h.frr) {
                (Some(_), Some(text)) => Some(text),
                (Some(frr), None) => Some(frr.render(cfg).map_err(|e| format!("FRR: {e}"))?),
                (None, _) => None,
            };
            return Ok((h.dataplane, frr));
        }
        let dp = self.dataplane(cfg)?;
        let frr = match &self.frr {
            Some(frr) => Some(frr.render(cfg).map_err(|e| format!("FRR: {e}"))?),
            None => None,
        };
        Ok((dp, frr))
    }

    /// The links an apply of `want` may leave unmarked if the agent dies mid-way: every link of `want`
    /// and of the last good config (its restore) that no one else holds now. Not only the missing ones:
    /// a change the kernel cannot make in place (a VXLAN's VNI) deletes and recreates a link the agent
    /// already owned, and a restore recreates what the apply removed.
    pub async fn may_create(&self, want: &Dataplane) -> Vec<String> {
        match self.netlink.observe().await {
            Ok(snap) => self.may_create_in(want, &snap),
            Err(e) => {
                tracing::warn!(error = %e, "listing links before an apply failed; a crash mid-apply may leave links to adopt by hand");
                Vec::new()
            }
        }
    }

    /// [`Agent::may_create`] on an observation the apply already made.
    fn may_create_in(&self, want: &Dataplane, snap: &netlink::Snapshot) -> Vec<String> {
        let mut names: BTreeSet<String> = want.links.keys().cloned().collect();
        if let Ok(Some(lg)) = self.last_good()
            && let Ok(dp) = self.dataplane(&lg.config)
        {
            names.extend(dp.links.into_keys());
        }
        netlink::not_foreign_in(snap, names)
    }

    /// The last good config from disk; a corrupt file is reported as `Err` and never used.
    pub fn last_good(&self) -> Result<Option<LastGood>, BackupError> {
        self.state.load_last_good()
    }

    /// Applies `t` with health checks and rollback. Never panics on kernel or probe failures: every
    /// failure is an `Invalid` outcome naming its step, and is recorded in the state dir (see
    /// [`Agent::rejected_outcome`]).
    ///
    /// With a corrupt backup nothing is applied and nothing recorded: the refusal is no verdict on `t`,
    /// which is applied once the backup is repaired.
    pub async fn apply(&self, t: &Target) -> Outcome {
        if let Err(e) = self.last_good() {
            return backup_corrupt(t, &e);
        }
        let o = self.apply_unrecorded(t).await;
        self.record_verdict(&o);
        o
    }

    fn record_verdict(&self, o: &Outcome) {
        let Some(reason) = o.reason else { return };
        let rejected = Rejected {
            revision: o.revision.clone(),
            retry: o.retry,
            reason: reason.as_str().to_string(),
            message: o.message.clone(),
        };
        if let Err(e) = self.state.save_rejected(&rejected) {
            tracing::warn!(error = %e, "recording the Invalid verdict (a restart may apply it again)");
        }
    }

    /// The `Invalid` outcome this node already reached for exactly `t` (revision and retry), from the state
    /// dir: after a restart it is reported again, and `t` is not applied a second time. The kernel runs
    /// the last good config (the verdict's rollback, or the restore at start).
    pub fn rejected_outcome(&self, t: &Target) -> Option<Outcome> {
        let r = self.state.rejected().ok().flatten();
        if !verdict_applies(r.as_ref(), t) {
            return None;
        }
        let r = r?;
        let last_good = self.last_good().ok().flatten();
        Some(Outcome::invalid(
            &r.revision,
            r.retry,
            Reason::parse(&r.reason).unwrap_or(Reason::ApplyFailed),
            r.message,
            (
                last_good.as_ref().map(|l| l.config_hash.clone()),
                last_good.map(|l| l.revision),
            ),
        ))
    }

    /// An apply in three stages, each passing the next what it found: [`Agent::preflight`] (refusals
    /// before any change), [`Agent::change`] (the marker, the kernel, FRR), [`Agent::judge`] (probes;
    /// the last good config back on any failure).
    async fn apply_unrecorded(&self, t: &Target) -> Outcome {
        let last_good = self.last_good().ok().flatten();
        let running = (
            last_good.as_ref().map(|l| l.config_hash.clone()),
            last_good.map(|l| l.revision),
        );
        let invalid = |reason: Reason, detail: String| {
            Outcome::invalid(
                &t.revision,
                t.retry,
                reason,
                format!("{reason}: {detail}"),
                running.clone(),
            )
        };
        let prepared = match self.preflight(t).await {
            Ok(p) => p,
            Err((reason, detail)) => return invalid(reason, detail),
        };
        let changed = match self.change(t, prepared, false).await {
            Ok(c) => c,
            Err((reason, detail)) => return invalid(reason, detail),
        };
        self.judge(t, changed, running.1).await
    }

    /// Stage 1: everything that can refuse `t` before the node changes. The config must give a
    /// dataplane; FRR (when on) must accept its text in a dry run, and when off the config must have no
    /// BGP content; the kernel must have every feature the config uses; the diff against the kernel must
    /// be computable; zebra must say which new L3 VNIs it has not bound yet.
    pub(crate) async fn preflight<'a>(
        &'a self,
        t: &Target,
    ) -> Result<Prepared<'a>, (Reason, String)> {
        let want = self
            .dataplane(&t.config)
            .map_err(|e| (Reason::InvalidConfig, e))?;
        // FRR before the kernel's own refusals: both change nothing, and FRR's answer is the one that
        // holds on every kernel.
        let mut frr_timings = FrrTimings::default();
        let frr = match &self.frr {
            None => {
                let content = bgp_content(&t.config);
                if !content.is_empty() {
                    return Err((
                        Reason::FrrUnavailable,
                        format!(
                            "FRR is off on this node (no --frr-config) and the config has BGP \
                             content: {}",
                            content.join("; ")
                        ),
                    ));
                }
                None
            }
            Some(frr) => {
                let start = Instant::now();
                let text = frr
                    .render(&t.config)
                    .map_err(|e| (Reason::InvalidConfig, format!("FRR: {e}")))?;
                frr_timings.render = start.elapsed();
                let start = Instant::now();
                match frr.check(&text).await {
                    Ok(()) => {}
                    Err(FrrApplyError::Rejected { detail }) => {
                        return Err((Reason::FrrRejected, detail));
                    }
                    // FRR's tools cannot run (not installed, config dir not writable): not a verdict
                    // on the config.
                    Err(e) => {
                        return Err((Reason::FrrUnavailable, format!("checking with FRR: {e}")));
                    }
                }
                frr_timings.check = start.elapsed();
                Some((frr, text))
            }
        };
        let missing = missing_features(&want, &self.caps);
        if !missing.is_empty() {
            let names: Vec<&str> = missing.iter().map(|f| f.name()).collect();
            return Err((
                Reason::KernelUnsupported,
                format!("this kernel does not support {}", names.join(", ")),
            ));
        }
        let kernel = self
            .netlink
            .observe()
            .await
            .map_err(|e| (Reason::ApplyFailed, format!("observe: {e}")))?;
        netwave_core::dataplane::diff::diff(&want, &kernel.observed)
            .map_err(|e| (Reason::ApplyFailed, e.to_string()))?;
        let hold = match &frr {
            Some((frr, _)) => frr.l3_vni_hold(&t.config).await.map_err(|e| {
                (
                    Reason::FrrUnavailable,
                    format!("asking zebra for its L3 VNIs: {e}"),
                )
            })?,
            None => Vec::new(),
        };
        Ok(Prepared {
            want,
            frr,
            frr_timings,
            hold,
            kernel,
        })
    }

    /// Stage 2: the change. The probes that pass now gate the change; the applying marker is written
    /// ahead (so a crash mid-way is recovered); the kernel is reconciled, then FRR (zebra learns VXLAN
    /// devices and VRFs from the kernel). `Err` only when the marker cannot be written: nothing changed.
    pub(crate) async fn change(
        &self,
        t: &Target,
        p: Prepared<'_>,
        upgrade: bool,
    ) -> Result<Changed, (Reason, String)> {
        let before = self.prober.run_once(&Default::default()).await;
        let gate = gating(&before);
        // Carry over how often this very apply was interrupted before (see `recover`).
        let interruptions = self
            .state
            .interrupted()
            .ok()
            .flatten()
            .filter(|i| i.revision == t.revision && i.retry == t.retry)
            .map_or(0, |i| i.interruptions);
        // Written ahead: if the agent dies between creating a link and marking it, recovery knows
        // the unmarked link is its own.
        let creating = self.may_create_in(&p.want, &p.kernel);
        self.state
            .mark_applying(&Applying {
                revision: t.revision.clone(),
                retry: t.retry,
                config_hash: t.config_hash.clone(),
                interruptions,
                creating,
                upgrade,
            })
            .map_err(|e| (Reason::ApplyFailed, format!("writing applying marker: {e}")))?;

        let writes_before = self.netlink.writes();
        let rendering =
            crate::backup::rendering_digest(&p.want, p.frr.as_ref().map(|(_, t)| t.as_str()));
        let start = Instant::now();
        // New L3 VNIs: their VRF bridges are created (or set) down and only come up once zebra has
        // bound the VNI (the FRR step brings them up); the kernel then runs `want`.
        let mut first = p.want.clone();
        for (bridge, _) in &p.hold {
            if let Some(link) = first.links.get_mut(bridge) {
                link.up = false;
            }
        }
        let kernel = self.netlink.reconcile_from(&first, p.kernel).await;
        let mut timings = ApplyTimings {
            netlink: start.elapsed(),
            frr: None,
        };
        let result = match (kernel, &p.frr) {
            (Ok(report), Some((frr, text))) => {
                match frr.apply(text, &p.hold, &self.netlink).await {
                    Ok(steps) => {
                        timings.frr = Some(FrrTimings {
                            render: p.frr_timings.render,
                            check: p.frr_timings.check,
                            ..steps
                        });
                        Ok(report.applied.len())
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, category = e.category(), "FRR apply failed");
                        Err((Reason::FrrReloadFailed, e.to_string(), report.applied.len()))
                    }
                }
            }
            (Ok(report), None) => Ok(report.applied.len()),
            (Err(e), _) => Err((Reason::ApplyFailed, e.to_string(), 0)),
        };
        self.timings.set(timings);
        Ok(Changed {
            result,
            timings,
            gate,
            writes_before,
            rendering,
        })
    }

    /// Stage 3: the verdict. After the settle time the gating probes must pass again; then `t` is the
    /// last good config. Any failure (of the change or of a probe) restores the last good config
    /// (`last_good_revision` names it, for the outcome when the restore cannot).
    pub(crate) async fn judge(
        &self,
        t: &Target,
        c: Changed,
        last_good_revision: Option<String>,
    ) -> Outcome {
        let applied_at = Instant::now();
        let (failure, probes, applied) = match c.result {
            Err((reason, detail, n)) => (Some((reason, detail)), Vec::new(), n),
            Ok(n) => {
                tokio::time::sleep(self.prober.cfg.settle()).await;
                let mut after = self.prober.run_until_healthy(&c.gate).await;
                let mut fail = first_gating_failure(&after).map(|r| {
                    (
                        Reason::HealthCheckFailed,
                        format!("{}: {}", r.name, r.message.as_deref().unwrap_or("failed")),
                    )
                });
                if fail.is_none() {
                    let peerings = self.peerings_established(&t.config, applied_at).await;
                    fail = first_gating_failure(&peerings).map(|r| {
                        (
                            Reason::HealthCheckFailed,
                            format!("{}: {}", r.name, r.message.as_deref().unwrap_or("failed")),
                        )
                    });
                    after.extend(peerings);
                }
                if fail.is_none() {
                    let mirrors = self.mirrors_in_place(&t.config).await;
                    fail = first_gating_failure(&mirrors).map(|r| {
                        (
                            Reason::HealthCheckFailed,
                            format!("{}: {}", r.name, r.message.as_deref().unwrap_or("failed")),
                        )
                    });
                    after.extend(mirrors);
                }
                if fail.is_none() {
                    let fabric = self.underlay_established(&t.config, applied_at).await;
                    fail = first_gating_failure(&fabric).map(|r| {
                        (
                            Reason::HealthCheckFailed,
                            format!("{}: {}", r.name, r.message.as_deref().unwrap_or("failed")),
                        )
                    });
                    after.extend(fabric);
                }
                (fail, after, n)
            }
        };
        let writes = self.netlink.writes() - c.writes_before;

        let Some((reason, detail)) = failure else {
            let saved = self.state.save_last_good(&LastGood {
                revision: t.revision.clone(),
                config_hash: t.config_hash.clone(),
                config: t.config.clone(),
            });
            let _ = self.state.clear_applying();
            let _ = self.state.clear_interrupted();
            // This agent's rendering passed the gate: nothing is held any more, and it is what runs.
            let _ = self.state.clear_held();
            let _ = self.state.save_rendered(&crate::backup::Rendered {
                revision: t.revision.clone(),
                config_hash: t.config_hash.clone(),
                rendering: c.rendering.clone(),
            });
            let mut note = match saved {
                Ok(()) => String::new(),
                Err(e) => format!("; backup not written: {e}"),
            };
            if let Some(f) = c.timings.frr {
                let frr = if f.reload.is_zero() {
                    "FRR already ran this config".to_string()
                } else {
                    format!("reload {} ms", f.reload.as_millis())
                };
                note = format!(
                    " in {} ms; FRR config applied in {} ms ({frr}){note}",
                    c.timings.netlink.as_millis(),
                    f.total().as_millis(),
                );
            }
            return Outcome::provisioned(
                &t.revision,
                t.retry,
                &t.config_hash,
                format!("applied {applied} operations{note}"),
            )
            .with_work(applied, writes, probes);
        };

        let restore = self.restore().await;
        let _ = self.prober.run_once(&c.gate).await;
        let _ = self.state.clear_applying();
        let _ = self.state.clear_interrupted();
        let (running_hash, restored) = restore.running_state();
        Outcome::invalid(
            &t.revision,
            t.retry,
            reason,
            format!("{reason}: {detail}; {}", restore.note),
            (running_hash, restored.or(last_good_revision)),
        )
        .with_work(applied, writes, probes)
        .rolled_back()
    }

    /// The health gate of the config's mirrors (`netwave_core::dataplane::mirror_health`): each
    /// tunnel up in its VRF with its source address there, each selector's filters in place. Always
    /// gating (a mirror is what the revision promises); one kernel read, after the probes passed.
    async fn mirrors_in_place(&self, config: &NodeConfig) -> Vec<ProbeResult> {
        if config.mirror_tunnels.is_empty() && config.mirrors.is_empty() {
            return Vec::new();
        }
        let started = Instant::now();
        let seen = match (
            self.netlink.observe().await,
            self.netlink.link_states().await,
        ) {
            (Ok(snap), Ok(states)) => Ok((
                snap,
                states
                    .into_iter()
                    .filter(|(_, up)| *up)
                    .map(|(n, _)| n)
                    .collect::<BTreeSet<String>>(),
            )),
            (Err(e), _) | (_, Err(e)) => Err(e.to_string()),
        };
        let checks = match &seen {
            Ok((snap, up)) => netwave_core::dataplane::mirror_health(
                config,
                self.netlink.settings(),
                &snap.observed.managed,
                up,
            ),
            Err(e) => vec![netwave_core::dataplane::MirrorCheck {
                name: "mirror".into(),
                problem: Some(format!("reading the kernel: {e}")),
            }],
        };
        let seconds = (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
        checks
            .into_iter()
            .map(|c| ProbeResult {
                name: c.name,
                gating: true,
                result: if c.problem.is_none() {
                    crate::health::PASSED
                } else {
                    crate::health::FAILED
                }
                .into(),
                message: c.problem,
                duration_seconds: Some(seconds),
            })
            .collect()
    }

    /// The health gate of the config's BGPPeerings: every session must reach Established within its
    /// hold time of the apply (`netwave_core::frr::peering_sessions`), whatever it was before (a new
    /// peering has no earlier state to gate on: it is what the revision promises). One probe result
    /// per session, always gating, its duration the time to Established; FRR is asked once per VRF
    /// and round, every 200 ms. Without FRR there is nothing to ask (and no such config is applied).
    async fn peerings_established(
        &self,
        config: &NodeConfig,
        applied_at: Instant,
    ) -> Vec<ProbeResult> {
        let sessions = netwave_core::frr::peering_sessions(config);
        let Some(frr) = self.frr.as_ref().filter(|_| !sessions.is_empty()) else {
            return Vec::new();
        };
        let name = |s: &netwave_core::frr::PeeringSession| {
            let vrf = if s.vrf == "default" {
                String::new()
            } else {
                format!(" vrf {}", s.vrf)
            };
            format!("bgp-peering {} {}{vrf}", s.peering, s.session)
        };
        let mut results: Vec<Option<ProbeResult>> = vec![None; sessions.len()];
        loop {
            let mut shown: BTreeMap<&str, Result<String, String>> = BTreeMap::new();
            for (i, s) in sessions.iter().enumerate() {
                if results[i]
                    .as_ref()
                    .is_some_and(|r| r.result == crate::health::PASSED)
                {
                    continue;
                }
                let answer = match shown.get(s.vrf.as_str()) {
                    Some(a) => a.clone(),
                    None => {
                        let a = frr.bgp_neighbors(&s.vrf).await.map_err(|e| e.to_string());
                        shown.insert(&s.vrf, a.clone());
                        a
                    }
                };
                let verdict =
                    answer.and_then(|text| crate::health::peering_session(&text, &s.session));
                let elapsed = applied_at.elapsed();
                let within = Duration::from_secs(u64::from(s.within_seconds));
                let message = match &verdict {
                    Ok(()) => None,
                    Err(why) if elapsed >= within => Some(format!(
                        "not Established within its hold time ({} s) of the apply: {why}",
                        s.within_seconds
                    )),
                    Err(_) => continue,
                };
                results[i] = Some(session_result(name(s), &verdict, message, elapsed));
                if verdict.is_ok() {
                    tracing::info!(
                        peering = %s.peering,
                        session = %s.session,
                        vrf = %s.vrf,
                        seconds = elapsed.as_secs_f64(),
                        "BGPPeering session Established"
                    );
                }
            }
            if results.iter().all(Option::is_some) {
                return results.into_iter().flatten().collect();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The health gate of an underlay change (#47): when the config's underlay (an Underlay input's,
    /// `spec.config.underlay`) differs from the one the node ran (its last good config's; the bootstrap
    /// `--frr-config` when either has none), every neighbour of the new one must be Established within
    /// its hold time of the apply (at least 10 s: FRR connects at once, and a session needs a few
    /// round trips). A wrong neighbour address, ASN or interface then fails the node, which goes back
    /// to its last good config and so to the underlay it ran. An unchanged underlay adds no probe
    /// (the health settings' `bgpPeers` gate on sessions that were up). One result per neighbour.
    async fn underlay_established(
        &self,
        config: &NodeConfig,
        applied_at: Instant,
    ) -> Vec<ProbeResult> {
        let Some(frr) = self.frr.as_ref() else {
            return Vec::new();
        };
        let before = (self.last_good().ok().flatten()).and_then(|lg| lg.config.underlay);
        let Some((peers, within)) =
            netwave_core::frr::underlay_sessions(config, before.as_ref(), frr.underlay())
        else {
            return Vec::new();
        };
        let within = Duration::from_secs(within);
        let mut results: Vec<Option<ProbeResult>> = vec![None; peers.len()];
        loop {
            let summary = frr.bgp_summary().await.map_err(|e| e.to_string());
            let elapsed = applied_at.elapsed();
            for (i, peer) in peers.iter().enumerate() {
                if results[i].is_some() {
                    continue;
                }
                let verdict = (summary.clone()).and_then(|s| crate::health::bgp_session(&s, peer));
                let message = match &verdict {
                    Ok(()) => None,
                    Err(why) if elapsed >= within => Some(format!(
                        "not Established within {} s of the underlay change: {why}",
                        within.as_secs()
                    )),
                    Err(_) => continue,
                };
                results[i] = Some(session_result(
                    format!("bgp-underlay {peer}"),
                    &verdict,
                    message,
                    elapsed,
                ));
            }
            if results.iter().all(Option::is_some) {
                return results.into_iter().flatten().collect();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Puts the last good config back (or removes every managed object when there is none yet). A corrupt
    /// backup is never applied: the kernel is left as it is and the note says so.
    async fn restore(&self) -> Restore {
        let (cfg, hash, rev) = match self.last_good() {
            Ok(Some(lg)) => (lg.config, lg.config_hash, lg.revision),
            Ok(None) => (NodeConfig::default(), String::new(), String::new()),
            Err(e) => {
                return Restore {
                    running: None,
                    note: format!("nothing restored: {e}"),
                };
            }
        };
        let what = if rev.is_empty() {
            "no last good config yet: removed every netwave object".to_string()
        } else {
            format!("restored last good revision {rev}")
        };
        let (result, frr) = match self.running_rendering(&cfg, &rev, &hash) {
            Err(e) => (Err(e), Ok(())),
            Ok((dp, text)) => {
                let result = self.netlink.reconcile(&dp).await.map_err(|e| e.to_string());
                // FRR too, whatever the kernel's restore did: FRR may be half-way through the failed
                // config. No bridge held: the last good config's L3 VNIs are the ones zebra had.
                let frr = match (&self.frr, text) {
                    (Some(frr), Some(text)) => frr
                        .apply(&text, &[], &self.netlink)
                        .await
                        .map(drop)
                        .map_err(|e| e.to_string()),
                    _ => Ok(()),
                };
                (result, frr)
            }
        };
        match (result, frr) {
            (Ok(_), Ok(())) => Restore {
                running: (!rev.is_empty()).then_some((hash, rev)),
                note: if self.frr.is_some() {
                    format!("{what} (kernel and FRR)")
                } else {
                    what
                },
            },
            (Err(e), _) => Restore {
                running: None,
                note: format!("restore failed: {e}"),
            },
            (Ok(_), Err(e)) => {
                tracing::error!(error = %e, "restoring the last good FRR config failed (drift repair retries)");
                Restore {
                    running: None,
                    note: format!("{what} in the kernel; FRR restore failed: {e}"),
                }
            }
        }
    }

    /// At start: if an apply was interrupted (marker present), restore the last good config first.
    ///
    /// A first interruption is not a verdict on the config (the agent may have been OOM-killed or the
    /// node rebooted): it is recorded and `None` is returned, so the assigned revision is applied again.
    /// When the same revision (and retry) is interrupted [`MAX_INTERRUPTIONS`] times, the config itself
    /// is suspect: the outcome is `Invalid` with `ApplyInterrupted`.
    pub async fn recover(&self) -> Result<Option<Outcome>, BackupError> {
        let Some(marker) = self.state.applying()? else {
            return Ok(None);
        };
        match self.netlink.adopt(&marker.creating).await {
            Ok(adopted) if !adopted.is_empty() => tracing::warn!(
                links = ?adopted,
                "the interrupted apply had created these links without marking them; they are the agent's again"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "adopting links of the interrupted apply failed"),
        }
        let restore = self.restore().await;
        if marker.upgrade {
            // An agent upgrade's gated apply of the running config: no verdict on the revision. What
            // the node ran is back (held); the gate runs again (`upgrade_gate`).
            self.state.clear_applying()?;
            tracing::warn!(
                revision = %marker.revision,
                restore = %restore.note,
                "this agent's gated apply of its own rendering was interrupted; restored what the node ran, the gate runs again"
            );
            return Ok(None);
        }
        match after_interruption(&marker) {
            AfterInterruption::Retry { interruptions } => {
                self.state.save_interrupted(&Applying {
                    interruptions,
                    ..marker.clone()
                })?;
                self.state.clear_applying()?;
                tracing::warn!(
                    revision = %marker.revision,
                    interruptions,
                    restore = %restore.note,
                    "an apply was interrupted; restored the last good config and will apply again"
                );
                Ok(None)
            }
            AfterInterruption::Judge { interruptions } => {
                self.state.clear_applying()?;
                self.state.clear_interrupted()?;
                Ok(Some(self.interrupted_outcome(
                    &marker,
                    interruptions,
                    restore,
                )))
            }
        }
    }

    fn interrupted_outcome(
        &self,
        marker: &Applying,
        interruptions: u32,
        restore: Restore,
    ) -> Outcome {
        let reason = Reason::ApplyInterrupted;
        let outcome = Outcome::invalid(
            &marker.revision,
            marker.retry,
            reason,
            format!(
                "{reason}: the agent stopped while applying revision {} ({interruptions} times); {}",
                marker.revision, restore.note
            ),
            restore.running_state(),
        )
        .rolled_back();
        self.record_verdict(&outcome);
        outcome
    }

    /// Drift repair: bring the kernel and FRR back to the config they should be running (the last good
    /// one). Returns what had drifted (empty: nothing). A corrupt backup is an error, never applied.
    ///
    /// What the node ran, never a new rendering: while one is held (an agent upgrade whose rendering
    /// has not passed the gate), the held kernel objects and FRR text.
    pub async fn repair_drift(&self) -> Result<DriftReport, DriftError> {
        let lg = self.last_good().map_err(DriftError::Backup)?;
        let first_start = lg.is_none();
        let (cfg, rev, hash) = lg
            .map(|l| (l.config, l.revision, l.config_hash))
            .unwrap_or_default();
        let (dp, text) = self
            .running_rendering(&cfg, &rev, &hash)
            .map_err(DriftError::Config)?;
        let mut report = DriftReport {
            netlink: self.netlink.reconcile(&dp).await?,
            frr: None,
            frr_baseline: None,
        };
        let (Some(frr), Some(text)) = (&self.frr, text) else {
            return Ok(report);
        };
        let Some(diff) = frr.drifted(&text).await.map_err(DriftError::Frr)? else {
            return Ok(report);
        };
        frr.reapply(&text, &self.netlink)
            .await
            .map_err(DriftError::Frr)?;
        if first_start {
            report.frr_baseline = Some(diff);
        } else {
            report.frr = Some(diff);
        }
        Ok(report)
    }

    /// Records `t` as last good without touching the kernel (the fast path: same configHash).
    pub fn record_fast_path(&self, t: &Target) -> Result<(), BackupError> {
        self.state.save_last_good(&LastGood {
            revision: t.revision.clone(),
            config_hash: t.config_hash.clone(),
            config: t.config.clone(),
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DriftError {
    #[error(transparent)]
    Backup(BackupError),
    #[error("last good config: {0}")]
    Config(String),
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    #[error("FRR: {0}")]
    Frr(#[source] FrrApplyError),
}

impl DriftError {
    pub fn category(&self) -> &'static str {
        match self {
            DriftError::Backup(_) => "backup",
            DriftError::Config(_) => "config",
            DriftError::Netlink(e) => e.category(),
            DriftError::Frr(e) => e.category(),
        }
    }
}

/// A gating probe result of a BGP session: passed or failed (`message` says why), its duration the
/// time since the apply.
fn session_result(
    name: String,
    verdict: &Result<(), String>,
    message: Option<String>,
    elapsed: Duration,
) -> ProbeResult {
    let result = if verdict.is_ok() {
        crate::health::PASSED
    } else {
        crate::health::FAILED
    };
    ProbeResult {
        name,
        gating: true,
        result: result.into(),
        message,
        duration_seconds: Some((elapsed.as_secs_f64() * 1000.0).round() / 1000.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config told apart by `label`.
    fn config(label: &str) -> NodeConfig {
        NodeConfig {
            rules: vec![netwave_api::RuleConfig {
                priority: 100,
                table: 100,
                from: None,
                to: None,
                iif: Some(label.into()),
                fwmark: None,
                fwmask: None,
            }],
            ..NodeConfig::default()
        }
    }

    /// The configHash of [`config`]`(label)`.
    fn h(label: &str) -> String {
        netwave_core::render::config_hash(&config(label))
    }

    fn spec(rev: &str, retry: u32, label: &str) -> NodeNetworkConfigSpec {
        NodeNetworkConfigSpec {
            revision: rev.into(),
            sequence: 1,
            config_hash: h(label),
            retry,
            config: config(label),
        }
    }

    fn status(phase: &str, rev: &str, retry: u32) -> NodeNetworkConfigStatus {
        NodeNetworkConfigStatus {
            phase: Some(phase.into()),
            observed_revision: Some(rev.into()),
            observed_retry: Some(retry),
            ..Default::default()
        }
    }

    #[test]
    fn invalid_revision_is_not_reapplied_until_retry_changes() {
        let st = status(INVALID, "r2", 0);
        assert_eq!(
            decide(&spec("r2", 0, "h2"), Some(&st), Some(h("h1").as_str())),
            Decision::SkipInvalid
        );
        assert_eq!(
            decide(&spec("r2", 1, "h2"), Some(&st), Some(h("h1").as_str())),
            Decision::Apply
        );
        // A newer revision is applied even though the previous one was invalid.
        assert_eq!(
            decide(&spec("r3", 0, "h3"), Some(&st), Some(h("h1").as_str())),
            Decision::Apply
        );
    }

    #[test]
    fn a_config_re_rendered_under_an_invalid_revision_is_applied() {
        // Judged Invalid for r2's config h2; a Node label change re-renders r2 as h2b, same retry.
        let st = NodeNetworkConfigStatus {
            observed_config_hash: Some(h("h2")),
            ..status(INVALID, "r2", 0)
        };
        assert_eq!(
            decide(&spec("r2", 0, "h2"), Some(&st), Some(h("h1").as_str())),
            Decision::SkipInvalid
        );
        assert_eq!(
            decide(&spec("r2", 0, "h2b"), Some(&st), Some(h("h1").as_str())),
            Decision::Apply
        );
    }

    #[test]
    fn a_placeholder_is_never_applied() {
        let queued = NodeNetworkConfigSpec::placeholder();
        assert_eq!(decide(&queued, None, None), Decision::Unassigned);
        assert_eq!(
            decide(&queued, None, Some(h("h1").as_str())),
            Decision::Unassigned
        );
    }

    #[test]
    fn a_config_that_does_not_match_its_hash_is_refused_once_and_applied_once_put_back() {
        let good = spec("r2", 0, "h2");
        let mut edited = good.clone();
        edited.config.rules[0].from = Some("198.18.0.0/24".into());
        let Decision::Tampered { actual } = decide(&edited, None, Some(h("h1").as_str())) else {
            panic!("an edited config is refused");
        };
        assert_eq!(actual, netwave_core::render::config_hash(&edited.config));
        // Reported: nothing more to do while it stays edited …
        let mut st = status(INVALID, "r2", 0);
        st.reason = Some(Reason::ConfigTampered.as_str().into());
        assert_eq!(
            decide(&edited, Some(&st), Some(h("h1").as_str())),
            Decision::StillTampered
        );
        // … and once put back it is applied: the refusal was no verdict on the revision.
        assert_eq!(
            decide(&good, Some(&st), Some(h("h1").as_str())),
            Decision::Apply
        );
        // The same revision judged Invalid on its merits stays skipped.
        st.reason = Some(Reason::ApplyFailed.as_str().into());
        assert_eq!(
            decide(&good, Some(&st), Some(h("h1").as_str())),
            Decision::SkipInvalid
        );
    }

    /// A corrupt backup refuses every spec, reported once per revision, retry and config (not on
    /// every watch event or drift tick); the refusal is no verdict, so once the backup is repaired the
    /// same revision is applied.
    #[test]
    fn a_corrupt_backup_refuses_once_per_attempt_and_is_no_verdict_on_the_revision() {
        let r2 = spec("r2", 0, "h2");
        assert_eq!(
            decide(&r2, None, Running::BackupCorrupt),
            Decision::BackupCorrupt
        );
        // Provisioned before the backup broke: still refused (the kernel cannot be rolled back).
        let st = status(PROVISIONED, "r2", 0);
        assert_eq!(
            decide(&r2, Some(&st), Running::BackupCorrupt),
            Decision::BackupCorrupt
        );
        let mut refused = status(INVALID, "r2", 0);
        refused.reason = Some(Reason::BackupCorrupt.as_str().into());
        refused.observed_config_hash = Some(h("h2"));
        assert_eq!(
            decide(&r2, Some(&refused), Running::BackupCorrupt),
            Decision::StillBackupCorrupt
        );
        // A new attempt or a new config is refused (and reported) again …
        assert_eq!(
            decide(&spec("r2", 1, "h2"), Some(&refused), Running::BackupCorrupt),
            Decision::BackupCorrupt
        );
        assert_eq!(
            decide(&spec("r3", 0, "h3"), Some(&refused), Running::BackupCorrupt),
            Decision::BackupCorrupt
        );
        // … a placeholder is nothing to refuse …
        assert_eq!(
            decide(
                &NodeNetworkConfigSpec::placeholder(),
                None,
                Running::BackupCorrupt
            ),
            Decision::Unassigned
        );
        // … and once the file is moved aside (no last good config) r2 is applied, not skipped.
        assert_eq!(decide(&r2, Some(&refused), None), Decision::Apply);
        // A refusal for another reason stays a verdict.
        refused.reason = Some(Reason::HealthCheckFailed.as_str().into());
        assert_eq!(decide(&r2, Some(&refused), None), Decision::SkipInvalid);
    }

    #[test]
    fn an_interrupted_apply_is_retried_once_then_judged() {
        let marker = |revision: &str, interruptions| Applying {
            revision: revision.into(),
            retry: 0,
            config_hash: "h".into(),
            interruptions,
            creating: Vec::new(),
            upgrade: false,
        };
        assert_eq!(
            after_interruption(&marker("r2", 0)),
            AfterInterruption::Retry { interruptions: 1 }
        );
        assert_eq!(
            after_interruption(&marker("r2", 1)),
            AfterInterruption::Judge { interruptions: 2 }
        );
        // A marker from a start-up restore names no revision: nothing to retry.
        assert_eq!(
            after_interruption(&marker("", 0)),
            AfterInterruption::Judge { interruptions: 1 }
        );
    }

    #[test]
    fn a_verdict_from_before_a_restart_answers_only_its_revision_and_retry() {
        let rejected = Rejected {
            revision: "r2".into(),
            retry: 1,
            reason: Reason::HealthCheckFailed.as_str().into(),
            message: String::new(),
        };
        let target = |rev: &str, retry| Target::from(&spec(rev, retry, "h2"));
        assert!(verdict_applies(Some(&rejected), &target("r2", 1)));
        assert!(
            !verdict_applies(Some(&rejected), &target("r2", 2)),
            "retry bumped"
        );
        assert!(
            !verdict_applies(Some(&rejected), &target("r3", 1)),
            "another revision"
        );
        assert!(!verdict_applies(None, &target("r2", 1)));
    }

    #[test]
    fn same_hash_takes_the_fast_path_and_provisioned_is_up_to_date() {
        assert_eq!(
            decide(&spec("r2", 0, "h1"), None, Some(h("h1").as_str())),
            Decision::FastPath
        );
        let st = status(PROVISIONED, "r2", 0);
        assert_eq!(
            decide(&spec("r2", 0, "h1"), Some(&st), Some(h("h1").as_str())),
            Decision::UpToDate
        );
        // Reported Provisioned but the kernel runs something else (e.g. restored after a crash).
        assert_eq!(
            decide(&spec("r2", 0, "h2"), Some(&st), Some(h("h1").as_str())),
            Decision::Apply
        );
        assert_eq!(decide(&spec("r1", 0, "h1"), None, None), Decision::Apply);
    }
}
