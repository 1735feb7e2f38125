//! The writes: `pause`, `resume`, `retry`, `undo`, `abort`, `release`. Each names what it changes before it does,
//! writes with the field manager `kubectl-netwave` (so `status` can say who paused), and leaves every
//! decision about nodes to the configurator.
//!
//! ```text
//!   pause/resume ──► merge patch spec.paused
//!   retry        ──► merge patch spec.retry + 1 (resourceVersion precondition: no lost bump)
//!   undo         ──► InputChanges (pure: live inputs vs the revision's spec.inputs), and whether the
//!                      configurator will hold it (core's rule against the last good revision)
//!                      ──► server-side apply of each created/changed object (forced), then a merge patch
//!                          removing spec fields other managers still own, then deletes
//!   abort        ──► pause the target, then undo to the last good revision
//!   release      ──► merge patch removing a NodeNetworkConfig's netwave.dev/quarantined annotation
//!                      (resourceVersion precondition)
//! ```

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use netwave_api::kinds::{Input, Visit, each_kind};
use netwave_api::vocab::RevisionPhase;
use netwave_api::{InputKind, NetworkConfigRevision, RevisionInputs};
use netwave_core::render::NodeInfo;
use netwave_core::rollout::hold::{self, Footprint};
use serde::Serialize;
use serde_json::{Value, json};

use crate::cli::{AbortArgs, Output, ReleaseArgs, TargetArgs, UndoArgs};
use crate::cluster::{self, FIELD_MANAGER, name};
use crate::output::emit;
use crate::shared::{Exit, Term};

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

async fn set_paused(client: &Client, rev: &str, paused: bool) -> anyhow::Result<()> {
    Api::<NetworkConfigRevision>::all(client.clone())
        .patch(
            rev,
            &patch_params(),
            &Patch::Merge(json!({"spec": {"paused": paused}})),
        )
        .await
        .with_context(|| format!("setting spec.paused of {rev}"))?;
    Ok(())
}

/// `pause` (`paused = true`) and `resume`.
pub async fn pause(
    client: &Client,
    args: TargetArgs,
    paused: bool,
    term: &mut Term<'_>,
) -> anyhow::Result<Exit> {
    let revs = cluster::revisions(client).await?;
    let rev = cluster::resolve_or_target(&revs, args.revision.as_deref())?;
    let rname = name(rev);
    let seq = netwave_api::effective_sequence(rev);
    if rev.spec.paused == paused {
        let by = cluster::paused_by(rev)
            .map(|b| format!(" (by {b})"))
            .unwrap_or_default();
        let state = if paused {
            format!("already paused{by}")
        } else {
            "not paused".into()
        };
        writeln!(term.out, "{rname} (seq {seq}) is {state}: nothing to do")?;
        return Ok(Exit::Success);
    }
    set_paused(client, rname, paused).await?;
    if paused {
        writeln!(
            term.out,
            "paused {rname} (seq {seq}): no new node gets it; nodes applying it finish; failed nodes \
             still roll back.\n`kubectl netwave resume {seq}` continues it."
        )?;
    } else {
        writeln!(
            term.out,
            "resumed {rname} (seq {seq}): the rollout continues (`kubectl netwave status -w` follows it)"
        )?;
    }
    Ok(Exit::Success)
}

