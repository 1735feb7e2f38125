//! The reconciler's memory: everything [`crate::decide::compute`] keeps between reconciles, each
//! entry keyed by what it is computed from, so a new leader with an empty memory decides exactly the
//! same. Renders and fleet validations per (inputs hash, node labels), the input objects' verdicts,
//! which specs verified, the nodes' and node configs' states converted once per change, what the last
//! step worked out about the fleet, and the folded inputs while the stores hold the same objects.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use netwave_api::features::FeatureSet;
use netwave_api::kinds::{ByKind, Objects};
use netwave_api::{RevisionInputs, ValidationResult};
use netwave_core::Sym;
use netwave_core::fleet::{self, FleetParams};
use netwave_core::render::RenderedNode;
use netwave_core::revision::{self};
use netwave_core::rollout::hold::Footprint;
use netwave_core::rollout::{self, InputVerdicts, StepMemo};

use crate::integrity::IntegrityCache;
use crate::observed::{Nodes, Observed};
pub use crate::snapshot::Snapshot;
use crate::snapshot::fold_inputs;

/// Renders and fleet-validates revisions, remembering results per (inputs hash, node labels), and
/// remembers which specs verified (see [`IntegrityCache`]).
#[derive(Default)]
pub struct Memory {
    pub(crate) rendered: BTreeMap<(String, u64), Arc<Rendered>>,
    /// Per-object verdicts of the current inputs (the input objects' status).
    pub(crate) verdicts: BTreeMap<(String, u64), Arc<InputVerdicts>>,
    pub(crate) integrity: IntegrityCache,
    /// The nodes' and node configs' states, converted once per change of the object.
    pub(crate) observed: Observed,
    /// What the last step worked out about the fleet (`rollout::StepMemo`): the nodes and configs
    /// sorted and joined, the failure domains, the rendered hashes per node. Checked against each
    /// input before it is used.
    pub(crate) memo: StepMemo,
    /// The inputs folded and hashed, while the stores hold the same input objects.
    pub(crate) folded: FoldedInputs,
    /// The items of the configs nodes run and of renderings, for the hold on moves.
    pub(crate) items: crate::moves::ItemMemo,
}

/// [`fold_inputs`] and [`revision::inputs_hash`] of the last snapshot, kept while the stores hold the
/// very same input objects: folding clones every spec and hashing serializes them all, which was 4 %
/// of the leader's CPU at 5,000 nodes when done on every reconcile (#28).
#[derive(Default)]
pub(crate) struct FoldedInputs {
    /// The objects they were folded from, held so that their addresses name them.
    from: Option<ByKind<Objects>>,
    inputs: Arc<RevisionInputs>,
    hash: String,
}

impl FoldedInputs {
    /// The folded inputs of `s` and their hash: the kept ones if `s` holds the same objects in the
    /// same order (a store that hands them out in another order costs a fold, never a wrong answer).
    pub(crate) fn of(&mut self, s: &Snapshot) -> (Arc<RevisionInputs>, String) {
        let kept = (self.from.as_ref()).is_some_and(|f| f.same_objects(&s.inputs));
        if !kept {
            let inputs = fold_inputs(s);
            self.hash = revision::inputs_hash(&inputs);
            self.inputs = Arc::new(inputs);
            self.from = Some(s.inputs.clone());
        }
        (self.inputs.clone(), self.hash.clone())
    }
}

pub struct Rendered {
    pub nodes: BTreeMap<String, RenderedNode>,
    /// What it puts on each node, for the destructive-change hold (`rollout::hold`).
    pub footprint: Arc<Footprint>,
    /// Every node's configHash, shared with each step input (built once per render, not per reconcile:
    /// at 5,000 nodes the copy was 15% of a reconcile's compute).
    pub hashes: Arc<BTreeMap<Sym, Sym>>,
    /// The agent features each node's config needs, for the nodes whose config needs any
    /// (`netwave_api::features`).
    pub needs: Arc<BTreeMap<Sym, FeatureSet>>,
    pub validation: ValidationResult,
    /// The basis of a hold on this rendering (`loss::rendering_basis` of `hashes`), once asked for.
    pub basis: std::sync::OnceLock<String>,
}

impl Memory {
    pub(crate) fn get(
        &mut self,
        hash: &str,
        inputs: &RevisionInputs,
        nodes: &Nodes,
        params: &FleetParams,
    ) -> Arc<Rendered> {
        let key = (hash.to_string(), nodes.fingerprint);
        if let Some(r) = self.rendered.get(&key) {
            return r.clone();
        }
        let nodes = &nodes.infos();
        // A render that fails comes with validation errors, so the revision goes Failed and nothing
        // is ever assigned from an empty render.
        let checked = fleet::render_and_validate(inputs, nodes, params);
        // Interned with the node configs' names and hashes, so the step compares them by pointer.
        let strings = self.observed.strings();
        let hashes = checked
            .nodes
            .iter()
            .map(|(n, rn)| (strings.intern(n), strings.intern(&rn.config_hash)))
            .collect::<BTreeMap<_, _>>();
        let needs = (checked.nodes.iter())
            .map(|(n, rn)| (n, rn.needs()))
            .filter(|(_, needs)| !needs.is_empty())
            .map(|(n, needs)| (strings.intern(n), needs))
            .collect::<BTreeMap<_, _>>();
        let r = Arc::new(Rendered {
            footprint: Arc::new(Footprint::of(inputs, nodes)),
            hashes: Arc::new(hashes),
            needs: Arc::new(needs),
            nodes: checked.nodes,
            validation: checked.validation.to_status(),
            basis: Default::default(),
        });
        self.rendered.insert(key, r.clone());
        r
    }

    /// The per-object verdicts of `inputs` (hashing to `hash`) on these nodes.
    pub(crate) fn verdicts(
        &mut self,
        hash: &str,
        inputs: &RevisionInputs,
        nodes: &Nodes,
        params: &FleetParams,
    ) -> Arc<InputVerdicts> {
        self.verdicts
            .entry((hash.to_string(), nodes.fingerprint))
            .or_insert_with(|| Arc::new(rollout::input_verdicts(inputs, &nodes.infos(), params)))
            .clone()
    }

    /// Drops entries not used by the latest reconcile, so memory stays bounded by the history limit.
    pub(crate) fn retain(&mut self, used: &BTreeSet<(String, u64)>) {
        self.rendered.retain(|k, _| used.contains(k));
        self.verdicts.retain(|k, _| used.contains(k));
        self.items.retain_used();
    }
}
