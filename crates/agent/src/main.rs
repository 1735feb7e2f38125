use clap::Parser;
use netwave_agent::shell::{self, args::Args};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Err(e) = args.check() {
        eprintln!("netwave-agent: {e}");
        std::process::exit(2);
    }
    shell::init_tracing(args.log_format);
    shell::run(args).await
}
