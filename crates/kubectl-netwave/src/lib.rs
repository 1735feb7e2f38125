//! `kubectl netwave`: follow and steer netwave rollouts from a terminal.
//!
//! ```text
//!   kubectl netwave …  ──► cli (clap) ──► cluster (reads: revisions, NNCs, Nodes, inputs)
//!                                          │
//!                     pure views ◄─────────┘  status::StatusView, history::Row, changes (per-node
//!                     (no I/O, `now` passed)  config diff via core::render), plan (core::fleet +
//!                          │                  core::rollout::step for the waves)
//!                          ▼
//!                     text / -o json / -o yaml ──► stdout
//!   writes (pause, resume, retry, abort, undo) ──► actions: patches and server-side apply with the
//!                                                  field manager `kubectl-netwave`
//! ```
//!
//! Imports flow one way: this root dispatches to the commands (status, history, actions, changes,
//! plan, clusters), and the commands use what they share from below them (`shared`: exit codes, the terminal,
//! the clock; `output`; `cluster`), never from the root.
//!
//! Everything that decides what a revision renders to, whether it validates and how it would roll out
//! is `netwave-core`'s; this crate only reads objects, asks core, and prints. The views are plain data
//! (`Serialize`), so the text a person reads and the JSON/YAML a script reads come from one place.

pub mod actions;
pub mod changes;
pub mod cli;
pub mod cluster;
pub mod clusters;
pub mod history;
pub mod output;
pub mod plan;
pub mod shared;
pub mod status;

use anyhow::Context;
pub use cli::Cli;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
pub use shared::{Exit, Term, now};

/// The binary's entry: client from `--kubeconfig`/`--context` (else `KUBECONFIG`, `~/.kube/config`, in
/// cluster), output to stdout.
pub async fn main(cli: Cli) -> anyhow::Result<Exit> {
    use std::io::IsTerminal;
    let mut stdout = std::io::stdout();
    let tty = stdout.is_terminal();
    let mut term = Term {
        out: &mut stdout,
        tty,
    };
    // `clusters` reads every context itself.
    if let cli::Command::Clusters(a) = cli.command {
        return clusters::run(cli.kubeconfig.as_deref(), a, &mut term).await;
    }
    let client = client(&cli).await;
    match (client, &cli.command) {
        // `plan --nodes` needs no cluster: without one it plans against the snapshot alone.
        (Err(e), cli::Command::Plan(_)) if plan_offline(&cli) => {
            eprintln!(
                "note: no cluster ({e:#}): planning against --nodes only, with no current target"
            );
            let cli::Command::Plan(a) = cli.command else {
                unreachable!("matched above")
            };
            plan::run(None, a, &mut term).await
        }
        (client, _) => run(cli, client?, &mut term).await,
    }
}

fn plan_offline(cli: &Cli) -> bool {
    matches!(&cli.command, cli::Command::Plan(a) if a.nodes.is_some())
}

async fn client(cli: &Cli) -> anyhow::Result<Client> {
    let options = KubeConfigOptions {
        context: cli.context.clone(),
        ..Default::default()
    };
    let config = match &cli.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &options).await?
        }
        None if cli.context.is_some() => kube::Config::from_kubeconfig(&options).await?,
        None => kube::Config::infer()
            .await
            .context("no kubeconfig found (set KUBECONFIG or pass --kubeconfig)")?,
    };
    Ok(Client::try_from(config)?)
}

/// Runs one command against `client`.
pub async fn run(cli: Cli, client: Client, term: &mut Term<'_>) -> anyhow::Result<Exit> {
    use cli::Command;
    match cli.command {
        Command::Status(a) => status::run(&client, a, term).await,
        Command::History(a) => history::run(&client, a, term).await,
        Command::Pause(a) => actions::pause(&client, a, true, term).await,
        Command::Resume(a) => actions::pause(&client, a, false, term).await,
        Command::Retry(a) => actions::retry(&client, a, term).await,
        Command::Undo(a) => actions::undo(&client, a, term).await,
        Command::Abort(a) => actions::abort(&client, a, term).await,
        Command::Diff(a) => changes::run(&client, a, term).await,
        Command::Plan(a) => plan::run(Some(&client), a, term).await,
        Command::Release(a) => actions::release(&client, a, term).await,
        // Every context of the kubeconfig, not this client's cluster alone.
        Command::Clusters(a) => clusters::run(cli.kubeconfig.as_deref(), a, term).await,
    }
}
