//! What moving nodes to a revision's rendering takes off them (`netwave_core::rollout::loss`),
//! measured on the configs they run: the step holds a target whose moves take too much, whatever
//! caused it (a Node label change re-rendering the last good revision included).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use netwave_api::NodeNetworkConfig;
use netwave_core::rollout::loss::{self, Move, MoveLoss};

use crate::memory::Rendered;
use crate::watch::CONFIG_ITEMS;

type Items = Arc<BTreeSet<String>>;

/// The items of each config, by configHash: computed once per config (a config's items depend only
/// on its content), kept while a reconcile uses them.
#[derive(Default)]
pub(crate) struct ItemMemo {
    items: HashMap<String, Items>,
    used: HashSet<String>,
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

    /// Forgets the items no reconcile since the last call used.
    pub(crate) fn retain_used(&mut self) {
        let used = std::mem::take(&mut self.used);
        self.items.retain(|h, _| used.contains(h));
    }

    /// What moving every node whose config differs from its rendering in `r` takes off it, against
    /// everything the fleet runs (`configs`, sorted by name). `None` when no node would move: the
    /// fleet's configs are not even looked at.
    pub(crate) fn move_loss(
        &mut self,
        r: &Rendered,
        configs: &[Arc<NodeNetworkConfig>],
    ) -> Option<Arc<MoveLoss>> {
        let running = || configs.iter().filter(|c| !c.spec.is_placeholder());
        let moving: Vec<_> = running()
            .filter_map(|c| {
                let rn = r.nodes.get(c.metadata.name.as_deref()?)?;
                (rn.config_hash != c.spec.config_hash).then_some((c, rn))
            })
            .collect();
        if moving.is_empty() {
            return None;
        }
        let mut items = 0u64;
        for c in running() {
            items += self.runs(c).len() as u64;
        }
        let moves: Vec<(&str, Items, Items)> = (moving.iter())
            .map(|(c, rn)| {
                let runs = self.runs(c);
                let gets = self.of(&rn.config_hash, || loss::config_items(&rn.config()));
                (c.metadata.name.as_deref().unwrap_or_default(), runs, gets)
            })
            .collect();
        let basis = (r.basis.get_or_init(|| loss::rendering_basis(&r.hashes))).clone();
        let moves = moves
            .iter()
            .map(|(node, runs, gets)| Move { node, runs, gets });
        Some(Arc::new(MoveLoss::measure(basis, items, moves)))
    }
}
