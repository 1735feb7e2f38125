//! Revisions: the content hash of a snapshot of the inputs, the revision object's name, and the rules
//! for when the configurator creates (or re-targets) a `NetworkConfigRevision`.
//!
//! ```text
//!  VRF/L2/RT objects ──canonical_inputs──► RevisionInputs (sorted) ──inputs_hash──► sha256 hex
//!                                                                     │
//!  existing NCRs (name, sequence, hash, phase, retry) + sequence floor ┴──decide──► Decision
//! ```
//!
//! **Canonical form.** Each object list is sorted by object name (ties, which Kubernetes never produces,
//! by the JSON of the spec), and serialized with serde_json from the typed structs: struct fields come out
//! in declaration order and label maps are `BTreeMap`s, so neither input order nor map order can change
//! the bytes. Lists *inside* a spec (import items, gateways, routes) are kept as the admin wrote them:
//! validation messages point at `spec.routes[3]`, and that index must be the admin's. Reordering such a
//! list therefore makes a new revision, whose rendered node configs are identical — the rollout moves every
//! node by the `configHash` fast path without touching a kernel.
//!
//! The hash covers the serialization of the API types, so adding a field to them (even an optional one
//! that serializes when set) changes hashes only for objects that set it.

use std::time::Duration;

use netwave_api::kinds::{Input, Visit, each_kind};
use netwave_api::{Named, NetworkConfigRevision, RevisionInputs};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::types::Timestamp;

/// Prefix of revision object names.
pub const REVISION_NAME_PREFIX: &str = "rev-";
/// Hex digits of the hash in a revision name (40 bits: a clash needs ~10^6 revisions alive at once, and
/// [`decide`] lengthens the name if one happens anyway).
pub const REVISION_NAME_HEX: usize = 10;

/// `items` sorted canonically: by name, ties by the JSON of the whole item.
pub(crate) fn canonical_refs<T: Serialize>(items: &[T], name: impl Fn(&T) -> &str) -> Vec<&T> {
    let mut v: Vec<&T> = items.iter().collect();
    v.sort_by(|a, b| name(a).cmp(name(b)).then_with(|| json(a).cmp(&json(b))));
    v
}

fn json<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("netwave API types always serialize to JSON")
}

/// The snapshot to store as a revision's `NetworkConfigInputs`: every list sorted canonically.
pub fn canonical_inputs(inputs: &RevisionInputs) -> RevisionInputs {
    struct Sort<'a>(&'a mut RevisionInputs);
    impl Visit for Sort<'_> {
        fn visit<K: Input>(&mut self) {
            let list = K::named_mut(self.0);
            if !sorted_by_name(list) {
                *list = canonical_refs(list, |o| &o.name)
                    .into_iter()
                    .cloned()
                    .collect();
            }
        }
    }
    let mut out = inputs.clone();
    each_kind(&mut Sort(&mut out));
    out
}

/// Whether every list of `inputs` is in canonical order already (names strictly increasing).
fn is_canonical(inputs: &RevisionInputs) -> bool {
    struct Check<'a>(&'a RevisionInputs, bool);
    impl Visit for Check<'_> {
        fn visit<K: Input>(&mut self) {
            self.1 &= sorted_by_name(K::named(self.0));
        }
    }
    let mut c = Check(inputs, true);
    each_kind(&mut c);
    c.1
}

fn sorted_by_name<S>(list: &[Named<S>]) -> bool {
    list.windows(2).all(|w| w[0].name < w[1].name)
}

/// Hex sha256 of the canonical serialization of `inputs` (`spec.hash`). Independent of the order of the
/// objects in `inputs`; equal to `sha256(serde_json::to_vec(&canonical_inputs(inputs)))`. Inputs that
/// are canonical already (the configurator's folds are) are hashed without a copy.
pub fn inputs_hash(inputs: &RevisionInputs) -> String {
    let sorted;
    let inputs = if is_canonical(inputs) {
        inputs
    } else {
        sorted = canonical_inputs(inputs);
        &sorted
    };
    let mut hasher = Sha256::new();
    serde_json::to_writer(&mut hasher, inputs).expect("netwave API types always serialize to JSON");
    hex::encode(hasher.finalize())
}

