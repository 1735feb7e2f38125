//! What moving nodes to a revision's rendering takes off them (`netwave_core::rollout::loss`),
//! measured on the configs they run: the step holds a target whose moves take too much, whatever
//! caused it (a Node label change re-rendering the last good revision included).
//!
//! **Changes in steps.** A label-sync job relabels a 2,000-node fleet node by node over minutes, and
//! each reconcile sees a few more: measured one reconcile at a time, every step would stay under the
//! threshold and the fleet would drain. So the measure is cumulative over a *walk*: what each node
//! ran before its first move of the walk stays its baseline. A walk ends when no node of the revision
//! has moved for [`WALK_QUIET`], when an admin approves a hold and then the rendering changes again
//! (the approval covered what came before), or when this configurator stops leading (a new leader
//! starts a new walk: the README says so).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use netwave_api::{NetworkConfigRevision, NodeNetworkConfig};
use netwave_core::Timestamp;
use netwave_core::render::RenderedNode;
use netwave_core::revision::DESTRUCTIVE_CHANGE_BASIS_ANNOTATION;
use netwave_core::rollout::loss::{self, Move, MoveLoss};

use crate::watch::CONFIG_ITEMS;

type Items = Arc<BTreeSet<String>>;

/// A walk ends when no node of its revision moved for this long.
pub const WALK_QUIET: Duration = Duration::from_secs(10 * 60);

/// The items of each config, by configHash: computed once per config (a config's items depend only
/// on its content), kept while a reconcile uses them; and the walk of each revision.
#[derive(Default)]
pub(crate) struct ItemMemo {
    items: HashMap<String, Items>,
    used: HashSet<String>,
    walks: HashMap<String, Walk>,
    walked: HashSet<String>,
}

/// One revision's walk: what each node that moved ran before its first move.
#[derive(Default)]
struct Walk {
    before: HashMap<String, Items>,
    /// When a node last moved (or was about to).
    last_move: Option<Timestamp>,
    /// The basis of a hold an admin approved during this walk.
    approved: Option<String>,
}

impl ItemMemo {
    fn of(&mut self, hash: &str, items: impl FnOnce() -> BTreeSet<String>) -> Items {
        self.used.insert(hash.to_string());
        (self.items.entry(hash.to_string()))
            .or_insert_with(|| Arc::new(items()))
            .clone()
    }

    /// The items `c` runs: from what the watch noted when it dropped the config, else the config.
    fn runs(&mut self, c: &NodeNetworkConfig) -> Items {
        self.of(&c.spec.config_hash, || {
            match c
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(CONFIG_ITEMS))
            {
                Some(noted) => noted.lines().map(str::to_string).collect(),
                None => loss::config_items(&c.spec.config),
            }
        })
    }

    /// Forgets the items and walks no reconcile since the last call used.
    pub(crate) fn retain_used(&mut self) {
        let used = std::mem::take(&mut self.used);
        self.items.retain(|h, _| used.contains(h));
        let walked = std::mem::take(&mut self.walked);
        self.walks.retain(|r, _| walked.contains(r));
    }

    /// What moving every node whose config differs from its rendering (`rendered`, whose hold basis
    /// is `basis`: `loss::rendering_basis`) takes off it, over the revision's walk, against everything
    /// the fleet ran before it (`configs`, sorted by name). `None` when no node moves now and none
    /// moved in the walk.
    pub(crate) fn move_loss(
        &mut self,
        rev: &NetworkConfigRevision,
        (rendered, basis): (&BTreeMap<String, RenderedNode>, &str),
        configs: &[Arc<NodeNetworkConfig>],
        now: Timestamp,
    ) -> Option<Arc<MoveLoss>> {
        let name = rev.metadata.name.clone().unwrap_or_default();
        self.walked.insert(name.clone());
        let running = || configs.iter().filter(|c| !c.spec.is_placeholder());
        let moving: HashMap<&str, &RenderedNode> = running()
            .filter_map(|c| {
                let node = c.metadata.name.as_deref()?;
                let rn = rendered.get(node)?;
                (rn.config_hash != c.spec.config_hash).then_some((node, rn))
            })
            .collect();
        let mut walk = self.walks.remove(&name).unwrap_or_default();
        walk.advance(rev, basis, !moving.is_empty(), now);
        if moving.is_empty() && walk.before.is_empty() {
            return None;
        }
        // Every node's baseline: what it ran before its first move of the walk, else what it runs.
        let mut items = 0u64;
        let mut moves: Vec<(&str, Items, Items)> = Vec::new();
        for c in running() {
            let node = c.metadata.name.as_deref().unwrap_or_default();
            let runs = self.runs(c);
            let base = match (walk.before.get(node), moving.contains_key(node)) {
                (Some(b), _) => b.clone(),
                (None, true) => {
                    walk.before.insert(node.to_string(), runs.clone());
                    runs.clone()
                }
                (None, false) => runs.clone(),
            };
            items += base.len() as u64;
            let gets = match moving.get(node) {
                Some(rn) => self.of(&rn.config_hash, || loss::config_items(&rn.config())),
                None => runs,
            };
            if !Arc::ptr_eq(&base, &gets) {
                moves.push((node, base, gets));
            }
        }
        self.walks.insert(name, walk);
        let moves = moves
            .iter()
            .map(|(node, runs, gets)| Move { node, runs, gets });
        Some(Arc::new(MoveLoss::measure(basis.to_string(), items, moves)))
    }
}

impl Walk {
    /// Ends the walk where it is over: quiet for [`WALK_QUIET`], or a new rendering after an approved
    /// hold. Notes an approval (the revision resumed with this hold on record) and a move.
    fn advance(&mut self, rev: &NetworkConfigRevision, basis: &str, moves: bool, now: Timestamp) {
        let quiet = self
            .last_move
            .is_some_and(|t| now >= t.plus_secs(WALK_QUIET.as_secs()));
        let superseded = self.approved.as_deref().is_some_and(|a| a != basis);
        if quiet || superseded {
            *self = Walk::default();
        }
        let recorded = (rev.metadata.annotations.as_ref())
            .and_then(|a| a.get(DESTRUCTIVE_CHANGE_BASIS_ANNOTATION))
            .is_some_and(|b| b == basis);
        if recorded && !rev.spec.paused {
            self.approved = Some(basis.to_string());
        }
        if moves {
            self.last_move = Some(now);
        }
    }
}