/// `release NODE`: lifts a quarantine (`rollout::quarantine`) by removing the annotation that records
/// it, over the object as read.
pub async fn release(
    client: &Client,
    args: ReleaseArgs,
    term: &mut Term<'_>,
) -> anyhow::Result<Exit> {
    let api = Api::<netwave_api::NodeNetworkConfig>::all(client.clone());
    let node = args.node.as_str();
    let nnc = api
        .get(node)
        .await
        .with_context(|| format!("reading NodeNetworkConfig {node}"))?;
    let annotations = nnc.metadata.annotations.clone().unwrap_or_default();
    let Some(note) = annotations.get(netwave_api::QUARANTINED_ANNOTATION) else {
        writeln!(term.out, "{node} is not quarantined: nothing to do")?;
        return Ok(Exit::Success);
    };
    api.patch(
        node,
        &patch_params(),
        &Patch::Merge(json!({"metadata": {
            "resourceVersion": nnc.metadata.resource_version,
            "annotations": {netwave_api::QUARANTINED_ANNOTATION: null},
        }})),
    )
    .await
    .with_context(|| {
        format!(
            "removing {} of {node} (it changed meanwhile? run again)",
            netwave_api::QUARANTINED_ANNOTATION
        )
    })?;
    writeln!(
        term.out,
        "released {node} (quarantined {note}): it gets the next revision like any node, and its \
         failures count again"
    )?;
    Ok(Exit::Success)
}

pub async fn retry(client: &Client, args: TargetArgs, term: &mut Term<'_>) -> anyhow::Result<Exit> {
    let revs = cluster::revisions(client).await?;
    let rev = match args.revision.as_deref() {
        Some(a) => cluster::resolve(&revs, a)?,
        None => match revs.iter().rev().find(|r| cluster::is_failed(r)) {
            Some(r) => r,
            None => bail!("no revision has failed: nothing to retry"),
        },
    };
    let rname = name(rev);
    if !cluster::is_failed(rev) {
        bail!(
            "{rname} is {}, not Failed: nothing to retry (retry re-arms a failed revision)",
            cluster::phase_str(rev)
        );
    }
    let (old, new) = (rev.spec.retry, rev.spec.retry + 1);
    // The resourceVersion makes this a compare-and-swap: two admins retrying at once bump it once.
    Api::<NetworkConfigRevision>::all(client.clone())
        .patch(
            rname,
            &patch_params(),
            &Patch::Merge(json!({
                "metadata": {"resourceVersion": rev.metadata.resource_version},
                "spec": {"retry": new},
            })),
        )
        .await
        .with_context(|| {
            format!("bumping spec.retry of {rname} (it changed meanwhile? run again)")
        })?;
    writeln!(
        term.out,
        "retrying {rname} (seq {}): spec.retry {old} → {new}; its failures are cleared and agents re-apply it",
        netwave_api::effective_sequence(rev)
    )?;
    if let Some(t) = revs.iter().rev().find(|r| {
        !cluster::is_failed(r)
            && netwave_api::effective_sequence(r) > netwave_api::effective_sequence(rev)
    }) {
        writeln!(
            term.out,
            "note: {} (seq {}) is newer and the target; {rname} becomes the target again only if every \
             newer revision fails",
            name(t),
            netwave_api::effective_sequence(t)
        )?;
    }
    Ok(Exit::Success)
}

/// What bringing a revision's inputs back changes on the cluster, by kind.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InputChanges {
    /// `Kind/name`.
    pub create: Vec<String>,
    /// `Kind/name: field old → new, …`.
    pub update: Vec<String>,
    pub delete: Vec<String>,
    pub unchanged: usize,
}

impl InputChanges {
    pub fn is_empty(&self) -> bool {
        self.create.is_empty() && self.update.is_empty() && self.delete.is_empty()
    }
}

/// Every input kind as (kind, name → spec JSON), in the kinds' list order.
fn by_kind(i: &RevisionInputs) -> Vec<(InputKind, BTreeMap<String, Value>)> {
    struct Specs<'a>(
        &'a RevisionInputs,
        Vec<(InputKind, BTreeMap<String, Value>)>,
    );
    impl Visit for Specs<'_> {
        fn visit<K: Input>(&mut self) {
            let specs = K::named(self.0)
                .iter()
                .map(|o| (o.name.clone(), value(&o.spec)));
            self.1.push((K::KIND, specs.collect()));
        }
    }
    let mut s = Specs(i, Vec::new());
    each_kind(&mut s);
    s.1
}

