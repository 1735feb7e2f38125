//! The destructive-change hold (DESIGN.md §6 "A held change stays held"): a revision that would take
//! much of what the nodes run off them waits for an admin, and the hold cannot be walked around.
//!
//! ```text
//!   inputs + nodes ──Footprint::of──► per node, the input objects rendered there
//!   last good footprint ┐
//!   candidate footprint ┴──destructive(threshold)──► Some(Removal) ─► held until an admin resumes it
//! ```
//!
//! **What is measured.** What the nodes would lose: every (node, object) *placement* the last good
//! revision has — the newest `Complete` one, which the nodes run — that the candidate lacks. Deleting
//! an object loses its placements, and so does a selector that no longer selects a node, so emptying
//! selectors counts like deleting the objects. A candidate is destructive when it loses every
//! placement of the last good revision, or more than `--destructive-threshold` percent of them.
//!
//! **Always against the last good revision.** Never against the previous target: a newly cut
//! revision, an older revision made the target again (the inputs went back to its, by hand or by
//! `kubectl netwave undo`), a revision re-armed by `spec.retry`, and the sum of several small
//! deletions made before any of them completed are all measured against what the nodes run. So a
//! small edit made while a hold is pending yields a revision that is held too: the removal still
//! pending is part of it.
//!
//! **Approval.** A held revision carries `spec.paused: true` and two annotations: what it removes
//! ([`DESTRUCTIVE_CHANGE_ANNOTATION`](crate::revision::DESTRUCTIVE_CHANGE_ANNOTATION)) and the basis
//! of the hold ([`DESTRUCTIVE_CHANGE_BASIS_ANNOTATION`](crate::revision::DESTRUCTIVE_CHANGE_BASIS_ANNOTATION),
//! [`basis`]): the sequence it is the target under and the last good revision it was measured
//! against. An admin approves by resuming it (`spec.paused: false`, `kubectl netwave resume`): that
//! approves exactly this removal — this revision, as the target under this sequence, against this last
//! good revision. Once it is `Complete` it is the last good revision, and its content the baseline
//! every later candidate is measured against. Until then the approval covers nothing else: a later
//! edit is measured against the old last good revision and held again, and a revision made the target
//! again later (a new sequence) is held again. Pausing and resuming an approved revision for another
//! reason keeps its approval.
//!
//! Deleting in steps that each *complete* is a series of changes the fleet ran and proved; each step
//! is measured against the one before. Removing the last of what the nodes run is always held.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};

use netwave_api::RevisionInputs;

use crate::render::index::Index;
use crate::render::{InputKind, InputRef, NodeInfo};
use crate::types::Sequence;

/// `--destructive-threshold`'s default: more than half of what the nodes run.
pub const DEFAULT_DESTRUCTIVE_THRESHOLD: u32 = 50;

/// Objects a [`Removal`] names before "and N more".
const NAMED: usize = 5;

/// What a revision puts on the nodes: for each node, the input objects rendered there (an object is
/// on a node when its `nodeSelector` selects the node). Nodes that select the same objects share one
/// set, so a footprint of 5,000 nodes is one map and a few sets.
#[derive(Clone, Debug)]
pub struct Footprint {
    nodes: BTreeMap<String, Arc<BTreeSet<InputRef>>>,
    /// Names this content: a fresh id whenever it changes (a clone keeps it, as it keeps the content).
    id: u64,
    /// The last [`removal`] measured with this footprint as the candidate. Each step measures the
    /// same pair again (a pass over every node), so it is measured once per pair instead.
    memo: Memo,
}

/// Ids of footprint contents.
static NEXT_FOOTPRINT: AtomicU64 = AtomicU64::new(1);

impl Default for Footprint {
    fn default() -> Self {
        Footprint {
            nodes: BTreeMap::new(),
            id: NEXT_FOOTPRINT.fetch_add(1, AtomicOrdering::Relaxed),
            memo: Memo::default(),
        }
    }
}

impl PartialEq for Footprint {
    fn eq(&self, other: &Footprint) -> bool {
        self.nodes == other.nodes
    }
}

impl Eq for Footprint {}

/// (baseline id, baseline name, what the candidate removes from it).
#[derive(Debug, Default)]
struct Memo(Mutex<Option<(u64, String, Removal)>>);

