//! netwave end-to-end harness: a fleet of nodes in network namespaces on one machine, the testbed API
//! server, configurators and agents as real processes. Used by the end-to-end tests and `make demo`.
//!
//! - [`netns`]: the fabric and node namespaces (underlay 198.18.0.0/16), workload namespaces, cleanup.
//! - [`fleet`]: [`fleet::Fleet`] = namespaces + testbed + configurators + agents; manifests, rollout
//!   waits, kernel snapshots per node, testbed faults, SIGKILL, nodes joining and leaving; a no-kernel
//!   mode with simulated agents; with `FleetOptions::frr`, a real FRR per node that the agents
//!   configure, and EVPN (not the harness) installs the VXLAN flood entries.
//! - [`install`]: netwave installed with `kubectl apply -k` on a real cluster (`netwave_control_plane::node`):
//!   the test overlay, polling with the cluster's logs, what the real-node tests read back.
//! - [`peer`]: the real node's BGP neighbour (FRR in a namespace) and the EVPN checks made through it.
//! - [`probe`]: continuous UDP flows between workloads with sequence numbers: lost and reordered
//!   packets and the longest gap per flow over a window (what a change does to traffic).
//! - [`prometheus`]: the PrometheusRule's alert rules as a plain rule file, and a real Prometheus (Debian's)
//!   scraping a fleet or, with the scrape jobs the ServiceMonitors render to, a real cluster, read through
//!   its HTTP API.
//! - [`kubernetes_sd`]: Prometheus's Kubernetes endpoints discovery for Debian's Prometheus, built without
//!   it, handing the targets over as a file.
//! - [`grafana`]: the Grafana dashboard's queries as Grafana sends them (template variables substituted).

pub mod fleet;
pub mod grafana;
pub mod install;
pub mod kubernetes_sd;
pub mod netns;
pub mod peer;
pub mod probe;
pub mod prometheus;
