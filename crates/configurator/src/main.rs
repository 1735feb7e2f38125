use clap::Parser;
use netwave_configurator::{args::Args, runtime};

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
