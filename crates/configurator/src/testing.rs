//! Test support (the `testing` feature, which only dev-dependencies enable): the arguments of a
//! configurator that a test runs, in one place for this crate's tests, the plugin's and the e2e fleet's.

use crate::args::Args;

/// A leader's lease lost within seconds, so failover tests end in seconds.
pub const LEASE_TIMINGS: [&str; 6] = [
    "--lease-duration",
    "3s",
    "--renew-deadline",
    "2s",
    "--retry-period",
    "300ms",
];

/// Resyncs and input settling fast.
pub const LOOP_TIMINGS: [&str; 4] = ["--resync-interval", "2s", "--input-settle", "300ms"];

/// Metrics and health on ports the kernel picks, text logs: many configurators on one host.
pub const LOCAL_ENDPOINTS: [&str; 6] = [
    "--metrics-addr",
    "127.0.0.1:0",
    "--health-addr",
    "127.0.0.1:0",
    "--log-format",
    "text",
];

/// The arguments of an in-process configurator in a test: [`LEASE_TIMINGS`], [`LOOP_TIMINGS`],
/// [`LOCAL_ENDPOINTS`], then `extra` (a later value of an option replaces an earlier one). Checked as
/// the binary checks them.
pub fn args(extra: &[&str]) -> Args {
    use clap::Parser;
    let mut argv = vec!["netwave-configurator"];
    argv.extend_from_slice(&LEASE_TIMINGS);
    argv.extend_from_slice(&LOOP_TIMINGS);
    argv.extend_from_slice(&LOCAL_ENDPOINTS);
    argv.extend_from_slice(extra);
    let args = Args::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    if let Err(e) = args.check() {
        panic!("{argv:?}: {e}");
    }
    args
}