impl Clone for Memo {
    fn clone(&self) -> Self {
        Memo(Mutex::new(self.0.lock().ok().and_then(|m| m.clone())))
    }
}

impl Footprint {
    /// The footprint of `inputs` rendered for `nodes`. Objects with an invalid selector are on no node
    /// (render refuses them; validation fails such a revision).
    pub fn of(inputs: &RevisionInputs, nodes: &[NodeInfo]) -> Footprint {
        let ix = Index::build(inputs, nodes);
        let mut fp = Footprint::default();
        for g in &ix.groups {
            let vrfs = ix
                .vrfs
                .iter()
                .zip(&ix.vrf_sel)
                .map(|(o, s)| (InputKind::Vrf, &o.name, *s));
            let l2s = ix
                .l2s
                .iter()
                .zip(&ix.l2_sel)
                .map(|(o, s)| (InputKind::Layer2, &o.name, *s));
            let rts = (ix.rts.iter().zip(&ix.rt_sel))
                .map(|(o, s)| (InputKind::RoutingTable, &o.name, *s));
            let peerings = (ix.peerings.iter().zip(&ix.peering_sel))
                .map(|(o, s)| (InputKind::BgpPeering, &o.name, *s));
            let objects: BTreeSet<InputRef> = vrfs
                .chain(l2s)
                .chain(rts)
                .chain(peerings)
                .filter(|(_, _, sel)| g.has(*sel))
                .map(|(kind, name, _)| InputRef::new(kind, name.as_str()))
                .collect();
            let objects = Arc::new(objects);
            for &n in &g.nodes {
                fp.nodes
                    .insert(ix.nodes[n as usize].name.clone(), objects.clone());
            }
        }
        fp
    }

    /// Puts `objects` on `node` (for building footprints by hand: tests and the simulator).
    pub fn insert(&mut self, node: impl Into<String>, objects: Arc<BTreeSet<InputRef>>) {
        self.nodes.insert(node.into(), objects);
        self.id = NEXT_FOOTPRINT.fetch_add(1, AtomicOrdering::Relaxed);
        self.memo = Memo::default();
    }
}

/// Footprints by revision name, each shared.
pub type Footprints = BTreeMap<String, Arc<Footprint>>;

/// What a candidate takes off the nodes compared with the last good revision (the baseline).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Removal {
    /// The last good revision measured against.
    pub baseline: String,
    /// Objects that lose at least one node, sorted (VRFs, then layer-2 segments, then routing tables).
    pub objects: Vec<InputRef>,
    /// Objects the baseline puts on at least one node.
    pub baseline_objects: usize,
    /// Nodes that lose at least one object.
    pub nodes: usize,
    /// (node, object) placements of the baseline the candidate lacks.
    pub lost: u64,
    /// (node, object) placements of the baseline.
    pub placements: u64,
}

impl Removal {
    /// The rule: every placement of the baseline lost, or more than `threshold_percent` of them. A
    /// baseline with nothing on any node has nothing to lose.
    pub fn exceeds(&self, threshold_percent: u32) -> bool {
        exceeds(self.lost, self.placements, threshold_percent)
    }
}

/// The rule for `lost` of `of`, whoever measures (inputs here, moves in [`super::loss`]): all of it, or
/// more than `threshold_percent`. Nothing to lose is never destructive.
pub(super) fn exceeds(lost: u64, of: u64, threshold_percent: u32) -> bool {
    let share = lost as u128 * 100 > threshold_percent as u128 * of as u128;
    of > 0 && lost > 0 && (lost == of || share)
}

/// `removes 18 of the 18 objects the last good revision rev-ab12 has (from 4 nodes: 72 of 72 node
/// placements): vrf/a, vrf/b, l2/c, rt/d, rt/e and 13 more`.
impl fmt::Display for Removal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "removes {} of the {} objects the last good revision {} has (from {} node(s): {} of {} \
             node placements)",
            self.objects.len(),
            self.baseline_objects,
            self.baseline,
            self.nodes,
            self.lost,
            self.placements
        )?;
        let named: Vec<String> = (self.objects.iter().take(NAMED))
            .map(|o| format!("{}/{}", o.kind.short_name(), o.name))
            .collect();
        if !named.is_empty() {
            write!(f, ": {}", named.join(", "))?;
        }
        if self.objects.len() > NAMED {
            write!(f, " and {} more", self.objects.len() - NAMED)?;
        }
        Ok(())
    }
}

