use clap::Parser;
use netwave_configurator::{args::Args, runtime};

/// mimalloc, not glibc's malloc: see the workspace's Cargo.toml.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// One worker thread. The reconcile is one task that computes on one core, and every watch event
/// handed from the connection's task to its watch's task on another thread was a wake-up across
/// threads. Measured at 5,000 nodes on 2 cores (#28, one benchmark run each, whole-run `perf stat`):
/// half the context switches (leader 162k to 70k, standby 106k to 60k), 10-13 % less CPU, the same
/// reaction times; at 15,000 nodes the leader's peak RSS fell from 245 to 217 MiB (fewer allocator
/// heaps).
#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Err(e) = args.check() {
        eprintln!("netwave-configurator: {e}");
        std::process::exit(2);
    }
    runtime::init_tracing(args.log_format);
    runtime::run(args).await
}
