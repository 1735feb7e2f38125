//! Test support (the `testing` feature, which only dev-dependencies enable): the arguments of a
//! configurator that a test runs in its own process, in one place for this crate's tests and the
//! plugin's.

use crate::args::Args;

/// Timings for a test: a leader's lease lost within seconds, resyncs and input settling fast.
pub const FAST_TIMINGS: [&str; 10] = [
    "--lease-duration",
    "3s",
    "--renew-deadline",
    "2s",
    "--retry-period",
    "300ms",
    "--resync-interval",
    "2s",
    "--input-settle",
    "300ms",
];

/// The arguments of an in-process configurator in a test: [`FAST_TIMINGS`], metrics and health on
/// ports the kernel picks, text logs, then `extra` (which may override any of them). Checked as the
/// binary checks them.
pub fn args(extra: &[&str]) -> Args {
    use clap::Parser;
    let mut argv = vec!["netwave-configurator"];
    argv.extend_from_slice(&FAST_TIMINGS);
    argv.extend_from_slice(&[
        "--metrics-addr",
        "127.0.0.1:0",
        "--health-addr",
        "127.0.0.1:0",
        "--log-format",
        "text",
    ]);
    argv.extend_from_slice(extra);
    let args = Args::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    if let Err(e) = args.check() {
        panic!("{argv:?}: {e}");
    }
    args
}
