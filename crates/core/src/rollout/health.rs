//! A rollout's health in the words generic tools read (kstatus: `Ready`, `Reconciling`, `Stalled`;
//! the table is in [`netwave_api::vocab::kstatus`]). One rule for the revision's own conditions and for
//! the input objects it carries, so `kubectl wait --for=condition=Ready`, Flux, cli-utils and Argo CD
//! agree with `kubectl netwave status`.
//!
//! ```text
//!   revision status (phase, Paused, Progressing) ──of_revision──► Verdict { health, reason, message }
//!   node config (spec, agent's status)     ──of_node─────► Verdict
//!   Verdict + old conditions + generation ──conditions──► Ready, Reconciling, Stalled
//! ```

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use netwave_api::vocab::{NodePhase, kstatus};
use netwave_api::{NetworkConfigRevisionStatus, NodeNetworkConfigSpec, NodeNetworkConfigStatus};

use super::vocab::{ConditionStatus, ConditionType, Phase, reasons};
use crate::types::Timestamp;

/// Where a rollout stands, for tools that know nothing of netwave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// Complete: `Ready=True`.
    Ready,
    /// Moving (or about to): `Reconciling=True`.
    Reconciling,
    /// Cannot go on until someone acts (failed, held, paused, past its deadline): `Stalled=True`.
    Stalled,
    /// Nothing to do and nothing to wait for (a superseded revision): none of the three conditions
    /// (kstatus reads `Ready=False` as in progress), so kstatus says `Current`.
    Idle,
}

/// A health, the reason word of its conditions and what the rollout says about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub health: Health,
    pub reason: &'static str,
    pub message: String,
}

/// Progressing reasons that mean the rollout cannot go on by itself.
const STALLED_PROGRESSING: [&str; 3] = [
    reasons::PROGRESS_DEADLINE_EXCEEDED,
    reasons::INVALID_POLICY,
    reasons::VALIDATION_FAILED,
];

/// The health of a revision from its status as written (`None`: no status yet).
pub fn of_revision(status: Option<&NetworkConfigRevisionStatus>) -> Verdict {
    let verdict = |health, reason, message: &str| Verdict {
        health,
        reason,
        message: message.to_string(),
    };
    let Some(st) = status else {
        return verdict(
            Health::Reconciling,
            kstatus::PENDING,
            "the configurator has not started its rollout yet",
        );
    };
    let condition = |t: ConditionType| st.conditions.iter().find(|c| c.type_ == t.as_str());
    let message = st.message.as_deref().unwrap_or_default();
    match Phase::parse(st.phase.as_deref()) {
        None => verdict(
            Health::Reconciling,
            kstatus::PENDING,
            "the configurator has not started its rollout yet",
        ),
        Some(Phase::Complete) => verdict(Health::Ready, reasons::ROLLOUT_COMPLETE, message),
        // Why it failed (not the rollback's progress, which the status message goes on to count).
        Some(Phase::Failed) => verdict(
            Health::Stalled,
            reasons::REVISION_FAILED,
            condition(ConditionType::Progressing).map_or(message, |c| c.message.as_str()),
        ),
        Some(Phase::Superseded) => verdict(Health::Idle, reasons::SUPERSEDED, message),
        Some(Phase::Pending | Phase::Progressing) => {
            if let Some(p) = condition(ConditionType::Paused)
                .filter(|c| c.status == ConditionStatus::True.as_str())
            {
                let reason = if p.reason == reasons::DESTRUCTIVE_CHANGE {
                    reasons::DESTRUCTIVE_CHANGE
                } else {
                    reasons::ROLLOUT_PAUSED
                };
                return verdict(Health::Stalled, reason, &p.message);
            }
            let progressing = condition(ConditionType::Progressing);
            let stalled = progressing.and_then(|c| {
                (c.status == ConditionStatus::False.as_str())
                    .then(|| STALLED_PROGRESSING.into_iter().find(|r| *r == c.reason))
                    .flatten()
            });
            match stalled {
                Some(reason) => verdict(Health::Stalled, reason, message),
                None if progressing.is_some_and(|c| c.reason == reasons::CANARY_BAKE) => {
                    verdict(Health::Reconciling, reasons::CANARY_BAKE, message)
                }
                None => verdict(Health::Reconciling, reasons::ROLLOUT_PROGRESSING, message),
            }
        }
    }
}

