//! Every Event the configurator writes, from one place: the rollout's, which the step decides (core's
//! `EventReason`, turned into intents by [`rollout_event`]), and the shell's own ([`ShellEvent`]: what
//! the configurator finds outside a plan). Each kind's reason, action and type are here, not at the
//! call sites.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::EventType as KubeEventType;
use netwave_api::NetworkConfigRevision;
use netwave_core::rollout::{self, EventType, ObjectRef};
use netwave_core::{limits, undecodable};

use crate::snapshot::{Snapshot, live};
use crate::writer::Intent;

/// The Events the configurator's shell emits on its own, every one a Warning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShellEvent {
    /// A spec edited by hand (a revision's or a node config's), put back.
    SpecRestored,
    /// A revision's spec edited by hand whose inputs are gone: it is never rendered again.
    SpecUnrestorable,
    /// The inputs fold into more than one object can hold: no revision is cut.
    InputsTooLarge,
    /// An object that does not decode: skipped, with what that holds back.
    Undecodable,
    /// The inputs equal a Failed revision: nothing new is cut.
    InputsEqualFailedRevision,
}

impl ShellEvent {
    pub const ALL: [ShellEvent; 5] = [
        ShellEvent::SpecRestored,
        ShellEvent::SpecUnrestorable,
        ShellEvent::InputsTooLarge,
        ShellEvent::Undecodable,
        ShellEvent::InputsEqualFailedRevision,
    ];

    /// The Event's reason (what alerts and `kubectl get events --field-selector reason=` match).
    pub fn reason(self) -> &'static str {
        match self {
            ShellEvent::SpecRestored | ShellEvent::SpecUnrestorable => "SpecTampered",
            ShellEvent::InputsTooLarge => limits::REASON,
            ShellEvent::Undecodable => undecodable::REASON,
            ShellEvent::InputsEqualFailedRevision => "InputsEqualFailedRevision",
        }
    }

    /// What the configurator did or tried (the Event's action).
    pub fn action(self) -> &'static str {
        match self {
            ShellEvent::SpecRestored => "Restore",
            ShellEvent::SpecUnrestorable => "Verify",
            ShellEvent::InputsTooLarge | ShellEvent::InputsEqualFailedRevision => "Revision",
            ShellEvent::Undecodable => "Decode",
        }
    }

    /// This Event about `regarding`, saying `note`.
    pub fn intent(self, regarding: ObjectReference, note: String) -> Intent {
        Intent::Event {
            regarding,
            type_: KubeEventType::Warning,
            reason: self.reason().into(),
            action: self.action().into(),
            note,
        }
    }
}

/// A reference to netwave's object `kind/name` for an Event.
pub fn object_ref(kind: &str, name: &str, uid: Option<String>) -> ObjectReference {
    ObjectReference {
        api_version: Some("netwave.dev/v1alpha1".into()),
        kind: Some(kind.into()),
        name: Some(name.into()),
        uid,
        ..Default::default()
    }
}

/// A core Event as an Event write about the live object it names.
pub fn rollout_event(s: &Snapshot, e: &rollout::Event, action: &str) -> Intent {
    let regarding = match &e.object {
        ObjectRef::Revision(n) => {
            let uid = (s.revisions.iter())
                .filter(|r| live(r.as_ref()))
                .find(|r| r.metadata.name.as_deref() == Some(n))
                .and_then(|r| r.metadata.uid.clone());
            object_ref("NetworkConfigRevision", n, uid)
        }
        ObjectRef::NodeConfig(n) => {
            let uid = s.node_config(n).and_then(|c| c.metadata.uid.clone());
            object_ref("NodeNetworkConfig", n, uid)
        }
    };
    Intent::Event {
        regarding,
        type_: match e.type_ {
            EventType::Normal => KubeEventType::Normal,
            EventType::Warning => KubeEventType::Warning,
        },
        reason: e.reason.as_str().to_string(),
        action: action.into(),
        note: e.message.clone(),
    }
}

/// What to tell an admin whose inputs equal a failed revision. A retry can only help a revision that
/// failed on nodes; one that failed fleet validation fails the same way again, so the advice is to fix
/// the inputs, with the first errors.
pub fn equals_failed_note(name: &str, failed: Option<&NetworkConfigRevision>) -> String {
    let errors = failed
        .and_then(|r| r.status.as_ref())
        .map(|st| st.validation.errors.as_slice())
        .unwrap_or_default();
    if errors.is_empty() {
        format!(
            "the current inputs equal {name}, which failed on nodes: no new revision is created; \
             change the inputs, or bump {name}'s spec.retry to roll it out again"
        )
    } else {
        let first: Vec<&str> = errors.iter().take(3).map(String::as_str).collect();
        format!(
            "the current inputs equal {name}, which failed fleet validation: no new revision is \
             created and a retry would fail the same way; fix the inputs (kubectl get vrf,l2,rt shows \
             which are not accepted): {}{}",
            first.join("; "),
            if errors.len() > 3 {
                format!(" and {} more", errors.len() - 3)
            } else {
                String::new()
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every shell Event has a reason and an action, and the reasons are the ones alerts and admins
    /// filter on (a rename would silently break `kubectl get events --field-selector`).
    #[test]
    fn every_shell_event_has_a_stable_reason_and_an_action() {
        let reasons: Vec<&str> = ShellEvent::ALL.iter().map(|e| e.reason()).collect();
        assert_eq!(
            reasons,
            [
                "SpecTampered",
                "SpecTampered",
                "InputsTooLarge",
                "Undecodable",
                "InputsEqualFailedRevision"
            ]
        );
        assert!(ShellEvent::ALL.iter().all(|e| !e.action().is_empty()));
    }
}
