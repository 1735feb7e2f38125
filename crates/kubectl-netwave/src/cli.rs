//! The command line: every command, flag and the help text an admin learns the plugin from.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

const ABOUT: &str =
    "Follow and steer netwave rollouts of VRFs, layer-2 segments and routing tables";

const LONG_ABOUT: &str = "\
Follow and steer netwave rollouts.

netwave folds the VRFRouteConfiguration, Layer2NetworkConfiguration and RoutingTable objects you edit into \
one immutable NetworkConfigRevision (rev-<hash>, with a growing sequence number) and moves nodes onto it a \
few at a time (spec.rollout.maxUnavailable). The newest revision that has not failed is the target; the \
newest Complete one is the last good revision, where failed nodes go back to.

Revisions are named by name (rev-3f9a0c12de) or by sequence number (7) wherever a REVISION is asked for.

Typical session:
  kubectl netwave status -w          follow the rollout of the newest revision
  kubectl netwave pause              stop new assignments (nodes already applying finish)
  kubectl netwave resume
  kubectl netwave history            every revision, its phase and counts
  kubectl netwave diff 6 7           which nodes a change touches, and how
  kubectl netwave undo --to 6        bring revision 6's inputs back (asks for --yes)
  kubectl netwave plan -f ./network  what applying a directory of manifests would do (writes nothing)
  kubectl netwave release node-7     give a quarantined node new revisions again
  kubectl netwave clusters           every kubeconfig context's target, phase and last good revision

Listings take -o json or -o yaml. Exit codes: 0 done; 1 an error (said on stderr), or `status -w \
--until-done` saw the revision fail; 2 a usage error, or undo/abort stopped for want of --yes; 130 \
interrupted.";

#[derive(Debug, Parser)]
#[command(
    name = "kubectl-netwave",
    bin_name = "kubectl netwave",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT
)]
pub struct Cli {
    /// Kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then the in-cluster service account).
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use (default: the current context).
    #[arg(long, global = true)]
    pub context: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show a rollout: phase, wave, progress, who paused it, failed nodes and what it waits on.
    #[command(long_about = STATUS_HELP)]
    Status(StatusArgs),
    /// List revisions, oldest first, with phase, node counts, age and the target / last good markers.
    History(HistoryArgs),
    /// Pause a rollout: no new node gets the revision; nodes already applying finish; rollbacks go on.
    #[command(long_about = PAUSE_HELP)]
    Pause(TargetArgs),
    /// Resume a paused rollout (also one the configurator paused as a destructive change).
    Resume(TargetArgs),
    /// Re-arm a Failed revision (bumps spec.retry): its failures are cleared and it rolls out again.
    #[command(long_about = RETRY_HELP)]
    Retry(TargetArgs),
    /// Stop the current rollout and roll every node back to the last good revision.
    #[command(long_about = ABORT_HELP)]
    Abort(AbortArgs),
    /// Bring an earlier good revision's inputs back (VRF, layer-2 and routing-table objects).
    #[command(long_about = UNDO_HELP)]
    Undo(UndoArgs),
    /// Which nodes change between two revisions, and how their config changes.
    #[command(long_about = DIFF_HELP)]
    Diff(DiffArgs),
    /// What applying a directory of manifests would do: per-node changes, validation, waves. Writes nothing.
    #[command(long_about = PLAN_HELP)]
    Plan(PlanArgs),
    /// Release a quarantined node (spec.rollout.quarantine): it gets new revisions again.
    #[command(long_about = RELEASE_HELP)]
    Release(ReleaseArgs),
    /// Every kubeconfig context's target revision, phase and last good revision: one change across
    /// many clusters.
    #[command(long_about = CLUSTERS_HELP)]
    Clusters(ClustersArgs),
}

const CLUSTERS_HELP: &str = "\
One line per cluster: every context of the kubeconfig (or those --contexts names), asked at once.

  CONTEXT   TARGET           SEQ   PHASE       UPDATED   LAST GOOD        NOTE
  canary    rev-5c1e2a9d0b   8     Complete    4/4       rev-5c1e2a9d0b   rev-77e0c1d2aa failed
  eu-1      rev-5c1e2a9d0b   8     Progressing 12/40     rev-0a67fa6548

TARGET is the newest revision that has not failed; PHASE is its phase, or Held (a destructive change \
waiting for an admin) or Paused; UPDATED how far its rollout got. NOTE names a newer revision that failed \
there (that cluster stopped the change and its nodes went back to LAST GOOD) and says why a cluster could \
not be read (each gets --timeout; the others are shown).";

#[derive(Debug, Args)]
pub struct ClustersArgs {
    /// Contexts to ask, comma-separated (default: every context of the kubeconfig, in its order).
    #[arg(long, value_delimiter = ',', value_name = "CONTEXT,...")]
    pub contexts: Option<Vec<String>>,
    /// Seconds each cluster gets to answer.
    #[arg(long, default_value_t = 10)]
    pub timeout: u64,
    #[arg(short, long, value_enum, default_value_t)]
    pub output: Output,
}