/// The health of one node config from its agent's status, as the agent writes it beside that status:
/// ready once the agent reports `Provisioned` for this very config (revision, retry and config hash),
/// reconciling while it applies it or has not reported on it yet, stalled when it refused it or
/// rolled it back (`Invalid`: the node runs its last good config until the configurator assigns
/// another). A placeholder holds no config: nothing to wait for.
pub fn of_node(spec: &NodeNetworkConfigSpec, status: &NodeNetworkConfigStatus) -> Verdict {
    let verdict = |health, reason, message: String| Verdict {
        health,
        reason,
        message,
    };
    if spec.is_placeholder() {
        return verdict(Health::Idle, kstatus::PENDING, String::new());
    }
    let answers = status.observed_revision.as_deref() == Some(spec.revision.as_str())
        && status.observed_retry == Some(spec.retry)
        && status.observed_config_hash.as_deref() == Some(spec.config_hash.as_str());
    let revision = &spec.revision;
    match NodePhase::parse(status.phase.as_deref().unwrap_or_default()).filter(|_| answers) {
        Some(NodePhase::Provisioned) => verdict(
            Health::Ready,
            NodePhase::Provisioned.as_str(),
            format!("runs revision {revision}"),
        ),
        Some(NodePhase::Invalid) => {
            let why = status.reason.as_deref().unwrap_or("refused");
            let what = status.message.as_deref().unwrap_or_default();
            verdict(
                Health::Stalled,
                NodePhase::Invalid.as_str(),
                netwave_api::bounds::truncate(
                    &format!("revision {revision}: {why}: {what}"),
                    netwave_api::bounds::FAILED_NODE_MESSAGE_MAX,
                ),
            )
        }
        Some(NodePhase::Provisioning) => verdict(
            Health::Reconciling,
            NodePhase::Provisioning.as_str(),
            format!("applying revision {revision}"),
        ),
        None => verdict(
            Health::Reconciling,
            kstatus::PENDING,
            format!("revision {revision} is assigned; its agent has not reported on it yet"),
        ),
    }
}

/// `v` as the input objects of `revision` carry it: while it rolls out (from before it starts to its
/// canary bake) and once it is complete, one reason and a message that do not change with every node,
/// else each input's status would be written again at every step of the rollout; why it stalled as the
/// revision says it. So a rollout costs two status writes per input object: rolling, then ready.
pub fn for_input(v: &Verdict, revision: &str) -> Verdict {
    let (reason, message) = match v.health {
        Health::Reconciling => (
            reasons::ROLLOUT_PROGRESSING,
            format!("{revision} is rolling out (`kubectl netwave status {revision}` follows it)"),
        ),
        Health::Ready => (v.reason, format!("{revision} runs on every eligible node")),
        Health::Stalled | Health::Idle => (v.reason, v.message.clone()),
    };
    Verdict {
        health: v.health,
        reason,
        message,
    }
}

/// The condition types this module writes.
pub const TYPES: [&str; 3] = [kstatus::READY, kstatus::RECONCILING, kstatus::STALLED];

