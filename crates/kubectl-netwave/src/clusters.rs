//! `clusters`: one line per kubeconfig context — each cluster's target revision, its phase and how far
//! it got, and its last good revision — for a change rolled across many clusters (#50). Every cluster
//! is asked at once, each within `--timeout`; one that cannot be reached or read says why on its own
//! line and the others are shown.
//!
//! ```text
//!   kubeconfig contexts ──► per context: client ──► cluster::read_revisions ──► Row ──► table | json | yaml
//! ```

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use netwave_api::NetworkConfigRevision;
use serde::Serialize;

use crate::cli::ClustersArgs;
use crate::cluster::{self, name};
use crate::output::emit;
use crate::shared::{Exit, Term};

/// One cluster, as its netwave reports it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    pub context: String,
    /// The newest revision that has not failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sequence: Option<u64>,
    /// The target's phase; `Held` when it waits for an admin's approval, `Paused` when paused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Nodes updated of the fleet, as far as the target's rollout got.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total: Option<u32>,
    /// The newest revision that failed after the target was cut, if any: a change this cluster
    /// stopped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_good: Option<String>,
    /// Revisions that cannot be decoded (left out, as the configurator leaves them out).
    #[serde(skip_serializing_if = "crate::output::is_zero")]
    pub unreadable: u32,
    /// Why the cluster could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The row of one cluster from its revisions. Pure.
pub fn row(context: &str, revs: &[NetworkConfigRevision], unreadable: usize) -> Row {
    let target = cluster::target(revs);
    let failed = revs
        .iter()
        .rev()
        .find(|r| cluster::is_failed(r))
        .filter(|f| {
            target.is_none_or(|t| {
                netwave_api::effective_sequence(f) > netwave_api::effective_sequence(t)
            })
        });
    let reached = target.and_then(cluster::reached);
    let phase = target.map(|t| {
        let held = (t.metadata.annotations.as_ref())
            .is_some_and(|a| a.contains_key(netwave_core::revision::DESTRUCTIVE_CHANGE_ANNOTATION));
        match (t.spec.paused, held) {
            (true, true) => "Held".to_string(),
            (true, false) => "Paused".to_string(),
            _ => cluster::phase_str(t),
        }
    });
    Row {
        context: context.to_string(),
        target: target.map(|t| name(t).to_string()),
        sequence: target.map(netwave_api::effective_sequence),
        phase,
        updated: reached.as_ref().map(|r| r.updated),
        total: reached.as_ref().map(|r| r.total),
        failed: failed.map(|f| name(f).to_string()),
        last_good: cluster::last_good(revs, None).map(|r| name(r).to_string()),
        unreadable: unreadable as u32,
        error: None,
    }
}

/// A kubectl-style table.
pub fn render(rows: &[Row]) -> String {
    let mut table = vec![
        [
            "CONTEXT",
            "TARGET",
            "SEQ",
            "PHASE",
            "UPDATED",
            "LAST GOOD",
            "NOTE",
        ]
        .map(String::from),
    ];
    for r in rows {
        let mut note = Vec::new();
        if let Some(f) = &r.failed {
            note.push(format!("{f} failed"));
        }
        if r.unreadable > 0 {
            note.push(format!("{} revision(s) cannot be read", r.unreadable));
        }
        if let Some(e) = &r.error {
            note.push(e.clone());
        }
        if r.error.is_none() && r.target.is_none() {
            note.push("no revision yet".into());
        }
        let opt = |o: &Option<String>| o.clone().unwrap_or_else(|| "-".into());
        table.push([
            r.context.clone(),
            opt(&r.target),
            r.sequence.map_or("-".into(), |s| s.to_string()),
            opt(&r.phase),
            match (r.updated, r.total) {
                (Some(u), Some(t)) => format!("{u}/{t}"),
                _ => "-".into(),
            },
            opt(&r.last_good),
            note.join("; "),
        ]);
    }
    let widths: Vec<usize> = (0..7)
        .map(|c| table.iter().map(|row| row[c].len()).max().unwrap_or(0))
        .collect();
    let mut s = String::new();
    for row in &table {
        let line: Vec<String> = (row.iter().zip(&widths))
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        s.push_str(line.join("   ").trim_end());
        s.push('\n');
    }
    s
}

/// One context's row: its client, its revisions, within `timeout`.
async fn read(kubeconfig: &Kubeconfig, context: &str, timeout: Duration) -> Row {
    let read = async {
        let options = KubeConfigOptions {
            context: Some(context.to_string()),
            ..Default::default()
        };
        let config = kube::Config::from_custom_kubeconfig(kubeconfig.clone(), &options).await?;
        let client = Client::try_from(config)?;
        let revs = cluster::read_revisions(&client).await?;
        anyhow::Ok(row(context, &revs.items, revs.unreadable.len()))
    };
    let failed = |error: String| Row {
        context: context.to_string(),
        target: None,
        sequence: None,
        phase: None,
        updated: None,
        total: None,
        failed: None,
        last_good: None,
        unreadable: 0,
        error: Some(error),
    };
    let server = server_of(kubeconfig, context).unwrap_or("its server");
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(row)) => row,
        Ok(Err(e)) => failed(format!("{server}: {e:#}")),
        Err(_) => failed(format!("{server}: no answer within {}s", timeout.as_secs())),
    }
}

/// The server URL of `context`'s cluster.
fn server_of<'a>(kc: &'a Kubeconfig, context: &str) -> Option<&'a str> {
    let ctx = kc
        .contexts
        .iter()
        .find(|c| c.name == context)?
        .context
        .as_ref()?;
    let cluster = kc.clusters.iter().find(|c| c.name == ctx.cluster)?;
    cluster.cluster.as_ref()?.server.as_deref()
}

/// `clusters`: every context named (`--contexts`), else every context of the kubeconfig, in its order.
pub async fn run(
    kubeconfig: Option<&Path>,
    args: ClustersArgs,
    term: &mut Term<'_>,
) -> anyhow::Result<Exit> {
    let kc = match kubeconfig {
        Some(path) => Kubeconfig::read_from(path)
            .with_context(|| format!("reading kubeconfig {}", path.display()))?,
        None => {
            Kubeconfig::read().context("reading the kubeconfig ($KUBECONFIG or ~/.kube/config)")?
        }
    };
    let contexts: Vec<String> = match &args.contexts {
        Some(named) => {
            for c in named {
                anyhow::ensure!(
                    kc.contexts.iter().any(|n| n.name == *c),
                    "context {c} is not in the kubeconfig"
                );
            }
            named.clone()
        }
        None => kc.contexts.iter().map(|c| c.name.clone()).collect(),
    };
    anyhow::ensure!(!contexts.is_empty(), "the kubeconfig has no contexts");
    let timeout = Duration::from_secs(args.timeout);
    let rows = futures::future::join_all(contexts.iter().map(|c| read(&kc, c, timeout))).await;
    emit(term.out, args.output, &rows, |r| render(r))?;
    Ok(Exit::Success)
}
