use clap::Parser;
use netwave_agent::shell::{self, args::Args};

// One worker (#14): the agent waits on the kernel, FRR and the API server, never on its own CPU, and each
// runtime thread allocates in its own glibc malloc arena, which keeps that thread's peak resident; the
// default is a worker per core. The main loop runs on the main thread and the spawned tasks (watches,
// reports, /healthz, the netlink socket) on the worker, so a slow fsync in the loop does not stall them.
// Idle RSS in `make bench` (agent-release profile, 4-5 runs each): 2 workers 13.5-16.3 MiB, 1 worker
// 12.9-15.2, current_thread 15.0-15.2 (one arena holds every peak). Blocking work (ICMP receives) still
// goes to tokio's blocking pool.
#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Err(e) = args.check() {
        eprintln!("netwave-agent: {e}");
        std::process::exit(2);
    }
    shell::init_tracing(args.log_format);
    shell::run(args).await
}
