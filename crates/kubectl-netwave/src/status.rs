//! `status [REVISION] [-w]`: one rollout at a glance — phase, wave, progress bar, who paused it, failed
//! nodes with their reasons, what it waits on, and the nodes by state.
//!
//! ```text
//!   revision + every revision + every NNC + now ──► StatusView (pure, Serialize) ──► text | json | yaml
//!        ▲ list once, or reflector stores fed by watches (-w: re-render on every event)
//! ```
//!
//! A 5,000-node fleet must read in a screenful: nodes are listed one per line only up to
//! [`NODES_LISTED`] (or with `--all-nodes`), otherwise summarised per state with a count and the first
//! few names; failed nodes show the first [`FAILED_SHOWN`] and "and N more". Whether a node counts as
//! updated is core's rule ([`netwave_core::rollout::is_updated`]), the same the configurator counts by.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use kube::Client;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use netwave_api::vocab::{
    ConditionStatus, NodePhase, RevisionCondition, RevisionPhase, revision_reasons,
};
use netwave_api::{ASSIGNED_AT_ANNOTATION, FailedNode, NetworkConfigRevision, NodeNetworkConfig};
use netwave_core::Timestamp;
use netwave_core::rollout::{NodeConfigState, is_updated};
use netwave_core::undecodable::Kind;
use netwave_runtime::decoded::Decoded;
use serde::Serialize;

use crate::cli::{Output, StatusArgs};
use crate::cluster::{self, name};
use crate::output::{emit, names};
use crate::shared::{Exit, Term};

/// Fleets up to this size list every node; larger ones are summarised per state.
pub const NODES_LISTED: usize = 20;
/// Failed nodes listed before "and N more".
pub const FAILED_SHOWN: usize = 5;
/// Names shown per state group before "and N more".
pub const GROUP_NAMES: usize = 3;
const BAR_WIDTH: usize = 30;
/// The plugin's own node state (not a wire word): the node has the revision and its agent has not
/// reported on it yet.
const APPLYING: &str = "applying";