/// The changes that turn `live` into `want`. Pure.
pub fn input_changes(live: &RevisionInputs, want: &RevisionInputs) -> InputChanges {
    let mut c = InputChanges::default();
    for ((kind, l), (_, w)) in by_kind(live).into_iter().zip(by_kind(want)) {
        for (n, ws) in &w {
            match l.get(n) {
                None => c.create.push(format!("{kind}/{n}")),
                Some(ls) if ls != ws => c.update.push(format!(
                    "{kind}/{n}: {}",
                    crate::changes::spec_fields(ls, ws)
                )),
                Some(_) => c.unchanged += 1,
            }
        }
        for n in l.keys().filter(|n| !w.contains_key(*n)) {
            c.delete.push(format!("{kind}/{n}"));
        }
    }
    c
}

/// A JSON merge patch that turns `live` into `want` exactly (keys `want` lacks become `null`).
fn merge_diff(live: &Value, want: &Value) -> Value {
    match (live, want) {
        (Value::Object(l), Value::Object(w)) => {
            let mut out = serde_json::Map::new();
            for (k, wv) in w {
                match l.get(k) {
                    Some(lv) if lv == wv => {}
                    Some(lv) => {
                        out.insert(k.clone(), merge_diff(lv, wv));
                    }
                    None => {
                        out.insert(k.clone(), wv.clone());
                    }
                }
            }
            for k in l.keys().filter(|k| !w.contains_key(*k)) {
                out.insert(k.clone(), Value::Null);
            }
            Value::Object(out)
        }
        _ => want.clone(),
    }
}

/// Server-side applies `spec` to `kind/name` (forced: the revision is what the admin asked for), then
/// removes spec fields another manager still owns that `spec` lacks (apply only removes fields its own
/// manager owned), so the object ends up with exactly the revision's spec.
async fn put(client: &Client, kind: InputKind, name: &str, spec: &Value) -> anyhow::Result<()> {
    let api = Api::<DynamicObject>::all_with(client.clone(), &kind.api_resource());
    let obj = json!({
        "apiVersion": format!("{}/{}", netwave_api::GROUP, netwave_api::VERSION),
        "kind": kind.as_str(),
        "metadata": {"name": name},
        "spec": spec,
    });
    let applied = api
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(obj),
        )
        .await
        .with_context(|| format!("applying {kind}/{name}"))?;
    let live = applied.data.get("spec").cloned().unwrap_or(Value::Null);
    if &live != spec {
        api.patch(
            name,
            &patch_params(),
            &Patch::Merge(json!({"spec": merge_diff(&live, spec)})),
        )
        .await
        .with_context(|| format!("removing fields of {kind}/{name} the revision does not have"))?;
    }
    Ok(())
}

async fn delete(client: &Client, kind: InputKind, name: &str) -> anyhow::Result<()> {
    let api = Api::<DynamicObject>::all_with(client.clone(), &kind.api_resource());
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("deleting {kind}/{name}")),
    }
}

/// Makes the cluster's inputs equal `want`, kind by kind in the kinds' list order (VRFs first:
/// segments name them; then layer-2 segments, routing tables, BGP peerings that name segments, mirrors
/// that name both); deletions in the opposite order.
async fn apply_inputs(
    client: &Client,
    want: &RevisionInputs,
    c: &InputChanges,
) -> anyhow::Result<()> {
    let touched = |kind: InputKind, n: &str| {
        let key = format!("{kind}/{n}");
        c.create.contains(&key) || c.update.iter().any(|u| u.starts_with(&format!("{key}: ")))
    };
    for (kind, specs) in by_kind(want) {
        for (n, spec) in specs.iter().filter(|(n, _)| touched(kind, n)) {
            put(client, kind, n, spec).await?;
        }
    }
    for d in c.delete.iter().rev() {
        let (kind, n) = d.split_once('/').expect("Kind/name");
        let kind = InputKind::from_kind(kind).expect("deletions name input kinds");
        delete(client, kind, n).await?;
    }
    Ok(())
}

