//! netwave-agent: applies one node's network config with netlink, checks connectivity, keeps a durable
//! copy of the last good config and reports `Provisioned` or `Invalid` (DESIGN.md §4).
//!
//! ```text
//!  NodeConfig + NodeSettings ──► core::dataplane::desired ──► Dataplane ─┐
//!  kernel ──► netlink::observe ──► Observed ─────────────────────────────┴► dataplane::diff ──► Vec<NetOp>
//!                                                                  │
//!                        netlink::apply (pipelined writes) ◄───────┘ ──► verify (diff must be empty)
//!  health probes ──► health::verdict (pure gating) ──► reconcile: Provisioned | restore last good → Invalid
//!  backup: last good config + revision + checksum, atomic; `applying` marker around every apply
//!  FRR (--frr-config): core::frr::render ─► frr: vtysh -C, frr.conf (atomic), frr-reload.py, --test
//! ```
//!
//! What a config means (the desired dataplane, the kernel's identities and defaults, the ordered
//! operations) is `netwave_core::dataplane`, the same code fleet validation runs before a revision
//! reaches any node. Here: the I/O (`netlink`, `backup`, `health` probes, the Kubernetes shell) and the
//! agent's own pure decisions (`health::verdict`, `reconcile::decide`).

pub mod backup;
pub mod drill;
pub mod frr;
pub mod health;
pub mod netlink;
pub mod reconcile;
pub mod shell;
pub mod sim;
pub mod upgrade;