/// Everything `status` shows about one revision.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusView {
    pub revision: String,
    pub sequence: u64,
    pub phase: String,
    /// The newest revision that has not failed.
    pub target: Option<String>,
    /// The newest Complete revision older than this one: where failed nodes go back to.
    pub last_good: Option<String>,
    /// Assignment rounds so far: nodes given this revision at the same moment form one wave.
    pub wave: usize,
    pub total: u32,
    pub updated: u32,
    pub in_progress: u32,
    pub queued: u32,
    pub failed: u32,
    pub skipped: u32,
    /// Of `skipped`: their agent lacks a feature their config needs (`netwave_api::features`).
    #[serde(skip_serializing_if = "crate::output::is_zero")]
    pub waiting_for_agent: u32,
    pub paused: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<String>,
    /// What the rollout waits on, in the configurator's words (`status.message`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_on: Option<String>,
    /// Conditions worth a person's attention: `Progressing=False`, `Degraded=True`, `Validated=False`,
    /// a `Paused` the configurator set.
    pub notices: Vec<String>,
    pub validation_errors: Vec<String>,
    /// The first [`FAILED_SHOWN`] failed nodes.
    pub failed_nodes: Vec<FailedNode>,
    /// Failed nodes beyond those listed.
    pub failed_not_shown: usize,
    /// Nodes by state: a count and the first names.
    pub nodes: Vec<NodeGroup>,
    /// One line per node (small fleets or `--all-nodes`); empty otherwise.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub node_lines: Vec<NodeLine>,
    /// The agent versions the nodes report (`status.agentVersion`), newest count first: an agent
    /// upgrade's progress. Nodes whose agent has not reported are counted under `""`.
    pub agents: Vec<AgentCount>,
    /// Objects that cannot be decoded, each with what the configurator holds meanwhile: left out of
    /// this view as the configurator leaves them out.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentCount {
    pub version: String,
    pub nodes: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeGroup {
    pub state: String,
    pub count: usize,
    pub first: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeLine {
    pub node: String,
    pub state: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// A node's state relative to the revision shown.
fn node_state(c: &NodeNetworkConfig, rev: &str, last_good: Option<&str>) -> (String, String) {
    let st = c.status.clone().unwrap_or_default();
    if c.spec.is_placeholder() {
        // Nothing assigned yet: the configurator's annotation says what the node waits for.
        return (
            "queued".into(),
            c.queued_message().unwrap_or_default().into(),
        );
    }
    let on_rev = NodeConfigState::from_api(c).is_ok_and(|s| is_updated(&s, &rev.into()));
    if on_rev {
        return (NodePhase::Provisioned.as_str().into(), String::new());
    }
    if st.phase.as_deref() == Some(NodePhase::Invalid.as_str())
        && st.observed_revision.as_deref() == Some(rev)
    {
        let mut detail = st.reason.unwrap_or_default();
        if let Some(m) = st.message.filter(|m| !m.is_empty()) {
            // The agent's message usually starts with its reason.
            detail = if m.starts_with(&detail) {
                m
            } else {
                format!("{detail}: {m}")
            };
        }
        if let Some(g) = st.last_good_revision {
            detail.push_str(&format!(" (restored {g})"));
        }
        return (NodePhase::Invalid.as_str().into(), detail);
    }
    if c.spec.revision == rev {
        let detail = match st.phase.as_deref() {
            Some(p) if st.observed_revision.as_deref() == Some(rev) => p.to_string(),
            _ => match st.observed_revision {
                Some(o) => format!("still runs {o}"),
                None => "agent has not reported".into(),
            },
        };
        return (APPLYING.into(), detail);
    }
    let on = &c.spec.revision;
    let state = if Some(on.as_str()) == last_good {
        format!("on last good {on}")
    } else {
        format!("on {on}")
    };
    let detail = match (st.phase.as_deref(), st.observed_revision.as_deref()) {
        (Some(p), Some(o)) if o == on => {
            if p == NodePhase::Provisioned.as_str() {
                String::new()
            } else {
                p.to_string()
            }
        }
        (_, Some(o)) => format!("moving from {o}"),
        _ => "agent has not reported".into(),
    };
    (state, detail)
}

/// Builds the view of `rev` from every revision and every node config. Pure.
pub fn build<'a>(
    rev: &NetworkConfigRevision,
    revs: &[NetworkConfigRevision],
    configs: impl IntoIterator<Item = &'a NodeNetworkConfig>,
    all_nodes: bool,
) -> StatusView {
    let rname = name(rev).to_string();
    // Every field of the revision's status, named: one the configurator starts writing does not
    // compile here until the view says whether it shows it (the `_`s are shown elsewhere or by
    // other commands: phase and sequence via `cluster`, timing in `history`).
    let netwave_api::NetworkConfigRevisionStatus {
        phase: _,
        conditions,
        total,
        updated,
        in_progress,
        queued,
        failed,
        skipped,
        waiting_for_agent,
        failed_nodes,
        validation,
        started_at,
        completed_at,
        paused_at,
        paused_by: _,
        last_progress_at: _,
        canaries_updated_at: _,
        observed_retry: _,
        observed_generation: _,
        message,
        active_sequence: _,
        reactivated_at: _,
        reached: _,
    } = rev.status.clone().unwrap_or_default();
    let last_good = cluster::last_good(revs, Some(netwave_api::effective_sequence(rev)))
        .map(|r| name(r).to_string());
    let seen = by_node(configs, &rname, last_good.as_deref(), all_nodes);
    let failed_total = (failed as usize).max(failed_nodes.len());
    let failed_not_shown = failed_total.saturating_sub(FAILED_SHOWN.min(failed_nodes.len()));
    let failed_nodes: Vec<FailedNode> = failed_nodes.into_iter().take(FAILED_SHOWN).collect();
    let notices = notices(&conditions);
    StatusView {
        revision: rname,
        sequence: netwave_api::effective_sequence(rev),
        phase: cluster::phase_str(rev),
        target: cluster::target(revs).map(|r| name(r).to_string()),
        last_good,
        wave: seen.waves,
        total,
        updated,
        in_progress,
        queued,
        failed: failed_total as u32,
        skipped,
        waiting_for_agent,
        paused: rev.spec.paused,
        paused_by: cluster::paused_by(rev),
        paused_at: paused_at.map(|t| t.0.to_string()),
        started_at: started_at.map(|t| t.0.to_string()),
        completed_at: completed_at.map(|t| t.0.to_string()),
        waiting_on: message.filter(|m| !m.is_empty()),
        notices,
        validation_errors: validation.errors,
        failed_not_shown,
        failed_nodes,
        nodes: seen.groups,
        node_lines: seen.lines,
        agents: seen.agents,
        unreadable: Vec::new(),
    }
}

/// What the node configs say about revision `rname`, node by node.
struct ByNode {
    /// Assignment rounds of `rname` so far.
    waves: usize,
    groups: Vec<NodeGroup>,
    lines: Vec<NodeLine>,
    agents: Vec<AgentCount>,
}

fn by_node<'a>(
    configs: impl IntoIterator<Item = &'a NodeNetworkConfig>,
    rname: &str,
    last_good: Option<&str>,
    all_nodes: bool,
) -> ByNode {
    let mut configs: Vec<&NodeNetworkConfig> = configs.into_iter().collect();
    configs.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));

    let mut groups: BTreeMap<String, (usize, Vec<String>)> = BTreeMap::new();
    let mut agents: BTreeMap<String, usize> = BTreeMap::new();
    let mut lines = Vec::new();
    let mut waves = std::collections::BTreeSet::new();
    let list = all_nodes || configs.len() <= NODES_LISTED;
    for c in &configs {
        let node = c.metadata.name.clone().unwrap_or_default();
        if c.spec.revision == rname
            && let Some(at) = c
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ASSIGNED_AT_ANNOTATION))
        {
            // Assignments of one step share their time (to the second).
            waves.insert(Timestamp::parse_rfc3339(at).map_or(0, |t| t.0 / 1000));
        }
        let version = c.status.as_ref().and_then(|s| s.agent_version.clone());
        *agents.entry(version.unwrap_or_default()).or_default() += 1;
        let (state, detail) = node_state(c, rname, last_good);
        let g = groups.entry(state.clone()).or_default();
        g.0 += 1;
        if g.1.len() < GROUP_NAMES {
            g.1.push(node.clone());
        }
        if list {
            lines.push(NodeLine {
                node,
                state,
                detail,
            });
        }
    }
    // Provisioned first, then the troubles, then the rest.
    let rank = |s: &str| match NodePhase::parse(s) {
        Some(NodePhase::Provisioned) => 0,
        Some(NodePhase::Invalid) => 1,
        _ if s == APPLYING => 2,
        _ => 3,
    };
    let mut groups: Vec<NodeGroup> = groups
        .into_iter()
        .map(|(state, (count, first))| NodeGroup {
            state,
            count,
            first,
        })
        .collect();
    groups.sort_by(|a, b| (rank(&a.state), &a.state).cmp(&(rank(&b.state), &b.state)));

    ByNode {
        waves: waves.len(),
        groups,
        lines,
        agents: agent_counts(agents),
    }
}