/// What `candidate` takes off the nodes compared with `baseline`, the footprint of the last good
/// revision `baseline_name`. Nodes are matched by name; a node the candidate lacks loses everything.
pub fn removal(baseline_name: &str, baseline: &Footprint, candidate: &Footprint) -> Removal {
    let mut memo = candidate.memo.0.lock().ok();
    if let Some(Some((id, name, r))) = memo.as_deref()
        && *id == baseline.id
        && name == baseline_name
    {
        return r.clone();
    }
    let r = measure(baseline_name, baseline, candidate);
    if let Some(m) = memo.as_deref_mut() {
        *m = Some((baseline.id, baseline_name.to_string(), r.clone()));
    }
    r
}

/// [`removal`], measured.
fn measure(baseline_name: &str, baseline: &Footprint, candidate: &Footprint) -> Removal {
    let empty = BTreeSet::new();
    // Nodes share sets, so each (baseline set, candidate set) pair is compared once.
    let mut pairs: BTreeMap<(usize, usize), u64> = BTreeMap::new();
    let mut lost_objects: BTreeSet<&InputRef> = BTreeSet::new();
    let mut baseline_objects: BTreeSet<&InputRef> = BTreeSet::new();
    let mut seen_sets: BTreeSet<usize> = BTreeSet::new();
    let (mut lost, mut placements, mut nodes) = (0u64, 0u64, 0usize);
    let mut cand = candidate.nodes.iter().peekable();
    for (node, had) in &baseline.nodes {
        // Both maps are sorted by node name: a merge join.
        while cand.next_if(|(n, _)| *n < node).is_some() {}
        let has = cand.next_if(|(n, _)| *n == node).map(|(_, s)| s);
        let key = (
            Arc::as_ptr(had) as usize,
            has.map_or(0, |s| Arc::as_ptr(s) as usize),
        );
        let gone = *pairs.entry(key).or_insert_with(|| {
            let has: &BTreeSet<InputRef> = has.map_or(&empty, |s| s);
            let mut n = 0;
            for o in had.difference(has) {
                lost_objects.insert(o);
                n += 1;
            }
            n
        });
        if seen_sets.insert(key.0) {
            baseline_objects.extend(had.iter());
        }
        placements += had.len() as u64;
        lost += gone;
        nodes += usize::from(gone > 0);
    }
    Removal {
        baseline: baseline_name.to_string(),
        objects: lost_objects.into_iter().cloned().collect(),
        baseline_objects: baseline_objects.len(),
        nodes,
        lost,
        placements,
    }
}

/// The rule, whoever asks (the rollout step, the configurator cutting a revision, `kubectl netwave
/// undo`): what `candidate` removes from the last good revision `last_good` (its footprint
/// `baseline`), when that is destructive under `threshold_percent`.
pub fn destructive(
    last_good: &str,
    baseline: &Footprint,
    candidate: &Footprint,
    threshold_percent: u32,
) -> Option<Removal> {
    Some(removal(last_good, baseline, candidate)).filter(|r| r.exceeds(threshold_percent))
}

/// The basis of a hold, as recorded in
/// [`DESTRUCTIVE_CHANGE_BASIS_ANNOTATION`](crate::revision::DESTRUCTIVE_CHANGE_BASIS_ANNOTATION): the
/// revision as the target under `sequence`, measured against `last_good`. An admin's resume approves
/// the hold with exactly this basis.
pub fn basis(sequence: Sequence, last_good: &str) -> String {
    format!("sequence {} against {last_good}", sequence.0)
}

/// A hold to record on a revision: `spec.paused: true` and the two annotations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HoldRecord {
    pub revision: String,
    /// What it removes ([`Removal`]'s text), for `DESTRUCTIVE_CHANGE_ANNOTATION`.
    pub summary: String,
    /// [`basis`], for `DESTRUCTIVE_CHANGE_BASIS_ANNOTATION`.
    pub basis: String,
}

impl HoldRecord {
    /// Applies the record to a revision, as the API server would.
    pub fn apply(&self, r: &mut super::RevisionState) {
        r.paused = true;
        r.destructive = Some(self.summary.clone());
        r.hold_basis = Some(self.basis.clone());
    }

