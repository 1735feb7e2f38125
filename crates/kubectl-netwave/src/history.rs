//! `history`: every revision, oldest first, with its phase, how far its rollout got, its age and which
//! one is the target and which the last good one.

use std::collections::BTreeMap;

use kube::Client;
use netwave_api::kinds::{Input, Visit, each_kind};
use netwave_api::{NetworkConfigRevision, RevisionInputs};
use netwave_core::Timestamp;
use serde::Serialize;

use crate::cli::HistoryArgs;
use crate::cluster::{self, name};
use crate::output::emit;
use crate::shared::{Exit, Term};

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    pub name: String,
    pub sequence: u64,
    pub phase: String,
    /// The newest revision that has not failed: what the rollout moves nodes to.
    pub target: bool,
    /// The newest Complete revision: where failed nodes go back to.
    pub last_good: bool,
    /// Nodes updated of the fleet as far as its rollout got while it was the target (`status.reached`;
    /// the live counts for a revision a configurator before 0.2.0 left).
    pub updated: u32,
    pub total: u32,
    /// Nodes that run it now.
    pub running: u32,
    pub failed: u32,
    pub paused: bool,
    pub retry: u32,
    /// Seconds since the revision was created.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub age_seconds: Option<i64>,
    /// Input objects: VRFs, layer-2 segments, routing tables.
    pub inputs: String,
}

/// The rows for every revision, oldest first, with `inputs` by revision name. Pure.
pub fn rows(
    revs: &[NetworkConfigRevision],
    inputs: &BTreeMap<String, RevisionInputs>,
    now: Timestamp,
) -> Vec<Row> {
    let target = cluster::target(revs).map(name);
    let last_good = cluster::last_good(revs, None).map(name);
    revs.iter()
        .map(|r| {
            let st = r.status.clone().unwrap_or_default();
            let reached = cluster::reached(r).unwrap_or_default();
            Row {
                name: name(r).to_string(),
                sequence: netwave_api::effective_sequence(r),
                phase: cluster::phase_str(r),
                target: target == Some(name(r)),
                last_good: last_good == Some(name(r)),
                updated: reached.updated,
                total: reached.total,
                running: st.updated,
                failed: st.failed,
                paused: r.spec.paused,
                retry: r.spec.retry,
                age_seconds: r
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| cluster::secs_since(t, now)),
                inputs: inputs
                    .get(name(r))
                    .map_or_else(|| "inputs gone".to_string(), counts),
            }
        })
        .collect()
}

/// `1 vrf, 1 l2, 1 rt`: how many objects of each kind a revision holds (kinds with none left out).
fn counts(inputs: &RevisionInputs) -> String {
    struct Counts<'a>(&'a RevisionInputs, Vec<String>);
    impl Visit for Counts<'_> {
        fn visit<K: Input>(&mut self) {
            let n = K::named(self.0).len();
            if n > 0 {
                self.1.push(format!("{n} {}", K::KIND.short_name()));
            }
        }
    }
    let mut c = Counts(inputs, Vec::new());
    each_kind(&mut c);
    if c.1.is_empty() {
        return "no inputs".into();
    }
    c.1.join(", ")
}

/// A kubectl-style table.
pub fn render(rows: &[Row]) -> String {
    if rows.is_empty() {
        return "no revisions yet (the configurator cuts one when VRF, layer-2 or routing-table \
                objects exist)\n"
            .into();
    }
    let mut table = vec![[
        "SEQ".to_string(),
        "REVISION".into(),
        "PHASE".into(),
        "UPDATED".into(),
        "FAILED".into(),
        "PAUSED".into(),
        "AGE".into(),
        "INPUTS".into(),
        "".into(),
    ]];
    for r in rows {
        let mut role = Vec::new();
        if r.target {
            role.push("<- target");
        }
        if r.last_good {
            role.push(if r.target {
                "last good"
            } else {
                "<- last good"
            });
        }
        table.push([
            r.sequence.to_string(),
            r.name.clone(),
            r.phase.clone(),
            format!("{}/{}", r.updated, r.total),
            r.failed.to_string(),
            if r.paused { "yes" } else { "" }.into(),
            r.age_seconds.map(cluster::age).unwrap_or_default(),
            r.inputs.clone(),
            role.join(", "),
        ]);
    }
    let widths: Vec<usize> = (0..9)
        .map(|c| table.iter().map(|row| row[c].len()).max().unwrap_or(0))
        .collect();
    let mut s = String::new();
    for row in &table {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        s.push_str(line.join("   ").trim_end());
        s.push('\n');
    }
    s
}

pub async fn run(client: &Client, args: HistoryArgs, term: &mut Term<'_>) -> anyhow::Result<Exit> {
    let revs = cluster::read_revisions(client).await?;
    let inputs = cluster::read_all_inputs(client).await?;
    let rows = rows(
        &revs.items,
        &inputs.items.into_iter().collect(),
        crate::shared::now(),
    );
    let unreadable = cluster::unreadable_notes(&[revs.unreadable, inputs.unreadable].concat());
    let block = cluster::render_unreadable(&unreadable);
    // The rows stay one list in JSON and YAML: the objects that cannot be read go to stderr there.
    if args.output != crate::cli::Output::Text {
        eprint!("{block}");
    }
    emit(term.out, args.output, &rows, |r| render(r) + &block)?;
    Ok(Exit::Success)
}