/// Conditions worth a person's attention, one line each.
fn notices(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) -> Vec<String> {
    conditions
        .iter()
        .filter(|c| {
            let status = ConditionStatus::parse(&c.status);
            match RevisionCondition::parse(&c.type_) {
                Some(RevisionCondition::Progressing | RevisionCondition::Validated) => {
                    status == Some(ConditionStatus::False)
                }
                Some(RevisionCondition::Degraded) => status == Some(ConditionStatus::True),
                // An admin's own pause is not news; a hold is.
                Some(RevisionCondition::Paused) => {
                    status == Some(ConditionStatus::True)
                        && c.reason != revision_reasons::PAUSED_BY_SPEC
                }
                _ => false,
            }
        })
        .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
        .collect()
}

/// Versions by how many nodes run them, most first (then by version).
fn agent_counts(agents: BTreeMap<String, usize>) -> Vec<AgentCount> {
    let mut out: Vec<AgentCount> = agents
        .into_iter()
        .map(|(version, nodes)| AgentCount { version, nodes })
        .collect();
    out.sort_by(|a, b| {
        b.nodes
            .cmp(&a.nodes)
            .then_with(|| a.version.cmp(&b.version))
    });
    out
}

fn ago(rfc3339: &Option<String>, now: Timestamp) -> Option<String> {
    let t = Timestamp::parse_rfc3339(rfc3339.as_deref()?).ok()?;
    Some(cluster::age((now.0 - t.0) / 1000))
}