    /// The Warning Event (`DestructiveChange`) that says a revision is held, once per hold.
    pub fn event_note(&self, sequence: Sequence) -> String {
        format!(
            "{} (sequence {}) held: it {}; no node gets it until an admin resumes it (spec.paused: \
             false, kubectl netwave resume), or restore the inputs",
            self.revision, sequence.0, self.summary
        )
    }

    pub fn new(revision: &str, sequence: Sequence, removal: &Removal) -> HoldRecord {
        HoldRecord {
            revision: revision.to_string(),
            summary: removal.to_string(),
            basis: basis(sequence, &removal.baseline),
        }
    }
}

/// The hold a revision about to be created as `sequence` is created with (paused, annotated), when it
/// is destructive against the last good revision: the configurator creates it held, so an admin can
/// approve it before any step has seen it, and nothing is ever assigned from it unapproved. `None`
/// without a last good revision (the first rollout has nothing to remove).
pub fn hold_on_creation(
    revision: &str,
    sequence: Sequence,
    candidate: &Footprint,
    last_good: Option<(&str, &Footprint)>,
    threshold_percent: u32,
) -> Option<HoldRecord> {
    let (name, baseline) = last_good?;
    let r = destructive(name, baseline, candidate, threshold_percent)?;
    Some(HoldRecord::new(revision, sequence, &r))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(nodes: &[(&str, &[&str])]) -> Footprint {
        let mut f = Footprint::default();
        for (n, objs) in nodes {
            let set = objs
                .iter()
                .map(|o| InputRef::new(InputKind::RoutingTable, *o))
                .collect();
            f.insert(*n, Arc::new(set));
        }
        f
    }

    #[test]
    fn a_remembered_removal_is_the_one_measured_for_that_baseline_and_no_other() {
        let base = fp(&[("a", &["x", "y"]), ("b", &["x"])]);
        let mut cand = fp(&[("a", &["x"]), ("b", &["x"])]);
        assert_eq!(removal("rev-1", &base, &cand).lost, 1);
        assert_eq!(removal("rev-1", &base, &cand).lost, 1);
        // Another baseline with the same name, another name, a changed candidate: measured afresh.
        let other = fp(&[("a", &["x", "y", "z"]), ("b", &["x"])]);
        assert_eq!(removal("rev-1", &other, &cand).lost, 2);
        assert_eq!(removal("rev-2", &base, &cand).baseline, "rev-2");
        cand.insert("a", Arc::new(BTreeSet::new()));
        assert_eq!(removal("rev-2", &base, &cand).lost, 2);
        let copy = cand.clone();
        assert_eq!(
            removal("rev-2", &base, &copy),
            removal("rev-2", &base, &cand)
        );
    }

    #[test]
    fn a_removal_counts_placements_objects_and_nodes() {
        let base = fp(&[("a", &["x", "y"]), ("b", &["x", "y"]), ("c", &["z"])]);
        let cand = fp(&[("a", &["x"]), ("b", &["x", "y"]), ("c", &[])]);
        let r = removal("rev-1", &base, &cand);
        assert_eq!((r.lost, r.placements, r.nodes), (2, 5, 2));
        assert_eq!(r.baseline_objects, 3);
        let names: Vec<&str> = r.objects.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(names, ["y", "z"]);
        assert!(!r.exceeds(50) && r.exceeds(39));
        assert_eq!(
            r.to_string(),
            "removes 2 of the 3 objects the last good revision rev-1 has (from 2 node(s): 2 of 5 node \
             placements): rt/y, rt/z"
        );
    }

    #[test]
    fn losing_everything_exceeds_any_threshold_and_an_empty_baseline_nothing() {
        let base = fp(&[("a", &["x"])]);
        let r = removal("rev-1", &base, &fp(&[("a", &["new"])]));
        assert!(r.exceeds(100));
        let nothing = removal("rev-0", &fp(&[("a", &[])]), &fp(&[("a", &[])]));
        assert!(!nothing.exceeds(0));
        // A node missing from the candidate loses what it had.
        assert_eq!(removal("rev-1", &base, &Footprint::default()).lost, 1);
    }
}