/// Digits of the zero-padded sequence in a [`Naming::Sequence`] name: names sort by sequence up to
/// 99,999,999 revisions.
pub const SEQUENCE_DIGITS: usize = 8;

/// How the configurator names the revisions it creates (`--revision-names`). Either way a name is
/// `rev-`, then at least [`REVISION_NAME_HEX`] leading hex digits of the hash, and every configurator
/// since 0.2.0 reads both forms ([`name_matches`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Naming {
    /// `rev-3f9a0c12de`: what 0.1.0 names, and the only form it reads. The API server lists objects by
    /// name, so `kubectl get ncr` lists these in hash order.
    #[default]
    Hash,
    /// `rev-00000007-3f9a0c12de`: the sequence, zero-padded to [`SEQUENCE_DIGITS`], before the hash,
    /// so `kubectl get ncr` lists revisions in creation order. A 0.1.0 configurator takes such a name
    /// for a tampered revision and never renders it again: use this once no 0.1.0 configurator can
    /// lead (after an upgrade that will not be rolled back).
    Sequence,
}

/// The revision object name for a hash: `rev-` and the first [`REVISION_NAME_HEX`] hex digits. A valid
/// DNS-1123 name. [`decide`] may lengthen it if another hash already holds that name.
pub fn revision_name(hash: &str) -> String {
    name_with_len(hash, REVISION_NAME_HEX, Naming::Hash, 0)
}

/// The name a revision with this hash and sequence gets under `naming`, before any lengthening.
pub fn revision_name_as(hash: &str, naming: Naming, sequence: u64) -> String {
    name_with_len(hash, REVISION_NAME_HEX, naming, sequence)
}

/// How `name` was named: [`Naming::Sequence`] when it has the sequence before the hash digits.
pub fn naming_of(name: &str) -> Naming {
    let sequenced = (name.strip_prefix(REVISION_NAME_PREFIX))
        .and_then(|r| r.split_once('-'))
        .is_some_and(|(seq, _)| !seq.is_empty() && seq.bytes().all(|b| b.is_ascii_digit()));
    if sequenced {
        Naming::Sequence
    } else {
        Naming::Hash
    }
}

fn name_with_len(hash: &str, len: usize, naming: Naming, sequence: u64) -> String {
    let hex: String = hash
        .chars()
        .filter(char::is_ascii_hexdigit)
        .map(|c| c.to_ascii_lowercase())
        .take(len)
        .collect();
    match naming {
        Naming::Hash => format!("{REVISION_NAME_PREFIX}{hex}"),
        Naming::Sequence => format!(
            "{REVISION_NAME_PREFIX}{sequence:0width$}-{hex}",
            width = SEQUENCE_DIGITS
        ),
    }
}

/// Why a revision is not what its creator wrote: its inputs (the `NetworkConfigInputs` object of its name)
/// no longer hash to `spec.hash` or are gone, or its name no longer belongs to that hash. Both objects are
/// immutable (CEL rules on the CRDs refuse the edit where the API server enforces them); this is the
/// check for where it does not, and for a deletion.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Tampered {
    #[error(
        "inputs: NetworkConfigInputs {name} hashes to {actual}, not to spec.hash {recorded}: the inputs \
         were edited after the revision was created (they are immutable; edit the VRF, layer-2 and \
         routing-table objects instead)"
    )]
    Inputs {
        name: String,
        recorded: String,
        actual: String,
    },
    #[error(
        "inputs: NetworkConfigInputs {name}, which holds the revision's inputs, is gone (deleted after \
         the revision was created)"
    )]
    InputsGone { name: String },
    #[error(
        "spec.hash: {hash} does not belong to the name {name} (a revision is named rev-, its sequence \
         and - or not, then the first hex digits of its hash): spec.hash was edited after the revision \
         was created"
    )]
    Name { name: String, hash: String },
}

