//! `plan -f DIR`: what applying a directory of manifests would do, computed the way the configurator
//! would, without writing anything.
//!
//! ```text
//!   DIR ──parse_manifests──► RevisionInputs ──core::fleet::render_and_validate──► errors / warnings
//!   Nodes (live or --nodes)    │                                               └► per-node configs
//!   current target ──render──► per-node configs ──changes::node_changes──► grouped per-node diff
//!   both renderings ──waves() = core::rollout::step, every agent answering at once──► the waves
//! ```
//!
//! The waves come from the rollout state machine itself ([`netwave_core::rollout::step`]) run over a
//! settled fleet (every node Provisioned on the current target) where each agent reports success as
//! soon as it is assigned, so they show the order and the budget's effect, not timings.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use netwave_api::features::FeatureSet;
use netwave_api::manifest::{Manifest, parse_manifests};
use netwave_api::{
    NetworkConfigRevision, NetworkConfigRevisionStatus, RevisionInputs, RolloutPolicy,
    ValidationResult,
};
use netwave_core::fleet::{FleetParams, render_and_validate};
use netwave_core::render::RenderedNode;
use netwave_core::revision::{canonical_inputs, inputs_hash, naming_of, revision_name_as};
use netwave_core::rollout::{
    AgentPhase, AgentReport, AssignReason, AssignedSpec, NodeConfigState, NodeState, Phase, Plan,
    PolicyDefaults, RenderedHashes, RevisionState, RolloutInput, step,
};
use netwave_core::undecodable::Undecodable;
use netwave_core::{Sequence, Sym, Timestamp};
use serde::Serialize;

use crate::actions::{InputChanges, hold_of, input_changes};
use crate::changes::{NodeChanges, node_changes, render_changes};
use crate::cli::PlanArgs;
use crate::cluster::{self, name};
use crate::output::{emit, names};
use crate::shared::{Exit, Term};

