//! `netwave-testbed [--bind 127.0.0.1] --port 0 --kubeconfig <path> [--crds <dir>]`: serves until interrupted and
//! prints the address on stdout.

use std::path::PathBuf;

use clap::Parser;
use netwave_testbed::{Testbed, TestbedOptions};

#[derive(Parser, Debug)]
#[command(about = "In-memory Kubernetes API server for netwave's tests and demo")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    bind: std::net::IpAddr,
    /// Port (0 picks a free one).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Where to write the kubeconfig.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// Directory of CRD YAML files to install at start.
    #[arg(long)]
    crds: Option<PathBuf>,
    /// Events kept for watches (older resourceVersions get 410 Gone).
    #[arg(long, default_value_t = 20_000)]
    history: usize,
    /// Disable garbage collection of ownerReferences dependents.
    #[arg(long)]
    no_gc: bool,
}

/// mimalloc, not glibc's malloc: the server's JSON trees made allocation half of its CPU in a
/// 5,000-node rollout, and at 15,000 nodes the testbed saturated a core of its own (#28).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let tb = Testbed::start(TestbedOptions {
        bind: args.bind,
        port: args.port,
        kubeconfig: Some(args.kubeconfig),
        crd_dir: args.crds,
        history_limit: args.history,
        garbage_collection: !args.no_gc,
        ..TestbedOptions::default()
    })
    .await?;
    println!("{}", tb.url());
    tokio::signal::ctrl_c().await?;
    tb.shutdown().await;
    Ok(())
}
