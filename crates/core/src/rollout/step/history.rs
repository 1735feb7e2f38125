//! Stage 9: history (DESIGN.md §3 **History**): keep the newest `revisionHistoryLimit` revisions and
//! every revision something still needs.

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
    // The revisions past the limit, but the target and the last good one; most steps have none, and
    // then no node needs looking at (the passes over every node are what a step costs, #28).
    let kept: Vec<&Sym> = (w.target.into_iter().chain(last_good_after))
        .map(|i| w.revs[i].name())
        .collect();
    let mut candidates: Vec<&Sym> = (w.revs.iter())
        .skip(w.input.defaults.revision_history_limit)
        .map(|r| r.name())
        .filter(|name| !kept.contains(name))
        .collect();
    for n in &w.nodes {
        if candidates.is_empty() {
            break;
        }
        let spec = n.spec.map(|s| s.revision);
        let last_good = n.status.last_good_revision.as_ref();
        candidates.retain(|c| Some(*c) != spec && Some(*c) != last_good);
    }
    candidates.into_iter().map(ToString::to_string).collect()
}