/// Checks that a revision is what its name and hash say: its inputs hash to `spec.hash`, and the name
/// is `rev-` with at least [`REVISION_NAME_HEX`] leading hex digits of that hash (what [`decide`] names
/// it, lengthened or not).
pub fn verify(name: &str, hash: &str, inputs: &RevisionInputs) -> Result<(), Tampered> {
    if !name_matches(name, hash) {
        return Err(Tampered::Name {
            name: name.to_string(),
            hash: hash.to_string(),
        });
    }
    let actual = inputs_hash(inputs);
    if actual != hash {
        return Err(Tampered::Inputs {
            name: name.to_string(),
            recorded: hash.to_string(),
            actual,
        });
    }
    Ok(())
}

/// `name` is a name [`decide`] could have given a revision with this hash, under either [`Naming`]:
/// `rev-` (then, in [`Naming::Sequence`], decimal digits and `-`) and at least [`REVISION_NAME_HEX`]
/// leading hex digits of the hash.
pub fn name_matches(name: &str, hash: &str) -> bool {
    let rest = name.strip_prefix(REVISION_NAME_PREFIX);
    let hex = rest.map(|r| match (naming_of(name), r.split_once('-')) {
        (Naming::Sequence, Some((_, hex))) => hex,
        _ => r,
    });
    hex.is_some_and(|hex| {
        hex.len() >= REVISION_NAME_HEX
            && hex.bytes().all(|b| b.is_ascii_hexdigit())
            && hash
                .get(..hex.len())
                .is_some_and(|h| h.eq_ignore_ascii_case(hex))
    })
}

/// What [`decide`] needs to know about one existing `NetworkConfigRevision`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExistingRevision {
    pub name: String,
    /// Its [effective sequence](netwave_api::effective_sequence): `spec.sequence`, or the sequence it
    /// was reactivated under.
    pub sequence: u64,
    /// `spec.hash`.
    pub hash: String,
    /// `status.phase == "Failed"`.
    pub failed: bool,
    /// `spec.retry`.
    pub retry: u32,
    /// `status.observedRetry`: the `spec.retry` the current phase belongs to.
    pub observed_retry: Option<u32>,
}

impl ExistingRevision {
    /// Reads the fields [`decide`] uses from a revision object.
    pub fn from_object(ncr: &NetworkConfigRevision) -> Self {
        let status = ncr.status.as_ref();
        ExistingRevision {
            name: ncr.metadata.name.clone().unwrap_or_default(),
            sequence: netwave_api::effective_sequence(ncr),
            hash: ncr.spec.hash.clone(),
            failed: netwave_api::vocab::RevisionPhase::parse(
                status.and_then(|s| s.phase.as_deref()),
            ) == Some(netwave_api::vocab::RevisionPhase::Failed),
            retry: ncr.spec.retry,
            observed_retry: status.and_then(|s| s.observed_retry),
        }
    }

    /// Failed in the current attempt: `status.phase` is `Failed` and `status.observedRetry` is absent or
    /// equal to `spec.retry`. An admin bumping `spec.retry` re-arms the revision at once, before the
    /// rollout has rewritten its status (the same rule `rollout` uses).
    pub fn is_failed(&self) -> bool {
        self.failed && self.observed_retry.is_none_or(|r| r == self.retry)
    }
}

/// What the configurator does about the current inputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The inputs equal the current target (the newest revision that is not Failed): nothing to do.
    NoChange { name: String },
    /// The inputs equal a revision that failed. Do not create anything (it would fail the same way);
    /// report it (condition/Event) so the admin changes the inputs or bumps that revision's `spec.retry`.
    EqualsFailed { name: String },
    /// The inputs equal an older good revision: make it the target again under `new_sequence`
    /// (`status.activeSequence`; its spec never changes), like a Deployment rollback re-using its old
    /// ReplicaSet. It rolls out afresh: `Pending`, then `Progressing` until its nodes are back.
    Reactivate { name: String, new_sequence: u64 },
    /// New inputs: create a revision with this name, sequence and hash.
    Create {
        name: String,
        sequence: u64,
        hash: String,
    },
}

