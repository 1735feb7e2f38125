//! netwave end-to-end harness: a fleet of nodes in network namespaces on one machine, the testbed API
//! server, configurators and agents as real processes. Used by the end-to-end tests and `make demo`.
//!
//! - [`netns`]: the fabric and node namespaces (underlay 198.18.0.0/16), workload namespaces, cleanup.
//! - [`fleet`]: [`fleet::Fleet`] = namespaces + testbed + configurators + agents; manifests, rollout
//!   waits, kernel snapshots per node, testbed faults, SIGKILL, nodes joining and leaving; a no-kernel
//!   mode with simulated agents; with `FleetOptions::frr`, a real FRR per node that the agents
//!   configure, and EVPN (not the harness) installs the VXLAN flood entries.
//! - [`prometheus`]: the PrometheusRule's alert rules as a plain rule file, and a real Prometheus (Debian's)
//!   scraping a fleet, read through its HTTP API.

pub mod fleet;
pub mod netns;
pub mod prometheus;
