//! Stage 9: history (DESIGN.md §3 **History**): keep the newest `revisionHistoryLimit` revisions and
//! every revision something still needs.

use std::collections::BTreeSet;

use super::super::world::World;
use crate::sym::Sym;

/// Revisions to delete: beyond the history limit and referenced by nothing.
///
/// Judged on the world after this plan (so the next step agrees): a node's spec once the plan's
/// assignments are written, its agent's last good revision, the target and the last good revision
/// (`last_good_after`, the target if it completes now). The shell stops at the first failed write, so a
/// revision is only deleted once the assignments moving nodes off it are written.
pub(super) fn history_deletions(w: &World, last_good_after: Option<usize>) -> Vec<String> {
    // A node whose config cannot be read may run or fall back to any revision.
    if !w.input.unreadable_configs.is_empty() {
        return Vec::new();
    }
    let mut protected: BTreeSet<&Sym> = BTreeSet::new();
    for n in &w.nodes {
        if let Some(s) = n.spec {
            protected.insert(s.revision);
        }
        if let Some(lg) = &n.status.last_good_revision {
            protected.insert(lg);
        }
    }
    for i in w.target.into_iter().chain(last_good_after) {
        protected.insert(w.revs[i].name());
    }
    w.revs
        .iter()
        .skip(w.input.defaults.revision_history_limit)
        .filter(|r| !protected.contains(r.name()))
        .map(|r| r.name().to_string())
        .collect()
}