/// Reads every manifest under `path` (a file, or a directory walked recursively; `*.yaml`, `*.yml`,
/// `*.json`, in name order) into canonical inputs. Errors name the file, document and field.
pub fn read_inputs(path: &Path) -> anyhow::Result<RevisionInputs> {
    let mut files = Vec::new();
    collect(path, &mut files)?;
    if files.is_empty() {
        bail!(
            "{}: no *.yaml, *.yml or *.json files to read",
            path.display()
        );
    }
    let mut inputs = RevisionInputs::default();
    let mut seen: BTreeMap<(String, String), String> = BTreeMap::new();
    for f in files {
        let text =
            std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
        let source = f.display().to_string();
        for m in parse_manifests(&source, &text)? {
            let kind = match &m {
                Manifest::Input(o) => o.kind().as_str(),
                Manifest::Revision(_) | Manifest::NodeConfig(_) => bail!(
                    "{source}: {} is written by the configurator, not an input: plan reads {} \
                     objects",
                    m.name(),
                    netwave_api::InputKind::ALL
                        .iter()
                        .map(|k| k.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            let key = (kind.to_string(), m.name().to_string());
            if let Some(first) = seen.insert(key, source.clone()) {
                bail!(
                    "{kind}/{} is defined twice: in {first} and in {source}",
                    m.name()
                );
            }
            if inputs.add(m).is_err() {
                unreachable!("refused above")
            }
        }
    }
    // As the configurator folds them: cut for this build's render version.
    netwave_core::render::stamp_render_version(&mut inputs, netwave_core::render::RENDER_VERSION);
    Ok(canonical_inputs(&inputs))
}

fn collect(path: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    if meta.is_file() {
        out.push(path.to_path_buf());
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .with_context(|| format!("reading directory {}", path.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    entries.sort();
    for p in entries {
        if p.is_dir() {
            collect(&p, out)?;
        } else if p
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"))
        {
            out.push(p);
        }
    }
    Ok(())
}

/// A Node list as `kubectl get nodes -o yaml|json` writes it (a `List` with `items`), or one Node.
pub fn read_nodes(path: &Path) -> anyhow::Result<Vec<Node>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let doc: serde_json::Value = serde_saphyr::from_str(&text)
        .with_context(|| format!("{}: not valid YAML or JSON", path.display()))?;
    let items = match doc.get("items") {
        Some(serde_json::Value::Array(items)) => items.clone(),
        _ if doc.get("kind").and_then(|k| k.as_str()) == Some("Node") => vec![doc],
        _ => bail!(
            "{}: want a Node list (`kubectl get nodes -o yaml`) or a Node",
            path.display()
        ),
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            serde_json::from_value(v)
                .with_context(|| format!("{}: items[{i}] is not a Node", path.display()))
        })
        .collect()
}

/// Nodes given the new revision at one step of the simulated rollout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Wave {
    /// Nodes that apply a new config in this wave.
    pub count: usize,
    pub first: Vec<String>,
    pub canary: bool,
    /// Nodes moved to the revision in this wave without applying anything (same config).
    pub fast_path: usize,
}

/// The simulated rollout.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Waves {
    pub waves: Vec<Wave>,
    /// Nodes not Ready or cordoned: skipped, they get the revision when they come back.
    pub skipped: usize,
    /// Nodes whose agent lacks a feature their new config needs: left on what they run until their
    /// agent is upgraded (`netwave_api::features`), with what they lack.
    #[serde(skip_serializing_if = "crate::output::is_zero")]
    pub waiting_for_agent: usize,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub agents_lack: String,
    /// The simulation stopped before the rollout completed (why).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<String>,
}

/// Runs core's rollout step over a settled fleet until `new` is Complete, every agent reporting
/// Provisioned as soon as it is assigned. `current` is the target now (name and per-node hashes).
/// Pure and deterministic.
pub fn waves(
    nodes: &[NodeState],
    current: Option<(&str, &BTreeMap<String, String>)>,
    new: (&str, &BTreeMap<String, String>),
    agents: &Agents,
    defaults: PolicyDefaults,
) -> Waves {
    let t0 = Timestamp::from_secs(1_000_000);
    let mut input = settled_fleet(nodes, current, new, defaults, t0);
    agents.put(&mut input, new.0);
    let lacking = (nodes.iter())
        .map(|n| agents.lacks(n.name.as_str()))
        .filter(|l| !l.is_empty());
    let (waiting, lack) = lacking.fold((0, FeatureSet::NONE), |(n, all), l| (n + 1, all.union(l)));
    let mut out = Waves {
        skipped: nodes.iter().filter(|n| !n.eligible()).count(),
        waiting_for_agent: waiting,
        agents_lack: if waiting > 0 {
            lack.to_string()
        } else {
            String::new()
        },
        ..Default::default()
    };
    let mut now = t0.plus_secs(60);
    // Each step either assigns, completes or waits on a clock; a budget of one moves one node a step.
    for _ in 0..nodes.len() * 2 + 20 {
        let plan = step(&input, now);
        let wave = carry_out(&mut input, &plan, new.0);
        if wave.count > 0 || wave.fast_path > 0 {
            out.waves.push(wave);
        }
        all_provisioned(&mut input);
        let phase = input
            .revisions
            .iter()
            .find(|r| r.name == new.0)
            .and_then(|r| r.status.phase.clone());
        match phase.as_deref() {
            Some(p) if p == Phase::Complete.as_str() => return out,
            Some(p) if p == Phase::Failed.as_str() => {
                out.incomplete = Some("the revision would fail".into());
                return out;
            }
            _ => {}
        }
        // Next step: when the step asked to be woken (a canary bake), else a second later.
        now = plan
            .report
            .requeue_at
            .filter(|t| t.0 > now.0)
            .unwrap_or(now.plus_secs(1));
        if plan.write_count() == 0 && plan.report.requeue_at.is_none() {
            out.incomplete = Some(
                plan.report
                    .waiting
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
            );
            return out;
        }
    }
    out.incomplete = Some("did not complete within the simulation's step limit".into());
    out
}

/// What the nodes' agents can apply and what their new configs need (`netwave_api::features`). A node
/// missing from `features` has an agent of this build (the plan without a cluster).
#[derive(Default)]
pub struct Agents {
    pub features: BTreeMap<String, FeatureSet>,
    pub needs: BTreeMap<String, FeatureSet>,
}

impl Agents {
    fn has(&self, node: &str) -> FeatureSet {
        self.features
            .get(node)
            .copied()
            .unwrap_or_else(FeatureSet::all)
    }

    /// What `node`'s agent lacks of its new config.
    fn lacks(&self, node: &str) -> FeatureSet {
        let needs = self.needs.get(node).copied().unwrap_or_default();
        needs.without(self.has(node))
    }

    /// Into the simulation's input: each config's agent, the nodes without one, `new`'s needs.
    fn put(&self, input: &mut RolloutInput, new: &str) {
        for c in Arc::make_mut(&mut input.configs) {
            Arc::make_mut(c).status.features = self.has(c.name.as_str());
        }
        let assigned: std::collections::BTreeSet<&Sym> =
            input.configs.iter().map(|c| &c.name).collect();
        input.unassigned_agents = (input.nodes.iter())
            .filter(|n| !assigned.contains(&n.name))
            .map(|n| (n.name.clone(), self.has(n.name.as_str())))
            .collect();
        let needs: BTreeMap<Sym, FeatureSet> = (self.needs.iter())
            .filter(|(_, f)| !f.is_empty())
            .map(|(n, f)| (Sym::from(n), *f))
            .collect();
        input.rendered.set_needs(new, needs);
    }
}

/// Rendered hashes per node as the rollout takes them.
fn syms(hashes: &BTreeMap<String, String>) -> BTreeMap<Sym, Sym> {
    hashes
        .iter()
        .map(|(node, hash)| (Sym::from(node), Sym::from(hash)))
        .collect()
}

/// The rollout's input before the new revision: `current` Complete and provisioned on every node
/// it has a config for, then `new` created with the default policy.
fn settled_fleet(
    nodes: &[NodeState],
    current: Option<(&str, &BTreeMap<String, String>)>,
    new: (&str, &BTreeMap<String, String>),
    defaults: PolicyDefaults,
    t0: Timestamp,
) -> RolloutInput {
    let mut rendered = RenderedHashes::default();
    let mut revisions = Vec::new();
    let mut configs = Vec::new();
    if let Some((cur, hashes)) = current {
        rendered.set_revision(cur, syms(hashes));
        revisions.push(RevisionState {
            name: cur.into(),
            sequence: Sequence(1),
            hash: "current".into(),
            status: NetworkConfigRevisionStatus {
                phase: Some(Phase::Complete.as_str().into()),
                ..Default::default()
            },
            ..Default::default()
        });
        for n in nodes {
            let Some(h) = hashes.get(n.name.as_str()) else {
                continue;
            };
            configs.push(Arc::new(NodeConfigState {
                name: n.name.clone(),
                spec: AssignedSpec {
                    revision: cur.into(),
                    sequence: Sequence(1),
                    config_hash: h.into(),
                    retry: 0,
                    assigned_at: Some(t0),
                },
                status: AgentReport {
                    phase: Some(AgentPhase::Provisioned),
                    observed_revision: Some(cur.into()),
                    observed_retry: Some(0),
                    config_hash: Some(h.into()),
                    last_good_revision: Some(cur.into()),
                    ..Default::default()
                },
                record: Default::default(),
            }));
        }
    }
    rendered.set_revision(new.0, syms(new.1));
    revisions.push(RevisionState {
        name: new.0.into(),
        sequence: Sequence(2),
        hash: "new".into(),
        // The configurator creates revisions with an empty spec.rollout: its defaults apply.
        policy: RolloutPolicy::default(),
        validation: ValidationResult::default(),
        ..Default::default()
    });
    RolloutInput {
        defaults,
        revisions,
        nodes: Arc::new(nodes.iter().cloned().map(Arc::new).collect()),
        configs: Arc::new(configs),
        unreadable_configs: Default::default(),
        unassigned_agents: Default::default(),
        rendered,
        // No footprints: the waves show the rollout as it goes once any hold is approved (`run`
        // says whether there is one).
        footprints: Default::default(),
        move_losses: Default::default(),
    }
}

/// Writes a step's status updates and assignments into the input; returns the wave of `new`
/// they make.
fn carry_out(input: &mut RolloutInput, plan: &Plan, new: &str) -> Wave {
    for u in &plan.status_updates {
        if let Some(r) = input.revisions.iter_mut().find(|r| r.name == u.revision) {
            r.status = (*u.status).clone();
        }
    }
    let mut wave = Wave {
        count: 0,
        first: Vec::new(),
        canary: false,
        fast_path: 0,
    };
    for a in &plan.assignments {
        if a.revision == new {
            if a.reason == AssignReason::FastPath {
                wave.fast_path += 1;
            } else {
                wave.count += 1;
                wave.canary |= a.reason == AssignReason::Canary;
                if wave.first.len() < 3 {
                    wave.first.push(a.node.to_string());
                }
            }
        }
        let spec = a.spec();
        let configs = Arc::make_mut(&mut input.configs);
        match configs.iter_mut().find(|c| c.name == a.node) {
            Some(c) => Arc::make_mut(c).spec = spec,
            None => configs.push(Arc::new(NodeConfigState {
                name: a.node.clone(),
                spec,
                status: AgentReport {
                    features: (input.unassigned_agents.get(&a.node).copied()).unwrap_or_default(),
                    ..AgentReport::default()
                },
                record: Default::default(),
            })),
        }
    }
    wave
}

/// Every agent answers at once: Provisioned with what it is assigned.
fn all_provisioned(input: &mut RolloutInput) {
    for c in Arc::make_mut(&mut input.configs) {
        let c = Arc::make_mut(c);
        c.status = AgentReport {
            phase: Some(AgentPhase::Provisioned),
            observed_revision: Some(c.spec.revision.clone()),
            observed_retry: Some(c.spec.retry),
            config_hash: Some(c.spec.config_hash.clone()),
            last_good_revision: Some(c.spec.revision.clone()),
            // The same agent: what it can apply does not change.
            features: c.status.features,
            ..Default::default()
        };
    }
}

/// Everything `plan` shows.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanView {
    /// The revision the configurator would cut (or find) for these inputs.
    pub revision: String,
    pub hash: String,
    pub nodes: usize,
    /// The current target compared against; `None` without a cluster or revisions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_target: Option<String>,
    /// What these manifests are to the existing revisions (equal to the target, to a failed one, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Input objects to create, update, delete on the cluster (`None` offline).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub objects: Option<InputChanges>,
    pub errors: Vec<String>,
    pub warnings: Vec<String>,
    pub changes: NodeChanges,
    /// The configurator would hold this revision as a destructive change: what it removes from the
    /// last good revision. No node gets it until an admin resumes it; `rollout` is what follows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Waves>,
    /// Objects on the cluster that cannot be decoded, each with what the configurator holds
    /// meanwhile (an input: no revision is cut at all).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<String>,
}

/// An input object on the cluster that cannot be decoded is not missing: applying the directory
/// replaces it when the directory has it, and deletes it when not.
fn unreadable_inputs(objects: &mut InputChanges, bad: &[Undecodable]) {
    for u in bad {
        let id = format!("{}/{}", u.kind, u.name);
        if let Some(i) = objects.create.iter().position(|c| *c == id) {
            objects.create.remove(i);
            objects.update.push(format!(
                "{id}: replaces the object on the cluster, which cannot be read"
            ));
        } else {
            objects.delete.push(format!("{id}, which cannot be read"));
        }
    }
}

/// What applying the directory changes on the cluster.
fn render_objects(o: &InputChanges, s: &mut String) {
    if o.is_empty() {
        s.push_str("objects: the manifests equal what is on the cluster\n");
    } else {
        s.push_str("objects (what applying the directory changes on the cluster):\n");
        for x in &o.create {
            s.push_str(&format!("  + create {x}\n"));
        }
        for x in &o.update {
            s.push_str(&format!("  ~ update {x}\n"));
        }
        for x in &o.delete {
            s.push_str(&format!("  - delete {x} (not in the directory)\n"));
        }
    }
}

/// The waves, runs of equal ones in one line; `when` qualifies the heading (" once resumed").
fn render_rollout(r: &Waves, when: &str, max_unavailable: &str, s: &mut String) {
    s.push_str(&format!(
        "rollout{when} (maxUnavailable {max_unavailable}):\n"
    ));
    if r.waves.is_empty() {
        s.push_str("  no node would be assigned anything\n");
    }
    // Runs of equal waves in one line.
    let mut i = 0;
    while i < r.waves.len() {
        let w = &r.waves[i];
        let mut j = i;
        while j + 1 < r.waves.len()
            && r.waves[j + 1].count == w.count
            && r.waves[j + 1].fast_path == 0
            && !r.waves[j + 1].canary
            && w.fast_path == 0
            && !w.canary
        {
            j += 1;
        }
        let what = |w: &Wave, names_too: bool| {
            let mut parts = Vec::new();
            if w.count > 0 {
                let mut p = format!(
                    "{} node{}{}",
                    w.count,
                    if w.count == 1 { "" } else { "s" },
                    if w.canary { " (canary)" } else { "" }
                );
                if names_too {
                    p.push_str(&format!(": {}", names(&w.first, w.count)));
                }
                parts.push(p);
            }
            if w.fast_path > 0 {
                parts.push(format!(
                    "{} unchanged node(s) moved without applying",
                    w.fast_path
                ));
            }
            parts.join("; ")
        };
        if j == i {
            s.push_str(&format!("  wave {}: {}\n", i + 1, what(w, true)));
        } else {
            s.push_str(&format!(
                "  waves {}–{}: {} each\n",
                i + 1,
                j + 1,
                what(w, false)
            ));
        }
        i = j + 1;
    }
    if r.skipped > 0 {
        s.push_str(&format!(
            "  {} node(s) not Ready or cordoned: skipped, they get it when they come back\n",
            r.skipped
        ));
    }
    if r.waiting_for_agent > 0 {
        s.push_str(&format!(
            "  {} node(s) wait for their agent: their config needs {}, which their agent does \
             not declare (upgrade it; they keep what they run meanwhile)\n",
            r.waiting_for_agent, r.agents_lack
        ));
    }
    if let Some(why) = &r.incomplete {
        s.push_str(&format!("  the rollout would not complete: {why}\n"));
    }
}

fn render(v: &PlanView, max_unavailable: &str) -> String {
    let mut s = format!(
        "plan for {} ({} nodes){}\n",
        v.revision,
        v.nodes,
        v.current_target
            .as_ref()
            .map(|t| format!(", against the current target {t}"))
            .unwrap_or_else(|| ", no current target".into())
    );
    if let Some(n) = &v.note {
        s.push_str(&format!("note: {n}\n"));
    }
    s.push_str(&cluster::render_unreadable(&v.unreadable));
    if let Some(o) = &v.objects {
        render_objects(o, &mut s);
    }
    if v.errors.is_empty() {
        s.push_str("validation: ok");
    } else {
        s.push_str(&format!(
            "validation: {} error(s) — the configurator would mark this revision Failed and touch no node:\n",
            v.errors.len()
        ));
        for e in &v.errors {
            s.push_str(&format!("  error: {e}\n"));
        }
    }
    if v.errors.is_empty() {
        s.push('\n');
    }
    for w in &v.warnings {
        s.push_str(&format!("  warning: {w}\n"));
    }
    render_changes(&v.changes, &mut s);
    if let Some(what) = &v.held {
        s.push_str(&format!(
            "held: {} {what}: the configurator holds it as a destructive change, and no node gets it \
             until an admin resumes it (`kubectl netwave resume`)\n",
            v.revision
        ));
    }
    if let Some(r) = &v.rollout {
        let when = if v.held.is_some() {
            " once resumed"
        } else {
            ""
        };
        render_rollout(r, when, max_unavailable, &mut s);
    }
    s
}

/// The revisions on the cluster, what applying `inputs` changes there, and the objects that cannot
/// be read.
async fn read_cluster(
    c: &Client,
    inputs: &RevisionInputs,
) -> anyhow::Result<(
    Vec<NetworkConfigRevision>,
    Option<InputChanges>,
    Vec<Undecodable>,
)> {
    let revs = cluster::read_revisions(c).await?;
    let (live, bad_inputs) = cluster::read_live_inputs(c).await?;
    let mut objects = input_changes(&live, inputs);
    unreadable_inputs(&mut objects, &bad_inputs);
    let unreadable = [revs.unreadable, bad_inputs].concat();
    Ok((revs.items, Some(objects), unreadable))
}

/// What these manifests are to the existing revisions: the current target, a failed one, an earlier
/// good one, or new (`None`).
fn note(
    same: Option<&NetworkConfigRevision>,
    target: Option<&NetworkConfigRevision>,
) -> Option<String> {
    match (same, target) {
        (Some(s), Some(t)) if cluster::name(s) == cluster::name(t) => Some(format!(
            "these manifests are the current target {}: nothing new to roll out",
            name(t)
        )),
        (Some(s), _) if cluster::is_failed(s) => Some(format!(
            "these manifests equal {}, which failed: the configurator creates nothing for them \
             (`kubectl netwave retry {}` re-arms it)",
            name(s),
            netwave_api::effective_sequence(s)
        )),
        (Some(s), _) => Some(format!(
            "these manifests equal the earlier revision {}: the configurator makes it the target again",
            name(s)
        )),
        _ => None,
    }
}

/// The name the configurator gives a new revision with this hash: as it named the newest revision
/// (`--revision-names`), under the next sequence.
fn new_name(revs: &[NetworkConfigRevision], hash: &str) -> String {
    let naming = revs.last().map(|r| naming_of(name(r))).unwrap_or_default();
    let next = revs.iter().map(netwave_api::effective_sequence).max();
    revision_name_as(hash, naming, next.unwrap_or(0) + 1)
}

pub async fn run(
    client: Option<&Client>,
    args: PlanArgs,
    term: &mut Term<'_>,
) -> anyhow::Result<Exit> {
    let inputs = read_inputs(&args.dir)?;
    let hash = inputs_hash(&inputs);
    let nodes = match (&args.nodes, client) {
        (Some(f), _) => read_nodes(f)?,
        (None, Some(c)) => cluster::nodes(c).await?,
        (None, None) => bail!("no cluster to read Nodes from: pass --nodes FILE"),
    };
    let infos = cluster::node_infos(&nodes);
    let states: Vec<NodeState> = nodes
        .iter()
        .filter_map(|n| NodeState::from_api(n).ok())
        .collect();
    let params = FleetParams {
        underlay_mtu: args.underlay_mtu,
        max_object_bytes: args.max_object_bytes,
        ..FleetParams::default()
    };
    let checked = render_and_validate(&inputs, &infos, &params);
    let mut validation = checked.validation.to_status();
    // Inputs no revision can hold are never cut: the configurator says so on every input object.
    if let Err(too_large) = netwave_core::limits::check_inputs(&inputs, args.max_object_bytes) {
        validation.errors.insert(0, too_large.to_string());
    }

    let (revs, objects, mut unreadable) = match client {
        Some(c) => read_cluster(c, &inputs).await?,
        None => (Vec::new(), None, Vec::new()),
    };
    let target = cluster::target(&revs);
    let same = revs.iter().rev().find(|r| r.spec.hash == hash);
    let note = note(same, target);
    let before: BTreeMap<String, RenderedNode> = match target {
        Some(t) => {
            let c = client.context("a target revision without a cluster")?;
            crate::changes::render_for(&cluster::inputs_of(c, name(t)).await?, &infos, name(t))?
        }
        None => BTreeMap::new(),
    };
    let changes = node_changes(&before, &checked.nodes, args.max_groups);
    let hashes = |m: &BTreeMap<String, RenderedNode>| -> BTreeMap<String, String> {
        m.iter()
            .map(|(n, r)| (n.clone(), r.config_hash.clone()))
            .collect()
    };
    let new_name = same.map_or_else(|| new_name(&revs, &hash), |s| name(s).to_string());
    // Measured as the configurator measures the target: against the last good revision.
    let held = match (client, cluster::last_good(&revs, None)) {
        (Some(c), Some(lg)) if name(lg) != new_name => hold_of(
            Some((name(lg), &cluster::inputs_of(c, name(lg)).await?)),
            &new_name,
            &inputs,
            &infos,
            args.destructive_threshold,
        ),
        _ => None,
    };
    // Each node's agent as its NodeNetworkConfig reports it (without a cluster: this build's).
    let configs = match client {
        Some(c) => cluster::read_configs(c).await?,
        None => cluster::Listed {
            items: Vec::new(),
            unreadable: Vec::new(),
        },
    };
    unreadable.extend(configs.unreadable);
    let agents = Agents {
        features: (configs.items.iter())
            .filter_map(|c| {
                let n = c.metadata.name.clone()?;
                Some((n, FeatureSet::of_agent(c.status.as_ref())))
            })
            .collect(),
        needs: (checked.nodes.iter())
            .map(|(n, r)| (n.clone(), r.needs()))
            .collect(),
    };
    let rollout = checked.validation.is_valid().then(|| {
        let cur = target.map(|t| (name(t).to_string(), hashes(&before)));
        waves(
            &states,
            cur.as_ref().map(|(n, h)| (n.as_str(), h)),
            (&new_name, &hashes(&checked.nodes)),
            &agents,
            PolicyDefaults {
                max_unavailable: args.max_unavailable,
                ..PolicyDefaults::default()
            },
        )
    });
    let view = PlanView {
        revision: new_name,
        hash,
        nodes: infos.len(),
        current_target: target.map(|t| name(t).to_string()),
        note,
        objects,
        errors: validation.errors,
        warnings: validation.warnings,
        changes,
        held,
        rollout,
        unreadable: cluster::unreadable_notes(&unreadable),
    };
    let mu = match args.max_unavailable {
        netwave_api::CountOrPercent::Count(n) => n.to_string(),
        netwave_api::CountOrPercent::Percent(p) => format!("{p}%"),
    };
    emit(term.out, args.output, &view, |v| render(v, &mu))?;
    Ok(Exit::Success)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(n: &str) -> NodeState {
        NodeState {
            name: n.into(),
            ready: true,
            ..Default::default()
        }
    }

    #[test]
    fn waves_follow_the_budget_and_skip_unchanged_nodes() {
        let mut nodes: Vec<NodeState> = (0..10).map(|i| node(&format!("n{i}"))).collect();
        nodes[9].ready = false;
        let cur: BTreeMap<String, String> = nodes
            .iter()
            .map(|n| (n.name.to_string(), "h0".into()))
            .collect();
        // n0 and n1 keep their config: moved for free.
        let new: BTreeMap<String, String> = nodes
            .iter()
            .map(|n| {
                let h = if n.name == "n0" || n.name == "n1" {
                    "h0"
                } else {
                    "h1"
                };
                (n.name.to_string(), h.into())
            })
            .collect();
        let budget = || PolicyDefaults {
            max_unavailable: netwave_api::CountOrPercent::Count(3),
            ..PolicyDefaults::default()
        };
        let agents = Agents::default();
        let w = waves(
            &nodes,
            Some(("rev-cur", &cur)),
            ("rev-new", &new),
            &agents,
            budget(),
        );
        assert_eq!(w.incomplete, None);
        assert_eq!(w.skipped, 1);
        let applied: Vec<usize> = w.waves.iter().map(|w| w.count).collect();
        assert_eq!(applied, vec![3, 3, 1], "7 changed Ready nodes, 3 at a time");
        assert_eq!(w.waves.iter().map(|w| w.fast_path).sum::<usize>(), 2);
        assert_eq!(w.waves[0].first, vec!["n2", "n3", "n4"]);

        // Every new config needs a firewall-mark rule; n2 and n3 run agents of 0.1.0 (they declare
        // nothing): they are in no wave, and the plan says why.
        let fwmark = FeatureSet::named(&["ruleFwmark"]);
        let agents = Agents {
            features: [("n2", FeatureSet::NONE), ("n3", FeatureSet::NONE)]
                .into_iter()
                .map(|(n, f)| (n.to_string(), f))
                .collect(),
            needs: nodes.iter().map(|n| (n.name.to_string(), fwmark)).collect(),
        };
        let w = waves(
            &nodes,
            Some(("rev-cur", &cur)),
            ("rev-new", &new),
            &agents,
            budget(),
        );
        let waved: Vec<&String> = w.waves.iter().flat_map(|w| &w.first).collect();
        assert!(!waved.iter().any(|n| *n == "n2" || *n == "n3"), "{waved:?}");
        let applied: Vec<usize> = w.waves.iter().map(|w| w.count).collect();
        assert_eq!(
            applied,
            vec![3, 2],
            "5 changed Ready nodes whose agents can apply it"
        );
        // n9 is not Ready and lacks nothing: it is not counted as waiting for its agent.
        assert_eq!(
            (w.waiting_for_agent, w.agents_lack.as_str()),
            (2, "ruleFwmark (since 0.2.0)")
        );
    }
}

#[cfg(test)]
mod fleet_tests {
    use super::*;

    #[test]
    fn waves_of_a_5000_node_fleet() {
        let nodes: Vec<NodeState> = (0..5000)
            .map(|i| NodeState {
                name: format!("node-{i:04}").into(),
                ready: true,
                ..Default::default()
            })
            .collect();
        let hashes = |h: &str| -> BTreeMap<String, String> {
            nodes
                .iter()
                .map(|n| (n.name.to_string(), h.into()))
                .collect()
        };
        let (cur, new) = (hashes("h0"), hashes("h1"));
        for (budget, want) in [
            (netwave_api::CountOrPercent::Percent(10), 10),
            (netwave_api::CountOrPercent::Count(50), 100),
        ] {
            let t = std::time::Instant::now();
            let w = waves(
                &nodes,
                Some(("rev-cur", &cur)),
                ("rev-new", &new),
                &Agents::default(),
                PolicyDefaults {
                    max_unavailable: budget,
                    ..PolicyDefaults::default()
                },
            );
            println!("{budget:?}: {} waves in {:?}", w.waves.len(), t.elapsed());
            assert_eq!(w.incomplete, None);
            assert_eq!(w.waves.len(), want);
            assert_eq!(w.waves.iter().map(|w| w.count).sum::<usize>(), 5000);
        }
    }
}
