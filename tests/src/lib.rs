//! netwave end-to-end harness: a fleet of nodes in network namespaces on one machine, the testbed API
//! server, configurators and agents as real processes. Used by the end-to-end tests and `make demo`.

pub mod fleet;
pub mod netns;