/// A node state in the demo's colours (on a terminal).
fn paint(state: &str, color: bool) -> String {
    let code = match NodePhase::parse(state) {
        Some(NodePhase::Provisioned) => "32",
        Some(NodePhase::Invalid) => "31",
        _ if state == APPLYING => "33",
        _ => return state.to_string(),
    };
    if color {
        format!("\x1b[{code}m{state}\x1b[0m")
    } else {
        state.to_string()
    }
}

/// The progress bar and the node counts (and why skipped nodes wait, when their agent is why).
fn progress(v: &StatusView) -> String {
    let total = v.total.max(1) as usize;
    let filled = (v.updated as usize * BAR_WIDTH / total).min(BAR_WIDTH);
    let mut s = format!(
        "[{}{}] {}/{} updated  {} in flight  {} failed  {} queued  {} skipped\n",
        "#".repeat(filled),
        "-".repeat(BAR_WIDTH - filled),
        v.updated,
        v.total,
        v.in_progress,
        v.failed,
        v.queued,
        v.skipped
    );
    if v.waiting_for_agent > 0 {
        s.push_str(&format!(
            "{} of the skipped node(s) wait for their agent: it cannot apply their config (see below)\n",
            v.waiting_for_agent
        ));
    }
    s
}

/// The text people read; `color` for a terminal.
pub fn render(v: &StatusView, now: Timestamp, color: bool) -> String {
    let mut s = format!(
        "revision {} (seq {})  phase {}  wave {}",
        v.revision, v.sequence, v.phase, v.wave
    );
    if let Some(a) = ago(&v.completed_at, now) {
        s.push_str(&format!("  completed {a} ago"));
    } else if let Some(a) = ago(&v.started_at, now) {
        s.push_str(&format!("  started {a} ago"));
    }
    s.push('\n');
    s.push_str(&progress(v));
    let mut roles = Vec::new();
    match &v.target {
        Some(t) if *t == v.revision => roles.push("this is the target".to_string()),
        Some(t) => roles.push(format!("target {t}")),
        None => roles.push("no target (every revision failed)".into()),
    }
    match &v.last_good {
        Some(g) => roles.push(format!("last good {g}")),
        None => roles.push("no earlier good revision".into()),
    }
    s.push_str(&roles.join("  ·  "));
    s.push('\n');
    if v.paused {
        s.push_str("PAUSED");
        match &v.paused_by {
            Some(by) => s.push_str(&format!(" by {by}")),
            None => s.push_str(" (spec.paused)"),
        }
        if let Some(a) = ago(&v.paused_at, now) {
            s.push_str(&format!(", {a} ago"));
        }
        s.push_str("; `kubectl netwave resume` continues it\n");
    }
    if let Some(w) = &v.waiting_on {
        s.push_str(&format!("waiting on: {w}\n"));
    }
    // Agents of more than one version: an upgrade (or a downgrade) is rolling.
    if v.agents.iter().filter(|a| !a.version.is_empty()).count() > 1 {
        let parts: Vec<String> = v
            .agents
            .iter()
            .map(|a| match a.version.as_str() {
                "" => format!("{} not reported", a.nodes),
                version => format!("{version} on {}", a.nodes),
            })
            .collect();
        s.push_str(&format!("agents: {}\n", parts.join("  ·  ")));
    }
    for n in &v.notices {
        s.push_str(&format!("{n}\n"));
    }
    s.push_str(&cluster::render_unreadable(&v.unreadable));
    if !v.validation_errors.is_empty() {
        s.push_str(&format!(
            "validation errors ({}):\n",
            v.validation_errors.len()
        ));
        for e in v.validation_errors.iter().take(FAILED_SHOWN) {
            s.push_str(&format!("  {e}\n"));
        }
        if v.validation_errors.len() > FAILED_SHOWN {
            s.push_str(&format!(
                "  and {} more\n",
                v.validation_errors.len() - FAILED_SHOWN
            ));
        }
    }
    if v.failed > 0 {
        s.push_str(&format!("failed nodes ({}):\n", v.failed));
        for f in &v.failed_nodes {
            if f.message.is_empty() {
                s.push_str(&format!("  {}  {}\n", f.node, f.reason));
            } else if f.message.starts_with(&f.reason) {
                s.push_str(&format!("  {}  {}\n", f.node, f.message));
            } else {
                s.push_str(&format!("  {}  {}: {}\n", f.node, f.reason, f.message));
            }
        }
        if v.failed_not_shown > 0 {
            s.push_str(&format!("  and {} more\n", v.failed_not_shown));
        }
    }
    if !v.node_lines.is_empty() {
        let w = v.node_lines.iter().map(|l| l.node.len()).max().unwrap_or(0);
        s.push_str("nodes:\n");
        for l in &v.node_lines {
            let line = format!("  {:<w$}  {}  {}", l.node, paint(&l.state, color), l.detail);
            s.push_str(line.trim_end());
            s.push('\n');
        }
    } else if !v.nodes.is_empty() {
        let count: usize = v.nodes.iter().map(|g| g.count).sum();
        let w = v.nodes.iter().map(|g| g.state.len()).max().unwrap_or(0);
        s.push_str(&format!("nodes ({count}):\n"));
        for g in &v.nodes {
            let pad = " ".repeat(w.saturating_sub(g.state.len()));
            s.push_str(&format!(
                "  {}{pad}  {:>6}  {}\n",
                paint(&g.state, color),
                g.count,
                names(&g.first, g.count)
            ));
        }
    }
    s
}