/// Decides what to do with inputs whose [`inputs_hash`] is `hash`, given every existing revision.
///
/// `sequence_floor` keeps sequences monotonic when history is deleted: pass the highest sequence the
/// caller can see anywhere besides `existing` — at least the maximum `spec.sequence` over all
/// NodeNetworkConfigs (nodes keep referencing revisions the history limit may not delete, but an admin
/// can delete anything). The next sequence is `max(existing sequences, sequence_floor) + 1`.
///
/// Rules, in order:
/// 1. target = the revision with the highest sequence that is not [failed](ExistingRevision::is_failed);
///    `hash == target.hash` → [`Decision::NoChange`];
/// 2. the newest other revision with this hash is failed → [`Decision::EqualsFailed`];
/// 3. it is good (so older than the target) → [`Decision::Reactivate`] with the next sequence;
/// 4. otherwise → [`Decision::Create`] with the next sequence and [`revision_name`] (lengthened to 16,
///    24, 32 then 59 hex digits if an existing revision with another hash holds that name).
pub fn decide(hash: &str, existing: &[ExistingRevision], sequence_floor: u64) -> Decision {
    decide_named(hash, existing, sequence_floor, Naming::Hash)
}

/// [`decide`], naming a created revision by `naming`.
pub fn decide_named(
    hash: &str,
    existing: &[ExistingRevision],
    sequence_floor: u64,
    naming: Naming,
) -> Decision {
    let next = existing
        .iter()
        .map(|r| r.sequence)
        .chain([sequence_floor])
        .max()
        .unwrap_or(0)
        + 1;
    // Ties in sequence never happen with one writer; break them by name so the choice is deterministic.
    let newest = |it: &mut dyn Iterator<Item = &ExistingRevision>| {
        it.max_by(|a, b| {
            a.sequence
                .cmp(&b.sequence)
                .then_with(|| a.name.cmp(&b.name))
        })
        .cloned()
    };
    let target = newest(&mut existing.iter().filter(|r| !r.is_failed()));
    if let Some(t) = &target
        && t.hash == hash
    {
        return Decision::NoChange {
            name: t.name.clone(),
        };
    }
    if let Some(same) = newest(&mut existing.iter().filter(|r| r.hash == hash)) {
        return if same.is_failed() {
            Decision::EqualsFailed { name: same.name }
        } else {
            Decision::Reactivate {
                name: same.name,
                new_sequence: next,
            }
        };
    }
    let name = [REVISION_NAME_HEX, 16, 24, 32, 59]
        .into_iter()
        .map(|len| name_with_len(hash, len, naming, next))
        .find(|n| !existing.iter().any(|r| &r.name == n))
        // 59 hex digits of sha256 clashing with a different hash does not happen; fall back to the
        // longest name rather than panic.
        .unwrap_or_else(|| name_with_len(hash, 59, naming, next));
    Decision::Create {
        name,
        sequence: next,
        hash: hash.to_string(),
    }
}

/// Annotation on a revision held as a destructive change (`rollout::hold`): what it removes from the
/// last good revision, as the hold was recorded. The Paused condition says `DestructiveChange` while
/// the hold is in effect.
pub const DESTRUCTIVE_CHANGE_ANNOTATION: &str = "netwave.dev/destructive-change";

/// Annotation on a held revision: the basis of the hold ([`crate::rollout::hold::basis`]), the
/// sequence it is the target under and the last good revision it was measured against. Resuming the
/// revision approves the hold with this basis, and only it.
pub const DESTRUCTIVE_CHANGE_BASIS_ANNOTATION: &str = "netwave.dev/destructive-change-basis";

/// The failed revision the admin must be told about now, if any: the inputs equal `now`'s failed
/// revision and this process has not said so since they last did (`reported`). One Event per occurrence:
/// going back to good inputs and then to the failed ones again is a new occurrence. The memory is the
/// caller's and per process, so a new leader says it once more.
pub fn equals_failed_notice<'a>(reported: Option<&str>, now: Option<&'a str>) -> Option<&'a str> {
    now.filter(|n| reported != Some(*n))
}

/// Debounces input changes. Admins change inputs object by object (`kubectl apply -f dir/`, a GitOps
/// sync), and every intermediate set would otherwise become a revision that starts rolling out: a
/// half-applied configuration on the first nodes, then a second rollout over them. A revision is cut once
/// the inputs hash has not changed for the window, or at the latest [`MAX_SETTLE_FACTOR`] windows after
/// the first change of the burst, so a steady stream of edits cannot hold revisions back forever.
///
/// The only state is in memory: a new leader waits one window before cutting, which delays a revision
/// by seconds and never changes which one is cut.
#[derive(Debug, Default)]
pub struct InputSettle {
    /// The inputs hash last seen and when it was first seen.
    seen: Option<(String, Timestamp)>,
    /// When the inputs first differed from every revision, in the current burst of changes.
    burst_started: Option<Timestamp>,
}