fn value<T: Serialize>(spec: &T) -> Value {
    serde_json::to_value(spec).expect("API types serialize")
}

/// What `undo` (and `abort`) will do, shown before it is done.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UndoView {
    /// `abort` only: the revision paused first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pause: Option<String>,
    pub to: String,
    pub to_sequence: u64,
    pub changes: InputChanges,
    /// The revision brought back would be held as a destructive change (the configurator's rule,
    /// [`hold_of`]): what it removes from the last good revision.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
    /// `dry run`, `not applied: pass --yes`, or `applied`.
    pub outcome: String,
}

/// Whether the revision `to` (inputs `to_inputs`), as the target, is one the configurator holds: it is
/// measured against the last good revision on the current nodes by core's rule
/// (`rollout::hold::destructive`), exactly as the configurator measures a revision it cuts or makes
/// the target again (`undo` brings one back, `plan` cuts one). `None` when it is the last good
/// revision, there is none, or it is not destructive.
pub fn hold_of(
    last_good: Option<(&str, &RevisionInputs)>,
    to: &str,
    to_inputs: &RevisionInputs,
    nodes: &[NodeInfo],
    threshold_percent: u32,
) -> Option<String> {
    let (lg, lg_inputs) = last_good.filter(|(lg, _)| *lg != to)?;
    let baseline = Footprint::of(lg_inputs, nodes);
    let candidate = Footprint::of(to_inputs, nodes);
    hold::destructive(lg, &baseline, &candidate, threshold_percent).map(|r| r.to_string())
}

fn render_undo(v: &UndoView) -> String {
    let mut s = String::new();
    if let Some(p) = &v.pause {
        s.push_str(&format!("1. pause {p}: no further node gets it\n2. "));
    }
    s.push_str(&format!(
        "bring back the inputs of {} (seq {}):\n",
        v.to, v.to_sequence
    ));
    let c = &v.changes;
    if c.is_empty() {
        s.push_str("  the inputs on the cluster already equal it: nothing to change\n");
    }
    for x in &c.create {
        s.push_str(&format!("  + create {x}\n"));
    }
    for x in &c.update {
        s.push_str(&format!("  ~ update {x}\n"));
    }
    for x in &c.delete {
        s.push_str(&format!("  - delete {x}\n"));
    }
    if c.unchanged > 0 {
        s.push_str(&format!("  ({} objects unchanged)\n", c.unchanged));
    }
    if let Some(what) = &v.held {
        s.push_str(&format!(
            "held: going back to {} {what}: the configurator holds it as a destructive change \
             (Paused, DestructiveChange) and moves no node until an admin approves it with `kubectl \
             netwave resume` once it is the target\n",
            v.to
        ));
    }
    s.push_str(&format!("{}\n", v.outcome));
    s
}

/// Shows the changes, then (with `--yes`) pauses `pause` and applies them.
#[allow(clippy::too_many_arguments)]
async fn undo_to(
    client: &Client,
    revs: &[NetworkConfigRevision],
    to: &NetworkConfigRevision,
    pause: Option<&NetworkConfigRevision>,
    yes: bool,
    dry_run: bool,
    output: Output,
    command: &str,
    threshold: u32,
    term: &mut Term<'_>,
) -> anyhow::Result<Exit> {
    let live = cluster::live_inputs(client).await?;
    let to_inputs = cluster::inputs_of(client, name(to)).await?;
    let changes = input_changes(&live, &to_inputs);
    let held = match cluster::last_good(revs, None).filter(|lg| name(lg) != name(to)) {
        Some(lg) => {
            let lg_inputs = cluster::inputs_of(client, name(lg)).await?;
            let nodes = cluster::node_infos(&cluster::nodes(client).await?);
            hold_of(
                Some((name(lg), &lg_inputs)),
                name(to),
                &to_inputs,
                &nodes,
                threshold,
            )
        }
        None => None,
    };
    let mut view = UndoView {
        pause: pause.map(|p| format!("{} (seq {})", name(p), netwave_api::effective_sequence(p))),
        to: name(to).to_string(),
        to_sequence: netwave_api::effective_sequence(to),
        changes,
        held,
        outcome: String::new(),
    };
    let (outcome, exit) = if dry_run {
        ("dry run: nothing written".to_string(), Exit::Success)
    } else if !yes {
        (
            format!("nothing written: run `kubectl netwave {command} --yes` to do this"),
            Exit::NotConfirmed,
        )
    } else {
        if let Some(p) = pause
            && !p.spec.paused
        {
            set_paused(client, name(p), true).await?;
        }
        apply_inputs(client, &to_inputs, &view.changes).await?;
        let what = if view.held.is_some() {
            "holds it until an admin resumes it (`kubectl netwave resume`); then it moves the nodes \
             back to it"
        } else {
            "moves the nodes back to it"
        };
        (
            format!(
                "done: the configurator makes {} the target again and {what} (`kubectl netwave \
                 status -w` follows it)",
                view.to
            ),
            Exit::Success,
        )
    };
    view.outcome = outcome;
    emit(term.out, output, &view, render_undo)?;
    Ok(exit)
}

