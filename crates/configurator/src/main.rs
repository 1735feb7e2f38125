use clap::Parser;
use netwave_configurator::{args::Args, runtime};

/// mimalloc, not glibc's malloc: see the workspace's Cargo.toml.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Err(e) = args.check() {
        eprintln!("netwave-configurator: {e}");
        std::process::exit(2);
    }
    runtime::init_tracing(args.log_format);
    runtime::run(args).await
}