pub const MAX_SETTLE_FACTOR: u32 = 10;

impl InputSettle {
    /// The inputs no longer need a new revision (one exists for them): the burst is over.
    pub fn settled(&mut self) {
        self.seen = None;
        self.burst_started = None;
    }

    /// This hash was first seen `now` (so the change is logged once, not on every reconcile).
    pub fn first_sight(&self, now: Timestamp) -> bool {
        self.seen.as_ref().is_some_and(|(_, t)| *t == now)
    }

    /// The inputs need a new revision. `None`: cut it now; `Some(t)`: not before `t`.
    pub fn wait_until(
        &mut self,
        hash: &str,
        now: Timestamp,
        window: Duration,
    ) -> Option<Timestamp> {
        if self.seen.as_ref().is_none_or(|(h, _)| h != hash) {
            self.seen = Some((hash.to_string(), now));
        }
        let since = self.seen.as_ref().map_or(now, |(_, t)| *t);
        let burst = *self.burst_started.get_or_insert(since);
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let quiet = Timestamp(since.0.saturating_add(ms(window)));
        let cap = Timestamp(burst.0.saturating_add(ms(window * MAX_SETTLE_FACTOR)));
        let ready = quiet.min(cap);
        (now < ready).then_some(ready)
    }
}

#[cfg(test)]
mod settle_tests {
    use super::*;

    #[test]
    fn equal_to_a_failed_revision_is_said_once_per_occurrence() {
        assert_eq!(equals_failed_notice(None, Some("rev-b")), Some("rev-b"));
        assert_eq!(equals_failed_notice(Some("rev-b"), Some("rev-b")), None);
        assert_eq!(equals_failed_notice(Some("rev-b"), None), None);
        // Another failed revision, or the same one after the inputs were good in between.
        assert_eq!(
            equals_failed_notice(Some("rev-b"), Some("rev-c")),
            Some("rev-c")
        );
        assert_eq!(equals_failed_notice(None, Some("rev-b")), Some("rev-b"));
    }

    const W: Duration = Duration::from_secs(2);

    #[test]
    fn a_revision_waits_until_the_inputs_are_quiet_for_the_window() {
        let mut s = InputSettle::default();
        let t = Timestamp::from_secs(100);
        assert_eq!(s.wait_until("a", t, W), Some(t.plus_secs(2)));
        assert_eq!(s.wait_until("a", t.plus_secs(1), W), Some(t.plus_secs(2)));
        // Another change restarts the quiet time.
        assert_eq!(s.wait_until("b", t.plus_secs(1), W), Some(t.plus_secs(3)));
        assert_eq!(s.wait_until("b", t.plus_secs(3), W), None);
    }

    #[test]
    fn a_steady_stream_of_changes_waits_at_most_ten_windows() {
        let mut s = InputSettle::default();
        let t = Timestamp::from_secs(100);
        let mut cut = None;
        for i in 0..40u64 {
            let now = t.plus_secs(i);
            if s.wait_until(&format!("h{i}"), now, W).is_none() {
                cut = Some(i);
                break;
            }
        }
        assert_eq!(
            cut,
            Some(20),
            "cut at the cap of 10 windows after the first change"
        );
    }

    #[test]
    fn settling_forgets_the_last_change() {
        let mut s = InputSettle::default();
        let t = Timestamp::from_secs(100);
        assert!(s.wait_until("b", t, W).is_some());
        // Back to the inputs of an existing revision, then to "b" again much later: a fresh window.
        s.settled();
        let later = t.plus_secs(60);
        assert_eq!(s.wait_until("b", later, W), Some(later.plus_secs(2)));
    }

    #[test]
    fn a_zero_window_cuts_at_once() {
        let mut s = InputSettle::default();
        assert_eq!(
            s.wait_until("a", Timestamp::from_secs(1), Duration::ZERO),
            None
        );
    }
}
