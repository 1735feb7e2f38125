//! netwave-agent: applies one node's network config with netlink, checks connectivity, keeps a durable
//! copy of the last good config and reports `Provisioned` or `Invalid` (DESIGN.md §4).
//!
//! ```text
//!  NodeConfig + NodeSettings ──► model::desired ──► Dataplane ─┐
//!  kernel ──► netlink::observe ──► Observed ───────────────────┴► diff::diff ──► Vec<NetOp> (pure)
//!                                                                  │
//!                        netlink::apply (pipelined writes) ◄───────┘ ──► verify (diff must be empty)
//!  health probes ──► health::verdict (pure gating) ──► reconcile: Provisioned | restore last good → Invalid
//!  backup: last good config + revision + checksum, atomic; `applying` marker around every apply
//! ```
//!
//! Pure decision code (`model`, `diff`, `health::verdict`, `reconcile::decide`) is kept apart from the
//! code that does I/O (`netlink`, `backup`, `health` probes, the Kubernetes shell).

pub mod backup;
pub mod diff;
pub mod health;
pub mod model;
pub mod netlink;
pub mod reconcile;
pub mod shell;
