//! The rollout state machine: [`step`](step())`(input, now) -> Plan`. DESIGN.md §3 is the contract.
//!
//! ```text
//!   shell (configurator leader)                 core (this module, pure)
//!   ───────────────────────────                 ────────────────────────
//!   watch caches ──► RolloutInput ─────────────► step(input, now): stages over one World (step.rs)
//!     revisions (spec knobs + status)              observe_fleet       nodes ⋈ NNCs, orphaned NNCs
//!     nodes (labels, Ready, cordoned)              evaluate_revisions  newest first: re-arm on
//!     NNCs (spec + agent report)                     spec.retry, validation errors → Failed, failures
//!     rendered configHash per (rev, node)            ≥ maxFailures → Failed; first survivor = target
//!                                                  order_and_budgets   domains, round-robin, budgets
//!                                                  rollback_intents → new_node_intents →
//!                                                    target_rollout_intents (canaries, bake, order)
//!   apply Plan::writes() in order ◄─────────────   admit_under_budget  free moves first, then budgeted
//!     statuses → NNC specs → deletions             history_deletions   beyond the limit, unreferenced
//!   record Events, requeue at report.requeue_at    report              statuses (status.rs) + Events
//! ```
//!
//! Modules: `world` holds what one evaluated step is (nodes, revisions and their fate, the target's
//! view) and what *updated* / *in flight* mean; `step` runs the stages over it; `status` turns it into
//! each revision's status; `vocab` spells every phase, condition and reason once. `step` and `status`
//! both import `world`; `status` never imports `step`.
//!
//! Per revision, `status.phase` moves like this (every arrow is decided by one step from API state):
//!
//! ```text
//!            validation errors                       retry changes
//!   (new) ──────────────────────────► Failed ◄───────────────────────┐ (re-armed: back to Pending/
//!     │                                 ▲  maxFailures reached       │  Progressing, failures cleared)
//!     ▼          first assignment       │                           │
//!   Pending ───────────────────► Progressing ──────► Complete (sticky: the last good revision)
//!     │                              │  all eligible updated
//!     └──────────┬───────────────────┘
//!                ▼ a newer revision became the target
//!           Superseded (target again if every newer one fails)
//! ```
//!
//! Only the last good revision reads `Complete`: one that completed before a newer one did reads
//! `Superseded` (its `completedAt` stays). When the inputs go back to an older revision's, the
//! configurator does not change its spec (`spec.sequence` stays its creation order): it records the
//! reactivation in status (`activeSequence`, `reactivatedAt`, a fresh `Pending`) and an Event, and the
//! revision rolls out afresh, `Progressing` until its nodes are back, then `Complete`. Revisions are
//! ordered by `netwave_api::effective_sequence` (`activeSequence` when set); `kubectl get ncr
//! --sort-by=.spec.sequence` lists them in creation order.
//!
//! # Why it is built this way
//!
//! - **No memory between steps.** Everything the machine needs is in the API objects: failures in
//!   `status.failedNodes`, the attempt in `status.observedRetry`, bake and deadline clocks in
//!   `status.canariesUpdatedAt` / `status.lastProgressAt`, assignment times in the `assigned-at`
//!   annotation. A new leader rebuilds [`RolloutInput`] from its caches and continues exactly where the
//!   old one stopped — it never reverts because it restarted.
//! - **Partial plans are safe.** [`Plan::writes`] orders status before assignments: a failure and the
//!   `Failed` phase are on record before any node is rolled back, and a revision is `Validated` before any
//!   node gets it. A leader that dies after any write leaves a state the next step continues from.
//! - **Idempotent.** Timestamps are taken from `now` only at transitions (truncated to the second, as the
//!   API server stores them) and kept afterwards; messages never say "N seconds left". Applying a plan and
//!   stepping again over the unchanged world yields an empty plan, so the shell never hot-loops.
//!
//! # Rules (DESIGN.md §3), as implemented
//!
//! - **Target**: the newest revision (by sequence) that is not `Failed`. A revision with fleet validation
//!   errors goes `Failed` (errors in `status.validation`) before it touches a node. A `Complete` revision
//!   is never failed afterwards: it is the proven last good one, so a node failing it later is recorded
//!   (`Degraded=True`) instead of rolling back the fleet.
//! - **Updated** for R: spec R, agent reports `Provisioned` for R (and for the config hash the spec holds,
//!   when it reports one). **In flight**: the spec differs from what the agent reports as provisioned,
//!   whatever revision ([`is_in_flight`]). A fast-path assignment (same config hash) is not in flight,
//!   and neither is a node whose agent reported `Invalid` for exactly its spec: it restored its last
//!   good config and stopped (otherwise failed nodes with nowhere to go would hold slots forever). Its
//!   reported hash is the restored config's, so moving it back to the last good revision is free.
//! - **Budget**: new in-flight nodes only while in flight < `maxUnavailable` (count, or share of the
//!   eligible nodes) and, with `topologyKey`, < `maxUnavailablePerDomain` in the node's domain. All
//!   in-flight nodes count, whatever revision and whether Ready or not: a node we cannot see may be one we
//!   broke, and counting it keeps "at most maxUnavailable nodes disrupted by us" true when it returns.
//!   Moves that do not add an in-flight node (superseding a node already in flight, a fast path, a
//!   rollback of a node that never started or already restored) are free and are planned before
//!   budgeted ones. A node moving to the last good revision finishes that before it takes the target.
//! - **Not Ready / cordoned** nodes are never *made* in flight: they are counted `skipped`, left for later
//!   and get the target when they return; they do not block completion. A node that goes Not Ready while
//!   applying the target stays in flight and its apply timeout runs (a config that cuts a node off is the
//!   failure this machine exists to catch). A node that leaves is forgotten; its NNC is deleted.
//! - **New nodes** (no NNC) get the last good revision until the target has an updated node (or while the
//!   rollout is paused), then the target. Without a last good revision (first rollout) they are ordinary
//!   candidates in rollout order. The last good revision is given to a joining node without waiting for
//!   the budget: nothing of ours runs there to disrupt and the revision is proven; the node is in flight
//!   until its agent reports, so the target's rollout waits for it, but it never waits behind a stuck
//!   rollout itself.
//! - **Failure** of N on R: the agent reports `Invalid` for R with R's current retry, or R was assigned
//!   (current retry) `applyTimeoutSeconds` ago and N is not updated. Each failure is recorded once in
//!   R's `failedNodes` and N goes back to the last good revision; R is never retried on N automatically.
//!   "The last good revision" is the one before R even when N's failure is what lets R complete in the
//!   same step (every other node updated): R becomes the last good revision, N stays on the previous one.
//! - **maxFailures** reached: R → `Failed`; every node assigned R is reassigned the last good revision
//!   (rollbacks first, same budget). `spec.retry` re-arms R (failures cleared, agents re-apply). Without a
//!   last good revision nothing more is assigned and the status says so.
//! - **Fail forward**: a newer revision becomes the target right away; nodes still on the failed one go
//!   to the last good revision first.
//! - **Order**: canaries first (`canary.count` first eligible nodes in order, or `canary.selector`), then
//!   wait `canary.bakeSeconds` after the last canary is updated, then failure domains round-robin (domains
//!   sorted by name), then node name.
//! - **Pause**: no new assignments of the target; nodes in flight finish; rollbacks continue; new nodes
//!   get the last good revision; `status.pausedAt`.
//! - **Progress deadline**: no node updated for `progressDeadlineSeconds` (not counting a bake, not
//!   while paused) → `Progressing=False`, reason `ProgressDeadlineExceeded`, and an Event.
//! - **History**: keep the newest `revisionHistoryLimit`; never delete the target, the last good one, or
//!   one a node's spec or `lastGoodRevision` references.
//! - **Fast path**: a node whose rendered config for R has the hash its agent reports running
//!   (`Provisioned`) is moved to R without spending budget; the agent only reports `Provisioned` for R.
//! - **Hold** (DESIGN.md §6): a target that takes more than `destructiveThreshold` percent of the last
//!   good revision's (node, object) placements off the nodes, or all of them, is halted like a paused
//!   one until an admin resumes it; the step records the hold (`spec.paused`, annotations) before
//!   anything else ([`hold`] says what is measured and what approval means).
//! - **Quarantine** (opt-in, #27): a node that failed `quarantine.afterConsecutiveFailures` revisions in
//!   a row that other nodes provisioned is quarantined: its failures stop counting against
//!   `maxFailures`, it keeps its last good config and gets nothing new until an admin releases it; a
//!   node that failed the last revisions gets the next one last ([`quarantine`] says why and where
//!   the record lives).

