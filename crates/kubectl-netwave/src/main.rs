//! `kubectl-netwave`: the `kubectl netwave` plugin. Everything lives in the library (`kubectl_netwave`);
//! this only parses arguments, builds the client and maps the outcome to an exit code.

use clap::Parser;
use kubectl_netwave::{Cli, Exit};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime starts");
    let result = rt.block_on(async {
        tokio::select! {
            r = kubectl_netwave::main(cli) => r,
            _ = tokio::signal::ctrl_c() => Ok(Exit::Interrupted),
        }
    });
    match result {
        Ok(exit) => exit.code(),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}
