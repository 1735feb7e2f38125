//! netwave end-to-end harness (fleet in network namespaces); see issue 7.