const RELEASE_HELP: &str = "\
Release a node the configurator quarantined (spec.rollout.quarantine, or its --quarantine-after): a node that \
failed that many revisions in a row which other nodes provisioned. While quarantined it keeps its last good \
config, gets no new revision, and its failures do not count against maxFailures; its NodeNetworkConfig says \
so (annotation netwave.dev/quarantined, condition Quarantined) and the gauge netwave_quarantined_nodes \
counts it.

Release removes the annotation (the same as `kubectl annotate nnc NODE netwave.dev/quarantined-`). The node \
is then trusted like any other: it gets the next revision, and its failures count again. A revision it \
failed is not given to it again unless that revision is retried (`kubectl netwave retry`). Find out why it \
failed first (`kubectl describe nnc NODE`): a compromised agent is released into a veto again.";

#[derive(Debug, Args)]
pub struct ReleaseArgs {
    /// The node (its NodeNetworkConfig has the same name).
    pub node: String,
}

const STATUS_HELP: &str = "\
Show the rollout of one revision (default: the newest one).

  revision rev-3f9a0c12de (seq 7)  phase Progressing  wave 3  started 2m ago
  [##########--------------------] 40/120 updated  4 in flight  1 failed  75 queued  0 skipped
  waiting on: waiting for budget: 4 node(s) in flight, maxUnavailable 4

The wave is the number of assignment rounds so far (nodes given the revision at the same moment form one \
wave). Failed nodes are listed with the reason their agent gave (the first few, then \"and N more\"). Nodes \
are listed one per line on small fleets and summarised by state (count and first names) on large ones; \
--all-nodes lists every node.

-w re-renders on every change of the revision or a node's config, until interrupted (Ctrl-C); with \
--until-done it stops once the revision is Complete (exit 0) or Failed or Superseded (exit 1).";

const PAUSE_HELP: &str = "\
Pause a rollout (default: the current target). Sets spec.paused: no new node is assigned the revision; \
nodes already applying it finish; rollbacks of failed nodes continue; new nodes get the last good \
revision. `kubectl netwave status` shows who paused it (the field manager, kubectl-netwave) and since when.";

const RETRY_HELP: &str = "\
Re-arm a Failed revision (default: the newest Failed one) by bumping spec.retry. netwave never retries a \
failed revision by itself: the configurator clears its failures, makes it the target again if it is the \
newest, and agents re-apply it even on nodes that reported it Invalid.";

const ABORT_HELP: &str = "\
Stop the current rollout and roll every node back to the last good revision.

netwave has no abort switch; abort is two steps, both shown before anything is written:
  1. pause the current target (spec.paused: true): no further node gets it;
  2. undo to the last good revision: its VRF, layer-2 and routing-table objects are put back (server-side \
apply, field manager kubectl-netwave; inputs it did not contain are deleted). The configurator then makes \
that revision the target again and moves every node back to it under the same maxUnavailable budget.

The aborted revision stays paused: if its inputs are applied again later, it comes back paused until \
`kubectl netwave resume`. Without --yes, abort only shows what it would change.";

const UNDO_HELP: &str = "\
Bring an earlier good revision's inputs back: every VRFRouteConfiguration, Layer2NetworkConfiguration and \
RoutingTable stored in that revision is applied (server-side apply, field manager kubectl-netwave, \
conflicts forced), and every such object the revision did not contain is deleted. The configurator sees \
inputs equal to that revision and makes it the target again (no new revision is created).

--to defaults to the newest Complete revision older than the current target. A Failed revision cannot be \
undone to (use `retry`). The changes are shown first; nothing is written without --yes, and --dry-run only \
shows them.

Going back is measured like any change: a revision that would take more than the configurator's \
--destructive-threshold of what the last good revision puts on the nodes off them (or all of it) is held \
as a destructive change until an admin resumes it. undo says so before it writes anything (pass \
--destructive-threshold when your configurator runs with another one than the default 50).";

const DIFF_HELP: &str = "\
Render both revisions' inputs against the current Nodes (the same rendering the configurator does) and \
show which nodes' configs differ, grouped: nodes with the same change are listed once, with a concise diff \
of their NodeConfig (VRFs, layer-2 segments, routes, rules; + added, - removed, ~ changed fields).";

const PLAN_HELP: &str = "\
Read a directory of manifests (*.yaml, *.yml, *.json, recursively; VRFRouteConfiguration, \
Layer2NetworkConfiguration and RoutingTable), render them against the live Nodes (or a saved snapshot, \
`kubectl get nodes -o yaml > nodes.yaml`, with --nodes) and show:
  - fleet validation errors and warnings, with the object and field they are about;
  - per-node changes against the current target (grouped as in `diff`);
  - the waves a rollout would take: the configurator's own rollout step, run with every agent answering \
at once, under --max-unavailable (the configurator's default, 10%, unless the flag says otherwise);
  - whether the configurator would hold the revision as a destructive change (it takes more than \
--destructive-threshold of what the last good revision puts on the nodes off them): then no node gets it \
until an admin resumes it, and the waves are what follows that approval.
The directory stands for the whole desired input set: objects on the cluster that it lacks would be \
removed. Nothing is written to the cluster.";

/// `-o`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Human-readable text.
    #[default]
    Text,
    Json,
    Yaml,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Revision name or sequence number (default: the newest revision).
    pub revision: Option<String>,
    /// Re-render on every change until interrupted.
    #[arg(short, long)]
    pub watch: bool,
    /// With -w: stop when the revision is Complete (exit 0), Failed or Superseded (exit 1).
    #[arg(long, requires = "watch")]
    pub until_done: bool,
    /// With -w: give up after this many seconds.
    #[arg(long, value_name = "SECONDS", requires = "watch")]
    pub timeout: Option<u64>,
    /// List every node, however many there are.
    #[arg(long)]
    pub all_nodes: bool,
    #[arg(short, long, value_enum, default_value_t)]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct HistoryArgs {
    #[arg(short, long, value_enum, default_value_t)]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct TargetArgs {
    /// Revision name or sequence number (default: the current target; for retry, the newest Failed one).
    pub revision: Option<String>,
}