/// The revision `status` shows: the one named, else the newest. `unreadable`: the notes on objects
/// that cannot be decoded, said with the error when no revision can be shown.
fn pick<'a>(
    revs: &'a [NetworkConfigRevision],
    arg: Option<&str>,
    unreadable: &[String],
) -> anyhow::Result<&'a NetworkConfigRevision> {
    let picked = match arg {
        Some(a) => cluster::resolve(revs, a),
        None => revs.last().ok_or_else(|| {
            anyhow::anyhow!(
                "there are no revisions yet (the configurator cuts one when VRF, layer-2 or \
                 routing-table objects exist)"
            )
        }),
    };
    picked.map_err(|e| match unreadable {
        [] => e,
        _ => anyhow::anyhow!("{e}\n{}", cluster::render_unreadable(unreadable).trim_end()),
    })
}

pub async fn run(client: &Client, args: StatusArgs, term: &mut Term<'_>) -> anyhow::Result<Exit> {
    if args.watch {
        return watch(client, &args, term).await;
    }
    let revs = cluster::read_revisions(client).await?;
    let configs = cluster::read_configs(client).await?;
    // An input that cannot be read is why no revision is cut for a change: say so here too.
    let (_, inputs_unreadable) = cluster::read_live_inputs(client).await?;
    let unreadable = cluster::unreadable_notes(
        &[revs.unreadable, configs.unreadable, inputs_unreadable].concat(),
    );
    let rev = pick(&revs.items, args.revision.as_deref(), &unreadable)?;
    let mut view = build(rev, &revs.items, &configs.items, args.all_nodes);
    view.unreadable = unreadable;
    let now = crate::shared::now();
    let color = term.tty;
    emit(term.out, args.output, &view, |v| render(v, now, color))?;
    Ok(Exit::Success)
}

/// One watch event: a new error is said once on stderr (the watch retries with backoff, and the view
/// stays on screen meanwhile); the end of the stream ends the command.
fn note(ev: Option<Option<String>>, last: &mut Option<String>) -> anyhow::Result<()> {
    match ev {
        None => anyhow::bail!("the watch ended"),
        Some(Some(e)) if last.as_ref() != Some(&e) => {
            eprintln!("{e} (retrying)");
            *last = Some(e);
        }
        Some(_) => {}
    }
    Ok(())
}

/// Whether `-w --until-done` stops at this phase, and how.
fn done(phase: &str) -> Option<Exit> {
    match RevisionPhase::parse(Some(phase)) {
        Some(RevisionPhase::Complete) => Some(Exit::Success),
        Some(RevisionPhase::Failed | RevisionPhase::Superseded) => Some(Exit::RolloutFailed),
        _ => None,
    }
}

