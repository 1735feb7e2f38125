//! Whether a revision is cut (or an old one reactivated) from the current inputs in this reconcile, and
//! what the Events about it say. The configurator's `compute` used to decide this inline; here the
//! simulator and rule tests see the same decision.
//!
//! ```text
//!  revision::decide ──► Decision ─┐
//!  InputSettle (debounce) ────────┼──cut──► Cut::Create | Cut::Reactivate | Cut::Roll(Rolling)
//!  undecodable inputs, size ──────┘
//! ```

use std::time::Duration;

use crate::limits::InputsTooLarge;
use crate::revision::{Decision, InputSettle};
use crate::types::{Sequence, Timestamp};

use super::hold::HoldRecord;
use super::plan::{Event, EventReason, ObjectRef};

/// What the configurator does with the current inputs this reconcile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cut {
    /// Create this revision (held if [`super::hold::hold_on_creation`] says so); nothing else is
    /// decided until the watch shows it.
    Create {
        name: String,
        sequence: u64,
        hash: String,
    },
    /// Make this older good revision the target again under `new_sequence`.
    Reactivate { name: String, new_sequence: u64 },
    /// Nothing is cut or reactivated now: the step rolls the current target on.
    Roll(Rolling),
}

/// Why nothing is cut now, and what the input objects' status is judged against.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rolling {
    /// The revision the current inputs equal (their status names it); `None` while they wait for one.
    pub current: Option<String>,
    /// `current` is Failed: nothing new is created for these inputs.
    pub equals_failed: bool,
    /// The inputs need a revision but are still changing: it is cut at this time at the latest.
    pub settle_until: Option<Timestamp>,
    /// The settling started in this reconcile (say so once, not on every reconcile).
    pub settle_started: bool,
    /// The inputs fold into more than one object holds: they are never cut, their status says why.
    pub too_large: Option<InputsTooLarge>,
}

/// Decides the cut from `revision::decide`'s `decision` for the current inputs, hashing to `hash`.
///
/// Rules, in order:
/// 1. inputs that need a revision (Create, Reactivate) wait until they stop changing
///    ([`InputSettle`], `window`); any other decision ends the settling;
/// 2. an input object that does not decode (`cutting_held`) holds every cut and reactivation, and the
///    inputs' status is left alone (its network would vanish from a revision cut without it);
/// 3. a revision is created only when the folded inputs fit one object (`size`, asked only then);
/// 4. inputs equal to the target roll on; equal to a Failed revision, nothing is created.
pub fn cut(
    hash: &str,
    decision: Decision,
    settle: &mut InputSettle,
    window: Duration,
    now: Timestamp,
    cutting_held: bool,
    size: impl FnOnce() -> Result<u64, InputsTooLarge>,
) -> Cut {
    let settle_until = match &decision {
        Decision::Create { .. } | Decision::Reactivate { .. } => {
            settle.wait_until(hash, now, window)
        }
        Decision::EqualsFailed { .. } | Decision::NoChange { .. } => {
            settle.settled();
            None
        }
    };
    let rolling = Rolling {
        settle_until,
        settle_started: settle_until.is_some() && !cutting_held && settle.first_sight(now),
        ..Rolling::default()
    };
    if cutting_held || settle_until.is_some() {
        return Cut::Roll(rolling);
    }
    match decision {
        Decision::Create {
            name,
            sequence,
            hash,
        } => match size() {
            Ok(_) => Cut::Create {
                name,
                sequence,
                hash,
            },
            Err(too_large) => Cut::Roll(Rolling {
                too_large: Some(too_large),
                ..rolling
            }),
        },
        Decision::Reactivate { name, new_sequence } => Cut::Reactivate { name, new_sequence },
        Decision::EqualsFailed { name } => Cut::Roll(Rolling {
            current: Some(name),
            equals_failed: true,
            ..rolling
        }),
        Decision::NoChange { name } => Cut::Roll(Rolling {
            current: Some(name),
            ..rolling
        }),
    }
}