#[derive(Debug, Args)]
pub struct AbortArgs {
    /// Write the changes (without it, only show them).
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Only show what would change.
    #[arg(long)]
    pub dry_run: bool,
    #[arg(short, long, value_enum, default_value_t)]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct UndoArgs {
    /// Revision to go back to, by name or sequence (default: the newest Complete one before the target).
    #[arg(long, value_name = "REVISION")]
    pub to: Option<String>,
    /// The configurator's --destructive-threshold (percent), to say whether it will hold the revision
    /// brought back.
    #[arg(long, value_name = "PERCENT", default_value_t = netwave_core::rollout::hold::DEFAULT_DESTRUCTIVE_THRESHOLD,
          value_parser = clap::value_parser!(u32).range(0..=100))]
    pub destructive_threshold: u32,
    /// Write the changes (without it, only show them).
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Only show what would change.
    #[arg(long)]
    pub dry_run: bool,
    #[arg(short, long, value_enum, default_value_t)]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The revision to compare from (name or sequence).
    pub from: String,
    /// The revision to compare to (name or sequence).
    pub to: String,
    /// Node groups shown in full before the rest are counted.
    #[arg(long, default_value_t = 20)]
    pub max_groups: usize,
    /// The configurator's --destructive-threshold (percent), to say whether it will hold the revision
    /// these manifests make.
    #[arg(long, value_name = "PERCENT", default_value_t = netwave_core::rollout::hold::DEFAULT_DESTRUCTIVE_THRESHOLD,
          value_parser = clap::value_parser!(u32).range(0..=100))]
    pub destructive_threshold: u32,
    #[arg(short, long, value_enum, default_value_t)]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Directory (or single file) of manifests: the complete desired set of netwave inputs.
    #[arg(short = 'f', long = "filename", value_name = "DIR")]
    pub dir: PathBuf,
    /// Render against this Node list (`kubectl get nodes -o yaml` or -o json) instead of the live Nodes.
    #[arg(long, value_name = "FILE")]
    pub nodes: Option<PathBuf>,
    /// maxUnavailable for the wave plan: a count (4) or a share of the eligible nodes (10%).
    #[arg(long, default_value = "10%", value_parser = parse_budget)]
    pub max_unavailable: netwave_api::CountOrPercent,
    /// Underlay MTU fleet validation checks VXLAN MTUs against (the configurator's --underlay-mtu).
    #[arg(long, default_value_t = netwave_core::fleet::DEFAULT_UNDERLAY_MTU)]
    pub underlay_mtu: u32,
    /// Largest folded inputs and node config, in bytes of JSON (the configurator's --max-object-bytes).
    #[arg(long, default_value_t = netwave_core::limits::DEFAULT_MAX_OBJECT_BYTES)]
    pub max_object_bytes: u64,
    /// Node groups shown in full before the rest are counted.
    #[arg(long, default_value_t = 20)]
    pub max_groups: usize,
    /// The configurator's --destructive-threshold (percent), to say whether it will hold the revision
    /// these manifests make.
    #[arg(long, value_name = "PERCENT", default_value_t = netwave_core::rollout::hold::DEFAULT_DESTRUCTIVE_THRESHOLD,
          value_parser = clap::value_parser!(u32).range(0..=100))]
    pub destructive_threshold: u32,
    #[arg(short, long, value_enum, default_value_t)]
    pub output: Output,
}

fn parse_budget(s: &str) -> Result<netwave_api::CountOrPercent, String> {
    netwave_api::CountOrPercent::parse(s).map_err(|e| e.to_string())
}