/// The kstatus conditions of `v`, in the order `Ready`, `Reconciling`, `Stalled`: the one the health
/// names `True`, the others `False`, all with `v`'s reason and message; none for [`Health::Idle`]. A
/// condition's `lastTransitionTime` stays `old`'s while its status does.
pub fn conditions(
    v: &Verdict,
    old: &[Condition],
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    if v.health == Health::Idle {
        return Vec::new();
    }
    let on = |h: Health| ConditionStatus::of(v.health == h);
    [
        (kstatus::READY, on(Health::Ready)),
        (kstatus::RECONCILING, on(Health::Reconciling)),
        (kstatus::STALLED, on(Health::Stalled)),
    ]
    .into_iter()
    .map(|(type_, status)| {
        let status = status.as_str();
        let last_transition_time = match old.iter().find(|c| c.type_ == type_) {
            Some(c) if c.status == status => c.last_transition_time.clone(),
            _ => now.truncate_to_secs().to_time(),
        };
        Condition {
            last_transition_time,
            message: v.message.clone(),
            observed_generation: generation,
            reason: v.reason.to_string(),
            status: status.to_string(),
            type_: type_.to_string(),
        }
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(phase: Option<Phase>, conds: &[(ConditionType, ConditionStatus, &str)]) -> Verdict {
        let st = NetworkConfigRevisionStatus {
            phase: phase.map(|p| p.as_str().to_string()),
            conditions: conds
                .iter()
                .map(|(t, s, r)| Condition {
                    type_: t.as_str().into(),
                    status: s.as_str().into(),
                    reason: (*r).into(),
                    message: format!("{r} message"),
                    last_transition_time: Timestamp(0).to_time(),
                    observed_generation: None,
                })
                .collect(),
            message: Some("what it says".into()),
            ..Default::default()
        };
        of_revision(Some(&st))
    }

    /// The table of `netwave_api::vocab::kstatus`, row by row.
    #[test]
    fn each_phase_has_its_health() {
        use ConditionStatus::{False, True};
        use ConditionType as T;
        assert_eq!(of_revision(None).health, Health::Reconciling);
        assert_eq!(status(None, &[]).health, Health::Reconciling);
        let rolling = status(
            Some(Phase::Progressing),
            &[(T::Progressing, True, reasons::ROLLOUT_PROGRESSING)],
        );
        assert_eq!(
            (rolling.health, rolling.reason, rolling.message.as_str()),
            (
                Health::Reconciling,
                reasons::ROLLOUT_PROGRESSING,
                "what it says"
            )
        );
        assert_eq!(status(Some(Phase::Complete), &[]).health, Health::Ready);
        assert_eq!(status(Some(Phase::Failed), &[]).health, Health::Stalled);
        assert_eq!(status(Some(Phase::Superseded), &[]).health, Health::Idle);
        let held = status(
            Some(Phase::Pending),
            &[(T::Paused, True, reasons::DESTRUCTIVE_CHANGE)],
        );
        assert_eq!(
            (held.health, held.reason, held.message.as_str()),
            (
                Health::Stalled,
                reasons::DESTRUCTIVE_CHANGE,
                "DestructiveChange message"
            )
        );
        let paused = status(
            Some(Phase::Progressing),
            &[(T::Paused, True, reasons::PAUSED_BY_SPEC)],
        );
        assert_eq!(
            (paused.health, paused.reason),
            (Health::Stalled, reasons::ROLLOUT_PAUSED)
        );
        let late = status(
            Some(Phase::Progressing),
            &[
                (T::Paused, False, reasons::NOT_PAUSED),
                (T::Progressing, False, reasons::PROGRESS_DEADLINE_EXCEEDED),
            ],
        );
        assert_eq!(late.health, Health::Stalled);
        let baking = status(
            Some(Phase::Progressing),
            &[(T::Progressing, True, reasons::CANARY_BAKE)],
        );
        assert_eq!(
            (baking.health, baking.reason),
            (Health::Reconciling, reasons::CANARY_BAKE)
        );
    }

    #[test]
    fn one_condition_is_true_and_transitions_keep_their_time() {
        let v = Verdict {
            health: Health::Reconciling,
            reason: reasons::ROLLOUT_PROGRESSING,
            message: "1 of 3".into(),
        };
        let first = conditions(&v, &[], Some(4), Timestamp(1_000));
        let states: Vec<(&str, &str)> = first
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str()))
            .collect();
        assert_eq!(
            states,
            [
                ("Ready", "False"),
                ("Reconciling", "True"),
                ("Stalled", "False")
            ]
        );
        assert!(first.iter().all(|c| c.observed_generation == Some(4)));
        let done = Verdict {
            health: Health::Ready,
            ..v.clone()
        };
        let later = conditions(&done, &first, Some(4), Timestamp(9_000));
        // Stalled stayed False: its time is kept; the other two moved.
        assert_eq!(later[2].last_transition_time, first[2].last_transition_time);
        assert_ne!(later[0].last_transition_time, first[0].last_transition_time);
        assert_eq!(later[0].status, "True");
        let idle = Verdict {
            health: Health::Idle,
            ..v
        };
        assert!(conditions(&idle, &first, Some(4), Timestamp(9_000)).is_empty());
    }
}