/// The Normal Event that says `name` (created as sequence `created`) is the target again.
pub fn reactivated_event(name: &str, created: u64, new_sequence: u64) -> Event {
    Event {
        object: ObjectRef::Revision(name.to_string()),
        type_: EventReason::RevisionReactivated.type_(),
        reason: EventReason::RevisionReactivated,
        message: format!(
            "the inputs equal {name} (created as sequence {created}) again: it is the target again as \
             sequence {new_sequence} (status.activeSequence) and rolls out afresh; it reads \
             Progressing until its nodes are back"
        ),
    }
}

/// The Warning Event that says a revision is created held as a destructive change, once per hold.
pub fn held_event(hold: &HoldRecord, sequence: u64) -> Event {
    Event {
        object: ObjectRef::Revision(hold.revision.clone()),
        type_: EventReason::DestructiveChange.type_(),
        reason: EventReason::DestructiveChange,
        message: hold.event_note(Sequence(sequence)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Timestamp = Timestamp(1_000_000);
    const WINDOW: Duration = Duration::from_secs(2);

    fn create() -> Decision {
        Decision::Create {
            name: "rev-h".into(),
            sequence: 2,
            hash: "h".into(),
        }
    }

    fn fits() -> Result<u64, InputsTooLarge> {
        Ok(1)
    }

    #[test]
    fn a_cut_waits_for_the_inputs_to_settle_and_says_so_once() {
        let mut settle = InputSettle::default();
        let first = cut("h", create(), &mut settle, WINDOW, NOW, false, fits);
        let Cut::Roll(r) = first else {
            panic!("cut before the inputs settled: {first:?}");
        };
        assert_eq!(r.settle_until, Some(Timestamp(NOW.0 + 2000)));
        assert!(r.settle_started && r.current.is_none());
        let later = cut(
            "h",
            create(),
            &mut settle,
            WINDOW,
            Timestamp(NOW.0 + 1000),
            false,
            fits,
        );
        assert!(matches!(
            later,
            Cut::Roll(Rolling {
                settle_started: false,
                ..
            })
        ));
        let settled = cut(
            "h",
            create(),
            &mut settle,
            WINDOW,
            Timestamp(NOW.0 + 2000),
            false,
            fits,
        );
        assert!(
            matches!(settled, Cut::Create { sequence: 2, .. }),
            "{settled:?}"
        );
    }

    #[test]
    fn an_undecodable_input_holds_every_cut_and_reactivation() {
        for d in [
            create(),
            Decision::Reactivate {
                name: "rev-old".into(),
                new_sequence: 3,
            },
        ] {
            let c = cut(
                "h",
                d,
                &mut InputSettle::default(),
                Duration::ZERO,
                NOW,
                true,
                || panic!("the size of inputs that are not cut is not asked"),
            );
            assert_eq!(c, Cut::Roll(Rolling::default()));
        }
    }

    #[test]
    fn inputs_too_large_roll_the_target_on_with_the_reason() {
        let too_large = || {
            Err(crate::limits::check_inputs(&Default::default(), 0)
                .expect_err("0 bytes is too small"))
        };
        let c = cut(
            "h",
            create(),
            &mut InputSettle::default(),
            Duration::ZERO,
            NOW,
            false,
            too_large,
        );
        assert!(
            matches!(
                c,
                Cut::Roll(Rolling {
                    too_large: Some(_),
                    current: None,
                    ..
                })
            ),
            "{c:?}"
        );
    }

    #[test]
    fn equal_inputs_end_the_settling_and_name_the_revision_they_equal() {
        let mut settle = InputSettle::default();
        let _ = cut("h", create(), &mut settle, WINDOW, NOW, false, fits);
        let failed = Decision::EqualsFailed {
            name: "rev-bad".into(),
        };
        let c = cut("g", failed, &mut settle, WINDOW, NOW, false, fits);
        assert_eq!(
            c,
            Cut::Roll(Rolling {
                current: Some("rev-bad".into()),
                equals_failed: true,
                ..Rolling::default()
            })
        );
        // The burst is over: the next change waits a whole window again.
        let Cut::Roll(r) = cut(
            "h",
            create(),
            &mut settle,
            WINDOW,
            Timestamp(NOW.0 + 5000),
            false,
            fits,
        ) else {
            panic!("cut at once after the burst ended");
        };
        assert_eq!(r.settle_until, Some(Timestamp(NOW.0 + 7000)));
    }
}