mod accepted;
pub mod cut;
pub mod deadline;
pub mod health;
pub mod hold;
mod input;
pub mod loss;
mod plan;
mod policy;
pub mod quarantine;
mod status;
mod step;
mod time;
mod vocab;
mod world;

pub use accepted::{
    InputVerdicts, ObjectVerdict, input_status, input_status_uncut, input_verdicts,
};
pub use input::{
    AgentPhase, AgentReport, AssignedSpec, InputError, NodeConfigState, NodeState, RenderedHashes,
    RevisionState, RolloutInput,
};
pub use plan::{
    AssignReason, Assignment, Event, EventReason, EventType, ObjectRef, Plan, Report, StatusUpdate,
    WaitingOn, Write,
};
pub use policy::{
    Budget, BudgetError, CanaryNodes, CanaryPolicy, Policy, PolicyDefaults, PolicyError, resolve,
};
pub use quarantine::{NodeRecord, RecordUpdate};
pub use step::{StepMemo, counters_only, last_good, revisions_to_render, step, step_every_round};
pub use time::TimeError;
pub use vocab::{
    CONDITION_TYPES, ConditionType, Phase, REASON_APPLY_TIMEOUT, REASON_PICKUP_TIMEOUT,
    REASON_PROTOCOL_VIOLATION, reasons,
};
pub use world::{is_in_flight, is_updated};