pub async fn undo(client: &Client, args: UndoArgs, term: &mut Term<'_>) -> anyhow::Result<Exit> {
    let revs = cluster::revisions(client).await?;
    let target = cluster::target(&revs);
    let to = match args.to.as_deref() {
        Some(a) => {
            let r = cluster::resolve(&revs, a)?;
            if cluster::is_failed(r) {
                bail!(
                    "{} failed: undo brings back good revisions only (`kubectl netwave retry {}` \
                     re-arms it)",
                    name(r),
                    netwave_api::effective_sequence(r)
                );
            }
            r
        }
        None => match cluster::last_good(&revs, target.map(netwave_api::effective_sequence)) {
            Some(r) => r,
            None => bail!(
                "no Complete revision older than the target {}: nothing to go back to (`kubectl \
                 netwave history` lists the revisions; --to names one)",
                target.map(name).unwrap_or("(none)")
            ),
        },
    };
    undo_to(
        client,
        &revs,
        to,
        None,
        args.yes,
        args.dry_run,
        args.output,
        "undo",
        args.destructive_threshold,
        term,
    )
    .await
}

pub async fn abort(client: &Client, args: AbortArgs, term: &mut Term<'_>) -> anyhow::Result<Exit> {
    let revs = cluster::revisions(client).await?;
    let Some(target) = cluster::target(&revs) else {
        bail!(
            "no revision is rolling out (every revision failed, or there are none): nothing to abort"
        );
    };
    if cluster::phase(target) == Some(RevisionPhase::Complete) {
        bail!(
            "{} (seq {}) is Complete: nothing is rolling out. `kubectl netwave undo` brings an earlier \
             revision back",
            name(target),
            netwave_api::effective_sequence(target)
        );
    }
    let Some(to) = cluster::last_good(&revs, Some(netwave_api::effective_sequence(target))) else {
        bail!(
            "{} is the first rollout: there is no earlier Complete revision to roll back to. `kubectl \
             netwave pause` stops it",
            name(target)
        );
    };
    // Back to the last good revision itself: never held.
    undo_to(
        client,
        &revs,
        to,
        Some(target),
        args.yes,
        args.dry_run,
        args.output,
        "abort",
        hold::DEFAULT_DESTRUCTIVE_THRESHOLD,
        term,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_merge_diff_removes_what_the_target_lacks() {
        let live =
            json!({"vrf": "a", "mtu": 1500, "nodeSelector": {"matchLabels": {"x": "1", "y": "2"}}});
        let want = json!({"vrf": "a", "nodeSelector": {"matchLabels": {"x": "1"}}});
        assert_eq!(
            merge_diff(&live, &want),
            json!({"mtu": null, "nodeSelector": {"matchLabels": {"y": null}}})
        );
    }
}