/// `-w`: two reflector stores fed by watches; the view is rebuilt after each burst of events (at most
/// every 200 ms, so a 5,000-node rollout does not redraw 5,000 times) and drawn when it changed (on a
/// terminal also once a second, for the ages).
async fn watch(client: &Client, args: &StatusArgs, term: &mut Term<'_>) -> anyhow::Result<Exit> {
    // As the configurator watches: one object that does not decode does not fail the watch.
    let (revs_r, revs_w) = reflector::store::<Decoded<NetworkConfigRevision>>();
    let (nncs_r, nncs_w) = reflector::store::<Decoded<NodeNetworkConfig>>();
    let cfg = watcher::Config::default();
    let revs_s = reflector(
        revs_w,
        watcher(
            Api::<Decoded<NetworkConfigRevision>>::all(client.clone()),
            cfg.clone(),
        )
        .default_backoff(),
    )
    .map(|e| {
        e.err()
            .map(|e| format!("watching NetworkConfigRevisions: {e}"))
    });
    let nncs_s = reflector(
        nncs_w,
        watcher(Api::<Decoded<NodeNetworkConfig>>::all(client.clone()), cfg).default_backoff(),
    )
    .map(|e| e.err().map(|e| format!("watching NodeNetworkConfigs: {e}")));
    let mut events = futures::stream::select(revs_s.boxed(), nncs_s.boxed());
    let deadline = args
        .timeout
        .map(|s| tokio::time::Instant::now() + Duration::from_secs(s));
    let timed_out = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(timed_out);

    // Until both stores have their first full list, there is nothing to show.
    let mut last_error: Option<String> = None;
    let ready = futures::future::join(revs_r.wait_until_ready(), nncs_r.wait_until_ready());
    tokio::pin!(ready);
    loop {
        tokio::select! {
            _ = &mut ready => break,
            ev = events.next() => match ev {
                Some(Some(e)) => last_error = Some(e),
                Some(None) => {}
                None => anyhow::bail!("the watch ended before the first list"),
            },
            _ = &mut timed_out => anyhow::bail!(
                "no answer from the API server within the timeout{}",
                last_error.map(|e| format!(": {e}")).unwrap_or_default()
            ),
        }
    }

    let mut shown: Option<StatusView> = None;
    let mut drawn_lines = 0usize;
    let mut waiting_drawn = false;
    loop {
        let (mut revs, mut bad) = cluster::split(Kind::Revision, revs_r.state().iter());
        cluster::sort_revisions(&mut revs);
        // The store's objects, not copies: a 5,000-node fleet is re-read every burst.
        let configs = nncs_r.state();
        bad.extend((configs.iter()).filter_map(|c| cluster::unreadable(Kind::NodeConfig, c)));
        let unreadable = cluster::unreadable_notes(&bad);
        let now = crate::shared::now();
        match pick(&revs, args.revision.as_deref(), &unreadable) {
            Ok(rev) => {
                let objects = configs.iter().filter_map(|c| c.object().map(|c| &**c));
                let mut view = build(rev, &revs, objects, args.all_nodes);
                view.unreadable = unreadable;
                let changed = shown.as_ref() != Some(&view);
                if changed || term.tty {
                    let text = match args.output {
                        Output::Text => render(&view, now, term.tty),
                        Output::Json => serde_json::to_string(&view)? + "\n",
                        Output::Yaml => format!("---\n{}", serde_saphyr::to_string(&view)?),
                    };
                    if term.tty && args.output == Output::Text && drawn_lines > 0 {
                        write!(term.out, "\x1b[{drawn_lines}A\x1b[J")?;
                    } else if drawn_lines > 0 && args.output == Output::Text && changed {
                        writeln!(term.out)?;
                    }
                    if changed || (term.tty && args.output == Output::Text) {
                        term.out.write_all(text.as_bytes())?;
                        term.out.flush()?;
                        drawn_lines = text.lines().count();
                    }
                }
                if args.until_done
                    && let Some(exit) = done(&view.phase)
                {
                    return Ok(exit);
                }
                shown = Some(view);
            }
            // A named revision that does not exist yet (or no revision at all): wait for it.
            Err(e) => {
                if !waiting_drawn {
                    writeln!(term.out, "{e}; waiting…")?;
                    term.out.flush()?;
                    waiting_drawn = true;
                }
            }
        }
        // Next event (or a tick for the ages), then let a burst of events settle.
        tokio::select! {
            ev = events.next() => note(ev, &mut last_error)?,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = &mut timed_out => anyhow::bail!("timed out after {}s", args.timeout.unwrap_or(0)),
        }
        let settle = tokio::time::sleep(Duration::from_millis(200));
        tokio::pin!(settle);
        loop {
            tokio::select! {
                ev = events.next() => note(ev, &mut last_error)?,
                _ = &mut settle => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use netwave_api::vocab::node_reasons;
    use serde_json::json;

    use super::*;

    fn rev(name: &str, seq: u64, status: serde_json::Value) -> NetworkConfigRevision {
        serde_json::from_value(json!({
            "apiVersion": "netwave.dev/v1alpha1", "kind": "NetworkConfigRevision",
            "metadata": {"name": name},
            "spec": {"hash": name, "sequence": seq},
            "status": status,
        }))
        .unwrap()
    }

    fn nnc(node: &str, rev: &str, at: &str, status: serde_json::Value) -> NodeNetworkConfig {
        serde_json::from_value(json!({
            "apiVersion": "netwave.dev/v1alpha1", "kind": "NodeNetworkConfig",
            "metadata": {"name": node, "annotations": {ASSIGNED_AT_ANNOTATION: at}},
            "spec": {"revision": rev, "sequence": 1, "configHash": "h", "config": {}},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn a_5000_node_fleet_reads_in_a_screenful() {
        let failed: Vec<serde_json::Value> = (0..42)
            .map(|i| json!({"node": format!("node-{i:04}"), "reason": node_reasons::APPLY_TIMEOUT, "message": ""}))
            .collect();
        let revs = vec![
            rev(
                "rev-old",
                1,
                json!({"phase": RevisionPhase::Complete.as_str()}),
            ),
            rev(
                "rev-new",
                2,
                json!({"phase": RevisionPhase::Progressing.as_str(), "total": 5000, "updated": 3000, "inProgress": 500,
                       "failed": 42, "queued": 1458, "failedNodes": failed}),
            ),
        ];
        let mut configs = Vec::new();
        for i in 0..5000 {
            let n = format!("node-{i:04}");
            let wave = format!("2026-11-23T10:{:02}:00Z", i / 500);
            configs.push(match i {
                0..42 => nnc(&n, "rev-old", &wave, json!({"phase": NodePhase::Invalid.as_str(), "observedRevision": "rev-new", "reason": node_reasons::APPLY_TIMEOUT})),
                42..3042 => nnc(&n, "rev-new", &wave, json!({"phase": NodePhase::Provisioned.as_str(), "observedRevision": "rev-new"})),
                3042..3542 => nnc(&n, "rev-new", &wave, json!({"phase": NodePhase::Provisioning.as_str(), "observedRevision": "rev-new"})),
                _ => nnc(&n, "rev-old", &wave, json!({"phase": NodePhase::Provisioned.as_str(), "observedRevision": "rev-old"})),
            });
        }
        let t = std::time::Instant::now();
        let view = build(&revs[1], &revs, &configs, false);
        let text = render(&view, Timestamp(0), false);
        assert!(render(&view, Timestamp(0), true).contains("\x1b[31mInvalid\x1b[0m"));
        let took = t.elapsed();
        println!("{text}\nbuilt and rendered in {took:?}");
        assert!(text.lines().count() < 25, "{text}");
        assert!(
            text.contains("3000/5000 updated  500 in flight  42 failed"),
            "{text}"
        );
        assert!(
            text.contains("node-0004  ApplyTimeout\n  and 37 more\n"),
            "{text}"
        );
        assert!(text.contains("nodes (5000):"), "{text}");
        assert!(
            text.contains(
                "Provisioned             3000  node-0042, node-0043, node-0044 and 2997 more"
            ),
            "{text}"
        );
        assert!(
            text.contains("Invalid                   42  node-0000"),
            "{text}"
        );
        assert!(text.contains("on last good rev-old    1458"), "{text}");
        assert!(took < std::time::Duration::from_secs(2), "{took:?}");
        assert_eq!(view.node_lines.len(), 0);
        // --all-nodes lists them.
        assert_eq!(
            build(&revs[1], &revs, &configs, true).node_lines.len(),
            5000
        );
    }

    /// An agent upgrade's progress: the versions the nodes' agents report, most first; said in the
    /// text only while more than one runs.
    #[test]
    fn the_agents_versions_show_an_upgrade_rolling() {
        let revs = vec![rev(
            "rev-a",
            1,
            json!({"phase": RevisionPhase::Complete.as_str(), "total": 4, "updated": 4}),
        )];
        let at = "2026-11-28T10:00:00Z";
        let on = |v: &str| json!({"phase": "Provisioned", "observedRevision": "rev-a", "agentVersion": v});
        let configs = [
            nnc("n1", "rev-a", at, on("0.1.0")),
            nnc("n2", "rev-a", at, on("0.2.0")),
            nnc("n3", "rev-a", at, on("0.2.0")),
            nnc("n4", "rev-a", at, json!({})),
        ];
        let view = build(&revs[0], &revs, &configs, false);
        let counts: Vec<(&str, usize)> = (view.agents.iter())
            .map(|a| (a.version.as_str(), a.nodes))
            .collect();
        assert_eq!(counts, [("0.2.0", 2), ("", 1), ("0.1.0", 1)]);
        let text = render(&view, Timestamp(0), false);
        assert!(
            text.contains("agents: 0.2.0 on 2  ·  1 not reported  ·  0.1.0 on 1\n"),
            "{text}"
        );
        // Once every agent runs one version, nothing is said.
        let done = build(&revs[0], &revs, &configs[1..3], false);
        assert!(!render(&done, Timestamp(0), false).contains("agents:"));
    }

    /// Nodes whose agent cannot apply their config are counted apart from the other skipped ones,
    /// and the revision's message (shown as what it waits on) names them and what they lack.
    #[test]
    fn nodes_waiting_for_their_agent_are_counted_and_named() {
        let message = "3 node(s) wait for their agent: their config needs ruleFwmark (since 0.2.0), \
                       which their agent does not declare (upgrade it; they keep what they run \
                       meanwhile): n2, n3, n4";
        let revs = vec![rev(
            "rev-fw",
            2,
            json!({"phase": RevisionPhase::Complete.as_str(), "total": 4, "updated": 1,
                   "skipped": 3, "waitingForAgent": 3, "message": message}),
        )];
        let view = build(&revs[0], &revs, &[], false);
        assert_eq!(view.waiting_for_agent, 3);
        let text = render(&view, Timestamp(0), false);
        assert!(
            text.contains("3 of the skipped node(s) wait for their agent")
                && text.contains(message),
            "{text}"
        );
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(json["waitingForAgent"], 3, "{json}");
    }

    #[test]
    fn a_revision_failed_by_validation_says_why() {
        let errors: Vec<String> = (0..7)
            .map(|i| format!("Layer2NetworkConfiguration/seg{i} spec.vni: 7 is taken by VRFRouteConfiguration/x"))
            .collect();
        let revs = vec![rev(
            "rev-bad",
            1,
            json!({"phase": RevisionPhase::Failed.as_str(), "validation": {"errors": errors},
                   "conditions": [{"type": RevisionCondition::Validated.as_str(), "status": ConditionStatus::False.as_str(), "reason": revision_reasons::VALIDATION_FAILED,
                                   "message": "7 error(s)", "lastTransitionTime": "2026-11-23T10:00:00Z"}]}),
        )];
        let text = render(&build(&revs[0], &revs, &[], false), Timestamp(0), false);
        println!("{text}");
        assert!(text.contains("no target (every revision failed)"), "{text}");
        assert!(
            text.contains("Validated=False ValidationFailed: 7 error(s)"),
            "{text}"
        );
        assert!(
            text.contains("validation errors (7):\n  Layer2NetworkConfiguration/seg0 spec.vni"),
            "{text}"
        );
        assert!(text.contains("  and 2 more\n"), "{text}");
    }
}
